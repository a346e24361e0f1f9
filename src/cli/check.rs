//! `steward check`: says in plain words, one line per finding, what works, what is risky and what
//! stops Steward from working, each with the fix in the line.
//!
//! Findings are grouped ok / warning / problem. Exit status 0 when there is neither a warning nor a
//! problem, 1 with warnings only, 2 with a problem (a missing secret, a service that refuses or
//! does not answer, a channel the bot cannot post in, an approver Slack does not know, push tests
//! nobody can trigger); `--json` prints the same findings as an array of `{level, area, message,
//! fix}` for scripts. It never calls a configuration complete while something is off.
//!
//! It reads settings, asks Redis whether it answers and what it keeps on disk, reads every Leave
//! mark (through `Store::all_left_marks`), and makes harmless calls: one page of E2B's sandbox list
//! and the team's metrics maximum; Slack's `auth.test`, `conversations.info` for each configured
//! channel, `users.info` for each approver and `usergroups.users.list` for each approver group; and
//! in Socket Mode `apps.connections.open`, whose URL it never connects to. It changes nothing, and
//! never prints a secret (not even `REDIS_URL`, which may hold a password).
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::cases::{ApproverRule, CaseState, DecisionOption, Subject};
use crate::config::{ProcessEnv, Settings};
use crate::e2b::{E2bClient, E2bError, ListQuery, TeamMaxMetric};
use crate::slack::format::{human_duration, when};
use crate::store::{LeftMark, Persistence, Store};

mod slack;

/// Longest wait for each reachability call, so `check` never hangs on a dead host.
const REACH_TIMEOUT: Duration = Duration::from_secs(15);

/// `steward check`'s options.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Print the findings as a JSON array of `{level, area, message, fix}` (exit status as without).
    #[arg(long)]
    pub json: bool,
}

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
enum Level {
    /// Checked, and it works.
    Ok,
    /// Steward runs, but something will surprise someone (exit 1).
    Warning,
    /// Steward will not work as configured (exit 2).
    Problem,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
struct Finding {
    level: Level,
    /// What it is about: `settings`, `redis`, `e2b`, `slack`, `channels`, `approvers`, `policy`,
    /// `github`, `exclusions`, `templates` or `events`.
    area: &'static str,
    /// What was found, as a sentence.
    message: String,
    /// What to do about it, as a sentence; none for an ok.
    fix: Option<String>,
}

/// Everything `check` found, in the order it found it.
#[derive(Debug, Default)]
struct Findings(Vec<Finding>);

impl Findings {
    fn ok(&mut self, area: &'static str, message: impl Into<String>) {
        self.push(Level::Ok, area, message.into(), None);
    }

    fn warning(&mut self, area: &'static str, message: impl Into<String>, fix: Option<String>) {
        self.push(Level::Warning, area, message.into(), fix);
    }

    fn problem(&mut self, area: &'static str, message: impl Into<String>, fix: Option<String>) {
        self.push(Level::Problem, area, message.into(), fix);
    }

    fn push(&mut self, level: Level, area: &'static str, message: String, fix: Option<String>) {
        self.0.push(Finding {
            level,
            area,
            message: super::sentence(&message),
            fix: fix.map(|f| super::sentence(&f)),
        });
    }

    fn count(&self, level: Level) -> usize {
        self.0.iter().filter(|f| f.level == level).count()
    }

    /// 0 all fine, 1 warnings only, 2 a problem.
    fn exit_code(&self) -> ExitCode {
        match self.0.iter().map(|f| f.level).max() {
            Some(Level::Problem) => ExitCode::from(2),
            Some(Level::Warning) => ExitCode::from(1),
            _ => ExitCode::SUCCESS,
        }
    }

