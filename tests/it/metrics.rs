//! `GET /metrics` over HTTP: a separate `STEWARD_METRICS_LISTEN` listener takes `/metrics` off
//! the main one, a sweep records its figures, and the dashboard, the alert rules and docs/operations.md name
//! only declared series. That traffic moves each series by exactly what it did, with no label
//! carrying an id, and that a scrape answers while Redis is down, is `tests/metrics_exact.rs`:
//! the recorder is process-wide, and only there does a test have a process to itself.
//!
//! Here tests run side by side, so they assert that a series grew by at least what the test
//! did, never an exact value.

use std::collections::HashMap;

use crate::common::scrape::{assert_declared_and_bounded, scrape, scrape_at, total};
use crate::common::{TestAppOptions, spawn_app_with};
use sandbox_steward::config::Settings;
use sandbox_steward::metrics::SERIES;
use sandbox_steward::startup::Application;

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
fn the_dashboard_the_alert_rules_and_the_operations_doc_name_only_series_that_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
    for file in [
        "deploy/grafana-dashboard.json",
        "deploy/alerts.yml",
        "docs/operations.md",
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
    // The table's rows: lines of docs/operations.md's "## Metrics and alerts" section that start
    // a table cell with a series name.
    let doc = read("docs/operations.md");
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Metrics and alerts\n"))
        .expect("docs/operations.md has a Metrics and alerts section");
    let rows: String = section
        .lines()
        .filter(|line| line.starts_with("| `steward_"))
        .map(|line| line.split('|').nth(1).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ");
    let documented = series_named_in(&rows);
    for s in SERIES {
        assert!(
            documented.iter().any(|n| n == s.name),
            "docs/operations.md's Metrics table misses {}",
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
