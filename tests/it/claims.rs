//! Tests for README claims that had none: each test names the claim it holds the code to.
use std::process::Output;

/// Runs `steward <args>` with exactly `env` (plus PATH) in an empty directory.
async fn steward(args: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"));
    cmd.args(args)
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().await.expect("steward runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// README: "Every setting has a default, and `steward check` tells you what is missing."
#[tokio::test]
async fn steward_check_says_what_is_missing_and_passes_when_nothing_is() {
    let out = steward(&["check"], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = text(&out);
    for name in [
        "E2B_API_KEY",
        "E2B_PROJECT_ID",
        "SLACK_BOT_TOKEN",
        "SLACK_SIGNING_SECRET",
    ] {
        let line = said.lines().find(|l| l.starts_with(name));
        assert!(line.is_some_and(|l| l.contains("is not set")), "{said}");
    }

    let out = steward(
        &["check"],
        &[
            ("E2B_API_KEY", "e2b_secret_value_1234"),
            ("E2B_PROJECT_ID", "team-1"),
            ("SLACK_BOT_TOKEN", "xoxb-secret-token"),
            ("SLACK_SIGNING_SECRET", "signing-secret-value"),
            ("STEWARD_LISTEN", "127.0.0.1:3999"),
        ],
    )
    .await;
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("Configuration is complete"), "{said}");
    for secret in [
        "e2b_secret_value_1234",
        "xoxb-secret-token",
        "signing-secret-value",
    ] {
        assert!(!said.contains(secret), "{said}");
    }
}

/// README: a bad setting "stops Steward at start with a sentence"; a duration too long for a
/// date (`decide_within = "100000y"`) is one, never a panic.
#[tokio::test]
async fn steward_check_refuses_a_duration_that_overflows_a_date_with_a_sentence() {
    for (toml, name) in [
        (
            "[approvals]\ndecide_within = \"100000y\"\n",
            "decide_within",
        ),
        ("[hygiene]\ndecide_within = \"100000y\"\n", "decide_within"),
        ("[hygiene.idle]\nidle_window = \"100000y\"\n", "duration"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steward.toml");
        std::fs::write(&path, toml).unwrap();
        let path = path.display().to_string();
        for args in [&["check"][..], &["serve"][..]] {
            let out = steward(
                args,
                &[("STEWARD_CONFIG", &path), ("STEWARD_LISTEN", "127.0.0.1:0")],
            )
            .await;
            let said = text(&out);
            assert!(!out.status.success(), "{args:?} {toml}: {said}");
            assert!(
                said.contains("longer than 100 years"),
                "{args:?} {toml}: {said}"
            );
            assert!(said.contains(name), "{args:?} {toml}: {said}");
            assert!(!said.contains("panicked"), "{args:?} {toml}: {said}");
        }
    }
    // Edge limits are checked the same way.
    let out = steward(&["check"], &[("STEWARD_BODY_TIMEOUT", "0s")]).await;
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("STEWARD_BODY_TIMEOUT"), "{said}");
}
