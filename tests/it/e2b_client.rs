//! The E2B client against the E2B simulator over real sockets: every action, every error class,
//! paging (including sabotaged paging), metric batching and the retry rules.
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use sandbox_steward::config::E2bSettings;
use sandbox_steward::e2b::{
    E2bClient, E2bError, ListQuery, LogsQuery, NewSandbox, PagingStop, RetryPolicy, SandboxState,
    StateFilter, TeamMaxMetric,
};
use sandbox_steward::ids::{SandboxId, TemplateId};
use sandbox_steward::sim::e2b::{SimHooks, SimOptions, SimServer};
use serde_json::{Value, json};

use crate::common::free_port;

const KEY: &str = "e2b_0123456789abcdef";

struct Harness {
    sim: SimServer,
    client: E2bClient,
    hooks: SimHooks,
}

/// Retries with millisecond backoff so tests do not wait; Retry-After up to 2 s is honoured.
fn quick_retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        max_retry_after: Duration::from_secs(2),
    }
}

async fn start(sandboxes: usize) -> Harness {
    let sim = SimServer::start(SimOptions {
        sandboxes,
        api_key: Some(KEY.to_owned()),
        ..SimOptions::default()
    })
    .await
    .expect("simulator starts");
    let mut settings = E2bSettings::for_url(&sim.base_url(), KEY);
    settings.team_id = Some(sim.team_id().to_owned());
    let client = E2bClient::new(&settings)
        .expect("client builds")
        .with_retry_policy(quick_retries());
    Harness {
        hooks: sim.hooks(),
        sim,
        client,
    }
}

impl Harness {
    /// How many API requests the simulator counted for `op`.
    async fn calls(&self, op: &str) -> u64 {
        self.hooks.calls_of(op).await.unwrap()
    }

    async fn reset_calls(&self) {
        self.hooks.reset_calls().await.unwrap()
    }

    async fn fault(&self, op: &str, status: u16, count: u32, retry_after_secs: u64) {
        self.hooks
            .fault(Some(op), status, count, retry_after_secs)
            .await
            .unwrap()
    }

    async fn paging(&self, mode: &str) {
        self.hooks.paging(mode).await.unwrap()
    }

    async fn seed(&self, body: Value) -> SandboxId {
        let v = self.hooks.seed(body).await.unwrap();
        SandboxId::parse(v["sandboxID"].as_str().unwrap()).unwrap()
    }

    async fn state(&self) -> Value {
        self.hooks.state().await.unwrap()
    }
}

fn sandbox(id: &str) -> SandboxId {
    SandboxId::parse(id).unwrap()
}

