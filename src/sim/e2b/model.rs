//! The simulated team's world: sandboxes, templates and snapshots, with E2B's state rules.
//!
//! `World` is plain data behind one mutex; every method is synchronous and does work in
//! proportion to what it returns (list pages walk a `BTreeSet` keyed by `(startedAt, id)`), so a
//! 100,000-sandbox fleet stays cheap per request. It knows nothing of HTTP beyond `ApiError`,
//! and it never reads the clock: callers pass `now`.
//!
//! Layering within the simulator is one-way: `series` (numbers, `Ms`, `Profile`) imports no
//! sibling, `wire` reads only `series`, and this module sits on both; the handlers sit on all three.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use super::lifecycle::{self, Kind};
use super::series::{self, LogLine, Ms, Profile, SeriesKey, mix, short_id, uuid_from};
use super::wire::ApiError;

/// The longest a sandbox may run, counted from its (last) start: the Pro plan's 24 hours.
pub(crate) const MAX_LIFETIME_MS: Ms = 24 * 3600 * 1000;
/// E2B's API default TTL when `timeout` is omitted.
pub(crate) const DEFAULT_TIMEOUT_SECS: i64 = 15;
/// `refreshes` never keeps a sandbox for less than this.
pub(crate) const MIN_REFRESH_SECS: i64 = 15;
/// The envd version sandboxes announce unless `--envd-version` says otherwise: the newest any
/// feature gate of the official SDKs (e2b 2.50 to 2.63) names (`0.6.4`, watching network
/// mounts), so every SDK feature is switched on; octet-stream uploads start at 0.5.7.
pub const DEFAULT_ENVD_VERSION: &str = "0.6.4";
/// E2B's deprecated, constant `clientID`.
pub(crate) const CLIENT_ID: &str = "6532622b";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SandboxState {
    Running,
    Paused,
    Killed,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Killed => "killed",
        }
    }
}

pub(crate) struct Sandbox {
    pub id: String,
    pub template_id: String,
    pub state: SandboxState,
    /// Start of the current (or last) run.
    pub started_at: Ms,
    /// Running: expiry. Paused: the time of the pause. Killed: end of the last run.
    pub end_at: Ms,
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub disk_size_mb: u32,
    pub metadata: BTreeMap<String, String>,
    pub profile: Profile,
    pub auto_pause: bool,
    pub auto_resume: bool,
    pub envd_access_token: Option<String>,
    pub allow_internet_access: Option<bool>,
    /// `envVars` of the create request: every process in the sandbox starts with them.
    pub env_vars: BTreeMap<String, String>,
    /// Earlier runs `[start, end)` before pauses, oldest first (usually empty).
    pub past_runs: Vec<(Ms, Ms)>,
}

impl Sandbox {
    /// Every run as a half-open span; a running sandbox's span is open-ended.
    pub fn runs(&self) -> Vec<(Ms, Ms)> {
        let current_end = match self.state {
            SandboxState::Running => Ms::MAX,
            SandboxState::Paused | SandboxState::Killed => self.end_at,
        };
        let mut runs = self.past_runs.clone();
        runs.push((self.started_at, current_end));
        runs
    }

    pub fn series_key(&self, seed: u64) -> SeriesKey {
        SeriesKey {
            key: mix(seed ^ series::fnv(&self.id)),
            profile: self.profile,
            memory_mb: self.memory_mb,
            disk_size_mb: self.disk_size_mb,
        }
    }

    /// The last instant with metrics or logs: now while running, the pause time otherwise.
    pub fn observed_until(&self, now: Ms) -> Ms {
        match self.state {
            SandboxState::Running => now,
            SandboxState::Paused | SandboxState::Killed => self.end_at.min(now),
        }
    }
}

pub(crate) struct Build {
    pub id: String,
    pub created_at: Ms,
    pub finished_at: Ms,
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub disk_size_mb: u32,
    /// The sandbox a snapshot build was taken from.
    pub source_sandbox: Option<String>,
}

