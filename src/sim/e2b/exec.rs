//! What the simulated sandboxes hold on this machine: one scratch directory per sandbox (its
//! filesystem, `/` of the sandbox mapped under it), the local processes started through envd
//! (`--exec local`), and live metric samples read from `/proc` while they run.
//!
//! `Exec` is plain state behind one mutex, plus the few blocking or process-spawning helpers that
//! act on it. It knows nothing of HTTP, Connect or the world's rules; the envd handlers drive it,
//! and the world guard in `mod.rs` tells it when a sandbox is paused (its processes are killed)
//! or killed (its processes and scratch directory go). Lock order: the world's lock may be held
//! while this one is taken, never the other way round.
//!
//! It must never run a command with the host's environment, outside the sandbox's scratch
//! directory, or let a sandbox path with `..` reach the host filesystem.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::series::Ms;

/// The sandbox user's home, the default working directory and the base of relative paths.
pub(crate) const HOME: &str = "/home/user";
/// The only variables a command sees besides the ones its request sets.
pub(crate) const BASE_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// Live samples are kept on the metrics grid for this many buckets (a day of 5 s buckets).
const MAX_BUCKETS: usize = 17_280;
/// Process log lines kept per sandbox.
pub(crate) const MAX_NOTES: usize = 10_000;
/// Linux reports CPU times in clock ticks of 1/100 s (`USER_HZ`) on every architecture we run on.
const CLOCK_TICKS_PER_SEC: f64 = 100.0;
/// RSS in `/proc/<pid>/stat` is counted in pages.
const PAGE_BYTES: i64 = 4096;

/// Whether envd's `Start` runs commands (`--exec local`) or refuses them (the default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecMode {
    /// `process.Process/Start` answers `failed_precondition`; files still work.
    #[default]
    Off,
    /// Commands run as local processes of this machine, in a per-sandbox scratch directory.
    Local,
}

/// One live sample on the metrics grid: the most the sandbox's processes used in that bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LiveSample {
    pub cpu_used_pct: f64,
    pub mem_used: i64,
    pub disk_used: i64,
}

/// A started process, as envd knows it.
struct Proc {
    /// Its process group (the same number as its pid: it leads its own group).
    pgid: u32,
}

/// One sandbox's footprint on this machine.
struct Workspace {
    dir: PathBuf,
    procs: HashMap<u32, Proc>,
    /// When its first process started: from then on its metrics are live, not generated.
    exec_since: Option<Ms>,
    /// Live samples by grid second (a multiple of 5).
    buckets: BTreeMap<i64, LiveSample>,
    /// CPU ticks per pid at the previous sample, so a sample measures only its own interval.
    last_ticks: HashMap<u32, u64>,
    last_sample_ms: Option<Ms>,
    disk_used: i64,
}

/// What the sampler reads for one sandbox: its process groups and where its disk is.
pub(crate) struct SampleTarget {
    pub sandbox: String,
    pub pgids: HashSet<u32>,
    pub dir: PathBuf,
}

/// What the sampler measured for one sandbox.
pub(crate) struct Measured {
    pub sandbox: String,
    /// Ticks (utime + stime + cutime + cstime) per live member of its groups.
    pub ticks: HashMap<u32, u64>,
    pub rss_bytes: i64,
    pub disk_bytes: i64,
}

pub(crate) struct Exec {
    pub mode: ExecMode,
    root: PathBuf,
    state: Mutex<HashMap<String, Workspace>>,
    /// Set by [`Exec::shutdown`], under the state's lock: from then on no scratch directory is
    /// made. A request still in flight when the simulator stops (its connection outlives the
    /// server task) would otherwise make the removed root again, and nothing would remove it.
    closed: AtomicBool,
}

