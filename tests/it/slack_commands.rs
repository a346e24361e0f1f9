//! Every `/sandbox` subcommand end to end: a signed slash command to Steward, E2B played by the
//! simulator, and what the user sees — the immediate acknowledgement and the reply posted to
//! the fake Slack's response_url.

use crate::common::{TestApp, TestAppOptions, spawn_app, spawn_app_with, visible_text};
use serde_json::{Value, json};

/// A running sandbox `sbxrun1` (owner=alice) and a paused `sbxpause1`, besides the seeded fleet.
async fn app_with_known_sandboxes(fleet: usize) -> TestApp {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: fleet,
        ..Default::default()
    })
    .await;
    // Started two hours ago, so it already has logs and metric samples.
    let started = (chrono::Utc::now() - chrono::Duration::hours(2)).to_rfc3339();
    app.seed_sandbox(json!({"sandboxID": "sbxrun1", "templateID": "base", "state": "running", "startedAt": started,
                            "metadata": {"owner": "alice", "note": "<b>&"}, "cpuCount": 2, "memoryMB": 1024}))
        .await;
    app.seed_sandbox(json!({"sandboxID": "sbxpause1", "templateID": "base", "state": "paused"}))
        .await;
    app
}

async fn sandbox_state(app: &TestApp, id: &str) -> String {
    let e2b = app.state.e2b.as_ref().unwrap();
    let s = e2b
        .get_sandbox(&sandbox_steward::ids::SandboxId::parse(id).unwrap())
        .await
        .unwrap();
    s.state.to_string()
}

/// The first column of the table rows in a list reply.
fn table_ids(post: &sandbox_steward::sim::slack::Recorded) -> Vec<String> {
    let blocks = post.blocks.clone().unwrap_or_default();
    blocks
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"]["text"].as_str())
        .filter(|t| t.starts_with("```"))
        .flat_map(|t| {
            t.trim_matches('`')
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|id| id != "id")
        .collect()
}

fn assert_no_raw_output(shown: &str) {
    for raw in ["{\"", "E2bError", "NotFound {", "Some(", "\\n"] {
        assert!(!shown.contains(raw), "raw output {raw:?} in {shown}");
    }
}

#[tokio::test]
async fn list_answers_working_on_it_then_posts_a_table_with_resources() {
    let app = app_with_known_sandboxes(3).await;
    let post = app.run_deferred("list").await;
    assert_eq!(post.response_type.as_deref(), Some("ephemeral"));
    assert!(!post.authorized, "response_url posts carry no token");
    let shown = visible_text(&post);
    for expected in [
        "id",
        "template",
        "state",
        "age",
        "idle for",
        "cpu",
        "memory",
        "disk",
        "sbxrun1",
        "sbxpause1",
        "base",
    ] {
        assert!(shown.contains(expected), "missing {expected} in {shown}");
    }
    // CPU comes from the batched metrics call for the page.
    assert!(shown.contains('%'), "{shown}");
    let calls = app.e2b_calls().await;
    assert_eq!(calls.get("list"), Some(&1));
    assert_eq!(calls.get("metrics-many"), Some(&1));
    assert_no_raw_output(&shown);
}

#[tokio::test]
async fn every_deferred_result_replaces_its_acknowledgement_instead_of_adding_a_second_message() {
    let app = app_with_known_sandboxes(0).await;
    // A command answered through `execute`, a case command and a sweep: three ways of deferring.
    let listed = app.run_deferred("list").await;
    assert_eq!(listed.replace_original, Some(true));
    assert_eq!(listed.response_type.as_deref(), Some("ephemeral"));
    for text in ["history sbxrun1", "sweep --dry-run"] {
        let hook = format!("h{}", uuid::Uuid::new_v4().simple());
        assert_eq!(app.post_command_to(text, &hook).await.status(), 200);
        let post = app.wait_for_hook(&hook).await;
        assert_eq!(post.replace_original, Some(true), "{text}");
        assert_eq!(post.response_type.as_deref(), Some("ephemeral"), "{text}");
        assert_eq!(app.slack.hook_posts(&hook).len(), 1, "{text}");
    }
}

#[tokio::test]
async fn list_filters_by_state_and_metadata() {
    let app = app_with_known_sandboxes(3).await;
    let paused = visible_text(&app.run_deferred("list paused").await);
    assert!(
        paused.contains("sbxpause1") && !paused.contains("sbxrun1"),
        "{paused}"
    );
    let alice = visible_text(&app.run_deferred("list running owner=alice").await);
    assert!(
        alice.contains("sbxrun1") && !alice.contains("sbxpause1"),
        "{alice}"
    );
    assert!(alice.contains("owner=alice"), "{alice}");
}

#[tokio::test]
async fn list_offers_a_next_page_button_that_replaces_the_message_with_page_two() {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 30,
        ..Default::default()
    })
    .await;
    let first = app.run_deferred("list").await;
    let blocks = first.blocks.clone().unwrap();
    let actions = blocks
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "actions")
        .expect("a Next page button");
    let button = &actions["elements"][0];
    assert_eq!(button["action_id"], "list_next_page");
    assert!(visible_text(&first).contains("page 1"));

    let payload = json!({
        "type": "block_actions",
        "user": {"id": "U0001"},
        "response_url": app.slack.response_url("next"),
        "container": {"type": "message", "message_ts": "1.2", "channel_id": "C0001", "is_ephemeral": true},
        "actions": [{"action_id": "list_next_page", "block_id": actions["block_id"], "value": button["value"]}],
    });
    let resp = app.post_interaction(&payload).await;
    assert_eq!(resp.status(), 200);
    let second = app.wait_for_hook("next").await;
    assert_eq!(second.replace_original, Some(true));
    let shown = visible_text(&second);
    assert!(shown.contains("page 2"), "{shown}");
    // Page two shows different sandboxes than page one.
    let (ids1, ids2) = (table_ids(&first), table_ids(&second));
    assert_eq!(ids1.len(), 20);
    assert!(!ids2.is_empty());
    assert!(
        ids2.iter().all(|id| !ids1.contains(id)),
        "{ids1:?} {ids2:?}"
    );
}

