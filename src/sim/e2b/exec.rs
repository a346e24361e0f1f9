//! What the simulated sandboxes hold on this machine: one scratch directory per sandbox (its
//! filesystem, `/` of the sandbox mapped under it), the local processes started through envd
//! (`--exec local`) with who reads their output, the ends of those that exited lately, directory
//! watchers, and live metric samples read from `/proc` while processes run.
//!
//! `Exec` is plain state behind one mutex, plus the few blocking or process-spawning helpers that
//! act on it. It knows nothing of HTTP, Connect or the world's rules; the envd handlers drive it,
//! and the world guard in `mod.rs` tells it when a sandbox is paused (its processes are killed)
//! or killed (its processes, watchers and scratch directory go). Lock order: the world's lock may
//! be held while this one is taken, never the other way round; a process's audience lock is taken
//! only after this one, or alone.
//!
//! It must never run a command with the host's environment, outside the sandbox's scratch
//! directory, or let a sandbox path reach the host filesystem outside that directory: `..` is
//! refused, and [`resolve`] follows symlinks as the sandbox would see them (an absolute target
//! starts again at the sandbox's `/`, a `..` in a target stops at it), never as the host would.
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;

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
/// How long the end of an exited process is kept, so a late `Connect` still learns how it ended
/// (envd's `terminatedRetentionTTL`).
const ENDED_KEPT_MS: Ms = 30_000;
/// Symlinks followed while resolving one path before giving up (Linux's `MAXSYMLINKS`).
const MAX_SYMLINK_HOPS: usize = 40;
/// Directory watchers one sandbox may hold at once.
pub(crate) const MAX_WATCHERS: usize = 64;

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

/// What a process was started with, as envd's `List` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ProcConfig {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    pub cwd: Option<String>,
}

/// How a process ended, worded as envd words it (Go's `ProcessState` and `Wait` error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProcEnd {
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    pub error: Option<String>,
}

/// What a process's readers receive, in order: output chunks, then its end.
#[derive(Clone, Debug)]
pub(crate) enum Output {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    End(ProcEnd),
}

/// A process's stdin pipe, shared by the handlers that write to or close it (`None` once closed).
pub(crate) type Stdin = Arc<tokio::sync::Mutex<Option<tokio::process::ChildStdin>>>;

/// Who reads a process's output: the stream that started it and every one that connected since.
/// Output nobody reads is dropped, as envd drops it; `end` is set once, when the process ended.
#[derive(Default)]
pub(crate) struct Audience {
    readers: Vec<mpsc::Sender<Output>>,
    end: Option<ProcEnd>,
}

pub(crate) type SharedAudience = Arc<Mutex<Audience>>;

fn audience(shared: &SharedAudience) -> MutexGuard<'_, Audience> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// The readers output goes to now.
pub(crate) fn readers(shared: &SharedAudience) -> Vec<mpsc::Sender<Output>> {
    audience(shared).readers.clone()
}

/// Adds a reader (the stream that starts the process) before the process is registered.
pub(crate) fn add_reader(shared: &SharedAudience, reader: mpsc::Sender<Output>) {
    audience(shared).readers.push(reader);
}

/// Forgets a reader that went away (its stream was closed).
pub(crate) fn drop_reader(shared: &SharedAudience, gone: &mpsc::Sender<Output>) {
    audience(shared).readers.retain(|r| !r.same_channel(gone));
}

/// How a request names a process: by pid, or by the tag it was started with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Selector {
    Pid(u32),
    Tag(String),
}

/// A process a sandbox started, as `register` records it.
pub(crate) struct NewProc {
    pub config: ProcConfig,
    pub tag: Option<String>,
    pub stdin: Option<Stdin>,
    pub audience: SharedAudience,
}

/// A started process, as envd knows it.
struct Proc {
    /// Its process group (the same number as its pid: it leads its own group).
    pgid: u32,
    config: ProcConfig,
    tag: Option<String>,
    stdin: Option<Stdin>,
    audience: SharedAudience,
}

/// A process that ended lately, kept for [`ENDED_KEPT_MS`].
struct Ended {
    tag: Option<String>,
    end: ProcEnd,
    at: Ms,
}

