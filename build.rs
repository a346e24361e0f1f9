//! Link options for the `steward` executable.
//!
//! On Linux with glibc the executable's relative relocations are packed (`-z
//! pack-relative-relocs`, DT_RELR): a position-independent executable carries one relocation per
//! pointer in its read-only data, and the dynamic loader reads them all at start, so unpacked
//! they stay resident for the process's life (1.3 MB of `.rela.dyn` for `steward`, about a
//! twentieth of an idle `steward serve`'s memory). Packed, they take a few kilobytes. It needs
//! binutils 2.38 or later to link (older ones warn and ignore it) and glibc 2.36 or later to run:
//! Debian bookworm, the image's base, has both. See benches/README.md ("Idle memory").
//!
//! In the release build for x86_64 Linux, the functions an idle `steward serve` runs are laid out
//! first and together ([`ORDER_FILE`], passed to the linker as `--symbol-ordering-file`). The
//! kernel maps an executable's code 64 KiB at a time around each page a process touches, so with
//! those functions spread over 24 MB of code an idle replica kept 13 MB of it resident; packed
//! into 3 MB, it keeps about 3. The names carry hashes that change with the toolchain, the locked
//! dependencies, the crate's version and the release profile, so the file records what it was
//! made from (its fingerprint line) and `scripts/symbol-order` makes it again; a build from
//! something else says so in a warning (and `tests/it/build_script.rs` fails), and the linker skips
//! names it does not find. Only LLD reads the file: it is passed where LLD is the linker, Rust's
//! own default on this target since 1.90, and not when a linker was chosen instead.
use std::path::{Path, PathBuf};

/// The function order, from the repository root.
pub const ORDER_FILE: &str = "link/steward.order";
/// The order file's line naming what it was made from.
pub const FINGERPRINT_PREFIX: &str = "# fingerprint: ";
/// The first release whose default linker on x86_64-unknown-linux-gnu is its own LLD.
const LLD_DEFAULT_SINCE_MINOR: u32 = 90;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    symbol_order(&var);
}

/// Passes [`ORDER_FILE`] to the linker when [`order_applies`], warning when it was made from
/// another toolchain, lock file or version than this build's.
fn symbol_order(var: &dyn Fn(&str) -> String) {
    let root = PathBuf::from(var("CARGO_MANIFEST_DIR"));
    let order = root.join(ORDER_FILE);
    println!("cargo::rerun-if-changed={}", order.display());
    println!(
        "cargo::rerun-if-changed={}",
        root.join("Cargo.lock").display()
    );
    println!("cargo::rerun-if-env-changed=RUSTC_LINKER");
    println!("cargo::rerun-if-env-changed=CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER");
    let rustc = rustc_version(&var("RUSTC"));
    let build = Build {
        arch: var("CARGO_CFG_TARGET_ARCH"),
        os: var("CARGO_CFG_TARGET_OS"),
        env: var("CARGO_CFG_TARGET_ENV"),
        profile_dir: profile_dir(Path::new(&var("OUT_DIR"))),
        rustc: rustc.clone(),
        linker: [
            var("RUSTC_LINKER"),
            var("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER"),
        ]
        .concat(),
        rustflags: var("CARGO_ENCODED_RUSTFLAGS"),
    };
    if order_applies(&build).is_err() {
        return;
    }
    let Ok(text) = std::fs::read_to_string(&order) else {
        println!(
            "cargo::warning={ORDER_FILE} is missing: the functions an idle `steward serve` runs are not laid out together (scripts/symbol-order makes the file)"
        );
        return;
    };
    let lock = std::fs::read(root.join("Cargo.lock")).unwrap_or_default();
    let now = fingerprint(&rustc, &var("CARGO_PKG_VERSION"), &lock);
    if let Some(stale) = staleness(&text, &now) {
        println!("cargo::warning={stale}");
    }
    println!(
        "cargo::rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    println!("cargo::rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
}

/// What decides whether the order file can be passed to the linker.
#[derive(Debug, Clone, Default)]
pub struct Build {
    pub arch: String,
    pub os: String,
    pub env: String,
    /// The directory the profile builds into (`release` for `--release`, and for `cargo bench`).
    pub profile_dir: String,
    /// `rustc -V`.
    pub rustc: String,
    /// A linker chosen instead of Rust's default (`RUSTC_LINKER`, `CARGO_TARGET_…_LINKER`).
    pub linker: String,
    /// `CARGO_ENCODED_RUSTFLAGS`.
    pub rustflags: String,
}

/// `Ok` when the order file is for this build and its linker reads it; otherwise why not.
pub fn order_applies(build: &Build) -> Result<(), &'static str> {
    if (build.arch.as_str(), build.os.as_str(), build.env.as_str()) != ("x86_64", "linux", "gnu") {
        return Err("the order is made on x86_64 Linux with glibc, where Rust links with LLD");
    }
    if build.profile_dir != "release" {
        return Err("the order's names are the release profile's");
    }
    match rustc_minor(&build.rustc) {
        Some(minor) if minor >= LLD_DEFAULT_SINCE_MINOR => {}
        _ => return Err("Rust links with LLD by default on this target from 1.90 on"),
    }
    let flags = &build.rustflags;
    if !build.linker.is_empty() || flags.contains("linker") || flags.contains("fuse-ld") {
        return Err("a linker was chosen instead of Rust's own LLD, which may not read the file");
    }
    Ok(())
}

/// The profile's output directory from a build script's `OUT_DIR`
/// (`target/[<triple>/]<profile>/build/<package>-<hash>/out`).
pub fn profile_dir(out_dir: &Path) -> String {
    out_dir
        .ancestors()
        .nth(3)
        .and_then(Path::file_name)
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `rustc -V` of the compiler cargo runs (`RUSTC`), or empty.
fn rustc_version(rustc: &str) -> String {
    let rustc = if rustc.is_empty() { "rustc" } else { rustc };
    std::process::Command::new(rustc)
        .arg("-V")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The minor version of `rustc 1.95.0 (…)`.
pub fn rustc_minor(version: &str) -> Option<u32> {
    let number = version.split_whitespace().nth(1)?;
    let mut parts = number.split('.');
    (parts.next()? == "1").then_some(())?;
    parts.next()?.parse().ok()
}

/// What the symbol names depend on, as the order file's fingerprint line states it (after
/// [`FINGERPRINT_PREFIX`]). `scripts/symbol-order` writes the same line.
pub fn fingerprint(rustc: &str, version: &str, lock: &[u8]) -> String {
    format!(
        "{rustc}; sandbox-steward {version}; Cargo.lock fnv1a64 {:016x}",
        fnv1a64(lock)
    )
}

/// `Some(a warning)` when `order` (the file's text) was made from something else than `now`
/// (this build's [`fingerprint`]).
pub fn staleness(order: &str, now: &str) -> Option<String> {
    let made = order
        .lines()
        .find_map(|line| line.strip_prefix(FINGERPRINT_PREFIX));
    match made {
        Some(made) if made.trim() == now => None,
        Some(made) => Some(format!(
            "{ORDER_FILE} was made from {}, this build is {now}: most of its names will not be found, so an idle `steward serve` holds about twice the memory; make it again with scripts/symbol-order",
            made.trim()
        )),
        None => Some(format!(
            "{ORDER_FILE} has no fingerprint line; make it again with scripts/symbol-order"
        )),
    }
}

/// FNV-1a, 64 bits: a fingerprint of the lock file that the generator's Python computes the same.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