#[tokio::test]
async fn a_sandbox_lives_its_whole_life_through_the_client() {
    let h = start(5).await;
    let c = &h.client;

    let mut req = NewSandbox::new(TemplateId::parse("base").unwrap());
    req.metadata.insert("owner".into(), "lifecycle-test".into());
    let created = c.create_sandbox(&req).await.unwrap();
    let id = created.sandbox_id.clone();

    let detail = c.get_sandbox(&id).await.unwrap();
    assert_eq!(detail.state, SandboxState::Running);
    assert_eq!(detail.metadata["owner"], "lifecycle-test");
    // The client always sends a timeout; E2B's own default would be 15 s.
    let ttl = detail.end_at - detail.started_at;
    assert!(ttl.num_seconds() >= 290, "ttl was {ttl}");

    let listed = c.list_sandboxes(&ListQuery::default()).await.unwrap();
    assert!(listed.items.iter().any(|s| s.sandbox_id == id));
    assert_eq!(listed.stopped, None);

    c.set_timeout(&id, Duration::from_secs(600)).await.unwrap();
    c.refresh_sandbox(&id, Some(Duration::from_secs(60)))
        .await
        .unwrap();
    c.refresh_sandbox(&id, None).await.unwrap();
    c.sandbox_metrics(&id, None, None).await.unwrap();
    c.sandbox_logs(&id, &LogsQuery::default()).await.unwrap();

    c.pause_sandbox(&id).await.unwrap();
    assert_eq!(
        c.get_sandbox(&id).await.unwrap().state,
        SandboxState::Paused
    );
    let connected = c
        .connect_sandbox(&id, Duration::from_secs(300))
        .await
        .unwrap();
    assert!(connected.resumed, "a paused sandbox is resumed by connect");
    let again = c
        .connect_sandbox(&id, Duration::from_secs(300))
        .await
        .unwrap();
    assert!(!again.resumed, "a running sandbox is only extended");

    c.pause_sandbox(&id).await.unwrap();
    let resumed = c
        .resume_sandbox(&id, Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(resumed.sandbox_id, id);

    let snap = c.create_snapshot(&id, Some("nightly")).await.unwrap();
    let unnamed = c.create_snapshot(&id, None).await.unwrap();
    let snaps = c.list_snapshots(Some(&id)).await.unwrap();
    let snap_ids: HashSet<_> = snaps.items.iter().map(|s| s.snapshot_id.clone()).collect();
    assert!(snap_ids.contains(&snap.snapshot_id), "{snap_ids:?}");
    assert!(snap_ids.contains(&unnamed.snapshot_id), "{snap_ids:?}");

    // Snapshot ids carry '/' and ':'; they must reach the server as one path segment.
    let tpl = c.get_template(&snap.snapshot_id).await.unwrap();
    assert!(!tpl.builds.is_empty());
    c.delete_template(&snap.snapshot_id).await.unwrap();
    assert!(matches!(
        c.get_template(&snap.snapshot_id).await,
        Err(E2bError::NotFound { .. })
    ));

    c.kill_sandbox(&id).await.unwrap();
    assert!(matches!(
        c.get_sandbox(&id).await,
        Err(E2bError::NotFound { .. })
    ));
}

#[tokio::test]
async fn templates_and_team_metrics_are_readable() {
    let h = start(20).await;
    let c = &h.client;
    let templates = c.list_templates().await.unwrap();
    assert!(
        templates
            .items
            .iter()
            .any(|t| t.names.iter().any(|n| n == "base")),
        "{:?}",
        templates.items
    );
    let base = templates
        .items
        .iter()
        .find(|t| t.names.iter().any(|n| n == "base"))
        .unwrap();
    let with_builds = c.get_template(&base.template_id).await.unwrap();
    assert_eq!(with_builds.template_id, base.template_id);
    assert!(!with_builds.builds.is_empty());

    let since = chrono::Utc::now() - chrono::Duration::hours(2);
    let samples = c.team_metrics(Some(since), None).await.unwrap();
    assert!(!samples.is_empty());
    c.team_metrics_max(TeamMaxMetric::ConcurrentSandboxes, Some(since), None)
        .await
        .unwrap();
    c.team_metrics_max(TeamMaxMetric::SandboxStartRate, None, None)
        .await
        .unwrap();
}

#[tokio::test]
async fn each_error_class_comes_back_as_its_own_variant() {
    let h = start(3).await;
    let c = &h.client;

    let missing = c.get_sandbox(&sandbox("nosuchsandbox")).await.unwrap_err();
    assert!(matches!(missing, E2bError::NotFound { .. }), "{missing:?}");
    assert!(missing.to_string().contains("nosuchsandbox"), "{missing}");

    let id = h
        .seed(json!({"templateID": "base", "state": "paused"}))
        .await;
    let conflict = c.pause_sandbox(&id).await.unwrap_err();
    assert!(
        matches!(conflict, E2bError::Conflict { .. }),
        "{conflict:?}"
    );

    let running = h
        .seed(json!({"templateID": "base", "state": "running"}))
        .await;
    let bad = c
        .set_timeout(&running, Duration::from_secs(48 * 3600))
        .await
        .unwrap_err();
    assert!(matches!(bad, E2bError::BadRequest { .. }), "{bad:?}");

    let mut wrong_key = E2bSettings::for_url(&h.sim.base_url(), "e2b_ffffffff");
    wrong_key.team_id = Some(h.sim.team_id().to_owned());
    let intruder = E2bClient::new(&wrong_key).unwrap();
    assert_eq!(
        intruder
            .list_sandboxes_page(&ListQuery::default(), None)
            .await
            .unwrap_err(),
        E2bError::Unauthorized
    );

    let mut other_team = E2bSettings::for_url(&h.sim.base_url(), KEY);
    other_team.team_id = Some("00000000-0000-4000-8000-000000000000".into());
    let forbidden = E2bClient::new(&other_team)
        .unwrap()
        .team_metrics(None, None)
        .await
        .unwrap_err();
    assert!(
        matches!(forbidden, E2bError::Forbidden { .. }),
        "{forbidden:?}"
    );

    // A Retry-After beyond what the policy will wait is returned at once, with its value.
    h.reset_calls().await;
    h.fault("get", 429, 1, 60).await;
    let limited = c.get_sandbox(&running).await.unwrap_err();
    assert_eq!(
        limited,
        E2bError::RateLimited {
            retry_after: Some(Duration::from_secs(60)),
            message: "Rate limit exceeded".into()
        }
    );
    assert_eq!(h.calls("get").await, 1);

    h.fault("get", 502, 1, 0).await;
    let no_retries = c.clone().with_retry_policy(RetryPolicy::none());
    let server = no_retries.get_sandbox(&running).await.unwrap_err();
    assert!(
        matches!(server, E2bError::Server { status: 502, .. }),
        "{server:?}"
    );
}

#[tokio::test]
async fn a_503_keeps_its_semantic_error_code() {
    let h = start(1).await;
    h.hooks
        .fault_from(json!({"op": "create", "status": 503, "count": 10, "error_code": "sandbox_capacity_unavailable"}))
        .await
        .unwrap();
    let err = h
        .client
        .create_sandbox(&NewSandbox::new(TemplateId::parse("base").unwrap()))
        .await
        .unwrap_err();
    let E2bError::Server {
        status, error_code, ..
    } = &err
    else {
        panic!("expected a server error, got {err:?}");
    };
    assert_eq!(*status, 503);
    assert_eq!(error_code.as_deref(), Some("sandbox_capacity_unavailable"));
    // Four attempts in the policy: all four were 503s.
    assert_eq!(h.calls("create").await, 4);
}

#[tokio::test]
async fn listing_follows_every_page_and_counts_each_request() {
    let h = start(250).await;
    let state = h.state().await;
    let expected = state["running"].as_u64().unwrap() + state["paused"].as_u64().unwrap();
    assert!(expected > 200, "{state}");

    h.reset_calls().await;
    let listing = h
        .client
        .list_sandboxes(&ListQuery {
            limit: Some(100),
            ..ListQuery::default()
        })
        .await
        .unwrap();
    let unique: HashSet<_> = listing.items.iter().map(|s| s.sandbox_id.clone()).collect();
    assert_eq!(unique.len() as u64, expected);
    assert_eq!(listing.items.len() as u64, expected);
    assert_eq!(listing.pages as u64, expected.div_ceil(100));
    assert_eq!(h.calls("list").await, listing.pages as u64);
    assert_eq!(listing.stopped, None);

    let running = h
        .client
        .list_sandboxes(&ListQuery {
            state: StateFilter::Running,
            limit: Some(37),
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert!(
        running
            .items
            .iter()
            .all(|s| s.state == SandboxState::Running)
    );
    assert_eq!(
        running.items.len() as u64,
        state["running"].as_u64().unwrap()
    );

    let first = h
        .client
        .list_sandboxes_page(
            &ListQuery {
                state: StateFilter::Running,
                limit: Some(10),
                ..ListQuery::default()
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(first.items.len(), 10);
    assert!(first.next_token.is_some());
    assert_eq!(first.total_running, state["running"].as_u64());
}

#[tokio::test]
async fn metadata_filters_survive_reserved_characters() {
    let h = start(0).await;
    let tricky = "a b&c=d%e";
    let both = h
        .seed(json!({"templateID": "base", "state": "running", "metadata": {"user": tricky, "app": "prod"}}))
        .await;
    h.seed(json!({"templateID": "base", "state": "running", "metadata": {"user": tricky}}))
        .await;
    h.seed(json!({"templateID": "base", "state": "paused", "metadata": {"user": "someone", "app": "prod"}}))
        .await;

    let found = h
        .client
        .list_sandboxes(&ListQuery {
            metadata: vec![
                ("user".into(), tricky.into()),
                ("app".into(), "prod".into()),
            ],
            ..ListQuery::default()
        })
        .await
        .unwrap();
    let ids: Vec<_> = found.items.iter().map(|s| s.sandbox_id.clone()).collect();
    assert_eq!(ids, vec![both]);
    let expected: BTreeMap<String, String> = [("user", tricky), ("app", "prod")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(found.items[0].metadata, expected);
}

#[tokio::test]
async fn metrics_for_many_sandboxes_go_in_batches_of_one_hundred() {
    let h = start(250).await;
    let all = h
        .client
        .list_sandboxes(&ListQuery::default())
        .await
        .unwrap();
    let mut ids: Vec<SandboxId> = all.items.iter().map(|s| s.sandbox_id.clone()).collect();
    let unique = ids.len();
    // Duplicates must not cost an extra batch.
    ids.extend(ids.clone().into_iter().take(40));
    let running: HashSet<_> = all
        .items
        .iter()
        .filter(|s| s.state == SandboxState::Running)
        .map(|s| s.sandbox_id.clone())
        .collect();

    h.reset_calls().await;
    let metrics = h.client.metrics_many(&ids).await.unwrap();
    assert_eq!(h.calls("metrics-many").await, unique.div_ceil(100) as u64);
    assert!(!metrics.is_empty());
    assert!(metrics.keys().all(|id| running.contains(id)));

    h.reset_calls().await;
    assert!(h.client.metrics_many(&[]).await.unwrap().is_empty());
    assert_eq!(h.calls("metrics-many").await, 0);
}

#[tokio::test]
async fn kill_is_retried_on_500_until_it_succeeds() {
    let h = start(0).await;
    let id = h
        .seed(json!({"templateID": "base", "state": "running"}))
        .await;
    h.fault("kill", 500, 2, 0).await;
    h.client.kill_sandbox(&id).await.unwrap();
    assert_eq!(h.calls("kill").await, 3);
    assert_eq!(h.state().await["running"], 0);
}

#[tokio::test]
async fn pause_is_not_replayed_after_a_500() {
    let h = start(0).await;
    let id = h
        .seed(json!({"templateID": "base", "state": "running"}))
        .await;
    h.fault("pause", 500, 1, 0).await;
    let err = h.client.pause_sandbox(&id).await.unwrap_err();
    assert!(
        matches!(err, E2bError::Server { status: 500, .. }),
        "{err:?}"
    );
    assert_eq!(h.calls("pause").await, 1);
    assert_eq!(
        h.client.get_sandbox(&id).await.unwrap().state,
        SandboxState::Running
    );
}

#[tokio::test]
async fn create_is_retried_on_503_but_not_on_500() {
    let h = start(0).await;
    let req = NewSandbox::new(TemplateId::parse("base").unwrap());

    h.fault("create", 503, 1, 0).await;
    h.client.create_sandbox(&req).await.unwrap();
    assert_eq!(h.calls("create").await, 2);

    h.reset_calls().await;
    h.fault("create", 500, 1, 0).await;
    let err = h.client.create_sandbox(&req).await.unwrap_err();
    assert!(
        matches!(err, E2bError::Server { status: 500, .. }),
        "{err:?}"
    );
    assert_eq!(h.calls("create").await, 1);
    assert_eq!(h.state().await["running"], 1);
}

#[tokio::test]
async fn a_rate_limit_is_waited_out_when_retry_after_is_short() {
    let h = start(0).await;
    let id = h
        .seed(json!({"templateID": "base", "state": "running"}))
        .await;
    h.fault("timeout", 429, 1, 1).await;
    h.client
        .set_timeout(&id, Duration::from_secs(900))
        .await
        .unwrap();
    assert_eq!(h.calls("timeout").await, 2);
}

#[tokio::test]
async fn a_repeated_page_token_stops_the_listing_and_says_so() {
    let h = start(30).await;
    h.paging("repeat").await;
    h.reset_calls().await;
    let listing = h
        .client
        .list_sandboxes(&ListQuery {
            limit: Some(10),
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(listing.stopped, Some(PagingStop::RepeatedToken));
    assert_eq!(h.calls("list").await, listing.pages as u64);
    assert!(listing.pages <= 3, "pages {}", listing.pages);
}

#[tokio::test]
async fn endless_page_tokens_stop_at_the_page_cap() {
    let h = start(30).await;
    h.paging("endless").await;
    h.reset_calls().await;
    let listing = h
        .client
        .list_sandboxes(&ListQuery {
            limit: Some(5),
            max_pages: Some(7),
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(listing.stopped, Some(PagingStop::PageCap(7)));
    assert_eq!(listing.pages, 7);
    assert_eq!(h.calls("list").await, 7);

    let capped = h.client.clone().with_max_pages(4);
    let snaps = capped.list_snapshots(None).await.unwrap();
    assert_eq!(snaps.stopped, Some(PagingStop::PageCap(4)));
    let templates = capped.list_templates().await.unwrap();
    assert_eq!(templates.stopped, Some(PagingStop::PageCap(4)));
    assert_eq!(h.calls("templates").await, 4);
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_sent() {
    let h = start(1).await;
    let id = sandbox("anything");
    let refresh = h
        .client
        .refresh_sandbox(&id, Some(Duration::from_secs(7200)))
        .await;
    assert!(matches!(refresh, Err(E2bError::BadRequest { .. })));
    let page = h
        .client
        .list_sandboxes_page(
            &ListQuery {
                limit: Some(500),
                ..ListQuery::default()
            },
            None,
        )
        .await;
    assert!(matches!(page, Err(E2bError::BadRequest { .. })));
    let logs = h
        .client
        .sandbox_logs(
            &id,
            &LogsQuery {
                search: Some("x".repeat(300)),
                ..LogsQuery::default()
            },
        )
        .await;
    assert!(matches!(logs, Err(E2bError::BadRequest { .. })));
    assert_eq!(h.client.calls_made(), 0);
}

#[tokio::test]
async fn an_unreachable_server_is_a_transport_error_without_the_key() {
    let port = free_port();
    let settings = E2bSettings::for_url(&format!("http://127.0.0.1:{port}"), KEY);
    let client = E2bClient::new(&settings)
        .unwrap()
        .with_retry_policy(quick_retries());
    let err = client.get_sandbox(&sandbox("abc")).await.unwrap_err();
    assert!(matches!(err, E2bError::Transport(_)), "{err:?}");
    assert_eq!(client.calls_made(), 4, "connection failures are retried");
    let shown = format!("{err} {err:?} {client:?}");
    assert!(!shown.contains(KEY), "{shown}");
}

#[tokio::test]
async fn an_answer_over_the_size_cap_is_a_sentence_and_is_not_asked_again() {
    let h = start(60).await;
    let client = h.client.clone().with_max_response_bytes(2048);
    h.reset_calls().await;
    let err = client
        .list_sandboxes_page(&ListQuery::default(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, E2bError::TooLarge { .. }), "{err:?}");
    assert!(err.to_string().contains("larger than"), "{err}");
    assert!(!err.is_transient());
    assert_eq!(
        h.calls("list").await,
        1,
        "a too-large answer is not fetched again"
    );
    // The same listing under the default cap reads fine.
    assert!(
        h.client
            .list_sandboxes_page(&ListQuery::default(), None)
            .await
            .is_ok()
    );
}

/// docs/operations.md: "Batch metrics go out in calls of at most 100 ids, 8 at a time."
#[tokio::test]
async fn batch_metrics_go_out_in_calls_of_100_ids_8_at_a_time() {
    let h = start(0).await;
    let front =
        crate::common::HoldingFront::start(&h.sim.base_url(), |path| path == "/sandboxes/metrics")
            .await;
    let mut settings = E2bSettings::for_url(&front.url, KEY);
    settings.team_id = Some(h.sim.team_id().to_owned());
    let client = E2bClient::new(&settings).unwrap();
    let ids: Vec<SandboxId> = (0..2000)
        .map(|i| SandboxId::parse(format!("ibatch{i:05}")).unwrap())
        .collect();
    let reading = tokio::spawn(async move { client.metrics_many(&ids).await });
    // Every call is held until eight are in flight at once...
    crate::common::wait_until("eight metrics calls in flight", || async {
        (front.in_flight() >= 8).then_some(())
    })
    .await;
    front.open();
    reading.await.unwrap().expect("the batch read succeeds");
    // ...and never more: 2,000 ids make 20 calls, at most 8 at a time.
    assert_eq!(front.arrived(), 20);
    assert_eq!(front.max_in_flight(), 8);
}

/// A list item's turn that stops waiting while its batched re-check read is under way (its
/// worker cancelled, say at shutdown) leaves the read to finish: the next turn gets its reading
/// from that same read instead of waiting forever for a read nobody ends.
#[tokio::test]
async fn a_cancelled_turn_leaves_its_batched_read_to_finish_for_the_others() {
    use sandbox_steward::approvals::list::reading::{self, Readings};
    let h = start(30).await;
    let mut listed = h
        .client
        .list_sandboxes_page(&ListQuery::default(), None)
        .await
        .unwrap()
        .items;
    // Turns come in the order the readings list them (oldest first).
    listed.sort_by(|a, b| {
        reading::listing_order(Some(a.started_at), &a.sandbox_id)
            .cmp(&reading::listing_order(Some(b.started_at), &b.sandbox_id))
    });
    let front =
        crate::common::HoldingFront::start(&h.sim.base_url(), |path| path == "/v2/sandboxes").await;
    let mut settings = E2bSettings::for_url(&front.url, KEY);
    settings.team_id = Some(h.sim.team_id().to_owned());
    let client = E2bClient::new(&settings).unwrap();
    let readings = std::sync::Arc::new(Readings::new(
        &client,
        listed
            .iter()
            .map(|s| (&s.sandbox_id, Some(s.started_at), &s.metadata)),
    ));
    let (first, second) = (listed[0].clone(), listed[1].clone());
    let turn = tokio::spawn({
        let readings = readings.clone();
        async move {
            readings
                .take(&first.sandbox_id, Some(first.started_at))
                .await
        }
    });
    crate::common::wait_until("the first turn's read is under way", || async {
        (front.in_flight() >= 1).then_some(())
    })
    .await;
    turn.abort();
    assert!(turn.await.unwrap_err().is_cancelled());
    front.open();
    let read = tokio::time::timeout(
        crate::common::PATIENCE,
        readings.take(&second.sandbox_id, Some(second.started_at)),
    )
    .await
    .expect("the next turn waited forever for a read nobody ended")
    .expect("the listing shows the second sandbox");
    assert_eq!(read.listed.sandbox_id, second.sandbox_id);
    assert_eq!(front.arrived(), 1, "one page read served both turns");
}

// ---- v2 create and connect, the v1 fallback, env vars and metadata filters ----

async fn start_with(opts: SimOptions) -> Harness {
    let sim = SimServer::start(SimOptions {
        sandboxes: 0,
        api_key: Some(KEY.to_owned()),
        ..opts
    })
    .await
    .expect("simulator starts");
    let settings = E2bSettings::for_url(&sim.base_url(), KEY);
    let client = E2bClient::new(&settings)
        .expect("client builds")
        .with_retry_policy(quick_retries());
    Harness {
        hooks: sim.hooks(),
        sim,
        client,
    }
}

/// What a shell command printed in sandbox `id`, run through the simulator's envd.
async fn shell_output(sim: &SimServer, id: &SandboxId, token: Option<&str>, line: &str) -> String {
    use sandbox_steward::envd::{ProcessEvent, ProcessSpec};
    let envd = crate::common::envd_client(sim, id, token);
    let events = envd
        .start(&ProcessSpec::shell(line))
        .await
        .expect("started")
        .collect()
        .await
        .expect("the stream ends cleanly");
    let bytes: Vec<u8> = events
        .iter()
        .filter_map(|e| match e {
            ProcessEvent::Stdout(b) => Some(b.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    String::from_utf8(bytes).unwrap()
}

#[tokio::test]
async fn create_and_connect_use_e2bs_v2_routes_and_env_vars_reach_the_sandboxes_commands() {
    let h = start_with(SimOptions {
        exec: sandbox_steward::sim::e2b::ExecMode::Local,
        ..SimOptions::default()
    })
    .await;
    let mut req = NewSandbox::new(TemplateId::parse("base").unwrap());
    req.env_vars.insert("GREETING".into(), "hi there".into());
    req.env_vars.insert("HOME_OVERRIDE".into(), "a=b&c".into());
    req.metadata.insert("owner".into(), "zoë".into());
    let created = h.client.create_sandbox(&req).await.unwrap();
    assert_eq!(h.calls("create-v2").await, 1);
    assert_eq!(h.calls("create-v1").await, 0);
    assert!(!h.client.uses_v1_routes());
    // A v2 sandbox is always secured: envd wants its token.
    let token = created
        .envd_access_token
        .as_ref()
        .map(|t| secrecy::ExposeSecret::expose_secret(t).to_owned());
    assert!(token.is_some(), "a v2 sandbox has an envd access token");
    assert_eq!(created.envd_version, "0.6.4");
    let printed = shell_output(
        &h.sim,
        &created.sandbox_id,
        token.as_deref(),
        r#"printf '%s|%s' "$GREETING" "$HOME_OVERRIDE""#,
    )
    .await;
    assert_eq!(printed, "hi there|a=b&c");

    h.client.pause_sandbox(&created.sandbox_id).await.unwrap();
    let connected = h
        .client
        .connect_sandbox(&created.sandbox_id, Duration::from_secs(600))
        .await
        .unwrap();
    assert!(connected.resumed, "connect resumed the paused sandbox");
    assert_eq!(h.calls("connect-v2").await, 1);
    assert_eq!(h.calls("connect-v1").await, 0);
    // The variables outlive a pause.
    let printed = shell_output(
        &h.sim,
        &created.sandbox_id,
        token.as_deref(),
        r#"printf '%s' "$GREETING""#,
    )
    .await;
    assert_eq!(printed, "hi there");
}

#[tokio::test]
async fn an_e2b_without_v2_routes_is_used_through_v1_after_one_probe() {
    let h = start_with(SimOptions {
        v1_only: true,
        ..SimOptions::default()
    })
    .await;
    let base = TemplateId::parse("base").unwrap();
    let first = h
        .client
        .create_sandbox(&NewSandbox::new(base.clone()))
        .await;
    let first = first.expect("created through v1 after v2 answered 404");
    assert_eq!(
        (h.calls("create-v2").await, h.calls("create-v1").await),
        (1, 1)
    );
    assert!(h.client.uses_v1_routes());
    // Remembered by the client and its clones, for connect too: no second probe.
    let clone = h.client.clone();
    clone.create_sandbox(&NewSandbox::new(base)).await.unwrap();
    clone.pause_sandbox(&first.sandbox_id).await.unwrap();
    let connected = clone
        .connect_sandbox(&first.sandbox_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(connected.resumed);
    assert_eq!(
        (h.calls("create-v2").await, h.calls("create-v1").await),
        (1, 2)
    );
    assert_eq!(
        (h.calls("connect-v2").await, h.calls("connect-v1").await),
        (0, 1)
    );
}

#[tokio::test]
async fn a_missing_sandbox_on_v2_is_not_taken_for_a_missing_route() {
    let h = start_with(SimOptions::default()).await;
    let nobody = SandboxId::parse("inosuchsandbox").unwrap();
    // A 404 that names the sandbox is about the sandbox, not the route: no v1 call.
    let err = h
        .client
        .connect_sandbox(&nobody, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(err, E2bError::NotFound { .. }), "{err:?}");
    assert!(!h.client.uses_v1_routes());
    assert_eq!(
        (h.calls("connect-v2").await, h.calls("connect-v1").await),
        (1, 0)
    );
    // So is one that names the template.
    let err = h
        .client
        .create_sandbox(&NewSandbox::new(
            TemplateId::parse("no-such-template").unwrap(),
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, E2bError::NotFound { .. }), "{err:?}");
    assert_eq!(
        (h.calls("create-v2").await, h.calls("create-v1").await),
        (1, 0)
    );
    // Once v2 has answered, its 404s are final: no v1 call.
    h.client
        .create_sandbox(&NewSandbox::new(TemplateId::parse("base").unwrap()))
        .await
        .unwrap();
    let err = h
        .client
        .connect_sandbox(&nobody, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(err, E2bError::NotFound { .. }), "{err:?}");
    assert_eq!(
        (h.calls("connect-v2").await, h.calls("connect-v1").await),
        (2, 0)
    );
    assert_eq!(h.calls("create-v1").await, 0);
}

#[tokio::test]
async fn metadata_filters_with_spaces_ampersands_equals_and_non_ascii_round_trip() {
    let h = start_with(SimOptions::default()).await;
    let base = TemplateId::parse("base").unwrap();
    let mut wanted = NewSandbox::new(base.clone());
    wanted.metadata.insert("owner".into(), "zoë".into());
    wanted.metadata.insert("a b&c=d".into(), "x/y+z %41".into());
    let wanted = h.client.create_sandbox(&wanted).await.unwrap();
    let mut other = NewSandbox::new(base);
    other.metadata.insert("owner".into(), "zoe".into());
    other.metadata.insert("a b&c=d".into(), "x/y+z %41".into());
    h.client.create_sandbox(&other).await.unwrap();

    let query = |pairs: &[(&str, &str)]| ListQuery {
        metadata: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..ListQuery::default()
    };
    let found = h
        .client
        .list_sandboxes(&query(&[("owner", "zoë"), ("a b&c=d", "x/y+z %41")]))
        .await
        .unwrap();
    let ids: Vec<&str> = found.items.iter().map(|s| s.sandbox_id.as_str()).collect();
    assert_eq!(ids, [wanted.sandbox_id.as_str()]);
    let both = h
        .client
        .list_sandboxes(&query(&[("a b&c=d", "x/y+z %41")]))
        .await
        .unwrap();
    assert_eq!(both.items.len(), 2);
    let none = h
        .client
        .list_sandboxes(&query(&[("a b&c=d", "x/y+z A")]))
        .await
        .unwrap();
    assert!(none.items.is_empty());
}