#[tokio::test]
async fn get_shows_state_template_resources_timestamps_metadata_and_lifecycle() {
    let app = app_with_known_sandboxes(1).await;
    let shown = visible_text(&app.run_deferred("get sbxrun1").await);
    for expected in [
        "Sandbox sbxrun1",
        "running",
        "(`base`)",
        "2 vCPU",
        "1 GiB",
        "Started",
        "Ends",
        "Lifecycle",
        "`owner` = `alice`",
    ] {
        assert!(shown.contains(expected), "missing {expected} in {shown}");
    }
    // Metadata is user-controlled text: escaped for mrkdwn.
    assert!(shown.contains("&lt;b&gt;&amp;"), "{shown}");
}

#[tokio::test]
async fn get_of_an_unknown_sandbox_is_a_plain_sentence() {
    let app = spawn_app().await;
    let shown = visible_text(&app.run_deferred("get nosuch1").await);
    assert!(
        shown.contains("Sandbox `nosuch1` was not found."),
        "{shown}"
    );
    assert_no_raw_output(&shown);
}

#[tokio::test]
async fn logs_come_newest_first_in_a_code_block_within_the_limit() {
    let app = app_with_known_sandboxes(1).await;
    let post = app.run_deferred("logs sbxrun1 limit=5").await;
    let shown = visible_text(&post);
    assert!(
        shown.contains("Logs of `sbxrun1`") && shown.contains("newest first"),
        "{shown}"
    );
    let block_text: Vec<String> = post
        .blocks
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"]["text"].as_str().map(str::to_owned))
        .filter(|t| t.starts_with("```"))
        .collect();
    let lines: Vec<&str> = block_text
        .iter()
        .flat_map(|t| t.trim_matches('`').lines())
        .collect();
    assert!(!lines.is_empty() && lines.len() <= 5, "{lines:?}");
    // Lines start with "MM-DD HH:MM:SS"; newest first means non-increasing.
    let stamps: Vec<&str> = lines.iter().map(|l| &l[..14]).collect();
    let mut sorted = stamps.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(stamps, sorted);
}

#[tokio::test]
async fn many_log_lines_are_cut_to_fit_slack() {
    let app = app_with_known_sandboxes(1).await;
    let post = app.run_deferred("logs sbxrun1 limit=1000").await;
    let blocks = post.blocks.unwrap();
    let blocks = blocks.as_array().unwrap();
    assert!(blocks.len() <= 50);
    for b in blocks {
        if let Some(t) = b["text"]["text"].as_str() {
            assert!(
                t.chars().count() <= 3000,
                "section of {} chars",
                t.chars().count()
            );
        }
    }
}

