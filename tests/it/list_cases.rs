//! A sweep's list decision over HTTP: `/sandbox sweep` on a simulated fleet posts one digest with
//! groups by owner and recommendation; clicks on it (signed like Slack, sent from the digest's own
//! message) approve a group, approve all, exclude sandboxes through the paged modal, or are
//! refused; the E2B simulator counts what was done.
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use sandbox_steward::approvals::list::{progress_of, view};
use sandbox_steward::cases::DecisionOption;
use sandbox_steward::cases::list::{GroupDecision, ListCase, Progress};
use sandbox_steward::sim::e2b::{SimOptions, SimServer};
use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use sandbox_steward::store::Store;
use serde_json::{Value, json};

use crate::common::{
    E2B_KEY, TestApp, TestAppOptions, app_env, free_port, hook, spawn_app_on, visible_json_text,
};

const CHANNEL: &str = "C0HYGIENE";
const KILLER: &str = "U0KILLER";
const PAUSER: &str = "U0PAUSER";

fn policy(extra: &str) -> String {
    format!(
        "[hygiene]\nchannel = \"{CHANNEL}\"\nlist_from = 0\nlist_progress_every = \"300ms\"\n\
         list_item_lease = \"2s\"\n{extra}\n\
         [approvals.approvers]\nkill = {{ users = [\"{KILLER}\"] }}\n\
         snapshot_then_kill = {{ users = [\"{KILLER}\"] }}\npause = {{ anyone = true }}\n\
         leave = {{ anyone = true }}\n"
    )
}

/// Waits up to `secs` for `check` (a condition, never a fixed sleep).
async fn within<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let what = format!("{what} (within {secs} s)");
    crate::common::poll_until(Duration::from_secs(secs), &what, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await
}

/// The simulators: a random fleet of `fleet` sandboxes at `latency_ms` per API call.
async fn simulators(fleet: usize, latency_ms: u64) -> (Arc<SlackSim>, Arc<SimServer>) {
    let slack = SlackSim::start(SlackSimOptions::default()).await.unwrap();
    let e2b = SimServer::start(SimOptions {
        sandboxes: fleet,
        latency_ms,
        api_key: Some(E2B_KEY.into()),
        ..SimOptions::default()
    })
    .await
    .unwrap();
    (Arc::new(slack), Arc::new(e2b))
}

fn idle_running(owner: &str) -> Value {
    let now = Utc::now();
    json!({"templateID": "python", "state": "running",
        "startedAt": (now - chrono::Duration::hours(5)).to_rfc3339(),
        "endAt": (now + chrono::Duration::hours(10)).to_rfc3339(),
        "profile": "idle", "metadata": {"owner": owner}})
}

fn paused_for_days(owner: &str) -> Value {
    let now = Utc::now();
    json!({"templateID": "python", "state": "paused",
        "startedAt": (now - chrono::Duration::days(9)).to_rfc3339(),
        "endAt": (now - chrono::Duration::days(8)).to_rfc3339(),
        "profile": "idle", "metadata": {"owner": owner}})
}

