//! NIC-based against host-based barrier latency, side by side in one run, in the shape of the
//! paper's Figure 5: pairwise exchange, gather-broadcast (best tree dimension) and n-way
//! dissemination (n = 1..4, and the n tuned by `cargo xtask bench rttp` where a tuning file
//! gives one) at 2, 4, 8 and 16 processes on the emulated NIC — and, where Open MPI
//! is installed, its own `MPI_Barrier` at the same sizes in the same run as a reference.
//!
//! `cargo xtask bench barrier` builds and runs it; `--help` lists the options. Every process is a
//! real process with its own port; the emulator (one daemon, one unit per process, the in-process
//! wire) runs in this process, on the NIC threads and idle policies `--threads` and `--idle` name
//! (each pair measured in turn). Latency is the mean time per barrier at rank 0 over back-to-back
//! barriers, as the paper measured it; beside it, the CPU time the daemon's NIC threads spent per
//! barrier over the same timed barriers (from their scheduler statistics, read by rank 0).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nicbar::tuning::Tuning;
use nicbar::{Algorithm, BarrierOptions, Group, Member, NodeId, Port, PortId, WaitMode};
use nicbar_emulator::{Emulator, EmulatorConfig, IdlePolicy};
use nicbar_system::{cores, cpu_model, scratch_dir};

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

const HELP: &str = "\
bench_barrier: NIC-based against host-based barrier latency on the emulated NIC, per algorithm,
at several process counts, with Open MPI's MPI_Barrier as a reference where it is installed.

usage: bench_barrier [--sizes 2,4,8,16] [--barriers K] [--out DIR] [--no-mpi]
                     [--wait sleep|spin|default] [--tuning FILE] [--threads LIST] [--idle LIST]

  --sizes LIST    process counts (default 2,4,8,16)
  --barriers K    timed barriers per measurement, after K/10 to warm up (default 1000)
  --out DIR       where to write bench-barrier.csv (default .); `cargo xtask bench
                  barrier` draws bench-barrier.svg from it
  --no-mpi        skip the Open MPI reference even if mpirun is installed
  --wait MODE     how the processes wait for a barrier's end (default sleep):
                    sleep    asleep on their doorbells at once
                    spin     spinning on their event rings (yielding the core), as MPI's
                             shared-memory barrier spins; wants a core per process (with
                             fewer, spinners can starve one another)
                    default  the library's default: spin 20 us, then sleep
  --spin          --wait spin
  --tuning FILE   also measure dissemination at the n FILE tunes for each size (a
                  `cargo xtask bench rttp --write` file); without it, at the n of the
                  tuning file the library reads, if there is one
  --threads LIST  NIC threads of the daemon, each measured in turn: numbers (at most the
                  process count; larger ones are cut to it) or `auto` (the daemon's
                  default for this host) (default auto)
  --idle LIST     idle policies of the NIC threads, each measured in turn with each
                  --threads value: poll, sleep, adaptive (default adaptive)
";

fn main() -> Result {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--child") => child(&args[1..]),
        Some("--help" | "-h") => {
            print!("{HELP}");
            Ok(())
        }
        _ => orchestrate(&args),
    }
}

/// One algorithm setting measured both ways.
#[derive(Clone, Debug)]
struct Row {
    processes: usize,
    algorithm: String,
    nic_us: f64,
    host_us: f64,
    /// The daemon's NIC threads and idle policy as asked, a label without commas.
    engine: String,
    /// NIC threads that ran at this size.
    threads: usize,
    /// CPU time of the NIC threads per NIC-based barrier, µs.
    nic_cpu_us: f64,
    /// CPU time of the NIC threads per host-based barrier (its messages), µs.
    host_cpu_us: f64,
}

/// How the daemon runs its NICs for one measurement.
#[derive(Clone, Copy, Debug)]
struct Engine {
    /// NIC threads; `None`: the daemon's default.
    threads: Option<usize>,
    idle: IdlePolicy,
}

impl Engine {
    /// The engine as asked, for every size: `auto threads adaptive`, `4 threads poll`.
    fn label(&self) -> String {
        match self.threads {
            Some(threads) => format!("{threads} threads {}", self.idle),
            None => format!("auto threads {}", self.idle),
        }
    }

    /// The NIC threads that run `n` processes' NICs (one per NIC at most).
    fn threads_at(&self, n: usize) -> usize {
        self.threads.map_or_else(
            || nicbar_emulator::default_threads(n, cores()),
            |threads| threads.min(n),
        )
    }
}

