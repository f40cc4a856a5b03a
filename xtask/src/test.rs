//! `cargo xtask test`: everything CI checks, in the order that fails fastest.
//!
//! It installs what it needs first (the firmware's embedded target through rustup, since these
//! machines do not install targets on their own), then checks formatting and lints, builds the
//! firmware for the embedded target, runs every test of the workspace and the ring under Miri,
//! a short soak of real processes (`cargo xtask soak`, about a minute), then builds the flashable
//! image and runs it as NICs under QEMU (which prints its section sizes).

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
    /// Skip the QEMU stage (building the image, booting it as NICs, messages and barriers).
    #[arg(long)]
    no_qemu: bool,
    /// Seeds per simulation campaign (CI runs the default; thousands are a flag away).
    #[arg(long, default_value_t = 200)]
    sim_seeds: u64,
    /// Skip the Open MPI stage (the coll/nicbar component, C, Fortran and mpi4py's suite).
    #[arg(long)]
    no_mpi: bool,
    /// Minutes of the soak on real processes (0 skips it).
    #[arg(long, default_value_t = 1.0)]
    soak_minutes: f64,
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
