//! `[[watch]]` burst state: a sorted set of creations per (rule, group), scored by creation time
//! (ms), and the (rule, group)'s open alert list id with a TTL.
use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::{Client, RedisStore, batch, ms};
use crate::store::StoreError;

/// KEYS: the creations zset. ARGV: score, sandbox, trim below, ttl ms, from, to.
static RECORD_CREATION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[5], ARGV[6], 'WITHSCORES')
"#,
    )
});

/// KEYS: the alert key. ARGV: expected id, next id, ttl ms. Returns the id now recorded.
static REPLACE_ALERT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local cur = redis.call('GET', KEYS[1])
if (not cur) or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return ARGV[2]
end
return cur
"#,
    )
});

/// KEYS: 1 the event's mark, 2 the sandbox's lifecycle list, 3 its open-case pointer (one
/// slot). ARGV: 1 mark ttl ms, 2 lifecycle entry, 3 entries kept, 4 lifecycle ttl ms.
/// Returns 0 a repeat (nothing changed), 1 new with no open case, 2 new with one. A repeat of
/// an entry already in the list is not added again.
static TAKE_EVENT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  return 0
end
if not redis.call('LPOS', KEYS[2], ARGV[2]) then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  redis.call('LTRIM', KEYS[2], -tonumber(ARGV[3]), -1)
end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
if redis.call('EXISTS', KEYS[3]) == 1 then
  return 2
end
return 1
"#,
    )
});

impl RedisStore {
    pub(crate) async fn take_event(
        &self,
        sandbox: &str,
        event: &str,
        entry: &str,
        mark_ttl: Duration,
        lifecycle_ttl: Duration,
    ) -> Result<Option<bool>, StoreError> {
        let keys = self.keys();
        let (mark, lifecycle) = (
            keys.e2b_event(sandbox, event),
            keys.sandbox_lifecycle(sandbox),
        );
        let open = keys.open_case_by_subject_key(&format!("sandbox:{sandbox}"));
        let (mark_ms, kept, lifecycle_ms) = (
            ms(mark_ttl).max(1),
            crate::store::watch::LIFECYCLE_KEPT,
            ms(lifecycle_ttl).max(1),
        );
        let taken: i64 = if matches!(self.inner.client, Client::Single(_)) {
            // The hot path of event intake: batched with the other script calls ready now.
            let data = mark.len() + lifecycle.len() + open.len() + entry.len() + 40;
            let mut cmd = batch::evalsha(&TAKE_EVENT, 8, data);
            cmd.arg(3)
                .arg(&mark)
                .arg(&lifecycle)
                .arg(&open)
                .arg(mark_ms)
                .arg(entry)
                .arg(kept)
                .arg(lifecycle_ms);
            let value = self
                .inner
                .batcher
                .call(&self.inner.conn, &TAKE_EVENT, cmd)
                .await?;
            redis::from_redis_value(value)
                .map_err(|e| StoreError::Corrupt(format!("the event intake script answered {e}")))?
        } else {
            self.invoke(
                TAKE_EVENT
                    .key(mark)
                    .key(lifecycle)
                    .key(open)
                    .arg(mark_ms)
                    .arg(entry)
                    .arg(kept)
                    .arg(lifecycle_ms),
            )
            .await?
        };
        match taken {
            0 => Ok(None),
            1 => Ok(Some(false)),
            2 => Ok(Some(true)),
            other => Err(StoreError::Corrupt(format!(
                "the event intake script answered {other}"
            ))),
        }
    }

    pub(crate) async fn forget_event(&self, sandbox: &str, event: &str) -> Result<(), StoreError> {
        let _: i64 = self
            .query(redis::cmd("DEL").arg(self.keys().e2b_event(sandbox, event)))
            .await?;
        Ok(())
    }

    pub(crate) async fn lifecycle_of(&self, sandbox: &str) -> Result<Vec<String>, StoreError> {
        self.query(
            redis::cmd("LRANGE")
                .arg(self.keys().sandbox_lifecycle(sandbox))
                .arg(0)
                .arg(-1),
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn record_creation(
        &self,
        rule: &str,
        group: &str,
        sandbox: &str,
        at_ms: i64,
        from_ms: i64,
        to_ms: i64,
        keep_ms: i64,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let raw: Vec<(String, f64)> = self
            .invoke(
                RECORD_CREATION
                    .key(self.keys().watch_creations(rule, group))
                    .arg(at_ms)
                    .arg(sandbox)
                    .arg(at_ms - keep_ms)
                    .arg(keep_ms.max(1))
                    .arg(from_ms)
                    .arg(to_ms),
            )
            .await?;
        Ok(raw.into_iter().map(|(id, s)| (id, s as i64)).collect())
    }

    pub(crate) async fn burst_alert(
        &self,
        rule: &str,
        group: &str,
        candidate: &str,
        ttl: Duration,
    ) -> Result<String, StoreError> {
        // SET NX GET (Redis 7): the old value when there was one, else ours was set.
        let old: Option<String> = self
            .query(
                redis::cmd("SET")
                    .arg(self.keys().watch_alert(rule, group))
                    .arg(candidate)
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(ms(ttl).max(1)),
            )
            .await?;
        Ok(old.unwrap_or_else(|| candidate.to_owned()))
    }

    pub(crate) async fn replace_burst_alert(
        &self,
        rule: &str,
        group: &str,
        current: &str,
        next: &str,
        ttl: Duration,
    ) -> Result<String, StoreError> {
        self.invoke(
            REPLACE_ALERT
                .key(self.keys().watch_alert(rule, group))
                .arg(current)
                .arg(next)
                .arg(ms(ttl).max(1)),
        )
        .await
    }
}
