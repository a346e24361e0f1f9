//! The hygiene sweep end to end over real sockets: the E2B simulator seeded with specific
//! sandboxes, real Redis under a unique key prefix per test, and the fake Slack recording what
//! Steward posts. Scheduling is driven through `scheduler_tick` with the real clock.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sandbox_steward::cases::{
    self, CaseDraft, CaseState, DecisionOption, Event, Evidence, Opener, Subject,
};
use sandbox_steward::config::E2bSettings;
use sandbox_steward::e2b::{E2bClient, E2bError, RetryPolicy};
use sandbox_steward::hygiene::policy::{Exemption, Recommendation, RunState};
use sandbox_steward::hygiene::report::{Capacity, IdleSandbox, SweepReport};
use sandbox_steward::hygiene::schedule::SWEEP_LEASE;
use sandbox_steward::hygiene::{
    HygieneConfig, LoopEvent, Scheduler, SweepContext, SweepError, SweepMode, Tick,
    run_scheduler_observed, scheduler_tick, sweep_once,
};
use sandbox_steward::ids::{SandboxId, SlackChannelId, SlackUserId};
use sandbox_steward::sim::e2b::{SimOptions, SimServer};
use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use sandbox_steward::slack::client::SlackClient;
use sandbox_steward::slack::render::Templates;
use sandbox_steward::store::{Store, Updated};
use serde_json::{Value, json};

use crate::common::{PrefixCleanup, redis_url};

const CHANNEL: &str = "C0HYGIENE";
const ALICE: &str = "U0ALICE01";

/// The simulator, the fake Slack, a Redis prefix and a sweep context over them.
struct World {
    sim: SimServer,
    slack: SlackSim,
    ctx: SweepContext,
    prefix: String,
    http: reqwest::Client,
    _cleanup: PrefixCleanup,
}

fn config() -> HygieneConfig {
    let mut config = HygieneConfig::default();
    config
        .owners
        .insert("alice".into(), SlackUserId::parse(ALICE).unwrap());
    config
}

async fn world(config: HygieneConfig) -> World {
    world_with(config, true).await
}

async fn world_with(config: HygieneConfig, with_team: bool) -> World {
    sandbox_steward::telemetry::init("error");
    let sim = SimServer::start(SimOptions {
        sandboxes: 0,
        ..SimOptions::default()
    })
    .await
    .expect("E2B simulator starts");
    let slack = SlackSim::start(SlackSimOptions::default())
        .await
        .expect("fake Slack starts");
    let prefix = format!("steward-hygiene-{}", uuid::Uuid::new_v4().simple());
    let store = Store::redis(&redis_url(), &prefix)
        .await
        .expect("these tests need Redis at REDIS_URL or 127.0.0.1:6379");
    let mut e2b_settings = E2bSettings::for_url(&sim.base_url(), "e2b_test_key");
    if with_team {
        e2b_settings.team_id = Some(sim.team_id().to_owned());
    }
    let e2b = E2bClient::new(&e2b_settings)
        .unwrap()
        .with_retry_policy(RetryPolicy::none());
    let slack_client = SlackClient::new(&sandbox_steward::config::SlackSettings {
        api_url: slack.api_url(),
        bot_token: Some("xoxb-test".to_owned().into()),
        signing_secret: None,
        templates_dir: None,
    })
    .unwrap();
    let ctx = SweepContext::new(
        e2b,
        store,
        slack_client,
        Arc::new(Templates::embedded()),
        Arc::new(config),
        Some(SlackChannelId::parse(CHANNEL).unwrap()),
    );
    World {
        sim,
        slack,
        ctx,
        _cleanup: PrefixCleanup {
            url: redis_url(),
            prefix: prefix.clone(),
        },
        prefix,
        http: reqwest::Client::new(),
    }
}

fn ago(d: chrono::Duration) -> String {
    (Utc::now() - d).to_rfc3339()
}

fn ahead(d: chrono::Duration) -> String {
    (Utc::now() + d).to_rfc3339()
}

fn hours(h: i64) -> chrono::Duration {
    chrono::Duration::hours(h)
}

fn days(d: i64) -> chrono::Duration {
    chrono::Duration::days(d)
}

/// Records a person's Leave decision on `id` the way Slack does: a case opened for it, decided
/// Leave (until `until`) at `decided_at`.
async fn leave(store: &Store, id: &SandboxId, until: DateTime<Utc>, decided_at: DateTime<Utc>) {
    let draft = CaseDraft {
        subject: Subject::Sandbox(id.clone()),
        evidence: Evidence::default(),
        recommendation: cases::Recommendation {
            option: DecisionOption::SnapshotThenKill,
            reason: "idle".into(),
        },
        options: None,
        opener: Opener::Person {
            user: SlackUserId::parse("UREQ").unwrap(),
        },
        reason: "cleanup".into(),
        decide_by: decided_at + hours(1),
    };
    let case = draft.into_case(decided_at - hours(1)).unwrap();
    let case = store.open_case(case).await.unwrap().case().clone();
    let decision = Event::Decide {
        option: DecisionOption::Leave,
        by: SlackUserId::parse("UAPPROVER").unwrap(),
        reason: None,
        until: Some(until),
    };
    let outcome = store
        .apply_event(&case.id, decision, decided_at)
        .await
        .unwrap();
    assert!(matches!(outcome, Updated::Applied(_)), "{outcome:?}");
}

impl World {
    /// Seeds one sandbox exactly as described and returns its id.
    async fn seed(&self, body: Value) -> SandboxId {
        let resp = self
            .http
            .post(format!("{}/_sim/sandboxes", self.sim.base_url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let v: Value = resp.json().await.unwrap();
        assert_eq!(status, 201, "seeding failed: {v}");
        SandboxId::parse(v["sandboxID"].as_str().unwrap()).unwrap()
    }

    /// Running, idle CPU and flat disk for five hours, expiring in ten.
    async fn idle_running(&self, owner: Option<&str>) -> SandboxId {
        let mut metadata = BTreeMap::new();
        if let Some(o) = owner {
            metadata.insert("owner", o);
        }
        self.seed(
            json!({"templateID": "python", "state": "running", "startedAt": ago(hours(5)),
            "endAt": ahead(hours(10)), "profile": "idle", "metadata": metadata}),
        )
        .await
    }

    async fn busy_running(&self) -> SandboxId {
        self.seed(
            json!({"templateID": "python", "state": "running", "startedAt": ago(hours(5)),
            "endAt": ahead(hours(10)), "profile": "busy"}),
        )
        .await
    }

    /// Paused `paused_days` ago with `disk_mb` of disk.
    async fn paused(&self, paused_days: i64, disk_mb: u32, owner: Option<&str>) -> SandboxId {
        let mut metadata = BTreeMap::new();
        if let Some(o) = owner {
            metadata.insert("owner", o);
        }
        self.seed(json!({"templateID": "python", "state": "paused",
            "startedAt": ago(days(paused_days) + hours(3)), "endAt": ago(days(paused_days)),
            "diskSizeMB": disk_mb, "profile": "idle", "metadata": metadata}))
            .await
    }

    async fn sweep(&self, mode: SweepMode) -> SweepReport {
        sweep_once(&self.ctx, Utc::now(), mode)
            .await
            .expect("the sweep runs")
    }

    fn scheduler(&self, holder: &str) -> Scheduler {
        Scheduler {
            sweep: self.ctx.clone(),
            holder: holder.to_owned(),
            lease_ttl: Duration::from_secs(30),
            retry_after_failure: Duration::from_secs(300),
        }
    }

    /// Top-level `chat.postMessage` calls: the digests.
    fn digests(&self) -> Vec<sandbox_steward::sim::slack::Recorded> {
        self.slack
            .messages()
            .into_iter()
            .filter(|m| m.method == "chat.postMessage" && m.thread_ts.is_none())
            .collect()
    }

    async fn open_case_of(&self, id: &SandboxId) -> Option<sandbox_steward::cases::Case> {
        self.ctx
            .store
            .case_for_subject(&Subject::Sandbox(id.clone()))
            .await
            .unwrap()
    }
}

fn idle<'a>(report: &'a SweepReport, id: &SandboxId) -> Option<&'a IdleSandbox> {
    report.idle.iter().find(|s| &s.id == id)
}

