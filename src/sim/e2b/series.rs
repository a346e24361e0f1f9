//! Deterministic numbers for the simulated fleet: ids, metric samples and log lines.
//!
//! Every value is a pure function of (seed, sandbox id, timestamp, profile), so two simulators
//! started with the same seed serve the same series, whatever their start time. Nothing here
//! reads the clock or touches state, and nothing here imports a sibling module: `Ms` and
//! `Profile` live here so that `wire` and `model` can both build on this file.

/// Milliseconds since the Unix epoch.
pub(crate) type Ms = i64;

/// The shape of a sandbox's metrics and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Profile {
    Busy,
    Idle,
    DiskGrowing,
}

impl Profile {
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "busy" => Some(Self::Busy),
            "idle" => Some(Self::Idle),
            "disk-growing" => Some(Self::DiskGrowing),
            _ => None,
        }
    }
}

/// Metric samples sit on a grid of this many seconds (E2B collects every 5 s).
pub(crate) const METRIC_GRID_SECS: i64 = 5;
/// A metric query returns at most about this many points; the step widens to fit.
pub(crate) const MAX_METRIC_POINTS: i64 = 360;
/// Logs older than this are gone, as on E2B.
pub(crate) const LOG_RETENTION_MS: Ms = 7 * 24 * 3600 * 1000;
/// A log query stops scanning after this many candidate lines, so a search that matches
/// nothing stays cheap.
const MAX_LOG_SCAN: usize = 200_000;
/// Disk of a `disk-growing` sandbox climbs for this long, then drops (log rotation).
const DISK_GROWTH_PERIOD_SECS: i64 = 14 * 24 * 3600;
const MIB: i64 = 1024 * 1024;

/// splitmix64's finalizer: a cheap, well-mixed 64-bit hash.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A hash mapped to `[0, 1)`.
pub(crate) fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// FNV-1a over a string, to key series by sandbox id rather than by creation order.
pub(crate) fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A small deterministic dice, for generating one fleet member.
pub(crate) struct Dice(u64);

impl Dice {
    pub fn new(seed: u64, stream: u64) -> Self {
        Self(mix(mix(seed) ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93)))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    pub fn unit(&mut self) -> f64 {
        unit(self.next_u64())
    }

    /// Uniform in `lo..hi` (ms, counts); `lo` when the range is empty.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        lo + (self.next_u64() % (hi - lo) as u64) as i64
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next_u64() % items.len() as u64) as usize]
    }
}

/// A lowercase alphanumeric id like E2B's (`i` + 19 chars); never contains `-`, which E2B
/// reserves for the legacy `<id>-<clientID>` form.
pub(crate) fn short_id(first: char, h: u64) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = String::with_capacity(20);
    out.push(first);
    let (mut a, mut b) = (h, mix(h ^ 0x5A5A));
    for i in 0..19 {
        let src = if i < 10 { &mut a } else { &mut b };
        out.push(ALPHABET[(*src % 36) as usize] as char);
        *src /= 36;
    }
    out
}

/// A uuid-shaped id (version 4 bits set) derived from a hash.
pub(crate) fn uuid_from(h: u64) -> String {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&h.to_le_bytes());
    bytes[8..].copy_from_slice(&mix(h).to_le_bytes());
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// The step a metric query uses: at least the 5 s grid, wide enough for ~360 points.
pub(crate) fn metric_step_secs(window_secs: i64) -> i64 {
    let raw = (window_secs + MAX_METRIC_POINTS - 1) / MAX_METRIC_POINTS;
    let rounded = (raw + METRIC_GRID_SECS - 1) / METRIC_GRID_SECS * METRIC_GRID_SECS;
    rounded.max(METRIC_GRID_SECS)
}

/// What a sandbox's metric series depends on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeriesKey {
    pub key: u64,
    pub profile: Profile,
    pub memory_mb: u32,
    pub disk_size_mb: u32,
}

