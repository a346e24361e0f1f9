//! How `steward e2b` prints a result: the model types as JSON with `--json`, otherwise a table or
//! aligned `key  value` lines, plus the value formats (times, durations) every action shares.
//!
//! Warnings about partial listings go to stderr so they show with `--json` too. Nothing here
//! calls E2B.
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::cli::table::{LastColumn, print_pairs, render_table_with};
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
        self.whole_or_rows(&items, items, headers, row, LastColumn::Visible)
            .map(drop)
    }

    /// Like [`table`](Self::table), with the last column printed as `last` says: `steward e2b
    /// logs` prints its messages raw to a pipe or with `--raw`.
    pub(super) fn table_with<T: Serialize>(
        &self,
        items: &[T],
        headers: &[&str],
        row: impl Fn(&T) -> Vec<String>,
        last: LastColumn,
    ) -> anyhow::Result<()> {
        self.whole_or_rows(&items, items, headers, row, last)
            .map(drop)
    }

    /// A paged listing followed to its end: JSON, or a table and how many items and pages it took.
    pub(super) fn listing<T: Serialize>(
        &self,
        listing: &Listing<T>,
        headers: &[&str],
        row: impl Fn(&T) -> Vec<String>,
    ) -> anyhow::Result<()> {
        warn_stopped(listing);
        if self.whole_or_rows(listing, &listing.items, headers, row, LastColumn::Visible)? {
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
        if self.whole_or_rows(page, &page.items, headers, row, LastColumn::Visible)? {
            if let Some(total) = page.total_running {
                println!("\n{total} running in total.");
            }
            match &page.next_token {
                // E2B's token, one line with nothing a terminal would act on.
                Some(token) => println!("More: --page-token {}", crate::cli::visible::cell(token)),
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
        last: LastColumn,
    ) -> anyhow::Result<bool> {
        if self.json {
            print_json(whole)?;
            return Ok(false);
        }
        let rows: Vec<Vec<String>> = items.iter().map(row).collect();
        print!("{}", render_table_with(headers, &rows, last));
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
    println!("{}", json_text(value)?);
    Ok(())
}

/// `value` as pretty JSON with no character a terminal acts on. serde_json already writes the
/// C0 controls (ESC included) as `\u00XX`; DEL and the C1 controls (U+009B is an 8-bit CSI) it
/// writes as they are, so they are written as `\u00XX` here too. They only occur inside strings,
/// so the JSON means exactly the same.
pub(super) fn json_text<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<String> {
    let text = serde_json::to_string_pretty(value)?;
    if !text.chars().any(|c| matches!(c, '\u{7f}'..='\u{9f}')) {
        return Ok(text);
    }
    Ok(text
        .chars()
        .map(|c| match c {
            '\u{7f}'..='\u{9f}' => format!("\\u{:04x}", c as u32),
            c => c.to_string(),
        })
        .collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_writes_every_control_character_escaped_and_means_the_same() {
        let value = serde_json::json!({"message": "a\x1b]52;c;x\x07\u{7f}\u{9b}2J é"});
        let text = json_text(&value).unwrap();
        assert!(text.chars().all(|c| !c.is_control() || c == '\n'), "{text}");
        assert!(
            text.contains(r"\u001b]52;c;x\u0007\u007f\u009b2J é"),
            "{text}"
        );
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, value);
    }
}
