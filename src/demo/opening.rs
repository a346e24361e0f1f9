//! What the demo does on start, so the page opens on real cases: one live sweep (in the hygiene
//! channel: with the demo's `list_from`, one list decision whose groups are approved, reviewed
//! case by case or trimmed with Exclude…), one governed run submitted through `/api/v1/runs` with the
//! demo agent's token (its run card follows when it ends), and one push to the demo repository
//! delivered to `/github/webhook` signed as GitHub signs it (its tests fail).
//!
//! Each step goes through the surface production uses; a step that fails is written down in
//! [`Opening`] and the demo goes on without it.
use serde_json::json;

use super::DemoHandle;
use super::repo::DemoRepo;
use super::setup::{REPOSITORY, REQUESTER};
use crate::hygiene::{Scheduler, SweepContext, sweep_now};

/// The governed run's command: a short job with a little output and a file.
pub const RUN_COMMAND: &str = "echo 'fetching the nightly prices'; \
for page in 1 2 3; do echo \"page $page: 200 OK, 50 rows\"; done; \
echo '{\"rows\": 150}' > prices.json; echo 'wrote prices.json (150 rows)'";

/// What the opening did.
#[derive(Debug, Clone, Default)]
pub struct Opening {
    /// The live sweep: where its digest went and how many cases it opened.
    pub sweep: Option<SweepSummary>,
    /// The governed run's id.
    pub run_id: Option<String>,
    /// The HTTP status Steward answered the push with (202 when a test run started).
    pub push_status: Option<u16>,
    /// Steps that could not be done, in words.
    pub problems: Vec<String>,
}

/// The part of a sweep report the terminal and the tests need.
#[derive(Debug, Clone)]
pub struct SweepSummary {
    pub channel: String,
    pub digest_ts: String,
    /// Cases opened: one per sandbox to decide, with a card or (in a list) without.
    pub cases_opened: usize,
    pub idle: usize,
    pub fleet: usize,
    /// The list decision's id when the sweep posted one (the demo's `list_from` makes it so).
    pub list: Option<String>,
    /// How many groups the list has (owner and recommendation); 0 without a list.
    pub groups: usize,
}

/// Runs the three steps in order; the sweep first, so the digest is the hygiene channel's
/// first message.
pub async fn run(
    demo: &DemoHandle,
    sweep: Option<SweepContext>,
    repo: Option<&DemoRepo>,
) -> Opening {
    let mut opening = Opening::default();
    // So a newcomer meets Retry failed: E2B refuses the demo's first pause, once (the banner says
    // so). It is queued before anything can pause, and only an approved group pauses.
    if let Some(e2b) = &demo.e2b {
        let refusal = json!({
            "op": "pause", "status": 403, "count": 1,
            "message": "Team is blocked from pausing sandboxes right now (a refusal the demo scripts once, so Retry failed has something to retry)",
        });
        if let Err(e) = e2b.hooks().fault_from(refusal).await {
            opening
                .problems
                .push(format!("could not script the one refused pause: {e}"));
        }
    }
    match sweep {
        None => opening
            .problems
            .push("no sweep: E2B is not configured (a bug in the demo)".into()),
        Some(ctx) => match sweep_now(&Scheduler::new(ctx), chrono::Utc::now()).await {
            Ok(report) => match report.posted {
                Some(posted) => {
                    opening.sweep = Some(SweepSummary {
                        channel: posted.channel,
                        digest_ts: posted.digest_ts,
                        cases_opened: posted.opened.len(),
                        idle: report.counts.idle,
                        fleet: report.fleet.total,
                        groups: if posted.list.is_some() {
                            report.groups.len()
                        } else {
                            0
                        },
                        list: posted.list.map(|id| id.to_string()),
                    })
                }
                None => opening
                    .problems
                    .push("the sweep posted no digest".to_owned()),
            },
            Err(e) => opening.problems.push(format!("the sweep failed: {e}")),
        },
    }
    let http = reqwest::Client::new();
    match submit_run(&http, demo).await {
        Ok(id) => opening.run_id = Some(id),
        Err(e) => opening
            .problems
            .push(format!("the governed run was not started: {e:#}")),
    }
    match repo {
        None => opening
            .problems
            .push("no push test: git is not installed".to_owned()),
        Some(repo) => match push(&http, demo, repo).await {
            Ok(status) => opening.push_status = Some(status),
            Err(e) => opening
                .problems
                .push(format!("the push was not delivered: {e:#}")),
        },
    }
    opening
}

/// `POST /api/v1/runs` as the demo agent; returns the run id.
async fn submit_run(http: &reqwest::Client, demo: &DemoHandle) -> anyhow::Result<String> {
    let resp = http
        .post(format!("{}/api/v1/runs", demo.steward_url))
        .bearer_auth(demo.agent_token())
        .json(&json!({"template": "base", "command": RUN_COMMAND, "timeout": "1m"}))
        .send()
        .await?;
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    if status != reqwest::StatusCode::ACCEPTED {
        anyhow::bail!("Steward answered {status}: {body}");
    }
    body["id"]
        .as_str()
        .or_else(|| body["run"]["id"].as_str())
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("Steward's answer names no run: {body}"))
}

/// A `push` to `main` of the demo repository, signed with the webhook secret.
async fn push(http: &reqwest::Client, demo: &DemoHandle, repo: &DemoRepo) -> anyhow::Result<u16> {
    use secrecy::ExposeSecret;
    let sha = &repo.sha;
    let body = json!({
        "ref": "refs/heads/main",
        "before": "0".repeat(40),
        "after": sha,
        "deleted": false,
        "compare": format!("https://github.com/{REPOSITORY}/compare/{sha}"),
        "repository": {
            "full_name": REPOSITORY,
            "clone_url": format!("https://github.com/{REPOSITORY}.git"),
        },
        "pusher": {"name": REQUESTER.name, "email": "dana@example.com"},
        "sender": {"login": REQUESTER.name},
        "commits": [{"id": sha, "message": repo.message, "modified": ["run-tests.sh"]}],
        "head_commit": {
            "id": sha,
            "message": repo.message,
            "url": format!("https://github.com/{REPOSITORY}/commit/{sha}"),
            "author": {"name": "Dana", "email": "dana@example.com", "username": REQUESTER.name},
            "modified": ["run-tests.sh"],
        },
    })
    .to_string();
    let signature =
        crate::github::signature::sign(demo.secrets.webhook.expose_secret(), body.as_bytes());
    let resp = http
        .post(format!("{}/github/webhook", demo.steward_url))
        .header("content-type", "application/json")
        .header("x-github-event", "push")
        .header("x-github-delivery", uuid::Uuid::new_v4().to_string())
        .header("x-hub-signature-256", signature)
        .body(body)
        .send()
        .await?;
    Ok(resp.status().as_u16())
}