/// One `SandboxMetric` sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    pub t: i64,
    pub cpu_used_pct: f64,
    pub mem_used: i64,
    pub mem_cache: i64,
    pub mem_total: i64,
    pub disk_used: i64,
    pub disk_total: i64,
}

/// Smooth noise in `[0, 1)`: random knots every `period` seconds, eased between.
fn smooth(key: u64, t: i64, period: i64) -> f64 {
    let k = t.div_euclid(period);
    let frac = t.rem_euclid(period) as f64 / period as f64;
    let a = unit(mix(key ^ (k as u64).wrapping_mul(0x2545_F491_4F6C_DD1D)));
    let b = unit(mix(
        key ^ ((k + 1) as u64).wrapping_mul(0x2545_F491_4F6C_DD1D)
    ));
    let eased = frac * frac * (3.0 - 2.0 * frac);
    a + (b - a) * eased
}

fn jitter(key: u64, t: i64) -> f64 {
    unit(mix(key ^ mix(t as u64)))
}

/// The metric sample of a sandbox at second `t`, shaped by its profile.
pub(crate) fn sample(s: &SeriesKey, t: i64) -> Sample {
    let mem_total = i64::from(s.memory_mb) * MIB;
    let disk_total = i64::from(s.disk_size_mb) * MIB;
    let (k_cpu, k_mem, k_disk) = (mix(s.key ^ 1), mix(s.key ^ 2), mix(s.key ^ 3));
    let disk_base = 0.2 + 0.3 * unit(k_disk);
    let (cpu, mem_frac, disk_frac) = match s.profile {
        Profile::Busy => (
            20.0 + 70.0 * (0.75 * smooth(k_cpu, t, 120) + 0.25 * jitter(k_cpu, t)),
            0.35 + 0.35 * smooth(k_mem, t, 300),
            disk_base + 0.02 * smooth(k_disk, t, 900),
        ),
        // Idle: under 1 % CPU, memory nearly flat, disk exactly flat for the whole span.
        Profile::Idle => (
            0.05 + 0.6 * jitter(k_cpu, t),
            0.12 + 0.1 * unit(k_mem) + 0.002 * jitter(k_mem, t),
            disk_base,
        ),
        Profile::DiskGrowing => {
            let phase = (unit(k_disk) * DISK_GROWTH_PERIOD_SECS as f64) as i64;
            let progress = (t + phase).rem_euclid(DISK_GROWTH_PERIOD_SECS) as f64
                / DISK_GROWTH_PERIOD_SECS as f64;
            (
                5.0 + 25.0 * smooth(k_cpu, t, 180),
                0.25 + 0.2 * smooth(k_mem, t, 600),
                0.2 + 0.75 * progress,
            )
        }
    };
    let mem_used = (mem_frac * mem_total as f64) as i64;
    Sample {
        t,
        cpu_used_pct: (cpu * 100.0).round() / 100.0,
        mem_used,
        mem_cache: ((0.08 + 0.1 * smooth(k_mem ^ 7, t, 600)) * mem_total as f64) as i64,
        mem_total,
        disk_used: (disk_frac * disk_total as f64) as i64,
        disk_total,
    }
}

/// Log levels in severity order, as E2B names them.
pub(crate) const LOG_LEVELS: [&str; 4] = ["debug", "info", "warn", "error"];

pub(crate) fn log_level_rank(level: &str) -> Option<usize> {
    LOG_LEVELS.iter().position(|l| *l == level)
}

/// One `SandboxLogEntry`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogLine {
    pub t_ms: Ms,
    pub level: &'static str,
    pub message: String,
    pub fields: Vec<(&'static str, String)>,
}

/// How a log query reads: which lines exist, and which the caller wants.
pub(crate) struct LogQuery<'a> {
    pub key: u64,
    pub profile: Profile,
    /// Half-open `[start, end)` run spans, oldest first; lines exist only inside them.
    pub runs: &'a [(Ms, Ms)],
    /// No line after this (now, or the pause time).
    pub until: Ms,
    pub cursor: Option<Ms>,
    pub forward: bool,
    pub limit: usize,
    pub min_level: usize,
    pub search: Option<&'a str>,
}

