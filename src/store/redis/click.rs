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

use redis::Script;

use super::{Client, RedisStore, ms};
use crate::ids::CaseId;
use crate::store::keys::INDEX_SHARDS;
use crate::store::{FirstClick, StoreError, decode};

/// KEYS: 1 the click's mark, 2 the case -> subject pointer (one slot).
/// ARGV: 1 mark ttl ms, 2 key prefix, 3 case id, 4 '1' to read the case here (one server
/// only), 5 number of index shards.
/// Returns {0, ''} a repeat, {1, ''} no such case, {2, subject key} (ARGV 4 not '1'),
/// {3, case json}.
///
/// The shard is FNV-1a of the subject key, as `keys::shard_of` computes it; 32-bit arithmetic
/// in Lua's doubles: `h * 0x01000193 mod 2^32 = (h * 0x193 + (h << 24)) mod 2^32`.
static FIRST_CLICK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  return {0, ''}
end
local subject = redis.call('GET', KEYS[2])
if not subject then
  return {1, ''}
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
  return {1, ''}
end
return {3, json}
"#,
    )
});

impl RedisStore {
    pub(crate) async fn first_click(
        &self,
        case: &CaseId,
        mark: &str,
        ttl: Duration,
    ) -> Result<FirstClick, StoreError> {
        let one_server = matches!(self.inner.client, Client::Single(_));
        let keys = self.keys();
        let (answer, text): (i64, String) = self
            .invoke(
                FIRST_CLICK
                    .key(keys.click(case, mark))
                    .key(keys.case_subject(case))
                    .arg(ms(ttl))
                    .arg(keys.prefix())
                    .arg(case.as_str())
                    .arg(if one_server { "1" } else { "0" })
                    .arg(INDEX_SHARDS),
            )
            .await?;
        let json = match answer {
            0 => return Ok(FirstClick::Repeat),
            1 => return Ok(FirstClick::Missing),
            3 => Some(text),
            // On a cluster: the case lives in its subject's slot.
            2 => {
                self.query(
                    redis::cmd("HGET")
                        .arg(keys.case_by_subject_key(&text, case))
                        .arg("json"),
                )
                .await?
            }
            other => {
                return Err(StoreError::Corrupt(format!(
                    "the click script answered {other}"
                )));
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
