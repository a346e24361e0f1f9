//! docs/configuration.md names every setting Steward reads, and only those.
//!
//! The `steward.toml` keys are not a list kept by hand: they are found by asking the policy's own
//! parser (`Policy::parse`), whose tables refuse unknown keys and say which keys they take. A probe key
//! in a table gives that table's keys; a probe one level down tells a sub-table (`[hygiene.idle]`), a
//! table of named tables (`[api.tokens.<name>]`) and an array of tables (`[[push_tests]]`) from a
//! plain value. The environment variables are the names Steward's settings loader asks its `Env` for,
//! plus every name read in `src/` through `var("…")`, `var_os("…")`, a constant passed to them, or a
//! clap `env = "…"`, plus `RUST_LOG` where the log filter reads its default variable.
//!
//! The doc lists keys in tables under headings naming their table (``### `[hygiene.idle]` ``), one key
//! per row (`` | `cpu_threshold_pct` | … ``), and variables in the rows of its "Environment variables"
//! section. A `<…>` segment stands for any name.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;

use sandbox_steward::config::{EdgeSettings, Env, Policy, Settings};

const PROBE: &str = "zz_probe_key";
const NAME: &str = "zz_probe_name";
/// How a table of named tables shows in a path found in the code.
const ANY: &str = "<name>";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One step of a path as a TOML document is built: a key, or "inside an array of tables".
#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Array,
}

/// The document with `leaf` at `path`.
fn build(path: &[Step], leaf: toml::Value) -> toml::Value {
    match path.split_first() {
        None => leaf,
        Some((Step::Array, rest)) => toml::Value::Array(vec![build(rest, leaf)]),
        Some((Step::Key(k), rest)) => {
            let mut t = toml::Table::new();
            t.insert(k.clone(), build(rest, leaf));
            toml::Value::Table(t)
        }
    }
}

