//! Reading `GET /metrics`: Prometheus' text format parsed into samples, sums by labels, and the
//! check that every sample is a declared series with bounded label values.
use std::collections::{BTreeMap, HashMap};

use sandbox_steward::metrics::{Kind, SERIES, SLACK_OUTCOMES, SLACK_ROUTES};

use super::TestApp;

/// One sample line of a scrape.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses Prometheus' text format (the subset the exporter writes: no escapes in our values).
pub fn parse(text: &str) -> Vec<Sample> {
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
pub fn total(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
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

pub async fn scrape_at(http: &reqwest::Client, url: &str) -> (String, Vec<Sample>) {
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

pub async fn scrape(app: &TestApp) -> (String, Vec<Sample>) {
    scrape_at(&app.http, &app.url("/metrics")).await
}

/// The values each label may take. A label not listed here fails the test: a new label needs a
/// bounded set before it ships.
fn bounded(label: &str, value: &str) -> bool {
    let status_code =
        value.len() == 3 && value.parse::<u16>().is_ok_and(|c| (100..=599).contains(&c));
    match label {
        "route" => SLACK_ROUTES.contains(&value),
        "outcome" => {
            SLACK_OUTCOMES.contains(&value)
                || [
                    // Socket Mode envelopes
                    "handled",
                    "duplicate",
                    "ignored",
                    "shed",
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
                    "handed_back",
                    "done",
                    "transient",
                    "permanent",
                    "evidence_changed",
                    // sweeps
                    "failed",
                ]
                .contains(&value)
        }
        "action" => sandbox_steward::sim::e2b::OPS.contains(&value),
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
            "shorten_timeout",
        ]
        .contains(&value),
        "call" => [
            "process_start",
            "process_connect",
            "send_signal",
            "upload",
            "download",
            "other",
        ]
        .contains(&value),
        "mode" => ["live", "dry_run"].contains(&value),
        "lane" => sandbox_steward::store::Lane::ALL
            .iter()
            .any(|lane| lane.as_str() == value),
        "state" => ["running", "paused"].contains(&value),
        "version" => value == env!("CARGO_PKG_VERSION"),
        "le" => value == "+Inf" || value.parse::<f64>().is_ok(),
        _ => false,
    }
}

/// Every `steward_` sample belongs to a series the metrics module declares, with exactly its
/// label names, and every label value is from its bounded set.
pub fn assert_declared_and_bounded(samples: &[Sample]) {
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
