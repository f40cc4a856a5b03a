//! `cargo xtask test`: everything CI checks, in the order that fails fastest.
//!
//! It installs what it needs first (the firmware's embedded target through rustup, since these
//! machines do not install targets on their own), then checks formatting and lints, builds the
//! firmware for the embedded target, runs every test of the workspace and the ring under Miri,
//! a short soak of real processes (`cargo xtask soak`, about half a minute), replays the fuzz
//! corpora and fuzzes each target briefly (cargo-fuzz, on nightly), then builds the flashable
//! image and runs it as NICs under QEMU (which prints its section sizes).

use clap::Args as ClapArgs;
use std::sync::OnceLock;
use std::time::Instant;

use crate::command::{cargo, ensure_rust_target, run};
use crate::image::{FIRMWARE_TARGET, FIRMWARE_TARGET_64};
use crate::{Result, workspace_root};

/// Options of `cargo xtask test`.
#[derive(ClapArgs)]
pub(crate) struct Args {
    /// Skip `cargo fmt --check` and clippy (for a quick local run).
    #[arg(long)]
    no_lint: bool,
    /// Skip the QEMU stage (building the image, booting it as NICs, messages and barriers).
    #[arg(long)]
    no_qemu: bool,
    /// Seeds per simulation campaign (CI runs the default; thousands are a flag away).
    #[arg(long, default_value_t = 100)]
    sim_seeds: u64,
    /// Skip the Open MPI stage (the coll/nicbar component, C, Fortran and mpi4py's suite).
    #[arg(long)]
    no_mpi: bool,
    /// Minutes of the soak on real processes (0 skips it).
    #[arg(long, default_value_t = 0.5)]
    soak_minutes: f64,
    /// Seconds of fuzzing per fuzz target (0: replay the corpora only).
    #[arg(long, default_value_t = 10)]
    fuzz_seconds: u64,
}

/// The fuzz crate (outside the workspace, as cargo-fuzz wants it).
const FUZZ_DIR: &str = "firmware/fuzz";

/// Runs the checks.
pub(crate) fn run_tests(args: Args) -> Result<()> {
    let root = workspace_root();
    ensure_rust_target(FIRMWARE_TARGET)?;
    ensure_rust_target(FIRMWARE_TARGET_64)?;
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
        let fuzz = root.join(FUZZ_DIR);
        run(cargo().current_dir(&fuzz).args(["fmt", "--", "--check"]))?;
        run(cargo().current_dir(&fuzz).args([
            "clippy",
            "--no-default-features",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
    }
    section("firmware for the embedded targets");
    for target in [FIRMWARE_TARGET, FIRMWARE_TARGET_64] {
        run(cargo().current_dir(&root).args([
            "build",
            "-p",
            "firmware",
            "--release",
            "--target",
            target,
        ]))?;
    }
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
    if args.soak_minutes > 0.0 {
        section("a short soak: real processes, every barrier kind, exits and kills, faults");
        crate::soak::run_soak(crate::soak::Args::short(args.soak_minutes))?;
    }
    fuzz(&root, args.fuzz_seconds)?;
    if args.no_qemu {
        println!("\n(the QEMU stage was skipped: --no-qemu)");
    } else {
        section("the flashable image under QEMU");
        crate::qemu::run_check(crate::qemu::Args::for_ci())?;
    }
    if args.no_mpi {
        println!("\n(the Open MPI stage was skipped: --no-mpi)");
    } else {
        section("Open MPI: the coll/nicbar component");
        crate::mpi::run_tests(&crate::mpi::TestArgs::for_ci())?;
    }
    section("done");
    Ok(())
}

/// Runs the ring code's tests under Miri (which checks the raw-memory module for undefined
/// behaviour and the acquire/release pairing of the two-thread test for data races). Miri needs a
/// nightly toolchain; where the machine has none (it cannot be fetched here), says so and skips.
fn miri(root: &std::path::Path) -> Result<()> {
    section("miri: the ring over raw memory");
    if !has_nightly() {
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

/// Whether rustup has a nightly toolchain (Miri and cargo-fuzz need one; it cannot be fetched
/// on machines that have none).
fn has_nightly() -> bool {
    let toolchains = std::process::Command::new("rustup")
        .args(["toolchain", "list"])
        .output();
    toolchains.as_ref().is_ok_and(|out| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.starts_with("nightly"))
    })
}

/// Replays every fuzz target's checked-in corpus as an ordinary test (any toolchain), then, where
/// a nightly toolchain exists, installs cargo-fuzz if missing and fuzzes each target for
/// `seconds`, starting from its corpus. New inputs go to `target/fuzz-corpus/` of the fuzz
/// crate, so the checked-in corpora stay as they are; a crash fails the stage and leaves its input
/// in `artifacts/`.
fn fuzz(root: &std::path::Path, seconds: u64) -> Result<()> {
    section("fuzz corpora, replayed");
    let dir = root.join(FUZZ_DIR);
    run(cargo()
        .current_dir(&dir)
        .args(["test", "--no-default-features"]))?;
    section("fuzzing");
    if seconds == 0 {
        println!("fuzzing skipped: --fuzz-seconds 0");
        return Ok(());
    }
    if !has_nightly() {
        println!("fuzzing skipped: this machine has no nightly toolchain, which cargo-fuzz needs");
        return Ok(());
    }
    let installed = std::process::Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !installed && run(cargo().args(["install", "cargo-fuzz", "--locked"])).is_err() {
        println!("fuzzing skipped: cargo-fuzz could not be installed");
        return Ok(());
    }
    let mut targets: Vec<String> = std::fs::read_dir(dir.join("fuzz_targets"))?
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            (path.extension()? == "rs").then(|| path.file_stem()?.to_str().map(String::from))?
        })
        .collect();
    targets.sort();
    for target in &targets {
        let scratch = dir.join("target").join("fuzz-corpus").join(target);
        std::fs::create_dir_all(&scratch)?;
        // Safe Rust throughout, so no sanitizer; debug assertions on, so overflow is a crash.
        run(std::process::Command::new("cargo")
            .current_dir(&dir)
            .arg("+nightly")
            .args(["fuzz", "run", "--sanitizer", "none", "--debug-assertions"])
            .arg(target)
            .arg(&scratch)
            .arg(dir.join("corpus").join(target))
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .args(["-timeout=5", "-max_len=8192"]))?;
    }
    Ok(())
}

/// Starts a section of the output, saying how far into the run it starts (so that a slow stage
/// shows in CI's log).
fn section(name: &str) {
    let started = *RUN_STARTED.get_or_init(Instant::now);
    println!(
        "\n== {name} == ({:.0} s into the run)",
        started.elapsed().as_secs_f64()
    );
}

/// When `cargo xtask test` began (its first section).
static RUN_STARTED: OnceLock<Instant> = OnceLock::new();