/// What `subscribe` found for a selector.
pub(crate) enum Subscribed {
    /// A running process; the reader now receives its output and end.
    Live {
        pid: u32,
    },
    /// A process that ended lately: only its end is left to tell.
    Ended {
        pid: u32,
        end: ProcEnd,
    },
    NotFound,
}

/// A running process as `List` shows it.
pub(crate) struct Listed {
    pub pid: u32,
    pub tag: Option<String>,
    pub config: ProcConfig,
}

/// One entry of a watched directory, as far as telling changes apart needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EntrySig {
    pub is_dir: bool,
    pub ino: u64,
    pub len: u64,
    pub mtime_ns: i128,
    pub mode: u32,
}

/// A directory watcher (`CreateWatcher`): what it watches and what it saw last.
#[derive(Clone, Debug)]
pub(crate) struct Watcher {
    /// The watched directory as the request named it, and as resolved in the sandbox.
    pub shown_dir: String,
    pub real_dir: String,
    pub recursive: bool,
    pub include_entry: bool,
    /// Entries by path relative to the watched directory, at the last look.
    pub seen: BTreeMap<String, EntrySig>,
}

/// One sandbox's footprint on this machine.
struct Workspace {
    dir: PathBuf,
    procs: HashMap<u32, Proc>,
    ended: HashMap<u32, Ended>,
    watchers: HashMap<String, Watcher>,
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
                ended: HashMap::new(),
                watchers: HashMap::new(),
                exec_since: None,
                buckets: BTreeMap::new(),
                last_ticks: HashMap::new(),
                last_sample_ms: None,
                disk_used: 0,
            },
        );
        Ok(dir)
    }

    /// Records a started process; its sandbox's metrics are live from `now` on. A pid the
    /// system reuses forgets the end of the process that had it before.
    pub fn register(&self, sandbox: &str, pid: u32, new: NewProc, now: Ms) {
        if let Some(ws) = self.state().get_mut(sandbox) {
            ws.ended.remove(&pid);
            if let Some(tag) = &new.tag {
                ws.ended.retain(|_, e| e.tag.as_ref() != Some(tag));
            }
            ws.procs.insert(
                pid,
                Proc {
                    pgid: pid,
                    config: new.config,
                    tag: new.tag,
                    stdin: new.stdin,
                    audience: new.audience,
                },
            );
            ws.exec_since.get_or_insert(now);
        }
    }

    /// A process ended: it leaves the table (unless a newer one has its pid), its end is kept
    /// for a late `Connect`, and the readers it had are returned to be told. Done under this
    /// lock, so a `subscribe` either joins before the end or finds it kept, never neither.
    pub fn finish(
        &self,
        sandbox: &str,
        pid: u32,
        shared: &SharedAudience,
        end: ProcEnd,
        now: Ms,
    ) -> Vec<mpsc::Sender<Output>> {
        let mut state = self.state();
        if let Some(ws) = state.get_mut(sandbox) {
            let ours = ws
                .procs
                .get(&pid)
                .is_some_and(|p| Arc::ptr_eq(&p.audience, shared));
            if ours && let Some(proc) = ws.procs.remove(&pid) {
                ws.ended.insert(
                    pid,
                    Ended {
                        tag: proc.tag,
                        end: end.clone(),
                        at: now,
                    },
                );
            }
            ws.ended.retain(|_, e| now - e.at < ENDED_KEPT_MS);
        }
        let mut audience = audience(shared);
        audience.end = Some(end);
        std::mem::take(&mut audience.readers)
    }

    /// The pid of the running process `selector` names (the lowest pid when several share a tag).
    fn find(ws: &Workspace, selector: &Selector) -> Option<u32> {
        match selector {
            Selector::Pid(pid) => ws.procs.contains_key(pid).then_some(*pid),
            Selector::Tag(tag) => ws
                .procs
                .iter()
                .filter(|(_, p)| p.tag.as_ref() == Some(tag))
                .map(|(pid, _)| *pid)
                .min(),
        }
    }

    /// Adds `reader` to the audience of the process `selector` names, or says how it ended.
    pub fn subscribe(
        &self,
        sandbox: &str,
        selector: &Selector,
        reader: mpsc::Sender<Output>,
        now: Ms,
    ) -> Subscribed {
        let state = self.state();
        let Some(ws) = state.get(sandbox) else {
            return Subscribed::NotFound;
        };
        if let Some(pid) = Self::find(ws, selector)
            && let Some(proc) = ws.procs.get(&pid)
        {
            let mut audience = audience(&proc.audience);
            return match &audience.end {
                Some(end) => Subscribed::Ended {
                    pid,
                    end: end.clone(),
                },
                None => {
                    audience.readers.push(reader);
                    Subscribed::Live { pid }
                }
            };
        }
        let kept = ws
            .ended
            .iter()
            .filter(|(_, e)| now - e.at < ENDED_KEPT_MS)
            .find(|(pid, e)| match selector {
                Selector::Pid(wanted) => *pid == wanted,
                Selector::Tag(tag) => e.tag.as_ref() == Some(tag),
            });
        match kept {
            Some((pid, e)) => Subscribed::Ended {
                pid: *pid,
                end: e.end.clone(),
            },
            None => Subscribed::NotFound,
        }
    }

    /// The sandbox's running processes, by pid.
    pub fn processes(&self, sandbox: &str) -> Vec<Listed> {
        let state = self.state();
        let mut listed: Vec<Listed> = state
            .get(sandbox)
            .map(|ws| {
                ws.procs
                    .iter()
                    .map(|(pid, p)| Listed {
                        pid: *pid,
                        tag: p.tag.clone(),
                        config: p.config.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        listed.sort_by_key(|l| l.pid);
        listed
    }

    /// The process `selector` names: its pid, its group and its stdin (`None` when started
    /// without one).
    pub fn process(&self, sandbox: &str, selector: &Selector) -> Option<(u32, u32, Option<Stdin>)> {
        let state = self.state();
        let ws = state.get(sandbox)?;
        let pid = Self::find(ws, selector)?;
        let proc = ws.procs.get(&pid)?;
        Some((pid, proc.pgid, proc.stdin.clone()))
    }

    /// Starts keeping `watcher` under `id`; `false` when the sandbox holds [`MAX_WATCHERS`].
    pub fn add_watcher(&self, sandbox: &str, id: String, watcher: Watcher) -> bool {
        let mut state = self.state();
        let Some(ws) = state.get_mut(sandbox) else {
            return false;
        };
        if ws.watchers.len() >= MAX_WATCHERS {
            return false;
        }
        ws.watchers.insert(id, watcher);
        true
    }

    pub fn watcher(&self, sandbox: &str, id: &str) -> Option<Watcher> {
        self.state().get(sandbox)?.watchers.get(id).cloned()
    }

    /// Records what a watcher saw at its latest look (unless it was removed meanwhile).
    pub fn set_seen(&self, sandbox: &str, id: &str, seen: BTreeMap<String, EntrySig>) {
        if let Some(w) = self
            .state()
            .get_mut(sandbox)
            .and_then(|ws| ws.watchers.get_mut(id))
        {
            w.seen = seen;
        }
    }

    pub fn remove_watcher(&self, sandbox: &str, id: &str) -> bool {
        self.state()
            .get_mut(sandbox)
            .is_some_and(|ws| ws.watchers.remove(id).is_some())
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
    // `~` is the user's home, as envd expands it; another user's (`~root`) is refused, as there.
    let full = if raw == "~" || raw.starts_with("~/") {
        format!("{HOME}/{}", &raw[1..])
    } else if raw.starts_with('~') {
        return Err(format!(
            "path '{raw}': cannot expand user-specific home dir"
        ));
    } else if raw.starts_with('/') {
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

/// A sandbox path resolved on this machine: where it is, and what the sandbox calls it after its
/// symlinks were followed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub host: PathBuf,
    pub sandbox: String,
}

/// Why a path could not be resolved.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ResolveError {
    /// More than [`MAX_SYMLINK_HOPS`] symlinks (a cycle, most likely).
    Loop,
    /// A symlink whose target is not UTF-8, or that could not be read.
    BadLink(String),
}

impl std::fmt::Display for ResolveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResolveError::Loop => write!(
                f,
                "more than {MAX_SYMLINK_HOPS} symlinks on the way (a cycle?)"
            ),
            ResolveError::BadLink(why) => write!(f, "a symlink on the way cannot be read: {why}"),
        }
    }
}

/// Resolves the canonical sandbox path `path` (from [`sandbox_path`]) inside the scratch
/// directory `dir`, following its symlinks as the sandbox sees them: an absolute target starts
/// again at the sandbox's `/` (the scratch directory), and a `..` in a target never climbs above
/// it. The last component is followed only when `follow_last` (a `Stat` or `Remove` acts on a
/// link itself). The host is never asked to follow a link, so a link pointing "out" (`/etc`,
/// `../../..`) lands inside the scratch directory.
///
/// What resolution checked can change before the caller acts on the result; only a process of
/// the sandbox could change it, and with `--exec local` such a process already runs on the host
/// as the same user, so the check keeps envd's own requests inside, not the sandbox's processes.
pub(crate) fn resolve(dir: &Path, path: &str, follow_last: bool) -> Result<Resolved, ResolveError> {
    let mut todo: VecDeque<String> = path
        .split('/')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    let mut done: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(part) = todo.pop_front() {
        match part.as_str() {
            "" | "." => continue,
            ".." => {
                done.pop();
                continue;
            }
            _ => {}
        }
        let host = dir.join(done.join("/")).join(&part);
        let last = todo.is_empty();
        let is_link = std::fs::symlink_metadata(&host).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link || (last && !follow_last) {
            done.push(part);
            continue;
        }
        hops += 1;
        if hops > MAX_SYMLINK_HOPS {
            return Err(ResolveError::Loop);
        }
        let target = std::fs::read_link(&host).map_err(|e| ResolveError::BadLink(e.to_string()))?;
        let target = target
            .to_str()
            .ok_or_else(|| ResolveError::BadLink("its target is not UTF-8".to_owned()))?;
        if target.starts_with('/') {
            done.clear();
        }
        for piece in target.split('/').rev().filter(|p| !p.is_empty()) {
            todo.push_front(piece.to_owned());
        }
    }
    Ok(Resolved {
        host: dir.join(done.join("/")),
        sandbox: format!("/{}", done.join("/")),
    })
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
        assert_eq!(sandbox_path("~").unwrap(), "/home/user");
        assert_eq!(sandbox_path("~/a/b").unwrap(), "/home/user/a/b");
        assert!(sandbox_path("~root/x").is_err());
        assert!(sandbox_path("../etc/passwd").is_err());
        assert!(sandbox_path("/home/user/../../etc").is_err());
        assert!(sandbox_path("  ").is_err());
        assert_eq!(
            host_path(Path::new("/s"), "/home/user/a"),
            PathBuf::from("/s/home/user/a")
        );
    }

    #[test]
    fn symlinks_resolve_inside_the_scratch_directory_whatever_they_point_at() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("home/user/real")).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        symlink("/etc", root.join("home/user/abs")).unwrap();
        symlink("../../../../../../etc", root.join("home/user/climb")).unwrap();
        symlink("real", root.join("home/user/rel")).unwrap();
        symlink("loop", root.join("home/user/loop")).unwrap();
        let at = |p: &str, follow| resolve(root, p, follow);

        let abs = at("/home/user/abs/passwd", true).unwrap();
        assert_eq!(abs.sandbox, "/etc/passwd");
        assert_eq!(abs.host, root.join("etc/passwd"));
        assert_eq!(at("/home/user/climb", true).unwrap().host, root.join("etc"));
        assert_eq!(
            at("/home/user/rel/x", true).unwrap().sandbox,
            "/home/user/real/x"
        );
        // The last component is the link itself unless asked to follow it.
        assert_eq!(
            at("/home/user/abs", false).unwrap().host,
            root.join("home/user/abs")
        );
        assert_eq!(at("/home/user/loop", true), Err(ResolveError::Loop));
        assert_eq!(at("/", true).unwrap().host, root.join(""));
        assert!(
            at("/home/user/missing/deeper", true)
                .unwrap()
                .host
                .starts_with(root)
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