impl Exec {
    /// A fresh scratch root under the system's temporary directory (mode 0700).
    pub fn new(mode: ExecMode) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let root =
            std::env::temp_dir().join(format!("steward-sim-{}", uuid::Uuid::new_v4().simple()));
        std::fs::DirBuilder::new().mode(0o700).create(&root)?;
        Ok(Self {
            mode,
            root,
            state: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        })
    }

    fn state(&self) -> MutexGuard<'_, HashMap<String, Workspace>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sandbox's scratch directory, created (with `home/user`) on first use; an error once
    /// the simulator is stopping.
    pub fn workspace(&self, sandbox: &str) -> std::io::Result<PathBuf> {
        let mut state = self.state();
        if self.closed.load(Ordering::Relaxed) {
            return Err(std::io::Error::other("the simulator is stopping"));
        }
        if let Some(ws) = state.get(sandbox) {
            return Ok(ws.dir.clone());
        }
        let dir = self.root.join(sandbox);
        std::fs::create_dir_all(host_path(&dir, HOME))?;
        state.insert(
            sandbox.to_owned(),
            Workspace {
                dir: dir.clone(),
                procs: HashMap::new(),
                exec_since: None,
                buckets: BTreeMap::new(),
                last_ticks: HashMap::new(),
                last_sample_ms: None,
                disk_used: 0,
            },
        );
        Ok(dir)
    }

    /// Records a started process; its sandbox's metrics are live from `now` on.
    pub fn register(&self, sandbox: &str, pid: u32, now: Ms) {
        if let Some(ws) = self.state().get_mut(sandbox) {
            ws.procs.insert(pid, Proc { pgid: pid });
            ws.exec_since.get_or_insert(now);
        }
    }

    pub fn unregister(&self, sandbox: &str, pid: u32) {
        if let Some(ws) = self.state().get_mut(sandbox) {
            ws.procs.remove(&pid);
        }
    }

    /// The process group of a process this sandbox started and that is still running.
    pub fn group_of(&self, sandbox: &str, pid: u32) -> Option<u32> {
        self.state()
            .get(sandbox)
            .and_then(|ws| ws.procs.get(&pid))
            .map(|p| p.pgid)
    }

    /// Sandboxes were paused (`remove == false`) or killed (`true`): their processes are killed,
    /// and a killed sandbox's scratch directory is removed. The work happens off the caller's
    /// thread, because the caller holds the world's lock.
    pub fn stop(&self, ended: Vec<(String, bool)>) {
        let mut groups = Vec::new();
        let mut dirs = Vec::new();
        {
            let mut state = self.state();
            for (sandbox, remove) in ended {
                if remove {
                    if let Some(ws) = state.remove(&sandbox) {
                        groups.extend(ws.procs.values().map(|p| p.pgid));
                        dirs.push(ws.dir);
                    }
                } else if let Some(ws) = state.get_mut(&sandbox) {
                    groups.extend(ws.procs.drain().map(|(_, p)| p.pgid));
                }
            }
        }
        if groups.is_empty() && dirs.is_empty() {
            return;
        }
        let work = move || {
            for pgid in groups {
                kill_group_blocking(pgid, "KILL");
            }
            for dir in dirs {
                let _ = std::fs::remove_dir_all(dir);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn_blocking(work)),
            Err(_) => work(),
        }
    }

    /// Kills every process and removes every scratch directory (the simulator is stopping).
    /// Idempotent; also run when the last handle drops.
    pub fn shutdown(&self) {
        let groups: Vec<u32> = {
            let mut state = self.state();
            self.closed.store(true, Ordering::Relaxed);
            let groups = state
                .values()
                .flat_map(|ws| ws.procs.values().map(|p| p.pgid))
                .collect();
            state.clear();
            groups
        };
        for pgid in groups {
            kill_group_blocking(pgid, "KILL");
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }

    /// The sandboxes with running processes, for the sampler.
    pub fn sample_targets(&self) -> Vec<SampleTarget> {
        self.state()
            .iter()
            .filter(|(_, ws)| !ws.procs.is_empty())
            .map(|(id, ws)| SampleTarget {
                sandbox: id.clone(),
                pgids: ws.procs.values().map(|p| p.pgid).collect(),
                dir: ws.dir.clone(),
            })
            .collect()
    }

    /// Turns measurements into samples on the grid; `cpu_count` gives each sandbox's share.
    pub fn record(&self, measured: Vec<Measured>, now: Ms, cpu_count: impl Fn(&str) -> u32) {
        let mut state = self.state();
        for m in measured {
            let Some(ws) = state.get_mut(&m.sandbox) else {
                continue;
            };
            let used: u64 = m
                .ticks
                .iter()
                .map(|(pid, &t)| t.saturating_sub(ws.last_ticks.get(pid).copied().unwrap_or(0)))
                .sum();
            let elapsed_secs = ws
                .last_sample_ms
                .map_or(1.0, |last| ((now - last) as f64 / 1000.0).max(0.001));
            let cores = f64::from(cpu_count(&m.sandbox).max(1));
            let pct = (used as f64 / CLOCK_TICKS_PER_SEC / elapsed_secs / cores * 100.0)
                .clamp(0.0, 100.0);
            ws.last_ticks = m.ticks;
            ws.last_sample_ms = Some(now);
            ws.disk_used = m.disk_bytes;
            let bucket = now.div_euclid(1000).div_euclid(5) * 5;
            let entry = ws.buckets.entry(bucket).or_default();
            entry.cpu_used_pct = entry.cpu_used_pct.max((pct * 100.0).round() / 100.0);
            entry.mem_used = entry.mem_used.max(m.rss_bytes);
            entry.disk_used = m.disk_bytes;
            while ws.buckets.len() > MAX_BUCKETS {
                ws.buckets.pop_first();
            }
        }
    }

    /// Notes the scratch directory's size after a file was written.
    pub fn set_disk_used(&self, sandbox: &str, bytes: i64) {
        if let Some(ws) = self.state().get_mut(sandbox) {
            ws.disk_used = bytes;
        }
    }

    /// The live sample for grid second `t`, when the sandbox has run processes by then: what its
    /// processes used in that bucket (or the one before, if the sampler has not reached this one
    /// yet), else nothing running. `None` means the generated series applies.
    pub fn live_sample(&self, sandbox: &str, t: i64) -> Option<LiveSample> {
        let state = self.state();
        let ws = state.get(sandbox)?;
        let since = ws.exec_since?;
        if t * 1000 < since.div_euclid(5000) * 5000 {
            return None;
        }
        let bucket = t.div_euclid(5) * 5;
        Some(
            ws.buckets
                .get(&bucket)
                .or_else(|| ws.buckets.get(&(bucket - 5)))
                .copied()
                .unwrap_or(LiveSample {
                    cpu_used_pct: 0.0,
                    mem_used: 0,
                    disk_used: ws.disk_used,
                }),
        )
    }
}

