//! The story fleet `steward demo` starts with (`SimOptions::story`, `steward sim e2b --story`):
//! about forty sandboxes a newcomer can read at a glance, chosen so that one sweep has
//! something to say about each kind of sandbox Steward handles.
//!
//! - busy sandboxes (high CPU) that the sweep leaves alone;
//! - idle ones (near-zero CPU for hours, a long timeout ahead), so the sweep recommends Pause;
//! - one idle sandbox whose own timeout ends it soon (the sweep recommends Leave it);
//! - sandboxes paused for days holding gigabytes (Snapshot, then kill), and a few paused for
//!   hours, which are not idle yet;
//! - one idle sandbox labelled `steward.keep` and one too young to judge, both exempt;
//! - running sandboxes whose disk keeps growing (active, not idle);
//! - owners in metadata, so the digest groups the cases by owner;
//! - two templates (`base` and `ml-notebook`) and two snapshots.
//!
//! Like `fleet`, it is a pure function of (seed, now) over the world's own id generator; it
//! keeps the kill recommendations under the sweep's default blast-radius guard (25 %), so the
//! demo opens every case instead of holding them for review.
use std::collections::BTreeMap;

use chrono::{DateTime, Duration as ChronoDuration, Utc};

use super::fleet::{catalog_template_id, template};
use super::model::{Build, Sandbox, SandboxState, Template, World};
use super::series::{Dice, Ms, Profile, fnv, mix, uuid_from};

const MINUTE: Ms = 60_000;
const HOUR: Ms = 60 * MINUTE;
const DAY: Ms = 24 * HOUR;

/// `(alias, cpuCount, memoryMB, diskSizeMB)` of the story's two templates.
pub(crate) const STORY_TEMPLATES: [(&str, u32, u32, u32); 2] =
    [("base", 2, 512, 4096), ("ml-notebook", 4, 8192, 20480)];
/// The names of the story's snapshots (under the team's slug).
pub(crate) const STORY_SNAPSHOTS: [&str; 2] = ["nightly-eval", "repro-checkout-bug"];

/// What kind of sandbox a story member is; the counts are what the demo promises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Running with high CPU.
    Busy,
    /// Running, near-zero CPU for hours, a long timeout ahead: the sweep recommends Pause.
    Idle,
    /// Idle, but its own timeout ends it within minutes: the sweep recommends Leave it.
    IdleEndingSoon,
    /// Idle, but labelled `steward.keep` until a date ahead: exempt.
    Kept,
    /// Idle, but started minutes ago: too young to judge.
    Young,
    /// Running, disk growing: active.
    DiskGrowing,
    /// Paused for days, holding gigabytes: the sweep recommends Snapshot, then kill.
    PausedForDays,
    /// Paused for a few hours: not idle yet.
    PausedForHours,
}

/// How many sandboxes of each role the story has (40 in all).
pub(crate) const STORY_ROLES: [(Role, usize); 8] = [
    (Role::Busy, 14),
    (Role::Idle, 10),
    (Role::IdleEndingSoon, 1),
    (Role::Kept, 1),
    (Role::Young, 1),
    (Role::DiskGrowing, 3),
    (Role::PausedForDays, 7),
    (Role::PausedForHours, 3),
];

/// The owners named in metadata; the demo maps `dana` and `erin` to its Slack people.
const OWNERS: &[&str] = &["alice", "bob", "carol", "dana", "erin"];
const AGENTS: &[&str] = &["claude-code", "codex", "ci-runner", "notebook"];

/// Adds the story's templates, snapshots and sandboxes to an empty world; returns each
/// sandbox's id with its role, in seeding order.
pub(crate) fn seed(world: &mut World, now: Ms) -> Vec<(String, Role)> {
    let mut template_ids = Vec::new();
    for (i, &(alias, cpu, mem, disk)) in STORY_TEMPLATES.iter().enumerate() {
        let id = catalog_template_id(alias);
        let created = now - (90 - 30 * i as i64) * DAY;
        world.add_template(template(
            id.clone(),
            Some(alias),
            (cpu, mem, disk),
            i == 0,
            created,
        ));
        template_ids.push(id);
    }
    let mut seeded = Vec::new();
    let mut n = 0u64;
    for &(role, count) in &STORY_ROLES {
        for k in 0..count {
            n += 1;
            let mut dice = Dice::new(world.seed, 0x5707 ^ n);
            let sandbox = member(world, &mut dice, role, k, &template_ids, now);
            seeded.push((sandbox.id.clone(), role));
            world.insert_sandbox(sandbox);
        }
    }
    for (i, name) in STORY_SNAPSHOTS.iter().enumerate() {
        let source = seeded
            .iter()
            .filter(|(_, r)| *r == Role::PausedForDays)
            .nth(i)
            .map(|(id, _)| id.clone());
        let snapshot = snapshot_template(world, name, source, now - (3 + 4 * i as i64) * DAY);
        world.add_template(snapshot);
    }
    seeded
}