#[tokio::test]
async fn logs_filters_are_passed_to_e2b() {
    let app = app_with_known_sandboxes(1).await;
    let shown = visible_text(
        &app.run_deferred("logs sbxrun1 level=error search=zzzznotthere")
            .await,
    );
    assert!(shown.contains("level ≥ error"), "{shown}");
    assert!(shown.contains("No log lines match."), "{shown}");
}

#[tokio::test]
async fn metrics_show_sparklines_and_min_avg_max_over_the_window() {
    let app = app_with_known_sandboxes(1).await;
    let shown = visible_text(&app.run_deferred("metrics sbxrun1 since=1h").await);
    for expected in [
        "Metrics of `sbxrun1`",
        "last 1 h (",
        "CPU",
        "Memory",
        "Disk",
        "min",
        "avg",
        "max",
    ] {
        assert!(shown.contains(expected), "missing {expected} in {shown}");
    }
    assert!(
        shown.chars().any(|c| ('▁'..='█').contains(&c)),
        "no sparkline in {shown}"
    );
}

#[tokio::test]
async fn team_shows_concurrency_now_and_at_peak_and_the_start_rate() {
    let app = app_with_known_sandboxes(4).await;
    let shown = visible_text(&app.run_deferred("team since=6h").await);
    for expected in [
        "Team activity",
        "last 6 h",
        "Running now",
        "Peak concurrency",
        "Sandboxes started",
        "on average",
    ] {
        assert!(shown.contains(expected), "missing {expected} in {shown}");
    }
    let calls = app.e2b_calls().await;
    assert_eq!(calls.get("team-metrics"), Some(&1));
    assert_eq!(calls.get("team-metrics-max"), Some(&2));
}

/// The text of the field of a fields section that starts with `label`.
fn field(post: &sandbox_steward::sim::slack::Recorded, label: &str) -> String {
    let blocks = post.blocks.clone().unwrap_or_default();
    blocks
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["fields"].as_array())
        .flatten()
        .filter_map(|f| f["text"].as_str())
        .find(|t| t.starts_with(label))
        .unwrap_or_else(|| panic!("no {label} field in {blocks}"))
        .to_owned()
}

/// The number that starts a field's value (after its `*Label*\n`).
fn leading_number(field: &str) -> f64 {
    let value = field.split_once('\n').unwrap().1;
    let number: String = value
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    number
        .parse()
        .unwrap_or_else(|_| panic!("no number in {field}"))
}

#[tokio::test]
async fn team_numbers_agree_across_windows_and_each_peak_rate_names_its_step() {
    let app = app_with_known_sandboxes(20).await;
    let hour = app.run_deferred("team since=1h").await;
    let day = app.run_deferred("team since=24h").await;
    // Totals can only grow with the window; the peak rates differ because E2B averages them
    // over a step that grows with the window, and each says which step it is.
    let started = |post| leading_number(&field(post, "*Sandboxes started*"));
    assert!(
        started(&day) >= started(&hour),
        "{} < {}",
        started(&day),
        started(&hour)
    );
    assert!(started(&day) > 0.0, "{}", visible_text(&day));
    let hour_peak = field(&hour, "*Peak start rate*");
    let day_peak = field(&day, "*Peak start rate*");
    for peak in [&hour_peak, &day_peak] {
        assert!(
            peak.contains(" in the busiest ")
                && (peak.contains(" a minute ") || peak.contains(" an hour ")),
            "{peak}"
        );
        assert!(peak.ends_with("(E2B's step for this window)"), "{peak}");
    }
    assert_ne!(
        hour_peak.split("busiest ").nth(1),
        day_peak.split("busiest ").nth(1),
        "a day is sampled more coarsely than an hour"
    );
    assert!(
        leading_number(&field(&day, "*Peak concurrency*"))
            >= leading_number(&field(&day, "*Running now*"))
    );
}

#[tokio::test]
async fn get_of_a_paused_sandbox_says_when_it_was_paused_instead_of_an_end_in_the_past() {
    let app = app_with_known_sandboxes(0).await;
    let paused_at = chrono::Utc::now() - chrono::Duration::hours(2);
    app.seed_sandbox(
        json!({"sandboxID": "sbxpause2", "templateID": "base", "state": "paused",
                            "startedAt": (paused_at - chrono::Duration::hours(1)).to_rfc3339(),
                            "endAt": paused_at.to_rfc3339()}),
    )
    .await;
    let post = app.run_deferred("get sbxpause2").await;
    assert_eq!(
        field(&post, "*Paused*"),
        format!(
            "*Paused*\n{} UTC (2 h ago)",
            paused_at.format("%Y-%m-%d %H:%M")
        )
    );
    let shown = visible_text(&post);
    assert!(
        !shown.contains("*Ends*") && !shown.contains("*Ended*"),
        "{shown}"
    );
    // A running sandbox still shows when it ends.
    let running = app.run_deferred("get sbxrun1").await;
    assert!(
        field(&running, "*Ends*").contains("(in "),
        "{}",
        visible_text(&running)
    );
}

