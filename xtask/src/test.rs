//! `cargo xtask test`: everything CI checks, in the order that fails fastest.
//!
//! It installs what it needs first (the firmware's embedded target through rustup, since these
//! machines do not install targets on their own), then checks formatting and lints, builds the
//! firmware for the embedded target and reports its size, and runs every test of the workspace.

use clap::Args as ClapArgs;

use crate::command::{cargo, ensure_rust_target, run};
use crate::{Result, workspace_root};

/// The firmware's primary embedded target.
pub(crate) const FIRMWARE_TARGET: &str = "riscv32imac-unknown-none-elf";

/// Options of `cargo xtask test`.
#[derive(ClapArgs)]
pub(crate) struct Args {
    /// Skip `cargo fmt --check` and clippy (for a quick local run).
    #[arg(long)]
    no_lint: bool,
    /// Seeds per simulation campaign (CI runs the default; thousands are a flag away).
    #[arg(long, default_value_t = 200)]
    sim_seeds: u64,
}

/// Runs the checks.
pub(crate) fn run_tests(args: Args) -> Result<()> {
    let root = workspace_root();
    ensure_rust_target(FIRMWARE_TARGET)?;
    if !args.no_lint {
        section("formatting");
        run(cargo()
            .current_dir(&root)
            .args(["fmt", "--all", "--", "--check"]))?;
        section("lints");
        run(cargo().current_dir(&root).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
    }
    section("firmware for the embedded target");
    run(cargo().current_dir(&root).args([
        "build",
        "-p",
        "firmware",
        "--release",
        "--target",
        FIRMWARE_TARGET,
    ]))?;
    report_firmware_size(&root)?;
    section("tests");
    run(cargo()
        .current_dir(&root)
        .env("NICBAR_SIM_SEEDS", args.sim_seeds.to_string())
        .args(["test", "--workspace", "--all-targets"]))?;
    // Doc tests are not part of --all-targets.
    run(cargo()
        .current_dir(&root)
        .args(["test", "--workspace", "--doc"]))?;
    miri(&root)?;
    Ok(())
}

/// Runs the ring code's tests under Miri (which checks the raw-memory module for undefined
/// behaviour and the acquire/release pairing of the two-thread test for data races). Miri needs a
/// nightly toolchain; where the machine has none (it cannot be fetched here), says so and skips.
fn miri(root: &std::path::Path) -> Result<()> {
    section("miri: the ring over raw memory");
    let toolchains = std::process::Command::new("rustup")
        .args(["toolchain", "list"])
        .output();
    let has_nightly = toolchains.as_ref().is_ok_and(|out| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.starts_with("nightly"))
    });
    if !has_nightly {
        println!("miri skipped: this machine has no nightly toolchain, which Miri needs");
        return Ok(());
    }
    let added = std::process::Command::new("rustup")
        .args([
            "component",
            "add",
            "miri",
            "rust-src",
            "--toolchain",
            "nightly",
        ])
        .status();
    if !added.is_ok_and(|status| status.success()) {
        println!("miri skipped: the miri component could not be added to the nightly toolchain");
        return Ok(());
    }
    run(std::process::Command::new("cargo")
        .current_dir(root)
        .env("MIRIFLAGS", "-Zmiri-strict-provenance")
        .args([
            "+nightly",
            "miri",
            "test",
            "-p",
            "shared-abi",
            "--lib",
            "ring::",
        ]))
}

fn section(name: &str) {
    println!("\n== {name} ==");
}

/// Prints the `.text` size of the firmware library as linked into the release build for the
/// embedded target (its object code; the bootable image's size is `cargo xtask image`'s).
fn report_firmware_size(root: &std::path::Path) -> Result<()> {
    let rlib = crate::target_dir()
        .join(FIRMWARE_TARGET)
        .join("release")
        .join("libfirmware.rlib");
    let bytes =
        std::fs::read(&rlib).map_err(|error| format!("reading {}: {error}", rlib.display()))?;
    let _ = root;
    let text = rlib_text_size(&bytes)?;
    println!("firmware ({FIRMWARE_TARGET}, release): .text {text} bytes in libfirmware.rlib");
    Ok(())
}

/// Sums the `.text*` sections of every object in an rlib (an `ar` archive).
fn rlib_text_size(bytes: &[u8]) -> Result<u64> {
    use object::{Object, ObjectSection};
    let archive = object::read::archive::ArchiveFile::parse(bytes)?;
    let mut text = 0;
    for member in archive.members() {
        let member = member?;
        let Ok(data) = member.data(bytes) else {
            continue;
        };
        let Ok(file) = object::File::parse(data) else {
            continue;
        };
        text += file
            .sections()
            .filter(|section| section.name().is_ok_and(|name| name.starts_with(".text")))
            .map(|section| section.size())
            .sum::<u64>();
    }
    Ok(text)
}
