//! The `/sandbox` command language: slash-command text parses into one [`SandboxCommand`].
//!
//! Parsing is pure and total: every input becomes a command, and input we cannot understand
//! becomes [`SandboxCommand::Invalid`] with a sentence for the user. This module must not call
//! E2B or Slack; running a command is `execute`'s job.
use std::time::Duration;

use crate::duration::{MAX_REFRESH_SECS, parse as parse_duration};
use crate::ids::{SandboxId, TemplateId};

/// Longest duration accepted for timeouts and look-back windows.
pub const MAX_DURATION_SECS: u64 = 31 * 24 * 3600;
/// Longest sandbox timeout E2B accepts (24 h on the Pro tier).
pub const MAX_SANDBOX_TIMEOUT_SECS: u64 = 24 * 3600;
/// Most log lines a user may ask for.
pub const MAX_LOG_LIMIT: u32 = 1000;
/// Default look-back of `metrics`.
pub const DEFAULT_METRICS_SINCE: Duration = Duration::from_secs(2 * 3600);
/// Default look-back of `team`.
pub const DEFAULT_TEAM_SINCE: Duration = Duration::from_secs(24 * 3600);

/// Which sandboxes `list` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ListState {
    Running,
    Paused,
    All,
}

/// Minimum severity for `logs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LevelFilter {
    Info,
    Warn,
    Error,
}

impl LevelFilter {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
        }
    }
}

/// Arguments of `list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListArgs {
    pub state: ListState,
    pub template: Option<String>,
    /// `key=value` metadata filters, in the order given.
    pub metadata: Vec<(String, String)>,
    /// `steward`: only the sandboxes Steward created for runs and push tests.
    pub steward: bool,
}

/// Arguments of `logs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogsArgs {
    pub id: SandboxId,
    pub level: Option<LevelFilter>,
    pub search: Option<String>,
    pub limit: Option<u32>,
}

/// One `/sandbox` invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxCommand {
    Help,
    List(ListArgs),
    Get {
        id: SandboxId,
    },
    Logs(LogsArgs),
    Metrics {
        id: SandboxId,
        since: Duration,
    },
    Team {
        since: Duration,
    },
    Pause {
        id: SandboxId,
    },
    Resume {
        id: SandboxId,
        timeout: Option<Duration>,
    },
    Timeout {
        id: SandboxId,
        duration: Duration,
    },
    Refresh {
        id: SandboxId,
        duration: Duration,
    },
    Snapshot {
        id: SandboxId,
        name: Option<String>,
    },
    Snapshots {
        sandbox: Option<SandboxId>,
    },
    Templates,
    Template {
        id: TemplateId,
    },
    /// Destructive: opens an approval case, never runs directly. `reason` is the rest of the
    /// line, if any.
    Kill {
        id: SandboxId,
        reason: Option<String>,
    },
    /// Destructive: opens an approval case, never runs directly.
    DeleteTemplate {
        id: TemplateId,
        reason: Option<String>,
    },
    /// The audit timeline of a case (`case_…`), a sandbox, or a template.
    History {
        target: String,
    },
    /// A hygiene sweep now; a dry run only reports what would be raised.
    Sweep {
        dry_run: bool,
    },
    /// Input we could not understand; `problem` is a sentence for the user.
    Invalid {
        problem: String,
    },
}

impl SandboxCommand {
    /// Whether answering needs a call to E2B (and so must be deferred past the 3 s ack).
    pub fn needs_e2b(&self) -> bool {
        !matches!(
            self,
            Self::Help
                | Self::Invalid { .. }
                | Self::Kill { .. }
                | Self::DeleteTemplate { .. }
                | Self::History { .. }
        )
    }

    /// Parses the `text` of a slash command.
    pub fn parse(text: &str) -> Self {
        match tokenize(text) {
            Ok(words) => parse_words(&words).unwrap_or_else(|problem| Self::Invalid { problem }),
            Err(problem) => Self::Invalid { problem },
        }
    }
}

/// Splits on whitespace, keeping `"double quoted"` runs together (Slack clients may send curly
/// quotes, so those count too).
fn tokenize(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut in_quotes = false;
    let mut started = false;
    for c in text.chars() {
        match c {
            '"' | '\u{201c}' | '\u{201d}' => {
                in_quotes = !in_quotes;
                started = true;
            }
            c if c.is_whitespace() && !in_quotes => {
                if started {
                    words.push(std::mem::take(&mut current));
                    started = false;
                }
            }
            c => {
                current.push(c);
                started = true;
            }
        }
    }
    if in_quotes {
        return Err("A quote is not closed.".into());
    }
    if started {
        words.push(current);
    }
    Ok(words)
}