    /// The report for a person: ok, warnings, problems (the ones to act on last, nearest the
    /// prompt), then one line that says what the whole means.
    fn render(&self) -> String {
        let mut out = String::new();
        for (level, title) in [
            (Level::Ok, "OK"),
            (Level::Warning, "Warnings"),
            (Level::Problem, "Problems"),
        ] {
            let found: Vec<&Finding> = self.0.iter().filter(|f| f.level == level).collect();
            if found.is_empty() {
                continue;
            }
            out.push_str(&format!("{title} ({}):\n", found.len()));
            for f in found {
                out.push_str(&format!("  [{}] {}", f.area, f.message));
                if let Some(fix) = &f.fix {
                    out.push_str(&format!(" Fix: {fix}"));
                }
                out.push('\n');
            }
        }
        let (warnings, problems) = (self.count(Level::Warning), self.count(Level::Problem));
        let plural =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let summary = match (problems, warnings) {
            (0, 0) => format!(
                "All {} checks passed: start Steward with `steward serve`.",
                self.count(Level::Ok)
            ),
            (0, w) => format!(
                "{}, no problems: `steward serve` runs, but read {} above.",
                plural(w, "warning", "warnings"),
                if w == 1 { "it" } else { "them" }
            ),
            (p, w) => format!(
                "{} and {}: Steward will not work as configured until {} fixed.",
                plural(p, "problem", "problems"),
                plural(w, "warning", "warnings"),
                if p == 1 { "it is" } else { "they are" }
            ),
        };
        out.push_str(&summary);
        out.push('\n');
        out
    }
}

/// Runs `steward check` with the process environment.
pub async fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(&ProcessEnv)?;
    let mut found = Findings::default();
    missing_settings(&settings, &mut found);
    template_overrides(&settings, &mut found);
    policy(&settings, &mut found);
    push_tests(&settings, &mut found);
    if let Some(store) = reach_redis(&settings, &mut found).await {
        long_exclusions(&settings, &store, &mut found).await;
    }
    reach_e2b(&settings, &mut found).await;
    lifecycle_events(&settings, &mut found).await;
    slack::check(&settings, &mut found).await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&found.0)?);
    } else {
        print!("{}", found.render());
    }
    Ok(found.exit_code())
}

/// Every message rendered from sample values, as `serve` does at start, so a broken override in
/// `STEWARD_TEMPLATES` is found before a deploy instead of by a replica that will not start.
fn template_overrides(settings: &Settings, found: &mut Findings) {
    if let Some(dir) = &settings.slack.templates_dir
        && let Err(e) = crate::startup::load_templates(Some(dir))
    {
        found.problem(
            "templates",
            format!(
                "STEWARD_TEMPLATES ({}): {}; `steward serve` will not start with it",
                dir.display(),
                e.to_string().trim_end_matches('.')
            ),
            Some("fix that template, or remove it to use the embedded one".into()),
        );
    }
}

fn missing_settings(settings: &Settings, found: &mut Findings) {
    if settings.e2b.api_key.is_none() {
        found.problem(
            "settings",
            "E2B_API_KEY is not set: Steward cannot call E2B",
            Some("set E2B_API_KEY to an API key from the E2B dashboard (API Keys)".into()),
        );
    }
    if settings.e2b.team_id.is_none() {
        found.problem(
            "settings",
            "E2B_PROJECT_ID (or E2B_TEAM_ID) is not set: team metrics are unavailable",
            Some("set E2B_PROJECT_ID to the team id of the key's team (E2B dashboard, team settings)".into()),
        );
    }
    if settings.slack.bot_token.is_none() {
        found.problem(
            "settings",
            "SLACK_BOT_TOKEN is not set: Steward cannot post to Slack",
            Some(
                "set it to the Bot User OAuth Token (xoxb-…) on the app's OAuth & Permissions page"
                    .into(),
            ),
        );
    }
    // In Socket Mode Slack's requests come over the app token's connection, unsigned.
    if settings.slack.signing_secret.is_none() && settings.socket.is_none() {
        found.problem(
            "settings",
            "SLACK_SIGNING_SECRET is not set: every Slack request will be refused",
            Some("set it to the Signing Secret on the app's Basic Information page (or use Socket Mode with SLACK_APP_TOKEN)".into()),
        );
    }
}

/// What `steward.toml` leaves without anyone or anywhere: cards with no channel, kills nobody may
/// choose, sweeps that never run.
fn policy(settings: &Settings, found: &mut Findings) {
    let policy = &settings.policy;
    match policy.approvals_channel() {
        Ok(Some(_)) => {}
        Ok(None) => found.warning(
            "policy",
            "[channels] approvals is not set in steward.toml: case cards go to whichever channel the command came from",
            Some("set `approvals = \"C…\"` under [channels] in steward.toml".into()),
        ),
        Err(e) => found.problem("policy", e, Some("use the channel's id (C…), not its name".into())),
    }
    match policy.sweep() {
        Ok((_, Some(channel))) => found.ok(
            "policy",
            format!("scheduled sweeps are on: digests go to {channel}"),
        ),
        Ok((_, None)) => found.warning(
            "policy",
            "scheduled sweeps are off: no hygiene channel is set, so idle sandboxes are only found by a `/sandbox sweep` or `steward sweep`",
            Some("set `hygiene = \"C…\"` under [channels] in steward.toml".into()),
        ),
        Err(e) => found.problem("policy", e, Some("use the channel's id (C…), not its name".into())),
    }
    let approvers = &policy.approvals.approvers;
    if nobody(approvers.rule_for(DecisionOption::Kill)) {
        found.warning(
            "policy",
            "nobody may choose Kill: [approvals.approvers] kill is empty in steward.toml, so kill cases would be posted that nobody can decide",
            Some("add `kill = { users = [\"U…\"] }` under [approvals.approvers] in steward.toml".into()),
        );
    }
    if approvers.kill != *approvers.rule_for(DecisionOption::SnapshotThenKill)
        && nobody(approvers.rule_for(DecisionOption::SnapshotThenKill))
    {
        found.warning(
            "policy",
            "nobody may choose Snapshot, then kill: [approvals.approvers] snapshot_then_kill is empty in steward.toml",
            Some("name someone in it, or remove it so the kill rule applies".into()),
        );
    }
}

