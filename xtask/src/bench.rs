//! `cargo xtask bench`: benchmarks, measured side by side in one run and printed with the machine
//! they ran on. Timing claims live here, never in pass/fail tests.

use clap::{Args as ClapArgs, Subcommand};

use crate::Result;
use crate::command::{cargo, run};

/// Options of `cargo xtask bench`.
#[derive(ClapArgs)]
pub(crate) struct Args {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// One-way small-message latency through the emulated NIC (processes spinning and sleeping;
    /// in-process path and UDP between two daemons) beside a shared-memory flag handoff and a raw
    /// UDP ping-pong between two processes, with the ratios.
    Pingpong {
        /// Round trips per measurement.
        #[arg(long, default_value_t = 20_000)]
        round_trips: usize,
        /// Also write the results as CSV here.
        #[arg(long)]
        csv: Option<std::path::PathBuf>,
    },
}

/// Builds the benchmark program with the fast release profile and runs it.
pub(crate) fn run_bench(args: Args) -> Result<()> {
    let root = crate::workspace_root();
    match args.bench {
        Bench::Pingpong { round_trips, csv } => {
            run(cargo().current_dir(&root).args([
                "build",
                "--quiet",
                "--profile",
                "bench-fast",
                "-p",
                "host-lib",
                "--example",
                "bench_pingpong",
            ]))?;
            let program = crate::target_dir()
                .join("bench-fast")
                .join("examples")
                .join("bench_pingpong");
            let mut command = std::process::Command::new(program);
            command.arg("--round-trips").arg(round_trips.to_string());
            if let Some(csv) = csv {
                command.arg("--csv").arg(csv);
            }
            run(&mut command)
        }
    }
}
