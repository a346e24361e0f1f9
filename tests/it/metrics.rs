//! `GET /metrics` over HTTP: traffic through Slack, E2B, the queue and a case decision moves the
//! series README lists, every label value comes from a bounded set (no ids), a separate
//! `STEWARD_METRICS_LISTEN` listener takes `/metrics` off the main one, and a scrape answers
//! while Redis is down.
//!
//! The recorder is process-wide and tests run in parallel, so these tests assert that a series
//! grew by at least what this test did, never an exact value.

use std::collections::{BTreeMap, HashMap};

use crate::common::{
    E2B_KEY, TestApp, TestAppOptions, case_id_in, eventually, free_port, hook, spawn_app_with,
    unix_now, visible_text,
};
use sandbox_steward::cases::CaseState;
use sandbox_steward::config::Settings;
use sandbox_steward::metrics::{Kind, SERIES};
use sandbox_steward::sim::slack::Fault;
use sandbox_steward::startup::Application;
use serde_json::json;

/// One sample line of a scrape.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses Prometheus' text format (the subset the exporter writes: no escapes in our values).
fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let inner = rest.strip_suffix('}').expect("labels close");
                    let labels = inner
                        .split(',')
                        .filter(|p| !p.is_empty())
                        .map(|pair| {
                            let (k, v) = pair.split_once('=').expect("label=value");
                            (k.to_owned(), v.trim_matches('"').to_owned())
                        })
                        .collect();
                    (name.to_owned(), labels)
                }
                None => (series.to_owned(), BTreeMap::new()),
            };
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("a number in {line}")),
            };
            Sample {
                name,
                labels,
                value,
            }
        })
        .collect()
}

