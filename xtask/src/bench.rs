//! `cargo xtask bench`: benchmarks, measured side by side in one run and printed with the machine
//! they ran on. Timing claims live here, never in pass/fail tests.

use clap::{Args as ClapArgs, Subcommand};

use crate::Result;
use crate::command::{cargo, run};
use crate::plot::{Axis, Colour, Figure, Panel, Series, Stroke};

mod armci;
mod fastpath;
mod gm_curve;
mod rttp;

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
        /// Where to write bench-pingpong.csv and bench-pingpong.svg.
        #[arg(long, default_value = "target")]
        out: std::path::PathBuf,
        /// Only draw OUT/bench-pingpong.svg from OUT/bench-pingpong.csv, without measuring.
        #[arg(long)]
        plot_only: bool,
        /// Instead, a GM program's curve: host-lib/capi/tests/c/gm_pingpong.c from 0 bytes to
        /// --most (each power of two and 3 bytes either side), in one daemon and over UDP between
        /// two, beside the Rust API's Port ping-pong in the same daemons and a raw UDP ping-pong
        /// on loopback (OUT/bench-pingpong-curve.csv and .svg).
        #[arg(long)]
        curve: bool,
        /// Round trips per length of the curve.
        #[arg(long, default_value_t = 100)]
        curve_round_trips: u32,
        /// The longest message of the curve.
        #[arg(long, default_value_t = 1 << 20)]
        most: usize,
    },
    /// NIC-based against host-based barrier latency for pairwise exchange, gather-broadcast (best
    /// dimension) and dissemination (n = 1..4, and the tuned n where a tuning file gives one) at 2, 4, 8, 16 processes on the emulated NIC, in the
    /// shape of the paper's Figure 5 (table, CSV, and a figure drawn from the CSV); with Open MPI's MPI_Barrier (shared memory,
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
        /// Only draw OUT/bench-barrier.svg from OUT/bench-barrier.csv, without measuring
        /// (`--out docs --plot-only` redraws the committed figure).
        #[arg(long)]
        plot_only: bool,
        /// Skip the Open MPI reference even if it is installed.
        #[arg(long)]
        no_mpi: bool,
        /// How the processes wait for a barrier's end: `sleep` on their doorbells at once;
        /// `spin` on their event rings (yielding), which wants a core per process (with fewer,
        /// spinners can starve one another); `default`, the library's: spin 20 µs, then sleep.
        #[arg(long, default_value = "sleep", value_parser = ["sleep", "spin", "default"])]
        wait: String,
        /// `--wait spin`.
        #[arg(long, conflicts_with = "wait")]
        spin: bool,
        /// Also measure dissemination at the n this tuning file (`bench rttp --write`) gives
        /// each size, as the series "diss tuned"; without it, at the n of the tuning file the
        /// library reads, if there is one.
        #[arg(long, value_name = "FILE")]
        tuning: Option<std::path::PathBuf>,
        /// NIC threads of the daemon, each measured in turn: numbers or `auto` (the daemon's
        /// default for this host).
        #[arg(long, value_delimiter = ',', default_value = "auto")]
        threads: Vec<String>,
        /// Idle policies of the NIC threads (poll, sleep, adaptive), each measured in turn
        /// with each --threads value.
        #[arg(long, value_delimiter = ',', default_value = "adaptive")]
        idle: Vec<String>,
    },
    /// The 1:P ping-pong of Hoefler et al., *Fast Barrier Synchronization for InfiniBand*: one
    /// process sends to P peers at once and waits for every reply, RTT(P) for P = 1..15 on the
    /// emulated NIC (medians, CSV, table, figure); the paper's LoP model fitted to it by least
    /// squares, the n-way dissemination n it predicts best per group size, and (`--write`) the
    /// tuning file from which `nicbar::tuning` gives that n.
    Rttp(rttp::Args),
    /// One-sided operations through the emulated NIC: put and get latency and bandwidth from 8 B
    /// to 16 MiB and NIC atomic latency, in-process (two units of one daemon) and over UDP between
    /// two daemons, beside memcpy and a raw UDP stream, interleaved in rounds (medians; table,
    /// CSV, figure), with the ratios issue 13 sets targets for.
    Rdma {
        /// Rounds of interleaved samples (one sample of every measurement per round).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// The seed of each round's order (default: from the clock; printed).
        #[arg(long)]
        seed: Option<u64>,
        /// Processes spin on their event rings instead of sleeping on doorbells.
        #[arg(long)]
        spin: bool,
        /// Packets not authenticated, to see what the fabric's code costs.
        #[arg(long)]
        no_auth: bool,
        /// Where to write bench-rdma.csv and bench-rdma.svg.
        #[arg(long, default_value = "target")]
        out: std::path::PathBuf,
        /// Only draw OUT/bench-rdma.svg from OUT/bench-rdma.csv, without measuring.
        #[arg(long)]
        plot_only: bool,
    },
    /// MPI_Barrier latency and MPI_Ibarrier overlap (OSU's definition), and the data
    /// collectives' latency (MPI_Bcast, MPI_Scatter[v], MPI_Gather[v], MPI_Alltoall[v],
    /// MPI_Allreduce) over sizes and process counts, through the coll/nicbar component beside
    /// Open MPI's own collectives over shared memory and TCP (tables, CSVs, plots).
    Mpi(crate::mpi::BenchArgs),
    /// Saify's *Optimizing Collective Communication Operations in ARMCI* over the emulated NIC:
    /// AllFence latency against K and node count (one request at a time, K outstanding in a
    /// shuffled order, and the NIC's own completions), the fused fence-and-barrier against
    /// AllFence + barrier, and lock/unlock under contention (ticket against MCS queue lock), each
    /// beside its baseline in one run (table, CSV, figure).
    Armci(armci::Args),
    /// Liu et al.'s fast path and Li et al.'s passive locks over the emulated NIC: one-way
    /// small-message latency (8 B .. 4 KiB) of the RDMA-write eager fast path against the ordinary
    /// send/receive path and raw UDP, and lock + unlock latency of the passive lock on NIC atomics
    /// against the lock the target's process serves, with the target computing; interleaved rounds,
    /// medians (table, CSV, figure).
    Fastpath(fastpath::Args),
}

