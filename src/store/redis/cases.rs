//! Cases and what follows them: the case hash, the id -> subject pointer, the subject's open
//! pointer, the sharded `due` and `decided` indexes, and Leave marks.
//!
//! A case write is one Lua script over the case, its subject's open pointer, its Leave mark and
//! its shard's two indexes (one hash tag, so one Cluster slot). A write whose answer is lost is
//! read back by its write token and reported as written, not written, or
//! [`StoreError::Unconfirmed`]. This file must not decide which transitions are legal; it only
//! writes what `Store` hands it, if the version still matches.
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::{RedisError, Script};

use super::{
    DELETE_IF_EQUAL, RECONNECT_RETRIES, RedisStore, answer_lost, map_err, ms, stored_case_id,
};
use crate::cases::{Case, CaseState, Subject};
use crate::ids::CaseId;
use crate::store::keys::{CASE_RETENTION, INDEX_SHARDS, POINTER_MARGIN, shard_of};
use crate::store::{
    DecidedMark, IndexEntry, LeftMark, Opened, StoreError, Swap, decode, encode, left_mark_ttl,
};

/// Opens a case unless the subject has an open one, indexing it by deadline in the same step.
/// KEYS: open pointer, case hash, due index of the shard (one slot). ARGV: id, json, ttl ms,
/// deadline ms, write token. Returns {1, id} when created, {0, existing id} otherwise.
static OPEN_CASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local existing = redis.call('GET', KEYS[1])
if existing then
  return {0, existing}
end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('HSET', KEYS[2], 'v', 1, 'json', ARGV[2], 'w', ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {1, ARGV[1]}
"#,
    )
});

/// Compare-and-swap of one case with every index that follows it, in one atomic step.
/// KEYS: case hash, open pointer, due index, decided index, Leave mark (one slot).
/// ARGV: 1 expected version, 2 new json, 3 new version, 4 id, 5 '1' if the new state is open,
/// 6 ttl ms, 7 write token, 8 deadline ms if the new state is Pending (else ''),
/// 9 decided move ('enter', 'keep' or 'leave'), 10 decided score ms, 11 Leave mark json (or ''),
/// 12 Leave mark ttl ms.
/// Returns {1, strays} written (strays: index entries that could not be removed), {0, json}
/// stale, {2, holder} subject busy, {3, ''} missing.
///
/// Redis does not roll a script back, so everything that can fail (an index of the wrong type)
/// comes before the case is written, and the removals after it use `pcall`: either nothing of
/// the case is written, or all of it is and only a harmless stray index entry may remain.
static SWAP_CASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local v = redis.call('HGET', KEYS[1], 'v')
if not v then
  return {3, ''}
end
if v ~= ARGV[1] then
  return {0, redis.call('HGET', KEYS[1], 'json')}
end
local holder = redis.call('GET', KEYS[2])
if ARGV[5] == '1' and holder and holder ~= ARGV[4] then
  return {2, holder}
end
if ARGV[8] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[8], ARGV[4])
end
if ARGV[9] == 'enter' then
  redis.call('ZADD', KEYS[4], ARGV[10], ARGV[4])
elseif ARGV[9] == 'keep' then
  redis.call('ZADD', KEYS[4], 'NX', ARGV[10], ARGV[4])
end
if ARGV[11] ~= '' then
  redis.call('SET', KEYS[5], ARGV[11], 'PX', ARGV[12])
end
if ARGV[5] == '1' then
  redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[6])
elseif holder == ARGV[4] then
  redis.call('DEL', KEYS[2])
end
redis.call('HSET', KEYS[1], 'v', ARGV[3], 'json', ARGV[2], 'w', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
local strays = 0
local function drop(key)
  local r = redis.pcall('ZREM', key, ARGV[4])
  if type(r) == 'table' and r.err then
    strays = strays + 1
  end
end
if ARGV[8] == '' then
  drop(KEYS[3])
end
if ARGV[9] == 'leave' then
  drop(KEYS[4])
end
return {1, tostring(strays)}
"#,
    )
});

/// Drops an index entry only if its score is still the one read.
/// KEYS: sorted set. ARGV: member, score.
static FORGET_IF_SCORE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
"#,
    )
});

/// Moves an index entry to a new score only if its score is still the one read.
/// KEYS: sorted set. ARGV: member, old score, new score. Returns 1 when moved.
static MOVE_IF_SCORE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
  return 1
end
return 0
"#,
    )
});

