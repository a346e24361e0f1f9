//! `[[watch]]`: rules evaluated on each E2B lifecycle event, as `steward.toml` writes them and as
//! Steward checks them. A **creation rule** looks at one `created` event (metadata a sandbox
//! lacks, a template outside an allow list, a timeout above a limit, metadata matching a
//! pattern) and says why it matched; a **burst rule** says which group (one owner, one template,
//! one metadata value) a creation counts towards, and how many in how long is too many.
//!
//! Pure: what an event does with a finding (a case, a notice, a burst alert, a log line in dry
//! run) lives in `approvals::watch`.
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::cases::Evidence;
use crate::ids::SlackChannelId;
use crate::lifecycle::LifecycleEvent;

/// The Shorten option's timeout when a creation rule names none.
pub const DEFAULT_SHORTEN_TO: Duration = Duration::from_secs(10 * 60);
/// The most sandboxes one burst alert lists (a burst past it still grows its count).
pub const MAX_BURST_ITEMS: usize = 1000;

/// One `[[watch]]` table as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchEntry {
    pub name: String,
    /// Metadata keys every sandbox must be created with (`["owner"]`).
    pub require_metadata: Vec<String>,
    /// The templates sandboxes may be created from (template ids as E2B's events name them).
    pub templates: Vec<String>,
    /// The longest timeout a sandbox may be created with (`"2h"`).
    pub max_timeout: Option<String>,
    /// Metadata that matches: key → pattern, `*` matching any run of characters.
    pub metadata: BTreeMap<String, String>,
    /// A burst rule instead of a creation rule.
    pub burst: Option<BurstEntry>,
    /// `"case"` (default) or `"notice"`.
    pub then: Option<String>,
    /// The timeout the case's Shorten option sets (default 10 minutes).
    pub shorten_to: Option<String>,
    /// Where its cards, notices and alerts go (default `[channels] approvals`).
    pub channel: Option<String>,
    /// Only log what it would have raised.
    pub dry_run: bool,
}

/// `burst = { more_than = 20, within = "10m", by = "owner" }` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BurstEntry {
    pub more_than: usize,
    pub within: String,
    /// `owner`, `template` or `metadata.<key>`.
    pub by: String,
}

/// A checked rule.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchRule {
    pub name: String,
    pub kind: RuleKind,
    pub channel: Option<SlackChannelId>,
    pub dry_run: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RuleKind {
    Creation(CreationRule),
    Burst(BurstRule),
}

/// What a creation rule raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// A case for the sandbox: Shorten timeout, Kill, Leave.
    Case,
    /// A message naming the owner; nothing to decide.
    Notice,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CreationRule {
    pub require_metadata: Vec<String>,
    pub templates: Vec<String>,
    pub max_timeout: Option<Duration>,
    pub metadata: Vec<(String, String)>,
    pub then: Then,
    pub shorten_to: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BurstRule {
    pub more_than: usize,
    pub within: Duration,
    pub by: BurstBy,
}

/// What a burst counts creations by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BurstBy {
    Owner,
    Template,
    Metadata(String),
}

fn duration(rule: &str, field: &str, text: &str) -> Result<Duration, String> {
    crate::duration::parse(field, text)
        .map_err(|e| format!("[[watch]] {rule:?}: {field} is not valid: {}", e.reason))
}

