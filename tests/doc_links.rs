//! Every relative link in README.md, docs/*.md and benches/README.md leads somewhere: the file
//! exists, and a `#fragment` is a heading of the file it points into (GitHub's anchors).
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn documents() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md"), root().join("benches/README.md")];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files
}

/// The text outside fenced code blocks and inline code, where links are links.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Drop inline code spans.
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                out.push_str(part);
            }
        }
        out.push('\n');
    }
    out
}

/// GitHub's anchor for a heading: lower case, letters, digits, `-` and `_` kept, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(
                line.trim_start_matches('#').replace('`', "").as_str(),
            ));
        }
    }
    out
}

/// The targets of `[text](target)` and `![alt](target)` in `text`.
fn targets(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].trim().to_owned());
        rest = &after[end..];
    }
    out
}

fn broken_links(files: &[PathBuf]) -> Vec<String> {
    let mut broken = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let shown = file
            .strip_prefix(root())
            .unwrap_or(file)
            .display()
            .to_string();
        for target in targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !dest.exists() {
                broken.push(format!("{shown}: ({target}): no such file"));
                continue;
            }
            if let Some(fragment) = fragment {
                let headings = std::fs::read_to_string(&dest)
                    .map(|t| anchors(&t))
                    .unwrap_or_default();
                if !headings.contains(fragment) {
                    broken.push(format!("{shown}: ({target}): no heading #{fragment} there"));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let files = documents();
    assert!(files.len() > 3, "the docs were not found: {files:?}");
    let broken = broken_links(&files);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn a_missing_file_or_heading_is_a_broken_link() {
    let dir = std::env::temp_dir().join(format!("steward-doc-links-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("page.md");
    std::fs::write(
        &page,
        "# A page\n\n## Install in 15 minutes\n\n[ok](#install-in-15-minutes) [self](page.md) \
         [gone](missing.md) [no heading](#nowhere) `[code](not-a-link.md)`\n\n```\n[fenced](x.md)\n```\n",
    )
    .unwrap();
    let broken = broken_links(std::slice::from_ref(&page));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].contains("missing.md"), "{broken:?}");
    assert!(broken[1].contains("#nowhere"), "{broken:?}");
    assert_eq!(
        anchor("Hygiene settings (steward.toml)"),
        "hygiene-settings-stewardtoml"
    );
    assert_eq!(
        anchor("The Slack simulator's page"),
        "the-slack-simulators-page"
    );
}
