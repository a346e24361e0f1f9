//! The job queue: one Redis stream per lane (decisions, runs) with one consumer group each,
//! claims (blocking ones on a dedicated connection), heartbeats of claims being worked on,
//! hand-backs, takeovers of stale claims, and the per-case step logs that make a re-delivered
//! job skip the steps it already did. It must not know what a job does.
use std::time::Duration;

use redis::RedisError;
use redis::streams::{
    StreamAutoClaimReply, StreamId, StreamInfoGroupsReply, StreamPendingCountReply,
    StreamRangeReply, StreamReadReply,
};

use super::{MAX_CLAIM_BLOCK, PAGE, RedisStore, field, map_err, ms};
use crate::cases::StepRecord;
use crate::ids::CaseId;
use crate::store::keys::{CASE_RETENTION, JOB_GROUP};
use crate::store::{ClaimedJob, Job, JobId, Lane, QueueStats, StoreError, decode, encode};

/// Field of a queue entry that holds the job's JSON.
const JOB_FIELD: &str = "job";

impl RedisStore {
    /// Creates every lane's consumer group (reading from the start, so jobs enqueued before the
    /// first worker started are not skipped). An existing group is fine.
    pub(super) async fn ensure_group(&self) -> Result<(), StoreError> {
        for lane in Lane::ALL {
            self.ensure_lane_group(lane).await?;
        }
        Ok(())
    }

