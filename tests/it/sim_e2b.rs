//! The E2B simulator over real sockets: raw HTTP and JSON against `SimServer::start`, checking
//! E2B's paths, status codes, bodies and required fields (`shared/e2b/openapi.yml`).
use std::collections::HashSet;

use reqwest::header::HeaderMap;
use reqwest::{Client, RequestBuilder, StatusCode};
use sandbox_steward::sim::e2b::{SimOptions, SimServer};
use serde_json::{Value, json};

const LISTED: &[&str] = &[
    "templateID",
    "sandboxID",
    "clientID",
    "startedAt",
    "endAt",
    "cpuCount",
    "memoryMB",
    "diskSizeMB",
    "state",
    "envdVersion",
];
const SANDBOX: &[&str] = &["templateID", "sandboxID", "clientID", "envdVersion"];
const METRIC: &[&str] = &[
    "timestamp",
    "timestampUnix",
    "cpuCount",
    "cpuUsedPct",
    "memUsed",
    "memTotal",
    "memCache",
    "diskUsed",
    "diskTotal",
];
const TEAM_METRIC: &[&str] = &[
    "timestamp",
    "timestampUnix",
    "concurrentSandboxes",
    "sandboxStartRate",
];
const MAX_TEAM_METRIC: &[&str] = &["timestamp", "timestampUnix", "value"];
const TEMPLATE: &[&str] = &[
    "templateID",
    "buildID",
    "cpuCount",
    "memoryMB",
    "diskSizeMB",
    "public",
    "createdAt",
    "updatedAt",
    "createdBy",
    "lastSpawnedAt",
    "spawnCount",
    "buildCount",
    "envdVersion",
    "aliases",
    "names",
    "buildStatus",
];
const TEMPLATE_WITH_BUILDS: &[&str] = &[
    "templateID",
    "public",
    "aliases",
    "names",
    "createdAt",
    "updatedAt",
    "lastSpawnedAt",
    "spawnCount",
    "builds",
];
const BUILD: &[&str] = &[
    "buildID",
    "status",
    "createdAt",
    "updatedAt",
    "cpuCount",
    "memoryMB",
];
const SNAPSHOT: &[&str] = &["snapshotID", "names"];
const LOG_ENTRY: &[&str] = &["timestamp", "level", "message", "fields"];

/// Fails unless `value` is an object holding every key the spec requires.
fn assert_required(value: &Value, keys: &[&str]) {
    let obj = value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"));
    for key in keys {
        assert!(
            obj.contains_key(*key),
            "missing required {key:?} in {value}"
        );
    }
}

/// Fails unless `body` is E2B's error shape for `status`.
fn assert_error(status: StatusCode, body: &Value, expected: StatusCode) {
    assert_eq!(status, expected, "body: {body}");
    assert_eq!(body["code"], json!(expected.as_u16()), "body: {body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "body: {body}"
    );
}

struct Sim {
    server: SimServer,
    http: Client,
}

impl Sim {
    async fn start(opts: SimOptions) -> Self {
        let server = SimServer::start(opts).await.expect("simulator starts");
        Self {
            server,
            http: Client::new(),
        }
    }

    async fn with_fleet(sandboxes: usize) -> Self {
        Self::start(SimOptions {
            sandboxes,
            ..SimOptions::default()
        })
        .await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.base_url())
    }

    async fn send(&self, req: RequestBuilder) -> (StatusCode, HeaderMap, Value) {
        let resp = req.send().await.expect("request reaches the simulator");
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.expect("body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON body")
        };
        (status, headers, body)
    }

    async fn get(&self, path: &str) -> (StatusCode, HeaderMap, Value) {
        self.send(self.http.get(self.url(path))).await
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let (s, _, b) = self.send(self.http.post(self.url(path)).json(&body)).await;
        (s, b)
    }

    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        let (s, _, b) = self.send(self.http.delete(self.url(path))).await;
        (s, b)
    }

    async fn seed(&self, body: Value) -> Value {
        let (status, seeded) = self.post("/_sim/sandboxes", body).await;
        assert_eq!(status, StatusCode::CREATED, "{seeded}");
        assert_required(&seeded, LISTED);
        seeded
    }

    async fn create(&self, template: &str) -> String {
        let (status, body) = self
            .post(
                "/sandboxes",
                json!({"templateID": template, "timeout": 300}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_required(&body, SANDBOX);
        body["sandboxID"].as_str().unwrap().to_owned()
    }

    /// Every page of a list, following `X-Next-Token` (capped so a bug cannot hang the test).
    async fn list_all(&self, query: &str) -> Vec<Value> {
        let mut items = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..1000 {
            let mut path = format!("/v2/sandboxes?{query}");
            if let Some(t) = &token {
                path.push_str(&format!("&nextToken={t}"));
            }
            let (status, headers, body) = self.get(&path).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            items.extend(body.as_array().unwrap().iter().cloned());
            match headers.get("x-next-token") {
                Some(t) => token = Some(t.to_str().unwrap().to_owned()),
                None => return items,
            }
        }
        panic!("paging did not end");
    }

    async fn state(&self) -> Value {
        self.get("/_sim/state").await.2
    }

    async fn calls(&self) -> Value {
        self.get("/_sim/calls").await.2["calls"].clone()
    }
}

fn encode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Python's `quote_plus(quote(s), safe="")`, written out independently of Steward's encoder.
fn python_quote_twice(s: &str) -> String {
    let quoted: String = s
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    quoted.replace('%', "%25").replace('/', "%2F")
}

fn ids(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|i| i["sandboxID"].as_str().unwrap().to_owned())
        .collect()
}

fn ms(rfc3339: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339.as_str().unwrap())
        .unwrap()
        .timestamp_millis()
}

fn ago(d: chrono::Duration) -> String {
    (chrono::Utc::now() - d).to_rfc3339()
}