pub(crate) struct Template {
    pub id: String,
    pub alias: Option<String>,
    /// Full names without tag (`team-slug/name` for snapshots).
    pub names: Vec<String>,
    pub public: bool,
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub disk_size_mb: u32,
    pub created_at: Ms,
    pub updated_at: Ms,
    pub created_by: Option<String>,
    pub last_spawned_at: Option<Ms>,
    pub spawn_count: u64,
    /// Oldest first; the last one is the current build.
    pub builds: Vec<Build>,
    /// `Some(snapshotID)` when this template is a snapshot.
    pub snapshot_id: Option<String>,
}

impl Template {
    pub fn current_build(&self) -> &Build {
        self.builds.last().expect("templates always have a build")
    }
}

/// What `GET /v2/sandboxes` filters on, already validated.
pub(crate) struct ListQuery {
    pub running: bool,
    pub paused: bool,
    pub metadata: Vec<(String, String)>,
    /// A resolved template id.
    pub template: Option<String>,
    pub started_after: Option<Ms>,
    pub ascending: bool,
    pub limit: usize,
    /// Resume strictly after this `(startedAt, id)` in the requested order.
    pub after: Option<(Ms, String)>,
}

pub(crate) struct ListPage<'a> {
    pub items: Vec<&'a Sandbox>,
    /// The key of the last item when more follow.
    pub next: Option<(Ms, String)>,
    pub total_running: Option<usize>,
}

/// A sample of the team's fleet over time.
pub(crate) struct TeamPoint {
    pub t: i64,
    pub concurrent: i64,
    pub start_rate: f64,
}

pub(crate) struct World {
    pub seed: u64,
    pub team_id: String,
    pub team_slug: String,
    sandboxes: HashMap<String, Sandbox>,
    /// Live (running or paused) sandboxes by `(startedAt, id)`: the list order.
    by_start: BTreeSet<(Ms, String)>,
    /// Running sandboxes by `(endAt, id)`, so expiry pops only what is due.
    expiry: BTreeSet<(Ms, String)>,
    pub running: usize,
    pub paused: usize,
    pub killed: usize,
    templates: BTreeMap<String, Template>,
    /// Live sandboxes per template id, so deleting a template need not scan the fleet.
    usage: HashMap<String, usize>,
    serial: u64,
    /// Sandboxes paused (`false`) or killed (`true`) since the last `take_ended`, so whoever holds
    /// their processes can stop them.
    ended: Vec<(String, bool)>,
    /// Log lines written by what happened in a sandbox (processes started and ended), oldest first.
    notes: HashMap<String, Vec<LogLine>>,
    /// The `envdVersion` every sandbox and template announces (`--envd-version`).
    pub envd_version: String,
    /// Lifecycle events of every change made since seeding ([`World::start_recording`]).
    pub events: lifecycle::Log,
    /// Off while the fleet is seeded: a seeded sandbox was created before the simulator started.
    recording: bool,
}

/// E2B accepts `<id>-<clientID>` and keeps only the first part.
pub(crate) fn short_sandbox_id(id: &str) -> &str {
    id.split('-').next().unwrap_or(id)
}

impl World {
    pub fn new(seed: u64, team_id: String) -> Self {
        Self {
            seed,
            team_id,
            team_slug: "steward-sim".to_owned(),
            sandboxes: HashMap::new(),
            by_start: BTreeSet::new(),
            expiry: BTreeSet::new(),
            running: 0,
            paused: 0,
            killed: 0,
            templates: BTreeMap::new(),
            usage: HashMap::new(),
            serial: 0,
            ended: Vec::new(),
            notes: HashMap::new(),
            envd_version: DEFAULT_ENVD_VERSION.to_owned(),
            events: lifecycle::Log::default(),
            recording: false,
        }
    }

    /// From now on every change is recorded as a lifecycle event.
    pub fn start_recording(&mut self) {
        self.recording = true;
    }