#[tokio::test]
async fn replies_write_units_as_people_do_and_one_size_unit_per_table() {
    let app = app_with_known_sandboxes(3).await;
    let listed = app.run_deferred("list").await;
    let table: String = listed
        .blocks
        .clone()
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"]["text"].as_str())
        .filter(|t| t.starts_with("```"))
        .collect();
    let header = table
        .trim_start_matches('`')
        .lines()
        .next()
        .unwrap()
        .to_owned();
    // The unit is named once, in the header, and no cell carries one of its own.
    assert!(
        header.contains("memory (GiB)") && header.contains("disk (GiB)"),
        "{header}"
    );
    for unit in [" MiB", " GiB", "KiB"] {
        assert!(
            !table.lines().skip(1).any(|l| l.contains(unit)),
            "{unit} in {table}"
        );
    }
    assert!(table.contains(" %"), "cpu as `12 %`: {table}");
    for post in [
        listed,
        app.run_deferred("get sbxrun1").await,
        app.run_deferred("metrics sbxrun1 since=1h").await,
        app.run_deferred("team since=1d").await,
        app.run_deferred("templates").await,
        app.run_deferred("template base").await,
    ] {
        let shown = visible_text(&post);
        for cramped in ["(s)", "1h ", "0m", "0s)", "1d "] {
            assert!(!shown.contains(cramped), "{cramped:?} in {shown}");
        }
        assert!(
            !shown.contains("1 builds") && !shown.contains("1 times"),
            "{shown}"
        );
    }
    let template = visible_text(&app.run_deferred("template base").await);
    assert!(
        template.contains(" build)") || template.contains(" builds)"),
        "{template}"
    );
}

#[tokio::test]
async fn pause_pauses_and_a_second_pause_is_reported_as_already_paused() {
    let app = app_with_known_sandboxes(1).await;
    let shown = visible_text(&app.run_deferred("pause sbxrun1").await);
    assert!(shown.contains("Paused `sbxrun1`."), "{shown}");
    assert_eq!(sandbox_state(&app, "sbxrun1").await, "paused");
    let again = visible_text(&app.run_deferred("pause sbxrun1").await);
    assert!(again.contains("`sbxrun1` is already paused."), "{again}");
    assert!(!again.contains(":warning:"), "{again}");
}

#[tokio::test]
async fn resume_brings_a_paused_sandbox_back_with_the_timeout_given() {
    let app = app_with_known_sandboxes(1).await;
    let shown = visible_text(&app.run_deferred("resume sbxpause1 timeout=10m").await);
    assert!(
        shown.contains("Resumed `sbxpause1`.") && shown.contains("run for 10 min unless"),
        "{shown}"
    );
    assert_eq!(sandbox_state(&app, "sbxpause1").await, "running");
}

#[tokio::test]
async fn timeout_and_refresh_report_the_new_end() {
    let app = app_with_known_sandboxes(1).await;
    let shown = visible_text(&app.run_deferred("timeout sbxrun1 30m").await);
    assert!(
        shown.contains("`sbxrun1` will now end in 30 min (at "),
        "{shown}"
    );
    let shown = visible_text(&app.run_deferred("refresh sbxrun1 20m").await);
    assert!(
        shown.contains("Refreshed `sbxrun1`") && shown.contains("at least 20 min more"),
        "{shown}"
    );
    let calls = app.e2b_calls().await;
    assert_eq!(calls.get("timeout"), Some(&1));
    assert_eq!(calls.get("refresh"), Some(&1));
}