/// Whether `rule` lets nobody at all choose its option.
fn nobody(rule: &ApproverRule) -> bool {
    !rule.anyone && rule.users.is_empty() && rule.groups.is_empty()
}

/// `[[push_tests]]` without a webhook secret: every push webhook is refused, so no test runs.
fn push_tests(settings: &Settings, found: &mut Findings) {
    let github = &settings.github;
    if github.push_tests.is_empty() {
        return;
    }
    let n = github.push_tests.len();
    if github.webhook_secrets.is_empty() {
        found.problem(
            "github",
            format!(
                "{n} [[push_tests]] {} configured but no GitHub webhook secret is set: every push webhook is refused, so no test runs",
                if n == 1 { "is" } else { "are" }
            ),
            Some("set GITHUB_WEBHOOK_SECRET to the secret of the repository's webhook (GitHub: Settings, Webhooks)".into()),
        );
    } else {
        found.ok(
            "github",
            format!(
                "{n} [[push_tests]] {} a GitHub webhook secret to verify pushes with",
                if n == 1 { "has" } else { "have" }
            ),
        );
    }
}

/// Redis answers, and keeps what Steward writes on disk. Answers the store when it answers.
async fn reach_redis(settings: &Settings, found: &mut Findings) -> Option<Store> {
    use secrecy::ExposeSecret;
    let fix = Some("start Redis, or point REDIS_URL at one (redis://host:6379)".to_owned());
    let store = match Store::redis_lazy(
        settings.redis.url.expose_secret(),
        &settings.redis.key_prefix,
    ) {
        Ok(store) => store,
        Err(e) => {
            found.problem("redis", format!("REDIS_URL cannot be used: {e}"), fix);
            return None;
        }
    };
    match tokio::time::timeout(REACH_TIMEOUT, store.ping()).await {
        Ok(Ok(())) => found.ok(
            "redis",
            format!(
                "Redis answers at REDIS_URL (key prefix `{}`)",
                settings.redis.key_prefix
            ),
        ),
        Ok(Err(e)) => {
            found.problem(
                "redis",
                format!(
                    "Redis (REDIS_URL) does not answer: {e}; Steward records nothing without it"
                ),
                fix,
            );
            return None;
        }
        Err(_) => {
            found.problem(
                "redis",
                format!(
                    "Redis (REDIS_URL) did not answer within {} s; Steward records nothing without it",
                    REACH_TIMEOUT.as_secs()
                ),
                fix,
            );
            return None;
        }
    }
    let durable = Some(
        "run Redis with `appendonly yes` (redis.conf, or `redis-server --appendonly yes` as deploy/compose.yml does; docs/operations.md, \"Redis\")".to_owned(),
    );
    match tokio::time::timeout(REACH_TIMEOUT, store.persistence()).await {
        Ok(Ok(Persistence::AppendOnly)) => found.ok(
            "redis",
            "Redis keeps an append-only file (appendonly yes): a restart keeps cases, decisions and runs",
        ),
        Ok(Ok(Persistence::Snapshots(rules))) => found.warning(
            "redis",
            format!(
                "Redis only saves snapshots (save {rules}): a crash loses the cases and decisions made since the last one"
            ),
            durable,
        ),
        Ok(Ok(Persistence::Off)) => found.warning(
            "redis",
            "Redis keeps nothing on disk (appendonly no, no save rules): a Redis restart loses every open case, decision and run",
            durable,
        ),
        Ok(Ok(Persistence::Unknown(why))) => found.warning(
            "redis",
            format!("could not tell whether Redis keeps its data on disk: {why}"),
            Some("make sure its append-only file is on (your provider's persistence setting)".into()),
        ),
        Ok(Err(e)) => found.warning(
            "redis",
            format!("could not ask Redis whether it keeps its data on disk: {e}"),
            durable,
        ),
        Err(_) => found.warning(
            "redis",
            "Redis did not say within the time whether it keeps its data on disk",
            durable,
        ),
    }
    Some(store)
}

