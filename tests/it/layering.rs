//! Tidy test for the layering in `docs/architecture.md`: reads `src/` and fails when a module imports what the
//! map says it must never, or when two top-level modules import each other. A failure names file, line and rule.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What a leaf (`metrics`, `telemetry`) may not import: every other module of ours, and the I/O
/// crates. (A module's paths to itself are never written `crate::itself`.)
const LEAF_MAY_NOT_IMPORT: &[&str] = &[
    "alerts",
    "approvals",
    "cases",
    "cli",
    "config",
    "e2b",
    "envd",
    "execute",
    "github",
    "http",
    "hygiene",
    "ids",
    "jobs",
    "mcp",
    "metrics",
    "runs",
    "sim",
    "slack",
    "startup",
    "store",
    "telemetry",
    "tokio",
    "reqwest",
    "redis",
    "axum",
    "hyper",
];

/// `(module, forbidden imports, why)`. Imports are top-level modules of this crate or external crates.
const NEVER: &[(&str, &[&str], &str)] = &[
    (
        "cases",
        &[
            "store",
            "e2b",
            "slack",
            "http",
            "jobs",
            "approvals",
            "hygiene",
            "cli",
            "startup",
            "sim",
            "tokio",
            "reqwest",
            "redis",
            "axum",
            "hyper",
        ],
        "cases is pure: no I/O, no clock",
    ),
    (
        "store",
        &[
            "http",
            "slack",
            "e2b",
            "approvals",
            "hygiene",
            "cli",
            "startup",
        ],
        "store knows Redis only",
    ),
    (
        "e2b",
        &["slack", "store", "cases", "approvals", "http", "hygiene"],
        "e2b is the control-plane client only",
    ),
    (
        "envd",
        &[
            "slack",
            "store",
            "http",
            "approvals",
            "hygiene",
            "cases",
            "e2b",
        ],
        "envd is the data-plane client only",
    ),
    (
        "slack",
        &["store", "e2b", "approvals", "http", "hygiene", "jobs"],
        "slack speaks Slack only",
    ),
    (
        "runs",
        &[
            "http",
            "slack",
            "cli",
            "approvals",
            "hygiene",
            "startup",
            "execute",
            "sim",
        ],
        "runs never posts to Slack and sits below the surfaces; the run case is handed over by startup",
    ),
    (
        "github",
        &[
            "approvals",
            "slack",
            "cli",
            "sim",
            "http",
            "startup",
            "config",
        ],
        "github turns pushes into runs; alerts and the HTTP surface sit above it",
    ),
    (
        "alerts",
        &["approvals", "runs", "http", "cli", "sim", "github"],
        "alerts posts what it is handed; callers glue runs and pushes to it",
    ),
    (
        "lifecycle",
        &[
            "store",
            "slack",
            "http",
            "approvals",
            "cases",
            "e2b",
            "hygiene",
            "jobs",
            "sim",
            "tokio",
            "reqwest",
            "redis",
            "axum",
            "hyper",
        ],
        "lifecycle is E2B's event shape and signature check only; what an event does lives in approvals",
    ),
    (
        "watch",
        &[
            "store",
            "slack",
            "http",
            "approvals",
            "e2b",
            "hygiene",
            "jobs",
            "sim",
            "tokio",
            "reqwest",
            "redis",
            "axum",
            "hyper",
        ],
        "watch is the [[watch]] rules and what matches them only; what a finding does lives in approvals",
    ),
    (
        "metrics",
        LEAF_MAY_NOT_IMPORT,
        "metrics is a leaf every layer calls: label values are static strings, never our ids",
    ),
    (
        "telemetry",
        LEAF_MAY_NOT_IMPORT,
        "telemetry is a leaf every layer may call: where logs go, and the warning gate",
    ),
    (
        "demo",
        &[
            "approvals",
            "cases",
            "jobs",
            "runs",
            "http",
            "execute",
            "mcp",
            "alerts",
            "e2b",
            "envd",
            "slack",
        ],
        "demo drives Steward through its seams (settings, startup, HTTP, the sweep), never its internals",
    ),
];