#[tokio::test]
async fn snapshot_then_snapshots_lists_it() {
    let app = app_with_known_sandboxes(1).await;
    let shown = visible_text(&app.run_deferred("snapshot sbxrun1 before-upgrade").await);
    assert!(shown.contains("of `sbxrun1` is ready"), "{shown}");
    let listed = visible_text(&app.run_deferred("snapshots sbxrun1").await);
    assert!(
        listed.contains("Snapshots") && listed.contains("of `sbxrun1`"),
        "{listed}"
    );
    assert!(listed.contains("before-upgrade"), "{listed}");
    let all = visible_text(&app.run_deferred("snapshots").await);
    assert!(all.contains("before-upgrade"), "{all}");
    // A snapshot taken without a name says so rather than leaving its cell blank.
    app.run_deferred("snapshot sbxrun1").await;
    let listed = app.run_deferred("snapshots sbxrun1").await;
    assert_eq!(listed.text.as_deref(), Some("2 snapshots of sbxrun1"));
    assert!(
        visible_text(&listed).contains("(no name)"),
        "{}",
        visible_text(&listed)
    );
}

#[tokio::test]
async fn templates_and_template_describe_what_exists() {
    let app = app_with_known_sandboxes(1).await;
    let shown = visible_text(&app.run_deferred("templates").await);
    assert!(
        shown.contains("Templates") && shown.contains("base"),
        "{shown}"
    );
    for column in ["aliases", "build", "spawns"] {
        assert!(shown.contains(column), "{shown}");
    }
    let one = visible_text(&app.run_deferred("template base").await);
    for expected in [
        "Template ",
        "*Aliases*\n`base`",
        "Resources",
        "Build",
        "Created",
        "Spawned",
    ] {
        assert!(one.contains(expected), "missing {expected} in {one}");
    }
    let missing = visible_text(&app.run_deferred("template nosuchtemplate").await);
    assert!(
        missing.contains("Template `nosuchtemplate` was not found."),
        "{missing}"
    );
}

#[tokio::test]
async fn an_e2b_rate_limit_becomes_a_sentence_with_the_wait() {
    let app = app_with_known_sandboxes(1).await;
    app.e2b_fault(json!({"op": "get", "status": 429, "count": 5, "retry_after_secs": 4}))
        .await;
    let shown = visible_text(&app.run_deferred("get sbxrun1").await);
    assert!(
        shown.contains("E2B is rate-limiting us; try again in 4 s."),
        "{shown}"
    );
    assert_no_raw_output(&shown);
}

#[tokio::test]
async fn an_e2b_outage_becomes_a_sentence() {
    let app = app_with_known_sandboxes(1).await;
    app.e2b_fault(json!({"op": "pause", "status": 503, "count": 5}))
        .await;
    let shown = visible_text(&app.run_deferred("pause sbxrun1").await);
    assert!(
        shown.contains("E2B had a problem on its side (HTTP 503)"),
        "{shown}"
    );
    assert_no_raw_output(&shown);
}

#[tokio::test]
async fn without_e2b_configured_commands_say_so() {
    let app = spawn_app_with(TestAppOptions {
        with_e2b: false,
        ..Default::default()
    })
    .await;
    let shown = visible_text(&app.run_deferred("list").await);
    assert!(
        shown.contains("not connected to E2B") && shown.contains("E2B_API_KEY"),
        "{shown}"
    );
}

#[tokio::test]
async fn the_reply_reaches_slack_even_when_the_response_url_is_rate_limited_once() {
    let app = app_with_known_sandboxes(1).await;
    app.slack.add_fault(sandbox_steward::sim::slack::Fault {
        method: "hooks".into(),
        status: 429,
        retry_after_secs: Some(1),
        count: 1,
        error: None,
    });
    let hook = "limited";
    let resp = app.post_command_to("get sbxrun1", hook).await;
    assert_eq!(resp.status(), 200);
    // The first post was refused; wait for the retry.
    crate::common::wait_until("the retry reaches Slack", || async {
        (app.slack.hook_posts(hook).len() >= 2).then_some(())
    })
    .await;
    let posts = app.slack.hook_posts(hook);
    assert_eq!(posts[0].body, posts[1].body);
    let v: Value = posts[1].body.clone();
    assert!(v["text"].as_str().unwrap().contains("sbxrun1"));
}