fn log_cadence_ms(profile: Profile) -> Ms {
    match profile {
        Profile::Busy => 10_000,
        Profile::DiskGrowing => 30_000,
        Profile::Idle => 300_000,
    }
}

fn log_line(key: u64, profile: Profile, t_ms: Ms) -> LogLine {
    const BUSY: &[&str] = &[
        "POST /process.Process/Start 200",
        "process started",
        "process exited with code 0",
        "GET /files 200",
        "POST /files 200",
        "filesystem.Filesystem/ListDir 200",
        "process exited with code 1",
        "high memory pressure",
    ];
    const IDLE: &[&str] = &["envd heartbeat", "GET /health 204", "no active processes"];
    const DISK: &[&str] = &[
        "appending to /home/user/output.log",
        "disk usage above threshold",
        "POST /files 200",
        "process started",
    ];
    let h = mix(key ^ (t_ms as u64));
    let roll = unit(h);
    let level = if roll < 0.3 {
        "debug"
    } else if roll < 0.85 {
        "info"
    } else if roll < 0.96 {
        "warn"
    } else {
        "error"
    };
    let messages = match profile {
        Profile::Busy => BUSY,
        Profile::Idle => IDLE,
        Profile::DiskGrowing => DISK,
    };
    let message = messages[(mix(h) % messages.len() as u64) as usize].to_owned();
    let source = if message.starts_with("process") {
        "process"
    } else {
        "envd"
    };
    LogLine {
        t_ms,
        level,
        message,
        fields: vec![
            ("logger", source.to_owned()),
            ("pid", (100 + mix(h ^ 9) % 4000).to_string()),
        ],
    }
}

/// The log lines a query asks for, newest first when reading backward.
pub(crate) fn logs(q: &LogQuery<'_>) -> Vec<LogLine> {
    let cadence = log_cadence_ms(q.profile);
    let offset = (q.key % cadence as u64) as Ms;
    let first = q.runs.first().map_or(q.until, |r| r.0);
    let floor = first.max(q.until - LOG_RETENTION_MS);
    let in_run = |t: Ms| q.runs.iter().any(|&(a, b)| t >= a && t < b);
    let wanted = |line: &LogLine| {
        log_level_rank(line.level).unwrap_or(0) >= q.min_level
            && q.search.is_none_or(|s| line.message.contains(s))
    };
    // Candidate times are `offset + k * cadence`; walk k in the requested direction.
    let k_of = |t: Ms| (t - offset).div_euclid(cadence);
    let mut out = Vec::new();
    if q.limit == 0 {
        return out;
    }
    let (mut k, k_stop, step) = if q.forward {
        let start = q.cursor.unwrap_or(floor).max(floor);
        let k0 = k_of(start) + i64::from(offset + k_of(start) * cadence < start);
        (k0, k_of(q.until), 1)
    } else {
        let end = q.cursor.unwrap_or(q.until).min(q.until);
        (k_of(end), k_of(floor), -1)
    };
    let in_bounds = |k: i64| if q.forward { k <= k_stop } else { k >= k_stop };
    let mut scanned = 0;
    while in_bounds(k) && scanned < MAX_LOG_SCAN && out.len() < q.limit {
        scanned += 1;
        let t = offset + k * cadence;
        k += step;
        if t < floor || t > q.until || !in_run(t) {
            continue;
        }
        let line = log_line(q.key, q.profile, t);
        if wanted(&line) {
            out.push(line);
        }
    }
    out
}