/// Checks the `[[watch]]` tables: names unique and set, each either a creation rule with at
/// least one condition or a burst rule, durations and channel ids valid.
pub fn check(entries: &[WatchEntry]) -> Result<Vec<WatchRule>, String> {
    let mut rules: Vec<WatchRule> = Vec::new();
    for e in entries {
        let name = e.name.trim();
        if name.is_empty() {
            return Err("every [[watch]] needs a name".into());
        }
        if rules.iter().any(|r| r.name == name) {
            return Err(format!("two [[watch]] rules are named {name:?}"));
        }
        let channel = match e.channel.as_deref() {
            None => None,
            Some(c) => Some(SlackChannelId::parse(c.trim()).map_err(|_| {
                format!("[[watch]] {name:?}: channel {c:?} is not a channel id like C0123456789 (a name does not work)")
            })?),
        };
        let has_creation = !e.require_metadata.is_empty()
            || !e.templates.is_empty()
            || e.max_timeout.is_some()
            || !e.metadata.is_empty();
        let kind = match (&e.burst, has_creation) {
            (Some(_), true) => {
                return Err(format!(
                    "[[watch]] {name:?} is both a burst rule and a creation rule: make them two rules"
                ));
            }
            (None, false) => {
                return Err(format!(
                    "[[watch]] {name:?} has nothing to watch: give it require_metadata, templates, max_timeout, metadata or burst"
                ));
            }
            (Some(b), false) => {
                if e.then.is_some() || e.shorten_to.is_some() {
                    return Err(format!(
                        "[[watch]] {name:?}: a burst rule raises one alert with Pause all, Kill all and Leave; then and shorten_to are for creation rules"
                    ));
                }
                if b.more_than == 0 {
                    return Err(format!(
                        "[[watch]] {name:?}: burst.more_than must be at least 1"
                    ));
                }
                let by = match b.by.trim() {
                    "owner" => BurstBy::Owner,
                    "template" => BurstBy::Template,
                    other => match other.strip_prefix("metadata.") {
                        Some(key) if !key.is_empty() => BurstBy::Metadata(key.to_owned()),
                        _ => {
                            return Err(format!(
                                "[[watch]] {name:?}: burst.by is {other:?}; it must be owner, template or metadata.<key>"
                            ));
                        }
                    },
                };
                RuleKind::Burst(BurstRule {
                    more_than: b.more_than,
                    within: duration(name, "burst.within", &b.within)?,
                    by,
                })
            }
            (None, true) => {
                let then = match e.then.as_deref().map(str::trim) {
                    None | Some("case") => Then::Case,
                    Some("notice") => Then::Notice,
                    Some(other) => {
                        return Err(format!(
                            "[[watch]] {name:?}: then is {other:?}; it must be case or notice"
                        ));
                    }
                };
                let shorten_to = match &e.shorten_to {
                    None => DEFAULT_SHORTEN_TO,
                    Some(t) => duration(name, "shorten_to", t)?,
                };
                if shorten_to < Duration::from_secs(60) {
                    return Err(format!(
                        "[[watch]] {name:?}: shorten_to must be at least 1m"
                    ));
                }
                RuleKind::Creation(CreationRule {
                    require_metadata: e
                        .require_metadata
                        .iter()
                        .map(|k| k.trim().to_owned())
                        .collect(),
                    templates: e.templates.iter().map(|t| t.trim().to_owned()).collect(),
                    max_timeout: e
                        .max_timeout
                        .as_deref()
                        .map(|t| duration(name, "max_timeout", t))
                        .transpose()?,
                    metadata: e
                        .metadata
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    then,
                    shorten_to,
                })
            }
        };
        rules.push(WatchRule {
            name: name.to_owned(),
            kind,
            channel,
            dry_run: e.dry_run,
        });
    }
    Ok(rules)
}

/// `pattern` with `*` matching any run of characters (none included) against all of `text`.
pub fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

impl CreationRule {
    /// Whether judging a creation needs the sandbox's end (a read of the sandbox).
    pub fn needs_end(&self) -> bool {
        self.max_timeout.is_some()
    }

    /// Whether the template of `event` is on the allow list by its id alone (E2B's events name
    /// the template by id; an allow list may name aliases, which need a read of the sandbox).
    pub fn template_allowed_by_id(&self, event: &LifecycleEvent) -> bool {
        self.templates.is_empty()
            || event
                .template_id
                .as_ref()
                .is_some_and(|t| self.templates.iter().any(|a| a == t))
    }