#[tokio::test]
async fn a_reply_still_in_flight_when_steward_stops_is_delivered_before_it_exits() {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 3,
        e2b_retry: sandbox_steward::e2b::RetryPolicy {
            max_attempts: 2,
            base_delay: std::time::Duration::from_millis(10),
            max_delay: std::time::Duration::from_millis(50),
            max_retry_after: std::time::Duration::from_secs(3),
        },
        ..TestAppOptions::default()
    })
    .await;
    // E2B makes Steward wait a second before it can list, so the reply is still being worked
    // on when the stop arrives.
    app.e2b_fault(json!({"op": "list", "status": 429, "count": 1, "retry_after_secs": 1}))
        .await;
    let hook = "stopping";
    let resp = app.post_command_to("list", hook).await;
    assert_eq!(resp.status(), 200);
    let slack = app.slack.clone();

    app.shutdown().await;

    // No waiting here: Steward returned only after delivering what it owed.
    let posts = slack.hook_posts(hook);
    assert_eq!(posts.len(), 1, "{posts:?}");
    let shown = visible_text(&posts[0]);
    assert!(
        shown.contains("running") || shown.contains("paused"),
        "{shown}"
    );
}

fn limited(limits: &str) -> TestAppOptions {
    TestAppOptions {
        sandboxes: 3,
        policy: Some(format!("[limits]\n{limits}\n")),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_past_the_rate_limit_gets_a_sentence_and_e2b_hears_nothing_more() {
    let app = spawn_app_with(limited("commands_per_minute = 2")).await;
    app.run_deferred("list").await;
    app.run_deferred("list").await;

    let resp = app.post_command("list").await;

    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    let text = crate::common::visible_json_text(&answer);
    assert!(text.contains("in the last minute"), "{text}");
    assert_eq!(app.e2b_calls().await.get("list").copied(), Some(2));
    // Commands that do not call E2B are not limited.
    let help: Value = app.post_command("help").await.json().await.unwrap();
    assert!(!crate::common::visible_json_text(&help).contains("in the last minute"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_sweep_while_another_runs_is_told_a_sweep_is_already_running() {
    let app = spawn_app_with(limited("commands_per_minute = 100")).await;
    let running = app.state.limits.try_sweep().expect("no sweep runs yet");

    let resp = app.post_command("sweep --dry-run").await;

    let answer: Value = resp.json().await.unwrap();
    let text = crate::common::visible_json_text(&answer);
    assert!(text.contains("A sweep is already running"), "{text}");
    assert!(!app.e2b_calls().await.contains_key("list"));
    drop(running);
    let resp = app.post_command("sweep --dry-run").await;
    let answer: Value = resp.json().await.unwrap();
    assert!(
        crate::common::visible_json_text(&answer).contains("dry run"),
        "{answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_follow_up_queue_answers_that_steward_is_busy() {
    let app = spawn_app_with(limited("follow_ups = 1")).await;
    let busy = app.state.limits.try_follow_up().expect("a free place");

    let resp = app.post_command("list").await;

    let answer: Value = resp.json().await.unwrap();
    let text = crate::common::visible_json_text(&answer);
    assert!(text.contains("Steward is busy"), "{text}");
    assert!(!app.e2b_calls().await.contains_key("list"));
    drop(busy);
    app.run_deferred("list").await;
}

/// `/sandbox list steward`: only the sandboxes Steward started for runs and push tests, each
/// with its run in a column of its own.
#[tokio::test]
async fn list_steward_shows_only_stewards_own_sandboxes_naming_their_run() {
    let app = app_with_known_sandboxes(3).await;
    app.seed_sandbox(
        json!({"sandboxID": "sbxrun7", "templateID": "base", "state": "running",
        "metadata": {"steward.run": "run_slack7", "steward.requester": "agent-b",
                     "steward.purpose": "run"}}),
    )
    .await;
    app.seed_sandbox(
        json!({"sandboxID": "sbxpush8", "templateID": "base", "state": "running",
        "metadata": {"steward.run": "run_slack8", "steward.requester": "github:acme/web",
                     "steward.purpose": "run"}}),
    )
    .await;
    let post = app.run_deferred("list steward").await;
    let mut ids = table_ids(&post);
    ids.sort();
    assert_eq!(ids, vec!["sbxpush8", "sbxrun7"]);
    let shown = visible_text(&post);
    assert!(shown.contains("Steward's runs and push tests"), "{shown}");
    assert!(shown.contains("run run_slack7 for agent-b"), "{shown}");
    assert!(
        shown.contains("push test of acme/web, run run_slack8"),
        "{shown}"
    );
    let refused: Value = app.post_command("list stewart").await.json().await.unwrap();
    assert!(
        refused["text"]
            .as_str()
            .unwrap_or_default()
            .contains("`steward` for Steward's own"),
        "{refused}"
    );
}