/// The sum of the samples named `name` whose labels include every pair of `with`.
pub(crate) fn total(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            with.iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

async fn scrape_at(http: &reqwest::Client, url: &str) -> (String, Vec<Sample>) {
    let resp = http
        .get(url)
        .send()
        .await
        .expect("the scrape reaches the app");
    assert_eq!(resp.status(), 200);
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let text = resp.text().await.unwrap();
    let samples = parse(&text);
    (text, samples)
}

pub(crate) async fn scrape(app: &TestApp) -> (String, Vec<Sample>) {
    scrape_at(&app.http, &app.url("/metrics")).await
}

/// The values each label may take. A label not listed here fails the test: a new label needs a
/// bounded set before it ships.
fn bounded(label: &str, value: &str) -> bool {
    const E2B_ACTIONS: &[&str] = &[
        "create",
        "list",
        "get",
        "kill",
        "pause",
        "resume",
        "connect",
        "timeout",
        "refresh",
        "logs",
        "metrics",
        "metrics-many",
        "team-metrics",
        "team-metrics-max",
        "snapshot",
        "snapshots",
        "templates",
        "template",
        "delete-template",
    ];
    let status_code =
        value.len() == 3 && value.parse::<u16>().is_ok_and(|c| (100..=599).contains(&c));
    match label {
        "route" => ["commands", "interactions", "events"].contains(&value),
        "outcome" => [
            // Slack requests
            "signature_refused",
            "2xx",
            "4xx",
            "5xx",
            "other",
            "cancelled",
            // Socket Mode envelopes
            "handled",
            "duplicate",
            "ignored",
            // Slack Web API
            "ok",
            "api_error",
            "rate_limited",
            "transport",
            "refused",
            // decisions
            "recorded",
            "not_allowed",
            "store_error",
            // jobs and steps
            "finished",
            "gave_up",
            "left_for_retry",
            "done",
            "transient",
            "permanent",
            "evidence_changed",
            // sweeps
            "failed",
        ]
        .contains(&value),
        "action" => E2B_ACTIONS.contains(&value),
        "status" => status_code || ["transport", "too_large", "other"].contains(&value),
        "reason" => [
            // E2B retries
            "rate_limited",
            "status",
            "not_connected",
            "interrupted",
            // Socket Mode reconnects
            "disconnect",
            "dropped",
            "open_failed",
            "connect_failed",
            "refused",
        ]
        .contains(&value),
        "type" => ["slash_commands", "interactive", "events_api", "other"].contains(&value),
        // Slack's method names are a fixed vocabulary: dotted lowercase words.
        "method" => {
            ["response_url", "upload_url"].contains(&value)
                || (value.contains('.')
                    && value.len() < 40
                    && value.chars().all(|c| c.is_ascii_alphabetic() || c == '.'))
        }
        "option" => sandbox_steward::cases::DecisionOption::ALL
            .iter()
            .any(|o| o.as_str() == value),
        "kind" => ["decision", "run", "restore", "unavailable", "backend"].contains(&value),
        "step" => [
            "snapshot",
            "verify_snapshot",
            "kill",
            "pause",
            "delete_template",
            "extend_timeout",
        ]
        .contains(&value),
        "mode" => ["live", "dry_run"].contains(&value),
        "state" => ["running", "paused"].contains(&value),
        "version" => value == env!("CARGO_PKG_VERSION"),
        "le" => value == "+Inf" || value.parse::<f64>().is_ok(),
        _ => false,
    }
}

/// Every `steward_` sample belongs to a series the metrics module declares, with exactly its
/// label names, and every label value is from its bounded set.
fn assert_declared_and_bounded(samples: &[Sample]) {
    let declared: HashMap<&str, (Kind, &[&str])> = SERIES
        .iter()
        .map(|s| (s.name, (s.kind, s.labels)))
        .collect();
    for sample in samples.iter().filter(|s| s.name.starts_with("steward_")) {
        let (base, extra): (&str, &[&str]) = if let Some(b) = sample.name.strip_suffix("_bucket") {
            (b, &["le"])
        } else if let Some(b) = sample
            .name
            .strip_suffix("_sum")
            .or_else(|| sample.name.strip_suffix("_count"))
            .filter(|b| declared.get(b).is_some_and(|d| d.0 == Kind::Histogram))
        {
            (b, &[])
        } else {
            (sample.name.as_str(), &[])
        };
        let (_, labels) = declared
            .get(base)
            .unwrap_or_else(|| panic!("{} is not declared in metrics::SERIES", sample.name));
        let mut want: Vec<&str> = labels.iter().chain(extra).copied().collect();
        want.sort_unstable();
        let got: Vec<&str> = sample.labels.keys().map(String::as_str).collect();
        assert_eq!(got, want, "labels of {}", sample.name);
        for (label, value) in &sample.labels {
            assert!(
                bounded(label, value),
                "{}: {label}={value:?} is not from the bounded set",
                sample.name
            );
        }
    }
}

const APPROVALS: &str = "C0APPROVALS";

fn options() -> TestAppOptions {
    TestAppOptions {
        sandboxes: 0,
        policy: Some(format!(
            r#"
[channels]
approvals = "{APPROVALS}"
[approvals.approvers]
kill = {{ users = ["U0002"] }}
pause = {{ anyone = true }}
leave = {{ anyone = true }}
"#
        )),
        ..TestAppOptions::default()
    }
}

#[tokio::test]
async fn traffic_moves_the_series_and_no_label_carries_an_id() {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(
        json!({"sandboxID": "metricsvictim1", "templateID": "base", "state": "running"}),
    )
    .await;
    let (_, before) = scrape(&app).await;

    // A signed command answered inline, and a forged one.
    assert_eq!(app.post_command("help").await.status(), 200);
    let forged = app
        .http
        .post(app.url("/slack/commands"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", unix_now().to_string())
        .header("x-slack-signature", "v0=00000000")
        .body("text=help")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);

    // An E2B listing that E2B first refuses with a 429 (no wait asked), then answers; the
    // answer reaches Slack through the response_url.
    app.e2b_fault(json!({"op": "list", "status": 429, "count": 1, "retry_after_secs": 0}))
        .await;
    let listed = app.run_deferred("list").await;
    assert!(!visible_text(&listed).is_empty());

    // A case: opened by a command, its card posted (Slack rate-limits the first post once),
    // then decided by a click and carried out by the worker.
    app.slack.add_fault(Fault {
        method: "chat.postMessage".into(),
        status: 429,
        retry_after_secs: Some(0),
        count: 1,
        error: None,
    });
    let name = hook();
    app.post_command_to("kill metricsvictim1 done with it", &name)
        .await;
    let reply = visible_text(&app.wait_for_hook(&name).await);
    assert!(reply.contains("Opened case"), "{reply}");
    let case = case_id_in(&reply);
    let clicked = app
        .click_case(&case, "case_pause", "U0002", &hook(), &hook())
        .await;
    assert_eq!(clicked.status(), 200);
    eventually("the pause is carried out", || async {
        matches!(
            app.state.store.get_case(&case).await.unwrap().state,
            CaseState::Done { .. }
        )
    })
    .await;
    // A second click on the decided card is refused ("Already decided"), which its reply says.
    let refused_reply = hook();
    let again = app
        .click_case(&case, "case_pause", "U0002", &refused_reply, &hook())
        .await;
    assert_eq!(again.status(), 200);
    let refusal = visible_text(&app.wait_for_hook(&refused_reply).await);
    assert!(refusal.contains("Already"), "{refusal}");

    let (text, after) = scrape(&app).await;
    let grew = |name: &str, with: &[(&str, &str)], by: f64| {
        let delta = total(&after, name, with) - total(&before, name, with);
        assert!(
            delta >= by,
            "{name}{with:?} grew by {delta}, expected at least {by}"
        );
    };
    grew(
        "steward_slack_requests_total",
        &[("route", "commands"), ("outcome", "2xx")],
        3.0,
    );
    grew(
        "steward_slack_requests_total",
        &[("route", "commands"), ("outcome", "signature_refused")],
        1.0,
    );
    grew(
        "steward_slack_requests_total",
        &[("route", "interactions"), ("outcome", "2xx")],
        1.0,
    );
    grew(
        "steward_slack_request_duration_seconds_count",
        &[("route", "commands")],
        4.0,
    );
    grew(
        "steward_slack_request_duration_seconds_bucket",
        &[("route", "commands"), ("le", "+Inf")],
        4.0,
    );
    grew(
        "steward_e2b_requests_total",
        &[("action", "list"), ("status", "429")],
        1.0,
    );
    grew(
        "steward_e2b_requests_total",
        &[("action", "list"), ("status", "200")],
        1.0,
    );
    grew(
        "steward_e2b_retries_total",
        &[("action", "list"), ("reason", "rate_limited")],
        1.0,
    );
    grew(
        "steward_e2b_rate_limit_wait_seconds_count",
        &[("action", "list")],
        1.0,
    );
    grew(
        "steward_e2b_request_duration_seconds_count",
        &[("action", "pause")],
        1.0,
    );
    grew(
        "steward_slack_api_calls_total",
        &[("method", "chat.postMessage"), ("outcome", "rate_limited")],
        1.0,
    );
    grew(
        "steward_slack_api_rate_limited_total",
        &[("method", "chat.postMessage")],
        1.0,
    );
    grew(
        "steward_slack_api_calls_total",
        &[("method", "chat.postMessage"), ("outcome", "ok")],
        1.0,
    );
    grew(
        "steward_slack_api_calls_total",
        &[("method", "response_url"), ("outcome", "ok")],
        2.0,
    );
    grew(
        "steward_decisions_total",
        &[("option", "pause"), ("outcome", "recorded")],
        1.0,
    );
    grew(
        "steward_decisions_total",
        &[("option", "pause"), ("outcome", "refused")],
        1.0,
    );
    grew(
        "steward_jobs_total",
        &[("kind", "decision"), ("outcome", "finished")],
        1.0,
    );
    grew(
        "steward_job_step_duration_seconds_count",
        &[("step", "pause"), ("outcome", "done")],
        1.0,
    );
    for gauge in [
        "steward_queue_depth",
        "steward_queue_oldest_job_age_seconds",
        "steward_cases_expired_total",
        "steward_redis_up",
        "steward_build_info",
    ] {
        assert!(
            after.iter().any(|s| s.name == gauge),
            "{gauge} is missing from:\n{text}"
        );
    }
    assert!(text.contains("# TYPE steward_slack_request_duration_seconds histogram"));
    assert!(text.contains("# HELP steward_e2b_requests_total"));

    assert_declared_and_bounded(&after);
    for id in [
        "metricsvictim1",
        "U0001",
        "U0002",
        case.as_str(),
        APPROVALS,
        E2B_KEY,
    ] {
        assert!(!text.contains(id), "the scrape names {id}");
    }
}

#[tokio::test]
async fn a_separate_metrics_listener_serves_metrics_and_the_main_one_then_does_not() {
    let prefix = crate::common::unique_prefix();
    let env: HashMap<String, String> = [
        ("STEWARD_LISTEN", "127.0.0.1:0".to_owned()),
        ("STEWARD_METRICS_LISTEN", "127.0.0.1:0".to_owned()),
        ("REDIS_URL", crate::common::redis_url()),
        ("STEWARD_REDIS_PREFIX", prefix),
        ("SLACK_SIGNING_SECRET", "metrics-listener-secret".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let settings = Settings::load(&env).expect("settings load");
    let mut app = Application::build(settings).await.expect("app builds");
    app.loops_mut().worker_enabled = false;
    let main = app.port();
    let metrics = app.metrics_port().expect("a metrics listener was bound");
    assert_ne!(main, metrics);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();

    let (text, _) = scrape_at(&http, &format!("http://127.0.0.1:{metrics}/metrics")).await;
    assert!(text.contains("steward_build_info"), "{text}");
    let on_main = http
        .get(format!("http://127.0.0.1:{main}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        on_main.status(),
        404,
        "the main listener no longer serves /metrics"
    );
    let health = http
        .get(format!("http://127.0.0.1:{main}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200, "the main listener serves the rest");
    let other = http
        .get(format!("http://127.0.0.1:{metrics}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        other.status(),
        404,
        "the metrics listener serves /metrics only"
    );

    let _ = stop.send(());
    running
        .await
        .expect("serve did not panic")
        .expect("both listeners stop cleanly");
}

#[tokio::test]
async fn an_address_that_is_no_address_is_refused_naming_the_variable() {
    let env: HashMap<String, String> = [("STEWARD_METRICS_LISTEN", "port nine thousand")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let error = Settings::load(&env).expect_err("a bad address is refused");
    let text = error.to_string();
    assert!(text.contains("STEWARD_METRICS_LISTEN"), "{text}");
    assert!(text.contains("port nine thousand"), "{text}");
}

#[tokio::test]
async fn with_redis_down_a_scrape_still_answers_and_counts_the_redis_errors() {
    // A port nobody listens on.
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let app = spawn_app_with(TestAppOptions {
        redis_url: Some(url),
        worker: false,
        ..TestAppOptions::default()
    })
    .await;
    let (_, before) = scrape(&app).await;
    let (_, after) = scrape(&app).await;
    let name = "steward_redis_errors_total";
    let with = [("kind", "unavailable")];
    assert!(
        total(&after, name, &with) > total(&before, name, &with),
        "the second scrape's failed queue read is counted (refused at once, or timed out \
         while the store reconnects on a loaded machine)"
    );
    // steward_redis_up is not checked here: a gauge is shared by every app in this process, and
    // another test's scrape may set it back to 1 in between.
}

/// The series names a text mentions (`steward_…`), histogram suffixes taken off.
fn series_named_in(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("steward_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        if name == "steward_" {
            // The prefix itself, as prose names it.
            continue;
        }
        let declared = |n: &str| SERIES.iter().any(|s| s.name == n);
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).filter(|b| declared(b)))
            .map(str::to_owned)
            .unwrap_or(name);
        names.push(base);
    }
    names
}

#[test]
fn the_dashboard_the_alert_rules_and_readme_name_only_series_that_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
    for file in [
        "deploy/grafana-dashboard.json",
        "deploy/alerts.yml",
        "README.md",
    ] {
        let named = series_named_in(&read(file));
        assert!(!named.is_empty(), "{file} names no series");
        for name in named {
            assert!(
                SERIES.iter().any(|s| s.name == name),
                "{file} names {name}, which metrics::SERIES does not declare"
            );
        }
    }
    // The table's rows: lines of README's "## Metrics" section that start a table cell with a
    // series name.
    let readme = read("README.md");
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Metrics\n"))
        .expect("README has a Metrics section");
    let rows: String = section
        .lines()
        .filter(|line| line.starts_with("| `steward_"))
        .map(|line| line.split('|').nth(1).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ");
    let readme = series_named_in(&rows);
    for s in SERIES {
        assert!(
            readme.iter().any(|n| n == s.name),
            "README's Metrics table misses {}",
            s.name
        );
    }
    serde_json::from_str::<serde_json::Value>(&read("deploy/grafana-dashboard.json"))
        .expect("the dashboard is JSON");
}

#[tokio::test]
async fn a_sweep_records_its_duration_and_the_fleet_it_saw() {
    use sandbox_steward::hygiene::{SweepMode, sweep_once};
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 12,
        worker: false,
        ..TestAppOptions::default()
    })
    .await;
    let ctx = app.state.sweep.clone().expect("E2B is configured");
    let (_, before) = scrape(&app).await;
    let report = sweep_once(&ctx, chrono::Utc::now(), SweepMode::DryRun)
        .await
        .expect("the dry run succeeds");
    assert_eq!(report.fleet.total, 12);
    let (_, after) = scrape(&app).await;
    let grew =
        |name: &str, with: &[(&str, &str)]| total(&after, name, with) - total(&before, name, with);
    let dry_ok = [("mode", "dry_run"), ("outcome", "ok")];
    assert!(grew("steward_sweeps_total", &dry_ok) >= 1.0);
    assert!(
        grew(
            "steward_sweep_duration_seconds_count",
            &[("mode", "dry_run")]
        ) >= 1.0
    );
    for gauge in [
        "steward_fleet_sandboxes",
        "steward_fleet_idle_sandboxes",
        "steward_fleet_idle_cost_usd_per_day",
        "steward_fleet_last_sweep_timestamp_seconds",
    ] {
        assert!(after.iter().any(|s| s.name == gauge), "{gauge} is missing");
    }
    assert_declared_and_bounded(&after);
}