/// One page of one sandbox proves the URL, the key and the network; the team's metrics prove
/// E2B knows `E2B_PROJECT_ID` for that key.
async fn reach_e2b(settings: &Settings, found: &mut Findings) {
    if settings.e2b.api_key.is_none() {
        return;
    }
    let url = &settings.e2b.api_url;
    let network = Some("check E2B_API_URL and that this machine can reach it".to_owned());
    let client = match E2bClient::new(&settings.e2b) {
        Ok(client) => client,
        Err(e) => return found.problem("e2b", unreachable("E2B", url, &e), network),
    };
    let query = ListQuery {
        limit: Some(1),
        max_pages: Some(1),
        ..ListQuery::default()
    };
    match tokio::time::timeout(REACH_TIMEOUT, client.list_sandboxes_page(&query, None)).await {
        Ok(Ok(_)) => found.ok("e2b", format!("E2B at {url} accepts E2B_API_KEY")),
        Ok(Err(E2bError::Unauthorized)) => {
            return found.problem(
                "e2b",
                format!("E2B at {url} refused E2B_API_KEY (401)"),
                Some(
                    "copy a current key from the E2B dashboard (API Keys) into E2B_API_KEY".into(),
                ),
            );
        }
        Ok(Err(e)) => return found.problem("e2b", unreachable("E2B", url, &e), network),
        Err(_) => {
            return found.problem(
                "e2b",
                format!(
                    "E2B at {url} did not answer within {} s",
                    REACH_TIMEOUT.as_secs()
                ),
                network,
            );
        }
    }
    let Some(team) = client.team_id().map(str::to_owned) else {
        return;
    };
    let now = Utc::now();
    let asked = client.team_metrics_max(
        TeamMaxMetric::ConcurrentSandboxes,
        Some(now - chrono::Duration::minutes(10)),
        Some(now),
    );
    match tokio::time::timeout(REACH_TIMEOUT, asked).await {
        Ok(Ok(_)) => found.ok("e2b", format!("E2B knows team `{team}` (E2B_PROJECT_ID)")),
        Ok(Err(
            e @ (E2bError::Forbidden { .. } | E2bError::NotFound { .. } | E2bError::BadRequest { .. }),
        )) => found.problem(
            "e2b",
            format!("E2B does not know team `{team}` (E2B_PROJECT_ID) for this key: {e}"),
            Some("set E2B_PROJECT_ID to the team id of the key's team (E2B dashboard, team settings)".into()),
        ),
        Ok(Err(e)) => found.problem(
            "e2b",
            format!("E2B did not answer for team `{team}` (E2B_PROJECT_ID): {e}"),
            network,
        ),
        Err(_) => found.problem(
            "e2b",
            format!(
                "E2B did not answer for team `{team}` within {} s",
                REACH_TIMEOUT.as_secs()
            ),
            network,
        ),
    }
}

