//! List decisions: one hash per list (`v`, `json`) written by compare-and-swap, the index of
//! lists still in play, and a batched read of many cases (a group's items).
use std::collections::BTreeMap;
use std::sync::LazyLock;

use redis::Script;

use super::{RedisStore, ms};
use crate::cases::{Case, Subject};
use crate::ids::{CaseId, ListId};
use crate::store::keys::{CASE_RETENTION, shard_of};
use crate::store::{StoreError, decode};

/// Creates a list unless its id is taken. KEYS: list hash, index. ARGV: json, ttl ms, id, score.
static CREATE_LIST: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'v', 1, 'json', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
return 1
"#,
    )
});

/// Compare-and-swap of a list's JSON. KEYS: list hash. ARGV: expected version, json, ttl ms.
/// Returns 1 written, 0 stale or missing.
static SWAP_LIST: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local v = redis.call('HGET', KEYS[1], 'v')
if not v or v ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'v', tonumber(v) + 1, 'json', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"#,
    )
});

impl RedisStore {
    pub(crate) async fn create_list(
        &self,
        id: &ListId,
        json: &str,
        score_ms: i64,
    ) -> Result<bool, StoreError> {
        let created: i64 = self
            .invoke(
                CREATE_LIST
                    .key(self.keys().list(id))
                    .key(self.keys().active_lists())
                    .arg(json)
                    .arg(ms(CASE_RETENTION))
                    .arg(id.as_str())
                    .arg(score_ms),
            )
            .await?;
        Ok(created == 1)
    }

    pub(crate) async fn load_list(&self, id: &ListId) -> Result<Option<(u64, String)>, StoreError> {
        let (version, json): (Option<u64>, Option<String>) = self
            .query(
                redis::cmd("HMGET")
                    .arg(self.keys().list(id))
                    .arg("v")
                    .arg("json"),
            )
            .await?;
        Ok(version.zip(json))
    }

    pub(crate) async fn swap_list(
        &self,
        id: &ListId,
        expected: u64,
        json: &str,
    ) -> Result<bool, StoreError> {
        let written: i64 = self
            .invoke(
                SWAP_LIST
                    .key(self.keys().list(id))
                    .arg(expected)
                    .arg(json)
                    .arg(ms(CASE_RETENTION)),
            )
            .await?;
        Ok(written == 1)
    }

    pub(crate) async fn active_lists(&self) -> Result<Vec<String>, StoreError> {
        self.query(
            redis::cmd("ZRANGE")
                .arg(self.keys().active_lists())
                .arg(0)
                .arg(-1),
        )
        .await
    }

    pub(crate) async fn retire_list(&self, id: &ListId) -> Result<(), StoreError> {
        let _: i64 = self
            .query(
                redis::cmd("ZREM")
                    .arg(self.keys().active_lists())
                    .arg(id.as_str()),
            )
            .await?;
        Ok(())
    }

    /// Many cases in one round trip per shard (each shard's reads are one pipeline, in one slot).
    pub(crate) async fn cases_of(
        &self,
        items: &[(Subject, CaseId)],
    ) -> Result<Vec<Option<Case>>, StoreError> {
        let mut by_shard: BTreeMap<u16, Vec<(usize, String)>> = BTreeMap::new();
        for (at, (subject, id)) in items.iter().enumerate() {
            by_shard
                .entry(shard_of(&subject.key()))
                .or_default()
                .push((at, self.keys().case(subject, id)));
        }
        let reads = by_shard.into_values().map(|group| async move {
            let mut pipe = redis::pipe();
            for (_, key) in &group {
                pipe.cmd("HGET").arg(key).arg("json");
            }
            let found: Vec<Option<String>> = self.query_pipe(&pipe).await?;
            Ok::<_, StoreError>(group.into_iter().map(|(at, _)| at).zip(found))
        });
        let mut all = Vec::with_capacity(items.len());
        for group in futures::future::join_all(reads).await {
            all.extend(group?);
        }
        all.sort_by_key(|(at, _)| *at);
        all.into_iter()
            .map(|(_, json)| json.map(|j| decode("case", &j)).transpose())
            .collect()
    }
}