    /// Records a lifecycle event for the sandbox `id` (which must be in the world).
    fn record(&mut self, kind: Kind, id: &str, at: Ms, set_timeout: Option<Ms>) {
        if !self.recording {
            return;
        }
        let Some(s) = self.sandboxes.get(id) else {
            return;
        };
        let (template_id, metadata) = (s.template_id.clone(), s.metadata.clone());
        let build_id = self
            .templates
            .get(&template_id)
            .and_then(|t| t.builds.last())
            .map(|b| b.id.clone())
            .unwrap_or_default();
        let execution_id = uuid_from(mix(self.seed ^ series::fnv(id) ^ 0xE7EC));
        let event_id = self.fresh_uuid();
        self.events.push(lifecycle::Event {
            seq: 0,
            id: event_id,
            kind,
            sandbox_id: id.to_owned(),
            template_id,
            build_id,
            execution_id,
            at,
            metadata,
            set_timeout,
        });
    }

    fn next_hash(&mut self, salt: u64) -> u64 {
        self.serial += 1;
        mix(mix(self.seed ^ salt) ^ self.serial)
    }

    /// A new sandbox id, unique in this world (killed ids included).
    pub fn fresh_sandbox_id(&mut self) -> String {
        loop {
            let id = short_id('i', self.next_hash(0x5B));
            if !self.sandboxes.contains_key(&id) {
                return id;
            }
        }
    }

    pub fn fresh_template_id(&mut self) -> String {
        loop {
            let id = short_id('t', self.next_hash(0x7E));
            if !self.templates.contains_key(&id) {
                return id;
            }
        }
    }

    pub fn fresh_uuid(&mut self) -> String {
        uuid_from(self.next_hash(0xB1))
    }

    pub fn contains_sandbox(&self, id: &str) -> bool {
        self.sandboxes.contains_key(id)
    }

    /// The sandboxes paused (`false`) or killed (`true`) since the last call.
    pub fn take_ended(&mut self) -> Vec<(String, bool)> {
        std::mem::take(&mut self.ended)
    }

    /// Appends a line to a live sandbox's logs, keeping at most `cap` lines.
    pub fn note(&mut self, id: &str, line: LogLine, cap: usize) {
        if self.live(id).is_err() {
            return;
        }
        let notes = self
            .notes
            .entry(short_sandbox_id(id).to_owned())
            .or_default();
        notes.push(line);
        if notes.len() > cap {
            let extra = notes.len() - cap;
            notes.drain(..extra);
        }
    }

    /// The lines written by what happened in a sandbox, oldest first.
    pub fn notes(&self, id: &str) -> &[LogLine] {
        self.notes
            .get(short_sandbox_id(id))
            .map_or(&[], Vec::as_slice)
    }

    // ---- templates ----

    pub fn add_template(&mut self, template: Template) {
        self.templates.insert(template.id.clone(), template);
    }

    pub fn template(&self, id: &str) -> Option<&Template> {
        self.templates.get(id)
    }