/// `(module, the only modules that may import it, why)`.
const ONLY_FROM: &[(&str, &[&str], &str)] = &[
    (
        "demo",
        &["cli"],
        "the demo is a command, not a library for other modules",
    ),
    (
        "sim",
        &["cli", "demo"],
        "production code never calls into the simulators",
    ),
];

const EXTERNAL: &[&str] = &["tokio", "reqwest", "redis", "axum", "hyper"];

#[derive(Debug, Clone)]
struct Import {
    file: PathBuf,
    line: usize,
    target: String,
}

/// Every `crate::x` path and every `use crate::{x, y::z}` group member, plus uses of external I/O crates.
fn imports_of(text: &str) -> Vec<(usize, String)> {
    let code = strip_comments(text);
    let mut found = Vec::new();
    for (index, line) in code.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let preceded_by_ident = at > 0
                && rest[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            rest = &rest[at + "crate::".len()..];
            if preceded_by_ident {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                found.extend(group_members(group).into_iter().map(|m| (index + 1, m)));
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.push((index + 1, name));
                }
            }
        }
        for krate in EXTERNAL {
            let path = format!("{krate}::");
            let mut from = 0;
            while let Some(at) = line[from..].find(&path) {
                let start = from + at;
                let ok_start = start == 0
                    || !line[..start]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
                if ok_start {
                    found.push((index + 1, (*krate).to_string()));
                }
                from = start + path.len();
            }
        }
    }
    // A group may span lines: find `use crate::{` and read to its closing brace.
    let mut from = 0;
    while let Some(at) = code[from..].find("crate::{") {
        let start = from + at + "crate::{".len();
        let line = code[..start].lines().count();
        let body = &code[start..];
        if body[..body.find('}').unwrap_or(body.len())].contains('\n') {
            found.extend(group_members(body).into_iter().map(|m| (line, m)));
        }
        from = start;
    }
    found
}

/// Top-level names in `a, b::{c, d}, e::f}` (reads up to the group's closing brace).
fn group_members(group: &str) -> Vec<String> {
    let mut members = Vec::new();
    let mut depth = 0usize;
    let mut at_item_start = true;
    let mut current = String::new();
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                at_item_start = true;
                current.clear();
                continue;
            }
            _ => {}
        }
        if depth == 0 && at_item_start {
            if c.is_alphanumeric() || c == '_' {
                current.push(c);
            } else if !current.is_empty() {
                members.push(std::mem::take(&mut current));
                at_item_start = false;
            }
        }
    }
    if at_item_start && !current.is_empty() {
        members.push(current);
    }
    members.retain(|m| m != "self");
    members
}

/// Removes `//` and `/* */` comments and the contents of string literals, keeping line breaks.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                    }
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            '"' => {
                out.push('"');
                let mut escaped = false;
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                    }
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    }
                }
                out.push('"');
            }
            _ => out.push(c),
        }
    }
    out
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("file under src");
    let first = rel.components().next().expect("non-empty path");
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_string()
}

/// Imports between top-level modules of this crate (and of external I/O crates), by importing module.
fn module_imports() -> BTreeMap<String, Vec<Import>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut by_module: BTreeMap<String, Vec<Import>> = BTreeMap::new();
    for file in files {
        let module = top_module(&src, &file);
        let text = std::fs::read_to_string(&file).expect("source is readable");
        for (line, target) in imports_of(&text) {
            if target != module {
                let shown = file
                    .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                    .unwrap_or(&file)
                    .to_path_buf();
                by_module.entry(module.clone()).or_default().push(Import {
                    file: shown,
                    line,
                    target,
                });
            }
        }
    }
    by_module
}

