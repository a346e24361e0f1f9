//! How a sweep pass lists the fleet: every running and every paused sandbox, as fast as E2B's
//! paging allows.
//!
//! Paging is sequential within one listing (each page needs the previous page's token), so the
//! listing's time is its longest chain of pages. Two things shorten the chain:
//!
//! - **One listing per state.** Running and paused sandboxes are listed separately (E2B's
//!   `state` filter), at the same time.
//! - **Each listing from both ends.** E2B sorts by start time in either direction (`order`),
//!   so a state's listing is read newest first and oldest first at once, and each end stops
//!   when it has passed the other ([`Ends`]). The chain is about half the state's pages.
//!
//! The oldest-first end starts only once the newest-first end's first page says there is more:
//! a state with one page of sandboxes costs one call, as before.
//!
//! The ends meet by start time, not by sandbox: an end stops when its last page reached past
//! the other end's last page *strictly*, so every start time is wholly inside one end or the
//! other, whatever order E2B gives sandboxes that started at the same instant. The sandboxes
//! both ends read around the meeting point (at most a page or two) come twice: the caller keeps
//! the first sighting of each id, as it does for a sandbox that changed state between the
//! running and the paused listing.
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};
use tokio_util::task::AbortOnDropHandle;

use super::context::SweepError;
use crate::e2b::paging::{PageGuard, PageStep};
use crate::e2b::{
    DEFAULT_MAX_PAGES, E2bClient, ListQuery, ListedSandbox, MAX_PAGE_LIMIT, Order, StateFilter,
};

/// The listings a pass pages through at the same time.
const STATES: [StateFilter; 2] = [StateFilter::Running, StateFilter::Paused];

/// What a pager hands to the judges.
pub(super) enum Paged {
    Page(Vec<ListedSandbox>),
    /// Paging of this listing stopped before E2B said it was complete, for this reason.
    Stopped(StateFilter, String),
}

/// Starts the pagers (two per state); their pages arrive on the receiver, which ends when
/// every pager has finished. Dropping the returned handles aborts the pagers.
pub(super) fn start(
    e2b: &E2bClient,
    capacity: usize,
) -> (
    Vec<AbortOnDropHandle<()>>,
    mpsc::Receiver<Result<Paged, SweepError>>,
) {
    let (tx, rx) = mpsc::channel(capacity);
    let mut pagers = Vec::new();
    for state in STATES {
        let ends = Arc::new(Mutex::new(Ends::default()));
        let (go, wait) = oneshot::channel();
        for (order, start) in [
            (Order::Desc, Start::Now(Some(go))),
            (Order::Asc, Start::WhenTold(wait)),
        ] {
            let pager = Pager {
                state,
                order,
                ends: ends.clone(),
            };
            let task = list_pages(e2b.clone(), pager, start, tx.clone());
            pagers.push(AbortOnDropHandle::new(tokio::spawn(task)));
        }
    }
    (pagers, rx)
}

/// How far each end of one state's listing has read: the start time of the last sandbox of
/// its latest page.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ends {
    /// Newest first: every sandbox started after this has been read.
    newest_first: Option<DateTime<Utc>>,
    /// Oldest first: every sandbox started before this has been read.
    oldest_first: Option<DateTime<Utc>>,
}

impl Ends {
    /// Records that the end read in `order` has got to `reached` (`None`: its page was empty),
    /// and says whether the two ends have passed each other, so that together they have read
    /// every start time: then neither needs another page.
    pub(super) fn reached(&mut self, order: Order, reached: Option<DateTime<Utc>>) -> bool {
        if let Some(at) = reached {
            match order {
                Order::Desc => self.newest_first = Some(at),
                Order::Asc => self.oldest_first = Some(at),
            }
        }
        matches!(
            (self.oldest_first, self.newest_first),
            (Some(oldest_to), Some(newest_to)) if oldest_to > newest_to
        )
    }
}

/// One end of one state's listing.
struct Pager {
    state: StateFilter,
    order: Order,
    ends: Arc<Mutex<Ends>>,
}

/// When an end starts reading.
enum Start {
    /// At once; tells the other end to start once there is more than one page.
    Now(Option<oneshot::Sender<()>>),
    /// When told (the other end's first page had a next token); never if that end is done.
    WhenTold(oneshot::Receiver<()>),
}

/// Sends every page of one end, in order, until E2B says there are no more or the other end
/// has been passed.
async fn list_pages(
    e2b: E2bClient,
    pager: Pager,
    start: Start,
    tx: mpsc::Sender<Result<Paged, SweepError>>,
) {
    let mut go = match start {
        Start::Now(go) => go,
        Start::WhenTold(wait) => {
            if wait.await.is_err() {
                return;
            }
            None
        }
    };
    let query = ListQuery {
        state: pager.state,
        order: Some(pager.order),
        limit: Some(MAX_PAGE_LIMIT),
        ..ListQuery::default()
    };
    let mut guard = PageGuard::new(DEFAULT_MAX_PAGES);
    let mut token: Option<String> = None;
    loop {
        let page = match e2b.list_sandboxes_page(&query, token.as_deref()).await {
            Ok(page) => page,
            Err(e) => {
                let _ = tx.send(Err(SweepError::Listing(e))).await;
                return;
            }
        };
        let met = pager
            .ends
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reached(pager.order, page.items.last().map(|s| s.started_at));
        let step = guard.after_page(page.next_token.as_deref());
        if tx.send(Ok(Paged::Page(page.items))).await.is_err() {
            return;
        }
        if met {
            return;
        }
        match step {
            PageStep::Next(next) => {
                if let Some(go) = go.take() {
                    let _ = go.send(());
                }
                token = Some(next);
            }
            PageStep::Done => return,
            PageStep::Stop(reason) => {
                tracing::warn!(
                    %reason,
                    state = pager.state.as_query(),
                    order = pager.order.as_str(),
                    "sweep listing stopped early"
                );
                let _ = tx
                    .send(Ok(Paged::Stopped(pager.state, reason.to_string())))
                    .await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: u32) -> Option<DateTime<Utc>> {
        Some(DateTime::from_timestamp(i64::from(minute) * 60, 0).unwrap())
    }

    #[test]
    fn the_ends_meet_only_once_they_have_passed_each_other() {
        let mut ends = Ends::default();
        assert!(
            !ends.reached(Order::Desc, at(50)),
            "one end alone never meets"
        );
        assert!(!ends.reached(Order::Asc, at(10)));
        assert!(!ends.reached(Order::Asc, at(30)));
        // Reaching the other end's start time exactly is not enough: sandboxes that started
        // at that instant may be split between the ends' pages in any order.
        assert!(!ends.reached(Order::Desc, at(30)));
        assert!(ends.reached(Order::Asc, at(31)));
        // Once passed, the other end sees it too.
        assert!(ends.reached(Order::Desc, at(29)));
    }

    #[test]
    fn an_empty_page_moves_neither_end() {
        let mut ends = Ends::default();
        assert!(!ends.reached(Order::Desc, at(20)));
        assert!(!ends.reached(Order::Asc, None));
        assert!(!ends.reached(Order::Asc, at(20)));
        assert!(ends.reached(Order::Asc, at(21)));
    }
}