/// The keys of the table at `path`, when it is one that refuses unknown keys.
fn table_keys(path: &[Step]) -> Option<Vec<String>> {
    let mut probe = toml::Table::new();
    probe.insert(PROBE.into(), toml::Value::Integer(1));
    let doc = build(path, toml::Value::Table(probe));
    let text = toml::to_string(&doc).expect("a probe document serializes");
    let err = match Policy::parse(&text) {
        Ok(_) => return None,
        Err(e) => e.message().to_owned(),
    };
    let rest = err.strip_prefix(&format!("unknown field `{PROBE}`"))?;
    if rest.contains("there are no fields") {
        return Some(Vec::new());
    }
    let allowed = rest.split_once("expected")?.1;
    Some(
        allowed
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

/// Every key the policy accepts, as dotted paths (`hygiene.idle.cpu_threshold_pct`,
/// `api.tokens.<name>.sha256`); a table is a key too (`hygiene.idle`).
fn code_keys() -> BTreeSet<String> {
    fn walk(path: Vec<Step>, shown: Vec<String>, out: &mut BTreeSet<String>) {
        let keys = table_keys(&path)
            .unwrap_or_else(|| panic!("{} is not a table the probe can read", shown.join(".")));
        for key in keys {
            let mut p = path.clone();
            p.push(Step::Key(key.clone()));
            let mut s = shown.clone();
            s.push(key);
            out.insert(s.join("."));
            if table_keys(&p).is_some() {
                walk(p, s, out);
                continue;
            }
            let mut named = p.clone();
            named.push(Step::Key(NAME.into()));
            if table_keys(&named).is_some() {
                let mut s2 = s.clone();
                s2.push(ANY.into());
                out.insert(s2.join("."));
                walk(named, s2, out);
                continue;
            }
            let mut array = p.clone();
            array.push(Step::Array);
            if table_keys(&array).is_some() {
                walk(array, s, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(Vec::new(), Vec::new(), &mut out);
    out
}

/// The section of `doc` under the `## {title}` heading, up to the next `## `.
fn section<'a>(doc: &'a str, title: &str) -> &'a str {
    let start = doc
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("docs/configuration.md has no \"## {title}\" section"));
    let body = &doc[start + title.len() + 5..];
    &body[..body.find("\n## ").unwrap_or(body.len())]
}

/// The backticked words in the first cell of each table row of `text`.
fn first_cells(text: &str) -> impl Iterator<Item = (&str, Vec<String>)> {
    text.lines().filter(|l| l.starts_with("| `")).map(|l| {
        let cell = l.split('|').nth(1).unwrap_or_default();
        let words = cell
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        (l, words)
    })
}

/// The keys docs/configuration.md names, with where.
fn doc_keys(doc: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut table: Option<String> = None;
    for line in section(doc, "steward.toml").lines() {
        if let Some(heading) = line.strip_prefix("### ") {
            let path = heading
                .split('`')
                .nth(1)
                .map(|p| p.trim_matches(|c| c == '[' || c == ']').to_owned());
            if let Some(p) = &path {
                // `[a.b.c]` names the tables `a` and `a.b` too.
                let parts: Vec<&str> = p.split('.').collect();
                for n in 1..=parts.len() {
                    out.insert(parts[..n].join("."), line.to_owned());
                }
            }
            table = path;
            continue;
        }
        if let Some((row, words)) = first_cells(line).next() {
            let table = table
                .as_ref()
                .unwrap_or_else(|| panic!("a key row outside a table's heading: {row}"));
            for key in words {
                out.insert(format!("{table}.{key}"), row.to_owned());
            }
        }
    }
    out
}

/// Whether a doc path (where `<…>` is any one segment) names a code path.
fn matches(doc: &str, code: &str) -> bool {
    let d: Vec<&str> = doc.split('.').collect();
    let c: Vec<&str> = code.split('.').collect();
    d.len() == c.len()
        && d.iter()
            .zip(&c)
            .all(|(d, c)| d == c || d.starts_with('<') || *c == ANY)
}

/// Whether a doc path documents a code path: it names it, and writes the key's own name (a
/// heading `[approvals.approvers.<option>]` is the shape of a rule, not a row for `restore`).
fn documents(doc: &str, code: &str) -> bool {
    let last = |p: &str| p.rsplit('.').next().unwrap_or_default().to_owned();
    let (d, c) = (last(doc), last(code));
    matches(doc, code) && (d == c || (c == ANY && d.starts_with('<')))
}

#[test]
fn every_steward_toml_key_is_in_docs_configuration_md_and_every_key_there_exists() {
    let code = code_keys();
    // The probe reads what the parser says: if it found little, the parser's wording changed.
    for sure in [
        "channels.approvals",
        "approvals.approvers.kill.groups",
        "hygiene.idle.templates.<name>.idle_window",
        "api.tokens.<name>.sha256",
        "push_tests.repository",
    ] {
        assert!(code.contains(sure), "the probe missed {sure}: {code:?}");
    }
    let doc = doc_keys(&read("docs/configuration.md"));
    let undocumented: Vec<&String> = code
        .iter()
        .filter(|c| !doc.keys().any(|d| documents(d, c)))
        .collect();
    let unknown: Vec<(&String, &String)> = doc
        .iter()
        .filter(|(d, _)| !code.iter().any(|c| matches(d, c)))
        .collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "steward.toml keys Steward accepts that docs/configuration.md does not list: {undocumented:?}; \
         keys docs/configuration.md lists that Steward does not accept: {unknown:?}"
    );
}

/// An `Env` that answers nothing and remembers every name it was asked for.
#[derive(Default)]
struct Recorder(Mutex<BTreeSet<String>>);

impl Env for Recorder {
    fn var(&self, name: &str) -> Option<String> {
        self.0.lock().unwrap().insert(name.to_owned());
        None
    }
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn is_env_name(s: &str) -> bool {
    s.len() > 1
        && s.starts_with(|c: char| c.is_ascii_uppercase())
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// Every environment variable Steward reads (the simulators' own included: they are commands of
/// the same binary).
fn code_vars() -> BTreeSet<String> {
    let recorder = Recorder::default();
    // With nothing set, loading asks for every name it knows; the answer does not matter.
    let _ = Settings::load(&recorder);
    let _ = EdgeSettings::from_env(&recorder);
    let mut vars = recorder.0.into_inner().unwrap();
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let sources: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let mut consts = BTreeMap::new();
    for text in &sources {
        for line in text.lines() {
            let line = line.trim_start().trim_start_matches("pub ");
            if let Some(rest) = line.strip_prefix("const ")
                && let Some((name, value)) = rest.split_once(": &str = \"")
                && let Some(value) = value.strip_suffix("\";")
            {
                consts.insert(name.trim().to_owned(), value.to_owned());
            }
        }
    }
    for text in &sources {
        for opener in ["var(", "var_os(", "env = "] {
            for (at, _) in text.match_indices(opener) {
                let arg = text[at + opener.len()..].trim_start();
                if let Some(quoted) = arg.strip_prefix('"') {
                    let name = quoted.split('"').next().unwrap_or_default();
                    if is_env_name(name) {
                        vars.insert(name.to_owned());
                    }
                } else if opener != "env = " {
                    // A constant: `var(SANDBOX_URL_ENV)`, `var(crate::envd::client::SANDBOX_URL_ENV)`.
                    let path: String = arg
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    let last = path.rsplit("::").next().unwrap_or_default();
                    if let Some(value) = consts.get(last).filter(|v| is_env_name(v)) {
                        vars.insert(value.clone());
                    }
                }
            }
        }
        if text.contains("EnvFilter::try_from_default_env") || text.contains("from_default_env()") {
            vars.insert(tracing_subscriber::EnvFilter::DEFAULT_ENV.to_owned());
        }
    }
    vars
}

#[test]
fn every_environment_variable_is_in_docs_configuration_md_and_every_one_there_is_read() {
    let code = code_vars();
    for sure in [
        "E2B_API_KEY",
        "STEWARD_HEADER_TIMEOUT",
        "E2B_SANDBOX_URL",
        "STEWARD_URL",
        "RUST_LOG",
    ] {
        assert!(code.contains(sure), "the scan missed {sure}: {code:?}");
    }
    let doc = read("docs/configuration.md");
    let documented: BTreeSet<String> = first_cells(section(&doc, "Environment variables"))
        .flat_map(|(_, words)| words)
        .filter(|w| is_env_name(w))
        .collect();
    let undocumented: Vec<&String> = code.difference(&documented).collect();
    let unknown: Vec<&String> = documented.difference(&code).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "environment variables Steward reads that docs/configuration.md does not list: {undocumented:?}; \
         variables docs/configuration.md lists that Steward does not read: {unknown:?}"
    );
}

#[test]
fn the_key_probe_tells_tables_from_values() {
    // The probe itself, on shapes whose answer is known from the parser's behaviour.
    assert!(table_keys(&[Step::Key("hygiene".into())]).is_some());
    assert!(table_keys(&[Step::Key("channels".into()), Step::Key("approvals".into())]).is_none());
    assert!(matches("api.tokens.<name>.rate", "api.tokens.<name>.rate"));
    assert!(matches(
        "approvals.approvers.<option>.users",
        "approvals.approvers.kill.users"
    ));
    assert!(!matches(
        "approvals.approvers.kill",
        "approvals.approvers.kill.users"
    ));
    assert!(documents(
        "approvals.approvers.<option>.users",
        "approvals.approvers.kill.users"
    ));
    assert!(!documents(
        "approvals.approvers.<option>",
        "approvals.approvers.restore"
    ));
    assert!(documents("api.tokens.<name>", "api.tokens.<name>"));
}