/// Builds the benchmark program with the fast release profile and runs it.
pub(crate) fn run_bench(args: Args) -> Result<()> {
    match args.bench {
        Bench::Pingpong {
            round_trips,
            c_round_trips,
            out,
            plot_only,
            curve,
            curve_round_trips,
            most,
        } => {
            let out = crate::workspace_root().join(out);
            if curve {
                let programs = || {
                    let (gm_pingpong, nicctl) =
                        c_program("host-lib/capi/tests/c/gm_pingpong.c", "gm_pingpong")?;
                    let bench_pingpong = example("bench_pingpong")?.get_program().into();
                    Ok(gm_curve::Programs {
                        gm_pingpong,
                        nicctl,
                        bench_pingpong,
                    })
                };
                return gm_curve::run_curve(&out, programs, curve_round_trips, most, plot_only);
            }
            let csv = out.join("bench-pingpong.csv");
            if !plot_only {
                std::fs::create_dir_all(&out)?;
                let (c_pingpong, nicctl) = c_pingpong()?;
                let mut command = example("bench_pingpong")?;
                command.arg("--round-trips").arg(round_trips.to_string());
                command.arg("--c-pingpong").arg(c_pingpong);
                command.arg("--nicctl").arg(nicctl);
                command
                    .arg("--c-round-trips")
                    .arg(c_round_trips.to_string());
                command.arg("--csv").arg(&csv);
                run(&mut command)?;
            }
            draw(&csv, &out.join("bench-pingpong.svg"), pingpong_figure)
        }
        Bench::Barrier {
            sizes,
            barriers,
            out,
            plot_only,
            no_mpi,
            wait,
            spin,
            tuning,
            threads,
            idle,
        } => {
            let out = crate::workspace_root().join(out);
            if !plot_only {
                let mut command = example("bench_barrier")?;
                let sizes: Vec<String> = sizes.iter().map(usize::to_string).collect();
                command.arg("--sizes").arg(sizes.join(","));
                command.arg("--barriers").arg(barriers.to_string());
                command.arg("--out").arg(&out);
                if no_mpi {
                    command.arg("--no-mpi");
                }
                command.arg("--wait").arg(if spin { "spin" } else { &wait });
                if let Some(file) = &tuning {
                    command.arg("--tuning").arg(file);
                }
                command.arg("--threads").arg(threads.join(","));
                command.arg("--idle").arg(idle.join(","));
                run(&mut command)?;
            }
            draw(
                &out.join("bench-barrier.csv"),
                &out.join("bench-barrier.svg"),
                barrier_figure,
            )
        }
        Bench::Rdma {
            rounds,
            seed,
            spin,
            no_auth,
            out,
            plot_only,
        } => {
            let out = crate::workspace_root().join(out);
            let csv = out.join("bench-rdma.csv");
            if !plot_only {
                std::fs::create_dir_all(&out)?;
                let mut command = example("bench_rdma")?;
                command.arg("--rounds").arg(rounds.to_string());
                command.arg("--csv").arg(&csv);
                if let Some(seed) = seed {
                    command.arg("--seed").arg(seed.to_string());
                }
                if spin {
                    command.arg("--spin");
                }
                if no_auth {
                    command.arg("--no-auth");
                }
                run(&mut command)?;
            }
            draw(&csv, &out.join("bench-rdma.svg"), rdma_figure)
        }
        Bench::Rttp(args) => rttp::run_rttp(args),
        Bench::Mpi(args) => crate::mpi::run_bench(args),
        Bench::Armci(args) => armci::run_armci(args),
        Bench::Fastpath(args) => fastpath::run_fastpath(args),
    }
}