fn member(
    world: &mut World,
    dice: &mut Dice,
    role: Role,
    k: usize,
    template_ids: &[String],
    now: Ms,
) -> Sandbox {
    // Notebooks are the expensive ones: every third sandbox, and every long-paused one but the
    // first, so the paused ones hold gigabytes.
    let notebook = match role {
        Role::PausedForDays => k > 0,
        Role::Busy | Role::Idle => k % 3 == 2,
        _ => false,
    };
    let pick = usize::from(notebook);
    let (_, cpu_count, memory_mb, disk_size_mb) = STORY_TEMPLATES[pick];
    let jitter = dice.range(0, 1000);
    let (state, profile, started_at, end_at) = match role {
        Role::Busy => (
            SandboxState::Running,
            Profile::Busy,
            now - dice.range(10 * MINUTE, 6 * HOUR) - jitter,
            now + dice.range(30 * MINUTE, 3 * HOUR),
        ),
        Role::Idle | Role::Kept => (
            SandboxState::Running,
            Profile::Idle,
            now - dice.range(3 * HOUR, 16 * HOUR) - jitter,
            now + dice.range(2 * HOUR, 6 * HOUR),
        ),
        Role::IdleEndingSoon => (
            SandboxState::Running,
            Profile::Idle,
            now - dice.range(4 * HOUR, 8 * HOUR) - jitter,
            now + dice.range(4 * MINUTE, 8 * MINUTE),
        ),
        Role::Young => (
            SandboxState::Running,
            Profile::Idle,
            now - dice.range(5 * MINUTE, 15 * MINUTE) - jitter,
            now + HOUR,
        ),
        Role::DiskGrowing => (
            SandboxState::Running,
            Profile::DiskGrowing,
            now - dice.range(HOUR, 10 * HOUR) - jitter,
            now + dice.range(HOUR, 4 * HOUR),
        ),
        Role::PausedForDays => {
            let paused = now - dice.range(4 * DAY, 21 * DAY) - jitter;
            (
                SandboxState::Paused,
                Profile::Idle,
                paused - dice.range(HOUR, 8 * HOUR),
                paused,
            )
        }
        Role::PausedForHours => {
            let paused = now - dice.range(2 * HOUR, 20 * HOUR) - jitter;
            (
                SandboxState::Paused,
                Profile::Busy,
                paused - dice.range(20 * MINUTE, 3 * HOUR),
                paused,
            )
        }
    };
    let mut metadata = BTreeMap::new();
    metadata.insert(
        "owner".to_owned(),
        OWNERS[(k + role as usize) % OWNERS.len()].to_owned(),
    );
    metadata.insert("agent".to_owned(), (*dice.pick(AGENTS)).to_owned());
    if role == Role::Kept {
        metadata.insert("steward.keep".to_owned(), keep_until(now));
        metadata.insert("purpose".to_owned(), "customer-demo".to_owned());
    }
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
        auto_pause: false,
        auto_resume: false,
        envd_access_token: Some(format!("{:016x}", dice.next_u64())),
        allow_internet_access: None,
        env_vars: BTreeMap::new(),
        past_runs: Vec::new(),
    }
}

/// The `steward.keep` date: four weeks after `now`, so the label is still in force.
fn keep_until(now: Ms) -> String {
    let at =
        DateTime::<Utc>::from_timestamp_millis(now).unwrap_or_default() + ChronoDuration::days(28);
    at.format("%Y-%m-%d").to_string()
}

