//! `[[push_tests]]` as written in steward.toml ([`PushTestEntry`]) and as checked
//! ([`PushTestRule`]), the GitHub settings ([`GithubSettings`]), and the glob matching used for
//! branches and ignored paths. Pure: no I/O.
use std::collections::BTreeMap;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::ids::{SlackChannelId, SlackUserId, TemplateId};

/// The run timeout of an entry that sets none.
pub const DEFAULT_PUSH_TEST_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// One `[[push_tests]]` entry as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushTestEntry {
    pub repository: String,
    /// Branch globs (`main`, `release/*`); every branch when absent.
    #[serde(default)]
    pub branches: Option<Vec<String>>,
    pub template: String,
    pub command: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub timeout: Option<String>,
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub clone_url: Option<String>,
    #[serde(default)]
    pub ignore_paths: Vec<String>,
    /// Commit author e-mails and GitHub logins -> Slack user ids.
    #[serde(default)]
    pub authors: BTreeMap<String, String>,
}

/// A checked `[[push_tests]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushTestRule {
    pub repository: String,
    /// Empty: every branch.
    pub branches: Vec<String>,
    pub template: String,
    pub command: String,
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
    pub channel: Option<SlackChannelId>,
    pub clone_url: Option<String>,
    pub ignore_paths: Vec<String>,
    /// Keys lower-cased (e-mails and logins compare without case).
    pub authors: BTreeMap<String, SlackUserId>,
}

/// What the GitHub intake needs from the environment and steward.toml. `Debug` hides secrets.
#[derive(Debug, Clone, Default)]
pub struct GithubSettings {
    /// `GITHUB_WEBHOOK_SECRET` (comma-separated) and `[github] secrets`; any one verifies.
    pub webhook_secrets: Vec<SecretString>,
    /// `GITHUB_TOKEN`: the clone credential for private repositories.
    pub token: Option<SecretString>,
    /// `GITHUB_APP_ID` and its private key: when set, each clone gets an installation token of
    /// its own (one repository, read-only, an hour) instead of `token`.
    pub app: Option<super::GithubApp>,
    pub push_tests: Vec<PushTestRule>,
    /// `[github] max_runs` and `max_runs_per_repository`: push tests running at once.
    pub caps: super::queue::Caps,
}

