//! `steward check`: says in plain words what is missing, what is risky and what cannot be reached.
//!
//! Problems (a missing secret, a service that does not answer, a template override that does not
//! render) exit 1; warnings (nobody may kill, no approvals channel, sandboxes kept out of sweeps
//! for longer than `[hygiene] max_exclude_for`) are printed but exit 0, since Steward still runs.
//! It reads settings and makes two harmless calls (Slack `auth.test`, one page of E2B's sandbox
//! list), and in Socket Mode a third (`apps.connections.open`, whose URL it never connects to); it
//! reads Redis (every Leave mark, through `Store::all_left_marks`); it changes nothing.
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::cases::{ApproverRule, CaseState, DecisionOption, Subject};
use crate::config::{ProcessEnv, Settings};
use crate::e2b::{E2bClient, ListQuery};
use crate::slack::client::SlackClient;
use crate::slack::format::{human_duration, when};
use crate::store::{LeftMark, Store};

/// Longest wait for each of the two reachability calls, so `check` never hangs on a dead host.
const REACH_TIMEOUT: Duration = Duration::from_secs(15);

/// What `check` found: `problems` make it fail, `warnings` do not.
#[derive(Debug, Default)]
struct Findings {
    problems: Vec<String>,
    warnings: Vec<String>,
}