/// The algorithm settings measured at `n` processes: PE, every GB dimension (the best is
/// reported, as the paper did), dissemination n = 1..4, and dissemination at the `n` tuned for
/// this size (the self-tuning of Hoefler et al., *Fast Barrier Synchronization for InfiniBand*)
/// when `tuning` gives one.
fn settings(n: usize, tuning: &Tuned) -> Vec<(String, Algorithm)> {
    let mut all = vec![("PE".to_string(), Algorithm::PairwiseExchange)];
    for dimension in 1..n {
        all.push((
            format!("GB d={dimension}"),
            Algorithm::GatherBroadcast { dimension, root: 0 },
        ));
    }
    for ways in 1..=4.min(n - 1) {
        all.push((
            format!("diss n={ways}"),
            Algorithm::Dissemination { n: ways },
        ));
    }
    if let Some(ways) = tuning.dissemination_n(n) {
        all.push((
            format!("diss tuned n={ways}"),
            Algorithm::Dissemination { n: ways as usize },
        ));
    }
    all
}

/// Where the tuned dissemination `n` comes from: a tuning file named with `--tuning`, else the
/// one the library reads (`nicbar::tuning`).
enum Tuned {
    File(Tuning),
    Library,
}

impl Tuned {
    fn dissemination_n(&self, members: usize) -> Option<u32> {
        match self {
            Self::File(tuning) => tuning.dissemination_n(members),
            Self::Library => nicbar::tuning::tuned_dissemination_n(members),
        }
    }
}

fn encode(algorithm: Algorithm) -> String {
    match algorithm {
        Algorithm::PairwiseExchange => "pe".into(),
        Algorithm::GatherBroadcast { dimension, root } => format!("gb:{dimension}:{root}"),
        Algorithm::Dissemination { n } => format!("diss:{n}"),
    }
}

fn decode(text: &str) -> Result<Algorithm> {
    let parts: Vec<&str> = text.split(':').collect();
    Ok(match parts.as_slice() {
        ["pe"] => Algorithm::PairwiseExchange,
        ["gb", d, r] => Algorithm::GatherBroadcast {
            dimension: d.parse()?,
            root: r.parse()?,
        },
        ["diss", n] => Algorithm::Dissemination { n: n.parse()? },
        _ => return Err(format!("bad algorithm {text:?}").into()),
    })
}

