//! What a push does ([`decide`]: run which entry, or why nothing runs) and the run it asks for
//! ([`run_request`]: clone the exact pushed commit shallowly, then the entry's command). Pure.
use std::collections::BTreeMap;

use secrecy::{ExposeSecret, SecretString};

use super::event::PushEvent;
use super::rules::PushTestRule;
use crate::ids::RunId;
use crate::runs::{RunRequest, SetupStep};
use crate::store::PushTest;

/// The exit code of a push-test run whose commit could not be fetched (its output's last line
/// then starts with [`CLONE_FAILED_MARKER`]); the glue reports it as an error, not a failure.
pub const CLONE_FAILED_EXIT_CODE: i32 = 97;
/// The line the clone step prints when it fails.
pub const CLONE_FAILED_MARKER: &str = "steward: could not fetch commit";
/// The environment variables of the clone step (never of the entry's command).
pub const CLONE_URL_ENV: &str = "STEWARD_CLONE_URL";
pub const TOKEN_ENV: &str = "STEWARD_GIT_TOKEN";
/// The host (with its port, if any) the credential may be given to; the askpass helper answers
/// git's prompts for that host only.
pub const TOKEN_HOST_ENV: &str = "STEWARD_GIT_HOST";
/// Where the commit is checked out, under the run's working directory.
pub const CHECKOUT_DIR: &str = "repo";
/// The `GIT_ASKPASS` helper the clone step writes to a temporary file and removes when it ends:
/// it holds no secret (it prints `$STEWARD_GIT_TOKEN`, which only the clone step's process has)
/// and answers only prompts for `$STEWARD_GIT_HOST` (git asks "Password for
/// 'https://x-access-token@github.com': "), so a redirect or a submodule elsewhere gets nothing.
const ASKPASS_SCRIPT: &str = r#"#!/bin/sh
case "$1" in
  "Username for 'http"*"://$STEWARD_GIT_HOST'"*) echo x-access-token ;;
  "Password for 'http"*"://x-access-token@$STEWARD_GIT_HOST'"*) printf '%s\n' "$STEWARD_GIT_TOKEN" ;;
  *) exit 1 ;;
esac
"#;

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

/// Where the sandbox clones from: the entry's `clone_url` (set by an operator in
/// steward.toml), else GitHub's URL of the configured repository. A push payload's own
/// `clone_url` never decides it: the payload is the sender's word, and the credential goes where
/// the clone goes.
pub fn clone_url(rule: &PushTestRule) -> String {
    match &rule.clone_url {
        Some(url) => url.clone(),
        None => format!("https://github.com/{}.git", rule.repository),
    }
}

