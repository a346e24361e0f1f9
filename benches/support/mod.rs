//! What several benchmarks share: the E2B simulator on its own thread and runtime, the
//! process's peak memory, numbers read from the environment, and Steward's settings.
#![allow(dead_code)]

use std::collections::HashMap;

use sandbox_steward::sim::e2b::{SimOptions, SimServer};

/// Redis at `REDIS_URL` (default the local one) and a fresh key prefix `bench-NAME-…` for a
/// bench's keys, so it never reads another run's.
pub fn redis_and_prefix(name: &str) -> (String, String) {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    (
        url,
        format!("bench-{name}-{}", uuid::Uuid::new_v4().simple()),
    )
}

/// The environment `Settings::load` reads for a Steward in the bench's process: listening on a
/// free port, plus `vars`.
pub fn steward_env<const N: usize>(vars: [(&str, String); N]) -> HashMap<String, String> {
    std::iter::once(("STEWARD_LISTEN", "127.0.0.1:0".to_owned()))
        .chain(vars)
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

/// The number in environment variable `name`, or `default` when it is unset or not a number.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `p` quantile (0.0 to 1.0) of `sorted`, the nearest sample's value; `sorted` is not empty.
pub fn percentile(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// `d` in milliseconds.
pub fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `VmHWM` (peak resident memory) of this process, in MiB.
pub fn peak_memory_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The simulator on its own thread and runtime, as E2B would be on its own machines: its
/// request handling must not queue behind the sweep's tasks (or the other way round).
pub struct SimThread {
    base_url: String,
    team_id: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SimThread {
    pub fn start(opts: SimOptions) -> anyhow::Result<SimThread> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("the simulator's runtime starts");
            runtime.block_on(async move {
                match SimServer::start(opts).await {
                    Ok(sim) => {
                        let _ = ready_tx.send(Ok((sim.base_url(), sim.team_id().to_owned())));
                        let _ = stopped.await;
                        sim.shutdown().await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                    }
                }
            });
        });
        let (base_url, team_id) = ready_rx.recv()?.map_err(anyhow::Error::msg)?;
        Ok(SimThread {
            base_url,
            team_id,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn base_url(&self) -> String {
        self.base_url.clone()
    }

    pub fn team_id(&self) -> &str {
        &self.team_id
    }

    pub fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A `redis-server` of the bench's own on a free port (no persistence), killed when dropped, so
/// what a bench counts in it (`INFO`) is the bench's alone.
pub struct OwnRedis {
    child: std::process::Child,
    pub url: String,
}

impl OwnRedis {
    pub fn start() -> anyhow::Result<OwnRedis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let redis = OwnRedis {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        };
        let client = redis::Client::open(redis.url.as_str())?;
        let started = std::time::Instant::now();
        while client.get_connection().is_err() {
            anyhow::ensure!(
                started.elapsed() < std::time::Duration::from_secs(5),
                "redis-server did not answer"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(redis)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
