//! A click on a case's card: its deduplication mark and the case it names, read together.
//!
//! A click is the Slack request people feel the most, so its first step is one round trip: a
//! Lua script sets the click's mark (`SET NX PX`), follows the case id to its subject and reads
//! the case. The mark and the case -> subject pointer share the case id's hash tag; the case
//! itself lives in its subject's shard, whose key the script builds the way
//! [`Keys::case_by_subject_key`](crate::store::keys::Keys::case_by_subject_key) does. On a Redis
//! Cluster a script may only touch its own slot, so there the script stops at the pointer and
//! the case is read with a second command. This file must not decide what a click means.
use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, Script, Value};

use super::{Client, RedisStore, batch, ms};
use crate::ids::CaseId;
use crate::store::keys::INDEX_SHARDS;
use crate::store::{FirstClick, StoreError, decode};

/// KEYS: 1 the click's mark, 2 the case -> subject pointer (one slot).
/// ARGV: 1 mark ttl ms, 2 key prefix, 3 case id, 4 '1' to read the case here (one server
/// only), 5 number of index shards.
/// Returns 0 a repeat, 1 no such case (plain integers: most clicks under load are Slack's
/// redeliveries, and a table is built in Lua and read back as an array for each), {2, subject
/// key} (ARGV 4 not '1'), {3, case json}.
///
/// The shard is FNV-1a of the subject key, as `keys::shard_of` computes it; 32-bit arithmetic
/// in Lua's doubles: `h * 0x01000193 mod 2^32 = (h * 0x193 + (h << 24)) mod 2^32`.
static FIRST_CLICK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  return 0
end
local subject = redis.call('GET', KEYS[2])
if not subject then
  return 1
end
if ARGV[4] ~= '1' then
  return {2, subject}
end
local h = 2166136261
for i = 1, #subject do
  h = bit.bxor(h, string.byte(subject, i)) % 4294967296
  h = (h * 403 + bit.lshift(h, 24)) % 4294967296
end
local shard = string.format('%02d', h % tonumber(ARGV[5]))
local key = ARGV[2] .. ':case:{s' .. shard .. '}:' .. subject .. ':' .. ARGV[3]
local json = redis.call('HGET', key, 'json')
if not json then
  return 1
end
return {3, json}
"#,
    )
});

/// The click script's invocation on a cluster, where it stops at the case -> subject pointer
/// (ARGV 4 is `0`).
fn cluster_click_script(
    mark_key: &str,
    subject_key: &str,
    ttl_ms: u64,
    prefix: &str,
    case: &CaseId,
) -> redis::ScriptInvocation<'static> {
    let mut invocation = FIRST_CLICK.key(mark_key);
    invocation
        .key(subject_key)
        .arg(ttl_ms)
        .arg(prefix)
        .arg(case.as_str())
        .arg("0")
        .arg(INDEX_SHARDS);
    invocation
}

/// The click script as one `EVALSHA` command, for a batch on one server (where the script reads
/// the case itself).
fn click_cmd(mark_key: &str, subject_key: &str, ttl_ms: u64, prefix: &str, case: &CaseId) -> Cmd {
    let data = mark_key.len() + subject_key.len() + prefix.len() + case.as_str().len() + 40;
    let mut cmd = batch::evalsha(&FIRST_CLICK, 8, data);
    cmd.arg(2)
        .arg(mark_key)
        .arg(subject_key)
        .arg(ttl_ms)
        .arg(prefix)
        .arg(case.as_str())
        .arg("1")
        .arg(INDEX_SHARDS);
    cmd
}

/// What the click script found.
enum ClickAnswer {
    Repeat,
    Missing,
    /// On a cluster: the case's subject, whose slot holds the case.
    Subject(String),
    /// The case's JSON.
    Case(String),
}

/// Reads the click script's answer: 0 or 1 alone, or 2 or 3 with its text.
fn click_answer(value: Value) -> Result<ClickAnswer, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("the click script answered {what}"));
    if let Value::Int(answer) = value {
        return match answer {
            0 => Ok(ClickAnswer::Repeat),
            1 => Ok(ClickAnswer::Missing),
            other => Err(corrupt(other.to_string())),
        };
    }
    let (answer, text): (i64, String) =
        redis::from_redis_value(value).map_err(|e| corrupt(e.to_string()))?;
    match answer {
        2 => Ok(ClickAnswer::Subject(text)),
        3 => Ok(ClickAnswer::Case(text)),
        other => Err(corrupt(other.to_string())),
    }
}

impl RedisStore {
    pub(crate) async fn first_click(
        &self,
        case: &CaseId,
        mark: &str,
        ttl: Duration,
    ) -> Result<FirstClick, StoreError> {
        let one_server = matches!(self.inner.client, Client::Single(_));
        let keys = self.keys();
        let answer = if one_server {
            self.first_click_batched(case, mark, ttl).await?
        } else {
            click_answer(
                self.invoke::<Value>(&cluster_click_script(
                    &keys.click(case, mark),
                    &keys.case_subject(case),
                    ms(ttl),
                    keys.prefix(),
                    case,
                ))
                .await?,
            )?
        };
        let json = match answer {
            ClickAnswer::Repeat => return Ok(FirstClick::Repeat),
            ClickAnswer::Missing => return Ok(FirstClick::Missing),
            ClickAnswer::Case(json) => Some(json),
            // On a cluster: the case lives in its subject's slot.
            ClickAnswer::Subject(subject) => {
                self.query(
                    redis::cmd("HGET")
                        .arg(keys.case_by_subject_key(&subject, case))
                        .arg("json"),
                )
                .await?
            }
        };
        match json {
            None => Ok(FirstClick::Missing),
            Some(json) => Ok(FirstClick::Case(Box::new(decode(
                &format!("case {case}"),
                &json,
            )?))),
        }
    }
}

impl RedisStore {
    /// One server: the click joins the next batch ([`ClickBatcher`]).
    async fn first_click_batched(
        &self,
        case: &CaseId,
        mark: &str,
        ttl: Duration,
    ) -> Result<ClickAnswer, StoreError> {
        let keys = self.keys();
        let cmd = click_cmd(
            &keys.click(case, mark),
            &keys.case_subject(case),
            ms(ttl),
            keys.prefix(),
            case,
        );
        click_answer(
            self.inner
                .batcher
                .call(&self.inner.conn, &FIRST_CLICK, cmd)
                .await?,
        )
    }
}