/// Builds `libnicbar` and `nicctl` with the `bench-fast` profile and compiles
/// `host-lib/examples/c/pingpong.c` against them (`$CC`, else `cc`, at `-O2`); returns the
/// program and `nicctl`.
fn c_pingpong() -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    c_program("host-lib/examples/c/pingpong.c", "pingpong")
}

/// Builds `libnicbar` and `nicctl` with the `bench-fast` profile and compiles the C program
/// `source` (relative to the workspace) against them as `name`; returns it and `nicctl`.
fn c_program(source: &str, name: &str) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
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
    let program = built.join("c").join(name);
    std::fs::create_dir_all(built.join("c"))?;
    run(
        std::process::Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
            .args(["-std=c11", "-O2", "-I"])
            .arg(root.join("host-lib/include"))
            .arg(root.join(source))
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

/// Reads a benchmark's CSV, draws its figure with `figure`, and writes it to `svg`.
fn draw(
    csv: &std::path::Path,
    svg: &std::path::Path,
    figure: fn(&Csv) -> Result<Figure>,
) -> Result<()> {
    let text =
        std::fs::read_to_string(csv).map_err(|e| format!("cannot read {}: {e}", csv.display()))?;
    let table = Csv::parse(&text).map_err(|e| format!("{}: {e}", csv.display()))?;
    figure(&table)?.write_svg(svg)?;
    println!("drew {} from {}", svg.display(), csv.display());
    Ok(())
}

/// A benchmark's CSV: a header line and rows of plain fields (no quoting: the benchmarks write
/// none; only the first column, a name, may hold commas).
struct Csv {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Csv {
    fn parse(text: &str) -> Result<Self> {
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let header: Vec<String> = lines
            .next()
            .ok_or("empty CSV")?
            .split(',')
            .map(|f| f.trim().to_string())
            .collect();
        let rows = lines
            .map(|line| {
                let mut fields: Vec<String> =
                    line.split(',').map(|f| f.trim().to_string()).collect();
                // A name with commas in the first column ("NIC in-process, spin"): the surplus
                // fields belong to it.
                let surplus = fields.len().saturating_sub(header.len());
                if surplus > 0 {
                    let name = fields.drain(..=surplus).collect::<Vec<_>>().join(", ");
                    fields.insert(0, name);
                }
                fields
            })
            .collect();
        Ok(Self { header, rows })
    }

    /// The index of column `name`.
    fn column(&self, name: &str) -> Result<usize> {
        self.header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| format!("no column {name:?} in {:?}", self.header).into())
    }

    /// Field `column` of `row`, as a number; `None` where it is empty.
    fn number(row: &[String], column: usize) -> Result<Option<f64>> {
        match row.get(column).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(text) => {
                Ok(Some(text.parse().map_err(|e| {
                    format!("field {text:?} is not a number: {e}")
                })?))
            }
        }
    }
}