fn valid_repository(name: &str) -> bool {
    let mut parts = name.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl PushTestEntry {
    /// Checks the entry (the `n`th, from 1); the error is one sentence naming the key.
    /// `max_timeout` is `[runs] max_timeout`.
    pub fn check(&self, n: usize, max_timeout: Duration) -> Result<PushTestRule, String> {
        let at = format!("[[push_tests]] #{n}");
        let repository = self.repository.trim();
        if !valid_repository(repository) {
            return Err(format!(
                "{at}: repository {:?} must be owner/name, like \"acme/api\"",
                self.repository
            ));
        }
        let at = format!("[[push_tests]] {repository}");
        let branches = self.branches.clone().unwrap_or_default();
        if self.branches.as_ref().is_some_and(Vec::is_empty) {
            return Err(format!(
                "{at}: branches is empty, so nothing would run; leave it out to test every branch"
            ));
        }
        if let Some(b) = branches.iter().find(|b| b.trim().is_empty()) {
            return Err(format!("{at}: branches holds an empty pattern ({b:?})"));
        }
        let template = self.template.trim();
        if template.is_empty() || TemplateId::parse(template).is_err() {
            return Err(format!(
                "{at}: template {:?} is not a template id or alias",
                self.template
            ));
        }
        if self.command.trim().is_empty() {
            return Err(format!("{at}: command is empty"));
        }
        if self.command.contains('\0') {
            return Err(format!("{at}: command contains a NUL byte"));
        }
        if let Some(name) = self.env.keys().find(|n| !valid_env_name(n)) {
            return Err(format!(
                "{at}: env.{name} is not a variable name (letters, digits and '_', not starting with a digit)"
            ));
        }
        if let Some(name) = self.env.keys().find(|n| n.starts_with("STEWARD_")) {
            return Err(format!(
                "{at}: env.{name} starts with STEWARD_, which Steward keeps for itself"
            ));
        }
        let timeout = match &self.timeout {
            None => DEFAULT_PUSH_TEST_TIMEOUT.min(max_timeout),
            Some(text) => {
                let d = crate::duration::parse("timeout", text)
                    .map_err(|e| format!("{at}: timeout is not valid: {}", e.reason))?;
                if d.is_zero() {
                    return Err(format!("{at}: timeout must be more than 0s"));
                }
                if d > max_timeout {
                    return Err(format!(
                        "{at}: timeout ({}) is longer than [runs] max_timeout ({})",
                        humantime::format_duration(d),
                        humantime::format_duration(max_timeout)
                    ));
                }
                d
            }
        };
        let channel = self
            .channel
            .as_deref()
            .map(|c| {
                SlackChannelId::parse(c)
                    .map_err(|e| format!("{at}: channel is not a channel id: {e}"))
            })
            .transpose()?;
        let clone_url = match self.clone_url.as_deref().map(str::trim) {
            None => None,
            Some(url)
                if url.starts_with("https://")
                    || url.starts_with("http://")
                    || url.starts_with("file:///")
                    || url.starts_with('/') =>
            {
                Some(url.to_owned())
            }
            Some(url) => {
                return Err(format!(
                    "{at}: clone_url {url:?} must start with https://, http://, file:/// or /"
                ));
            }
        };
        if let Some(p) = self.ignore_paths.iter().find(|p| p.trim().is_empty()) {
            return Err(format!("{at}: ignore_paths holds an empty pattern ({p:?})"));
        }
        let mut authors = BTreeMap::new();
        for (who, user) in &self.authors {
            let user = SlackUserId::parse(user.as_str()).map_err(|e| {
                format!("{at}: authors.{who:?} is not a Slack user id like \"U0ALICE\": {e}")
            })?;
            authors.insert(who.trim().to_lowercase(), user);
        }
        Ok(PushTestRule {
            repository: repository.to_owned(),
            branches,
            template: template.to_owned(),
            command: self.command.clone(),
            env: self.env.clone(),
            timeout,
            channel,
            clone_url,
            ignore_paths: self.ignore_paths.clone(),
            authors,
        })
    }
}

impl PushTestRule {
    /// Whether this entry tests pushes to `branch`.
    pub fn covers_branch(&self, branch: &str) -> bool {
        self.branches.is_empty() || self.branches.iter().any(|g| glob_match(g, branch))
    }

    /// Whether `path` is one of the entry's ignored paths. A pattern without `/` matches the
    /// file's name at any depth (like `.gitignore`); one with `/` matches the whole path.
    pub fn ignores(&self, path: &str) -> bool {
        self.ignore_paths.iter().any(|p| {
            let p = p.trim().trim_start_matches('/');
            if p.contains('/') {
                glob_match(p, path)
            } else {
                glob_match(p, path.rsplit('/').next().unwrap_or(path))
            }
        })
    }
}

/// Glob matching: `*` is any run of characters but `/`, `**` any run including `/` (and
/// `**/` also none), `?` one character but `/`; everything else is literal.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    fn go(p: &[char], t: &[char]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some('*') if p.get(1) == Some(&'*') => {
                let rest = &p[2..];
                if rest.is_empty() {
                    return true;
                }
                // `**/` may also match nothing at all (docs/**/x matches docs/x).
                if rest.first() == Some(&'/') && go(&rest[1..], t) {
                    return true;
                }
                (0..=t.len()).any(|i| go(rest, &t[i..]))
            }
            Some('*') => {
                let rest = &p[1..];
                for i in 0..=t.len() {
                    if go(rest, &t[i..]) {
                        return true;
                    }
                    if t.get(i) == Some(&'/') {
                        return false;
                    }
                }
                false
            }
            Some('?') => t.first().is_some_and(|c| *c != '/') && go(&p[1..], &t[1..]),
            Some(c) => t.first() == Some(c) && go(&p[1..], &t[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    go(&p, &t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> PushTestEntry {
        PushTestEntry {
            repository: "acme/api".into(),
            template: "base".into(),
            command: "cargo test".into(),
            ..PushTestEntry::default()
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn globs_match_like_github_branch_filters() {
        assert!(glob_match("main", "main"));
        assert!(!glob_match("main", "main2"));
        assert!(glob_match("release/*", "release/1.2"));
        assert!(!glob_match("release/*", "release/1/2"));
        assert!(glob_match("release/**", "release/1/2"));
        assert!(glob_match("docs/**", "docs/a/b.md"));
        assert!(glob_match("docs/**/x.md", "docs/x.md"));
        assert!(glob_match("*.md", "README.md"));
        assert!(glob_match("v?", "v1"));
        assert!(!glob_match("*", "a/b"));
    }

    #[test]
    fn ignored_paths_without_a_slash_match_at_any_depth() {
        let mut e = entry();
        e.ignore_paths = vec!["docs/**".into(), "*.md".into()];
        let r = e.check(1, HOUR).unwrap();
        assert!(r.ignores("docs/guide/intro.txt"));
        assert!(r.ignores("src/README.md"));
        assert!(!r.ignores("src/lib.rs"));
    }

    #[test]
    fn an_entry_gets_defaults_and_every_branch() {
        let r = entry().check(1, HOUR).unwrap();
        assert!(r.covers_branch("anything/at-all"));
        assert_eq!(r.timeout, DEFAULT_PUSH_TEST_TIMEOUT);
        let r = entry().check(1, Duration::from_secs(60)).unwrap();
        assert_eq!(
            r.timeout,
            Duration::from_secs(60),
            "capped by [runs] max_timeout"
        );
    }

    #[test]
    fn mistakes_are_one_sentence_naming_the_entry_and_key() {
        type Change = fn(&mut PushTestEntry);
        let cases: Vec<(Change, &str)> = vec![
            (|e| e.repository = "acme".into(), "repository"),
            (|e| e.branches = Some(vec![]), "branches is empty"),
            (|e| e.template = "".into(), "template"),
            (|e| e.command = " ".into(), "command is empty"),
            (|e| e.timeout = Some("soon".into()), "timeout is not valid"),
            (|e| e.timeout = Some("2h".into()), "max_timeout"),
            (|e| e.channel = Some("not a channel".into()), "channel"),
            (
                |e| e.clone_url = Some("git@github.com:a/b".into()),
                "clone_url",
            ),
            (
                |e| {
                    e.env.insert("1X".into(), "v".into());
                },
                "env.1X",
            ),
            (
                |e| {
                    e.env.insert("STEWARD_X".into(), "v".into());
                },
                "STEWARD_",
            ),
            (
                |e| {
                    e.authors.insert("a@x".into(), "not an id!".into());
                },
                "authors",
            ),
        ];
        for (change, needle) in cases {
            let mut e = entry();
            change(&mut e);
            let err = e.check(2, HOUR).unwrap_err();
            assert!(err.starts_with("[[push_tests]] "), "{err}");
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }
}