    async fn ensure_lane_group(&self, lane: Lane) -> Result<(), StoreError> {
        let result: Result<(), RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(self.keys().jobs(lane))
            .arg(JOB_GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.conn())
            .await;
        match result {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }

    pub(crate) async fn enqueue(&self, job: &Job) -> Result<JobId, StoreError> {
        let lane = job.lane();
        let entry: String = self
            .query(
                redis::cmd("XADD")
                    .arg(self.keys().jobs(lane))
                    .arg("*")
                    .arg(JOB_FIELD)
                    .arg(encode(job)?),
            )
            .await?;
        Ok(JobId { lane, entry })
    }

    pub(crate) async fn claim(
        &self,
        lane: Lane,
        consumer: &str,
        block: Duration,
    ) -> Result<Option<ClaimedJob>, StoreError> {
        let block = block.min(MAX_CLAIM_BLOCK);
        loop {
            let mut cmd = redis::cmd("XREADGROUP");
            cmd.arg("GROUP")
                .arg(JOB_GROUP)
                .arg(consumer)
                .arg("COUNT")
                .arg(1);
            if !block.is_zero() {
                cmd.arg("BLOCK").arg(ms(block));
            }
            cmd.arg("STREAMS").arg(self.keys().jobs(lane)).arg(">");
            let reply: Result<Option<StreamReadReply>, RedisError> = if block.is_zero() {
                cmd.query_async(&mut self.conn()).await
            } else {
                let mut conn = self.blocking_conn().await?;
                let reply = cmd.query_async(&mut conn).await;
                // A connection that failed may be broken; only healthy ones go back.
                if reply.is_ok() {
                    self.return_blocking_conn(conn);
                }
                reply
            };
            let reply = match reply {
                Ok(reply) => reply,
                // Someone deleted the stream (and its group): recreate and read again.
                Err(e) if e.code() == Some("NOGROUP") => {
                    self.ensure_lane_group(lane).await?;
                    continue;
                }
                Err(e) => return Err(map_err(e)),
            };
            let Some(entry) = reply.and_then(|r| r.keys.into_iter().next()?.ids.into_iter().next())
            else {
                return Ok(None);
            };
            match self.decode_job(&entry) {
                Ok(job) => {
                    return Ok(Some(ClaimedJob {
                        id: JobId {
                            lane,
                            entry: entry.id,
                        },
                        job,
                        deliveries: 1,
                    }));
                }
                Err(e) => self.drop_poison(lane, &entry.id, &e).await?,
            }
        }
    }

    fn decode_job(&self, entry: &StreamId) -> Result<Job, StoreError> {
        decode(&format!("job {}", entry.id), &field(entry, JOB_FIELD)?)
    }

    /// Acknowledges an entry that can never be decoded, so it does not come back forever.
    async fn drop_poison(
        &self,
        lane: Lane,
        id: &str,
        error: &StoreError,
    ) -> Result<(), StoreError> {
        tracing::error!(job = id, lane = lane.as_str(), %error, "dropping a queue entry that cannot be decoded");
        self.ack(&JobId {
            lane,
            entry: id.to_owned(),
        })
        .await
    }

    pub(crate) async fn ack(&self, id: &JobId) -> Result<(), StoreError> {
        // Deleting after the ack keeps the stream short; the audit log is the history.
        let key = self.keys().jobs(id.lane);
        self.query_pipe(
            redis::pipe()
                .cmd("XACK")
                .arg(&key)
                .arg(JOB_GROUP)
                .arg(&id.entry)
                .ignore()
                .cmd("XDEL")
                .arg(&key)
                .arg(&id.entry)
                .ignore(),
        )
        .await
    }

    pub(crate) async fn touch_job(&self, id: &JobId, consumer: &str) -> Result<(), StoreError> {
        // XCLAIM to the holder itself resets the entry's idle time; JUSTID leaves its delivery
        // count alone. An entry already acknowledged (or taken over) is simply not claimed.
        let _: Vec<String> = self
            .query(
                redis::cmd("XCLAIM")
                    .arg(self.keys().jobs(id.lane))
                    .arg(JOB_GROUP)
                    .arg(consumer)
                    .arg(0)
                    .arg(&id.entry)
                    .arg("JUSTID"),
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn hand_back(&self, id: &JobId, job: &Job) -> Result<JobId, StoreError> {
        let lane = job.lane();
        let old = self.keys().jobs(id.lane);
        let new = self.keys().jobs(lane);
        let mut pipe = redis::pipe();
        // One transaction when both entries are in one stream (always, but for a job a replica
        // before lanes queued in the decisions stream).
        if old == new {
            pipe.atomic();
        }
        pipe.cmd("XADD")
            .arg(&new)
            .arg("*")
            .arg(JOB_FIELD)
            .arg(encode(job)?)
            .cmd("XACK")
            .arg(&old)
            .arg(JOB_GROUP)
            .arg(&id.entry)
            .ignore()
            .cmd("XDEL")
            .arg(&old)
            .arg(&id.entry)
            .ignore();
        let (entry,): (String,) = self.query_pipe(&pipe).await?;
        Ok(JobId { lane, entry })
    }

    pub(crate) async fn queue_position(
        &self,
        job: &Job,
        up_to: u64,
    ) -> Result<Option<u64>, StoreError> {
        let lane = job.lane();
        let wanted = encode(job)?;
        // Waiting entries are those after the group's last delivered id (all, before any).
        let from = match self.last_delivered(lane).await? {
            Some(after) => format!("({after}"),
            None => "-".to_owned(),
        };
        let waiting: StreamRangeReply = self
            .query(
                redis::cmd("XRANGE")
                    .arg(self.keys().jobs(lane))
                    .arg(from)
                    .arg("+")
                    .arg("COUNT")
                    .arg(up_to),
            )
            .await?;
        for (n, entry) in waiting.ids.iter().enumerate() {
            let same = entry
                .get::<String>(JOB_FIELD)
                .is_some_and(|field| field == wanted);
            if same {
                return Ok(Some(n as u64 + 1));
            }
        }
        Ok(None)
    }

    pub(crate) async fn reclaim_stale(
        &self,
        lane: Lane,
        consumer: &str,
        min_idle: Duration,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        let mut conn = self.conn();
        let mut cursor = "0-0".to_owned();
        let mut taken = Vec::new();
        loop {
            let reply: Result<StreamAutoClaimReply, RedisError> = redis::cmd("XAUTOCLAIM")
                .arg(self.keys().jobs(lane))
                .arg(JOB_GROUP)
                .arg(consumer)
                .arg(u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX))
                .arg(&cursor)
                .arg("COUNT")
                .arg(PAGE)
                .query_async(&mut conn)
                .await;
            let reply = match reply {
                Ok(reply) => reply,
                // No group yet (a lazily connected store, or the stream was deleted): nobody
                // can have claimed anything, so there is nothing to take over.
                Err(e) if e.code() == Some("NOGROUP") => {
                    self.ensure_lane_group(lane).await?;
                    return Ok(taken);
                }
                Err(e) => return Err(map_err(e)),
            };
            for entry in reply.claimed {
                match self.decode_job(&entry) {
                    Ok(job) => {
                        let deliveries = self.deliveries(lane, &entry.id).await?;
                        taken.push(ClaimedJob {
                            id: JobId {
                                lane,
                                entry: entry.id,
                            },
                            job,
                            deliveries,
                        });
                    }
                    Err(e) => self.drop_poison(lane, &entry.id, &e).await?,
                }
            }
            if reply.next_stream_id == "0-0" {
                return Ok(taken);
            }
            cursor = reply.next_stream_id;
        }
    }

    /// Unacknowledged entries and the oldest one's enqueue time (from its stream id, which is
    /// the enqueue time in milliseconds). Acknowledged entries are deleted, so the stream holds
    /// exactly the jobs not yet done.
    pub(crate) async fn queue_stats(&self, lane: Lane) -> Result<QueueStats, StoreError> {
        let key = self.keys().jobs(lane);
        let (depth, oldest): (u64, StreamRangeReply) = self
            .query_pipe(
                redis::pipe()
                    .cmd("XLEN")
                    .arg(&key)
                    .cmd("XRANGE")
                    .arg(&key)
                    .arg("-")
                    .arg("+")
                    .arg("COUNT")
                    .arg(1),
            )
            .await?;
        let oldest_enqueued_at = oldest.ids.first().and_then(|entry| enqueued_at(&entry.id));
        let oldest_waiting_at = match oldest_enqueued_at {
            None => None,
            Some(_) => self.oldest_waiting(lane).await?,
        };
        Ok(QueueStats {
            depth,
            oldest_enqueued_at,
            oldest_waiting_at,
        })
    }

    /// The consumer group's last delivered id in `lane`; `None` before the group exists or
    /// anything was handed out.
    async fn last_delivered(&self, lane: Lane) -> Result<Option<String>, StoreError> {
        let groups: Result<StreamInfoGroupsReply, RedisError> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(self.keys().jobs(lane))
            .query_async(&mut self.conn())
            .await;
        match groups {
            Ok(reply) => Ok(reply
                .groups
                .into_iter()
                .find(|g| g.name == JOB_GROUP)
                .map(|g| g.last_delivered_id)
                .filter(|id| id != "0-0")),
            // The stream or its group does not exist yet: nothing was ever handed out.
            Err(e) if e.code() == Some("ERR") => Ok(None),
            Err(e) => Err(map_err(e)),
        }
    }

    /// The enqueue time of the oldest job no worker has been handed yet: the first entry after
    /// the consumer group's last delivered id (every entry, before the group exists).
    async fn oldest_waiting(
        &self,
        lane: Lane,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError> {
        let after = self.last_delivered(lane).await?.map(|id| format!("({id}"));
        let first: StreamRangeReply = self
            .query(
                redis::cmd("XRANGE")
                    .arg(self.keys().jobs(lane))
                    .arg(after.as_deref().unwrap_or("-"))
                    .arg("+")
                    .arg("COUNT")
                    .arg(1),
            )
            .await?;
        Ok(first.ids.first().and_then(|entry| enqueued_at(&entry.id)))
    }

    /// How many times an entry has been delivered (XAUTOCLAIM counts a takeover).
    async fn deliveries(&self, lane: Lane, id: &str) -> Result<u64, StoreError> {
        let reply: StreamPendingCountReply = self
            .query(
                redis::cmd("XPENDING")
                    .arg(self.keys().jobs(lane))
                    .arg(JOB_GROUP)
                    .arg(id)
                    .arg(id)
                    .arg(1),
            )
            .await?;
        Ok(reply
            .ids
            .first()
            .map(|p| p.times_delivered as u64)
            .unwrap_or(1))
    }

    pub(crate) async fn mark_step_done(
        &self,
        case: &CaseId,
        record: &StepRecord,
    ) -> Result<bool, StoreError> {
        let key = self.keys().steps(case);
        let (added, _): (i64, i64) = self
            .query_pipe(
                redis::pipe()
                    .cmd("HSETNX")
                    .arg(&key)
                    .arg(record.step.as_str())
                    .arg(encode(record)?)
                    .cmd("PEXPIRE")
                    .arg(&key)
                    .arg(ms(CASE_RETENTION)),
            )
            .await?;
        Ok(added == 1)
    }

    pub(crate) async fn steps_done(&self, case: &CaseId) -> Result<Vec<StepRecord>, StoreError> {
        let values: Vec<String> = self
            .query(redis::cmd("HVALS").arg(self.keys().steps(case)))
            .await?;
        values
            .iter()
            .map(|v| decode(&format!("step log of {case}"), v))
            .collect()
    }

    pub(crate) async fn clear_steps(&self, case: &CaseId) -> Result<(), StoreError> {
        let _: i64 = self
            .query(redis::cmd("DEL").arg(self.keys().steps(case)))
            .await?;
        Ok(())
    }
}

/// A stream id's enqueue time (its first part is the time in milliseconds).
fn enqueued_at(id: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    id.split('-')
        .next()?
        .parse::<i64>()
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
}
