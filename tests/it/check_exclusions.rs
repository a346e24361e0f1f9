//! `steward check` reads every Leave mark in Redis and warns about the ones that keep a sandbox
//! out of sweeps for longer than `[hygiene] max_exclude_for` (made before the cap existed, or
//! with no end date), naming the sandbox, until when, who and the case. Run as the built binary
//! against the simulators and real Redis, under a key prefix of its own.
use std::process::Stdio;

use chrono::{DateTime, Utc};
use sandbox_steward::cases::{
    CaseDraft, DecisionOption, Event, Evidence, Opener, Recommendation, Subject,
};
use sandbox_steward::ids::{SandboxId, SlackUserId};
use sandbox_steward::sim::e2b::{SimOptions, SimServer};
use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use sandbox_steward::store::{Opened, Store, Updated};

use crate::common::{E2B_KEY, PrefixCleanup, redis_url};

/// Opens a case about sandbox `id` and has `by` leave it until `until`, straight through the
/// store: what an exclusion made before the cap looks like.
async fn left(store: &Store, id: &str, by: &str, until: Option<DateTime<Utc>>) {
    let now = Utc::now();
    let case = CaseDraft {
        subject: Subject::Sandbox(SandboxId::parse(id).unwrap()),
        evidence: Evidence::default(),
        recommendation: Recommendation {
            option: DecisionOption::Pause,
            reason: "idle".into(),
        },
        options: None,
        opener: Opener::Sweep,
        reason: "idle for days".into(),
        decide_by: now + chrono::Duration::days(1),
    }
    .into_case(now)
    .unwrap();
    let Opened::Created(case) = store.open_case(case).await.unwrap() else {
        panic!("a new case");
    };
    let leave = Event::Decide {
        option: DecisionOption::Leave,
        by: SlackUserId::parse(by).unwrap(),
        reason: Some("needed".into()),
        until,
    };
    let applied = store.apply_event(&case.id, leave, now).await.unwrap();
    assert!(matches!(applied, Updated::Applied(_)), "{applied:?}");
}

#[tokio::test]
async fn steward_check_lists_exclusions_longer_than_the_cap_and_nothing_else() {
    let prefix = format!("steward-check-{}", uuid::Uuid::new_v4().simple());
    let _cleanup = PrefixCleanup {
        url: redis_url(),
        prefix: prefix.clone(),
    };
    let store = Store::redis(&redis_url(), &prefix).await.unwrap();
    let forever = DateTime::parse_from_rfc3339("9999-12-31T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    left(&store, "forever1", "U0OLD", Some(forever)).await;
    left(&store, "nodate1", "U0OLD", None).await;
    left(
        &store,
        "fine1",
        "U0NEW",
        Some(Utc::now() + chrono::Duration::days(10)),
    )
    .await;

    let e2b = SimServer::start(SimOptions {
        api_key: Some(E2B_KEY.to_owned()),
        ..SimOptions::default()
    })
    .await
    .unwrap();
    let slack = SlackSim::start(SlackSimOptions {
        users: vec![("U01ALICE".into(), None)],
        ..SlackSimOptions::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("steward.toml");
    std::fs::write(
        &policy,
        "[channels]\napprovals = \"C0APPROVALS\"\n[approvals.approvers]\nkill = { users = [\"U01ALICE\"] }\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .arg("check")
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("E2B_API_URL", e2b.base_url())
        .env("E2B_API_KEY", E2B_KEY)
        .env("E2B_PROJECT_ID", e2b.team_id())
        .env("SLACK_API_URL", slack.api_url())
        .env("SLACK_BOT_TOKEN", "xoxb-check")
        .env("SLACK_SIGNING_SECRET", "secret")
        .env("STEWARD_LISTEN", "127.0.0.1:3999")
        .env("STEWARD_CONFIG", &policy)
        .env("REDIS_URL", redis_url())
        .env("STEWARD_REDIS_PREFIX", &prefix)
        .env("RUST_LOG", "off")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();

    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    // Long exclusions are warnings (exit 1), each a line of its own area.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let warnings: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("  [exclusions] "))
        .collect();
    assert_eq!(warnings.len(), 2, "{said}");
    let in_warnings = said
        .split("Warnings (")
        .nth(1)
        .and_then(|rest| rest.split("Problems (").next())
        .unwrap_or_default();
    assert!(
        in_warnings.contains(warnings[0]) && in_warnings.contains(warnings[1]),
        "{said}"
    );
    assert!(
        warnings[0].starts_with(
            "  [exclusions] sandbox nodate1 was left out of sweeps with no end date (left by U0OLD on "
        ),
        "{said}"
    );
    assert!(
        warnings[1].starts_with(
            "  [exclusions] sandbox forever1 was left out of sweeps until 9999-12-31 00:00 UTC (left by U0OLD on "
        ),
        "{said}"
    );
    assert!(
        warnings[1].contains(
            "longer than [hygiene] max_exclude_for (30 d) allows, so sweeps raise it again from "
        ),
        "{said}"
    );
    assert!(!said.contains("fine1"), "within the cap: {said}");
    assert!(!said.contains("Configuration is complete"), "{said}");
}
