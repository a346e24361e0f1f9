//! Batched readings for the re-check of an approved group's items: what E2B says of up to 100
//! of them (state, size, metadata, start, and the latest metrics sample) in one listing page
//! and one batch-metrics call, taken just before the items' turns, instead of a detail read
//! and a metrics read per sandbox.
//!
//! E2B's listing cannot be filtered by sandbox id, so a group's items are read through the
//! listing E2B can narrow to them: the metadata pairs all of them had when people decided (the
//! owner, at least), oldest first from the earliest start, page after page. The driver acts on
//! the items in that same order, so each page read covers the next items in turn; when half a
//! page of readings is left the next page is read ahead, in the background, one read at a
//! time, so the turns do not all stop for it. A reading
//! is used only while it is fresh ([`MAX_READING_AGE`]); an older one is read again. An item
//! the listing does not show (gone, restarted, its metadata changed) or that the reader cannot
//! reach within a few pages gets no reading, and the worker re-checks it on its own, as a
//! single case is re-checked: the batched reading only ever saves calls, it never decides.
//! This module reads E2B and nothing else: it must not decide, execute or write the store.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::e2b::{E2bClient, ListQuery, ListedSandbox, MAX_PAGE_LIMIT, Order, SandboxMetric};
use crate::ids::SandboxId;

/// How old a batched reading may be when an item's turn comes; older, it is read again.
pub const MAX_READING_AGE: Duration = Duration::from_secs(5);
/// Pages one item's turn reads (or waits for) at most looking for it before it is re-checked
/// on its own.
const MAX_PAGES_PER_TURN: usize = 3;
/// With fewer readings than this left, the next page is read ahead: half a page, which at the
/// list's concurrency lasts longer than a page read (one listing call and one metrics batch).
const READ_AHEAD_BELOW: usize = MAX_PAGE_LIMIT as usize / 2;

/// What the batched reading says of one sandbox, and when it was read.
#[derive(Debug, Clone)]
pub struct Read {
    pub listed: ListedSandbox,
    /// Its latest sample; `None` when paused or when E2B has none.
    pub metric: Option<SandboxMetric>,
    pub at: Instant,
    /// How many of the group's sandboxes the same page read.
    pub batch: usize,
}

/// Where the current listing stands.
struct Cursor {
    /// `None` once the listing ended.
    next_token: Option<String>,
    /// The start time of the last sandbox listed: the listing is past anything earlier.
    last_started: Option<DateTime<Utc>>,
}

#[derive(Default)]
struct Inner {
    cursor: Option<Cursor>,
    read: HashMap<SandboxId, Read>,
    /// A page is being read (for a turn that needed it, or ahead of the turns): one at a time,
    /// and nobody else reads until it is in.
    fetching: bool,
    /// Reads that failed so far: a turn that waited for one that failed is re-checked on its
    /// own, as the turn that read it would have been.
    failures: u64,
}

/// The batched readings of one approved group's items (shared by the items' workers).
pub struct Readings {
    shared: Arc<Shared>,
}

struct Shared {
    e2b: E2bClient,
    query: ListQuery,
    wanted: HashSet<SandboxId>,
    inner: tokio::sync::Mutex<Inner>,
    /// Told when a page read ends (read or failed).
    fetched: tokio::sync::Notify,
    /// E2B calls made for readings (pages and metrics batches), for the log.
    calls: std::sync::atomic::AtomicU64,
}