fn violations(imports: &BTreeMap<String, Vec<Import>>) -> Vec<String> {
    let mut problems = Vec::new();
    for (module, forbidden, why) in NEVER {
        for import in imports.get(*module).into_iter().flatten() {
            if forbidden.contains(&import.target.as_str()) {
                problems.push(format!(
                    "{}:{}: `{module}` imports `{}` ({why})",
                    import.file.display(),
                    import.line,
                    import.target
                ));
            }
        }
    }
    for (target, allowed, why) in ONLY_FROM {
        for (module, list) in imports {
            if allowed.contains(&module.as_str()) || module == target {
                continue;
            }
            for import in list.iter().filter(|i| i.target == *target) {
                problems.push(format!(
                    "{}:{}: `{module}` imports `{target}` ({why})",
                    import.file.display(),
                    import.line,
                ));
            }
        }
    }
    if let Some(sim) = imports.get("sim") {
        for import in sim
            .iter()
            .filter(|i| !EXTERNAL.contains(&i.target.as_str()))
        {
            problems.push(format!(
                "{}:{}: `sim` imports `{}` (the simulators use nothing of ours outside sim)",
                import.file.display(),
                import.line,
                import.target
            ));
        }
    }
    for (module, list) in imports {
        for import in list
            .iter()
            .filter(|i| !EXTERNAL.contains(&i.target.as_str()))
        {
            if module.as_str() < import.target.as_str()
                && let Some(back) = imports
                    .get(&import.target)
                    .and_then(|l| l.iter().find(|b| &b.target == module))
            {
                problems.push(format!(
                        "{}:{}: `{module}` imports `{}` while {}:{} imports `{module}` (no two top-level modules import each other)",
                        import.file.display(),
                        import.line,
                        import.target,
                        back.file.display(),
                        back.line
                    ));
            }
        }
    }
    problems.sort();
    problems.dedup_by(|a, b| {
        a.split(" while ").next() == b.split(" while ").next() && a.contains("while")
    });
    problems
}

#[test]
fn modules_import_only_what_the_architecture_allows() {
    let problems = violations(&module_imports());
    assert!(
        problems.is_empty(),
        "layering rules broken (docs/architecture.md):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_import_reader_sees_grouped_multiline_and_ignores_comments() {
    let text = "use crate::{\n    cases::Case,\n    store::{Store, keys},\n};\n// use crate::http;\nlet x = \"crate::slack\";\nfn f() { crate::e2b::go(); tokio::spawn(x); }\n";
    let mut names: Vec<String> = imports_of(text).into_iter().map(|(_, n)| n).collect();
    names.sort();
    names.dedup();
    assert_eq!(names, ["cases", "e2b", "store", "tokio"]);
}

#[test]
fn a_forbidden_import_is_reported_with_file_line_and_rule() {
    let mut imports = BTreeMap::new();
    imports.insert(
        "cases".to_string(),
        vec![Import {
            file: "src/cases/mod.rs".into(),
            line: 7,
            target: "store".into(),
        }],
    );
    imports.insert(
        "store".to_string(),
        vec![Import {
            file: "src/store/mod.rs".into(),
            line: 3,
            target: "cases".into(),
        }],
    );
    let problems = violations(&imports);
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("src/cases/mod.rs:7: `cases` imports `store`")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("while src/store/mod.rs:3 imports `cases`")),
        "{problems:?}"
    );
}

#[test]
fn only_the_command_line_imports_the_demo_and_only_it_and_the_demo_import_the_simulators() {
    let import = |file: &str, target: &str| Import {
        file: file.into(),
        line: 1,
        target: target.into(),
    };
    let mut imports = BTreeMap::new();
    imports.insert("cli".to_string(), vec![import("src/cli/demo.rs", "demo")]);
    imports.insert("demo".to_string(), vec![import("src/demo/mod.rs", "sim")]);
    imports.insert("http".to_string(), vec![import("src/http/mod.rs", "sim")]);
    imports.insert(
        "startup".to_string(),
        vec![import("src/startup.rs", "demo")],
    );
    let problems = violations(&imports);
    assert_eq!(
        problems,
        [
            "src/http/mod.rs:1: `http` imports `sim` (production code never calls into the simulators)",
            "src/startup.rs:1: `startup` imports `demo` (the demo is a command, not a library for other modules)",
        ],
    );
}