#[tokio::test]
async fn paging_walks_every_live_sandbox_newest_first_and_ends_without_a_token() {
    let sim = Sim::with_fleet(250).await;
    let state = sim.state().await;
    let live = state["running"].as_u64().unwrap() + state["paused"].as_u64().unwrap();
    assert_eq!(live, 250);

    let (_, headers, first) = sim.get("/v2/sandboxes?limit=40").await;
    assert_eq!(first.as_array().unwrap().len(), 40);
    assert!(headers.contains_key("x-next-token"));
    assert_eq!(
        headers["x-total-running"].to_str().unwrap(),
        state["running"].to_string()
    );

    let all = sim.list_all("limit=40").await;
    assert_eq!(all.len(), 250);
    let unique: HashSet<_> = ids(&all).into_iter().collect();
    assert_eq!(unique.len(), 250, "pages overlap");
    for item in &all {
        assert_required(item, LISTED);
    }
    let started: Vec<i64> = all.iter().map(|i| ms(&i["startedAt"])).collect();
    assert!(
        started.windows(2).all(|w| w[0] >= w[1]),
        "default order is newest first"
    );
}

#[tokio::test]
async fn ascending_order_reverses_the_list_and_tokens_are_bound_to_their_order() {
    let sim = Sim::with_fleet(120).await;
    let desc = ids(&sim.list_all("limit=50").await);
    let mut asc = ids(&sim.list_all("limit=50&order=asc").await);
    asc.reverse();
    assert_eq!(desc, asc);

    let (_, headers, _) = sim.get("/v2/sandboxes?limit=10").await;
    let desc_token = headers["x-next-token"].to_str().unwrap().to_owned();
    let (status, _, body) = sim
        .get(&format!("/v2/sandboxes?order=asc&nextToken={desc_token}"))
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    assert_eq!(body["message"], "Invalid next token");
}

#[tokio::test]
async fn state_metadata_template_and_start_filters_narrow_the_list() {
    let sim = Sim::with_fleet(0).await;
    sim.seed(
        json!({"sandboxID": "alicepy", "templateID": "python", "state": "running",
        "metadata": {"owner": "alice", "agent": "codex"}}),
    )
    .await;
    sim.seed(
        json!({"sandboxID": "bobbase", "templateID": "base", "state": "paused",
        "startedAt": ago(chrono::Duration::hours(2)), "endAt": ago(chrono::Duration::hours(1)),
        "metadata": {"owner": "bob"}}),
    )
    .await;
    sim.seed(
        json!({"sandboxID": "alicenode", "templateID": "node", "state": "paused",
        "metadata": {"owner": "alice", "agent": "devin & co"}}),
    )
    .await;

    let sorted = |items: Vec<Value>| {
        let mut v = ids(&items);
        v.sort();
        v
    };
    assert_eq!(
        sorted(sim.list_all("state=paused").await),
        ["alicenode", "bobbase"]
    );
    assert_eq!(sim.list_all("state=running,paused").await.len(), 3);
    let (_, headers, _) = sim.get("/v2/sandboxes?state=paused").await;
    assert!(
        !headers.contains_key("x-total-running"),
        "only sent when running was asked for"
    );

    // The filter as the official SDK sends it: urlencode({quote(k): quote(v)}), then the query's
    // own encoding; E2B decodes the query, the whole value, then each key and value.
    let filter = |pairs: &[(&str, &str)]| {
        let inner: Vec<String> = pairs
            .iter()
            .map(|(k, v)| format!("{}={}", python_quote_twice(k), python_quote_twice(v)))
            .collect();
        format!("metadata={}", encode(&inner.join("&")))
    };
    let query = filter(&[("owner", "alice"), ("agent", "devin & co")]);
    assert_eq!(sorted(sim.list_all(&query).await), ["alicenode"]);
    let (_, headers, _) = sim.get(&format!("/v2/sandboxes?{query}")).await;
    assert_eq!(headers["x-total-running"], "0");
    sim.seed(
        json!({"sandboxID": "zoe", "templateID": "base", "state": "running",
        "startedAt": ago(chrono::Duration::hours(2)),
        "metadata": {"owner": "zoë", "k": "a b&c=d", "path": "x/y+z"}}),
    )
    .await;
    let query = filter(&[("owner", "zoë"), ("k", "a b&c=d"), ("path", "x/y+z")]);
    assert_eq!(sorted(sim.list_all(&query).await), ["zoe"]);
    assert!(sim.list_all(&filter(&[("owner", "zoe")])).await.is_empty());
    // Encoded once too few times (as Steward once did), the `&` in the value splits the pair
    // into `k=a b` and `c=d`, which match nothing.
    let once = format!("metadata={}", encode(&format!("k={}", encode("a b&c=d"))));
    assert!(sim.list_all(&once).await.is_empty());
    let (status, _, body) = sim.get("/v2/sandboxes?metadata=k%3D%2525YY").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    assert_eq!(sorted(sim.list_all("template=python").await), ["alicepy"]);
    assert!(sim.list_all("template=no-such-template").await.is_empty());
    let after = encode(&ago(chrono::Duration::minutes(30)));
    assert_eq!(
        sorted(sim.list_all(&format!("startedAfter={after}")).await),
        ["alicenode", "alicepy"]
    );
}

#[tokio::test]
async fn out_of_range_limits_and_malformed_parameters_are_400_with_an_e2b_body() {
    let sim = Sim::with_fleet(5).await;
    for query in [
        "limit=101",
        "limit=0",
        "limit=ten",
        "order=sideways",
        "state=gone",
        "nextToken=%25%25",
        "startedAfter=yesterday",
    ] {
        let (status, _, body) = sim.get(&format!("/v2/sandboxes?{query}")).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST);
    }
    let (status, _, body) = sim.get("/v2/templates?limit=101").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    let (status, _, body) = sim.get("/snapshots?limit=500").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn enum_query_values_outside_the_spec_are_refused_in_the_validators_words() {
    let sim = Sim::with_fleet(3).await;
    let team = sim.server.team_id().to_owned();
    let cases = [
        (
            "/v2/sandboxes?state=running,gone".to_owned(),
            "state",
            "gone",
            r#"["running","paused"]"#,
        ),
        (
            "/v2/sandboxes?order=sideways".to_owned(),
            "order",
            "sideways",
            r#"["asc","desc"]"#,
        ),
        (
            "/v2/sandboxes/any/logs?direction=up".to_owned(),
            "direction",
            "up",
            r#"["forward","backward"]"#,
        ),
        (
            "/v2/sandboxes/any/logs?level=loud".to_owned(),
            "level",
            "loud",
            r#"["debug","info","warn","error"]"#,
        ),
        (
            format!("/teams/{team}/metrics/max?metric=mood"),
            "metric",
            "mood",
            r#"["concurrent_sandboxes","sandbox_start_rate"]"#,
        ),
    ];
    for (path, name, value, allowed) in cases {
        let (status, _, body) = sim.get(&path).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST);
        assert_eq!(
            body["message"],
            format!(
                "parameter \"{name}\" in query has an error: value \"{value}\" is not one of the allowed values {allowed}"
            ),
            "{path}"
        );
    }
}