impl RedisStore {
    pub(crate) async fn open_case(&self, case: Case) -> Result<Opened, StoreError> {
        let keys = self.keys();
        let json = encode(&case)?;
        let ttl = ms(CASE_RETENTION);
        let subject_key = case.subject.key();
        let shard = shard_of(&subject_key);
        // The id -> subject pointer is written first (it lives in the case id's own slot): if
        // we crash before the case itself, it points at nothing, which readers treat as absent.
        self.query::<()>(
            redis::cmd("SET")
                .arg(keys.case_subject(&case.id))
                .arg(&subject_key)
                .arg("PX")
                .arg(ms(CASE_RETENTION + POINTER_MARGIN)),
        )
        .await?;
        // One retry covers a pointer left dangling by a case that outlived its retention.
        for _ in 0..2 {
            let (created, id): (i64, String) = self
                .invoke(
                    OPEN_CASE
                        .key(keys.open_case(&case.subject))
                        .key(keys.case(&case.subject, &case.id))
                        .key(keys.due(shard))
                        .arg(case.id.as_str())
                        .arg(&json)
                        .arg(ttl)
                        .arg(case.decide_by.timestamp_millis())
                        .arg(write_token()),
                )
                .await?;
            if created == 1 {
                return Ok(Opened::Created(case));
            }
            let existing_id = stored_case_id(id)?;
            match self.load_case(&existing_id).await? {
                Some(existing) if existing.state.is_open() => {
                    self.forget_new(&case.id).await?;
                    return Ok(Opened::Existing(existing));
                }
                _ => {
                    let _: i64 = self
                        .invoke(
                            DELETE_IF_EQUAL
                                .key(keys.open_case(&case.subject))
                                .arg(existing_id.as_str()),
                        )
                        .await?;
                }
            }
        }
        Err(StoreError::Conflict(format!(
            "{} keeps getting new open cases",
            case.subject
        )))
    }

    /// Removes the pointer written for a case that turned out not to be needed.
    async fn forget_new(&self, id: &CaseId) -> Result<(), StoreError> {
        let _: i64 = self
            .query(redis::cmd("DEL").arg(self.keys().case_subject(id)))
            .await?;
        Ok(())
    }

    /// The subject key a case id belongs to, from its pointer.
    async fn subject_key_of(&self, id: &CaseId) -> Result<Option<String>, StoreError> {
        self.query(redis::cmd("GET").arg(self.keys().case_subject(id)))
            .await
    }

    pub(crate) async fn subject_of(&self, id: &CaseId) -> Result<Option<Subject>, StoreError> {
        Ok(self.load_case(id).await?.map(|case| case.subject))
    }

    pub(crate) async fn load_case(&self, id: &CaseId) -> Result<Option<Case>, StoreError> {
        let Some(subject_key) = self.subject_key_of(id).await? else {
            return Ok(None);
        };
        let json: Option<String> = self
            .query(
                redis::cmd("HGET")
                    .arg(self.keys().case_by_subject_key(&subject_key, id))
                    .arg("json"),
            )
            .await?;
        json.map(|j| decode(&format!("case {id}"), &j)).transpose()
    }

    pub(crate) async fn open_case_id(
        &self,
        subject: &Subject,
    ) -> Result<Option<CaseId>, StoreError> {
        let id: Option<String> = self
            .query(redis::cmd("GET").arg(self.keys().open_case(subject)))
            .await?;
        id.map(stored_case_id).transpose()
    }

    pub(crate) async fn swap_case(
        &self,
        expected: u64,
        next: &Case,
        decided: DecidedMark,
        left: Option<&LeftMark>,
        now: DateTime<Utc>,
    ) -> Result<Swap, StoreError> {
        let keys = self.keys();
        let shard = shard_of(&next.subject.key());
        // The id -> subject pointer lives in another slot, so it cannot join the script. Its
        // TTL is refreshed first, a day longer than the case's: it always outlives the case.
        let _: i64 = self
            .query(
                redis::cmd("PEXPIRE")
                    .arg(keys.case_subject(&next.id))
                    .arg(ms(CASE_RETENTION + POINTER_MARGIN)),
            )
            .await?;
        let deadline = if next.state == CaseState::Pending {
            next.decide_by.timestamp_millis().to_string()
        } else {
            String::new()
        };
        let (decided_move, decided_at) = match decided {
            DecidedMark::Enter(at) => ("enter", at.timestamp_millis()),
            DecidedMark::Keep(at) => ("keep", at.timestamp_millis()),
            DecidedMark::Drop => ("leave", 0),
        };
        let (left_json, left_ttl) = match left {
            Some(mark) => (encode(mark)?, ms(left_mark_ttl(mark, now))),
            None => (String::new(), 0),
        };
        let token = write_token();
        let sent: Result<(i64, String), RedisError> = SWAP_CASE
            .key(keys.case(&next.subject, &next.id))
            .key(keys.open_case(&next.subject))
            .key(keys.due(shard))
            .key(keys.decided(shard))
            .key(keys.left(&next.subject))
            .arg(expected)
            .arg(encode(next)?)
            .arg(next.version)
            .arg(next.id.as_str())
            .arg(if next.state.is_open() { "1" } else { "0" })
            .arg(ms(CASE_RETENTION))
            .arg(&token)
            .arg(deadline)
            .arg(decided_move)
            .arg(decided_at)
            .arg(left_json)
            .arg(left_ttl)
            .invoke_async(&mut self.conn())
            .await;
        let (code, payload) = match sent {
            Ok(answer) => answer,
            Err(e) if answer_lost(&e) => return self.read_back(expected, next, &token, &e).await,
            Err(e) => return Err(map_err(e)),
        };
        match code {
            1 => {
                if payload != "0" {
                    tracing::warn!(case = %next.id, strays = %payload, "a case was written but an index entry could not be removed; readers skip it");
                }
                Ok(Swap::Written)
            }
            0 => Ok(Swap::Stale(Box::new(decode(
                &format!("case {}", next.id),
                &payload,
            )?))),
            2 => Ok(Swap::SubjectBusy(stored_case_id(payload)?)),
            _ => Ok(Swap::Missing),
        }
    }

