//! What a push does ([`decide`]: run which entry, or why nothing runs) and the run it asks for
//! ([`run_request`]: clone the exact pushed commit shallowly, then the entry's command). Pure.
use std::collections::BTreeMap;

use secrecy::{ExposeSecret, SecretString};

use super::event::PushEvent;
use super::rules::PushTestRule;
use crate::ids::RunId;
use crate::runs::{FileSpec, RunRequest};
use crate::store::PushTest;

/// The exit code of a push-test run whose commit could not be fetched (its output's last line
/// then starts with [`CLONE_FAILED_MARKER`]); the glue reports it as an error, not a failure.
pub const CLONE_FAILED_EXIT_CODE: i32 = 97;
/// The line the clone step prints when it fails.
pub const CLONE_FAILED_MARKER: &str = "steward: could not fetch commit";
/// The environment variables the clone step reads; the token's value is scrubbed from output.
pub const CLONE_URL_ENV: &str = "STEWARD_CLONE_URL";
pub const TOKEN_ENV: &str = "STEWARD_GIT_TOKEN";
/// The `GIT_ASKPASS` helper uploaded when a token is configured; it holds no secret itself.
pub const ASKPASS_FILE: &str = ".steward-askpass";
const ASKPASS_SCRIPT: &str = "#!/bin/sh\ncase \"$1\" in\n  Username*) echo x-access-token ;;\n  *) echo \"$STEWARD_GIT_TOKEN\" ;;\nesac\n";

/// What a push does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<'a> {
    /// Nothing runs; the sentence is the audit outcome.
    Ignore(String),
    /// Run `rule` for `branch`.
    Run {
        rule: &'a PushTestRule,
        branch: String,
    },
}

fn is_sha(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.chars().all(|c| c.is_ascii_hexdigit())
}

/// Decides what `event` does under `rules` (the first entry for the repository that covers
/// the branch wins).
pub fn decide<'a>(rules: &'a [PushTestRule], event: &PushEvent) -> Decision<'a> {
    let repo = event.repository.full_name.as_str();
    if let Some(tag) = event.git_ref.strip_prefix("refs/tags/") {
        return Decision::Ignore(format!("ignored: tag {tag} (tags are not tested)"));
    }
    let Some(branch) = event.branch() else {
        return Decision::Ignore(format!("ignored: {} is not a branch", event.git_ref));
    };
    if event.deleted {
        return Decision::Ignore(format!("ignored: branch {branch} was deleted"));
    }
    if !is_sha(&event.after) {
        return Decision::Ignore(format!(
            "ignored: {:?} is not a commit sha",
            event.after.chars().take(80).collect::<String>()
        ));
    }
    let for_repo: Vec<&PushTestRule> = rules
        .iter()
        .filter(|r| r.repository.eq_ignore_ascii_case(repo))
        .collect();
    if for_repo.is_empty() {
        return Decision::Ignore(format!("ignored: {repo} has no [[push_tests]] entry"));
    }
    let Some(rule) = for_repo.into_iter().find(|r| r.covers_branch(branch)) else {
        return Decision::Ignore(format!(
            "ignored: branch {branch} is not one [[push_tests]] tests"
        ));
    };
    let mut changed = event.changed_paths().peekable();
    if changed.peek().is_some() && changed.all(|p| rule.ignores(p)) {
        return Decision::Ignore(format!(
            "ignored: every file the push to {branch} changed matches ignore_paths"
        ));
    }
    Decision::Run {
        rule,
        branch: branch.to_owned(),
    }
}

/// Where the sandbox clones from: the entry's `clone_url`, else the payload's https URL, else
/// github.com.
pub fn clone_url(rule: &PushTestRule, event: &PushEvent) -> String {
    if let Some(url) = &rule.clone_url {
        return url.clone();
    }
    match &event.repository.clone_url {
        Some(url) if url.starts_with("https://") => url.clone(),
        _ => format!("https://github.com/{}.git", rule.repository),
    }
}