type Parsed = Result<SandboxCommand, String>;

fn parse_words(words: &[String]) -> Parsed {
    let Some((verb, rest)) = words.split_first() else {
        return Ok(SandboxCommand::Help);
    };
    let verb = verb.to_lowercase();
    let mut args = Args::new(&verb, rest);
    let cmd = match verb.as_str() {
        "help" | "?" => SandboxCommand::Help,
        "list" | "ls" => parse_list(&mut args)?,
        "get" | "show" => SandboxCommand::Get {
            id: args.sandbox_id()?,
        },
        "logs" => {
            let id = args.sandbox_id()?;
            let level = match args.option("level") {
                None => None,
                Some(v) => Some(match v.to_lowercase().as_str() {
                    "info" => LevelFilter::Info,
                    "warn" | "warning" => LevelFilter::Warn,
                    "error" => LevelFilter::Error,
                    _ => return Err(format!("`level={v}` is not one of info, warn, error.")),
                }),
            };
            let search = args.option("search");
            let limit = match args.option("limit") {
                None => None,
                Some(v) => match v.parse::<u32>() {
                    Ok(n) if (1..=MAX_LOG_LIMIT).contains(&n) => Some(n),
                    _ => {
                        return Err(format!(
                            "`limit={v}` must be a whole number from 1 to {MAX_LOG_LIMIT}."
                        ));
                    }
                },
            };
            SandboxCommand::Logs(LogsArgs {
                id,
                level,
                search,
                limit,
            })
        }
        "metrics" => {
            let id = args.sandbox_id()?;
            let since = args.duration_option("since", DEFAULT_METRICS_SINCE)?;
            SandboxCommand::Metrics { id, since }
        }
        "team" => SandboxCommand::Team {
            since: args.duration_option("since", DEFAULT_TEAM_SINCE)?,
        },
        "pause" => SandboxCommand::Pause {
            id: args.sandbox_id()?,
        },
        "resume" => {
            let id = args.sandbox_id()?;
            let timeout = match args.option("timeout") {
                None => None,
                Some(v) => Some(sandbox_timeout("timeout", &v)?),
            };
            SandboxCommand::Resume { id, timeout }
        }
        "timeout" => {
            let id = args.sandbox_id()?;
            let duration = sandbox_timeout("duration", &args.required("duration", "10m")?)?;
            SandboxCommand::Timeout { id, duration }
        }
        "refresh" => {
            let id = args.sandbox_id()?;
            let value = args.required("duration", "10m")?;
            let duration = duration("duration", &value)?;
            if duration.as_secs() > MAX_REFRESH_SECS {
                return Err(format!(
                    "`{value}` is longer than E2B's refresh limit of 1h."
                ));
            }
            SandboxCommand::Refresh { id, duration }
        }
        "snapshot" => {
            let id = args.sandbox_id()?;
            let name = match args.positional() {
                None => None,
                Some(name) => {
                    // Snapshot names become template aliases: keep them to what E2B accepts.
                    TemplateId::parse(&name).map_err(|_| {
                        format!("`{name}` is not a usable snapshot name: use letters, digits, '-' and '_'.")
                    })?;
                    Some(name)
                }
            };
            SandboxCommand::Snapshot { id, name }
        }
        "snapshots" => SandboxCommand::Snapshots {
            sandbox: match args.positional() {
                None => None,
                Some(id) => Some(sandbox_id(&id)?),
            },
        },
        "templates" => SandboxCommand::Templates,
        "template" => SandboxCommand::Template {
            id: args.template_id()?,
        },
        "kill" => SandboxCommand::Kill {
            id: args.sandbox_id()?,
            reason: args.rest(),
        },
        "delete-template" => SandboxCommand::DeleteTemplate {
            id: args.template_id()?,
            reason: args.rest(),
        },
        "history" => SandboxCommand::History {
            target: args.required("sandbox-id|case-id", "i1a2b3c4")?,
        },
        "sweep" => {
            let dry_run = match args.positional().as_deref() {
                None => false,
                Some("--dry-run" | "dry-run" | "—dry-run") => true,
                Some(other) => {
                    return Err(format!(
                        "`sweep` takes only `--dry-run`; `{other}` is not something it knows."
                    ));
                }
            };
            SandboxCommand::Sweep { dry_run }
        }
        other => return Err(unknown_subcommand(other)),
    };
    args.finish()?;
    Ok(cmd)
}