    /// After a case write whose answer was lost, finds out whether it happened: our token at
    /// our version means written; the expected version still there means not written (the
    /// caller re-reads and tries again); anything else, or no answer, is unconfirmed.
    async fn read_back(
        &self,
        expected: u64,
        next: &Case,
        token: &str,
        lost: &RedisError,
    ) -> Result<Swap, StoreError> {
        tracing::warn!(case = %next.id, error = %lost, "the answer to a case write was lost; reading it back");
        let key = self.keys().case(&next.subject, &next.id);
        let mut last = lost.to_string();
        for _ in 0..RECONNECT_RETRIES + 1 {
            let read: Result<StoredWrite, RedisError> = redis::cmd("HMGET")
                .arg(&key)
                .arg("v")
                .arg("w")
                .arg("json")
                .query_async(&mut self.conn())
                .await;
            let (version, stored_token, json) = match read {
                Ok(found) => found,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let (Some(version), Some(json)) = (version, json) else {
                return Ok(Swap::Missing);
            };
            let version: u64 = version
                .parse()
                .map_err(|_| StoreError::Corrupt(format!("case {} version {version}", next.id)))?;
            if version == next.version && stored_token.as_deref() == Some(token) {
                return Ok(Swap::Written);
            }
            if version == expected || version == next.version {
                // Not ours: the caller recomputes on what is stored, as after any lost race.
                return Ok(Swap::Stale(Box::new(decode(
                    &format!("case {}", next.id),
                    &json,
                )?)));
            }
            return Err(StoreError::Unconfirmed(format!(
                "case {} moved on to version {version} before its write could be confirmed",
                next.id
            )));
        }
        Err(StoreError::Unconfirmed(format!(
            "the write of case {} could not be read back: {last}",
            next.id
        )))
    }

    /// Reads one index over all shards (each shard is its own slot), earliest first.
    async fn read_index(
        &self,
        key: impl Fn(u16) -> String,
        up_to: DateTime<Utc>,
    ) -> Result<Vec<IndexEntry>, StoreError> {
        let reads = (0..INDEX_SHARDS).map(|shard| {
            let key = key(shard);
            async move {
                let flat: Vec<(String, f64)> = self
                    .query(
                        redis::cmd("ZRANGE")
                            .arg(key)
                            .arg("-inf")
                            .arg(up_to.timestamp_millis())
                            .arg("BYSCORE")
                            .arg("WITHSCORES"),
                    )
                    .await?;
                flat.into_iter()
                    .map(|(id, at)| {
                        let id = stored_case_id(id)?;
                        // Scores are whole milliseconds, exact in a double.
                        let at = DateTime::from_timestamp_millis(at as i64)
                            .ok_or_else(|| StoreError::Corrupt(format!("index score {at}")))?;
                        Ok(IndexEntry { id, at, shard })
                    })
                    .collect::<Result<Vec<_>, StoreError>>()
            }
        });
        let mut all = Vec::new();
        for shard in futures::future::join_all(reads).await {
            all.extend(shard?);
        }
        all.sort_by(|a, b| (a.at, a.id.as_str()).cmp(&(b.at, b.id.as_str())));
        Ok(all)
    }

    pub(crate) async fn due_ids(&self, now: DateTime<Utc>) -> Result<Vec<IndexEntry>, StoreError> {
        self.read_index(|shard| self.keys().due(shard), now).await
    }

    /// Drops a due entry only if it still has the score read.
    pub(crate) async fn forget_due(&self, entry: &IndexEntry) -> Result<(), StoreError> {
        self.forget_if_score(self.keys().due(entry.shard), entry)
            .await
    }

    pub(crate) async fn decided_ids(
        &self,
        cutoff: DateTime<Utc>,
    ) -> Result<Vec<IndexEntry>, StoreError> {
        self.read_index(|shard| self.keys().decided(shard), cutoff)
            .await
    }

    pub(crate) async fn forget_decided(&self, entry: &IndexEntry) -> Result<(), StoreError> {
        self.forget_if_score(self.keys().decided(entry.shard), entry)
            .await
    }

    async fn forget_if_score(&self, key: String, entry: &IndexEntry) -> Result<(), StoreError> {
        let _: i64 = self
            .invoke(
                FORGET_IF_SCORE
                    .key(key)
                    .arg(entry.id.as_str())
                    .arg(entry.at.timestamp_millis()),
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn postpone_decided(
        &self,
        subject: &Subject,
        id: &CaseId,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let moved: i64 = self
            .invoke(
                MOVE_IF_SCORE
                    .key(self.keys().decided(shard_of(&subject.key())))
                    .arg(id.as_str())
                    .arg(since.timestamp_millis())
                    .arg(until.timestamp_millis()),
            )
            .await?;
        Ok(moved == 1)
    }

    // ----- what sweeps read: Leave marks and open pointers of many subjects -----

    /// Reads many string keys, one MGET per shard (a slot each), in the order given.
    async fn get_many(&self, keys: Vec<(u16, String)>) -> Result<Vec<Option<String>>, StoreError> {
        let mut by_shard: std::collections::BTreeMap<u16, Vec<(usize, String)>> =
            std::collections::BTreeMap::new();
        for (at, (shard, key)) in keys.into_iter().enumerate() {
            by_shard.entry(shard).or_default().push((at, key));
        }
        let reads = by_shard.into_values().map(|group| async move {
            let mut cmd = redis::cmd("MGET");
            for (_, key) in &group {
                cmd.arg(key);
            }
            let found: Vec<Option<String>> = self.query(&cmd).await?;
            Ok::<_, StoreError>(group.into_iter().map(|(at, _)| at).zip(found))
        });
        let mut all = Vec::new();
        for group in futures::future::join_all(reads).await {
            all.extend(group?);
        }
        all.sort_by_key(|(at, _)| *at);
        Ok(all.into_iter().map(|(_, value)| value).collect())
    }

    pub(crate) async fn left_marks(
        &self,
        subjects: &[Subject],
    ) -> Result<Vec<Option<LeftMark>>, StoreError> {
        let keys = subjects
            .iter()
            .map(|s| (shard_of(&s.key()), self.keys().left(s)))
            .collect();
        self.get_many(keys)
            .await?
            .into_iter()
            .map(|json| json.map(|j| decode("leave mark", &j)).transpose())
            .collect()
    }

    /// Every Leave mark: their keys found by `SCAN` (one pass on one server; on a Cluster one
    /// pass per shard, on the node holding that shard's slot), then read like the sweep reads
    /// them, one `MGET` per shard. A mark that expired between the two is left out.
    pub(crate) async fn all_left_marks(&self) -> Result<Vec<(Subject, LeftMark)>, StoreError> {
        let keys = self.keys();
        let mut found = Vec::new();
        if self.is_cluster() {
            for shard in 0..INDEX_SHARDS {
                let pattern = keys.left_pattern(Some(shard));
                found.extend(self.scan(&pattern, &pattern).await?);
            }
        } else {
            let pattern = keys.left_pattern(None);
            found = self.scan(&pattern, &pattern).await?;
        }
        found.sort_unstable();
        found.dedup();
        let subjects: Vec<Subject> = found
            .iter()
            .filter_map(|key| keys.subject_of_left(key))
            .collect();
        let marks = self.left_marks(&subjects).await?;
        Ok(subjects
            .into_iter()
            .zip(marks)
            .filter_map(|(subject, mark)| Some((subject, mark?)))
            .collect())
    }

    pub(crate) async fn open_case_ids(
        &self,
        subjects: &[Subject],
    ) -> Result<Vec<Option<CaseId>>, StoreError> {
        let keys = subjects
            .iter()
            .map(|s| (shard_of(&s.key()), self.keys().open_case(s)))
            .collect();
        self.get_many(keys)
            .await?
            .into_iter()
            .map(|id| id.map(stored_case_id).transpose())
            .collect()
    }
}

/// A case's version, write token and JSON, as read back.
type StoredWrite = (Option<String>, Option<String>, Option<String>);

/// A fresh token naming one case write, so its answer can be read back if lost.
fn write_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
