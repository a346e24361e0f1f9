//! A real 3-node Redis Cluster for the store suite (`store_suite::cluster::*`), started from the
//! `redis-server` and `redis-cli` binaries on free ports the first time a test asks for it and
//! shared by every cluster test in this binary (each test uses its own key prefix).
//!
//! Each node runs under `sh`, which kills it when the test binary's end of its stdin pipe closes
//! (the binary exited), so no node outlives the tests, then removes the node's file and tries
//! the directory (the last node's removal succeeds): the cluster lives in a static that is never
//! dropped, so nothing else would. Without the binaries the tests fail with a sentence saying so.
use sandbox_steward::store::Lane;
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use sandbox_steward::store::Store;

/// How long the cluster may take to start and agree on its slots.
const CLUSTER_PATIENCE: Duration = Duration::from_secs(60);

/// The running nodes: their ports, and the pipes that keep them alive.
struct Cluster {
    ports: Vec<u16>,
    _keep_alive: Mutex<Vec<(Child, ChildStdin)>>,
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

/// A free port whose cluster bus port (port + 10000) is free too.
fn free_port_pair() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn query(port: u16, cmd: &mut redis::Cmd) -> Result<String, String> {
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}")).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(1))
        .map_err(|e| e.to_string())?;
    cmd.query(&mut conn).map_err(|e| e.to_string())
}

/// Polls `check` until it holds or the cluster's patience runs out.
fn wait_until(what: &str, check: impl FnMut() -> bool) -> Result<(), String> {
    if crate::common::poll_for_blocking(CLUSTER_PATIENCE, check) {
        Ok(())
    } else {
        Err(format!("the test Redis Cluster never got ready: {what}"))
    }
}

fn start() -> Result<Cluster, String> {
    for binary in ["redis-server", "redis-cli"] {
        let found = Command::new(binary)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Err(format!(
                "the cluster tests need `{binary}` on PATH to start a 3-node Redis Cluster"
            ));
        }
    }
    // Kept: the nodes' scripts remove it when the binary exits (see the module's comment).
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?.keep();
    let mut nodes = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..3 {
        let port = free_port_pair();
        let script = format!(
            "redis-server --port {port} --bind 127.0.0.1 --cluster-enabled yes \
             --cluster-config-file nodes-{port}.conf --dir '{dir}' --save '' --appendonly no \
             --loglevel warning >/dev/null 2>&1 & pid=$!; read _; kill $pid; wait $pid; \
             rm -f '{dir}/nodes-{port}.conf'; rmdir '{dir}' 2>/dev/null; true",
            dir = dir.display()
        );
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| format!("could not start redis-server: {e}"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        nodes.push((child, stdin));
        ports.push(port);
    }
    for port in &ports {
        wait_until(&format!("node {port} answers PING"), || {
            query(*port, &mut redis::cmd("PING")).is_ok()
        })?;
    }
    let created = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .map_err(|e| format!("could not run redis-cli: {e}"))?;
    if !created.status.success() {
        return Err(format!(
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&created.stdout)
        ));
    }
    for port in &ports {
        wait_until(&format!("node {port} says cluster_state:ok"), || {
            query(*port, redis::cmd("CLUSTER").arg("INFO"))
                .is_ok_and(|info| info.contains("cluster_state:ok"))
        })?;
    }
    Ok(Cluster {
        ports,
        _keep_alive: Mutex::new(nodes),
    })
}

/// The shared cluster's ports, starting it on first use.
async fn cluster_ports() -> Vec<u16> {
    let started = tokio::task::spawn_blocking(|| {
        CLUSTER
            .get_or_init(start)
            .as_ref()
            .map(|c| c.ports.clone())
            .map_err(Clone::clone)
    })
    .await
    .unwrap();
    started.unwrap_or_else(|sentence| panic!("{sentence}"))
}

/// Deletes a test's keys from every node when dropped (one key at a time: they live in many
/// slots).
pub struct ClusterCleanup {
    ports: Vec<u16>,
    prefix: String,
}

impl Drop for ClusterCleanup {
    fn drop(&mut self) {
        for port in &self.ports {
            let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) else {
                continue;
            };
            let Ok(mut conn) = client.get_connection() else {
                continue;
            };
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{}:*", self.prefix))
                .query(&mut conn)
                .unwrap_or_default();
            for key in keys {
                let _: Result<i64, _> = redis::cmd("DEL").arg(key).query(&mut conn);
            }
        }
    }
}

/// A store on the shared cluster under a fresh prefix, reached through the documented
/// `redis+cluster://` URL naming two of the three nodes (the third is discovered).
pub async fn cluster_store() -> (Store, ClusterCleanup) {
    let ports = cluster_ports().await;
    let prefix = format!("steward-cluster-{}", uuid::Uuid::new_v4().simple());
    let url = format!(
        "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
        ports[0], ports[1]
    );
    let store = Store::redis(&url, &prefix)
        .await
        .unwrap_or_else(|e| panic!("the store could not connect to the test cluster: {e}"));
    (store, ClusterCleanup { ports, prefix })
}

/// The keys of a store really are spread over the cluster's nodes (so the suite's scripts and
/// pipelines did cross nodes and stayed within slots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_store_spreads_its_shards_over_every_node() {
    use sandbox_steward::cases::Subject;
    use sandbox_steward::ids::SandboxId;
    use sandbox_steward::store::{Actor, AuditEvent};

    let (store, cleanup) = cluster_store().await;
    for n in 0..64 {
        let subject = Subject::Sandbox(SandboxId::parse(format!("spread{n}")).unwrap());
        store
            .append_audit(&AuditEvent {
                time: chrono::Utc::now(),
                case: None,
                subject: Some(subject),
                actor: Actor::Steward {
                    part: "test".into(),
                },
                action: "spread".into(),
                outcome: "ok".into(),
            })
            .await
            .unwrap();
    }
    for port in &cleanup.ports {
        let keys: Vec<String> = {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
            let mut conn = client.get_connection().unwrap();
            redis::cmd("KEYS")
                .arg(format!("{}:audit:*", cleanup.prefix))
                .query(&mut conn)
                .unwrap()
        };
        assert!(
            !keys.is_empty(),
            "node {port} holds none of the store's keys"
        );
    }
    let mut out = Vec::new();
    let written = sandbox_steward::approvals::history::export(
        &store,
        chrono::Utc::now() - chrono::Duration::hours(1),
        &mut out,
    )
    .await
    .unwrap();
    assert_eq!(written, 64);
}

/// The service connects lazily (it starts while Redis is down); on a cluster that first use
/// connects, creates the queue's consumer group and hands out a job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazily_connected_cluster_store_connects_on_first_use() {
    use sandbox_steward::ids::CaseId;
    use sandbox_steward::store::Job;

    let ports = cluster_ports().await;
    let prefix = format!("steward-cluster-{}", uuid::Uuid::new_v4().simple());
    let _cleanup = ClusterCleanup {
        ports: ports.clone(),
        prefix: prefix.clone(),
    };
    let url = format!("redis+cluster://127.0.0.1:{}", ports[2]);
    let store = Store::redis_lazy(&url, &prefix).unwrap();
    store.ping().await.unwrap();
    let job = Job::RunDecision {
        case_id: CaseId::generate(),
        option: sandbox_steward::cases::DecisionOption::Kill,
        attempt: 1,
    };
    store.enqueue(&job).await.unwrap();
    let claimed = store
        .claim(Lane::Decisions, "worker-a", Duration::from_secs(1))
        .await
        .unwrap()
        .expect("the job is handed out");
    assert_eq!(claimed.job, job);
    store.ack(&claimed.id).await.unwrap();
}
