//! The simulated team's lifecycle event log: one entry per state change the world makes
//! (`created`, `updated`, `paused`, `resumed`, `killed`), as E2B records them for its events API
//! and its webhooks (E2B docs, "Sandbox → Lifecycle events API / webhooks").
//!
//! Plain data like the world: no clock reads, no I/O. Entries get a sequence number in the order
//! they were recorded; the events API pages over that order and the webhook deliverer reads
//! everything after the last sequence it handed out. Events older than E2B's retention (7 days)
//! or past [`MAX_EVENTS`] are dropped from the front.
use std::collections::{BTreeMap, VecDeque};

use super::series::Ms;

/// E2B keeps lifecycle events for 7 days.
pub(crate) const RETENTION_MS: Ms = 7 * 24 * 3600 * 1000;
/// At most this many events are kept (the oldest go first), so a long-running simulator with a
/// busy fleet stays bounded.
pub(crate) const MAX_EVENTS: usize = 200_000;

/// A lifecycle event type, as E2B names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Created,
    Updated,
    Paused,
    Resumed,
    Killed,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Created,
        Kind::Updated,
        Kind::Paused,
        Kind::Resumed,
        Kind::Killed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Created => "sandbox.lifecycle.created",
            Kind::Updated => "sandbox.lifecycle.updated",
            Kind::Paused => "sandbox.lifecycle.paused",
            Kind::Resumed => "sandbox.lifecycle.resumed",
            Kind::Killed => "sandbox.lifecycle.killed",
        }
    }

    pub fn parse(text: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

/// One recorded event.
#[derive(Clone, Debug)]
pub(crate) struct Event {
    /// Order of recording, from 1.
    pub seq: u64,
    pub id: String,
    pub kind: Kind,
    pub sandbox_id: String,
    pub template_id: String,
    pub build_id: String,
    pub execution_id: String,
    pub at: Ms,
    pub metadata: BTreeMap<String, String>,
    /// `updated`: the new end of the sandbox's life (`set_timeout` in `eventData`).
    pub set_timeout: Option<Ms>,
}

/// The log, oldest first.
#[derive(Default)]
pub(crate) struct Log {
    events: VecDeque<Event>,
    next_seq: u64,
}

impl Log {
    /// Appends an event (its `seq` is assigned here) and drops what retention no longer keeps.
    pub fn push(&mut self, mut event: Event) {
        self.next_seq += 1;
        event.seq = self.next_seq;
        let horizon = event.at - RETENTION_MS;
        self.events.push_back(event);
        while self.events.len() > MAX_EVENTS || self.events.front().is_some_and(|e| e.at < horizon)
        {
            self.events.pop_front();
        }
    }

    /// The sequence number of the last event recorded (0 before any).
    pub fn last_seq(&self) -> u64 {
        self.next_seq
    }

    /// Events recorded after `seq`, oldest first.
    pub fn after(&self, seq: u64) -> impl Iterator<Item = &Event> {
        let start = self.events.partition_point(|e| e.seq <= seq);
        self.events.range(start..)
    }

    /// One page of the events API: `sandbox` narrows to one sandbox; `ascending` pages from the
    /// oldest, otherwise from the newest (E2B's default); `offset` and `limit` count matching
    /// events.
    pub fn page(
        &self,
        sandbox: Option<&str>,
        ascending: bool,
        offset: usize,
        limit: usize,
    ) -> Vec<&Event> {
        let matches = |e: &&Event| sandbox.is_none_or(|id| e.sandbox_id == id);
        if ascending {
            self.events
                .iter()
                .filter(matches)
                .skip(offset)
                .take(limit)
                .collect()
        } else {
            self.events
                .iter()
                .rev()
                .filter(matches)
                .skip(offset)
                .take(limit)
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(sandbox: &str, at: Ms) -> Event {
        Event {
            seq: 0,
            id: format!("e-{sandbox}-{at}"),
            kind: Kind::Created,
            sandbox_id: sandbox.to_owned(),
            template_id: "base".to_owned(),
            build_id: "b".to_owned(),
            execution_id: "x".to_owned(),
            at,
            metadata: BTreeMap::new(),
            set_timeout: None,
        }
    }

    #[test]
    fn pages_run_newest_first_by_default_and_filter_by_sandbox() {
        let mut log = Log::default();
        for (i, s) in ["a", "b", "a", "c", "a"].iter().enumerate() {
            log.push(event(s, i as Ms * 1000));
        }
        let newest: Vec<u64> = log.page(None, false, 0, 2).iter().map(|e| e.seq).collect();
        assert_eq!(newest, [5, 4]);
        let oldest: Vec<u64> = log.page(None, true, 1, 2).iter().map(|e| e.seq).collect();
        assert_eq!(oldest, [2, 3]);
        let of_a: Vec<u64> = log
            .page(Some("a"), false, 1, 10)
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(of_a, [3, 1]);
        let after: Vec<u64> = log.after(3).map(|e| e.seq).collect();
        assert_eq!(after, [4, 5]);
    }

    #[test]
    fn events_past_the_retention_are_dropped() {
        let mut log = Log::default();
        log.push(event("a", 0));
        log.push(event("b", RETENTION_MS + 1));
        assert_eq!(log.page(None, true, 0, 10).len(), 1);
        assert_eq!(log.last_seq(), 2);
    }
}
