//! xtask: the nicbar project's build tasks, run as `cargo xtask <task>`.
//!
//! Each task is a module with a clap `Args` struct and a `run` function. Adding a task is three
//! lines here: its `mod`, a variant of [`Task`], and an arm in `main`.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod apt;
mod bench;
mod capi;
mod command;
mod demo;
mod engine;
mod image;
mod mpi;
mod plot;
mod qemu;
mod sim;
mod soak;
mod test;

/// What every task returns: an error is printed and the task exits non-zero.
type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// The nicbar project's build tasks.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", version, about)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// The quick start: a 4-node emulated cluster on this host, a ping-pong, and NIC-based
    /// against host-based barriers of three algorithms, with a table of their latencies.
    Demo(demo::Args),
    /// Build the NIC firmware for a target and wrap it into a flashable image, or check an
    /// existing image.
    Image(image::Args),
    /// The end-to-end check of the firmware image as NICs under QEMU: install QEMU if missing,
    /// build and flash the image, boot NICs from it, and run messages and barriers across them.
    Qemu(qemu::Args),
    /// Run every check CI runs: formatting, lints, the firmware's embedded build, and all tests.
    /// Installs what it needs (the embedded Rust target) first.
    Test(test::Args),
    /// Run a benchmark: measured side by side with its references in one run, on this machine.
    Bench(bench::Args),
    /// Models: `sim barrier` predicts barrier latency from the paper's costs, to 65,536 nodes.
    Sim(sim::Args),
    /// Real processes on the emulated NIC for a while: every barrier kind, messages, changing
    /// groups, exits and kills, the fault injector; checks barrier safety and delivery.
    Soak(soak::Args),
    /// The C API: regenerate or check its header (`header [--check]`), or install the library,
    /// header, nicbar.pc and nicctl under a prefix (`install --prefix DIR`).
    Capi(capi::Args),
    /// The Open MPI collective component coll/nicbar: `build`, `install [--prefix DIR]
    /// [--components DIR]`, `test` (installs Debian's Open MPI, gfortran and mpi4py if missing).
    Mpi(mpi::Args),
    /// Measure every algorithm of the data collectives over communicator and message sizes and
    /// write the selection map coll/nicbar loads (a table, a picture, the map file).
    Tune(mpi::TuneArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Demo(args) => demo::run_demo(args),
        Task::Image(args) => image::run(args),
        Task::Qemu(args) => qemu::run_check(args),
        Task::Test(args) => test::run_tests(args),
        Task::Bench(args) => bench::run_bench(args),
        Task::Sim(args) => sim::run(args),
        Task::Capi(args) => capi::run_capi(args),
        Task::Mpi(args) => mpi::run_mpi(args),
        Task::Soak(args) => soak::run_soak(args),
        Task::Tune(args) => mpi::run_tune(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: the directory above this crate's.
fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}

/// Cargo's target directory: `CARGO_TARGET_DIR` if set (relative to the workspace root), else
/// `target` in the workspace root.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => workspace_root().join(dir),
        None => workspace_root().join("target"),
    }
}
