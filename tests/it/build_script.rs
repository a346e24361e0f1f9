//! build.rs's symbol order: the committed `link/steward.order` was made from this tree (the
//! toolchain, Cargo.lock and version its names depend on), names each function once, and is
//! passed to the linker only where Rust's own LLD links a release build for x86_64 Linux.
//!
//! When the first test fails, the order is stale: `scripts/symbol-order` makes it again (a release
//! build and half a minute of an idle `steward serve` under callgrind).
#[allow(dead_code)]
#[path = "../../build.rs"]
mod script;

use std::collections::HashSet;
use std::path::Path;

use script::{
    Build, FINGERPRINT_PREFIX, ORDER_FILE, fingerprint, fnv1a64, order_applies, profile_dir,
    rustc_minor, staleness,
};

fn read(path: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rustc_version() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = std::process::Command::new(&rustc)
        .arg("-V")
        .output()
        .unwrap_or_else(|e| panic!("{rustc} -V: {e}"));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn the_committed_order_was_made_from_this_toolchain_lock_file_and_version() {
    let order = String::from_utf8(read(ORDER_FILE)).unwrap();
    let now = fingerprint(
        &rustc_version(),
        env!("CARGO_PKG_VERSION"),
        &read("Cargo.lock"),
    );
    if let Some(stale) = staleness(&order, &now) {
        panic!("{stale}");
    }
}

#[test]
fn the_order_names_each_function_once() {
    let order = String::from_utf8(read(ORDER_FILE)).unwrap();
    let names: Vec<&str> = order
        .lines()
        .filter(|line| !line.starts_with('#'))
        .collect();
    assert!(
        names.len() >= 1000,
        "{} names: an idle replica runs more functions than that",
        names.len()
    );
    let mut seen = HashSet::new();
    for name in &names {
        assert!(
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.$".contains(&b)),
            "not a symbol name: {name:?}"
        );
        assert!(seen.insert(name), "named twice: {name}");
    }
    assert!(
        names.iter().filter(|n| n.starts_with("_ZN")).count() * 2 > names.len(),
        "most of the functions an idle replica runs are Rust's"
    );
    assert_eq!(
        order
            .lines()
            .filter(|line| line.starts_with(FINGERPRINT_PREFIX))
            .count(),
        1,
        "one fingerprint line"
    );
}

fn release_x86_64() -> Build {
    Build {
        arch: "x86_64".into(),
        os: "linux".into(),
        env: "gnu".into(),
        profile_dir: "release".into(),
        rustc: "rustc 1.95.0 (59807616e 2026-04-14)".into(),
        linker: String::new(),
        rustflags: String::new(),
    }
}

#[test]
fn the_order_is_passed_only_where_rusts_own_lld_links_a_release_build() {
    assert_eq!(order_applies(&release_x86_64()), Ok(()));
    let refused = [
        Build {
            arch: "aarch64".into(),
            ..release_x86_64()
        },
        Build {
            env: "musl".into(),
            ..release_x86_64()
        },
        Build {
            os: "macos".into(),
            ..release_x86_64()
        },
        Build {
            profile_dir: "debug".into(),
            ..release_x86_64()
        },
        Build {
            profile_dir: "release-small".into(),
            ..release_x86_64()
        },
        // GNU ld was the default before 1.90, and it does not read the file.
        Build {
            rustc: "rustc 1.89.0 (29483883e 2025-08-04)".into(),
            ..release_x86_64()
        },
        Build {
            rustc: String::new(),
            ..release_x86_64()
        },
        Build {
            linker: "/usr/bin/clang".into(),
            ..release_x86_64()
        },
        Build {
            rustflags: "-Clinker-features=-lld".into(),
            ..release_x86_64()
        },
        Build {
            rustflags: "-C\u{1f}link-arg=-fuse-ld=bfd".into(),
            ..release_x86_64()
        },
    ];
    for build in refused {
        assert!(order_applies(&build).is_err(), "{build:?}");
    }
}

#[test]
fn the_profile_is_read_from_the_build_scripts_out_dir() {
    let cases = [
        (
            "/w/target/release/build/sandbox-steward-0a1b/out",
            "release",
        ),
        (
            "/w/target/x86_64-unknown-linux-gnu/release-small/build/sandbox-steward-0a1b/out",
            "release-small",
        ),
        ("/w/target/debug/build/sandbox-steward-0a1b/out", "debug"),
        ("", ""),
    ];
    for (out_dir, profile) in cases {
        assert_eq!(profile_dir(Path::new(out_dir)), profile, "{out_dir}");
    }
    assert_eq!(rustc_minor("rustc 1.95.0 (59807616e 2026-04-14)"), Some(95));
    assert_eq!(
        rustc_minor("rustc 1.90.0-nightly (abc 2025-07-01)"),
        Some(90)
    );
    assert_eq!(rustc_minor("rustc 2.0.0"), None);
    assert_eq!(rustc_minor(""), None);
}

#[test]
fn another_lock_file_toolchain_or_version_makes_the_order_stale() {
    let rustc = "rustc 1.95.0 (59807616e 2026-04-14)";
    let made = fingerprint(rustc, "0.1.0", b"lock");
    let order = format!("# made by hand\n{FINGERPRINT_PREFIX}{made}\n_ZN4main17h0E\n");
    assert_eq!(staleness(&order, &made), None);
    for now in [
        fingerprint(rustc, "0.1.0", b"lock\n"),
        fingerprint("rustc 1.96.0 (0 2026-05-28)", "0.1.0", b"lock"),
        fingerprint(rustc, "0.2.0", b"lock"),
    ] {
        let stale = staleness(&order, &now).expect("stale");
        assert!(stale.contains("scripts/symbol-order"), "{stale}");
        assert!(stale.contains(&now), "{stale}");
    }
    let unmarked = staleness("_ZN4main17h0E\n", &made).expect("no fingerprint line");
    assert!(unmarked.contains("no fingerprint line"), "{unmarked}");
    // FNV-1a's published 64-bit values, which scripts/symbol-order's Python computes the same.
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
}