/// `generated` (from [`logs`]) merged with lines written by events (`notes`, oldest first) that
/// the same query selects, in the query's order and cut to its limit.
pub(crate) fn merge_logs(
    q: &LogQuery<'_>,
    generated: Vec<LogLine>,
    notes: &[LogLine],
) -> Vec<LogLine> {
    let first = q.runs.first().map_or(q.until, |r| r.0);
    let floor = first.max(q.until - LOG_RETENTION_MS);
    let selected = notes.iter().filter(|l| {
        l.t_ms >= floor
            && l.t_ms <= q.until
            && match q.cursor {
                Some(c) if q.forward => l.t_ms >= c,
                Some(c) => l.t_ms <= c,
                None => true,
            }
            && log_level_rank(l.level).unwrap_or(0) >= q.min_level
            && q.search.is_none_or(|s| l.message.contains(s))
    });
    let mut out = generated;
    out.extend(selected.cloned());
    if q.forward {
        out.sort_by_key(|l| l.t_ms);
    } else {
        out.sort_by_key(|l| std::cmp::Reverse(l.t_ms));
    }
    out.truncate(q.limit);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(profile: Profile) -> SeriesKey {
        SeriesKey {
            key: 42,
            profile,
            memory_mb: 1024,
            disk_size_mb: 4096,
        }
    }

    #[test]
    fn idle_sandboxes_stay_under_one_percent_with_flat_disk() {
        let k = key(Profile::Idle);
        let disk = sample(&k, 0).disk_used;
        for t in (0..86_400).step_by(5) {
            let s = sample(&k, t);
            assert!(s.cpu_used_pct < 1.0, "{s:?}");
            assert_eq!(s.disk_used, disk);
        }
    }

    #[test]
    fn busy_sandboxes_range_between_twenty_and_ninety_percent() {
        let k = key(Profile::Busy);
        let cpus: Vec<f64> = (0..3600)
            .step_by(5)
            .map(|t| sample(&k, t).cpu_used_pct)
            .collect();
        assert!(cpus.iter().all(|c| (20.0..=90.0).contains(c)));
        let max = cpus.iter().cloned().fold(0.0, f64::max);
        let min = cpus.iter().cloned().fold(100.0, f64::min);
        assert!(max - min > 10.0, "busy CPU should vary, got {min}..{max}");
    }

    #[test]
    fn growing_disks_grow_over_an_hour() {
        let k = key(Profile::DiskGrowing);
        // Hours spread over months; the sawtooth resets once per 14 days (1 hour in 336).
        let grew = (0..100i64)
            .map(|i| i * 97_003)
            .filter(|&t| sample(&k, t + 3600).disk_used > sample(&k, t).disk_used)
            .count();
        assert!(grew >= 95, "disk grew in only {grew} of 100 hours");
    }

    #[test]
    fn metric_steps_keep_points_near_the_cap() {
        assert_eq!(metric_step_secs(60), 5);
        assert_eq!(metric_step_secs(3600), 10);
        assert_eq!(metric_step_secs(7 * 86_400) % 5, 0);
        assert!(7 * 86_400 / metric_step_secs(7 * 86_400) <= MAX_METRIC_POINTS);
    }

    #[test]
    fn ids_are_twenty_lowercase_alphanumerics() {
        let id = short_id('i', 12345);
        assert_eq!(id.len(), 20);
        assert!(
            id.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert!(uuid::Uuid::parse_str(&uuid_from(7)).is_ok());
    }

    #[test]
    fn logs_read_backward_newest_first_and_forward_oldest_first() {
        let runs = [(0, 3_600_000)];
        let mut q = LogQuery {
            key: 1,
            profile: Profile::Busy,
            runs: &runs,
            until: 3_600_000,
            cursor: None,
            forward: false,
            limit: 50,
            min_level: 0,
            search: None,
        };
        let back = logs(&q);
        assert_eq!(back.len(), 50);
        assert!(back.windows(2).all(|w| w[0].t_ms > w[1].t_ms));
        q.forward = true;
        let fwd = logs(&q);
        assert!(fwd.windows(2).all(|w| w[0].t_ms < w[1].t_ms));
        assert!(fwd[0].t_ms < back[49].t_ms);
        q.min_level = 3;
        assert!(logs(&q).iter().all(|l| l.level == "error"));
    }
}