/// How E2B's lifecycle events reach this deployment: the webhook registrations E2B holds for the
/// team (those ending in `/e2b/webhook` are Steward's), `E2B_WEBHOOK_SECRET`, and the poller.
async fn lifecycle_events(settings: &Settings, found: &mut Findings) {
    if settings.e2b.api_key.is_none() {
        return;
    }
    // E2B unreachable or refusing the key is said once, by the `e2b` check.
    if found
        .0
        .iter()
        .any(|f| f.area == "e2b" && f.level == Level::Problem)
    {
        return;
    }
    let Ok(client) = E2bClient::new(&settings.e2b) else {
        return;
    };
    let poll = settings.policy.events_poll_every().ok().flatten();
    let polling = match poll {
        Some(every) => format!(
            "one replica polls E2B's events API every {}",
            crate::slack::format::human_duration(every)
        ),
        None => "the poller is off ([events] poll_every = \"off\")".to_owned(),
    };
    let hooks = match tokio::time::timeout(REACH_TIMEOUT, client.webhooks()).await {
        Ok(Ok(hooks)) => hooks,
        Ok(Err(e)) => {
            return found.warning(
                "events",
                format!("E2B did not list its webhook registrations ({e}); {polling}"),
                None,
            );
        }
        Err(_) => {
            return found.warning(
                "events",
                "E2B did not list its webhook registrations in time".to_owned(),
                None,
            );
        }
    };
    let ours: Vec<&str> = hooks
        .iter()
        .filter(|h| h.enabled && h.url.trim_end_matches('/').ends_with("/e2b/webhook"))
        .map(|h| h.url.as_str())
        .collect();
    let register = match &settings.public_url {
        Some(_) => {
            "run `steward e2b webhooks register` (it registers STEWARD_PUBLIC_URL)".to_owned()
        }
        None => "run `steward e2b webhooks register --url https://<this deployment>`".to_owned(),
    };
    // Where E2B should deliver, when the deployment says where it is reached.
    let here = settings
        .public_url
        .as_deref()
        .map(|base| format!("{base}/e2b/webhook"));
    let points_here = here
        .as_deref()
        .map(|here| ours.iter().any(|u| u.trim_end_matches('/') == here));
    match (settings.e2b_webhook_secrets.is_empty(), ours.is_empty()) {
        (true, true) if poll.is_some() => found.ok(
            "events",
            format!("no E2B webhook is registered, so events arrive by polling: {polling}"),
        ),
        (true, true) => found.warning(
            "events",
            "no E2B webhook is registered and the poller is off: Steward hears of sandboxes changed outside it only at sweeps".to_owned(),
            Some(format!("set E2B_WEBHOOK_SECRET and {register}, or remove [events] poll_every = \"off\"")),
        ),
        (true, false) => found.problem(
            "events",
            format!(
                "E2B delivers lifecycle events to {}, but E2B_WEBHOOK_SECRET is not set here, so every delivery is refused",
                ours.join(", ")
            ),
            Some("set E2B_WEBHOOK_SECRET to the registration's signature secret on every replica".into()),
        ),
        (false, true) => found.warning(
            "events",
            format!("E2B_WEBHOOK_SECRET is set but no E2B webhook registration points at an /e2b/webhook; {polling}"),
            Some(register),
        ),
        (false, false) => match (points_here, here) {
            (Some(false), Some(here)) => found.warning(
                "events",
                format!(
                    "E2B delivers lifecycle events to {}, not to this deployment ({here}, from STEWARD_PUBLIC_URL); {polling}",
                    ours.join(", ")
                ),
                Some(format!("{register}, and delete the registration that is not yours with `steward e2b webhooks delete <id>` if nothing else uses it")),
            ),
            (Some(_), Some(here)) => found.ok(
                "events",
                format!("E2B delivers lifecycle events to this deployment ({here}); {polling}"),
            ),
            _ => found.ok(
                "events",
                format!(
                    "E2B delivers lifecycle events to {} (set STEWARD_PUBLIC_URL and check can tell whether that is this deployment); {polling}",
                    ours.join(", ")
                ),
            ),
        },
    }
}

/// Long exclusions `check` names one by one; the rest are counted.
const LONG_EXCLUSIONS_SHOWN: usize = 20;

/// Every Leave mark in Redis that keeps its subject out of sweeps for longer than
/// `[hygiene] max_exclude_for` from when it was made (no end date counts: it is one), each a
/// warning naming the subject, until when, who decided and the case. Such marks were made before
/// the cap (or by a policy); sweeps honour them until their date.
async fn long_exclusions(settings: &Settings, store: &Store, found: &mut Findings) {
    let marks = match tokio::time::timeout(REACH_TIMEOUT, store.all_left_marks()).await {
        Ok(Ok(marks)) => marks,
        Ok(Err(e)) => {
            return found.problem(
                "exclusions",
                format!("Redis (REDIS_URL) could not be read, so long exclusions could not be listed: {e}"),
                None,
            );
        }
        Err(_) => {
            return found.problem(
                "exclusions",
                format!(
                    "Redis (REDIS_URL) did not list the exclusions within {} s",
                    REACH_TIMEOUT.as_secs()
                ),
                None,
            );
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
        found.warning(
            "exclusions",
            format!(
                "{subject} was left out of sweeps {until} (left{by} on {}, case {}): longer than [hygiene] max_exclude_for ({}) allows, so sweeps raise it again from {}",
                when(mark.at),
                mark.case,
                human_duration(max),
                when(mark.at + cap)
            ),
            None,
        );
    }
    if long.len() > LONG_EXCLUSIONS_SHOWN {
        found.warning(
            "exclusions",
            format!(
                "{} more subjects are kept out of sweeps for longer than [hygiene] max_exclude_for allows",
                long.len() - LONG_EXCLUSIONS_SHOWN
            ),
            None,
        );
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