/// The command line the sandbox runs: fetch the exact commit (shallow), then the entry's
/// command. Holds no secret: the URL and the token come through the environment, and the
/// credential is gone from the environment before the entry's command starts.
pub fn command(rule: &PushTestRule, sha: &str, with_token: bool) -> String {
    let mut script = String::new();
    if with_token {
        script.push_str(&format!(
            "chmod 700 {ASKPASS_FILE} && export GIT_ASKPASS=\"$PWD/{ASKPASS_FILE}\" || exit {CLONE_FAILED_EXIT_CODE}\n"
        ));
    }
    script.push_str(&format!(
        "git init -q repo && cd repo || exit {code}\n\
         if ! {{ git fetch -q --depth 1 \"${CLONE_URL_ENV}\" {sha} && git checkout -q FETCH_HEAD; }}; then\n  \
         rm -f ../{ASKPASS_FILE}; echo \"{CLONE_FAILED_MARKER} {sha}\" >&2; exit {code}\nfi\n\
         rm -f ../{ASKPASS_FILE}\n\
         unset {TOKEN_ENV} GIT_ASKPASS {CLONE_URL_ENV}\n",
        code = CLONE_FAILED_EXIT_CODE,
    ));
    script.push_str(&rule.command);
    script
}

/// The run a push asks for. `token` (`GITHUB_TOKEN`) goes in as an environment value marked
/// secret (scrubbed from the output), read only by the `GIT_ASKPASS` helper.
pub fn run_request(
    rule: &PushTestRule,
    event: &PushEvent,
    token: Option<&SecretString>,
) -> RunRequest {
    let mut env: BTreeMap<String, String> = rule.env.clone();
    env.insert(CLONE_URL_ENV.into(), clone_url(rule, event));
    env.insert("GIT_TERMINAL_PROMPT".into(), "0".into());
    let mut files = Vec::new();
    let mut secret_env = Vec::new();
    if let Some(token) = token {
        env.insert(TOKEN_ENV.into(), token.expose_secret().to_owned());
        secret_env.push(TOKEN_ENV.to_owned());
        files.push(FileSpec {
            path: ASKPASS_FILE.into(),
            content: ASKPASS_SCRIPT.as_bytes().to_vec(),
        });
    }
    RunRequest {
        template: rule.template.clone(),
        command: command(rule, &event.after, token.is_some()),
        files,
        env,
        cwd: None,
        timeout: Some(format!("{}s", rule.timeout.as_secs().max(1))),
        secret_env,
    }
}