/// Seeds `n` sandboxes described by `body` (the simulator's seeding hook is neither delayed nor
/// counted); returns their ids.
async fn seed(app: &TestApp, n: usize, body: &Value) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(
            app.seed_sandbox(body.clone()).await["sandboxID"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    ids
}

/// Runs `/sandbox sweep` and returns the list it posted.
async fn sweep(app: &TestApp) -> ListCase {
    let before = app.state.store.active_lists().await.unwrap();
    let name = hook();
    assert_eq!(app.post_command_to("sweep", &name).await.status(), 200);
    let started = std::time::Instant::now();
    let mut answer = None;
    within(180, "the sweep answers", || {
        let found = app.slack.hook_posts(&name).into_iter().next();
        let done = found.is_some();
        answer = found;
        async move { done }
    })
    .await;
    eprintln!("the sweep took {:?}", started.elapsed());
    let answer = answer.unwrap();
    assert!(
        crate::common::visible_text(&answer).contains("Sweep done"),
        "{answer:?}"
    );
    let now = app.state.store.active_lists().await.unwrap();
    let id = now
        .into_iter()
        .find(|id| !before.contains(id))
        .expect("the sweep posted a list");
    app.state.store.get_list(&id).await.unwrap()
}

fn group_of(list: &ListCase, owner: &str, option: DecisionOption) -> usize {
    list.groups
        .iter()
        .position(|g| g.owner.as_deref() == Some(owner) && g.option == option)
        .unwrap_or_else(|| {
            panic!(
                "no {owner} · {option} group in {:#?}",
                list.groups.iter().map(|g| g.label()).collect::<Vec<_>>()
            )
        })
}

/// A signed click on one of the list's buttons, from the message that shows it.
async fn click(
    app: &TestApp,
    list: &ListCase,
    action_id: &str,
    group: Option<usize>,
    user: &str,
) -> String {
    click_at(app, &app.address, list, action_id, group, user).await
}

/// [`click`] sent to the replica at `address` (which shares `app`'s Redis and simulators).
pub(crate) async fn click_at(
    app: &TestApp,
    address: &str,
    list: &ListCase,
    action_id: &str,
    group: Option<usize>,
    user: &str,
) -> String {
    let list = app.state.store.get_list(&list.id).await.unwrap();
    let message = &list.messages[group.map_or(0, view::message_of)];
    let value = match group {
        Some(g) => format!("{}:{g}", list.id),
        None => list.id.to_string(),
    };
    let reply = hook();
    let payload = json!({
        "type": "block_actions",
        "user": {"id": user},
        "trigger_id": format!("trigger-{}", hook()),
        "response_url": app.slack.response_url(&reply),
        "container": {"type": "message", "channel_id": message.channel.as_str(), "message_ts": message.ts},
        "channel": {"id": message.channel.as_str()},
        "actions": [{"action_id": action_id, "block_id": "b", "value": value, "action_ts": hook()}],
    });
    let body = crate::common::interaction_form(&payload);
    let ts = crate::common::unix_now();
    let resp = app
        .http
        .post(format!("{address}/slack/interactions"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", ts.to_string())
        .header("x-slack-signature", app.sign(ts, body.as_bytes()))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    reply
}

/// Whether an approved group's work has all ended.
async fn settled(store: &Store, list: &ListCase, g: usize) -> bool {
    let p = group_progress(store, list, g).await;
    p.total > 0 && p.finished()
}

async fn group_progress(store: &Store, list: &ListCase, g: usize) -> Progress {
    let list = store.get_list(&list.id).await.unwrap();
    progress_of(store, &list).await.unwrap()[g].unwrap_or_default()
}

/// The latest text Slack shows for the list message holding group `g`.
fn shown(app: &TestApp, list: &ListCase, g: usize) -> String {
    let message = &list.messages[view::message_of(g)];
    app.slack
        .messages()
        .iter()
        .rev()
        .find(|m| {
            m.ts.as_deref() == Some(message.ts.as_str())
                && matches!(m.method.as_str(), "chat.update" | "chat.postMessage")
        })
        .map(crate::common::visible_text)
        .unwrap_or_default()
}

fn mutations(calls: &std::collections::HashMap<String, u64>) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = calls
        .iter()
        .filter(|(op, n)| {
            **n > 0
                && matches!(
                    op.as_str(),
                    "pause"
                        | "kill"
                        | "snapshot"
                        | "create"
                        | "resume"
                        | "connect"
                        | "timeout"
                        | "refresh"
                        | "delete-template"
                        | "delete-snapshot"
                        | "metadata"
                )
        })
        .map(|(op, n)| (op.clone(), *n))
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn approving_a_group_of_1000_pauses_on_a_5000_fleet_runs_exactly_1000_pauses() {
    let (slack, e2b) = simulators(4000, 20).await;
    let app = spawn_app_on(
        slack,
        e2b,
        TestAppOptions {
            policy: Some(policy("")),
            ..TestAppOptions::default()
        },
    )
    .await;
    seed(&app, 1000, &idle_running("loadtest")).await;
    let list = sweep(&app).await;
    let g = group_of(&list, "loadtest", DecisionOption::Pause);
    assert_eq!(list.groups[g].items.len(), 1000);
    let digest_text = shown(&app, &list, 0);
    assert!(
        digest_text.contains("Approve all recommendations"),
        "{digest_text}"
    );
    assert!(
        shown(&app, &list, g).contains("`loadtest` · *Pause* · 1,000 sandboxes"),
        "{}",
        shown(&app, &list, g)
    );

    app.e2b.hooks().reset_calls().await.unwrap();
    click(&app, &list, "sweep_list_approve", Some(g), PAUSER).await;
    within(180, "the group's 1,000 pauses finish", || async {
        settled(&app.state.store, &list, g).await
    })
    .await;
    let p = group_progress(&app.state.store, &list, g).await;
    assert_eq!(
        (p.total, p.done, p.skipped, p.failed),
        (1000, 1000, 0, 0),
        "{p:?}"
    );
    let calls = app.e2b_calls().await;
    assert_eq!(
        mutations(&calls),
        [("pause".to_owned(), 1000)],
        "1,000 pauses and no other action: {calls:?}"
    );
    assert_eq!(calls.get("paused").copied(), Some(1000), "{calls:?}");
    // No other group was touched: their sandboxes' cases still wait.
    for (i, other) in list.groups.iter().enumerate().filter(|(i, _)| *i != g) {
        assert_eq!(other.decision, GroupDecision::Open, "group {i}");
    }
    within(30, "the digest ends at 1,000 done", || async {
        let list = app.state.store.get_list(&list.id).await.unwrap();
        shown(&app, &list, g).contains("Finished pausing 1,000: 1,000 done")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_dying_mid_list_is_replaced_and_no_sandbox_is_acted_on_twice() {
    let (slack, e2b) = simulators(4000, 20).await;
    let replica_b = spawn_app_on(
        slack.clone(),
        e2b.clone(),
        TestAppOptions {
            policy: Some(policy("")),
            // B starts without its loops: the list must be A's until A dies.
            worker: false,
            ..TestAppOptions::default()
        },
    )
    .await;
    seed(&replica_b, 1000, &idle_running("loadtest")).await;
    let list = sweep(&replica_b).await;
    let g = group_of(&list, "loadtest", DecisionOption::Pause);

    // Replica A: a `steward serve` process on the same Redis prefix, killed with SIGKILL.
    let dir = tempfile::tempdir().unwrap();
    let opts = TestAppOptions {
        policy: Some(policy("")),
        ..TestAppOptions::default()
    };
    let port = free_port();
    let mut env = app_env(
        &slack,
        &e2b,
        &replica_b.redis_url,
        &replica_b.redis_prefix,
        &opts,
        dir.path(),
    );
    env.insert("STEWARD_LISTEN".into(), format!("127.0.0.1:{port}"));
    let mut replica_a = std::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .arg("serve")
        .envs(&env)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let a_address = format!("http://127.0.0.1:{port}");
    within(30, "replica A answers", || async {
        replica_b
            .http
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;

    e2b.hooks().reset_calls().await.unwrap();
    click_at(
        &replica_b,
        &a_address,
        &list,
        "sweep_list_approve",
        Some(g),
        PAUSER,
    )
    .await;
    within(120, "replica A pauses some of the list", || async {
        e2b.hooks().calls_of("pause").await.unwrap() >= 250
    })
    .await;
    replica_a.kill().unwrap();
    replica_a.wait().unwrap();
    let paused_by_a = e2b.hooks().calls_of("pause").await.unwrap();
    assert!(paused_by_a < 1000, "A was stopped mid-list ({paused_by_a})");

    // Replica B's loops take the list over once A's leases run out.
    let b = replica_b
        .spawn_peer(TestAppOptions {
            policy: Some(policy("")),
            ..TestAppOptions::default()
        })
        .await;
    within(180, "replica B finishes the list", || async {
        settled(&b.state.store, &list, g).await
    })
    .await;
    let p = group_progress(&b.state.store, &list, g).await;
    assert_eq!(p.done + p.skipped, 1000, "{p:?}");
    assert_eq!(p.failed, 0, "{p:?}");
    // Pause requests A had in flight when it died were never carried out (their connection
    // closed before E2B handled them), and B sent those again: the simulator counts the pauses
    // it actually made, one per sandbox, and nothing else was done.
    let calls = b.e2b_calls().await;
    assert_eq!(
        calls.get("paused").copied(),
        Some(1000),
        "each sandbox paused exactly once across both replicas: {calls:?}"
    );
    let requests = calls.get("pause").copied().unwrap_or(0);
    assert!(
        requests <= 1000 + 8,
        "at most the 8 requests in flight at the crash were sent again: {calls:?}"
    );
    assert!(
        mutations(&calls).iter().all(|(op, _)| op == "pause"),
        "{calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excluded_sandboxes_are_left_alone_and_the_next_sweep_remembers_them() {
    let (slack, e2b) = simulators(0, 0).await;
    let app = spawn_app_on(
        slack,
        e2b,
        TestAppOptions {
            policy: Some(policy("")),
            ..TestAppOptions::default()
        },
    )
    .await;
    let ids = seed(&app, 85, &idle_running("bob")).await;
    let list = sweep(&app).await;
    let g = group_of(&list, "bob", DecisionOption::Pause);

    // Exclude…: page 1 of 2 lists 80 checkboxes (ten per block) and the paste box.
    let before = app.modals_opened().len();
    click(&app, &list, "sweep_list_exclude", Some(g), PAUSER).await;
    let modal = app.opened_modal(before).await;
    let boxes: usize = modal["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["element"]["type"] == "checkboxes")
        .map(|b| b["element"]["options"].as_array().unwrap().len())
        .sum();
    assert_eq!(boxes, 80, "{modal}");
    assert!(visible_json_text(&modal).contains("Page 1 of 2"), "{modal}");
    let first_page: Vec<String> = modal["blocks"][1]["element"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["value"].as_str().unwrap().to_owned())
        .collect();
    let until = (Utc::now() + chrono::Duration::days(30))
        .format("%Y-%m-%d")
        .to_string();
    let submit = |values: Value, private_metadata: Value| {
        let payload = json!({
            "type": "view_submission",
            "user": {"id": PAUSER},
            "view": {"id": format!("V{}", hook()), "callback_id": "sweep_list_exclude",
                     "private_metadata": private_metadata, "state": {"values": values}},
        });
        let app = &app;
        async move {
            let resp = app.post_interaction(&payload).await;
            assert_eq!(resp.status(), 200);
            let body = resp.text().await.unwrap();
            if body.is_empty() {
                Value::Null
            } else {
                serde_json::from_str::<Value>(&body).unwrap()
            }
        }
    };
    // Two ticked on page 1, one pasted (from anywhere in the group), with an until-date.
    let pasted = ids
        .iter()
        .find(|id| !first_page.contains(id))
        .unwrap()
        .clone();
    let answer = submit(
        json!({
            "pick_0": {"pick": {"type": "checkboxes", "selected_options": [
                {"value": first_page[0]}, {"value": first_page[1]}]}},
            "paste": {"paste_ids": {"type": "plain_text_input", "value": format!("{pasted}\n")}},
            "until": {"until_date": {"type": "datepicker", "selected_date": until}},
        }),
        modal["private_metadata"].clone(),
    )
    .await;
    assert_eq!(answer["response_action"], "update", "{answer}");
    assert!(
        visible_json_text(&answer["view"]).contains("Page 2 of 2"),
        "{answer}"
    );
    // A stranger pasted is refused with the reason next to the box, and nothing changes.
    let refused = submit(
        json!({"paste": {"paste_ids": {"type": "plain_text_input", "value": "nosuchsandbox"}}}),
        answer["view"]["private_metadata"].clone(),
    )
    .await;
    assert_eq!(refused["response_action"], "errors", "{refused}");
    let excluded = [first_page[0].clone(), first_page[1].clone(), pasted.clone()];
    let stored = app.state.store.get_list(&list.id).await.unwrap();
    assert_eq!(stored.groups[g].excluded.len(), 3);

    click(&app, &list, "sweep_list_approve", Some(g), PAUSER).await;
    crate::common::eventually("the 82 included sandboxes are paused", || async {
        settled(&app.state.store, &list, g).await
    })
    .await;
    let p = group_progress(&app.state.store, &list, g).await;
    assert_eq!((p.total, p.done), (82, 82), "{p:?}");
    assert_eq!(
        mutations(&app.e2b_calls().await),
        [("pause".to_owned(), 82)]
    );
    let e2b = app.state.e2b.as_ref().unwrap();
    for id in &excluded {
        let detail = e2b
            .get_sandbox(&sandbox_steward::ids::SandboxId::parse(id.as_str()).unwrap())
            .await
            .unwrap();
        assert_eq!(detail.state.as_str(), "running", "{id} was excluded");
    }

    // The next sweep: the excluded three are exempt (left by a decision), not raised again.
    let dry = app.state.sweep.clone().unwrap();
    let report = sandbox_steward::hygiene::sweep_once(
        &dry,
        Utc::now(),
        sandbox_steward::hygiene::SweepMode::DryRun,
    )
    .await
    .unwrap();
    assert_eq!(report.counts.exempt.left, 3, "{:?}", report.counts);
    assert!(report.groups.iter().all(|g| {
        g.sandboxes
            .iter()
            .all(|s| !excluded.contains(&s.to_string()))
    }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_group_needs_a_kill_approver_and_its_snapshots_can_be_restored_from_the_thread() {
    let (slack, e2b) = simulators(0, 0).await;
    let app = spawn_app_on(
        slack,
        e2b,
        TestAppOptions {
            // The guard stays out of the way here (its own test is below). U0001, who starts
            // the sweep, may kill too: only the two-person rule stops them.
            policy: Some(policy("kill_share_guard = 1.0").replace(
                &format!("[\"{KILLER}\"]"),
                &format!("[\"{KILLER}\", \"U0001\"]"),
            )),
            ..TestAppOptions::default()
        },
    )
    .await;
    let ids = seed(&app, 4, &paused_for_days("carol")).await;
    let list = sweep(&app).await;
    let g = group_of(&list, "carol", DecisionOption::SnapshotThenKill);
    let text = shown(&app, &list, g);
    assert!(
        text.contains("Approve group") && text.contains("Exclude…"),
        "{text}"
    );

    // Someone who may pause but not kill: refused, told why, nothing happens.
    let reply = click(&app, &list, "sweep_list_approve", Some(g), PAUSER).await;
    let answer = app.wait_for_hook(&reply).await;
    assert!(
        crate::common::visible_text(&answer).contains("not"),
        "{answer:?}"
    );
    assert_eq!(
        app.state.store.get_list(&list.id).await.unwrap().groups[g].decision,
        GroupDecision::Open
    );
    // The person who started the sweep may not approve its kills either (two-person rule), and
    // is told so in the words of a sweep, not of a case they never asked for.
    let reply = click(&app, &list, "sweep_list_approve", Some(g), "U0001").await;
    let answer = crate::common::visible_text(&app.wait_for_hook(&reply).await);
    assert!(
        answer.contains("you started this sweep") && !answer.contains("asked for this case"),
        "{answer}"
    );
    assert!(mutations(&app.e2b_calls().await).is_empty());

    click(&app, &list, "sweep_list_approve", Some(g), KILLER).await;
    crate::common::eventually("the group is snapshotted, then killed", || async {
        settled(&app.state.store, &list, g).await
    })
    .await;
    let p = group_progress(&app.state.store, &list, g).await;
    assert_eq!(p.done, 4, "{p:?}");
    let calls = app.e2b_calls().await;
    assert_eq!(
        mutations(&calls),
        [("kill".to_owned(), 4), ("snapshot".to_owned(), 4)],
        "{calls:?}"
    );
    // Each killed sandbox's Restore is in the digest's thread; one click brings one back.
    let digest_ts = list.messages[0].ts.clone();
    crate::common::eventually("four restore cards in the thread", || async {
        app.slack
            .messages()
            .iter()
            .filter(|m| m.thread_ts.as_deref() == Some(digest_ts.as_str()))
            .filter(|m| {
                m.blocks
                    .as_ref()
                    .is_some_and(|b| b.to_string().contains("case_restore"))
            })
            .count()
            == 4
    })
    .await;
    let case = app
        .state
        .store
        .case_for_subject(&sandbox_steward::cases::Subject::Sandbox(
            sandbox_steward::ids::SandboxId::parse(ids[0].as_str()).unwrap(),
        ))
        .await
        .unwrap();
    let case = match case {
        Some(case) => case,
        None => {
            let item = &list.groups[g]
                .items
                .iter()
                .find(|i| i.sandbox.as_str() == ids[0])
                .unwrap()
                .case;
            app.state.store.get_case(item).await.unwrap()
        }
    };
    assert!(case.restore.is_some(), "{case:?}");
    let reply = hook();
    assert_eq!(
        app.click_case(&case.id, "case_restore", PAUSER, &reply, &hook())
            .await
            .status(),
        200
    );
    crate::common::eventually("a sandbox is created from the snapshot", || async {
        app.e2b_calls().await.get("create").copied().unwrap_or(0) == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_holds_an_oversized_kill_group_until_a_kill_approver_approves_it_explicitly() {
    let (slack, e2b) = simulators(0, 0).await;
    let app = spawn_app_on(
        slack,
        e2b,
        TestAppOptions {
            policy: Some(policy("kill_share_guard = 0.1")),
            ..TestAppOptions::default()
        },
    )
    .await;
    seed(&app, 5, &paused_for_days("dave")).await;
    seed(&app, 5, &idle_running("dave")).await;
    let list = sweep(&app).await;
    let kills = group_of(&list, "dave", DecisionOption::SnapshotThenKill);
    let pauses = group_of(&list, "dave", DecisionOption::Pause);
    assert!(list.groups[kills].held_by_guard);
    let digest = shown(&app, &list, 0);
    assert!(digest.contains("Blast-radius guard"), "{digest}");
    assert!(shown(&app, &list, kills).contains("Approve despite the guard"));

    // Approve all, even by a kill approver, leaves the held group alone.
    click(&app, &list, "sweep_list_approve_all", None, KILLER).await;
    crate::common::eventually("the pauses run", || async {
        group_progress(&app.state.store, &list, pauses).await.done == 5
    })
    .await;
    let stored = app.state.store.get_list(&list.id).await.unwrap();
    assert_eq!(stored.groups[kills].decision, GroupDecision::Open);
    assert_eq!(mutations(&app.e2b_calls().await), [("pause".to_owned(), 5)]);

    // Its own button, by someone allowed to kill, runs it.
    click(&app, &list, "sweep_list_approve", Some(kills), KILLER).await;
    crate::common::eventually("the held group runs once approved explicitly", || async {
        group_progress(&app.state.store, &list, kills).await.done == 5
    })
    .await;
    assert!(matches!(
        app.state.store.get_list(&list.id).await.unwrap().groups[kills].decision,
        GroupDecision::Approved {
            over_guard: true,
            ..
        }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_expires_like_a_case_and_a_late_click_does_nothing() {
    let (slack, e2b) = simulators(0, 0).await;
    let app = spawn_app_on(
        slack,
        e2b,
        TestAppOptions {
            policy: Some(policy("decide_within = \"2s\"")),
            ..TestAppOptions::default()
        },
    )
    .await;
    seed(&app, 3, &idle_running("erin")).await;
    let list = sweep(&app).await;
    let g = group_of(&list, "erin", DecisionOption::Pause);
    crate::common::eventually("the digest says the list expired", || async {
        shown(&app, &list, 0).contains("This list expired")
    })
    .await;
    let reply = click(&app, &list, "sweep_list_approve", Some(g), PAUSER).await;
    let answer = app.wait_for_hook(&reply).await;
    assert!(
        crate::common::visible_text(&answer).contains("expired"),
        "{answer:?}"
    );
    assert!(mutations(&app.e2b_calls().await).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_busy_again_is_skipped_and_a_failed_one_is_retried_from_the_digest() {
    let (slack, e2b) = simulators(0, 0).await;
    let app = spawn_app_on(
        slack,
        e2b,
        TestAppOptions {
            policy: Some(policy("")),
            ..TestAppOptions::default()
        },
    )
    .await;
    let ids = seed(&app, 6, &idle_running("frank")).await;
    let list = sweep(&app).await;
    let g = group_of(&list, "frank", DecisionOption::Pause);
    let hooks = app.e2b.hooks();
    // Someone starts using one again after the sweep; E2B is failing pauses.
    hooks
        .change(&ids[0], json!({"profile": "busy"}))
        .await
        .unwrap();
    // Every pause fails until the faults are cleared (each item gives up after three tries).
    hooks.fault(Some("pause"), 503, 1000, 0).await.unwrap();

    click(&app, &list, "sweep_list_approve", Some(g), PAUSER).await;
    crate::common::eventually("the group settles", || async {
        settled(&app.state.store, &list, g).await
    })
    .await;
    let p = group_progress(&app.state.store, &list, g).await;
    assert_eq!((p.done, p.skipped, p.failed), (0, 1, 5), "{p:?}");
    crate::common::eventually(
        "the digest shows the skip, the failure and Retry failed",
        || async {
            let text = shown(&app, &list, g);
            text.contains("Finished pausing 6: 0 done, 1 skipped (active again), 5 failed")
                && text.contains("Retry failed")
        },
    )
    .await;

    hooks.clear_faults().await.unwrap();
    click(&app, &list, "sweep_list_retry", Some(g), PAUSER).await;
    crate::common::eventually("the failed ones are paused on retry", || async {
        let p = group_progress(&app.state.store, &list, g).await;
        p.done == 5 && p.failed == 0
    })
    .await;
    let calls = app.e2b_calls().await;
    assert_eq!(calls.get("paused").copied(), Some(5), "{calls:?}");
    let busy = app
        .state
        .e2b
        .as_ref()
        .unwrap()
        .get_sandbox(&sandbox_steward::ids::SandboxId::parse(ids[0].as_str()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        busy.state.as_str(),
        "running",
        "the busy one was left alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_button_sent_from_another_message_does_nothing_and_a_later_approval_is_told_who() {
    let (slack, e2b) = simulators(0, 0).await;
    let app = spawn_app_on(
        slack,
        e2b,
        TestAppOptions {
            policy: Some(policy("")),
            ..TestAppOptions::default()
        },
    )
    .await;
    seed(&app, 2, &idle_running("grace")).await;
    let list = sweep(&app).await;
    let g = group_of(&list, "grace", DecisionOption::Pause);

    // The button's value names the list, but the message it was sent from is not the list's.
    let reply = hook();
    let payload = json!({
        "type": "block_actions",
        "user": {"id": PAUSER},
        "trigger_id": format!("trigger-{}", hook()),
        "response_url": app.slack.response_url(&reply),
        "container": {"type": "message", "channel_id": CHANNEL, "message_ts": "1.000001"},
        "channel": {"id": CHANNEL},
        "actions": [{"action_id": "sweep_list_approve", "block_id": "b",
                     "value": format!("{}:{g}", list.id), "action_ts": hook()}],
    });
    assert_eq!(app.post_interaction(&payload).await.status(), 200);
    let answer = app.wait_for_hook(&reply).await;
    assert!(
        crate::common::visible_text(&answer).contains("does not belong to this list"),
        "{answer:?}"
    );
    assert_eq!(
        app.state.store.get_list(&list.id).await.unwrap().groups[g].decision,
        GroupDecision::Open
    );

    // A second person approving the same group is told who already did; nothing runs twice.
    click(&app, &list, "sweep_list_approve", Some(g), PAUSER).await;
    crate::common::eventually("the first approval is recorded", || async {
        matches!(
            app.state.store.get_list(&list.id).await.unwrap().groups[g].decision,
            GroupDecision::Approved { .. }
        )
    })
    .await;
    let second = click(&app, &list, "sweep_list_approve", Some(g), "U0SECOND").await;
    let answer = app.wait_for_hook(&second).await;
    assert!(
        crate::common::visible_text(&answer).contains("Already approved by"),
        "{answer:?}"
    );
    crate::common::eventually("the two pauses run once", || async {
        settled(&app.state.store, &list, g).await
    })
    .await;
    assert_eq!(app.e2b_calls().await.get("paused").copied(), Some(2));
}

/// `[hygiene] max_exclude_for` (30 days by default) bounds how long Exclude… keeps a sandbox out
/// of sweeps: a later date is refused next to the date picker and nothing is excluded; a date
/// within it, or none (which lasts the cap), excludes, and the digest and `/sandbox history`
/// say who excluded which sandbox until when.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusion_past_the_cap_is_refused_and_one_within_it_says_who_and_until_when() {
    let (slack, e2b) = simulators(0, 0).await;
    let app = spawn_app_on(
        slack,
        e2b,
        TestAppOptions {
            policy: Some(policy("")),
            ..TestAppOptions::default()
        },
    )
    .await;
    seed(&app, 3, &idle_running("bob")).await;
    let list = sweep(&app).await;
    let g = group_of(&list, "bob", DecisionOption::Pause);
    let before = app.modals_opened().len();
    click(&app, &list, "sweep_list_exclude", Some(g), PAUSER).await;
    let modal = app.opened_modal(before).await;
    assert!(
        visible_json_text(&modal).contains("at most 30 d ahead"),
        "{modal}"
    );
    let submit = |sandbox: String, until: Option<String>| {
        let payload = json!({
            "type": "view_submission",
            "user": {"id": PAUSER},
            "view": {"id": format!("V{}", hook()), "callback_id": "sweep_list_exclude",
                     "private_metadata": modal["private_metadata"].clone(),
                     "state": {"values": {
                         "paste": {"paste_ids": {"type": "plain_text_input", "value": sandbox}},
                         "until": {"until_date": {"type": "datepicker", "selected_date": until}},
                     }}},
        });
        let app = &app;
        async move {
            let resp = app.post_interaction(&payload).await;
            assert_eq!(resp.status(), 200);
            let body = resp.text().await.unwrap();
            if body.is_empty() {
                Value::Null
            } else {
                serde_json::from_str::<Value>(&body).unwrap()
            }
        }
    };
    let items: Vec<String> = list.groups[g]
        .items
        .iter()
        .map(|i| i.sandbox.to_string())
        .collect();
    let item_case = |n: usize| list.groups[g].items[n].case.clone();
    let latest = (Utc::now() + chrono::Duration::days(30))
        .format("%Y-%m-%d")
        .to_string();

    // "Don't raise again" until the end of time: refused, with the latest date allowed.
    let refused = submit(items[0].clone(), Some("9999-12-31".into())).await;
    assert_eq!(refused["response_action"], "errors", "{refused}");
    let said = refused["errors"]["until"].as_str().unwrap_or_default();
    assert!(
        said.contains(&format!("The latest date allowed is {latest}")),
        "{refused}"
    );
    assert!(said.contains("[hygiene] max_exclude_for"), "{said}");
    let stored = app.state.store.get_list(&list.id).await.unwrap();
    assert!(stored.groups[g].excluded.is_empty(), "nothing was excluded");
    let case = app.state.store.get_case(&item_case(0)).await.unwrap();
    assert_eq!(case.state, sandbox_steward::cases::CaseState::Pending);
    let subject = sandbox_steward::cases::Subject::Sandbox(
        sandbox_steward::ids::SandboxId::parse(items[0].as_str()).unwrap(),
    );
    let marks = app
        .state
        .store
        .left_marks(std::slice::from_ref(&subject))
        .await
        .unwrap();
    assert_eq!(marks, [None], "no Leave mark");

    // Ten days: excluded. No date: excluded for the cap, not for ever.
    let ten_days = (Utc::now() + chrono::Duration::days(10))
        .format("%Y-%m-%d")
        .to_string();
    assert_eq!(
        submit(items[0].clone(), Some(ten_days.clone())).await,
        Value::Null
    );
    assert_eq!(submit(items[1].clone(), None).await, Value::Null);
    let stored = app.state.store.get_list(&list.id).await.unwrap();
    let excluded = &stored.groups[g].excluded;
    assert_eq!(excluded.len(), 2, "{excluded:?}");
    assert_eq!(excluded[0].by.as_str(), PAUSER);
    assert_eq!(
        excluded[0].until.map(|u| u.format("%Y-%m-%d").to_string()),
        Some(ten_days.clone())
    );
    let capped = excluded[1].until.expect("no date lasts the cap");
    assert!(
        capped <= Utc::now() + chrono::Duration::days(30)
            && capped > Utc::now() + chrono::Duration::days(29),
        "{capped}"
    );

    // The digest says who excluded which until when.
    let expected = format!("`{}` by <@{PAUSER}> until {ten_days} 00:00 UTC", items[0]);
    within(20, "the digest names the exclusion", || {
        let holds = shown(&app, &list, g).contains(&expected);
        async move { holds }
    })
    .await;
    let digest = shown(&app, &list, g);
    assert!(digest.contains("Excluded: "), "{digest}");
    assert!(
        digest.contains(&format!("`{}` by <@{PAUSER}> until", items[1])),
        "{digest}"
    );

    // So does the sandbox's history: the Leave mark on top, the decision in the timeline.
    let history = hook();
    app.post_command_to(&format!("history {}", items[0]), &history)
        .await;
    let history = crate::common::visible_text(&app.wait_for_hook(&history).await);
    assert!(
        history.contains(&format!(
            "Left out of sweeps until {ten_days} 00:00 UTC: <@{PAUSER}> excluded it from a sweep's list"
        )),
        "{history}"
    );
    assert!(
        history.contains(&format!(
            "decide:leave: `ok (excluded from the list until {ten_days} 00:00 UTC)`"
        )),
        "{history}"
    );
}

/// A pasted id that is not in the group is refused with a sentence under the paste box, and
/// nothing is excluded; the same form (the same modal page) corrected and submitted again is
/// then acted on, not dropped as a repeat of the refused one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pasted_stranger_is_refused_and_the_corrected_form_then_excludes() {
    let (slack, e2b) = simulators(0, 0).await;
    let app = spawn_app_on(
        slack,
        e2b,
        TestAppOptions {
            policy: Some(policy("")),
            ..TestAppOptions::default()
        },
    )
    .await;
    seed(&app, 3, &idle_running("bob")).await;
    let list = sweep(&app).await;
    let g = group_of(&list, "bob", DecisionOption::Pause);
    let before = app.modals_opened().len();
    click(&app, &list, "sweep_list_exclude", Some(g), PAUSER).await;
    let modal = app.opened_modal(before).await;
    let view_id = format!("V{}", hook());
    let submit = |pasted: String| {
        let payload = json!({
            "type": "view_submission",
            "user": {"id": PAUSER},
            "view": {"id": view_id.clone(), "callback_id": "sweep_list_exclude",
                     "private_metadata": modal["private_metadata"].clone(),
                     "state": {"values": {
                         "paste": {"paste_ids": {"type": "plain_text_input", "value": pasted}},
                     }}},
        });
        let app = &app;
        async move {
            let resp = app.post_interaction(&payload).await;
            assert_eq!(resp.status(), 200);
            let body = resp.text().await.unwrap();
            if body.is_empty() {
                Value::Null
            } else {
                serde_json::from_str::<Value>(&body).unwrap()
            }
        }
    };
    let member = list.groups[g].items[0].sandbox.to_string();

    let refused = submit(format!("{member}, sbx_stranger")).await;
    assert_eq!(refused["response_action"], "errors", "{refused}");
    let said = refused["errors"]["paste"].as_str().unwrap_or_default();
    assert!(
        said.contains("sbx_stranger is not in this group") && said.contains("nothing was excluded"),
        "{refused}"
    );
    let stored = app.state.store.get_list(&list.id).await.unwrap();
    assert!(stored.groups[g].excluded.is_empty(), "nothing was excluded");

    // The same page, corrected: excluded, and the form closes.
    let answer = submit(member.clone()).await;
    assert_eq!(answer, Value::Null, "the last page closes: {answer}");
    let stored = app.state.store.get_list(&list.id).await.unwrap();
    let excluded: Vec<String> = stored.groups[g]
        .excluded
        .iter()
        .map(|e| e.sandbox.to_string())
        .collect();
    assert_eq!(excluded, std::slice::from_ref(&member));

    // Slack delivering that same form again excludes nothing more (one audit line, one Leave).
    let again = submit(member.clone()).await;
    assert_eq!(again, Value::Null, "{again}");
    let stored = app.state.store.get_list(&list.id).await.unwrap();
    assert_eq!(stored.groups[g].excluded.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_group_is_re_checked_in_batches_and_still_leaves_one_busy_again_and_records_one_gone()
 {
    let (slack, e2b) = simulators(0, 0).await;
    let app = spawn_app_on(
        slack,
        e2b,
        TestAppOptions {
            policy: Some(policy("")),
            ..TestAppOptions::default()
        },
    )
    .await;
    // More than one listing page (E2B lists at most 100 a page), beside another owner's
    // sandboxes that the batched reads must not mix up with them.
    let n = 230;
    let ids = seed(&app, n, &idle_running("grace")).await;
    seed(&app, 40, &idle_running("heidi")).await;
    let list = sweep(&app).await;
    let g = group_of(&list, "grace", DecisionOption::Pause);
    assert_eq!(list.groups[g].items.len(), n);
    // Just before the group's turn: one is used again, another is killed outside Steward.
    let hooks = app.e2b.hooks();
    hooks
        .change(&ids[n / 2], json!({"profile": "busy"}))
        .await
        .unwrap();
    let e2b_client = app.state.e2b.as_ref().unwrap();
    let gone = sandbox_steward::ids::SandboxId::parse(ids[7].as_str()).unwrap();
    e2b_client.kill_sandbox(&gone).await.unwrap();
    hooks.reset_calls().await.unwrap();

    click(&app, &list, "sweep_list_approve", Some(g), PAUSER).await;
    within(120, "the group settles", || async {
        settled(&app.state.store, &list, g).await
    })
    .await;
    let p = group_progress(&app.state.store, &list, g).await;
    assert_eq!(
        (p.total, p.done, p.skipped, p.failed),
        (n, n - 1, 1, 0),
        "{p:?}"
    );
    let calls = app.e2b_calls().await;
    assert_eq!(
        mutations(&calls),
        [("pause".to_owned(), (n - 2) as u64)],
        "{calls:?}"
    );
    // Read in batches: a few listing pages and metrics batches, not a detail read and a
    // metrics read per sandbox (the gone one is looked up on its own).
    let one_by_one =
        calls.get("get").copied().unwrap_or(0) + calls.get("metrics").copied().unwrap_or(0);
    let batched =
        calls.get("list").copied().unwrap_or(0) + calls.get("metrics-many").copied().unwrap_or(0);
    assert!(one_by_one <= 4, "read one by one: {calls:?}");
    // A page read covers up to 100 of them (a reading older than 5 s is read again, so a slow
    // machine reads more pages, but never one per sandbox).
    assert!(
        batched >= 2 && batched < n as u64,
        "read in batches of up to 100: {calls:?}"
    );
    let busy = e2b_client
        .get_sandbox(&sandbox_steward::ids::SandboxId::parse(ids[n / 2].as_str()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        busy.state.as_str(),
        "running",
        "the busy one was left alone"
    );
    let gone_case = &list.groups[g]
        .items
        .iter()
        .find(|i| i.sandbox == gone)
        .unwrap()
        .case;
    let case = app.state.store.get_case(gone_case).await.unwrap();
    assert!(
        matches!(
            &case.state,
            sandbox_steward::cases::CaseState::Done { steps, .. }
                if steps.iter().any(|s| s.outcome == sandbox_steward::cases::StepOutcome::AlreadyGone)
        ),
        "{:?}",
        case.state
    );
}
