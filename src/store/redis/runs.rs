//! Runs: one hash per run (its JSON, version and output total), its kept output and its files
//! until they are uploaded, all under the run id's hash tag. The record's JSON is opaque here:
//! `runs` reads and writes it; this file only makes each write atomic.
use std::sync::LazyLock;

use redis::Script;

use super::wake::{change_message, runs_channel};
use super::{RedisStore, ms};
use crate::ids::RunId;
use crate::store::keys::RUN_RETENTION;
use crate::store::{OutputCount, StoreError, StoredRun};

/// Creates a run unless its id is taken. KEYS: run hash, files. ARGV: json, files json, ttl ms.
/// Returns 1 when created, 0 when the id was taken.
static CREATE_RUN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'v', 1, 'json', ARGV[1], 'total', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
"#,
    )
});

/// Compare-and-swap of a run's JSON. KEYS: run hash, output, output tail. ARGV: expected
/// version, json, ttl ms, the run-change channel and message (see `wake.rs`). Returns 1
/// written (and announced), 0 stale or missing.
static SWAP_RUN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local v = redis.call('HGET', KEYS[1], 'v')
if not v or v ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'v', tonumber(v) + 1, 'json', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
for i = 2, 3 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[3])
  end
end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"#,
    )
});

/// Counts a chunk of output and keeps what fits under the cap as the head; what comes after a
/// full head goes to the tail, which is cut back to its last `cap` bytes whenever it holds
/// twice that (so each byte is copied at most once more). KEYS: run hash, output, output tail.
/// ARGV: chunk, cap, ttl ms, the run-change channel and message (see `wake.rs`). Returns
/// {kept, total}. A run that is gone counts nothing and announces nothing.
static APPEND_OUTPUT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, 0}
end
local cap = tonumber(ARGV[2])
local total = redis.call('HINCRBY', KEYS[1], 'total', string.len(ARGV[1]))
local kept = redis.call('STRLEN', KEYS[2])
local room = cap - kept
local rest = ARGV[1]
if room > 0 then
  kept = redis.call('APPEND', KEYS[2], string.sub(ARGV[1], 1, room))
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  rest = string.sub(ARGV[1], room + 1)
end
if string.len(rest) > 0 and cap > 0 then
  local held = redis.call('APPEND', KEYS[3], rest)
  if held >= 2 * cap then
    redis.call('SET', KEYS[3], redis.call('GETRANGE', KEYS[3], -cap, -1))
  end
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return {kept, total}
"#,
    )
});

/// A run hash's `v`, `json` and `total`, any of them missing when the run is gone.
type RunFields = (Option<u64>, Option<String>, Option<u64>);

impl RedisStore {
    pub(crate) async fn create_run(
        &self,
        id: &RunId,
        json: &str,
        files_json: &str,
    ) -> Result<(), StoreError> {
        let created: i64 = self
            .invoke(
                CREATE_RUN
                    .key(self.keys().run(id))
                    .key(self.keys().run_files(id))
                    .arg(json)
                    .arg(files_json)
                    .arg(ms(RUN_RETENTION)),
            )
            .await?;
        if created == 1 {
            Ok(())
        } else {
            Err(StoreError::Conflict(format!("run {id} already exists")))
        }
    }

    pub(crate) async fn load_run(&self, id: &RunId) -> Result<Option<StoredRun>, StoreError> {
        let (fields, kept): (RunFields, u64) = self
            .query_pipe(
                redis::pipe()
                    .cmd("HMGET")
                    .arg(self.keys().run(id))
                    .arg("v")
                    .arg("json")
                    .arg("total")
                    .cmd("STRLEN")
                    .arg(self.keys().run_output(id)),
            )
            .await?;
        let (version, json, total) = fields;
        let (Some(version), Some(json)) = (version, json) else {
            return Ok(None);
        };
        Ok(Some(StoredRun {
            json,
            version,
            output_total: total.unwrap_or(0),
            output_kept: kept,
        }))
    }

    pub(crate) async fn swap_run(
        &self,
        id: &RunId,
        expected: u64,
        json: &str,
    ) -> Result<bool, StoreError> {
        let written: i64 = self
            .invoke(
                SWAP_RUN
                    .key(self.keys().run(id))
                    .key(self.keys().run_output(id))
                    .key(self.keys().run_output_tail(id))
                    .arg(expected)
                    .arg(json)
                    .arg(ms(RUN_RETENTION))
                    .arg(runs_channel(self.keys().prefix()))
                    .arg(change_message(&self.inner.origin, id)),
            )
            .await?;
        if written == 1 {
            self.wake_local(id);
        }
        Ok(written == 1)
    }

    pub(crate) async fn append_run_output(
        &self,
        id: &RunId,
        chunk: &[u8],
        cap: u64,
    ) -> Result<OutputCount, StoreError> {
        let (kept, total): (u64, u64) = self
            .invoke(
                APPEND_OUTPUT
                    .key(self.keys().run(id))
                    .key(self.keys().run_output(id))
                    .key(self.keys().run_output_tail(id))
                    .arg(chunk)
                    .arg(cap)
                    .arg(ms(RUN_RETENTION))
                    .arg(runs_channel(self.keys().prefix()))
                    .arg(change_message(&self.inner.origin, id)),
            )
            .await?;
        self.wake_local(id);
        Ok(OutputCount { kept, total })
    }

    pub(crate) async fn run_output(
        &self,
        id: &RunId,
        from: u64,
        max: u64,
    ) -> Result<(Vec<u8>, u64), StoreError> {
        let key = self.keys().run_output(id);
        if max == 0 {
            let kept: u64 = self.query(redis::cmd("STRLEN").arg(&key)).await?;
            return Ok((Vec::new(), kept));
        }
        let (bytes, kept): (Vec<u8>, u64) = self
            .query_pipe(
                redis::pipe()
                    .cmd("GETRANGE")
                    .arg(&key)
                    .arg(from)
                    .arg(from.saturating_add(max - 1))
                    .cmd("STRLEN")
                    .arg(&key),
            )
            .await?;
        // GETRANGE past the end answers "", and from a start beyond the end Redis clamps.
        let bytes = if from >= kept { Vec::new() } else { bytes };
        Ok((bytes, kept))
    }

    pub(crate) async fn run_output_tail(
        &self,
        id: &RunId,
        max: u64,
    ) -> Result<Vec<u8>, StoreError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        self.query(
            redis::cmd("GETRANGE")
                .arg(self.keys().run_output_tail(id))
                .arg(-max)
                .arg(-1),
        )
        .await
    }

    pub(crate) async fn run_files(&self, id: &RunId) -> Result<Option<String>, StoreError> {
        self.query(redis::cmd("GET").arg(self.keys().run_files(id)))
            .await
    }

    pub(crate) async fn replace_run_files(&self, id: &RunId, json: &str) -> Result<(), StoreError> {
        let _: Option<String> = self
            .query(
                redis::cmd("SET")
                    .arg(self.keys().run_files(id))
                    .arg(json)
                    .arg("XX")
                    .arg("KEEPTTL"),
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn delete_run_files(&self, id: &RunId) -> Result<(), StoreError> {
        let _: i64 = self
            .query(redis::cmd("DEL").arg(self.keys().run_files(id)))
            .await?;
        Ok(())
    }
}