/// Every subcommand, in the order `help` shows them (aliases such as `ls` are left out).
pub const SUBCOMMANDS: [&str; 18] = [
    "list",
    "get",
    "logs",
    "metrics",
    "team",
    "snapshots",
    "templates",
    "template",
    "history",
    "pause",
    "resume",
    "timeout",
    "refresh",
    "snapshot",
    "kill",
    "delete-template",
    "sweep",
    "help",
];

/// Longest edit distance at which a typo still gets a "did you mean".
const SUGGEST_MAX_DISTANCE: usize = 2;

/// The sentence for a verb we do not know: the nearest subcommand when one is close, and the
/// list of all of them, so the person can retype without opening help.
fn unknown_subcommand(verb: &str) -> String {
    let all = SUBCOMMANDS.map(|s| format!("`{s}`")).join(", ");
    let nearest = SUBCOMMANDS
        .iter()
        .map(|s| (edit_distance(verb, s), *s))
        .min_by_key(|(d, _)| *d)
        .filter(|(d, s)| *d <= SUGGEST_MAX_DISTANCE.min(s.len() / 2));
    match nearest {
        Some((_, s)) => {
            format!("I don't know the subcommand `{verb}`. Did you mean `{s}`? Subcommands: {all}.")
        }
        None => format!("I don't know the subcommand `{verb}`. Subcommands: {all}."),
    }
}

/// Levenshtein distance in characters (inputs are single words, so the quadratic table is tiny).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(previous + 1);
        }
    }
    row[b.len()]
}

fn parse_list(args: &mut Args<'_>) -> Parsed {
    let mut state = ListState::All;
    let mut template = None;
    let mut metadata = Vec::new();
    let mut state_given = false;
    let mut steward = false;
    while let Some(word) = args.next_raw() {
        if word.eq_ignore_ascii_case("steward") {
            steward = true;
            continue;
        }
        if let Some((key, value)) = word.split_once('=') {
            if key.is_empty() || value.is_empty() {
                return Err(format!(
                    "`{word}` needs a key and a value, like `owner=alice`."
                ));
            }
            if key.eq_ignore_ascii_case("template") {
                template = Some(value.to_owned());
            } else {
                metadata.push((key.to_owned(), value.to_owned()));
            }
            continue;
        }
        if state_given {
            return Err(format!("`list` takes one state; `{word}` is extra."));
        }
        state = match word.to_lowercase().as_str() {
            "running" => ListState::Running,
            "paused" => ListState::Paused,
            "all" => ListState::All,
            _ => {
                return Err(format!(
                    "`{word}` is not a state: use running, paused or all, `steward` for Steward's own, or a `key=value` filter."
                ));
            }
        };
        state_given = true;
    }
    Ok(SandboxCommand::List(ListArgs {
        state,
        template,
        metadata,
        steward,
    }))
}

fn sandbox_id(word: &str) -> Result<SandboxId, String> {
    SandboxId::parse(word).map_err(|_| format!("`{word}` is not a sandbox id."))
}

fn sandbox_timeout(name: &str, value: &str) -> Result<Duration, String> {
    let d = duration(name, value)?;
    if d.as_secs() > MAX_SANDBOX_TIMEOUT_SECS {
        return Err(format!("`{value}` is longer than E2B's limit of 24h."));
    }
    Ok(d)
}

fn duration(name: &str, value: &str) -> Result<Duration, String> {
    let bad = || format!("`{name}={value}` is not a duration like 90s, 10m or 2h.");
    let d = parse_duration(name, value).map_err(|_| bad())?;
    if d.is_zero() || d.as_secs() > MAX_DURATION_SECS {
        return Err(format!(
            "`{value}` must be more than zero and at most 31 days."
        ));
    }
    Ok(d)
}

/// The words after the verb, consumed positionally or as `key=value` options.
struct Args<'a> {
    verb: &'a str,
    words: Vec<Option<&'a str>>,
}

impl<'a> Args<'a> {
    fn new(verb: &'a str, words: &'a [String]) -> Self {
        Self {
            verb,
            words: words.iter().map(|w| Some(w.as_str())).collect(),
        }
    }