    /// Why `event` (a creation) matches, one sentence per condition; empty when it does not.
    /// `end_at`: the end E2B set for the sandbox, when [`Self::needs_end`]; `alias`: the
    /// template's alias, when known.
    pub fn findings(
        &self,
        event: &LifecycleEvent,
        end_at: Option<DateTime<Utc>>,
        alias: Option<&str>,
    ) -> Vec<String> {
        let mut found = Vec::new();
        let missing: Vec<&str> = self
            .require_metadata
            .iter()
            .filter(|k| {
                event
                    .metadata
                    .get(k.as_str())
                    .is_none_or(|v| v.trim().is_empty())
            })
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            found.push(format!(
                "created without {} metadata",
                missing
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !self.templates.is_empty() {
            let allowed = |name: &str| self.templates.iter().any(|a| a == name);
            match (&event.template_id, alias) {
                (Some(t), _) if allowed(t) => {}
                (_, Some(a)) if allowed(a) => {}
                (Some(t), Some(a)) => {
                    found.push(format!("template `{a}` ({t}) is not on the allow list"))
                }
                (Some(t), None) => found.push(format!("template `{t}` is not on the allow list")),
                (None, _) => found.push("E2B did not say its template".to_owned()),
            }
        }
        if let (Some(max), Some(end)) = (self.max_timeout, end_at) {
            let timeout = (end - event.at).to_std().unwrap_or_default();
            if timeout > max + Duration::from_secs(1) {
                found.push(format!(
                    "its timeout is {}, above the limit of {}",
                    human(timeout),
                    human(max)
                ));
            }
        }
        for (key, pattern) in &self.metadata {
            if let Some(value) = event.metadata.get(key)
                && glob(pattern, value)
            {
                found.push(format!("metadata `{key}={value}` matches `{pattern}`"));
            }
        }
        found
    }
}

impl BurstRule {
    /// The group `event` counts towards, as what it is counted by (`owner`, `template`,
    /// `metadata team`) and the value (`alice`), or `None` when the sandbox has no such value (a
    /// missing owner is a creation rule's business).
    pub fn group_of(&self, event: &LifecycleEvent) -> Option<(String, String)> {
        match &self.by {
            BurstBy::Owner => {
                Evidence::owner_from_metadata(&event.metadata).map(|o| ("owner".to_owned(), o))
            }
            BurstBy::Template => event
                .template_id
                .as_ref()
                .map(|t| ("template".to_owned(), t.clone())),
            BurstBy::Metadata(key) => event
                .metadata
                .get(key)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (format!("metadata {key}"), v.clone())),
        }
    }
}

/// `2h`, `10m`, `1h 30m`, `45s` for a sentence.
pub fn human(d: Duration) -> String {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    match (h, m, s) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m {s}s"),
        (h, 0, _) => format!("{h}h"),
        (h, m, _) => format!("{h}h {m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SandboxId;
    use crate::lifecycle::EventKind;

    fn entry(toml_text: &str) -> Result<Vec<WatchRule>, String> {
        #[derive(Deserialize)]
        struct File {
            watch: Vec<WatchEntry>,
        }
        let file: File = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        check(&file.watch)
    }

    fn created(metadata: &[(&str, &str)], template: &str) -> LifecycleEvent {
        LifecycleEvent {
            id: "ev1".into(),
            kind: EventKind::Created,
            type_name: "sandbox.lifecycle.created".into(),
            sandbox: SandboxId::parse("sbx1").unwrap(),
            template_id: Some(template.into()),
            at: "2026-12-07T02:00:00Z".parse().unwrap(),
            metadata: metadata
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            set_timeout: None,
        }
    }

    #[test]
    fn a_creation_rule_says_every_condition_that_matched() {
        let rules = entry(
            r#"
            [[watch]]
            name = "strict"
            require_metadata = ["owner", "purpose"]
            templates = ["base"]
            max_timeout = "2h"
            metadata = { env = "prod*" }
            "#,
        )
        .unwrap();
        let RuleKind::Creation(rule) = &rules[0].kind else {
            panic!("a creation rule")
        };
        let event = created(&[("purpose", "ci"), ("env", "prod-eu")], "gpu");
        let end = event.at + chrono::Duration::hours(3);
        assert_eq!(
            rule.findings(&event, Some(end), None),
            vec![
                "created without `owner` metadata",
                "template `gpu` is not on the allow list",
                "its timeout is 3h, above the limit of 2h",
                "metadata `env=prod-eu` matches `prod*`",
            ]
        );
        let fine = created(
            &[("owner", "ann"), ("purpose", "ci"), ("env", "dev")],
            "base",
        );
        assert!(
            rule.findings(&fine, Some(fine.at + chrono::Duration::hours(2)), None)
                .is_empty()
        );
        // An allow list may name the alias E2B's event does not carry.
        let aliased = created(
            &[("owner", "ann"), ("purpose", "ci")],
            "rki5dems9wqfm4r03t7g",
        );
        assert!(!rule.template_allowed_by_id(&aliased));
        assert!(rule.findings(&aliased, None, Some("base")).is_empty());
    }

    #[test]
    fn rules_that_cannot_work_are_refused_with_the_rule_named() {
        for (text, says) in [
            ("[[watch]]\nname = \"x\"", "nothing to watch"),
            ("[[watch]]\nrequire_metadata = [\"owner\"]", "needs a name"),
            (
                "[[watch]]\nname = \"x\"\nrequire_metadata = [\"owner\"]\n[[watch]]\nname = \"x\"\ntemplates = [\"a\"]",
                "two [[watch]] rules",
            ),
            (
                "[[watch]]\nname = \"x\"\ntemplates = [\"a\"]\nburst = { more_than = 5, within = \"10m\", by = \"owner\" }",
                "both a burst rule",
            ),
            (
                "[[watch]]\nname = \"x\"\nburst = { more_than = 5, within = \"10m\", by = \"colour\" }",
                "owner, template or metadata.<key>",
            ),
            (
                "[[watch]]\nname = \"x\"\ntemplates = [\"a\"]\nthen = \"kill\"",
                "case or notice",
            ),
            (
                "[[watch]]\nname = \"x\"\ntemplates = [\"a\"]\nchannel = \"#ops\"",
                "channel id",
            ),
        ] {
            let err = entry(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_burst_counts_by_owner_template_or_one_metadata_value() {
        let rules = entry(
            r#"
            [[watch]]
            name = "by-owner"
            burst = { more_than = 20, within = "10m", by = "owner" }
            [[watch]]
            name = "by-team"
            burst = { more_than = 5, within = "1h", by = "metadata.team" }
            dry_run = true
            "#,
        )
        .unwrap();
        let event = created(&[("owner", "ann"), ("team", "ml")], "base");
        let groups: Vec<_> = rules
            .iter()
            .map(|r| match &r.kind {
                RuleKind::Burst(b) => b.group_of(&event),
                RuleKind::Creation(_) => None,
            })
            .collect();
        assert_eq!(
            groups,
            vec![
                Some(("owner".into(), "ann".into())),
                Some(("metadata team".into(), "ml".into()))
            ]
        );
        assert!(rules[1].dry_run);
        let RuleKind::Burst(b) = &rules[0].kind else {
            panic!()
        };
        assert_eq!(b.group_of(&created(&[], "base")), None);
    }

    #[test]
    fn glob_matches_the_whole_value() {
        assert!(glob("prod*", "prod-eu"));
        assert!(glob("*-eu", "prod-eu"));
        assert!(glob("p*d*u", "prod-eu"));
        assert!(glob("*", ""));
        assert!(!glob("prod", "prod-eu"));
        assert!(glob("a*b*a", "aba"));
        assert!(!glob("ab*ba", "aba"));
    }
}