/// The host (and port) of an `http(s)://` clone URL: where a credential may go. `None` for a
/// local path or `file://` URL, which needs none.
pub fn credential_host(clone_url: &str) -> Option<String> {
    let url = url::Url::parse(clone_url).ok()?;
    if !matches!(url.scheme(), "https" | "http") {
        return None;
    }
    let host = url.host_str()?;
    Some(match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

/// The clone step: fetch the exact commit (shallow) into [`CHECKOUT_DIR`]. It runs as a process
/// of its own before the entry's command (see `runs::SetupStep`), so the credential is never in
/// the environment of the command or of any of its ancestors. No credential is written to a
/// file: git reads it from the askpass helper, no credential helper may store it
/// (`credential.helper=` clears the template's), redirects are not followed, and the URL is
/// given on the command line of `fetch`, so `.git/config` holds no remote.
pub fn clone_step(sha: &str, with_token: bool) -> String {
    let mut script = String::new();
    if with_token {
        script.push_str(&format!(
            "askpass=\"$(mktemp)\" || exit {CLONE_FAILED_EXIT_CODE}\n\
             trap 'rm -f \"$askpass\"' EXIT\n\
             cat >\"$askpass\" <<'STEWARD_ASKPASS'\n{ASKPASS_SCRIPT}STEWARD_ASKPASS\n\
             chmod 700 \"$askpass\" && export GIT_ASKPASS=\"$askpass\" || exit {CLONE_FAILED_EXIT_CODE}\n"
        ));
    }
    script.push_str(&format!(
        "git init -q {CHECKOUT_DIR} && cd {CHECKOUT_DIR} || exit {code}\n\
         if ! {{ git -c credential.helper= -c http.followRedirects=false fetch -q --depth 1 \"${CLONE_URL_ENV}\" {sha} && git checkout -q FETCH_HEAD; }}; then\n  \
         echo \"{CLONE_FAILED_MARKER} {sha}\" >&2; exit {code}\nfi\n",
        code = CLONE_FAILED_EXIT_CODE,
    ));
    script
}

/// The entry's command, run in the checkout by a process that never held the credential.
pub fn command(rule: &PushTestRule) -> String {
    format!(
        "cd {CHECKOUT_DIR} || exit {CLONE_FAILED_EXIT_CODE}\n{}",
        rule.command
    )
}

/// The run a push asks for: the clone as its setup step, then the entry's command. `token`
/// (`GITHUB_TOKEN`, or an installation token) goes only into the clone step's environment,
/// marked secret, and only when the clone URL has a host to give it to.
pub fn run_request(
    rule: &PushTestRule,
    event: &PushEvent,
    token: Option<&SecretString>,
) -> RunRequest {
    let url = clone_url(rule);
    let mut setup_env = BTreeMap::from([
        (CLONE_URL_ENV.to_owned(), url.clone()),
        ("GIT_TERMINAL_PROMPT".to_owned(), "0".to_owned()),
    ]);
    let mut setup_secrets = Vec::new();
    let token = token.zip(credential_host(&url));
    if let Some((token, host)) = &token {
        setup_env.insert(TOKEN_ENV.into(), token.expose_secret().to_owned());
        setup_env.insert(TOKEN_HOST_ENV.into(), host.clone());
        setup_secrets.push(TOKEN_ENV.to_owned());
    }
    RunRequest {
        template: rule.template.clone(),
        command: command(rule),
        files: Vec::new(),
        env: rule.env.clone(),
        cwd: None,
        timeout: Some(format!("{}s", rule.timeout.as_secs().max(1))),
        secret_env: None,
        setup: Some(SetupStep {
            command: clone_step(&event.after, token.is_some()),
            env: setup_env,
            secret_env: setup_secrets,
        }),
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
        committed_at: event.committed_at(),
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
    fn the_clone_is_a_step_of_its_own_and_the_command_never_sees_the_token() {
        let rules = rules();
        let event = push("refs/heads/main", &["a"]);
        let token = SecretString::from("ghp_secret_value".to_owned());
        let req = run_request(&rules[0], &event, Some(&token));
        let setup = req.setup.as_ref().expect("a clone step");
        assert!(
            setup
                .command
                .contains(&format!("--depth 1 \"$STEWARD_CLONE_URL\" {SHA}"))
        );
        assert!(setup.command.contains("credential.helper="));
        assert!(setup.command.contains("http.followRedirects=false"));
        assert!(!setup.command.contains("ghp_secret_value"));
        assert_eq!(setup.env[TOKEN_ENV], "ghp_secret_value");
        assert_eq!(setup.env[TOKEN_HOST_ENV], "github.com");
        assert_eq!(setup.secret_env, vec![TOKEN_ENV.to_owned()]);
        assert_eq!(setup.env[CLONE_URL_ENV], "https://github.com/acme/api.git");
        // The command's process gets the entry's env, never the clone's.
        assert!(req.command.ends_with("make test"));
        assert!(!req.command.contains("ghp_secret_value"));
        assert!(!req.env.contains_key(TOKEN_ENV) && !req.env.contains_key(CLONE_URL_ENV));
        assert!(req.files.is_empty() && req.secret_env.is_none());
        let without = run_request(&rules[0], &event, None);
        let setup = without.setup.unwrap();
        assert!(!setup.env.contains_key(TOKEN_ENV));
        assert!(!setup.command.contains("GIT_ASKPASS"));
    }

    #[test]
    fn the_payloads_clone_url_never_decides_where_the_credential_goes() {
        let rules = rules();
        let mut event = push("refs/heads/main", &["a"]);
        event.repository.clone_url = Some("https://evil.example/acme/api.git".into());
        let token = SecretString::from("ghp_secret_value".to_owned());
        let setup = run_request(&rules[0], &event, Some(&token)).setup.unwrap();
        assert_eq!(setup.env[CLONE_URL_ENV], "https://github.com/acme/api.git");
        assert_eq!(setup.env[TOKEN_HOST_ENV], "github.com");
        // An operator's clone_url decides; a local one gets no credential at all.
        let mut local = rules[0].clone();
        local.clone_url = Some("file:///srv/git/api".into());
        let setup = run_request(&local, &event, Some(&token)).setup.unwrap();
        assert!(!setup.env.contains_key(TOKEN_ENV));
        let mut own = rules[0].clone();
        own.clone_url = Some("https://git.internal:8443/acme/api.git".into());
        let setup = run_request(&own, &event, Some(&token)).setup.unwrap();
        assert_eq!(setup.env[TOKEN_HOST_ENV], "git.internal:8443");
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