/// Sends `signal` (`TERM`, `KILL`) to a whole process group with the system's `kill`.
pub(crate) fn kill_group_blocking(pgid: u32, signal: &str) -> bool {
    std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// [`kill_group_blocking`] without blocking the runtime.
pub(crate) async fn kill_group(pgid: u32, signal: &'static str) -> bool {
    tokio::task::spawn_blocking(move || kill_group_blocking(pgid, signal))
        .await
        .unwrap_or(false)
}

/// A sandbox path in its canonical absolute form: relative paths are under `/home/user`, `.` and
/// empty segments are dropped, and `..` is refused (it could climb out of the scratch directory).
pub(crate) fn sandbox_path(raw: &str) -> Result<String, String> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Err("the path is empty".to_owned());
    }
    let full = if raw.starts_with('/') {
        raw.to_owned()
    } else {
        format!("{HOME}/{raw}")
    };
    let mut parts = Vec::new();
    for part in full.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(format!("path '{raw}' must not contain '..'")),
            part if part.contains('\0') => {
                return Err(format!("path '{raw}' contains a NUL byte"));
            }
            part => parts.push(part),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// `arg` with every `/home/user` path rewritten to the sandbox's home on this machine, so a
/// command naming an uploaded file by its sandbox path (`python3 /home/user/main.py`, also inside
/// a `bash -c` script) finds it. `/home/username` and the like are left alone.
pub(crate) fn map_home(arg: &str, host_home: &str) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(at) = rest.find(HOME) {
        let after = &rest[at + HOME.len()..];
        let boundary = after
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || "_-.".contains(c)));
        out.push_str(&rest[..at]);
        out.push_str(if boundary { host_home } else { HOME });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Where a canonical sandbox path lives on this machine.
pub(crate) fn host_path(dir: &Path, sandbox_path: &str) -> PathBuf {
    dir.join(sandbox_path.trim_start_matches('/'))
}