fn recommendation(report: &SweepReport, id: &SandboxId) -> Option<Recommendation> {
    idle(report, id).map(|s| s.recommendation)
}

fn exemption(report: &SweepReport, id: &SandboxId) -> Option<Exemption> {
    report
        .exempt
        .iter()
        .find(|s| &s.id == id)
        .map(|s| s.exemption.clone())
}

fn text_of(message: &sandbox_steward::sim::slack::Recorded) -> String {
    message
        .blocks
        .as_ref()
        .map(|b| b.to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sandboxes_are_raised_with_the_right_recommendations_and_evidence() {
    let mut config = config();
    // A template whose CPU threshold is high, so only its growing disk keeps it active.
    config.idle.templates.insert(
        "grower".into(),
        toml::from_str("cpu_threshold_pct = 60.0\ndisk_growth_bytes = 1048576\n").unwrap(),
    );
    let w = world(config).await;
    let idle_id = w.idle_running(Some("alice")).await;
    let busy = w.busy_running().await;
    let grower = w
        .seed(
            json!({"templateID": "grower", "state": "running", "startedAt": ago(hours(5)),
            "endAt": ahead(hours(10)), "diskSizeMB": 20480, "profile": "disk-growing"}),
        )
        .await;
    let ending = w
        .seed(
            json!({"templateID": "python", "state": "running", "startedAt": ago(hours(5)),
            "endAt": ahead(chrono::Duration::minutes(5)), "profile": "idle"}),
        )
        .await;
    let paused_long = w.paused(5, 4096, Some("bob")).await;
    let paused_ancient = w.paused(40, 100, None).await;
    let paused_recent = w.paused(1, 4096, None).await;

    let report = w.sweep(SweepMode::DryRun).await;

    assert_eq!(report.fleet.total, 7);
    assert_eq!((report.fleet.running, report.fleet.paused), (4, 3));
    assert_eq!(
        recommendation(&report, &idle_id),
        Some(Recommendation::Pause)
    );
    assert_eq!(
        recommendation(&report, &ending),
        Some(Recommendation::Leave)
    );
    assert_eq!(
        recommendation(&report, &paused_long),
        Some(Recommendation::SnapshotThenKill)
    );
    assert_eq!(
        recommendation(&report, &paused_ancient),
        Some(Recommendation::Kill)
    );
    for active in [&busy, &grower, &paused_recent] {
        assert!(
            idle(&report, active).is_none(),
            "{active} was raised: {report:#?}"
        );
    }
    assert_eq!(report.counts.active, 3);
    assert_eq!(report.counts.idle, 4);
    let rec = report.counts.by_recommendation;
    assert_eq!(
        (rec.pause, rec.snapshot_then_kill, rec.kill, rec.leave),
        (1, 1, 1, 1)
    );

    // The evidence a running recommendation rests on.
    let s = idle(&report, &idle_id).unwrap();
    let e = &s.evidence;
    let now = report.at;
    let start = e.window_start.unwrap();
    assert!(
        // The simulator serves samples on a grid, so the first can sit a step before the hour.
        start >= now - hours(1) - chrono::Duration::minutes(1)
            && start <= now - chrono::Duration::minutes(55),
        "{e:?}"
    );
    assert!(
        e.samples >= 300,
        "an hour of 10 s samples, got {}",
        e.samples
    );
    assert!(e.cpu_p95_pct.unwrap() < 1.0, "{e:?}");
    assert!(
        e.mem_used.unwrap() > 0 && e.mem_total.unwrap() == 1024 << 20,
        "{e:?}"
    );
    assert_eq!(e.disk_growth, Some(0));
    assert_eq!(e.idle_since, e.window_start);
    assert_eq!(s.owner.as_deref(), Some("alice"));
    assert_eq!(s.owner_slack.as_ref().map(|u| u.as_str()), Some(ALICE));
    assert_eq!(s.template, "python");
    assert_eq!(s.state, RunState::Running);
    assert!(e.cost_per_day_usd > 0.0);
    // ... and a paused one.
    let p = idle(&report, &paused_long).unwrap();
    let paused_since = p.evidence.paused_since.unwrap();
    assert!(
        (now - paused_since - days(5)).num_seconds().abs() < 60,
        "{p:?}"
    );
    assert_eq!(p.owner.as_deref(), Some("bob"));
    assert_eq!(p.owner_slack, None);
    assert!(p.reason.contains("Paused for 5 d"), "{}", p.reason);
    // Team capacity comes from the simulator's team metrics.
    assert!(
        matches!(report.capacity, Capacity::Available { concurrent_now, .. } if concurrent_now >= 4),
        "{:?}",
        report.capacity
    );
    // One list page per state (running and paused are listed apart; a one-page state from one
    // end only), one batch for the running page (the paused page has no running sandbox to ask
    // about), one window per running
    // candidate (idle, ending, and the grower, whose latest CPU is under its own threshold),
    // three team calls. Paused sandboxes and busy ones cost no window.
    assert_eq!(report.e2b_calls, 2 + 1 + 3 + 3, "{report:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_metadata_unexpired_leave_decisions_and_youth_are_exempt() {
    let mut config = config();
    config.idle.grace_period = Duration::from_secs(12 * 3600);
    let w = world(config).await;
    let kept = w
        .seed(
            json!({"templateID": "python", "state": "paused", "startedAt": ago(days(6)),
            "endAt": ago(days(5)), "metadata": {"steward.keep": "2099-12-31"}}),
        )
        .await;
    let keep_lapsed = w
        .seed(
            json!({"templateID": "python", "state": "paused", "startedAt": ago(days(6)),
            "endAt": ago(days(5)), "metadata": {"steward.keep": "2020-01-01"}}),
        )
        .await;
    let left = w.paused(5, 4096, None).await;
    let left_lapsed = w.paused(5, 4096, None).await;
    let left_forever = w.paused(5, 4096, None).await;
    let young = w.idle_running(None).await; // five hours old, grace is twelve
    // Both were left a day ago by a person's Leave decision, one until next week and one until
    // an hour ago.
    let store = &w.ctx.store;
    leave(store, &left, Utc::now() + days(7), Utc::now() - days(1)).await;
    leave(
        store,
        &left_lapsed,
        Utc::now() - hours(1),
        Utc::now() - days(1),
    )
    .await;
    // Left 31 days ago "until 9999", before `[hygiene] max_exclude_for` (30 days) existed.
    let forever = DateTime::parse_from_rfc3339("9999-12-31T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    leave(store, &left_forever, forever, Utc::now() - days(31)).await;

    let report = w.sweep(SweepMode::DryRun).await;

    assert!(
        matches!(exemption(&report, &kept), Some(Exemption::KeepUntil { until }) if until == "2099-12-31")
    );
    assert!(matches!(
        exemption(&report, &left),
        Some(Exemption::LeftUntil { until: Some(_) })
    ));
    assert_eq!(exemption(&report, &young), Some(Exemption::TooYoung));
    for exempt in [&kept, &left, &young] {
        assert!(idle(&report, exempt).is_none(), "{exempt} was raised");
    }
    assert_eq!(
        recommendation(&report, &keep_lapsed),
        Some(Recommendation::SnapshotThenKill),
        "an expired keep date no longer exempts"
    );
    assert_eq!(
        recommendation(&report, &left_lapsed),
        Some(Recommendation::SnapshotThenKill),
        "a Leave decision whose date passed no longer exempts"
    );
    assert_eq!(
        recommendation(&report, &left_forever),
        Some(Recommendation::SnapshotThenKill),
        "a Leave older than max_exclude_for no longer exempts, whatever its date"
    );
    let ex = report.counts.exempt;
    assert_eq!((ex.keep_metadata, ex.left, ex.too_young), (1, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_opens_nothing_and_posts_nothing() {
    let w = world(config()).await;
    let a = w.idle_running(Some("alice")).await;
    let b = w.paused(5, 4096, None).await;

    let report = w.sweep(SweepMode::DryRun).await;

    assert_eq!(report.counts.idle, 2, "{report:#?}");
    assert!(report.posted.is_none());
    assert!(w.slack.messages().is_empty(), "{:?}", w.slack.messages());
    for id in [&a, &b] {
        assert!(
            w.open_case_of(id).await.is_none(),
            "a dry run opened a case for {id}"
        );
    }
    let audit = w
        .ctx
        .store
        .audit_since(Utc::now() - hours(1))
        .await
        .unwrap();
    assert!(audit.is_empty(), "{audit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sweep_posts_one_digest_then_each_owners_cases_in_its_thread() {
    let w = world(config()).await;
    let alice_1 = w.idle_running(Some("alice")).await;
    let alice_2 = w.paused(5, 4096, Some("alice")).await;
    let bob = w.paused(6, 4096, Some("bob")).await;
    let nobody = w.idle_running(None).await;
    let ending = w
        .seed(
            json!({"templateID": "python", "state": "running", "startedAt": ago(hours(5)),
            "endAt": ahead(chrono::Duration::minutes(5)), "profile": "idle"}),
        )
        .await;
    for _ in 0..3 {
        w.busy_running().await;
    }

    let report = w.sweep(SweepMode::Live).await;

    let posted = report.posted.as_ref().expect("a live sweep posts");
    assert_eq!(posted.opened.len(), 5, "{posted:?}");
    let digests = w.digests();
    assert_eq!(digests.len(), 1, "exactly one digest: {digests:?}");
    let digest = &digests[0];
    assert_eq!(digest.channel.as_deref(), Some(CHANNEL));
    let ts = digest
        .text
        .as_ref()
        .map(|_| posted.digest_ts.clone())
        .unwrap();
    let body = text_of(digest);
    assert!(body.contains("6 running · 2 paused"), "{body}");
    assert!(
        body.contains("1 pause") || body.contains("2 pause"),
        "{body}"
    );
    // Everything else went into the digest's thread, owners' headings before their cases.
    let thread: Vec<_> = w
        .slack
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.postMessage" && m.thread_ts.as_deref() == Some(&ts))
        .collect();
    let texts: Vec<String> = thread.iter().map(text_of).collect();
    assert_eq!(
        thread.len(),
        3 + 5,
        "three headings and five cards: {texts:#?}"
    );
    let position = |needle: &str| {
        texts
            .iter()
            .position(|t| t.contains(needle))
            .unwrap_or_else(|| panic!("{needle} not in the thread: {texts:#?}"))
    };
    let alice_heading = position("Owner `alice`");
    assert!(
        texts[alice_heading].contains(&format!("<@{ALICE}>")),
        "{}",
        texts[alice_heading]
    );
    assert!(texts[alice_heading].contains("2 idle sandboxes"));
    assert!(
        alice_heading < position(alice_1.as_str()) && alice_heading < position(alice_2.as_str())
    );
    let bob_heading = position("Owner `bob`");
    assert!(
        !texts[bob_heading].contains("<@"),
        "bob has no Slack user: {}",
        texts[bob_heading]
    );
    assert!(bob_heading < position(bob.as_str()));
    assert!(position("No owner in metadata") < position(nobody.as_str()));
    // Each card says each fact once: the sweep's sentence carries only what its fields do not.
    let card_of = |id: &SandboxId| {
        thread
            .iter()
            .find(|m| m.text.as_deref().is_some_and(|t| t.contains(id.as_str())))
            .and_then(|m| m.blocks.clone())
            .unwrap_or_else(|| panic!("no card for {id}"))
    };
    let running_card = card_of(&alice_1);
    let asks = running_card[1]["text"]["text"].as_str().unwrap();
    assert!(
        asks.contains("CPU p95") && asks.contains("samples"),
        "{asks}"
    );
    for twice in ["alice", "python", "memory", "idle since", "Idle since"] {
        assert!(
            !asks.contains(twice),
            "{twice:?} is a field already: {asks}"
        );
    }
    let fields = running_card[2]["fields"].to_string();
    assert!(
        fields.contains("*Owner*") && fields.contains("*Idle since*"),
        "{fields}"
    );
    let paused_card = card_of(&alice_2);
    assert!(
        paused_card[1]["text"]["text"]
            .as_str()
            .unwrap()
            .ends_with("asks: is this paused sandbox still needed? It holds 4 GiB of disk."),
        "{paused_card:#}"
    );
    assert!(
        !paused_card.to_string().contains("$0.00"),
        "{paused_card:#}"
    );
    // Each raised sandbox now has a pending case from the sweep with its evidence.
    for (id, option) in [
        (&alice_1, DecisionOption::Pause),
        (&alice_2, DecisionOption::SnapshotThenKill),
        (&bob, DecisionOption::SnapshotThenKill),
        (&nobody, DecisionOption::Pause),
        (&ending, DecisionOption::Leave),
    ] {
        let case = w.open_case_of(id).await.expect("a case was opened");
        assert_eq!(case.state, CaseState::Pending);
        assert_eq!(case.recommendation.option, option);
        assert_eq!(case.opener, sandbox_steward::cases::Opener::Sweep);
        let card = case.card.as_ref().expect("the card was recorded");
        assert_eq!(card.channel.as_str(), CHANNEL);
        let says = if id == &alice_2 || id == &bob {
            // A paused sandbox costs nothing by default: its card says what it holds.
            "It holds 4 GiB of disk."
        } else {
            "costs about $"
        };
        assert!(case.reason.contains(says), "{}", case.reason);
        assert!(!case.reason.contains("$0.00"), "{}", case.reason);
    }
    // A sweep case is due in `decide_within` (2 days), but never after the sandbox's own end:
    // a paused sandbox has no end, a running one ends in 10 h.
    let paused_case = w.open_case_of(&bob).await.unwrap();
    assert!(
        (paused_case.decide_by - (report.at + days(2)))
            .num_seconds()
            .abs()
            < 5,
        "{}",
        paused_case.decide_by
    );
    let pause_case = w.open_case_of(&alice_1).await.unwrap();
    assert!(
        (pause_case.decide_by - (report.at + hours(10)))
            .num_seconds()
            .abs()
            < 60,
        "{}",
        pause_case.decide_by
    );
    let ending_case = w.open_case_of(&ending).await.unwrap();
    assert!(
        ending_case.decide_by <= report.at + chrono::Duration::minutes(6),
        "a Leave case for a sandbox ending in 5 minutes is due by its end, not in a day: {}",
        ending_case.decide_by
    );
    assert!(ending_case.decide_by > report.at);
    let card = w.open_case_of(&alice_1).await.unwrap();
    assert!(card.reason.contains("CPU p95"), "{}", card.reason);
    assert!(card.evidence.idle_since.is_some() && card.evidence.metrics.is_some());
    assert!(!card.options.is_empty());
    let paused_case = w.open_case_of(&alice_2).await.unwrap();
    assert!(!paused_case.options.contains(&DecisionOption::Pause));
    let leave_case = w.open_case_of(&ending).await.unwrap();
    assert!(
        leave_case.recommendation.reason.contains("timeout ends it"),
        "a Leave case says why leaving it is fine: {}",
        leave_case.recommendation.reason
    );
    // The digest was updated with the outcome.
    let updated = w.slack.message(CHANNEL, &ts).expect("the digest exists");
    assert!(
        text_of(&updated).contains("Opened 5 cases in this thread"),
        "{}",
        text_of(&updated)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sweep_raises_nothing_again_and_moves_no_deadline() {
    let w = world(config()).await;
    let a = w.idle_running(Some("alice")).await;
    let b = w.paused(5, 4096, None).await;
    // Enough busy ones that one kill recommendation stays under the blast-radius guard.
    for _ in 0..4 {
        w.busy_running().await;
    }
    let first = w.sweep(SweepMode::Live).await;
    assert_eq!(first.posted.as_ref().unwrap().opened.len(), 2);
    let before = [
        w.open_case_of(&a).await.unwrap(),
        w.open_case_of(&b).await.unwrap(),
    ];
    let cards_before = w
        .slack
        .messages()
        .iter()
        .filter(|m| m.thread_ts.is_some())
        .count();

    let second = w.sweep(SweepMode::Live).await;

    let posted = second.posted.as_ref().unwrap();
    assert!(posted.opened.is_empty(), "{posted:?}");
    assert_eq!(second.counts.already_open, 2);
    assert_eq!(second.counts.idle, 0);
    let after = [
        w.open_case_of(&a).await.unwrap(),
        w.open_case_of(&b).await.unwrap(),
    ];
    for (x, y) in before.iter().zip(&after) {
        assert_eq!(x.id, y.id);
        assert_eq!(x.decide_by, y.decide_by, "the deadline must not move");
        assert_eq!(x.version, y.version, "the case must not be rewritten");
    }
    let cards_after = w
        .slack
        .messages()
        .iter()
        .filter(|m| m.thread_ts.is_some())
        .count();
    assert_eq!(cards_before, cards_after, "no card is posted again");
    let digests = w.digests();
    assert_eq!(digests.len(), 2, "each sweep has its digest");
    // Nothing new: the second digest is one line that still counts the idle sandboxes.
    let blocks = digests[1].blocks.clone().unwrap();
    assert_eq!(blocks.as_array().unwrap().len(), 1, "{blocks:#}");
    let line = blocks[0]["text"]["text"].as_str().unwrap();
    assert!(
        line.contains(": nothing new. 2 idle of 6 sandboxes, 2 already have a case."),
        "{line}"
    );
    assert_eq!(
        digests[1].text.as_deref(),
        Some("Fleet hygiene: 2 idle of 6 sandboxes, 2 already have a case")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sweep_with_nothing_new_can_post_nothing() {
    let mut config = config();
    config.when_nothing_new = sandbox_steward::hygiene::WhenNothingNew::Nothing;
    let w = world(config).await;
    w.busy_running().await;
    let report = w.sweep(SweepMode::Live).await;
    let posted = report.posted.as_ref().unwrap();
    assert!(posted.digest_ts.is_empty(), "{posted:?}");
    assert!(w.slack.messages().is_empty(), "{:#?}", w.slack.messages());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_sandboxes_that_cost_nothing_are_ranked_by_the_disk_they_hold() {
    let w = world(config()).await;
    let small = w.paused(5, 2048, None).await;
    let large = w.paused(5, 8192, None).await;
    let running = w.idle_running(None).await;
    let report = w.sweep(SweepMode::DryRun).await;
    let order: Vec<&SandboxId> = report.idle.iter().map(|s| &s.id).collect();
    assert_eq!(order, [&running, &large, &small], "{report:#?}");
    let digest = sandbox_steward::hygiene::digest::digest_params(&report, None, true);
    let listed: Vec<&str> = digest.top.iter().map(|t| t.worth.as_str()).collect();
    assert_eq!(listed[1..], ["holds 8 GiB of disk", "holds 2 GiB of disk"]);
    assert!(
        listed[0].ends_with(" a day") && !listed[0].contains("$0.00"),
        "{listed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blast_radius_guard_holds_kill_cases_for_review() {
    let w = world(config()).await;
    let kills = [
        w.paused(5, 4096, None).await,
        w.paused(6, 4096, None).await,
        w.paused(40, 100, None).await,
    ];
    let pause = w.idle_running(Some("alice")).await;
    w.busy_running().await;

    let report = w.sweep(SweepMode::Live).await;

    assert!(report.guard.tripped, "{:?}", report.guard);
    assert_eq!(report.guard.kill_count, 3);
    assert!((report.guard.share - 0.6).abs() < 1e-9);
    let posted = report.posted.as_ref().unwrap();
    assert_eq!(posted.held_for_review, 3);
    assert_eq!(posted.opened.len(), 1, "the pause case still opens");
    assert!(w.open_case_of(&pause).await.is_some());
    for id in &kills {
        assert!(
            w.open_case_of(id).await.is_none(),
            "{id} was raised despite the guard"
        );
    }
    let digest = text_of(&w.digests()[0]);
    assert!(digest.contains("Blast-radius guard"), "{digest}");
    assert!(
        digest.contains("60 %") && digest.contains("25 %"),
        "{digest}"
    );
    // The held sandboxes are listed by name so people can review them together.
    for id in &kills {
        assert!(digest.contains(id.as_str()), "{id} not listed in {digest}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_with_nothing_to_open_says_opened_0_cases_from_the_start() {
    let w = world(config()).await;
    // Every idle sandbox is a kill held by the guard: nothing is opened.
    let held = w.paused(5, 4096, None).await;
    w.busy_running().await;

    let report = w.sweep(SweepMode::Live).await;

    assert!(report.guard.tripped, "{:?}", report.guard);
    let posted = report.posted.as_ref().unwrap();
    assert!(posted.opened.is_empty(), "{posted:?}");
    let calls = w.slack.messages();
    assert_eq!(calls.len(), 1, "one digest, no update, no card: {calls:#?}");
    let digest = text_of(&calls[0]);
    assert!(
        digest.contains("Opened 0 cases · 1 kill recommendation held for review."),
        "{digest}"
    );
    assert!(!digest.contains("Opening cases"), "{digest}");
    assert!(digest.contains(held.as_str()), "{digest}");
    // One fleet count: the digest does not repeat a "Running now" from team metrics.
    assert!(
        digest.contains("2 sandboxes: 1 running · 1 paused"),
        "{digest}"
    );
    assert!(!digest.contains("Running now"), "{digest}");
    assert!(!digest.contains("$-"), "{digest}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_team_id_the_capacity_view_says_it_is_unavailable() {
    let w = world_with(config(), false).await;
    w.idle_running(None).await;
    let report = w.sweep(SweepMode::Live).await;
    assert!(
        matches!(&report.capacity, Capacity::Unavailable { reason } if reason.contains("E2B_PROJECT_ID")),
        "{:?}",
        report.capacity
    );
    assert_eq!(report.counts.idle, 1);
    let digest = text_of(&w.digests()[0]);
    assert!(digest.contains("Team capacity is unavailable"), "{digest}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sweep_without_a_channel_is_refused_before_reading_anything() {
    let mut w = world(config()).await;
    w.idle_running(None).await;
    w.ctx.channel = None;
    let calls = w.ctx.e2b.calls_made();
    let err = sweep_once(&w.ctx, Utc::now(), SweepMode::Live)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no hygiene channel"), "{err}");
    assert_eq!(w.ctx.e2b.calls_made(), calls);
    assert!(w.slack.messages().is_empty());
}

// ----- scheduling -----

/// Marks the sweep before the latest slot as the last one completed, so the latest is due.
async fn last_sweep_was(w: &World, slots_ago: i64) -> DateTime<Utc> {
    let latest = w.ctx.config.latest_slot(Utc::now()).unwrap();
    w.ctx
        .store
        .record_completed_sweep(latest - days(slots_ago))
        .await
        .unwrap();
    latest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_one_of_two_instances_runs_a_scheduled_sweep() {
    let w = world(config()).await;
    w.idle_running(Some("alice")).await;
    let latest = last_sweep_was(&w, 1).await;
    // A second replica: its own store connection to the same prefix, its own holder id.
    let other_store = Store::redis(&redis_url(), &w.prefix).await.unwrap();
    let mut other = w.scheduler("replica-b");
    other.sweep.store = other_store;
    let one = w.scheduler("replica-a");

    let now = Utc::now();
    let (a, b) = tokio::join!(scheduler_tick(&one, now), scheduler_tick(&other, now));
    let ticks = [a.unwrap(), b.unwrap()];

    let ran: Vec<_> = ticks
        .iter()
        .filter(|t| matches!(t, Tick::Ran { .. }))
        .collect();
    assert_eq!(ran.len(), 1, "{ticks:?}");
    assert!(
        ticks
            .iter()
            .any(|t| matches!(t, Tick::HeldElsewhere { .. } | Tick::NotDue { .. })),
        "{ticks:?}"
    );
    assert_eq!(w.digests().len(), 1);
    assert_eq!(
        w.ctx.store.last_completed_sweep().await.unwrap(),
        Some(latest)
    );
    // Once done, neither replica runs it again.
    for s in [&one, &other] {
        let again = scheduler_tick(s, Utc::now()).await.unwrap();
        assert!(matches!(again, Tick::NotDue { .. }), "{again:?}");
    }
    assert_eq!(w.digests().len(), 1);
    assert!(
        w.ctx
            .store
            .acquire_lease(SWEEP_LEASE, "probe", Duration::from_secs(1))
            .await
            .unwrap(),
        "the lease was released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_missed_for_days_runs_once_on_start() {
    let w = world(config()).await;
    w.paused(5, 4096, None).await;
    let latest = last_sweep_was(&w, 3).await;
    let s = w.scheduler("replica-a");

    let first = scheduler_tick(&s, Utc::now()).await.unwrap();
    assert!(
        matches!(&first, Tick::Ran { slot, .. } if *slot == latest),
        "{first:?}"
    );
    for _ in 0..3 {
        let again = scheduler_tick(&s, Utc::now()).await.unwrap();
        assert!(matches!(again, Tick::NotDue { next: Some(_) }), "{again:?}");
    }
    assert_eq!(w.digests().len(), 1, "three missed days make one sweep");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_waits_for_the_first_scheduled_time() {
    let w = world(config()).await;
    w.paused(5, 4096, None).await;
    let s = w.scheduler("replica-a");
    let tick = scheduler_tick(&s, Utc::now()).await.unwrap();
    assert!(matches!(tick, Tick::Started { .. }), "{tick:?}");
    assert!(matches!(
        scheduler_tick(&s, Utc::now()).await.unwrap(),
        Tick::NotDue { .. }
    ));
    assert!(w.slack.messages().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_dies_mid_sweep_is_replaced_when_its_lease_ends() {
    let w = world(config()).await;
    w.idle_running(None).await;
    last_sweep_was(&w, 1).await;
    // The dead leader took the lease and never finished (nor renewed, nor released).
    assert!(
        w.ctx
            .store
            .acquire_lease(SWEEP_LEASE, "dead-leader", Duration::from_millis(700))
            .await
            .unwrap()
    );
    let s = w.scheduler("replica-b");
    let blocked = scheduler_tick(&s, Utc::now()).await.unwrap();
    assert!(matches!(blocked, Tick::HeldElsewhere { .. }), "{blocked:?}");
    assert!(w.digests().is_empty());

    // Tick until the dead leader's lease has ended: until then every tick is held elsewhere.
    let took_over = crate::common::wait_until("the dead leader's lease ends", || async {
        match scheduler_tick(&s, Utc::now()).await.unwrap() {
            Tick::HeldElsewhere { .. } => {
                assert!(w.digests().is_empty());
                None
            }
            other => Some(other),
        }
    })
    .await;
    assert!(matches!(took_over, Tick::Ran { .. }), "{took_over:?}");
    assert_eq!(w.digests().len(), 1);
}

/// A front for a simulator (the fake Slack, or E2B's) that holds the first request matching
/// `hold` until released (so a test can act while a sweep is mid-post or mid-listing), and
/// forwards everything else untouched.
struct Gate {
    url: String,
    arrived: tokio::sync::watch::Receiver<bool>,
    release: tokio::sync::watch::Sender<bool>,
}

/// Which request (path, body) the gate holds.
type HoldIf = Box<dyn Fn(&str, &str) -> bool + Send + Sync>;

struct GateState {
    target: String,
    hold: HoldIf,
    taken: std::sync::atomic::AtomicBool,
    arrived: tokio::sync::watch::Sender<bool>,
    release: tokio::sync::watch::Receiver<bool>,
    http: reqwest::Client,
}

impl Gate {
    async fn start(
        slack: &SlackSim,
        hold: impl Fn(&str, &str) -> bool + Send + Sync + 'static,
    ) -> Gate {
        Self::in_front_of(slack.base_url(), hold).await
    }

    /// Holds the first request to `target` whose path (with its query) and body match `hold`.
    async fn in_front_of(
        target: String,
        hold: impl Fn(&str, &str) -> bool + Send + Sync + 'static,
    ) -> Gate {
        let (arrived_tx, arrived) = tokio::sync::watch::channel(false);
        let (release, release_rx) = tokio::sync::watch::channel(false);
        let state = Arc::new(GateState {
            target,
            hold: Box::new(hold),
            taken: Default::default(),
            arrived: arrived_tx,
            release: release_rx,
            http: reqwest::Client::new(),
        });
        let app = axum::Router::new().fallback(gate_forward).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Gate {
            url,
            arrived,
            release,
        }
    }

    /// A Slack client whose Web API calls go through the gate.
    fn client(&self) -> SlackClient {
        SlackClient::new(&sandbox_steward::config::SlackSettings {
            api_url: format!("{}/api", self.url),
            bot_token: Some("xoxb-test".to_owned().into()),
            signing_secret: None,
            templates_dir: None,
        })
        .unwrap()
    }

    /// Waits until the held request has arrived.
    async fn held(&self) {
        let mut arrived = self.arrived.clone();
        tokio::time::timeout(Duration::from_secs(20), arrived.wait_for(|a| *a))
            .await
            .expect("the gated call never arrived")
            .unwrap();
    }

    fn open(&self) {
        self.release.send_replace(true);
    }
}

async fn gate_forward(
    axum::extract::State(g): axum::extract::State<Arc<GateState>>,
    req: axum::extract::Request,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    if (g.hold)(&path, &String::from_utf8_lossy(&bytes))
        && !g.taken.swap(true, std::sync::atomic::Ordering::SeqCst)
    {
        g.arrived.send_replace(true);
        let mut release = g.release.clone();
        let _ = release.wait_for(|r| *r).await;
    }
    let mut forward = g
        .http
        .request(parts.method, format!("{}{path}", g.target))
        .body(bytes);
    for (name, value) in &parts.headers {
        if name != "host" && name != "content-length" {
            forward = forward.header(name, value);
        }
    }
    let resp = forward.send().await.unwrap();
    let status = resp.status();
    let mut headers = resp.headers().clone();
    headers.remove("content-length");
    headers.remove("transfer-encoding");
    (status, headers, resp.bytes().await.unwrap()).into_response()
}

/// The sweep lease's Redis key under `prefix` (found, not spelled out: only the store knows
/// the layout).
fn sweep_lease_key(conn: &mut redis::Connection, prefix: &str) -> String {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(conn)
        .unwrap();
    keys.into_iter()
        .find(|k| k.contains("lease") && k.contains(SWEEP_LEASE))
        .unwrap_or_else(|| panic!("no sweep lease under {prefix}"))
}

/// How many commands Redis has refused with WRONGTYPE since it started.
fn wrongtype_errors(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("errorstats").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_WRONGTYPE:count="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

fn redis_conn() -> redis::Connection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_connection()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failed_lease_renewal_is_retried_and_the_sweep_goes_on() {
    let w = world(config()).await;
    w.idle_running(None).await;
    let latest = last_sweep_was(&w, 1).await;
    // Hold the digest post, so the sweep is still running while its lease is sabotaged.
    let gate = Gate::start(&w.slack, |path, _| path.ends_with("chat.postMessage")).await;
    let mut s = w.scheduler("replica-a");
    s.sweep.slack = gate.client();
    s.lease_ttl = Duration::from_secs(6);
    let running = tokio::spawn(async move { scheduler_tick(&s, Utc::now()).await });
    gate.held().await;

    // One renewal fails: the lease key briefly holds a value of the wrong type.
    let mut conn = redis_conn();
    let key = sweep_lease_key(&mut conn, &w.prefix);
    let holder: String = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    let before = wrongtype_errors(&mut conn);
    let _: () = redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg(&key)
        .cmd("HSET")
        .arg(&key)
        .arg("sabotage")
        .arg(1)
        .query(&mut conn)
        .unwrap();
    crate::common::wait_until("a renewal tried", || {
        let tried = wrongtype_errors(&mut conn) != before;
        async move { tried.then_some(()) }
    })
    .await;
    let _: () = redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg(&key)
        .cmd("SET")
        .arg(&key)
        .arg(&holder)
        .arg("PX")
        .arg(6000)
        .query(&mut conn)
        .unwrap();
    gate.open();

    let tick = running.await.unwrap().unwrap();
    assert!(
        matches!(&tick, Tick::Ran { slot, .. } if *slot == latest),
        "{tick:?}"
    );
    assert_eq!(w.digests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_its_lease_mid_post_stops_and_the_digest_is_never_posted_twice() {
    let w = world(config()).await;
    let a_id = w.idle_running(Some("alice")).await;
    let b_id = w.idle_running(None).await;
    let latest = last_sweep_was(&w, 1).await;
    // Let the digest through, hold the first post in its thread (an owner heading).
    let gate = Gate::start(&w.slack, |path, body| {
        path.ends_with("chat.postMessage") && body.contains("\"thread_ts\":\"")
    })
    .await;
    let mut leader = w.scheduler("replica-a");
    leader.sweep.slack = gate.client();
    leader.lease_ttl = Duration::from_millis(900);
    let running = tokio::spawn(async move { scheduler_tick(&leader, Utc::now()).await });
    gate.held().await;
    assert_eq!(w.digests().len(), 1, "the leader posted the digest");

    // Someone else holds the lease now: the leader's next renewal finds out and it stops.
    let mut conn = redis_conn();
    let key = sweep_lease_key(&mut conn, &w.prefix);
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("someone-else")
        .arg("PX")
        .arg(60_000)
        .query(&mut conn)
        .unwrap();
    let stopped = running.await.unwrap().unwrap();
    assert!(
        matches!(&stopped, Tick::Failed { error, .. } if error.contains("lease")),
        "{stopped:?}"
    );
    assert!(
        w.open_case_of(&a_id).await.is_none(),
        "a stopped leader opens nothing more"
    );
    assert!(w.open_case_of(&b_id).await.is_none());
    gate.open();

    // The other replica takes the slot over once the lease is free.
    let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    let other = w.scheduler("replica-b");
    let took_over = scheduler_tick(&other, Utc::now()).await.unwrap();
    assert!(
        matches!(&took_over, Tick::Ran { slot, .. } if *slot == latest),
        "{took_over:?}"
    );
    let digests = w.digests();
    assert_eq!(digests.len(), 1, "one digest per scheduled sweep");
    let digest_ts = digests[0].ts.clone();
    for id in [&a_id, &b_id] {
        let case = w
            .open_case_of(id)
            .await
            .expect("the new leader opened the case");
        let card = w
            .slack
            .messages()
            .into_iter()
            .find(|m| m.method == "chat.postMessage" && text_of(m).contains(case.id.as_str()))
            .expect("the case card was posted");
        assert_eq!(
            card.thread_ts, digest_ts,
            "cards go in the one digest's thread"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_dry_run_prints_every_idle_sandbox_as_json_and_opens_nothing() {
    let w = world(config()).await;
    let a = w.idle_running(Some("alice")).await;
    let b = w.paused(40, 100, None).await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["sweep", "--dry-run", "--json"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("E2B_API_URL", w.sim.base_url())
        .env("E2B_API_KEY", "e2b_test_key")
        .env("E2B_PROJECT_ID", w.sim.team_id())
        .env("REDIS_URL", redis_url())
        .env("STEWARD_REDIS_PREFIX", &w.prefix)
        .env("SLACK_API_URL", w.slack.api_url())
        .env("SLACK_BOT_TOKEN", "xoxb-test")
        .env("STEWARD_CONFIG", "/nonexistent-on-purpose/steward.toml")
        .output()
        .await
        .unwrap();
    // A required config file that does not exist is refused with a sentence...
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "could not read the policy file /nonexistent-on-purpose/steward.toml: it does not exist"
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // ...and without one the defaults apply.
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["sweep", "--dry-run", "--json"])
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("E2B_API_URL", w.sim.base_url())
        .env("E2B_API_KEY", "e2b_test_key")
        .env("E2B_PROJECT_ID", w.sim.team_id())
        .env("REDIS_URL", redis_url())
        .env("STEWARD_REDIS_PREFIX", &w.prefix)
        .env("SLACK_API_URL", w.slack.api_url())
        .env("SLACK_BOT_TOKEN", "xoxb-test")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["mode"], "dry_run");
    assert_eq!(report["counts"]["idle"], 2);
    let idle = report["idle"].as_array().unwrap();
    let by_id = |id: &SandboxId| {
        idle.iter()
            .find(|s| s["id"] == id.as_str())
            .unwrap_or_else(|| panic!("{id} missing from {report}"))
    };
    assert_eq!(by_id(&a)["recommendation"], "pause");
    assert!(by_id(&a)["evidence"]["cpu_p95_pct"].as_f64().unwrap() < 1.0);
    assert!(by_id(&a)["reason"].as_str().unwrap().contains("CPU under"));
    assert_eq!(by_id(&b)["recommendation"], "kill");
    // The same list by owner and recommendation, as a person approves it.
    let groups = report["groups"].as_array().unwrap();
    let shape: Vec<(Value, Value, Value)> = groups
        .iter()
        .map(|g| {
            (
                g["owner"].clone(),
                g["recommendation"].clone(),
                g["count"].clone(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (json!("alice"), json!("pause"), json!(1)),
            (Value::Null, json!("kill"), json!(1)),
        ],
        "{groups:?}"
    );
    assert_eq!(groups[0]["sandboxes"], json!([a.as_str()]));
    assert!(report["posted"].is_null());
    assert!(w.slack.messages().is_empty());
    assert!(w.open_case_of(&a).await.is_none());
}

/// docs/hygiene.md: "The most expensive idle sandboxes are raised first, up to `max_cases_per_sweep`"
/// and "the rest wait for the next sweep".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cases_over_max_cases_per_sweep_wait_for_the_next_sweep_costliest_first() {
    let mut c = config();
    c.max_cases_per_sweep = 1;
    let w = world(c).await;
    let big = w
        .seed(
            json!({"templateID": "python", "state": "running", "startedAt": ago(hours(5)),
            "endAt": ahead(hours(10)), "profile": "idle", "cpuCount": 8, "memoryMB": 16384}),
        )
        .await;
    let small_a = w.idle_running(None).await;
    let small_b = w.idle_running(None).await;

    let first = w.sweep(SweepMode::Live).await;
    let posted = first.posted.as_ref().unwrap();
    assert_eq!(posted.opened.len(), 1, "{posted:?}");
    assert_eq!(posted.deferred, 2, "{posted:?}");
    assert!(
        w.open_case_of(&big).await.is_some(),
        "the costliest goes first"
    );
    let digest = w.digests().remove(0);
    let latest = w
        .slack
        .message(CHANNEL, digest.ts.as_deref().unwrap())
        .unwrap();
    assert!(
        text_of(&latest).contains("2 left for the next sweep"),
        "{}",
        text_of(&latest)
    );

    let second = w.sweep(SweepMode::Live).await;
    let posted = second.posted.as_ref().unwrap();
    assert_eq!(second.counts.already_open, 1);
    assert_eq!(posted.opened.len(), 1, "{posted:?}");
    assert_eq!(posted.deferred, 1, "{posted:?}");
    let raised = [&small_a, &small_b];
    let mut open = 0;
    for id in raised {
        open += usize::from(w.open_case_of(id).await.is_some());
    }
    assert_eq!(open, 1, "one more case per sweep");
}

/// The scheduler loop on its own task, reporting each tick; stopped when dropped.
struct Looping {
    events: tokio::sync::mpsc::Receiver<LoopEvent>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Looping {
    fn start(s: Scheduler) -> Self {
        let (tx, events) = tokio::sync::mpsc::channel(8);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(run_scheduler_observed(
            s,
            Duration::from_millis(10),
            async {
                let _ = stopped.await;
            },
            Some(tx),
        ));
        Self {
            events,
            _stop: stop,
        }
    }

    async fn next(&mut self) -> LoopEvent {
        tokio::time::timeout(Duration::from_secs(20), self.events.recv())
            .await
            .expect("the scheduler loop reports every tick")
            .expect("the scheduler loop is running")
    }
}

/// docs/hygiene.md: "After a failed sweep the replica waits 5 minutes before trying the same slot again."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failed_sweep_the_replica_waits_before_trying_the_slot_again() {
    let w = world(config()).await;
    w.idle_running(None).await;
    last_sweep_was(&w, 1).await;
    assert_eq!(
        Scheduler::new(w.ctx.clone()).retry_after_failure,
        Duration::from_secs(5 * 60)
    );
    let hooks = w.sim.hooks();
    hooks.fault(Some("list"), 500, 1, 0).await.unwrap();

    let mut s = w.scheduler("replica-a");
    s.retry_after_failure = Duration::from_secs(3600);
    let mut looping = Looping::start(s);
    let first = looping.next().await;
    assert!(
        matches!(first, LoopEvent::Ticked(Ok(Tick::Failed { .. }))),
        "{first:?}"
    );
    // The running and the paused stream are listed at once: the failed pass made one or both
    // of its first list calls, no more.
    let failed_pass = hooks.calls_of("list").await.unwrap();
    assert!((1..=2).contains(&failed_pass), "{failed_pass}");
    // The loop keeps ticking, and every tick waits: the slot is not tried again.
    for _ in 0..20 {
        let next = looping.next().await;
        assert!(matches!(next, LoopEvent::Waiting { .. }), "{next:?}");
    }
    assert_eq!(hooks.calls_of("list").await.unwrap(), failed_pass);
    assert!(w.digests().is_empty());
    drop(looping);

    // Once the wait is over, the same slot is tried again and runs.
    let mut s = w.scheduler("replica-a");
    s.retry_after_failure = Duration::ZERO;
    hooks.fault(Some("list"), 500, 1, 0).await.unwrap();
    let mut looping = Looping::start(s);
    let failed = looping.next().await;
    assert!(
        matches!(failed, LoopEvent::Ticked(Ok(Tick::Failed { .. }))),
        "{failed:?}"
    );
    let retried = looping.next().await;
    assert!(
        matches!(retried, LoopEvent::Ticked(Ok(Tick::Ran { .. }))),
        "{retried:?}"
    );
    assert_eq!(w.digests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_its_lease_while_posting_the_digest_still_records_it_for_the_takeover()
{
    let w = world(config()).await;
    let id = w.idle_running(None).await;
    let latest = last_sweep_was(&w, 1).await;
    // Hold the digest itself.
    let gate = Gate::start(&w.slack, |path, _| path.ends_with("chat.postMessage")).await;
    let mut leader = w.scheduler("replica-a");
    leader.sweep.slack = gate.client();
    leader.lease_ttl = Duration::from_millis(900);
    let running = tokio::spawn(async move { scheduler_tick(&leader, Utc::now()).await });
    gate.held().await;

    let mut conn = redis_conn();
    let key = sweep_lease_key(&mut conn, &w.prefix);
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("someone-else")
        .arg("PX")
        .arg(60_000)
        .query(&mut conn)
        .unwrap();
    let stopped = running.await.unwrap().unwrap();
    assert!(
        matches!(&stopped, Tick::Failed { error, .. } if error.contains("lease")),
        "{stopped:?}"
    );
    // The digest Slack was already receiving still arrives, and is recorded for the slot.
    gate.open();
    crate::common::wait_until("the digest posted mid-stop recorded", || async {
        w.ctx.store.sweep_digest(latest).await.unwrap().map(|_| ())
    })
    .await;

    let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    let took_over = scheduler_tick(&w.scheduler("replica-b"), Utc::now())
        .await
        .unwrap();
    assert!(matches!(took_over, Tick::Ran { .. }), "{took_over:?}");
    let digests = w.digests();
    assert_eq!(digests.len(), 1, "one digest per scheduled sweep");
    let case = w
        .open_case_of(&id)
        .await
        .expect("the takeover opened the case");
    let card = w
        .slack
        .messages()
        .into_iter()
        .find(|m| m.method == "chat.postMessage" && text_of(m).contains(case.id.as_str()))
        .expect("the case card was posted");
    assert_eq!(card.thread_ts, digests[0].ts);
}

/// Issue 41: a replica that dies between Slack accepting the digest and the store recording
/// it must not make the next attempt post a second digest. Slack here carries out the post and
/// loses the answer (as when the connection drops); the retry finds the digest by its message
/// metadata and adopts it, so the channel shows one digest, with the cases in its thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_whose_post_answer_was_lost_is_adopted_not_posted_again() {
    let w = world(config()).await;
    w.idle_running(Some("alice")).await;
    let latest = last_sweep_was(&w, 1).await;
    w.slack
        .add_fault_after_handling(sandbox_steward::sim::slack::Fault {
            method: "chat.postMessage".into(),
            status: 502,
            retry_after_secs: None,
            count: 1,
            error: None,
        });
    let s = w.scheduler("replica-a");

    let first = scheduler_tick(&s, Utc::now()).await.unwrap();
    assert!(matches!(first, Tick::Failed { .. }), "{first:?}");
    assert_eq!(w.digests().len(), 1, "Slack posted it all the same");
    let mark = w.ctx.store.sweep_digest(latest).await.unwrap().unwrap();
    assert!(mark.starts_with("posting "), "{mark}");

    let second = scheduler_tick(&s, Utc::now()).await.unwrap();
    assert!(matches!(second, Tick::Ran { .. }), "{second:?}");
    let digests = w.digests();
    assert_eq!(digests.len(), 1, "one digest in the channel");
    let ts = digests[0].ts.clone().unwrap();
    let recorded = w.ctx.store.sweep_digest(latest).await.unwrap().unwrap();
    assert!(recorded.ends_with(&format!(" {ts}")), "{recorded}");
    // The digest carries its slot, as Slack's history returns it.
    assert_eq!(
        digests[0].body["metadata"]["event_type"],
        json!("steward_digest")
    );
    assert_eq!(
        digests[0].body["metadata"]["event_payload"]["sweep_id"],
        json!(latest.timestamp().to_string())
    );
    // The case cards went into the adopted digest's thread.
    let replies: Vec<_> = w
        .slack
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.postMessage" && m.thread_ts.is_some())
        .collect();
    assert!(!replies.is_empty());
    assert!(
        replies
            .iter()
            .all(|m| m.thread_ts.as_deref() == Some(ts.as_str()))
    );
}

/// The sweep lists running and paused sandboxes separately (E2B's `state` filter), each from both
/// ends at once (`order=desc` and `order=asc`, each with its own page tokens): a fleet of several
/// pages of each state is listed whole, and every sandbox is counted and judged exactly once,
/// though the ends read the pages around their meeting point twice. Without either state's
/// listing, or with an end that stopped short, sandboxes would be missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_and_paused_streams_list_every_page_of_each_and_count_each_sandbox_once() {
    let w = world(config()).await;
    // Over two full pages of each state (the sweep asks for 100 a page), all idle, so every one
    // of them must come back in `idle` once.
    const EACH: usize = 230;
    let mut seeded = Vec::new();
    for chunk in 0..EACH / 10 {
        let running = (0..10).map(|_| w.idle_running(Some("alice")));
        let paused = (0..10).map(|_| w.paused(40, 100, None));
        let (r, p) = tokio::join!(
            futures::future::join_all(running),
            futures::future::join_all(paused)
        );
        seeded.extend(r.into_iter().map(|id| (id, RunState::Running)));
        seeded.extend(p.into_iter().map(|id| (id, RunState::Paused)));
        assert_eq!(seeded.len(), (chunk + 1) * 20);
    }
    let report = w.sweep(SweepMode::DryRun).await;
    assert_eq!(report.fleet.running, EACH, "{:?}", report.problems);
    assert_eq!(report.fleet.paused, EACH);
    assert_eq!(report.fleet.total, 2 * EACH);
    // Three pages of each state from one end; from both, four (whichever end is ahead, each
    // reads until its last page has passed the other's).
    assert_eq!(report.pages, 8);
    let c = &report.counts;
    assert_eq!(
        c.active
            + c.idle
            + c.already_open
            + c.vanished
            + c.unreadable
            + c.exempt.keep_metadata
            + c.exempt.left
            + c.exempt.too_young,
        2 * EACH,
        "{c:?}"
    );
    assert_eq!(report.idle.len(), 2 * EACH, "{c:?}");
    let judged: BTreeMap<&SandboxId, RunState> =
        report.idle.iter().map(|s| (&s.id, s.state)).collect();
    assert_eq!(judged.len(), 2 * EACH, "a sandbox was judged twice");
    for (id, state) in &seeded {
        assert_eq!(
            judged.get(id),
            Some(state),
            "{id} was not listed as {state:?}"
        );
    }
}

/// The two ends of a listing meet by start time. Sandboxes that started at the same instant may
/// come in any order within it, so an end stops only once its last page is strictly past the
/// other end's: a crowd of sandboxes sharing one start time, larger than a page and straddling
/// where the ends meet, is still listed whole, each sandbox judged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_that_started_at_the_same_instant_where_the_ends_meet_are_all_listed() {
    let w = world(config()).await;
    const CROWD: i64 = 650;
    let same = ago(hours(5));
    let mut seeded = Vec::new();
    // 20 older (six hours ago, a second apart), 650 sharing one start time (six and a half
    // pages: more than the ends' pages in flight when they first reach that instant), 30 newer
    // (four hours ago).
    for (count, around) in [(20, Some(6)), (CROWD, None), (30, Some(4))] {
        let seeding = (0..count).map(|i| {
            let started = around.map_or_else(
                || same.clone(),
                |h| ago(hours(h) + chrono::Duration::seconds(i)),
            );
            w.seed(
                json!({"templateID": "python", "state": "running", "startedAt": started,
                "endAt": ahead(hours(10)), "profile": "idle", "metadata": {"owner": "alice"}}),
            )
        });
        seeded.extend(futures::future::join_all(seeding).await);
    }
    let report = w.sweep(SweepMode::DryRun).await;
    let all = (20 + CROWD + 30) as usize;
    assert_eq!(report.fleet.running, all, "{:?}", report.problems);
    let judged: BTreeSet<&SandboxId> = report.idle.iter().map(|s| &s.id).collect();
    assert_eq!(
        report.idle.len(),
        all,
        "a sandbox was judged twice or not at all"
    );
    for id in &seeded {
        assert!(judged.contains(id), "{id} was not listed");
    }
}

/// An end of a listing that E2B refuses (here a 429 on the oldest-first end, after the
/// newest-first end has read every page) fails the pass with E2B's answer: it is never taken
/// for the two ends having met, and no partial fleet is reported as the whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_page_of_the_oldest_first_end_fails_the_pass() {
    let w = world(config()).await;
    // A page and a half of running sandboxes, no paused ones: the newest-first end reads two
    // pages, and the oldest-first end starts after the first.
    for _ in 0..15 {
        futures::future::join_all((0..10).map(|_| w.idle_running(None))).await;
    }
    let gate = Gate::in_front_of(w.sim.base_url(), |path, _| {
        path.starts_with("/v2/sandboxes?") && path.contains("order=asc")
    })
    .await;
    let mut settings = E2bSettings::for_url(&gate.url, "e2b_test_key");
    settings.team_id = Some(w.sim.team_id().to_owned());
    let ctx = SweepContext {
        e2b: E2bClient::new(&settings)
            .unwrap()
            .with_retry_policy(RetryPolicy::none()),
        ..w.ctx.clone()
    };
    let hooks = w.sim.hooks();
    let sweep = tokio::spawn(async move { sweep_once(&ctx, Utc::now(), SweepMode::DryRun).await });
    gate.held().await;
    // The other three list calls (running newest first, both pages; paused, one) are done:
    // the held one is all that is left of the listing.
    crate::common::wait_until("the newest-first ends have read every page", || async {
        (hooks.calls_of("list").await.unwrap() == 3).then_some(())
    })
    .await;
    hooks.fault(Some("list"), 429, 1, 1).await.unwrap();
    gate.open();
    let failed = sweep.await.unwrap();
    let Err(SweepError::Listing(e)) = &failed else {
        panic!("the pass went on without the oldest-first end: {failed:?}");
    };
    assert!(matches!(e, E2bError::RateLimited { .. }), "{e:?}");
}