#[tokio::test]
async fn unknown_sandboxes_get_e2bs_not_found_wording_everywhere() {
    let sim = Sim::with_fleet(3).await;
    let expected = "Sandbox \"nosuchbox\" doesn't exist or you don't have access to it";
    for path in [
        "/sandboxes/nosuchbox",
        "/sandboxes/nosuchbox/metrics",
        "/v2/sandboxes/nosuchbox/logs",
    ] {
        let (status, _, body) = sim.get(path).await;
        assert_error(status, &body, StatusCode::NOT_FOUND);
        assert_eq!(body["message"], expected);
    }
    for (status, body) in [
        sim.delete("/sandboxes/nosuchbox").await,
        sim.post("/sandboxes/nosuchbox/pause", json!({})).await,
        sim.post("/sandboxes/nosuchbox/connect", json!({"timeout": 60}))
            .await,
        sim.post("/sandboxes/nosuchbox/timeout", json!({"timeout": 60}))
            .await,
        sim.post("/sandboxes/nosuchbox/snapshots", json!({})).await,
    ] {
        assert_error(status, &body, StatusCode::NOT_FOUND);
        assert_eq!(body["message"], expected);
    }
}

#[tokio::test]
async fn pause_twice_is_409_and_a_paused_sandbox_can_still_be_killed() {
    let sim = Sim::with_fleet(0).await;
    let id = sim.create("base").await;
    let (status, _) = sim.post(&format!("/sandboxes/{id}/pause"), json!({})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = sim.post(&format!("/sandboxes/{id}/pause"), json!({})).await;
    assert_error(status, &body, StatusCode::CONFLICT);
    assert_eq!(
        body["message"],
        format!("Error pausing sandbox - sandbox '{id}' is already paused")
    );

    let (status, _, detail) = sim.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_required(&detail, LISTED);
    assert_eq!(detail["state"], "paused");
    assert!(
        ms(&detail["endAt"]) <= chrono::Utc::now().timestamp_millis(),
        "paused endAt is the pause time"
    );
    assert_eq!(detail["lifecycle"]["onTimeout"], "kill");

    let (status, _) = sim
        .post(&format!("/sandboxes/{id}/timeout"), json!({"timeout": 60}))
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "timeout does not apply to paused sandboxes"
    );

    let (status, _) = sim.delete(&format!("/sandboxes/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = sim.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = sim.delete(&format!("/sandboxes/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let state = sim.state().await;
    assert_eq!(
        (&state["running"], &state["paused"], &state["killed"]),
        (&json!(0), &json!(0), &json!(1))
    );
}

#[tokio::test]
async fn connect_resumes_paused_sandboxes_with_201_and_only_extends_running_ones() {
    let sim = Sim::with_fleet(0).await;
    let id = sim.create("python").await;
    let (_, _, before) = sim.get(&format!("/sandboxes/{id}")).await;

    let (status, body) = sim
        .post(&format!("/sandboxes/{id}/connect"), json!({"timeout": 10}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_required(&body, SANDBOX);
    let (_, _, after) = sim.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(
        after["endAt"], before["endAt"],
        "a shorter connect never shortens the TTL"
    );

    let (status, body) = sim
        .post(&format!("/sandboxes/{id}/connect"), json!({}))
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);

    sim.post(&format!("/sandboxes/{id}/pause"), json!({})).await;
    let (status, body) = sim
        .post(&format!("/sandboxes/{id}/connect"), json!({"timeout": 120}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, _, resumed) = sim.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(resumed["state"], "running");

    let (status, body) = sim
        .post(&format!("/sandboxes/{id}/resume"), json!({}))
        .await;
    assert_error(status, &body, StatusCode::CONFLICT);
    sim.post(&format!("/sandboxes/{id}/pause"), json!({})).await;
    let (status, _, body) = sim
        .send(sim.http.post(sim.url(&format!("/sandboxes/{id}/resume"))))
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the resume body is optional: {body}"
    );

    let (status, _) = sim
        .post(&format!("/sandboxes/{id}/timeout"), json!({"timeout": 30}))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, _, shortened) = sim.get(&format!("/sandboxes/{id}")).await;
    let left = ms(&shortened["endAt"]) - chrono::Utc::now().timestamp_millis();
    assert!(
        (0..=31_000).contains(&left),
        "timeout sets the TTL from now, got {left} ms"
    );

    let (status, body) = sim
        .post(
            &format!("/sandboxes/{id}/refreshes"),
            json!({"duration": 3601}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    let (status, _) = sim
        .post(
            &format!("/sandboxes/{id}/refreshes"),
            json!({"duration": 600}),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, _, refreshed) = sim.get(&format!("/sandboxes/{id}")).await;
    assert!(ms(&refreshed["endAt"]) > ms(&shortened["endAt"]));
}

#[tokio::test]
async fn create_refuses_long_timeouts_unknown_templates_and_missing_fields() {
    let sim = Sim::with_fleet(0).await;
    let (status, body) = sim
        .post(
            "/sandboxes",
            json!({"templateID": "base", "timeout": 86_401}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    assert_eq!(body["message"], "Timeout cannot be greater than 24 hours");
    let (status, body) = sim
        .post("/sandboxes", json!({"templateID": "no-such-template"}))
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, body) = sim.post("/sandboxes", json!({"timeout": 60})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    assert_eq!(
        sim.state().await["running"],
        0,
        "refused creates change nothing"
    );

    let (status, body) = sim
        .post(
            "/sandboxes",
            json!({"templateID": "code-interpreter-v1", "timeout": 60, "secure": true,
                "autoPause": true, "metadata": {"owner": "alice"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(body["envdAccessToken"].is_string());
    assert_eq!(body["alias"], "code-interpreter-v1");
    let id = body["sandboxID"].as_str().unwrap();
    let (_, _, detail) = sim.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(detail["metadata"]["owner"], "alice");
    assert_eq!(detail["memoryMB"], 4096);
    assert_eq!(detail["lifecycle"]["onTimeout"], "pause");
    let (status, _, legacy) = sim.get(&format!("/sandboxes/{id}-6532622b")).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the legacy <id>-<clientID> form is accepted"
    );
    assert_eq!(legacy["sandboxID"], id);
}

#[tokio::test]
async fn an_expired_sandbox_is_paused_when_it_asked_for_auto_pause_and_killed_otherwise() {
    let sim = Sim::with_fleet(0).await;
    let (_, pausing) = sim
        .post(
            "/sandboxes",
            json!({"templateID": "base", "timeout": 1, "autoPause": true}),
        )
        .await;
    let (_, dying) = sim
        .post("/sandboxes", json!({"templateID": "base", "timeout": 1}))
        .await;
    let pausing = pausing["sandboxID"].as_str().unwrap();
    let dying = dying["sandboxID"].as_str().unwrap();
    // Until its one-second TTL runs out each is running; afterwards one is paused and the
    // other gone. Poll for the end state rather than sleeping past the TTL.
    crate::common::wait_until("the TTLs run out", || async {
        let (_, _, detail) = sim.get(&format!("/sandboxes/{pausing}")).await;
        let (status, _, _) = sim.get(&format!("/sandboxes/{dying}")).await;
        // The two TTLs run out one after the other: either may be over first.
        assert!(
            detail["state"] == "running" || detail["state"] == "paused",
            "an auto-pause sandbox is never killed: {detail}"
        );
        (detail["state"] == "paused" && status == StatusCode::NOT_FOUND).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_snapshot_becomes_a_template_that_spawns_sandboxes_and_is_protected_while_used() {
    let sim = Sim::with_fleet(0).await;
    let source = sim.create("base").await;
    let snap_path = format!("/sandboxes/{source}/snapshots");
    let (status, body) = sim.post(&snap_path, json!({"name": "my-snap"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_required(&body, SNAPSHOT);
    let snapshot_id = body["snapshotID"].as_str().unwrap().to_owned();
    assert_eq!(snapshot_id, "steward-sim/my-snap:default");
    assert_eq!(body["names"], json!(["steward-sim/my-snap:default"]));

    let (status, first) = sim.post(&snap_path, json!({})).await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, second) = sim.post(&snap_path, json!({})).await;
    assert!(first["snapshotID"].as_str().unwrap().ends_with(":default"));
    assert_ne!(
        first["snapshotID"], second["snapshotID"],
        "unnamed snapshots are unique"
    );
    let (status, body) = sim.post(&snap_path, json!({"name": "Bad Name!"})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    let (status, _, body) = sim.send(sim.http.post(sim.url(&snap_path))).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);

    let (_, _, listed) = sim.get(&format!("/snapshots?sandboxID={source}")).await;
    assert_eq!(listed.as_array().unwrap().len(), 3);
    listed
        .as_array()
        .unwrap()
        .iter()
        .for_each(|s| assert_required(s, SNAPSHOT));
    let (_, _, by_name) = sim.get("/snapshots?name=my-snap").await;
    assert_eq!(by_name.as_array().unwrap().len(), 1);

    let (_, _, templates) = sim.get("/v2/templates").await;
    let names: Vec<&Value> = templates
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["names"])
        .collect();
    assert!(
        names.contains(&&json!(["steward-sim/my-snap"])),
        "{templates}"
    );

    let path = format!("/templates/{}", encode(&snapshot_id));
    let (status, _, with_builds) = sim.get(&path).await;
    assert_eq!(status, StatusCode::OK, "{with_builds}");
    assert_required(&with_builds, TEMPLATE_WITH_BUILDS);

    let child = sim.create(&snapshot_id).await;
    let (status, body) = sim.delete(&path).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    let (status, _, _) = sim.get(&path).await;
    assert_eq!(status, StatusCode::OK, "a refused delete changes nothing");

    sim.post(&format!("/sandboxes/{child}/pause"), json!({}))
        .await;
    let (status, _) = sim.delete(&path).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "paused sandboxes count as users too"
    );
    sim.delete(&format!("/sandboxes/{child}")).await;
    let (status, _) = sim.delete(&path).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = sim.delete(&path).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (_, _, gone) = sim.get("/snapshots?name=my-snap").await;
    assert_eq!(gone, json!([]));
}

#[tokio::test]
async fn two_simulators_with_the_same_seed_serve_the_same_fleet_and_metric_series() {
    let opts = SimOptions {
        sandboxes: 40,
        seed: 7,
        ..SimOptions::default()
    };
    let (a, b) = (Sim::start(opts.clone()).await, Sim::start(opts).await);
    let other = Sim::start(SimOptions {
        sandboxes: 40,
        seed: 8,
        ..SimOptions::default()
    })
    .await;
    let fleet_a = a.list_all("state=running").await;
    let mut ids_a = ids(&fleet_a);
    let mut ids_b = ids(&b.list_all("state=running").await);
    ids_a.sort();
    ids_b.sort();
    assert_eq!(ids_a, ids_b);
    let ids_other: HashSet<String> = ids(&other.list_all("").await).into_iter().collect();
    assert!(
        ids_a.iter().all(|id| !ids_other.contains(id)),
        "another seed, another fleet"
    );

    let now = chrono::Utc::now().timestamp();
    let (start, end) = (now - 900, now - 60);
    let old_enough: Vec<&Value> = fleet_a
        .iter()
        .filter(|s| ms(&s["startedAt"]) < (start - 60) * 1000)
        .take(5)
        .collect();
    assert!(!old_enough.is_empty());
    for sandbox in old_enough {
        let path = format!(
            "/sandboxes/{}/metrics?start={start}&end={end}",
            sandbox["sandboxID"].as_str().unwrap()
        );
        let (status, _, series_a) = a.get(&path).await;
        assert_eq!(status, StatusCode::OK);
        let (_, _, series_b) = b.get(&path).await;
        let points = series_a.as_array().unwrap();
        assert!(points.len() > 100, "a 14-minute window has 5 s samples");
        points.iter().for_each(|m| assert_required(m, METRIC));
        assert_eq!(series_a, series_b);
    }
}

#[tokio::test]
async fn idle_sandboxes_stay_flat_busy_ones_work_and_paused_ones_stop_reporting() {
    let sim = Sim::with_fleet(0).await;
    let five_hours_ago = ago(chrono::Duration::hours(5));
    sim.seed(
        json!({"sandboxID": "idlebox", "templateID": "python", "state": "running",
        "startedAt": five_hours_ago, "profile": "idle"}),
    )
    .await;
    sim.seed(
        json!({"sandboxID": "busybox", "templateID": "python", "state": "running",
        "startedAt": five_hours_ago, "profile": "busy"}),
    )
    .await;
    let paused_at = ago(chrono::Duration::hours(2));
    sim.seed(
        json!({"sandboxID": "pausedbox", "templateID": "python", "state": "paused",
        "startedAt": five_hours_ago, "endAt": paused_at, "profile": "busy"}),
    )
    .await;

    let (_, _, idle) = sim.get("/sandboxes/idlebox/metrics").await;
    let idle = idle.as_array().unwrap().clone();
    assert!(
        idle.len() > 300,
        "five hours of samples, got {}",
        idle.len()
    );
    assert!(idle.len() <= 362, "the step widens to cap the points");
    assert!(idle.iter().all(|m| m["cpuUsedPct"].as_f64().unwrap() < 1.0));
    assert!(idle.iter().all(|m| m["diskUsed"] == idle[0]["diskUsed"]));
    assert_eq!(idle[0]["memTotal"], json!(1024i64 * 1024 * 1024));

    let (_, _, busy) = sim.get("/sandboxes/busybox/metrics").await;
    let cpus: Vec<f64> = busy
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["cpuUsedPct"].as_f64().unwrap())
        .collect();
    assert!(cpus.iter().all(|c| (20.0..=90.0).contains(c)));
    let spread =
        cpus.iter().cloned().fold(0.0, f64::max) - cpus.iter().cloned().fold(100.0, f64::min);
    assert!(spread > 10.0, "busy CPU varies, spread {spread}");

    let (_, _, paused) = sim.get("/sandboxes/pausedbox/metrics").await;
    let last = paused.as_array().unwrap().last().unwrap()["timestampUnix"]
        .as_i64()
        .unwrap();
    assert!(
        last * 1000 < ms(&json!(paused_at)),
        "no samples after the pause"
    );

    let (status, _, body) = sim
        .get("/sandboxes/busybox/metrics?start=200&end=100")
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn batch_metrics_cover_running_sandboxes_skip_unknown_ids_and_refuse_over_100() {
    let sim = Sim::with_fleet(0).await;
    sim.seed(
        json!({"sandboxID": "one", "templateID": "base", "state": "running",
        "startedAt": ago(chrono::Duration::minutes(10))}),
    )
    .await;
    sim.seed(
        json!({"sandboxID": "two", "templateID": "node", "state": "running",
        "startedAt": ago(chrono::Duration::minutes(10))}),
    )
    .await;
    let (status, _, body) = sim
        .get("/sandboxes/metrics?sandbox_ids=one,two,ghost")
        .await;
    assert_eq!(status, StatusCode::OK);
    let map = body["sandboxes"].as_object().unwrap();
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    assert_eq!(keys, ["one", "two"]);
    map.values().for_each(|m| assert_required(m, METRIC));
    assert_eq!(map["two"]["memTotal"], json!(2048i64 * 1024 * 1024));

    let many: Vec<String> = (0..101).map(|i| format!("s{i}")).collect();
    let (status, _, body) = sim
        .get(&format!(
            "/sandboxes/metrics?sandbox_ids={}",
            many.join(",")
        ))
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    let (status, _, body) = sim.get("/sandboxes/metrics").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn team_metrics_answer_for_the_own_team_and_403_for_any_other() {
    let sim = Sim::with_fleet(60).await;
    let team = sim.server.team_id().to_owned();
    let (status, _, body) = sim.get("/teams/someone-else/metrics").await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
    assert_eq!(
        body["message"],
        format!("You ({team}) are not authorized to access this team's (someone-else) metrics")
    );

    let now = chrono::Utc::now().timestamp();
    let (status, _, series) = sim
        .get(&format!(
            "/teams/{team}/metrics?start={}&end={now}",
            now - 3600
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
    let points = series.as_array().unwrap();
    assert!(!points.is_empty());
    points.iter().for_each(|p| assert_required(p, TEAM_METRIC));
    let state = sim.state().await;
    let latest = points.last().unwrap()["concurrentSandboxes"]
        .as_i64()
        .unwrap();
    assert_eq!(
        latest,
        state["running"].as_i64().unwrap(),
        "the last point counts running sandboxes"
    );

    let (status, _, max) = sim
        .get(&format!(
            "/teams/{team}/metrics/max?metric=concurrent_sandboxes"
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_required(&max, MAX_TEAM_METRIC);
    assert!(max["value"].as_f64().unwrap() >= latest as f64);
    let (status, _, body) = sim.get(&format!("/teams/{team}/metrics/max")).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_api_key_is_required_when_configured_but_not_for_admin_routes() {
    let sim = Sim::start(SimOptions {
        sandboxes: 3,
        api_key: Some("e2b_0123abcd".to_owned()),
        ..SimOptions::default()
    })
    .await;
    let (status, _, body) = sim.get("/v2/sandboxes").await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED);
    let (status, _, body) = sim
        .send(
            sim.http
                .get(sim.url("/v2/sandboxes"))
                .header("X-API-Key", "e2b_wrong"),
        )
        .await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED);
    let (status, _, body) = sim
        .send(
            sim.http
                .get(sim.url("/v2/sandboxes"))
                .header("X-API-KEY", "e2b_0123abcd"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.as_array().unwrap().len(), 3);
    let (status, _, _) = sim.get("/_sim/state").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !format!(
            "{:?}",
            SimOptions {
                api_key: Some("e2b_0123abcd".into()),
                ..SimOptions::default()
            }
        )
        .contains("0123abcd")
    );
}

#[tokio::test]
async fn injected_faults_fail_exactly_the_next_matching_calls_and_are_counted() {
    let sim = Sim::with_fleet(5).await;
    let (status, _) = sim
        .post(
            "/_sim/faults",
            json!({"op": "list", "status": 429, "count": 2, "retry_after_secs": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    for _ in 0..2 {
        let (status, headers, body) = sim.get("/v2/sandboxes").await;
        assert_error(status, &body, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(headers["retry-after"], "3");
        let (status, _, _) = sim.get("/v2/templates").await;
        assert_eq!(status, StatusCode::OK, "other ops are untouched");
    }
    let (status, _, _) = sim.get("/v2/sandboxes").await;
    assert_eq!(status, StatusCode::OK);

    let running_before = sim.state().await["running"].clone();
    sim.post("/_sim/faults", json!({"op": null, "status": 503, "count": 1, "error_code": "sandbox_capacity_unavailable"}))
        .await;
    let (status, body) = sim.post("/sandboxes", json!({"templateID": "base"})).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error_code"], "sandbox_capacity_unavailable");
    assert_eq!(
        sim.state().await["running"],
        running_before,
        "a faulted create creates nothing"
    );

    let (status, body) = sim
        .post("/_sim/faults", json!({"op": "explode", "status": 500}))
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    let (status, body) = sim.post("/_sim/faults", json!({"status": 418})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);

    let calls = sim.calls().await;
    assert_eq!(
        calls,
        json!({"list": 3, "templates": 2, "create": 1, "create-v1": 1})
    );
    let (status, _) = sim.post("/_sim/calls/reset", json!({})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(sim.calls().await, json!({}));
}

#[tokio::test]
async fn a_fault_after_handling_answers_502_but_the_change_happened() {
    let sim = Sim::with_fleet(0).await;
    let hooks = sim.server.hooks();
    let victim = sim.create("base").await;
    hooks.fault_after("kill", 502, 1).await.unwrap();
    let (status, body) = sim.delete(&format!("/sandboxes/{victim}")).await;
    assert_error(status, &body, StatusCode::BAD_GATEWAY);
    let (status, _, _) = sim.get(&format!("/sandboxes/{victim}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the kill happened");

    let source = sim.create("base").await;
    hooks.fault_after("snapshot", 502, 1).await.unwrap();
    let (status, body) = sim
        .post(&format!("/sandboxes/{source}/snapshots"), json!({}))
        .await;
    assert_error(status, &body, StatusCode::BAD_GATEWAY);
    assert_eq!(sim.state().await["snapshots"], 1, "the snapshot was taken");
    let (status, body) = sim
        .post(
            "/_sim/faults",
            json!({"op": "kill", "status": 502, "when": "later"}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_snapshot_pauses_a_running_sandbox_briefly_and_it_runs_on_in_a_new_run() {
    let sim = Sim::with_fleet(0).await;
    let seeded = sim
        .seed(
            json!({"sandboxID": "snapme", "templateID": "base", "state": "running",
            "startedAt": chrono::Utc::now() - chrono::Duration::minutes(30)}),
        )
        .await;
    let (status, _) = sim.post("/sandboxes/snapme/snapshots", json!({})).await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, _, after) = sim.get("/sandboxes/snapme").await;
    assert_eq!(after["state"], "running");
    assert_eq!(after["endAt"], seeded["endAt"], "its timeout is kept");
    assert!(
        after["startedAt"].as_str().unwrap() > seeded["startedAt"].as_str().unwrap(),
        "a new run: {after}"
    );
}

#[tokio::test]
async fn seeding_or_changing_a_sandbox_refuses_unknown_states_and_profiles_and_changes_nothing() {
    let sim = Sim::with_fleet(0).await;
    let refusals = [
        (
            json!({"templateID": "base", "state": "gone"}),
            "state \"gone\" must be running or paused",
        ),
        (
            json!({"templateID": "base", "state": "running", "profile": "lazy"}),
            "profile \"lazy\" must be busy, idle or disk-growing",
        ),
    ];
    for (body, message) in refusals {
        let (status, answer) = sim.post("/_sim/sandboxes", body).await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST);
        assert_eq!(answer["message"], message);
    }
    assert_eq!(sim.state().await["running"], 0, "nothing was seeded");

    sim.seed(json!({"sandboxID": "steady", "templateID": "base", "state": "running"}))
        .await;
    for (body, message) in [
        (
            json!({"state": "gone"}),
            "state \"gone\" must be running or paused",
        ),
        (
            json!({"profile": "lazy"}),
            "profile \"lazy\" must be busy, idle or disk-growing",
        ),
    ] {
        let (status, _, answer) = sim
            .send(
                sim.http
                    .patch(sim.url("/_sim/sandboxes/steady"))
                    .json(&body),
            )
            .await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST);
        assert_eq!(answer["message"], message);
    }
    let (_, _, after) = sim.get("/sandboxes/steady").await;
    assert_eq!(
        after["state"], "running",
        "the sandbox is unchanged: {after}"
    );
}

#[tokio::test]
async fn a_sandbox_can_be_changed_behind_stewards_back() {
    let sim = Sim::with_fleet(0).await;
    let hooks = sim.server.hooks();
    let seeded = sim
        .seed(
            json!({"sandboxID": "changeme", "templateID": "base", "state": "paused",
            "profile": "idle"}),
        )
        .await;
    let resumed = hooks
        .change(
            "changeme",
            json!({"state": "running", "metadata": {"owner": "ana"}}),
        )
        .await
        .unwrap();
    assert_eq!(resumed["state"], "running");
    assert_eq!(resumed["metadata"], json!({"owner": "ana"}));
    assert_ne!(resumed["startedAt"], seeded["startedAt"]);
    let restarted = hooks
        .change("changeme", json!({"restart": true, "profile": "busy"}))
        .await
        .unwrap();
    assert!(restarted["startedAt"].as_str() >= resumed["startedAt"].as_str());
    assert!(
        hooks
            .change("changeme", json!({"state": "gone"}))
            .await
            .is_err()
    );
    assert!(hooks.change("nosuch", json!({})).await.is_err());
    assert!(
        hooks
            .change("changeme", json!({"colour": "red"}))
            .await
            .is_err(),
        "unknown fields are refused"
    );
    assert_eq!(sim.calls().await, json!({}), "hooks are not API calls");
}

#[tokio::test]
async fn random_faults_at_the_configured_rate_are_e2b_shaped_and_deterministic() {
    let run = || async {
        let sim = Sim::start(SimOptions {
            sandboxes: 2,
            fault_rate: 0.5,
            seed: 3,
            ..SimOptions::default()
        })
        .await;
        let mut statuses = Vec::new();
        for _ in 0..40 {
            let (status, headers, body) = sim.get("/v2/sandboxes").await;
            if status != StatusCode::OK {
                assert_eq!(body["code"], json!(status.as_u16()));
                if status == StatusCode::TOO_MANY_REQUESTS {
                    assert_eq!(headers["retry-after"], "1");
                }
            }
            statuses.push(status.as_u16());
        }
        statuses
    };
    let first = run().await;
    let failures = first.iter().filter(|s| **s != 200).count();
    assert!(
        (5..=35).contains(&failures),
        "{failures} of 40 failed at rate 0.5"
    );
    assert_eq!(first, run().await, "the same seed fails the same requests");
}

#[tokio::test]
async fn repeat_and_endless_paging_modes_sabotage_the_next_token() {
    let sim = Sim::with_fleet(30).await;
    sim.post("/_sim/paging", json!({"mode": "repeat"})).await;
    let (_, headers, _) = sim.get("/v2/sandboxes?limit=10").await;
    let token = headers["x-next-token"].to_str().unwrap().to_owned();
    let (status, headers, _) = sim
        .get(&format!("/v2/sandboxes?limit=10&nextToken={token}"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-next-token"].to_str().unwrap(), token);

    sim.post("/_sim/paging", json!({"mode": "endless"})).await;
    let mut seen = HashSet::new();
    let mut token = String::new();
    for _ in 0..5 {
        let (status, headers, _) = sim
            .get(&format!("/v2/sandboxes?limit=100&nextToken={token}"))
            .await;
        assert_eq!(status, StatusCode::OK);
        token = headers["x-next-token"].to_str().unwrap().to_owned();
        assert!(
            seen.insert(token.clone()),
            "endless tokens are always fresh"
        );
    }
    let (_, headers, _) = sim.get("/v2/templates?limit=100").await;
    assert!(
        headers.contains_key("x-next-token"),
        "every list is sabotaged"
    );

    let (status, body) = sim.post("/_sim/paging", json!({"mode": "sideways"})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    sim.post("/_sim/paging", json!({"mode": "normal"})).await;
    assert_eq!(sim.list_all("limit=10").await.len(), 30);
}

#[tokio::test]
async fn a_fleet_of_100000_sandboxes_starts_and_lists_its_first_pages() {
    let sim = Sim::with_fleet(100_000).await;
    let state = sim.state().await;
    assert_eq!(
        state["running"].as_u64().unwrap() + state["paused"].as_u64().unwrap(),
        100_000
    );
    let (status, headers, page) = sim.get("/v2/sandboxes").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page.as_array().unwrap().len(), 100);
    let token = headers["x-next-token"].to_str().unwrap().to_owned();
    let (_, _, second) = sim.get(&format!("/v2/sandboxes?nextToken={token}")).await;
    assert_eq!(second.as_array().unwrap().len(), 100);
    assert_ne!(page[0]["sandboxID"], second[0]["sandboxID"]);
    let batch: Vec<&str> = page
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sandboxID"].as_str().unwrap())
        .collect();
    let (status, _, metrics) = sim
        .get(&format!(
            "/sandboxes/metrics?sandbox_ids={}",
            batch.join(",")
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(!metrics["sandboxes"].as_object().unwrap().is_empty());
}

#[tokio::test]
async fn the_seeded_fleet_mixes_states_owners_templates_and_long_paused_sandboxes() {
    let sim = Sim::with_fleet(500).await;
    let fleet = sim.list_all("").await;
    let paused: Vec<&Value> = fleet.iter().filter(|s| s["state"] == "paused").collect();
    assert!(
        paused.len() > 100 && paused.len() < 300,
        "{} paused",
        paused.len()
    );
    let days_ago = chrono::Utc::now().timestamp_millis() - 2 * 86_400_000;
    assert!(
        paused.iter().any(|s| ms(&s["endAt"]) < days_ago),
        "some paused for days"
    );
    assert!(fleet.iter().any(|s| s["metadata"]["owner"] == "alice"));
    assert!(
        fleet
            .iter()
            .any(|s| s["metadata"]["steward.keep"] == "2026-12-31")
    );
    let aliases: HashSet<&str> = fleet.iter().filter_map(|s| s["alias"].as_str()).collect();
    assert!(aliases.len() >= 4, "{aliases:?}");
    let now = chrono::Utc::now().timestamp_millis();
    for s in fleet.iter().filter(|s| s["state"] == "running") {
        assert!(
            ms(&s["endAt"]) > now,
            "running sandboxes expire in the future"
        );
        assert!(ms(&s["endAt"]) - ms(&s["startedAt"]) <= 86_400_000);
    }
}

#[tokio::test]
async fn logs_read_newest_first_by_default_and_filter_by_level_and_search() {
    let sim = Sim::with_fleet(0).await;
    sim.seed(
        json!({"sandboxID": "chatty", "templateID": "base", "state": "running",
        "startedAt": ago(chrono::Duration::hours(1)), "profile": "busy"}),
    )
    .await;
    let (status, _, body) = sim.get("/v2/sandboxes/chatty/logs?limit=50").await;
    assert_eq!(status, StatusCode::OK);
    let logs = body["logs"].as_array().unwrap();
    assert_eq!(logs.len(), 50);
    logs.iter().for_each(|l| assert_required(l, LOG_ENTRY));
    let times: Vec<i64> = logs.iter().map(|l| ms(&l["timestamp"])).collect();
    assert!(
        times.windows(2).all(|w| w[0] > w[1]),
        "backward is newest first"
    );

    let (_, _, forward) = sim
        .get("/v2/sandboxes/chatty/logs?limit=5&direction=forward")
        .await;
    let times: Vec<i64> = forward["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| ms(&l["timestamp"]))
        .collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]));
    let cursor = times[2];
    let (_, _, from_cursor) = sim
        .get(&format!(
            "/v2/sandboxes/chatty/logs?limit=2&direction=forward&cursor={cursor}"
        ))
        .await;
    assert_eq!(
        ms(&from_cursor["logs"][0]["timestamp"]),
        cursor,
        "the cursor bound is inclusive"
    );

    let (_, _, errors) = sim.get("/v2/sandboxes/chatty/logs?level=warn").await;
    let errors = errors["logs"].as_array().unwrap();
    assert!(!errors.is_empty());
    assert!(
        errors
            .iter()
            .all(|l| l["level"] == "warn" || l["level"] == "error")
    );
    let (_, _, found) = sim.get("/v2/sandboxes/chatty/logs?search=process").await;
    let found = found["logs"].as_array().unwrap();
    assert!(!found.is_empty());
    assert!(
        found
            .iter()
            .all(|l| l["message"].as_str().unwrap().contains("process"))
    );
    let (_, _, none) = sim.get("/v2/sandboxes/chatty/logs?search=PROCESS").await;
    assert_eq!(none["logs"], json!([]), "search is case-sensitive");
    let (status, _, body) = sim.get("/v2/sandboxes/chatty/logs?limit=1001").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn templates_page_with_every_required_field_and_show_their_builds() {
    let sim = Sim::with_fleet(20).await;
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let (status, headers, page) = sim
            .get(&format!("/v2/templates?limit=2&nextToken={token}"))
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        all.extend(page.as_array().unwrap().iter().cloned());
        match headers.get("x-next-token") {
            Some(t) => token = t.to_str().unwrap().to_owned(),
            None => break,
        }
    }
    assert_eq!(all.len(), 5);
    all.iter().for_each(|t| assert_required(t, TEMPLATE));
    let base = all
        .iter()
        .find(|t| t["aliases"] == json!(["base"]))
        .unwrap();
    assert_eq!(base["buildStatus"], "ready");

    let (status, _, with_builds) = sim.get("/templates/base").await;
    assert_eq!(status, StatusCode::OK);
    assert_required(&with_builds, TEMPLATE_WITH_BUILDS);
    assert_eq!(with_builds["templateID"], base["templateID"]);
    let builds = with_builds["builds"].as_array().unwrap();
    assert_eq!(builds.len(), 1);
    assert_required(&builds[0], BUILD);
    assert!(uuid::Uuid::parse_str(builds[0]["buildID"].as_str().unwrap()).is_ok());

    let (status, _, body) = sim.get("/templates/nope").await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, _, body) = sim.get("/v2/templates?teamID=another-team").await;
    assert_error(status, &body, StatusCode::FORBIDDEN);
}

/// `POST /v2/sandboxes` and `POST /v2/sandboxes/{id}/connect` with the bodies e2b 2.63's
/// generated client sends (`NewSandboxV2`, `ConnectSandboxV2`), answered with `Sandbox`.
#[tokio::test]
async fn v2_create_and_connect_take_the_sdks_bodies_and_are_always_secured() {
    let sim = Sim::with_fleet(0).await;
    let before = chrono::Utc::now();
    let (status, created) = sim
        .post(
            "/v2/sandboxes",
            json!({"templateID": "base", "autoPause": false, "autoPauseMemory": true,
                "metadata": {"owner": "zoë"}, "envVars": {"A": "1"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_required(&created, SANDBOX);
    assert_eq!(created["envdVersion"], "0.6.4");
    assert!(
        created["envdAccessToken"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "a v2 sandbox is always secured: {created}"
    );
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    // No timeout given: v2's default is 300 s (v1's create defaults to 15 s).
    let (_, _, detail) = sim.get(&format!("/sandboxes/{id}")).await;
    let end = chrono::DateTime::parse_from_rfc3339(detail["endAt"].as_str().unwrap()).unwrap();
    let ttl = (end.with_timezone(&chrono::Utc) - before).num_seconds();
    assert!((295..=305).contains(&ttl), "ttl {ttl}");
    assert_eq!(detail["metadata"]["owner"], "zoë");

    let (status, body) = sim
        .post(
            "/v2/sandboxes",
            json!({"templateID": "base", "envVars": {"A=B": "1"}}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    let (status, body) = sim
        .post(
            "/v2/sandboxes",
            json!({"templateID": "base", "autoPause": true, "autoPauseMemory": false,
                "autoResume": {"enabled": true}}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);

    // Connect without a timeout (optional in v2) to a running sandbox: 200 with `Sandbox`.
    let (status, connected) = sim
        .post(&format!("/v2/sandboxes/{id}/connect"), json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{connected}");
    assert_required(&connected, SANDBOX);
    let (status, _) = sim.post(&format!("/sandboxes/{id}/pause"), json!({})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, resumed) = sim
        .post(
            &format!("/v2/sandboxes/{id}/connect"),
            json!({"timeout": 60, "memory": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{resumed}");
    let (status, body) = sim
        .post("/v2/sandboxes/inosuch/connect", json!({"timeout": 60}))
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let calls = sim.calls().await;
    assert_eq!(calls["create-v2"], 3, "{calls}");
    assert_eq!(calls["connect-v2"], 3, "{calls}");
    assert!(calls.get("create-v1").is_none(), "{calls}");
}

/// `--v1-only`: an older self-hosted E2B, whose v2 create and connect are E2B's JSON 404.
#[tokio::test]
async fn an_e2b_without_v2_routes_answers_them_404_and_serves_v1() {
    let sim = Sim::start(SimOptions {
        sandboxes: 0,
        v1_only: true,
        envd_version: "0.4.1".into(),
        ..SimOptions::default()
    })
    .await;
    let (status, body) = sim
        .post("/v2/sandboxes", json!({"templateID": "base"}))
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    assert_eq!(sim.state().await["running"], 0, "nothing was created");
    let (status, created) = sim
        .post("/sandboxes", json!({"templateID": "base", "timeout": 60}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["envdVersion"], "0.4.1");
    assert!(
        created.get("envdAccessToken").is_none(),
        "v1 secures only when asked"
    );
    let id = created["sandboxID"].as_str().unwrap();
    let (status, body) = sim
        .post(
            &format!("/v2/sandboxes/{id}/connect"),
            json!({"timeout": 60}),
        )
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, _) = sim
        .post(&format!("/sandboxes/{id}/connect"), json!({"timeout": 60}))
        .await;
    assert_eq!(status, StatusCode::OK);

    let bad = SimServer::start(SimOptions {
        envd_version: "latest".into(),
        ..SimOptions::default()
    })
    .await;
    assert!(bad.is_err(), "--envd-version must be a version");
}
