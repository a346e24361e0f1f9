//! The seeded starting world: a handful of templates and a fleet of N sandboxes.
//!
//! The fleet is a pure function of (seed, N, now): the same seed gives the same ids, templates,
//! profiles and metadata, with times placed relative to the moment the simulator starts. It
//! mixes the cases Steward has to handle: busy and idle running sandboxes, growing disks, and
//! sandboxes paused for hours or for days. It must stay fast enough for 100,000 sandboxes.
use std::collections::BTreeMap;

use super::model::{Build, MAX_LIFETIME_MS, Sandbox, SandboxState, Template, World};
use super::series::{Dice, fnv, mix, short_id, uuid_from};
use super::series::{Ms, Profile};

const MINUTE: Ms = 60_000;
const HOUR: Ms = 60 * MINUTE;
const DAY: Ms = 24 * HOUR;

/// `(alias, cpuCount, memoryMB, diskSizeMB, public, weight %)` of the seeded templates.
const CATALOG: &[(&str, u32, u32, u32, bool, u32)] = &[
    ("base", 2, 512, 1024, true, 30),
    ("python", 2, 1024, 5120, false, 25),
    ("node", 2, 2048, 5120, false, 20),
    ("code-interpreter-v1", 4, 4096, 10240, true, 20),
    ("desktop", 8, 8192, 20480, false, 5),
];
const OWNERS: &[&str] = &[
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi",
];
const AGENTS: &[&str] = &["codex", "claude-code", "devin", "ci-runner", "notebook"];
const PURPOSES: &[&str] = &["eval", "ci", "demo", "scratch"];
/// The person who built the team's own templates.
const BUILDER_ID: &str = "8d3a6f0e-2c41-4b7e-9a55-0f1e2d3c4b5a";

/// The id a catalog template gets: stable across seeds, so demos can hard-code it.
pub(crate) fn catalog_template_id(alias: &str) -> String {
    short_id('r', mix(fnv(alias)))
}

/// Builds a template with one ready build.
pub(crate) fn template(
    id: String,
    alias: Option<&str>,
    sizes: (u32, u32, u32),
    public: bool,
    created_at: Ms,
) -> Template {
    let (cpu_count, memory_mb, disk_size_mb) = sizes;
    Template {
        alias: alias.map(str::to_owned),
        names: alias.iter().map(|a| (*a).to_owned()).collect(),
        public,
        cpu_count,
        memory_mb,
        disk_size_mb,
        created_at,
        updated_at: created_at,
        created_by: (!public).then(|| BUILDER_ID.to_owned()),
        last_spawned_at: None,
        spawn_count: 0,
        builds: vec![Build {
            id: uuid_from(mix(fnv(&id))),
            created_at,
            finished_at: created_at + 3 * MINUTE,
            cpu_count,
            memory_mb,
            disk_size_mb,
            source_sandbox: None,
        }],
        snapshot_id: None,
        id,
    }
}

/// Adds the catalog templates and `count` sandboxes to an empty world.
pub(crate) fn seed(world: &mut World, count: usize, now: Ms) {
    let mut ids = Vec::with_capacity(CATALOG.len());
    for (i, &(alias, cpu, mem, disk, public, _)) in CATALOG.iter().enumerate() {
        let id = catalog_template_id(alias);
        let created = now - (120 - 15 * i as i64) * DAY;
        world.add_template(template(
            id.clone(),
            Some(alias),
            (cpu, mem, disk),
            public,
            created,
        ));
        ids.push(id);
    }
    for i in 0..count {
        let mut dice = Dice::new(world.seed, i as u64 + 1);
        let sandbox = member(world, &mut dice, &ids, now);
        world.insert_sandbox(sandbox);
    }
}

fn member(world: &mut World, dice: &mut Dice, template_ids: &[String], now: Ms) -> Sandbox {
    let mut roll = dice.range(0, 100) as u32;
    let mut pick = 0;
    for (i, entry) in CATALOG.iter().enumerate() {
        if roll < entry.5 {
            pick = i;
            break;
        }
        roll -= entry.5;
    }
    let (_, cpu_count, memory_mb, disk_size_mb, _, _) = CATALOG[pick];
    let kind = dice.range(0, 100);
    let jitter = dice.range(0, 1000);
    let (state, profile, started_at, end_at) = match kind {
        // Busy and running: started minutes to hours ago, TTL ahead.
        0..35 => {
            let started = now - dice.range(2 * MINUTE, 8 * HOUR) - jitter;
            (
                SandboxState::Running,
                Profile::Busy,
                started,
                now + dice.range(2 * MINUTE, HOUR),
            )
        }
        // Idle and running for hours, kept alive by a long TTL.
        35..55 => {
            let started = now - dice.range(2 * HOUR, 20 * HOUR) - jitter;
            let room = started + MAX_LIFETIME_MS - now;
            let end = now + dice.range(10 * MINUTE, room.max(10 * MINUTE + 1));
            (SandboxState::Running, Profile::Idle, started, end)
        }
        // Running with a disk that keeps growing.
        55..65 => {
            let started = now - dice.range(30 * MINUTE, 12 * HOUR) - jitter;
            let end = now + dice.range(5 * MINUTE, 2 * HOUR);
            (SandboxState::Running, Profile::DiskGrowing, started, end)
        }
        // Paused for hours: `endAt` is the pause time.
        65..85 => {
            let paused = now - dice.range(HOUR, 20 * HOUR) - jitter;
            let profile = *dice.pick(&[Profile::Busy, Profile::Idle]);
            (
                SandboxState::Paused,
                profile,
                paused - dice.range(5 * MINUTE, 6 * HOUR),
                paused,
            )
        }
        // Paused for days, the forgotten ones.
        _ => {
            let paused = now - dice.range(2 * DAY, 25 * DAY) - jitter;
            let profile = *dice.pick(&[Profile::Busy, Profile::Idle, Profile::DiskGrowing]);
            (
                SandboxState::Paused,
                profile,
                paused - dice.range(5 * MINUTE, 8 * HOUR),
                paused,
            )
        }
    };
    let mut metadata = BTreeMap::new();
    if dice.unit() < 0.7 {
        metadata.insert("owner".to_owned(), (*dice.pick(OWNERS)).to_owned());
    }
    if dice.unit() < 0.5 {
        metadata.insert("agent".to_owned(), (*dice.pick(AGENTS)).to_owned());
    }
    if dice.unit() < 0.3 {
        metadata.insert("purpose".to_owned(), (*dice.pick(PURPOSES)).to_owned());
    }
    if dice.unit() < 0.03 {
        metadata.insert("steward.keep".to_owned(), "2026-12-31".to_owned());
    }
    let auto_pause = state == SandboxState::Running && dice.unit() < 0.3;
    let secure = dice.unit() < 0.8;
    let token_hash = dice.next_u64();
    Sandbox {
        id: world.fresh_sandbox_id(),
        template_id: template_ids[pick].clone(),
        state,
        started_at,
        end_at,
        cpu_count,
        memory_mb,
        disk_size_mb,
        metadata,
        profile,
        auto_pause,
        auto_resume: false,
        envd_access_token: secure.then(|| format!("{token_hash:016x}")),
        allow_internet_access: None,
        env_vars: BTreeMap::new(),
        past_runs: Vec::new(),
    }
}
