//! Paging over E2B's `X-Next-Token` lists, guaranteed to end.
//!
//! A server that hands back a token it already gave (a bug, or a mock) or never stops handing out
//! new ones must not keep the client in a loop: [`PageGuard`] remembers every token and counts
//! pages, and says why it stopped so callers can tell a partial list from a complete one.
//!
//! This module is pure: it does no I/O and never sleeps.
use std::collections::HashSet;
use std::fmt;

use serde::Serialize;

/// Default page cap of every listing.
pub const DEFAULT_MAX_PAGES: u32 = 10_000;

/// Why a listing stopped before the server said it was finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PagingStop {
    /// The server sent a next token it had sent before.
    RepeatedToken,
    /// The cap on pages was reached (the cap is the value).
    PageCap(u32),
}

impl fmt::Display for PagingStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RepeatedToken => f.write_str(
                "paging was stopped because E2B sent a page token it had already sent; the list may be incomplete",
            ),
            Self::PageCap(cap) => write!(
                f,
                "paging was stopped after the cap of {cap} pages; the list may be incomplete"
            ),
        }
    }
}

/// Every item of a listing, and how it ended.
#[derive(Debug, Clone, Serialize)]
pub struct Listing<T> {
    pub items: Vec<T>,
    /// Pages fetched.
    pub pages: u32,
    /// `Some` when paging stopped early; `None` when the server said there were no more pages.
    pub stopped: Option<PagingStop>,
}

impl<T> Listing<T> {
    /// The items, only if the server said the list was finished: a listing that stopped early
    /// (a repeated token, the page cap) may miss anything, so it counts as unknown, never as
    /// "these are all".
    pub fn complete(self) -> Result<Vec<T>, PagingStop> {
        match self.stopped {
            None => Ok(self.items),
            Some(stop) => Err(stop),
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Page<T> {
    pub items: Vec<T>,
    /// `X-Next-Token`; `None` on the last page.
    pub next_token: Option<String>,
    /// `X-Total-Running`, when E2B sent it.
    pub total_running: Option<u64>,
}

/// What to do after a page arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageStep {
    /// Fetch the next page with this token.
    Next(String),
    /// The server said there are no more pages.
    Done,
    /// Stop here, for this reason.
    Stop(PagingStop),
}

/// Remembers tokens and counts pages for one listing.
#[derive(Debug)]
pub struct PageGuard {
    cap: u32,
    pages: u32,
    seen: HashSet<String>,
}

impl PageGuard {
    /// A guard that allows at most `cap` pages (a cap of 0 is treated as 1).
    pub fn new(cap: u32) -> Self {
        Self {
            cap: cap.max(1),
            pages: 0,
            seen: HashSet::new(),
        }
    }

    /// Records that a page came back with `next_token`, and says what to do next.
    pub fn after_page(&mut self, next_token: Option<&str>) -> PageStep {
        self.pages += 1;
        // An empty header value means "no more pages", like an absent one.
        let Some(token) = next_token.filter(|t| !t.is_empty()) else {
            return PageStep::Done;
        };
        if !self.seen.insert(token.to_owned()) {
            return PageStep::Stop(PagingStop::RepeatedToken);
        }
        if self.pages >= self.cap {
            return PageStep::Stop(PagingStop::PageCap(self.cap));
        }
        PageStep::Next(token.to_owned())
    }

    /// Pages recorded so far.
    pub fn pages(&self) -> u32 {
        self.pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paging_ends_when_the_server_sends_no_token() {
        let mut guard = PageGuard::new(10);
        assert_eq!(guard.after_page(Some("a")), PageStep::Next("a".into()));
        assert_eq!(guard.after_page(Some("b")), PageStep::Next("b".into()));
        assert_eq!(guard.after_page(None), PageStep::Done);
        assert_eq!(guard.pages(), 3);
    }

    #[test]
    fn an_empty_token_counts_as_the_last_page() {
        assert_eq!(PageGuard::new(10).after_page(Some("")), PageStep::Done);
    }

    #[test]
    fn a_token_seen_before_stops_paging() {
        let mut guard = PageGuard::new(10);
        assert_eq!(guard.after_page(Some("a")), PageStep::Next("a".into()));
        assert_eq!(guard.after_page(Some("b")), PageStep::Next("b".into()));
        assert_eq!(
            guard.after_page(Some("a")),
            PageStep::Stop(PagingStop::RepeatedToken)
        );
    }

    #[test]
    fn endless_fresh_tokens_stop_at_the_cap() {
        let mut guard = PageGuard::new(3);
        assert!(matches!(guard.after_page(Some("1")), PageStep::Next(_)));
        assert!(matches!(guard.after_page(Some("2")), PageStep::Next(_)));
        assert_eq!(
            guard.after_page(Some("3")),
            PageStep::Stop(PagingStop::PageCap(3))
        );
        assert_eq!(guard.pages(), 3);
    }

    #[test]
    fn the_last_allowed_page_without_a_token_is_complete_not_capped() {
        let mut guard = PageGuard::new(1);
        assert_eq!(guard.after_page(None), PageStep::Done);
    }

    #[test]
    fn only_a_listing_the_server_finished_is_complete() {
        let whole = Listing {
            items: vec![1, 2],
            pages: 1,
            stopped: None,
        };
        assert_eq!(whole.complete(), Ok(vec![1, 2]));
        let cut = Listing {
            items: vec![1],
            pages: 3,
            stopped: Some(PagingStop::RepeatedToken),
        };
        assert_eq!(cut.complete(), Err(PagingStop::RepeatedToken));
    }

    #[test]
    fn stop_reasons_read_as_sentences() {
        assert!(
            PagingStop::PageCap(5)
                .to_string()
                .contains("cap of 5 pages")
        );
        assert!(
            PagingStop::RepeatedToken
                .to_string()
                .contains("already sent")
        );
    }
}