/// A snapshot template named `name`, taken from `source` at `at`.
fn snapshot_template(world: &mut World, name: &str, source: Option<String>, at: Ms) -> Template {
    let (_, cpu_count, memory_mb, disk_size_mb) = STORY_TEMPLATES[1];
    let full = format!("{}/{name}", world.team_slug);
    let id = world.fresh_template_id();
    Template {
        alias: Some(name.to_owned()),
        names: vec![full.clone()],
        public: false,
        cpu_count,
        memory_mb,
        disk_size_mb,
        created_at: at,
        updated_at: at,
        created_by: None,
        last_spawned_at: None,
        spawn_count: 0,
        builds: vec![Build {
            id: uuid_from(mix(fnv(&id))),
            created_at: at,
            finished_at: at,
            cpu_count,
            memory_mb,
            disk_size_mb,
            source_sandbox: source,
        }],
        snapshot_id: Some(format!("{full}:default")),
        id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(seeded: &[(String, Role)], role: Role) -> usize {
        seeded.iter().filter(|(_, r)| *r == role).count()
    }

    #[test]
    fn the_story_fleet_has_the_promised_shape() {
        let now = 1_796_000_000_000;
        let mut world = World::new(42, "team".into());
        let seeded = seed(&mut world, now);
        assert_eq!(seeded.len(), 40, "about forty sandboxes");
        let sandboxes: Vec<&Sandbox> = seeded
            .iter()
            .map(|(id, _)| world.live(id).expect("every story sandbox is live"))
            .collect();

        // Busy: running with the busy profile.
        assert_eq!(count(&seeded, Role::Busy), 14);
        let busy = sandboxes
            .iter()
            .filter(|s| s.state == SandboxState::Running && s.profile == Profile::Busy)
            .count();
        assert_eq!(busy, 14);

        // Idle for hours with a long timeout ahead: Pause material.
        let idle: Vec<&&Sandbox> = sandboxes
            .iter()
            .filter(|s| {
                s.state == SandboxState::Running
                    && s.profile == Profile::Idle
                    && now - s.started_at > 2 * HOUR
                    && s.end_at - now > HOUR
                    && !s.metadata.contains_key("steward.keep")
            })
            .collect();
        assert_eq!(idle.len(), 10);

        // Paused for days, holding gigabytes; paused for hours.
        let paused_days: Vec<&&Sandbox> = sandboxes
            .iter()
            .filter(|s| s.state == SandboxState::Paused && now - s.end_at > 3 * DAY)
            .collect();
        assert_eq!(paused_days.len(), 7);
        assert!(paused_days.iter().all(|s| s.disk_size_mb >= 4096));
        assert!(
            paused_days
                .iter()
                .filter(|s| s.disk_size_mb >= 20480)
                .count()
                >= 5
        );
        let paused_hours = sandboxes
            .iter()
            .filter(|s| s.state == SandboxState::Paused && now - s.end_at < DAY)
            .count();
        assert_eq!(paused_hours, 3);

        // Exactly one keep label, with a date ahead.
        let kept: Vec<&&Sandbox> = sandboxes
            .iter()
            .filter(|s| s.metadata.contains_key("steward.keep"))
            .collect();
        assert_eq!(kept.len(), 1);
        let today = DateTime::<Utc>::from_timestamp_millis(now)
            .unwrap()
            .format("%Y-%m-%d")
            .to_string();
        assert!(kept[0].metadata["steward.keep"] > today);

        // Every sandbox names an owner; more than one owner, so the digest groups.
        assert!(sandboxes.iter().all(|s| s.metadata.contains_key("owner")));
        let owners: std::collections::BTreeSet<&str> = sandboxes
            .iter()
            .map(|s| s.metadata["owner"].as_str())
            .collect();
        assert!(owners.len() >= 4, "{owners:?}");

        // Two templates and two snapshots; every sandbox uses one of the two templates.
        assert_eq!(world.template_count(), 4);
        assert_eq!(world.snapshot_count(), 2);
        for (alias, ..) in STORY_TEMPLATES {
            assert!(world.resolve_template(alias).is_some(), "{alias}");
        }
        for name in STORY_SNAPSHOTS {
            let full = format!("{}/{name}:default", world.team_slug);
            assert!(world.resolve_template(&full).is_some(), "{full}");
        }

        // The kill recommendations stay under the sweep's default 25 % guard.
        assert!(paused_days.len() * 4 < seeded.len());
    }

    #[test]
    fn the_story_is_the_same_for_the_same_seed_and_time() {
        let now = 1_796_000_000_000;
        let (mut a, mut b) = (World::new(7, "t".into()), World::new(7, "t".into()));
        assert_eq!(seed(&mut a, now), seed(&mut b, now));
    }
}
