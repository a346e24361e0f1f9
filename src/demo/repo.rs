//! The push test's repository: a small Git repository in the scratch directory whose test
//! script fails the way `cargo test` does, so the opening's push has something to report.
//! Needs `git` on this machine; without it the demo runs without a push test and says so.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// A repository made for the demo.
#[derive(Debug, Clone)]
pub struct DemoRepo {
    pub path: PathBuf,
    /// `file://…`, the `[[push_tests]]` entry's `clone_url`.
    pub clone_url: String,
    /// The one commit on `main`.
    pub sha: String,
    pub message: String,
}

/// The commit's message (the first line shows on the alert).
const MESSAGE: &str = "Apply the loyalty discount before tax";

/// What the sandbox runs: output shaped like a failing `cargo test`, exit 101.
const TEST_SCRIPT: &str = r#"#!/bin/sh
# The demo's test suite: it prints what a failing `cargo test` prints.
echo "   Compiling checkout v0.3.1 (/home/user/repo)"
echo "    Finished \`test\` profile [unoptimized + debuginfo] target(s) in 4.21s"
echo "     Running unittests src/lib.rs (target/debug/deps/checkout-5f0c2a9d1e7b3c44)"
echo ""
echo "running 4 tests"
echo "test cart::adds_items ... ok"
echo "test cart::totals_in_cents ... ok"
echo "test discount::applies_loyalty_before_tax ... FAILED"
echo "test tax::rounds_half_up ... ok"
echo ""
echo "failures:"
echo ""
echo "---- discount::applies_loyalty_before_tax stdout ----"
echo "thread 'discount::applies_loyalty_before_tax' panicked at src/discount.rs:42:9:"
echo "assertion \`left == right\` failed"
echo "  left: 9180"
echo " right: 9000"
echo ""
echo "failures:"
echo "    discount::applies_loyalty_before_tax"
echo ""
echo "test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.02s"
echo ""
echo "error: test failed, to rerun pass \`--lib\`"
exit 101
"#;

/// Makes the repository under `scratch` (blocking Git calls run off the async threads).
pub async fn create(scratch: &Path) -> anyhow::Result<DemoRepo> {
    let scratch = scratch.to_owned();
    tokio::task::spawn_blocking(move || create_blocking(&scratch))
        .await
        .context("making the demo repository stopped")?
}

fn create_blocking(scratch: &Path) -> anyhow::Result<DemoRepo> {
    let path = scratch.join("checkout");
    std::fs::create_dir_all(&path)?;
    let git = |args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new("git")
            .args([
                "-c",
                "user.name=Dana",
                "-c",
                "user.email=dana@example.com",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .current_dir(&path)
            // Git must not read the person's own configuration or templates.
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .context("git is not installed, so the demo has no push test")?;
        if !out.status.success() {
            bail!(
                "git {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    git(&["init", "-q", "-b", "main"])?;
    std::fs::write(path.join("run-tests.sh"), TEST_SCRIPT)?;
    std::fs::write(
        path.join("README.md"),
        "# checkout\n\nThe demo's repository: its tests fail on purpose.\n",
    )?;
    git(&["add", "run-tests.sh", "README.md"])?;
    git(&["commit", "-q", "-m", MESSAGE])?;
    let sha = git(&["rev-parse", "HEAD"])?;
    Ok(DemoRepo {
        clone_url: format!("file://{}", path.display()),
        path,
        sha,
        message: MESSAGE.to_owned(),
    })
}
