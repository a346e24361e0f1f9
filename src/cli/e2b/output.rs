//! How `steward e2b` prints a result: the model types as JSON with `--json`, otherwise a table or
//! aligned `key  value` lines, plus the value formats (times, durations) every action shares.
//!
//! Warnings about partial listings go to stderr so they show with `--json` too. Nothing here
//! calls E2B.
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::cli::table::{print_pairs, print_table};
use crate::e2b::{Listing, Page};
use crate::ids::{SandboxId, TemplateId};

/// What an action without an answer body acted on, named in its JSON as the API names it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Subject<'a> {
    Sandbox(&'a SandboxId),
    Template(&'a TemplateId),
}

/// How results are printed.
pub(super) struct Output {
    pub(super) json: bool,
}

impl Output {
    /// One value: JSON, or the `key  value` lines `pairs` builds.
    pub(super) fn show<T: Serialize>(
        &self,
        value: &T,
        pairs: impl FnOnce() -> Vec<(&'static str, String)>,
    ) -> anyhow::Result<()> {
        if self.json {
            print_json(value)
        } else {
            print_pairs(&pairs());
            Ok(())
        }
    }

    /// A list the API answers in one call: JSON, or a table with one row per item.
    pub(super) fn table<T: Serialize>(
        &self,
        items: &[T],
        headers: &[&str],
        row: impl Fn(&T) -> Vec<String>,
    ) -> anyhow::Result<()> {
        self.whole_or_rows(&items, items, headers, row).map(drop)
    }

    /// A paged listing followed to its end: JSON, or a table and how many items and pages it took.
    pub(super) fn listing<T: Serialize>(
        &self,
        listing: &Listing<T>,
        headers: &[&str],
        row: impl Fn(&T) -> Vec<String>,
    ) -> anyhow::Result<()> {
        warn_stopped(listing);
        if self.whole_or_rows(listing, &listing.items, headers, row)? {
            println!(
                "\n{} in {}.",
                count(listing.items.len(), "item"),
                count(listing.pages as usize, "page")
            );
        }
        Ok(())
    }

    /// One page of a listing: JSON, or a table and the token of the next page.
    pub(super) fn page<T: Serialize>(
        &self,
        page: &Page<T>,
        headers: &[&str],
        row: impl Fn(&T) -> Vec<String>,
    ) -> anyhow::Result<()> {
        if self.whole_or_rows(page, &page.items, headers, row)? {
            if let Some(total) = page.total_running {
                println!("\n{total} running in total.");
            }
            match &page.next_token {
                Some(token) => println!("More: --page-token {token}"),
                None => println!("This is the last page."),
            }
        }
        Ok(())
    }

    /// Prints `whole` as JSON, or `items` as a table; true when it printed the table, so the
    /// caller can add a footer that only a person reads.
    fn whole_or_rows<T>(
        &self,
        whole: &impl Serialize,
        items: &[T],
        headers: &[&str],
        row: impl Fn(&T) -> Vec<String>,
    ) -> anyhow::Result<bool> {
        if self.json {
            print_json(whole)?;
            return Ok(false);
        }
        print_table(headers, items.iter().map(row).collect());
        Ok(true)
    }

    /// An action with no body in its answer: `{"action", "sandboxID" or "templateID", "ok"}` as
    /// JSON, or `text`.
    pub(super) fn done(
        &self,
        action: &str,
        subject: Subject<'_>,
        text: &str,
    ) -> anyhow::Result<()> {
        if self.json {
            let (key, id) = match subject {
                Subject::Sandbox(id) => ("sandboxID", id.as_str()),
                Subject::Template(id) => ("templateID", id.as_str()),
            };
            let mut obj = serde_json::Map::new();
            obj.insert("action".into(), action.into());
            obj.insert(key.into(), id.into());
            obj.insert("ok".into(), true.into());
            return print_json(&obj);
        }
        println!("{text}");
        Ok(())
    }
}

/// A stopped listing is partial; say so on stderr so it shows with `--json` too.
pub(super) fn warn_stopped<T>(listing: &Listing<T>) {
    if let Some(reason) = listing.stopped {
        eprintln!(
            "Warning: {reason} ({}, {} read).",
            count(listing.pages as usize, "page"),
            count(listing.items.len(), "item")
        );
    }
}

pub(super) fn print_json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

pub(super) fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

pub(super) fn unix_time(secs: i64) -> String {
    DateTime::from_timestamp(secs, 0)
        .map(time)
        .unwrap_or_else(|| secs.to_string())
}

/// A duration in whole seconds, e.g. `5m`, `1h 30m`.
pub(super) fn format_duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// `1 page`, `3 pages`: a count with its noun, never "page(s)".
pub(super) fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