/// Runs `steward check` with the process environment.
pub async fn run() -> anyhow::Result<ExitCode> {
    let settings = Settings::load(&ProcessEnv)?;
    let mut found = Findings::default();
    missing_settings(&settings, &mut found);
    template_overrides(&settings, &mut found);
    policy_warnings(&settings, &mut found);
    reach_e2b(&settings, &mut found).await;
    reach_slack(&settings, &mut found).await;
    open_socket(&settings, &mut found).await;
    long_exclusions(&settings, &mut found).await;
    for line in &found.problems {
        println!("{line}");
    }
    for line in &found.warnings {
        println!("Warning: {line}");
    }
    if !found.problems.is_empty() {
        return Ok(ExitCode::from(1));
    }
    match found.warnings.len() {
        0 => println!(
            "Configuration is complete (listening on {}).",
            settings.listen
        ),
        n => println!(
            "Configuration is complete (listening on {}), with {n} {} above.",
            settings.listen,
            if n == 1 { "warning" } else { "warnings" }
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// Every message rendered from sample values, as `serve` does at start, so a broken override in
/// `STEWARD_TEMPLATES` is found before a deploy instead of by a replica that will not start.
fn template_overrides(settings: &Settings, found: &mut Findings) {
    if let Some(dir) = &settings.slack.templates_dir
        && let Err(e) = crate::startup::load_templates(Some(dir))
    {
        found.problems.push(format!(
            "STEWARD_TEMPLATES ({}): {}; `steward serve` will not start with it.",
            dir.display(),
            e.to_string().trim_end_matches('.')
        ));
    }
}

fn missing_settings(settings: &Settings, found: &mut Findings) {
    if settings.e2b.api_key.is_none() {
        found
            .problems
            .push("E2B_API_KEY is not set: Steward cannot call E2B.".into());
    }
    if settings.e2b.team_id.is_none() {
        found.problems.push(
            "E2B_PROJECT_ID (or E2B_TEAM_ID) is not set: team metrics are unavailable.".into(),
        );
    }
    if settings.slack.bot_token.is_none() {
        found
            .problems
            .push("SLACK_BOT_TOKEN is not set: Steward cannot post to Slack.".into());
    }
    // In Socket Mode Slack's requests come over the app token's connection, unsigned.
    if settings.slack.signing_secret.is_none() && settings.socket.is_none() {
        found
            .problems
            .push("SLACK_SIGNING_SECRET is not set: every Slack request will be refused.".into());
    }
}

fn policy_warnings(settings: &Settings, found: &mut Findings) {
    let policy = &settings.policy;
    match policy.approvals_channel() {
        Ok(Some(_)) => {}
        Ok(None) => found.warnings.push(
            "[channels] approvals is not set in steward.toml: case cards go to whichever channel the command came from.".into(),
        ),
        Err(e) => found.problems.push(format!("{e}.")),
    }
    if let Err(e) = policy.sweep() {
        found.problems.push(format!("{e}."));
    }
    let approvers = &policy.approvals.approvers;
    if nobody(approvers.rule_for(DecisionOption::Kill)) {
        found.warnings.push(
            "nobody may choose Kill: [approvals.approvers] kill is empty in steward.toml, so kill cases would be posted that nobody can decide.".into(),
        );
    }
    if approvers.kill != *approvers.rule_for(DecisionOption::SnapshotThenKill)
        && nobody(approvers.rule_for(DecisionOption::SnapshotThenKill))
    {
        found.warnings.push(
            "nobody may choose Snapshot, then kill: [approvals.approvers] snapshot_then_kill is empty in steward.toml.".into(),
        );
    }
}

/// Whether `rule` lets nobody at all choose its option.
fn nobody(rule: &ApproverRule) -> bool {
    !rule.anyone && rule.users.is_empty() && rule.groups.is_empty()
}

/// One page of one sandbox: proves the URL, the key and the network all work.
async fn reach_e2b(settings: &Settings, found: &mut Findings) {
    if settings.e2b.api_key.is_none() {
        return;
    }
    let client = match E2bClient::new(&settings.e2b) {
        Ok(client) => client,
        Err(e) => {
            return found
                .problems
                .push(unreachable("E2B", &settings.e2b.api_url, &e));
        }
    };
    let query = ListQuery {
        limit: Some(1),
        max_pages: Some(1),
        ..ListQuery::default()
    };
    match tokio::time::timeout(REACH_TIMEOUT, client.list_sandboxes_page(&query, None)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => found
            .problems
            .push(unreachable("E2B", &settings.e2b.api_url, &e)),
        Err(_) => found.problems.push(format!(
            "E2B at {} did not answer within {} s.",
            settings.e2b.api_url,
            REACH_TIMEOUT.as_secs()
        )),
    }
}

/// What Slack answers for a bot token it does not take: none sent, unknown, revoked, or of a
/// deactivated account.
const REFUSED_TOKEN: [&str; 4] = [
    "not_authed",
    "invalid_auth",
    "token_revoked",
    "account_inactive",
];

/// `auth.test`: proves the URL, the bot token and the network all work.
async fn reach_slack(settings: &Settings, found: &mut Findings) {
    if settings.slack.bot_token.is_none() {
        return;
    }
    let client = match SlackClient::new(&settings.slack) {
        Ok(client) => client,
        Err(e) => {
            return found
                .problems
                .push(unreachable("Slack", &settings.slack.api_url, &e));
        }
    };
    match tokio::time::timeout(REACH_TIMEOUT, client.auth_test()).await {
        Ok(Ok(_)) => {}
        Ok(Err(crate::slack::client::SlackError::Api { code }))
            if REFUSED_TOKEN.contains(&code.as_str()) =>
        {
            found.problems.push(format!(
                "Slack refused SLACK_BOT_TOKEN ({code}): it must be the Bot User OAuth Token (xoxb-…) of this app, installed in the workspace, from the app's OAuth & Permissions page."
            ))
        }
        Ok(Err(e)) => found
            .problems
            .push(unreachable("Slack", &settings.slack.api_url, &e)),
        Err(_) => found.problems.push(format!(
            "Slack at {} did not answer auth.test within {} s.",
            settings.slack.api_url,
            REACH_TIMEOUT.as_secs()
        )),
    }
}

/// In Socket Mode, `apps.connections.open` with `SLACK_APP_TOKEN`: proves the token, its scope
/// and that Socket Mode is on. The URL it returns is never connected to and expires unused.
async fn open_socket(settings: &Settings, found: &mut Findings) {
    use crate::slack::socket::{OpenError, SocketClient};
    let Some(socket) = &settings.socket else {
        return;
    };
    let opened = match SocketClient::new(socket, &settings.slack.api_url) {
        Ok(client) => tokio::time::timeout(REACH_TIMEOUT, client.open()).await,
        Err(e) => Ok(Err(e)),
    };
    match opened {
        Ok(Ok(_url)) => {}
        Ok(Err(e @ OpenError::Refused { .. })) => found.problems.push(format!("{e}.")),
        Ok(Err(e)) => found.problems.push(unreachable(
            "Slack (Socket Mode)",
            &settings.slack.api_url,
            &e,
        )),
        Err(_) => found.problems.push(format!(
            "Slack at {} did not answer apps.connections.open within {} s.",
            settings.slack.api_url,
            REACH_TIMEOUT.as_secs()
        )),
    }
}

/// Long exclusions `check` names one by one; the rest are counted.
const LONG_EXCLUSIONS_SHOWN: usize = 20;

/// Every Leave mark in Redis that keeps its subject out of sweeps for longer than
/// `[hygiene] max_exclude_for` from when it was made (no end date counts: it is one), each a
/// warning naming the subject, until when, who decided and the case. Such marks were made before
/// the cap (or by a policy); sweeps honour them until their date. Redis not answering is a
/// problem: Steward records nothing without it.
async fn long_exclusions(settings: &Settings, found: &mut Findings) {
    use secrecy::ExposeSecret;
    let store = match Store::redis_lazy(
        settings.redis.url.expose_secret(),
        &settings.redis.key_prefix,
    ) {
        Ok(store) => store,
        Err(e) => return found.problems.push(format!("{e}.")),
    };
    let marks = match tokio::time::timeout(REACH_TIMEOUT, store.all_left_marks()).await {
        Ok(Ok(marks)) => marks,
        Ok(Err(e)) => {
            return found.problems.push(format!(
                "Redis (REDIS_URL) could not be read, so long exclusions could not be listed: {e}."
            ));
        }
        Err(_) => {
            return found.problems.push(format!(
                "Redis (REDIS_URL) did not answer within {} s.",
                REACH_TIMEOUT.as_secs()
            ));
        }
    };
    let max = settings.policy.hygiene.max_exclude_for;
    let cap = chrono::Duration::from_std(max).unwrap_or(chrono::Duration::MAX);
    let now = Utc::now();
    let mut long: Vec<(Subject, LeftMark)> = marks
        .into_iter()
        // Sweeps honour a mark for at most the cap from when it was made; one whose cap has
        // passed hides nothing any more.
        .filter(|(_, mark)| mark.at + cap > now)
        .filter(|(_, mark)| match mark.until {
            None => true,
            Some(until) => until > now && until - mark.at > cap,
        })
        .collect();
    // The furthest first (no end date before any date), then by subject, so the output is stable.
    long.sort_by(|(a, x), (b, y)| {
        let far = |m: &LeftMark| m.until.unwrap_or(DateTime::<Utc>::MAX_UTC);
        far(y).cmp(&far(x)).then_with(|| a.key().cmp(&b.key()))
    });
    for (subject, mark) in long.iter().take(LONG_EXCLUSIONS_SHOWN) {
        let by = match store.get_case(&mark.case).await.map(|c| c.state) {
            Ok(CaseState::Left { by, .. }) => format!(" by {by}"),
            _ => String::new(),
        };
        let until = match mark.until {
            Some(until) => format!("until {}", when(until)),
            None => "with no end date".to_owned(),
        };
        found.warnings.push(format!(
            "{subject} was left out of sweeps {until} (left{by} on {}, case {}): longer than [hygiene] max_exclude_for ({}) allows, so sweeps raise it again from {}.",
            when(mark.at),
            mark.case,
            human_duration(max),
            when(mark.at + cap)
        ));
    }
    if long.len() > LONG_EXCLUSIONS_SHOWN {
        found.warnings.push(format!(
            "{} more subjects are kept out of sweeps for longer than [hygiene] max_exclude_for allows.",
            long.len() - LONG_EXCLUSIONS_SHOWN
        ));
    }
}

/// One sentence for a failed call. Connection failures are said plainly rather than as the HTTP
/// library's error chain, which names types a reader cannot act on.
fn unreachable(service: &str, url: &str, e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    let lower = text.to_lowercase();
    if lower.contains("connection refused") {
        format!("{service} is unreachable: nothing answers at {url} (connection refused).")
    } else if lower.contains("dns error") || lower.contains("failed to lookup") {
        format!("{service} is unreachable: the host of {url} does not resolve.")
    } else if lower.contains("timed out") {
        format!("{service} is unreachable: {url} timed out.")
    } else {
        super::sentence(&format!(
            "{service} at {url} refused Steward's call: {text}"
        ))
    }
}