fn orchestrate(args: &[String]) -> Result {
    let mut sizes = vec![2usize, 4, 8, 16];
    let mut barriers = 1000usize;
    let mut out = PathBuf::from(".");
    let mut mpi = true;
    let mut wait = "sleep";
    let mut tuned = Tuned::Library;
    let mut threads: Vec<Option<usize>> = vec![None];
    let mut idles = vec![IdlePolicy::Adaptive];
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--sizes" => {
                sizes = rest
                    .next()
                    .ok_or("--sizes needs a list")?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
            }
            "--barriers" => barriers = rest.next().ok_or("--barriers needs a value")?.parse()?,
            "--out" => out = rest.next().ok_or("--out needs a directory")?.into(),
            "--no-mpi" => mpi = false,
            "--spin" => wait = "spin",
            "--wait" => {
                wait = match rest.next().map(String::as_str) {
                    Some("sleep") => "sleep",
                    Some("spin") => "spin",
                    Some("default") => "default",
                    other => {
                        let other = other.unwrap_or("nothing");
                        return Err(
                            format!("--wait takes sleep, spin or default, not {other}").into()
                        );
                    }
                }
            }
            "--tuning" => {
                let path = PathBuf::from(rest.next().ok_or("--tuning needs a file")?);
                tuned = Tuned::File(
                    Tuning::load(&path).map_err(|e| format!("--tuning {}: {e}", path.display()))?,
                );
            }
            "--threads" => {
                threads =
                    rest.next()
                        .ok_or("--threads needs a list")?
                        .split(',')
                        .map(|t| match t {
                            "auto" => Ok(None),
                            t => {
                                t.parse::<usize>().ok().filter(|&t| t >= 1).map(Some).ok_or(
                                    format!("--threads: `{t}` is neither `auto` nor 1 or more"),
                                )
                            }
                        })
                        .collect::<Result<_, _>>()?;
            }
            "--idle" => {
                idles = rest
                    .next()
                    .ok_or("--idle needs a list")?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
            }
            other => return Err(format!("unknown argument {other:?}; see --help").into()),
        }
    }
    let engines: Vec<Engine> = threads
        .iter()
        .flat_map(|&threads| idles.iter().map(move |&idle| Engine { threads, idle }))
        .collect();
    if sizes.iter().any(|&n| !(2..=64).contains(&n)) {
        return Err("sizes must be between 2 and 64 processes".into());
    }
    std::fs::create_dir_all(&out)?;
    let dir = scratch_dir("bench-barrier")?;
    println!("machine: {} cores, {}", cores(), cpu_model());
    println!(
        "{barriers} timed barriers per measurement, processes {}\n",
        match wait {
            "spin" => "spinning on their event rings (yielding)",
            "default" => "waiting by the library's default (spin 20 us, then sleep)",
            _ => "sleeping on their doorbells",
        }
    );

    let mut rows = Vec::new();
    for &n in &sizes {
        for engine in &engines {
            let socket = dir.join(format!("n{n}.sock"));
            let mut config = EmulatorConfig::in_process(&socket, n as u16);
            config.threads = Some(engine.threads_at(n));
            config.idle = engine.idle;
            let emulator = Emulator::spawn(config)?;
            let list: Vec<String> = settings(n, &tuned)
                .iter()
                .map(|(_, a)| encode(*a))
                .collect();
            let label = engine.label();
            println!(
                "{n} processes, {} NIC threads {}: {} settings x NIC and host ...",
                engine.threads_at(n),
                engine.idle,
                list.len()
            );
            let started = Instant::now();
            let report = run_processes(&socket, n, barriers, &list.join(","), wait)?;
            drop(emulator);
            for ((name, _), line) in settings(n, &tuned).iter().zip(report.lines()) {
                let fields: Vec<f64> = line
                    .split_whitespace()
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
                let [nic_us, host_us, nic_cpu_us, host_cpu_us] = fields[..] else {
                    return Err(format!("short report line {line:?}").into());
                };
                rows.push(Row {
                    processes: n,
                    algorithm: name.clone(),
                    nic_us,
                    host_us,
                    engine: label.clone(),
                    threads: engine.threads_at(n),
                    nic_cpu_us,
                    host_cpu_us,
                });
            }
            println!("  done in {:.1?}", started.elapsed());
        }
    }

    // (Every NIC here is a unit of one daemon, and packets between them carry no
    // authentication code: they never leave its memory. What the code costs shows over UDP, in
    // `bench pingpong`.)

    let mut mpi_rows: Vec<(usize, &'static str, f64)> = Vec::new();
    if mpi {
        match mpi_reference(&dir, &sizes, barriers) {
            Ok(found) => mpi_rows = found,
            Err(why) => println!("\nOpen MPI reference skipped: {why}"),
        }
    }

    print_table(&rows, &mpi_rows, &sizes);
    let csv = out.join("bench-barrier.csv");
    write_csv(&csv, &rows, &mpi_rows)?;
    println!("\nwrote {}", csv.display());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Starts `n` worker processes, one per unit, and returns rank 0's report.
fn run_processes(
    socket: &Path,
    n: usize,
    barriers: usize,
    list: &str,
    wait: &str,
) -> Result<String> {
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for rank in 0..n {
        let child = Command::new(&exe)
            .args([
                "--child",
                socket.to_str().ok_or("path")?,
                &rank.to_string(),
                &n.to_string(),
                &barriers.to_string(),
                list,
                wait,
            ])
            .stdout(if rank == 0 {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .spawn()?;
        children.push(child);
    }
    let mut report = String::new();
    let deadline = Instant::now() + Duration::from_secs(1200);
    let mut failed = None;
    for (rank, mut child) in children.into_iter().enumerate() {
        if rank == 0 {
            use std::io::Read;
            if let Some(mut stdout) = child.stdout.take() {
                stdout.read_to_string(&mut report)?;
            }
        }
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() && failed.is_none() {
                    failed = Some(format!("rank {rank} failed: {status}"));
                }
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                failed.get_or_insert_with(|| format!("rank {rank} did not finish in time"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    match failed {
        Some(why) => Err(why.into()),
        None => Ok(report),
    }
}

/// A worker: for each setting, `barriers/10` warm-up then `barriers` timed barriers in the NIC,
/// then the same on the host. Rank 0 prints "nic_us host_us" per setting.
fn child(args: &[String]) -> Result {
    let arg = |i: usize| {
        args.get(i)
            .map(String::as_str)
            .ok_or("missing child argument")
    };
    let socket = Path::new(arg(0)?);
    let rank: usize = arg(1)?.parse()?;
    let n: usize = arg(2)?.parse()?;
    let barriers: usize = arg(3)?.parse()?;
    let list: Vec<Algorithm> = arg(4)?.split(',').map(decode).collect::<Result<_>>()?;
    let mut port = Port::open_at(socket, rank as u8, 1)?;
    port.set_wait_mode(match arg(5)? {
        "spin" => WaitMode::Spin,
        "default" => WaitMode::default(),
        _ => WaitMode::Sleep,
    });
    let group = Group::new((0..n).map(|node| Member::new(NodeId::new(node as u16), PortId(1))))?;
    let mut out = String::new();
    for algorithm in list {
        let options = BarrierOptions::for_members(n)
            .with_algorithm(algorithm)
            .with_timeout(Duration::from_secs(60));
        let mut per_mode = [0f64; 2];
        let mut cpu_per_mode = [0f64; 2];
        for (mode, slot) in per_mode.iter_mut().enumerate() {
            let mut cpu_from = 0;
            for i in 0..barriers / 10 + barriers {
                if i == barriers / 10 {
                    // Start timing only once everyone is past the warm-up: a barrier has just
                    // ended here at every process.
                    *slot = 0.0;
                    if rank == 0 {
                        cpu_from = nic_threads_cpu_ns();
                    }
                }
                let start = Instant::now();
                if mode == 0 {
                    port.barrier_with(&group, &options)?;
                } else {
                    port.host_barrier(&group, &options)?;
                }
                if i >= barriers / 10 {
                    *slot += start.elapsed().as_secs_f64();
                }
            }
            *slot = *slot / barriers as f64 * 1e6;
            if rank == 0 {
                cpu_per_mode[mode] =
                    nic_threads_cpu_ns().saturating_sub(cpu_from) as f64 / barriers as f64 / 1e3;
            }
        }
        let _ = writeln!(
            out,
            "{:.3} {:.3} {:.3} {:.3}",
            per_mode[0], per_mode[1], cpu_per_mode[0], cpu_per_mode[1]
        );
    }
    if rank == 0 {
        print!("{out}");
    }
    Ok(())
}

/// CPU time the NIC threads of the daemon (this worker's parent) have used, in nanoseconds: the
/// first field of each thread's scheduler statistics.
fn nic_threads_cpu_ns() -> u64 {
    let tasks = format!("/proc/{}/task", std::os::unix::process::parent_id());
    let Ok(entries) = std::fs::read_dir(tasks) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.starts_with("nic-thread"))
        })
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Open MPI's `MPI_Barrier` at the same sizes: over shared memory, and over TCP on loopback.
fn mpi_reference(
    dir: &Path,
    sizes: &[usize],
    barriers: usize,
) -> Result<Vec<(usize, &'static str, f64)>> {
    let have = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !have("mpirun") || !have("mpicc") {
        return Err(
            "mpirun/mpicc not installed (Debian: apt-get install openmpi-bin libopenmpi-dev)"
                .into(),
        );
    }
    let source = dir.join("mpi_barrier.c");
    std::fs::write(&source, MPI_PROGRAM)?;
    let binary = dir.join("mpi_barrier");
    let built = Command::new("mpicc")
        .arg("-O2")
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .status()?;
    if !built.success() {
        return Err("mpicc could not build the reference program".into());
    }
    let mut found = Vec::new();
    for &n in sizes {
        for (label, transport) in [
            ("MPI_Barrier shm", &["--mca", "btl", "self,vader"][..]),
            (
                "MPI_Barrier tcp lo",
                &[
                    "--mca",
                    "btl",
                    "self,tcp",
                    "--mca",
                    "btl_tcp_if_include",
                    "lo",
                ][..],
            ),
        ] {
            println!("{label}: {n} processes ...");
            let output = Command::new("mpirun")
                .args([
                    "--allow-run-as-root",
                    "--oversubscribe",
                    "-np",
                    &n.to_string(),
                ])
                .args(transport)
                .arg(&binary)
                .arg(barriers.to_string())
                .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                .stderr(Stdio::null())
                .output()?;
            let text = String::from_utf8_lossy(&output.stdout);
            match text.trim().parse::<f64>() {
                Ok(us) if output.status.success() => found.push((n, label, us)),
                _ => println!("  {label} at {n} processes failed: {}", text.trim()),
            }
        }
    }
    Ok(found)
}

const MPI_PROGRAM: &str = r#"#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int rank, k = argc > 1 ? atoi(argv[1]) : 1000;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int i = 0; i < k / 10; i++) MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int i = 0; i < k; i++) MPI_Barrier(MPI_COMM_WORLD);
    double us = (MPI_Wtime() - start) / k * 1e6;
    if (rank == 0) printf("%.3f\n", us);
    MPI_Finalize();
    return 0;
}
"#;

/// One row per algorithm family and size: gather-broadcast is reported at its best dimension,
/// for each mode separately (the minimum over dimensions, as the paper reported it).
fn families(rows: &[Row]) -> Vec<Row> {
    let mut picked: Vec<Row> = Vec::new();
    for row in rows {
        let family = if row.algorithm.starts_with("GB") {
            "GB best"
        } else if row.algorithm.starts_with("diss tuned") {
            "diss tuned"
        } else {
            row.algorithm.as_str()
        };
        match picked.iter_mut().find(|r| {
            r.processes == row.processes && r.algorithm == family && r.engine == row.engine
        }) {
            Some(best) => {
                if row.nic_us < best.nic_us {
                    best.nic_us = row.nic_us;
                    best.nic_cpu_us = row.nic_cpu_us;
                }
                if row.host_us < best.host_us {
                    best.host_us = row.host_us;
                    best.host_cpu_us = row.host_cpu_us;
                }
            }
            None => picked.push(Row {
                algorithm: family.to_string(),
                ..row.clone()
            }),
        }
    }
    picked
}

fn print_table(rows: &[Row], mpi: &[(usize, &'static str, f64)], sizes: &[usize]) {
    let picked = families(rows);
    let mut engines: Vec<String> = Vec::new();
    for row in &picked {
        if !engines.contains(&row.engine) {
            engines.push(row.engine.clone());
        }
    }
    println!(
        "\nbarrier latency, µs (mean per barrier at rank 0); factor = host / NIC; cpu = the NIC \
         threads' CPU µs per NIC-based barrier"
    );
    for engine in &engines {
        println!("\nNIC threads and idle policy: {engine}");
        print!("{:<12}", "algorithm");
        for n in sizes {
            print!(
                " | {:>6} {:>6} {:>5} {:>5}",
                format!("{n} NIC"),
                "host",
                "x",
                "cpu"
            );
        }
        println!();
        let mut names: Vec<String> = Vec::new();
        for row in &picked {
            if !names.contains(&row.algorithm) {
                names.push(row.algorithm.clone());
            }
        }
        for name in &names {
            print!("{name:<12}");
            for n in sizes {
                match picked
                    .iter()
                    .find(|r| &r.algorithm == name && r.processes == *n && &r.engine == engine)
                {
                    Some(r) => print!(
                        " | {:>6.1} {:>6.1} {:>5.2} {:>5.1}",
                        r.nic_us,
                        r.host_us,
                        r.host_us / r.nic_us,
                        r.nic_cpu_us
                    ),
                    None => print!(" | {:>6} {:>6} {:>5} {:>5}", "-", "-", "-", "-"),
                }
            }
            println!();
        }
    }
    for label in ["MPI_Barrier shm", "MPI_Barrier tcp lo"] {
        if mpi.iter().any(|(_, l, _)| *l == label) {
            print!("{label:<12}");
            for n in sizes {
                match mpi.iter().find(|(m, l, _)| *l == label && m == n) {
                    Some((_, _, us)) => print!(" | {:>6.1} {:>6} {:>5}", us, "", ""),
                    None => print!(" | {:>6} {:>6} {:>5}", "-", "", ""),
                }
            }
            println!();
        }
    }
    if let Some(best) = sizes.last().and_then(|n| {
        picked
            .iter()
            .filter(|r| r.processes == *n)
            .min_by(|a, b| a.nic_us.total_cmp(&b.nic_us))
    }) {
        println!(
            "\nfastest NIC-based barrier at {} processes: {} at {:.1} µs ({:.2}x its host-based twin)",
            best.processes,
            best.algorithm,
            best.nic_us,
            best.host_us / best.nic_us
        );
        if let Some((_, _, us)) = mpi
            .iter()
            .find(|(m, l, _)| *m == best.processes && *l == "MPI_Barrier shm")
        {
            println!(
                "Open MPI MPI_Barrier over shared memory at {} processes: {:.1} µs ({:.2}x the NIC-based barrier)",
                best.processes,
                us,
                us / best.nic_us
            );
        }
    }
}

fn write_csv(path: &Path, rows: &[Row], mpi: &[(usize, &'static str, f64)]) -> Result {
    let mut text = String::from(
        "processes,algorithm,nic_us,host_us,factor,engine,threads,nic_cpu_us,host_cpu_us\n",
    );
    for r in rows {
        let _ = writeln!(
            text,
            "{},{},{:.3},{:.3},{:.4},{},{},{:.3},{:.3}",
            r.processes,
            r.algorithm,
            r.nic_us,
            r.host_us,
            r.host_us / r.nic_us,
            r.engine,
            r.threads,
            r.nic_cpu_us,
            r.host_cpu_us
        );
    }
    for (n, label, us) in mpi {
        let _ = writeln!(text, "{n},{label},{us:.3},,,,,,");
    }
    std::fs::write(path, text)?;
    Ok(())
}