    fn next_raw(&mut self) -> Option<&'a str> {
        self.words.iter_mut().find_map(Option::take)
    }

    /// The next word that is not a `key=value` option.
    fn positional(&mut self) -> Option<String> {
        self.words
            .iter_mut()
            .find(|w| w.is_some_and(|w| !w.contains('=')))
            .and_then(Option::take)
            .map(str::to_owned)
    }

    /// Every word left, joined by spaces (a free-text reason).
    fn rest(&mut self) -> Option<String> {
        let words: Vec<&str> = self.words.iter_mut().filter_map(Option::take).collect();
        (!words.is_empty()).then(|| words.join(" "))
    }

    fn option(&mut self, key: &str) -> Option<String> {
        self.words.iter_mut().find_map(|slot| {
            let (k, v) = slot.as_ref()?.split_once('=')?;
            if !k.eq_ignore_ascii_case(key) {
                return None;
            }
            let v = v.to_owned();
            *slot = None;
            Some(v)
        })
    }

    fn duration_option(&mut self, key: &str, default: Duration) -> Result<Duration, String> {
        match self.option(key) {
            None => Ok(default),
            Some(v) => duration(key, &v),
        }
    }

    fn required(&mut self, what: &str, example: &str) -> Result<String, String> {
        self.positional()
            .ok_or_else(|| format!("`{}` needs a {what}, for example `{example}`.", self.verb))
    }

    fn sandbox_id(&mut self) -> Result<SandboxId, String> {
        let word = self.positional().ok_or_else(|| {
            format!(
                "`{}` needs a sandbox id, for example `{} i1a2b3c4`.",
                self.verb, self.verb
            )
        })?;
        sandbox_id(&word)
    }

    fn template_id(&mut self) -> Result<TemplateId, String> {
        let word = self.positional().ok_or_else(|| {
            format!(
                "`{}` needs a template id, for example `{} base`.",
                self.verb, self.verb
            )
        })?;
        TemplateId::parse(&word).map_err(|_| format!("`{word}` is not a template id."))
    }

    /// Anything left over is a mistake worth pointing out rather than silently ignoring.
    fn finish(self) -> Result<(), String> {
        let extra: Vec<&str> = self.words.into_iter().flatten().collect();
        if extra.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "`{}` does not understand `{}`.",
                self.verb,
                extra.join(" ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> SandboxId {
        SandboxId::parse(s).unwrap()
    }

    fn check(text: &str, expected: SandboxCommand) {
        assert_eq!(SandboxCommand::parse(text), expected, "input {text:?}");
    }

    fn invalid(text: &str) -> String {
        match SandboxCommand::parse(text) {
            SandboxCommand::Invalid { problem } => problem,
            other => panic!("{text:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn an_unknown_subcommand_suggests_the_nearest_and_lists_them_all() {
        let typo = invalid("lsit");
        assert!(
            typo.starts_with("I don't know the subcommand `lsit`. Did you mean `list`?"),
            "{typo}"
        );
        assert!(
            typo.ends_with("`delete-template`, `sweep`, `help`."),
            "{typo}"
        );
        assert!(invalid("snapshts").contains("Did you mean `snapshots`?"));
        assert!(invalid("Paus i1").contains("Did you mean `pause`?"));
        // Nothing is close to `destroy`: no guess, only the list.
        let far = invalid("destroy");
        assert!(!far.contains("Did you mean"), "{far}");
        assert!(far.contains("Subcommands: `list`, `get`"), "{far}");
        // Every listed subcommand parses as itself, not as unknown.
        for verb in SUBCOMMANDS {
            if let SandboxCommand::Invalid { problem } = SandboxCommand::parse(verb) {
                assert!(!problem.contains("don't know"), "{verb}: {problem}");
            }
        }
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "get"), 3);
    }

    #[test]
    fn empty_text_and_help_show_help() {
        check("", SandboxCommand::Help);
        check("   ", SandboxCommand::Help);
        check("help", SandboxCommand::Help);
        check("HELP", SandboxCommand::Help);
    }

    #[test]
    fn list_takes_a_state_a_template_and_metadata_filters() {
        check(
            "list",
            SandboxCommand::List(ListArgs {
                state: ListState::All,
                template: None,
                metadata: vec![],
                steward: false,
            }),
        );
        check(
            "list running steward",
            SandboxCommand::List(ListArgs {
                state: ListState::Running,
                template: None,
                metadata: vec![],
                steward: true,
            }),
        );
        check(
            "list paused template=base owner=alice env=\"ci prod\"",
            SandboxCommand::List(ListArgs {
                state: ListState::Paused,
                template: Some("base".into()),
                metadata: vec![
                    ("owner".into(), "alice".into()),
                    ("env".into(), "ci prod".into()),
                ],
                steward: false,
            }),
        );
        assert!(invalid("list running paused").contains("one state"));
        assert!(invalid("list sleeping").contains("not a state"));
        assert!(invalid("list owner=").contains("key and a value"));
    }

    #[test]
    fn sandbox_subcommands_take_an_id() {
        check("get i123", SandboxCommand::Get { id: id("i123") });
        check("pause i123", SandboxCommand::Pause { id: id("i123") });
        check(
            "kill i123",
            SandboxCommand::Kill {
                id: id("i123"),
                reason: None,
            },
        );
        check(
            "kill i123 done with it, thanks",
            SandboxCommand::Kill {
                id: id("i123"),
                reason: Some("done with it, thanks".into()),
            },
        );
        check(
            "history case_abc",
            SandboxCommand::History {
                target: "case_abc".into(),
            },
        );
        check(
            "resume i123",
            SandboxCommand::Resume {
                id: id("i123"),
                timeout: None,
            },
        );
        check(
            "resume i123 timeout=10m",
            SandboxCommand::Resume {
                id: id("i123"),
                timeout: Some(Duration::from_secs(600)),
            },
        );
        check("sweep", SandboxCommand::Sweep { dry_run: false });
        check("sweep --dry-run", SandboxCommand::Sweep { dry_run: true });
        // Slack clients may turn `--` into an em dash.
        check("sweep —dry-run", SandboxCommand::Sweep { dry_run: true });
        assert!(invalid("sweep now").contains("only `--dry-run`"));
        assert!(invalid("sweep --dry-run twice").contains("does not understand"));
        assert!(invalid("get").contains("needs a sandbox id"));
        assert!(invalid("get a/b").contains("not a sandbox id"));
        assert!(invalid("get i1 i2").contains("does not understand `i2`"));
    }

    #[test]
    fn logs_options_are_checked() {
        check(
            "logs i1 level=warn search=\"disk full\" limit=50",
            SandboxCommand::Logs(LogsArgs {
                id: id("i1"),
                level: Some(LevelFilter::Warn),
                search: Some("disk full".into()),
                limit: Some(50),
            }),
        );
        assert!(invalid("logs i1 level=loud").contains("info, warn, error"));
        assert!(invalid("logs i1 limit=0").contains("1 to 1000"));
        assert!(invalid("logs i1 limit=lots").contains("1 to 1000"));
        assert!(invalid("logs i1 colour=red").contains("does not understand"));
    }

    #[test]
    fn durations_have_defaults_and_limits() {
        check(
            "metrics i1",
            SandboxCommand::Metrics {
                id: id("i1"),
                since: DEFAULT_METRICS_SINCE,
            },
        );
        check(
            "team since=1h",
            SandboxCommand::Team {
                since: Duration::from_secs(3600),
            },
        );
        check(
            "timeout i1 30m",
            SandboxCommand::Timeout {
                id: id("i1"),
                duration: Duration::from_secs(1800),
            },
        );
        check(
            "refresh i1 90",
            SandboxCommand::Refresh {
                id: id("i1"),
                duration: Duration::from_secs(90),
            },
        );
        assert!(invalid("timeout i1").contains("needs a duration"));
        assert!(invalid("timeout i1 soon").contains("not a duration"));
        assert!(invalid("timeout i1 25h").contains("24h"));
        assert!(invalid("refresh i1 2h").contains("1h"));
        assert!(invalid("team since=0s").contains("more than zero"));
    }

    #[test]
    fn snapshots_and_templates_parse() {
        check(
            "snapshot i1",
            SandboxCommand::Snapshot {
                id: id("i1"),
                name: None,
            },
        );
        check(
            "snapshot i1 before-upgrade",
            SandboxCommand::Snapshot {
                id: id("i1"),
                name: Some("before-upgrade".into()),
            },
        );
        check("snapshots", SandboxCommand::Snapshots { sandbox: None });
        check(
            "snapshots i1",
            SandboxCommand::Snapshots {
                sandbox: Some(id("i1")),
            },
        );
        check("templates", SandboxCommand::Templates);
        check(
            "template base",
            SandboxCommand::Template {
                id: TemplateId::parse("base").unwrap(),
            },
        );
        check(
            "delete-template base",
            SandboxCommand::DeleteTemplate {
                id: TemplateId::parse("base").unwrap(),
                reason: None,
            },
        );
        assert!(invalid("snapshot i1 bad?name").contains("snapshot name"));
    }

    #[test]
    fn unknown_input_becomes_a_helpful_variant() {
        assert!(invalid("destroy everything").contains("`destroy`"));
        assert!(invalid("get \"i1").contains("quote"));
    }

    #[test]
    fn only_commands_that_touch_e2b_are_deferred() {
        assert!(!SandboxCommand::parse("help").needs_e2b());
        assert!(!SandboxCommand::parse("nonsense").needs_e2b());
        assert!(!SandboxCommand::parse("kill i1").needs_e2b());
        assert!(SandboxCommand::parse("list").needs_e2b());
        assert!(SandboxCommand::parse("pause i1").needs_e2b());
    }
}
