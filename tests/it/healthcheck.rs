//! `steward healthcheck`, the container image's HEALTHCHECK, run as the binary against a running
//! app, against a port nobody listens on, and with a dead proxy in its environment.

use crate::common::{free_port, spawn_app};

async fn healthcheck(listen: &str) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["healthcheck", "--listen", listen])
        .env_remove("STEWARD_LISTEN")
        .output()
        .await
        .expect("the binary runs")
}

#[tokio::test]
async fn a_live_replica_passes_and_a_silent_port_fails_with_a_sentence() {
    let app = spawn_app().await;
    let alive = healthcheck(&format!("0.0.0.0:{}", app.port)).await;
    assert!(
        alive.status.success(),
        "{}",
        String::from_utf8_lossy(&alive.stderr)
    );

    let port = free_port();
    let dead = healthcheck(&format!("127.0.0.1:{port}")).await;
    assert_eq!(dead.status.code(), Some(1));
    let said = String::from_utf8_lossy(&dead.stderr);
    assert!(
        said.contains(&format!("127.0.0.1:{port}/healthz did not answer")),
        "{said}"
    );
}

#[tokio::test]
async fn a_proxy_in_the_environment_is_not_asked() {
    let app = spawn_app().await;
    // A proxy that accepts nothing: a probe sent through it would fail.
    let dead = free_port();
    let proxy = format!("http://127.0.0.1:{dead}");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["healthcheck", "--listen", &format!("0.0.0.0:{}", app.port)])
        .env_remove("STEWARD_LISTEN")
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .env("HTTP_PROXY", &proxy)
        .env("http_proxy", &proxy)
        .env("ALL_PROXY", &proxy)
        .env("all_proxy", &proxy)
        .output()
        .await
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
