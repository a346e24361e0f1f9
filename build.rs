//! Link options for the `steward` executable.
//!
//! On Linux with glibc the executable's relative relocations are packed (`-z
//! pack-relative-relocs`, DT_RELR): a position-independent executable carries one relocation per
//! pointer in its read-only data, and the dynamic loader reads them all at start, so unpacked
//! they stay resident for the process's life (1.3 MB of `.rela.dyn` for `steward`, about a
//! twentieth of an idle `steward serve`'s memory). Packed, they take a few kilobytes. It needs
//! binutils 2.38 or later to link (older ones warn and ignore it) and glibc 2.36 or later to run:
//! Debian bookworm, the image's base, has both. See benches/README.md ("Idle memory").
fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
