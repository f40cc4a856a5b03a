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
    /// UDP ping-pong between two processes, with the ratios; and GM's C ping-pong
    /// (host-lib/examples/c/pingpong.c) against `nicctl emulate --units 2` with its defaults,
    /// blocking in gm_blocking_receive and polling gm_receive, with their ratio.
    Pingpong {
        /// Round trips per measurement.
        #[arg(long, default_value_t = 20_000)]
        round_trips: usize,
        /// Round trips of each C measurement.
        #[arg(long, default_value_t = 5_000)]
        c_round_trips: usize,
        /// Also write the results as CSV here.
        #[arg(long)]
        csv: Option<std::path::PathBuf>,
    },
    /// NIC-based against host-based barrier latency for pairwise exchange, gather-broadcast (best
    /// dimension) and dissemination (n = 1..4) at 2, 4, 8, 16 processes on the emulated NIC, in the
    /// shape of the paper's Figure 5 (table, CSV, SVG); with Open MPI's MPI_Barrier (shared memory,
    /// and TCP on loopback) as a reference row where mpirun is installed.
    Barrier {
        /// Process counts.
        #[arg(long, value_delimiter = ',', default_values_t = [2, 4, 8, 16])]
        sizes: Vec<usize>,
        /// Timed barriers per measurement.
        #[arg(long, default_value_t = 1000)]
        barriers: usize,
        /// Where to write bench-barrier.csv and bench-barrier.svg.
        #[arg(long, default_value = "target")]
        out: std::path::PathBuf,
        /// Skip the Open MPI reference even if it is installed.
        #[arg(long)]
        no_mpi: bool,
        /// Processes spin on their event rings (yielding) instead of sleeping on doorbells; wants
        /// a core per process (with fewer, spinners can starve one another).
        #[arg(long)]
        spin: bool,
    },
    /// MPI_Barrier latency and MPI_Ibarrier overlap (OSU's definition) through the coll/nicbar
    /// component beside Open MPI's own collectives over shared memory and TCP (table, CSV).
    Mpi(crate::mpi::BenchArgs),
}

/// Builds the benchmark program with the fast release profile and runs it.
pub(crate) fn run_bench(args: Args) -> Result<()> {
    match args.bench {
        Bench::Pingpong {
            round_trips,
            c_round_trips,
            csv,
        } => {
            let (c_pingpong, nicctl) = c_pingpong()?;
            let mut command = example("bench_pingpong")?;
            command.arg("--round-trips").arg(round_trips.to_string());
            command.arg("--c-pingpong").arg(c_pingpong);
            command.arg("--nicctl").arg(nicctl);
            command
                .arg("--c-round-trips")
                .arg(c_round_trips.to_string());
            if let Some(csv) = csv {
                command.arg("--csv").arg(csv);
            }
            run(&mut command)
        }
        Bench::Barrier {
            sizes,
            barriers,
            out,
            no_mpi,
            spin,
        } => {
            let mut command = example("bench_barrier")?;
            let sizes: Vec<String> = sizes.iter().map(usize::to_string).collect();
            command.arg("--sizes").arg(sizes.join(","));
            command.arg("--barriers").arg(barriers.to_string());
            command.arg("--out").arg(crate::workspace_root().join(out));
            if no_mpi {
                command.arg("--no-mpi");
            }
            if spin {
                command.arg("--spin");
            }
            run(&mut command)
        }
        Bench::Mpi(args) => crate::mpi::run_bench(args),
    }
}

/// Builds `libnicbar` and `nicctl` with the `bench-fast` profile and compiles
/// `host-lib/examples/c/pingpong.c` against them (`$CC`, else `cc`, at `-O2`); returns the
/// program and `nicctl`.
fn c_pingpong() -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let root = crate::workspace_root();
    run(cargo().current_dir(&root).args([
        "build",
        "--quiet",
        "--profile",
        "bench-fast",
        "-p",
        "nicbar-capi",
        "--lib",
        "-p",
        "host-driver",
        "--bin",
        "nicctl",
    ]))?;
    let built = crate::target_dir().join("bench-fast");
    let program = built.join("c").join("pingpong");
    std::fs::create_dir_all(built.join("c"))?;
    run(
        std::process::Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
            .args(["-std=c11", "-O2", "-I"])
            .arg(root.join("host-lib/include"))
            .arg(root.join("host-lib/examples/c/pingpong.c"))
            .arg("-o")
            .arg(&program)
            .arg("-L")
            .arg(&built)
            .arg("-lnicbar")
            .arg(format!("-Wl,-rpath,{}", built.display())),
    )?;
    Ok((program, built.join("nicctl")))
}

/// Builds the system crate's example `name` with the `bench-fast` profile; returns a command running it.
fn example(name: &str) -> Result<std::process::Command> {
    let root = crate::workspace_root();
    run(cargo().current_dir(&root).args([
        "build",
        "--quiet",
        "--profile",
        "bench-fast",
        "-p",
        "nicbar-system",
        "--example",
        name,
    ]))?;
    let program = crate::target_dir()
        .join("bench-fast")
        .join("examples")
        .join(name);
    Ok(std::process::Command::new(program))
}