/// The metadata pairs every one of `metadata` has, with the same value.
fn shared_pairs<'a>(
    mut metadata: impl Iterator<Item = &'a BTreeMap<String, String>>,
) -> Vec<(String, String)> {
    let Some(first) = metadata.next() else {
        return Vec::new();
    };
    let mut shared: BTreeMap<&String, &String> = first.iter().collect();
    for m in metadata {
        shared.retain(|k, v| m.get(*k) == Some(*v));
    }
    shared
        .into_iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The order a group's items are read (and so acted on) in: E2B's ascending listing order,
/// start time then id.
pub fn listing_order(
    started_at: Option<DateTime<Utc>>,
    id: &SandboxId,
) -> (Option<DateTime<Utc>>, &str) {
    (started_at, id.as_str())
}

impl Readings {
    /// Readings for sandboxes `items` (id, start and metadata as people saw them), which the
    /// caller acts on in [`listing_order`].
    pub fn new<'a>(
        e2b: &E2bClient,
        items: impl Iterator<
            Item = (
                &'a SandboxId,
                Option<DateTime<Utc>>,
                &'a BTreeMap<String, String>,
            ),
        > + Clone,
    ) -> Self {
        let metadata = shared_pairs(items.clone().map(|(_, _, m)| m));
        let earliest = items.clone().map(|(_, s, _)| s).min().flatten();
        let wanted = items.map(|(id, _, _)| id.clone()).collect();
        Self {
            shared: Arc::new(Shared {
                e2b: e2b.clone(),
                query: ListQuery {
                    metadata,
                    started_after: earliest,
                    order: Some(Order::Asc),
                    limit: Some(MAX_PAGE_LIMIT),
                    ..ListQuery::default()
                },
                wanted,
                inner: tokio::sync::Mutex::new(Inner::default()),
                fetched: tokio::sync::Notify::new(),
                calls: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// E2B calls these readings made so far.
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The fresh reading of sandbox `id` (started at `started_at` when people decided), read
    /// now if need be; `None` when the listing does not show it within a few pages (or could
    /// not be read): the caller then re-checks it on its own. Each reading is handed out once.
    /// When few readings are left, the next page is read ahead in the background, so the
    /// turns after them find theirs waiting instead of all stopping for the read.
    pub async fn take(&self, id: &SandboxId, started_at: Option<DateTime<Utc>>) -> Option<Read> {
        let shared = &self.shared;
        for _ in 0..=MAX_PAGES_PER_TURN {
            let mut inner = shared.inner.lock().await;
            if let Some(read) = inner.read.remove(id) {
                if read.at.elapsed() <= MAX_READING_AGE {
                    if inner.read.len() < READ_AHEAD_BELOW
                        && inner
                            .cursor
                            .as_ref()
                            .is_some_and(|c| c.next_token.is_some())
                        && !inner.fetching
                    {
                        shared.start_read(&mut inner, None);
                    }
                    return Some(read);
                }
                // Too old: read again from this sandbox on, with a fresh listing.
                if !inner.fetching {
                    inner.cursor = None;
                }
            } else if !inner.fetching {
                match &inner.cursor {
                    Some(Cursor {
                        next_token: None, ..
                    }) => return None,
                    Some(Cursor {
                        last_started: Some(last),
                        ..
                    }) if started_at.is_none_or(|s| *last > s) => return None,
                    _ => {}
                }
            }
            if !inner.fetching {
                shared.start_read(&mut inner, started_at);
            }
            // Wait for the read under way (registered before the lock is let go, so its end
            // is not missed); a failed one sends this item to its own re-check.
            let failures = inner.failures;
            let fetched = shared.fetched.notified();
            tokio::pin!(fetched);
            fetched.as_mut().enable();
            drop(inner);
            fetched.await;
            if shared.inner.lock().await.failures != failures {
                return None;
            }
        }
        None
    }
}

impl Shared {
    /// Starts reading the listing's next page (a new listing from `from` when there is none) in
    /// a task of its own: a turn that stops waiting (its worker cancelled) leaves the read to
    /// finish and tell the others, never a read marked under way that nobody ends.
    fn start_read(self: &Arc<Self>, inner: &mut Inner, from: Option<DateTime<Utc>>) {
        inner.fetching = true;
        let (query, token) = match &inner.cursor {
            Some(cursor) => (self.query.clone(), cursor.next_token.clone()),
            None => {
                let mut query = self.query.clone();
                query.started_after = from.or(query.started_after);
                (query, None)
            }
        };
        let shared = self.clone();
        tokio::spawn(async move { shared.read_page(query, token).await });
    }

    /// Reads one page (started by [`Shared::start_read`]) without holding the readings, then
    /// keeps what it says of the wanted sandboxes and tells whoever waits.
    async fn read_page(&self, query: ListQuery, token: Option<String>) {
        let result = self.e2b.read_sandboxes_page(&query, token.as_deref()).await;
        let mut inner = self.inner.lock().await;
        inner.fetching = false;
        match result {
            Ok((page, mut metrics)) => {
                let running = page
                    .items
                    .iter()
                    .filter(|s| s.state == crate::e2b::SandboxState::Running)
                    .count();
                let calls = 1 + u64::from(running > 0);
                self.calls
                    .fetch_add(calls, std::sync::atomic::Ordering::Relaxed);
                let at = Instant::now();
                let last_started = page.items.last().map(|s| s.started_at);
                let ours: Vec<ListedSandbox> = page
                    .items
                    .into_iter()
                    .filter(|s| self.wanted.contains(&s.sandbox_id))
                    .collect();
                let batch = ours.len();
                for listed in ours {
                    let metric = metrics.remove(&listed.sandbox_id);
                    inner.read.insert(
                        listed.sandbox_id.clone(),
                        Read {
                            listed,
                            metric,
                            at,
                            batch,
                        },
                    );
                }
                inner.cursor = Some(Cursor {
                    next_token: page.next_token,
                    last_started: last_started
                        .or(inner.cursor.as_ref().and_then(|c| c.last_started)),
                });
            }
            Err(e) => {
                inner.cursor = None;
                inner.failures += 1;
                tracing::warn!(error = %e, "a batched re-check read failed; its sandboxes are re-checked one by one");
            }
        }
        drop(inner);
        self.fetched.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_listing_is_narrowed_by_the_pairs_every_item_shares() {
        let a = m(&[("owner", "bob"), ("app", "ci"), ("run", "1")]);
        let b = m(&[("owner", "bob"), ("app", "ci"), ("run", "2")]);
        let c = m(&[("owner", "bob"), ("app", "web")]);
        assert_eq!(
            shared_pairs([&a, &b].into_iter()),
            [
                ("app".to_owned(), "ci".to_owned()),
                ("owner".to_owned(), "bob".to_owned())
            ]
        );
        assert_eq!(
            shared_pairs([&a, &b, &c].into_iter()),
            [("owner".to_owned(), "bob".to_owned())]
        );
        assert!(shared_pairs([&a, &m(&[])].into_iter()).is_empty());
        assert!(shared_pairs(std::iter::empty()).is_empty());
    }
}