/// The record of the run started for `event`: who pushed, who wrote the head commit, and the
/// Slack users they map to.
pub fn push_test(
    rule: &PushTestRule,
    event: &PushEvent,
    branch: &str,
    run_id: RunId,
    delivery: &str,
) -> PushTest {
    let head = event.head_commit.as_ref();
    let author = head.and_then(|c| c.author.as_ref());
    let pusher = event
        .pusher
        .as_ref()
        .map(|p| p.name.clone())
        .or_else(|| event.sender.as_ref().map(|s| s.login.clone()));
    let candidates = [
        author.and_then(|a| a.email.clone()),
        author.and_then(|a| a.username.clone()),
        pusher.clone(),
        event.pusher.as_ref().and_then(|p| p.email.clone()),
    ];
    let mapped = |who: &[Option<String>]| {
        who.iter()
            .flatten()
            .find_map(|w| rule.authors.get(&w.trim().to_lowercase()).cloned())
    };
    let author_slack = mapped(&candidates[..2]);
    let pusher_slack = mapped(&candidates[2..]);
    let mut slack_users = Vec::new();
    for who in candidates.into_iter().flatten() {
        if let Some(user) = rule.authors.get(&who.trim().to_lowercase())
            && !slack_users.contains(user)
        {
            slack_users.push(user.clone());
        }
    }
    PushTest {
        run_id,
        repository: rule.repository.clone(),
        branch: branch.to_owned(),
        before: event.before.clone(),
        after: event.after.clone(),
        compare_url: event.compare.clone(),
        commit_url: head.and_then(|c| c.url.clone()),
        message: head.and_then(|c| c.message.clone()),
        pusher,
        author_name: author.and_then(|a| a.name.clone()),
        author_email: author.and_then(|a| a.email.clone()),
        author_login: author.and_then(|a| a.username.clone()),
        slack_users,
        author_slack,
        pusher_slack,
        channel: rule.channel.as_ref().map(|c| c.to_string()),
        command: rule.command.clone(),
        delivery: delivery.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::event::parse_push;
    use crate::github::rules::PushTestEntry;
    use std::time::Duration;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    fn rules() -> Vec<PushTestRule> {
        let mut e = PushTestEntry {
            repository: "acme/api".into(),
            branches: Some(vec!["main".into(), "release/*".into()]),
            template: "base".into(),
            command: "make test".into(),
            ignore_paths: vec!["docs/**".into(), "*.md".into()],
            ..PushTestEntry::default()
        };
        e.authors
            .insert("Alice@Example.com".into(), "U0ALICE".into());
        e.authors.insert("bob-gh".into(), "U0BOB".into());
        vec![e.check(1, Duration::from_secs(3600)).unwrap()]
    }

    fn push(git_ref: &str, files: &[&str]) -> PushEvent {
        parse_push(
            serde_json::json!({
                "ref": git_ref, "before": "0".repeat(40), "after": SHA,
                "repository": {"full_name": "acme/api", "clone_url": "https://github.com/acme/api.git"},
                "pusher": {"name": "bob-gh"},
                "commits": [{"id": SHA, "modified": files}],
                "head_commit": {"id": SHA, "message": "Fix it", "author": {"name": "Alice", "email": "alice@example.com", "username": "alice-gh"}},
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    }

    fn ignored(d: Decision<'_>) -> String {
        match d {
            Decision::Ignore(why) => why,
            Decision::Run { .. } => panic!("expected nothing to run"),
        }
    }

    #[test]
    fn a_push_to_a_configured_branch_runs() {
        let rules = rules();
        let d = decide(&rules, &push("refs/heads/release/2", &["src/lib.rs"]));
        assert!(matches!(d, Decision::Run { ref branch, .. } if branch == "release/2"));
    }

    #[test]
    fn tags_deletes_other_branches_other_repos_and_ignored_paths_run_nothing() {
        let rules = rules();
        assert!(ignored(decide(&rules, &push("refs/tags/v1", &["a"]))).contains("tag v1"));
        let mut deleted = push("refs/heads/main", &[]);
        deleted.deleted = true;
        assert!(ignored(decide(&rules, &deleted)).contains("deleted"));
        assert!(ignored(decide(&rules, &push("refs/heads/dev", &["a"]))).contains("dev"));
        let docs = push("refs/heads/main", &["docs/x/y.txt", "README.md"]);
        assert!(ignored(decide(&rules, &docs)).contains("ignore_paths"));
        let mut other = push("refs/heads/main", &["a"]);
        other.repository.full_name = "acme/web".into();
        assert!(ignored(decide(&rules, &other)).contains("acme/web"));
    }

    #[test]
    fn the_command_fetches_the_exact_sha_and_holds_no_secret() {
        let rules = rules();
        let event = push("refs/heads/main", &["a"]);
        let token = SecretString::from("ghp_secret_value".to_owned());
        let req = run_request(&rules[0], &event, Some(&token));
        assert!(
            req.command
                .contains(&format!("--depth 1 \"$STEWARD_CLONE_URL\" {SHA}"))
        );
        assert!(req.command.ends_with("make test"));
        assert!(!req.command.contains("ghp_secret_value"));
        assert_eq!(req.secret_env, vec![TOKEN_ENV.to_owned()]);
        assert_eq!(req.env[CLONE_URL_ENV], "https://github.com/acme/api.git");
        let without = run_request(&rules[0], &event, None);
        assert!(!without.env.contains_key(TOKEN_ENV));
        assert!(without.files.is_empty());
    }

    #[test]
    fn authors_and_pushers_map_to_slack_users_once_each() {
        let rules = rules();
        let event = push("refs/heads/main", &["a"]);
        let t = push_test(
            &rules[0],
            &event,
            "main",
            RunId::parse("run_1").unwrap(),
            "d1",
        );
        assert_eq!(t.author_slack.as_ref().map(|u| u.as_str()), Some("U0ALICE"));
        assert_eq!(t.pusher_slack.as_ref().map(|u| u.as_str()), Some("U0BOB"));
        let users: Vec<&str> = t.slack_users.iter().map(|u| u.as_str()).collect();
        assert_eq!(users, ["U0ALICE", "U0BOB"]);
        assert_eq!(t.message.as_deref(), Some("Fix it"));
        assert_eq!(t.author_login.as_deref(), Some("alice-gh"));
    }
}