/// The barrier benchmark's figure, in the shape of the paper's Figure 5: (a) latency against
/// processes, NIC-based solid and host-based dashed per algorithm family (gather-broadcast at its
/// best dimension), Open MPI dotted; (b) the factor of improvement, host over NIC. Where the
/// run measured several NIC engines (threads and idle policies), the first one's rows are drawn.
fn barrier_figure(csv: &Csv) -> Result<Figure> {
    let (processes, algorithm, nic, host) = (
        csv.column("processes")?,
        csv.column("algorithm")?,
        csv.column("nic_us")?,
        csv.column("host_us")?,
    );
    let engine = csv.column("engine").ok();
    let first_engine = engine.and_then(|column| {
        csv.rows
            .iter()
            .filter_map(|row| row.get(column))
            .find(|label| !label.is_empty())
            .cloned()
    });
    let drawn = |row: &Vec<String>| match (engine, &first_engine) {
        (Some(column), Some(first)) => row
            .get(column)
            .is_none_or(|label| label.is_empty() || label == first),
        _ => true,
    };
    // (family, processes) -> best (nic, host), in first-seen order; and the references.
    let mut families: Vec<String> = Vec::new();
    let mut best: Vec<(String, f64, f64, f64)> = Vec::new();
    let mut references: Vec<(String, f64, f64)> = Vec::new();
    let mut sizes: Vec<f64> = Vec::new();
    for row in csv.rows.iter().filter(|row| drawn(row)) {
        let n = Csv::number(row, processes)?.ok_or("a row without processes")?;
        let name = row.get(algorithm).ok_or("a row without algorithm")?;
        let nic_us = Csv::number(row, nic)?.ok_or("a row without nic_us")?;
        if !sizes.contains(&n) {
            sizes.push(n);
        }
        let Some(host_us) = Csv::number(row, host)? else {
            // A reference (Open MPI's MPI_Barrier) has one latency and no host-based twin.
            references.push((name.clone(), n, nic_us));
            continue;
        };
        let family = if name.starts_with("GB") {
            "GB best".to_string()
        } else if name.starts_with("diss tuned") {
            // The tuned n differs from size to size: one series.
            "diss tuned".to_string()
        } else {
            name.clone()
        };
        if !families.contains(&family) {
            families.push(family.clone());
        }
        match best.iter_mut().find(|b| b.0 == family && b.1 == n) {
            Some(b) => {
                b.2 = b.2.min(nic_us);
                b.3 = b.3.min(host_us);
            }
            None => best.push((family, n, nic_us, host_us)),
        }
    }
    sizes.sort_by(f64::total_cmp);

    let x = Axis::log("processes").with_ticks(&sizes);
    let mut latency = Panel::new(
        "(a) barrier latency",
        x.clone(),
        Axis::log("latency per barrier (µs)"),
    );
    let mut factor = Panel::new(
        "(b) factor of improvement",
        x,
        Axis::linear("host-based / NIC-based latency")
            .including(0.0)
            .including(1.0),
    );
    for (i, family) in families.iter().enumerate() {
        let mut nic = Series::new(family, Colour::Palette(i), Stroke::Solid);
        let mut host = Series::unlabelled(Colour::Palette(i), Stroke::Dashed);
        let mut ratio = Series::new(family, Colour::Palette(i), Stroke::Solid);
        for (_, n, nic_us, host_us) in best.iter().filter(|b| &b.0 == family) {
            nic.point(*n, *nic_us);
            host.point(*n, *host_us);
            ratio.point(*n, host_us / nic_us);
        }
        latency.series.extend([nic, host]);
        factor.series.push(ratio);
    }
    let mut names: Vec<&str> = Vec::new();
    for (name, _, _) in &references {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    for (i, name) in names.into_iter().enumerate() {
        // The references take the palette's colours after the families'.
        let colour = Colour::Palette(families.len() + i);
        let mut series = Series::new(name, colour, Stroke::Dotted);
        for (_, n, us) in references.iter().filter(|r| r.0 == name) {
            series.point(*n, *us);
        }
        latency.series.push(series);
    }
    latency
        .note(Stroke::Solid, "NIC-based")
        .note(Stroke::Dashed, "host-based");
    let mut parity = Series::new("equal (1x)", Colour::Gray, Stroke::Dashed);
    if let (Some(first), Some(last)) = (sizes.first(), sizes.last()) {
        parity.point(*first, 1.0).point(*last, 1.0);
    }
    factor.series.push(parity);
    Ok(Figure {
        title: "NIC-based against host-based barriers on the emulated NIC".into(),
        panels: vec![latency, factor],
    })
}

/// The ping-pong benchmark's figure: one-way latency at the median and the 99th percentile, one
/// line per measurement (the NIC's solid, the references dotted), so both the typical latency
/// and its tail compare at a glance.
fn pingpong_figure(csv: &Csv) -> Result<Figure> {
    let (name, p50, p99) = (
        csv.column("measurement")?,
        csv.column("p50_us")?,
        csv.column("p99_us")?,
    );
    let mut panel = Panel::new(
        "one-way latency of 64-byte messages",
        Axis::linear("percentile of round trips (%)").with_ticks(&[50.0, 99.0]),
        Axis::log("one-way latency (µs)"),
    );
    for (i, row) in csv.rows.iter().enumerate() {
        let label = row.get(name).ok_or("a row without measurement")?;
        let stroke = if label.starts_with("NIC") {
            Stroke::Solid
        } else {
            Stroke::Dotted
        };
        let mut series = Series::new(label, Colour::Palette(i), stroke);
        if let (Some(median), Some(tail)) = (Csv::number(row, p50)?, Csv::number(row, p99)?) {
            series.point(50.0, median).point(99.0, tail);
        }
        panel.series.push(series);
    }
    Ok(Figure {
        title: "Messages through the emulated NIC and two references".into(),
        panels: vec![panel],
    })
}

/// The one-sided benchmark's figure: (a) latency and (b) bandwidth against operation size, both
/// log-log; the NIC's series solid (in-process) and dashed (UDP), the references dotted; atomic
/// latency as a point at 8 bytes.
fn rdma_figure(csv: &Csv) -> Result<Figure> {
    let mut figure = size_figure(
        csv,
        "operation size (bytes)",
        "(a) latency of one operation",
        "(b) bandwidth, 8 operations outstanding",
        "median",
    )?;
    figure.title = "One-sided operations through the emulated NIC".into();
    Ok(figure)
}

/// Latency and bandwidth against size, log-log, from a CSV of `series`, `bytes`, `latency_us`
/// and `bandwidth_mb_s`: series ending "UDP" dashed, "in-process" solid, others dotted.
fn size_figure(
    csv: &Csv,
    size_label: &str,
    latency_title: &str,
    bandwidth_title: &str,
    statistic: &str,
) -> Result<Figure> {
    let (series, bytes, latency, bandwidth) = (
        csv.column("series")?,
        csv.column("bytes")?,
        csv.column("latency_us")?,
        csv.column("bandwidth_mb_s")?,
    );
    let mut names: Vec<String> = Vec::new();
    let mut sizes: Vec<f64> = Vec::new();
    for row in &csv.rows {
        let name = row.get(series).ok_or("a row without series")?;
        if !names.contains(name) {
            names.push(name.clone());
        }
        let size = Csv::number(row, bytes)?.ok_or("a row without bytes")?;
        if !sizes.contains(&size) {
            sizes.push(size);
        }
    }
    names.sort();
    // 8 B, 1 KiB and 1 MiB: every size's label would overlap its neighbours'.
    let ticks: Vec<f64> = [8.0, 1024.0, 1_048_576.0]
        .into_iter()
        .filter(|tick| sizes.contains(tick))
        .collect();
    let x = Axis::log(size_label).with_ticks(&ticks);
    let mut latency_panel = Panel::new(
        latency_title,
        x.clone(),
        Axis::log(&format!("{statistic} latency (µs)")),
    );
    let mut bandwidth_panel = Panel::new(
        bandwidth_title,
        x,
        Axis::log(&format!("{statistic} bandwidth (MB/s)")),
    );
    for (i, name) in names.iter().enumerate() {
        let stroke = if name.ends_with("UDP") {
            Stroke::Dashed
        } else if name.ends_with("in-process") {
            Stroke::Solid
        } else {
            Stroke::Dotted
        };
        let mut on_latency = Series::new(name, Colour::Palette(i), stroke);
        let mut on_bandwidth = Series::new(name, Colour::Palette(i), stroke);
        for row in csv.rows.iter().filter(|row| row.get(series) == Some(name)) {
            let size = Csv::number(row, bytes)?.ok_or("a row without bytes")?;
            if size <= 0.0 {
                // No place on a log axis.
                continue;
            }
            if let Some(us) = Csv::number(row, latency)? {
                on_latency.point(size, us);
            }
            if let Some(mb_s) = Csv::number(row, bandwidth)? {
                on_bandwidth.point(size, mb_s);
            }
        }
        // The benchmark writes its rows in the order it met them (shuffled rounds).
        on_latency.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        on_bandwidth.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        if !on_latency.points.is_empty() {
            latency_panel.series.push(on_latency);
        }
        if !on_bandwidth.points.is_empty() {
            bandwidth_panel.series.push(on_bandwidth);
        }
    }
    latency_panel
        .note(Stroke::Solid, "in-process")
        .note(Stroke::Dashed, "over UDP")
        .note(Stroke::Dotted, "reference");
    Ok(Figure {
        title: String::new(),
        panels: vec![latency_panel, bandwidth_panel],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rdma_figure_draws_latency_and_bandwidth_per_series() {
        let csv = Csv::parse(
            "series,bytes,latency_us,bandwidth_mb_s,samples\n\
             put in-process,1048576,9000,110,5\nput in-process,8,15,0.5,5\n\
             atomic UDP,8,40,,5\nraw UDP stream,8,,1.5,5\n",
        )
        .expect("parses");
        let figure = rdma_figure(&csv).expect("draws");
        let latency: Vec<Option<&str>> = figure.panels[0]
            .series
            .iter()
            .map(|s| s.label.as_deref())
            .collect();
        assert_eq!(latency, [Some("atomic UDP"), Some("put in-process")]);
        let bandwidth = &figure.panels[1].series;
        assert_eq!(
            bandwidth.len(),
            2,
            "atomics have no bandwidth, the stream no latency"
        );
        assert_eq!(bandwidth[0].points, [(8.0, 0.5), (1_048_576.0, 110.0)]);
        assert_eq!(bandwidth[0].label.as_deref(), Some("put in-process"));
        assert!(figure.to_svg().is_ok());
    }

    #[test]
    fn a_name_with_commas_stays_one_field() {
        let csv = Csv::parse("measurement,p50_us,mean_us,p99_us\nNIC in-process, spin,1.5,1.7,4\n")
            .expect("parses");
        assert_eq!(csv.rows[0][0], "NIC in-process, spin");
        assert_eq!(Csv::number(&csv.rows[0], 3).expect("a number"), Some(4.0));
    }

    #[test]
    fn the_barrier_figure_reports_best_gather_broadcast_and_references() {
        let csv = Csv::parse(
            "processes,algorithm,nic_us,host_us,factor\n\
             2,PE,20,30,1.5\n2,GB d=1,40,90,2.25\n4,GB d=1,50,200,4\n4,GB d=2,45,100,2.2\n\
             2,MPI_Barrier shm,0.2,,\n",
        )
        .expect("parses");
        let figure = barrier_figure(&csv).expect("draws");
        let latency = &figure.panels[0];
        let labels: Vec<Option<&str>> = latency.series.iter().map(|s| s.label.as_deref()).collect();
        assert_eq!(
            labels,
            [
                Some("PE"),
                None,
                Some("GB best"),
                None,
                Some("MPI_Barrier shm")
            ]
        );
        // GB at 4 processes: the best dimension of each mode.
        assert_eq!(latency.series[2].points, [(2.0, 40.0), (4.0, 45.0)]);
        assert_eq!(latency.series[3].points, [(2.0, 90.0), (4.0, 100.0)]);
        let factor = &figure.panels[1];
        assert_eq!(factor.series[1].points, [(2.0, 2.25), (4.0, 100.0 / 45.0)]);
        assert!(figure.to_svg().is_ok());
    }
}