    /// Templates in id order, strictly after `after` (the paging cursor).
    pub fn templates_after(&self, after: Option<&str>) -> impl Iterator<Item = &Template> {
        let lower = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.to_owned()));
        self.templates
            .range::<String, _>((lower, Bound::Unbounded))
            .map(|(_, t)| t)
    }

    pub fn template_count(&self) -> usize {
        self.templates.len()
    }

    pub fn snapshot_count(&self) -> usize {
        self.templates
            .values()
            .filter(|t| t.snapshot_id.is_some())
            .count()
    }

    /// Finds a template by id, alias or full name, optionally tagged `:default` (the only tag
    /// the simulator builds).
    pub fn resolve_template(&self, reference: &str) -> Option<&Template> {
        let name = match reference.rsplit_once(':') {
            Some((name, "default")) => name,
            Some(_) => return None,
            None => reference,
        };
        if let Some(t) = self.templates.get(name) {
            return Some(t);
        }
        self.templates
            .values()
            .find(|t| t.alias.as_deref() == Some(name) || t.names.iter().any(|n| n == name))
    }

    pub fn alias_of(&self, template_id: &str) -> Option<&str> {
        self.templates
            .get(template_id)
            .and_then(|t| t.alias.as_deref())
    }

    /// Deletes a template (or snapshot); refused with 400 while live sandboxes use it.
    pub fn delete_template(&mut self, reference: &str) -> Result<(), ApiError> {
        let id = self
            .resolve_template(reference)
            .map(|t| t.id.clone())
            .ok_or_else(|| ApiError::template_not_found(reference))?;
        let in_use = self.usage.get(&id).copied().unwrap_or(0);
        if in_use > 0 {
            return Err(ApiError::bad_request(format!(
                "cannot delete template '{id}' because there are {in_use} running or paused sandboxes using it"
            )));
        }
        self.templates.remove(&id);
        Ok(())
    }

    // ---- sandboxes ----

    /// Adds a sandbox in any live state and indexes it.
    pub fn insert_sandbox(&mut self, sandbox: Sandbox) {
        debug_assert!(sandbox.state != SandboxState::Killed);
        let key = (sandbox.started_at, sandbox.id.clone());
        match sandbox.state {
            SandboxState::Running => {
                self.running += 1;
                self.expiry.insert((sandbox.end_at, sandbox.id.clone()));
            }
            SandboxState::Paused => self.paused += 1,
            SandboxState::Killed => self.killed += 1,
        }
        self.by_start.insert(key);
        *self.usage.entry(sandbox.template_id.clone()).or_default() += 1;
        if let Some(t) = self.templates.get_mut(&sandbox.template_id) {
            t.spawn_count += 1;
            let spawned = t.last_spawned_at.unwrap_or(Ms::MIN).max(sandbox.started_at);
            t.last_spawned_at = Some(spawned);
        }
        let (id, at) = (sandbox.id.clone(), sandbox.started_at);
        self.sandboxes.insert(id.clone(), sandbox);
        self.record(Kind::Created, &id, at, None);
    }

    /// A running or paused sandbox, or E2B's 404.
    pub fn live(&self, id: &str) -> Result<&Sandbox, ApiError> {
        let short = short_sandbox_id(id);
        self.sandboxes
            .get(short)
            .filter(|s| s.state != SandboxState::Killed)
            .ok_or_else(|| ApiError::sandbox_not_found(short))
    }

    fn live_mut(&mut self, id: &str) -> Result<&mut Sandbox, ApiError> {
        let short = short_sandbox_id(id);
        self.sandboxes
            .get_mut(short)
            .filter(|s| s.state != SandboxState::Killed)
            .ok_or_else(|| ApiError::sandbox_not_found(short))
    }

    /// Ends every running sandbox whose TTL passed: paused if it asked for auto-pause,
    /// killed otherwise, as of its expiry time.
    pub fn expire(&mut self, now: Ms) {
        while let Some((end, id)) = self.expiry.first().cloned() {
            if end > now {
                break;
            }
            let auto_pause = self.sandboxes.get(&id).is_some_and(|s| s.auto_pause);
            let result = if auto_pause {
                self.pause(&id, end)
            } else {
                self.kill(&id, end)
            };
            if result.is_err() {
                // The index and the map disagree; drop the stale entry rather than spin.
                self.expiry.remove(&(end, id));
            }
        }
    }

    fn set_end(&mut self, id: &str, end_at: Ms) {
        if let Some(s) = self.sandboxes.get_mut(id) {
            if s.state == SandboxState::Running {
                self.expiry.remove(&(s.end_at, s.id.clone()));
                self.expiry.insert((end_at, s.id.clone()));
            }
            s.end_at = end_at;
        }
    }

    /// A new end for a running sandbox, recorded as an `updated` event at `now`.
    fn set_end_at(&mut self, id: &str, end_at: Ms, now: Ms) {
        self.set_end(id, end_at);
        self.record(Kind::Updated, id, now, Some(end_at));
    }

    pub fn kill(&mut self, id: &str, now: Ms) -> Result<(), ApiError> {
        let s = self.live_mut(id)?;
        let was = s.state;
        let (started, old_end, sid, template) =
            (s.started_at, s.end_at, s.id.clone(), s.template_id.clone());
        s.state = SandboxState::Killed;
        if was == SandboxState::Running {
            // A paused sandbox's last run ended at its pause; a running one ends now.
            s.end_at = now;
            self.expiry.remove(&(old_end, sid.clone()));
            self.running -= 1;
        } else {
            self.paused -= 1;
        }
        self.killed += 1;
        self.record(Kind::Killed, &sid, now, None);
        self.ended.push((sid.clone(), true));
        self.notes.remove(&sid);
        self.by_start.remove(&(started, sid));
        if let Some(n) = self.usage.get_mut(&template) {
            *n = n.saturating_sub(1);
        }
        Ok(())
    }

    pub fn pause(&mut self, id: &str, now: Ms) -> Result<(), ApiError> {
        let s = self.live_mut(id)?;
        if s.state == SandboxState::Paused {
            return Err(ApiError::conflict(format!(
                "Error pausing sandbox - sandbox '{}' is already paused",
                s.id
            )));
        }
        let old_end = s.end_at;
        s.state = SandboxState::Paused;
        s.end_at = now;
        let sid = s.id.clone();
        self.expiry.remove(&(old_end, sid.clone()));
        self.record(Kind::Paused, &sid, now, None);
        self.ended.push((sid, false));
        self.running -= 1;
        self.paused += 1;
        Ok(())
    }

    /// Resumes a paused sandbox as a new run starting `now`.
    pub fn resume(&mut self, id: &str, now: Ms, timeout_secs: i64) -> Result<(), ApiError> {
        let s = self.live_mut(id)?;
        if s.state == SandboxState::Running {
            return Err(ApiError::conflict(format!(
                "Sandbox '{}' is already running",
                s.id
            )));
        }
        let (old_start, sid) = (s.started_at, s.id.clone());
        s.past_runs.push((s.started_at, s.end_at));
        s.state = SandboxState::Running;
        s.started_at = now;
        s.end_at = now + timeout_secs * 1000;
        let end = s.end_at;
        self.paused -= 1;
        self.running += 1;
        self.by_start.remove(&(old_start, sid.clone()));
        self.by_start.insert((now, sid.clone()));
        self.expiry.insert((end, sid.clone()));
        self.record(Kind::Resumed, &sid, now, None);
        Ok(())
    }

    /// Ends a running sandbox's current run and starts a new one `now`, keeping its expiry:
    /// what E2B's brief pause during a snapshot, or a restart by its user, looks like from
    /// outside. A paused sandbox is left as it is.
    pub fn restart(&mut self, id: &str, now: Ms) -> Result<(), ApiError> {
        let s = self.live_mut(id)?;
        if s.state != SandboxState::Running || s.started_at >= now {
            return Ok(());
        }
        let (old_start, sid) = (s.started_at, s.id.clone());
        s.past_runs.push((s.started_at, now));
        s.started_at = now;
        self.by_start.remove(&(old_start, sid.clone()));
        self.by_start.insert((now, sid));
        Ok(())
    }

    /// Replaces a live sandbox's metadata and/or metrics profile (test hooks only).
    pub fn change(
        &mut self,
        id: &str,
        metadata: Option<BTreeMap<String, String>>,
        profile: Option<Profile>,
    ) -> Result<(), ApiError> {
        let s = self.live_mut(id)?;
        if let Some(metadata) = metadata {
            s.metadata = metadata;
        }
        if let Some(profile) = profile {
            s.profile = profile;
        }
        Ok(())
    }

    /// `connect`: resumes a paused sandbox (`true`) or only extends a running one's TTL.
    pub fn connect(&mut self, id: &str, now: Ms, timeout_secs: i64) -> Result<bool, ApiError> {
        let s = self.live(id)?;
        if s.state == SandboxState::Paused {
            self.resume(id, now, timeout_secs)?;
            return Ok(true);
        }
        let wanted = (now + timeout_secs * 1000).min(s.started_at + MAX_LIFETIME_MS);
        if wanted > s.end_at {
            let sid = s.id.clone();
            self.set_end_at(&sid, wanted, now);
        }
        Ok(false)
    }

    /// `timeout`: sets the TTL from now (may shorten), capped at the lifetime limit.
    pub fn set_timeout(&mut self, id: &str, now: Ms, timeout_secs: i64) -> Result<(), ApiError> {
        let s = self.live(id)?;
        if s.state != SandboxState::Running {
            // E2B answers 404 for a paused sandbox here.
            return Err(ApiError::sandbox_not_found(&s.id));
        }
        let end = (now + timeout_secs * 1000).min(s.started_at + MAX_LIFETIME_MS);
        let sid = s.id.clone();
        self.set_end_at(&sid, end, now);
        Ok(())
    }

    /// `refreshes`: only ever extends, by at least 15 s.
    pub fn refresh(&mut self, id: &str, now: Ms, duration_secs: i64) -> Result<(), ApiError> {
        let s = self.live(id)?;
        if s.state != SandboxState::Running {
            return Err(ApiError::sandbox_not_found(&s.id));
        }
        let wanted =
            (now + duration_secs.max(MIN_REFRESH_SECS) * 1000).min(s.started_at + MAX_LIFETIME_MS);
        if wanted > s.end_at {
            let sid = s.id.clone();
            self.set_end_at(&sid, wanted, now);
        }
        Ok(())
    }

    /// One page of `GET /v2/sandboxes`; work is proportional to the sandboxes it walks past.
    pub fn list(&self, q: &ListQuery) -> ListPage<'_> {
        let matches = |s: &Sandbox| {
            let state_ok = match s.state {
                SandboxState::Running => q.running,
                SandboxState::Paused => q.paused,
                SandboxState::Killed => false,
            };
            state_ok
                && q.template.as_ref().is_none_or(|t| &s.template_id == t)
                && q.started_after.is_none_or(|after| s.started_at >= after)
                && q.metadata
                    .iter()
                    .all(|(k, v)| s.metadata.get(k).is_some_and(|have| have == v))
        };
        let floor = q.started_after.map(|t| (t, String::new()));
        let lower = match (&q.after, &floor) {
            (Some(after), _) if q.ascending => Bound::Excluded(after.clone()),
            (_, Some(f)) => Bound::Included(f.clone()),
            _ => Bound::Unbounded,
        };
        let upper = match &q.after {
            Some(after) if !q.ascending => Bound::Excluded(after.clone()),
            _ => Bound::Unbounded,
        };
        if let (Bound::Included(lo) | Bound::Excluded(lo), Bound::Excluded(hi)) = (&lower, &upper)
            && lo >= hi
        {
            // A token from before `startedAfter`: nothing can follow it.
            return ListPage {
                items: Vec::new(),
                next: None,
                total_running: q.running.then_some(0),
            };
        }
        let range = self.by_start.range((lower, upper));
        let walk: Box<dyn Iterator<Item = &(Ms, String)>> = if q.ascending {
            Box::new(range)
        } else {
            Box::new(range.rev())
        };
        let mut items = Vec::with_capacity(q.limit + 1);
        for (_, id) in walk {
            let Some(s) = self.sandboxes.get(id) else {
                continue;
            };
            if matches(s) {
                items.push(s);
                if items.len() > q.limit {
                    break;
                }
            }
        }
        let next = if items.len() > q.limit {
            items.truncate(q.limit);
            items.last().map(|s| (s.started_at, s.id.clone()))
        } else {
            None
        };
        let total_running = q.running.then(|| {
            let unfiltered =
                q.metadata.is_empty() && q.template.is_none() && q.started_after.is_none();
            if unfiltered {
                self.running
            } else {
                // Filtered counts need a scan; only filtered queries pay for it.
                self.by_start
                    .iter()
                    .filter_map(|(_, id)| self.sandboxes.get(id))
                    .filter(|s| s.state == SandboxState::Running && matches(s))
                    .count()
            }
        });
        ListPage {
            items,
            next,
            total_running,
        }
    }

    /// Snapshots a live sandbox into a template. A name that already exists gets a new build.
    pub fn snapshot(
        &mut self,
        id: &str,
        name: Option<&str>,
        now: Ms,
    ) -> Result<(String, Vec<String>), ApiError> {
        let s = self.live(id)?;
        let (sid, cpu, mem, disk) = (s.id.clone(), s.cpu_count, s.memory_mb, s.disk_size_mb);
        if let Some(name) = name {
            let valid = !name.is_empty()
                && name.len() <= 128
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c))
                && name.starts_with(|c: char| c.is_ascii_alphanumeric());
            if !valid {
                return Err(ApiError::bad_request(format!(
                    "Invalid snapshot name '{name}': use lowercase letters, digits, '-', '_' and '.'"
                )));
            }
        }
        // E2B pauses a running sandbox while it snapshots it, then lets it run on.
        self.restart(&sid, now)?;
        let build_id = self.fresh_uuid();
        let build = Build {
            id: build_id,
            created_at: now,
            finished_at: now,
            cpu_count: cpu,
            memory_mb: mem,
            disk_size_mb: disk,
            source_sandbox: Some(sid),
        };
        let full_name = name.map(|n| format!("{}/{n}", self.team_slug));
        if let Some(full) = &full_name {
            let existing = self
                .templates
                .values_mut()
                .find(|t| t.snapshot_id.is_some() && t.names.contains(full));
            if let Some(t) = existing {
                t.builds.push(build);
                t.updated_at = now;
                let snapshot_id = t.snapshot_id.clone().unwrap_or_default();
                return Ok((snapshot_id, vec![format!("{full}:default")]));
            }
        }
        let template_id = self.fresh_template_id();
        let snapshot_id = match &full_name {
            Some(full) => format!("{full}:default"),
            None => format!("{template_id}:default"),
        };
        let names: Vec<String> = full_name.iter().cloned().collect();
        let info_names = names.iter().map(|n| format!("{n}:default")).collect();
        self.add_template(Template {
            id: template_id,
            alias: name.map(str::to_owned),
            names,
            public: false,
            cpu_count: cpu,
            memory_mb: mem,
            disk_size_mb: disk,
            created_at: now,
            updated_at: now,
            created_by: None,
            last_spawned_at: None,
            spawn_count: 0,
            builds: vec![build],
            snapshot_id: Some(snapshot_id.clone()),
        });
        Ok((snapshot_id, info_names))
    }

    /// The team's concurrency and start rate on a grid from every run ever seen (killed too).
    pub fn team_series(&self, start: i64, end: i64, step: i64) -> Vec<TeamPoint> {
        let mut starts = Vec::with_capacity(self.sandboxes.len());
        let mut ends = Vec::with_capacity(self.sandboxes.len());
        for s in self.sandboxes.values() {
            for (a, b) in s.runs() {
                starts.push(a);
                ends.push(b);
            }
        }
        starts.sort_unstable();
        ends.sort_unstable();
        let upto = |v: &[Ms], t: Ms| v.partition_point(|&x| x <= t) as i64;
        let first = start.div_euclid(step) * step + if start % step == 0 { 0 } else { step };
        let mut out = Vec::new();
        let mut t = first;
        while t <= end {
            let tm = t * 1000;
            let started = upto(&starts, tm) - upto(&starts, tm - step * 1000);
            out.push(TeamPoint {
                t,
                concurrent: upto(&starts, tm) - upto(&ends, tm),
                start_rate: started as f64 / step as f64,
            });
            t += step;
        }
        out
    }
}