/// Reads `/proc` once for every target: CPU ticks and RSS of each member of its process groups,
/// and the size of its scratch directory. Blocking; run it off the runtime's threads.
pub(crate) fn measure(targets: Vec<SampleTarget>) -> Vec<Measured> {
    let mut out: Vec<Measured> = targets
        .iter()
        .map(|t| Measured {
            sandbox: t.sandbox.clone(),
            ticks: HashMap::new(),
            rss_bytes: 0,
            disk_bytes: dir_size(&t.dir),
        })
        .collect();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((pgrp, ticks, rss_pages)) = parse_stat(&stat) else {
            continue;
        };
        if let Some(i) = targets.iter().position(|t| t.pgids.contains(&pgrp)) {
            out[i].ticks.insert(pid, ticks);
            out[i].rss_bytes += rss_pages * PAGE_BYTES;
        }
    }
    out
}

/// `(pgrp, utime + stime + cutime + cstime, rss pages)` from a `/proc/<pid>/stat` line. The
/// command name may hold spaces and parentheses, so fields are counted from its last `)`.
fn parse_stat(stat: &str) -> Option<(u32, u64, i64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields after the name start at field 3 (state): pgrp is 5, times 14..=17, rss 24.
    let field = |n: usize| fields.get(n - 3).copied();
    let pgrp = field(5)?.parse().ok()?;
    let mut ticks = 0u64;
    for n in 14..=17 {
        ticks += field(n)?.parse::<i64>().ok()?.max(0) as u64;
    }
    let rss = field(24)?.parse::<i64>().ok()?.max(0);
    Some((pgrp, ticks, rss))
}

/// Bytes of regular files under `dir` (symlinks not followed).
pub(crate) fn dir_size(dir: &Path) -> i64 {
    let mut total = 0i64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total = total.saturating_add(meta.len() as i64);
            }
        }
    }
    total
}

/// The simulator may stop without [`Exec::shutdown`] (a handle outliving its server): the last
/// handle still kills what its sandboxes started and removes the scratch root.
impl Drop for Exec {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_simulator_makes_no_scratch_directory_again() {
        let exec = Exec::new(ExecMode::Local).unwrap();
        let root = exec.root.clone();
        let first = exec.workspace("sbx-one").unwrap();
        assert!(first.join("home/user").is_dir());
        exec.shutdown();
        assert!(!root.exists(), "shutdown removes the scratch root");
        let late = exec.workspace("sbx-two").unwrap_err();
        assert_eq!(late.to_string(), "the simulator is stopping");
        assert!(
            !root.exists(),
            "a late request does not make the root again"
        );
        exec.shutdown();
    }

    #[test]
    fn dropping_the_last_handle_removes_the_scratch_root() {
        let exec = Exec::new(ExecMode::Local).unwrap();
        let root = exec.root.clone();
        exec.workspace("sbx-one").unwrap();
        assert!(root.is_dir());
        drop(exec);
        assert!(!root.exists());
    }

    #[test]
    fn sandbox_paths_are_rooted_at_home_and_never_climb() {
        assert_eq!(sandbox_path("main.py").unwrap(), "/home/user/main.py");
        assert_eq!(sandbox_path("/tmp//x/./y").unwrap(), "/tmp/x/y");
        assert_eq!(sandbox_path("/").unwrap(), "/");
        assert!(sandbox_path("../etc/passwd").is_err());
        assert!(sandbox_path("/home/user/../../etc").is_err());
        assert!(sandbox_path("  ").is_err());
        assert_eq!(
            host_path(Path::new("/s"), "/home/user/a"),
            PathBuf::from("/s/home/user/a")
        );
    }

    #[test]
    fn home_paths_in_arguments_point_into_the_scratch_directory() {
        assert_eq!(
            map_home(
                "python3 /home/user/main.py && cd /home/user",
                "/s/home/user"
            ),
            "python3 /s/home/user/main.py && cd /s/home/user"
        );
        assert_eq!(map_home("/home/username/x", "/s"), "/home/username/x");
        assert_eq!(map_home("plain", "/s"), "plain");
    }

    #[test]
    fn stat_lines_are_read_from_after_the_command_name() {
        let line = "4242 (my (odd) cmd) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 2 1 20 0 1 0 123 456 89 18446744073709551615";
        assert_eq!(parse_stat(line), Some((4242, 13, 89)));
        assert_eq!(parse_stat("garbage"), None);
    }
}
