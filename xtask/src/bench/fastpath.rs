//! `cargo xtask bench fastpath`: the measurements of Liu et al., *High Performance RDMA-Based MPI
//! Implementation over InfiniBand*, and of Li et al., *Efficient and Truly Passive MPI-3 RMA
//! Using InfiniBand Atomics*, over the emulated NIC (the program is
//! `xtask/system/examples/bench_fastpath.rs`) — one-way small-message latency of the RDMA-write
//! eager fast path against the ordinary send/receive path and raw UDP, and lock + unlock latency
//! of the passive lock on NIC atomics against the lock the target's process serves, with the
//! target computing; interleaved rounds, medians, table, CSV and figure.

use std::path::PathBuf;

use clap::Args as ClapArgs;

use super::{Csv, draw, example};
use crate::Result;
use crate::command::run;
use crate::plot::{Axis, Colour, Figure, Panel, Series, Stroke};

/// Options of `cargo xtask bench fastpath`.
#[derive(ClapArgs)]
pub(crate) struct Args {
    /// Rounds; each measures every length and path, and every lock variant, once.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// Round trips per length and path per round (after a tenth as many to warm up).
    #[arg(long, default_value_t = 2000)]
    round_trips: usize,
    /// Message lengths in bytes (at most 4072, what one ordinary message carries).
    #[arg(long, value_delimiter = ',', default_values_t = [8, 64, 256, 1024, 4072])]
    sizes: Vec<usize>,
    /// Lock + unlock pairs per lock variant per round.
    #[arg(long, default_value_t = 500)]
    lock_pairs: usize,
    /// Microseconds the lock's target computes between its calls to the library (served lock).
    #[arg(long, default_value_t = 200)]
    compute_us: u64,
    /// Where to write bench-fastpath.csv and bench-fastpath.svg.
    #[arg(long, default_value = "target")]
    out: PathBuf,
    /// Only draw OUT/bench-fastpath.svg from OUT/bench-fastpath.csv, without measuring.
    #[arg(long)]
    plot_only: bool,
}

/// Runs `cargo xtask bench fastpath`.
pub(crate) fn run_fastpath(args: Args) -> Result<()> {
    let out = crate::workspace_root().join(&args.out);
    let csv = out.join("bench-fastpath.csv");
    if !args.plot_only {
        std::fs::create_dir_all(&out)?;
        let given: Vec<String> = std::env::args().skip(1).collect();
        println!("command: cargo xtask {}", given.join(" "));
        let mut command = example("bench_fastpath")?;
        let sizes: Vec<String> = args.sizes.iter().map(usize::to_string).collect();
        command.arg("--rounds").arg(args.rounds.to_string());
        command
            .arg("--round-trips")
            .arg(args.round_trips.to_string());
        command.arg("--sizes").arg(sizes.join(","));
        command.arg("--lock-pairs").arg(args.lock_pairs.to_string());
        command.arg("--compute-us").arg(args.compute_us.to_string());
        command.arg("--csv").arg(&csv);
        run(&mut command)?;
    }
    draw(&csv, &out.join("bench-fastpath.svg"), figure)
}

/// Two panels: (a) one-way latency against message length, one line per path (the fast path
/// solid, the ordinary path dashed, raw UDP dotted); (b) lock + unlock latency at the median and
/// the 99th percentile, one line per lock variant.
fn figure(csv: &Csv) -> Result<Figure> {
    let (measurement, variant, bytes, p50, p99) = (
        csv.column("measurement")?,
        csv.column("variant")?,
        csv.column("bytes")?,
        csv.column("p50_us")?,
        csv.column("p99_us")?,
    );
    let mut sizes: Vec<f64> = Vec::new();
    let mut paths: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut locks: Vec<(String, f64, f64)> = Vec::new();
    for row in &csv.rows {
        let m = row.get(measurement).ok_or("a row without measurement")?;
        let v = row.get(variant).ok_or("a row without variant")?.clone();
        let median = Csv::number(row, p50)?.ok_or("a row without p50_us")?;
        match m.as_str() {
            "latency" => {
                let b = Csv::number(row, bytes)?.ok_or("a row without bytes")?;
                if !sizes.contains(&b) {
                    sizes.push(b);
                }
                match paths.iter_mut().find(|p| p.0 == v) {
                    Some(path) => path.1.push((b, median)),
                    None => paths.push((v, vec![(b, median)])),
                }
            }
            "lock" => {
                let tail = Csv::number(row, p99)?.ok_or("a row without p99_us")?;
                locks.push((v, median, tail));
            }
            _ => {}
        }
    }
    sizes.sort_by(f64::total_cmp);
    let mut latency = Panel::new(
        "(a) one-way latency, median",
        Axis::log("message length (bytes)").with_ticks(&sizes),
        Axis::log("one-way latency (µs)"),
    );
    for (i, (name, points)) in paths.iter().enumerate() {
        let stroke = if name.starts_with("fast") {
            Stroke::Solid
        } else if name.starts_with("ordinary") {
            Stroke::Dashed
        } else {
            Stroke::Dotted
        };
        let mut series = Series::new(name, Colour::Palette(i), stroke);
        for &(x, y) in points {
            series.point(x, y);
        }
        latency.series.push(series);
    }
    let mut lock = Panel::new(
        "(b) lock + unlock, target computing",
        Axis::linear("percentile of pairs (%)").with_ticks(&[50.0, 99.0]),
        Axis::log("latency (µs)"),
    );
    for (i, (name, median, tail)) in locks.iter().enumerate() {
        let stroke = if name.starts_with("passive") {
            Stroke::Solid
        } else {
            Stroke::Dashed
        };
        let mut series = Series::new(name, Colour::Palette(paths.len() + i), stroke);
        series.point(50.0, *median).point(99.0, *tail);
        lock.series.push(series);
    }
    Ok(Figure {
        title: "Liu et al.'s fast path and Li et al.'s passive locks over the emulated NIC".into(),
        panels: vec![latency, lock],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figure_has_a_line_per_path_and_per_lock_variant() {
        let csv = Csv::parse(
            "measurement,variant,bytes,p50_us,p99_us\n\
             latency,fast path,8,20,30\nlatency,ordinary path,8,30,40\n\
             latency,fast path,64,22,31\nlatency,raw UDP,8,6,9\n\
             lock,passive,0,40,70\nlock,served (target polls),0,30,60\n",
        )
        .expect("parses");
        let figure = figure(&csv).expect("draws");
        assert_eq!(figure.panels.len(), 2);
        let latency = &figure.panels[0];
        assert_eq!(latency.series.len(), 3);
        assert_eq!(latency.series[0].points, [(8.0, 20.0), (64.0, 22.0)]);
        let lock = &figure.panels[1];
        assert_eq!(lock.series.len(), 2);
        assert_eq!(
            lock.series[1].label.as_deref(),
            Some("served (target polls)")
        );
        assert_eq!(lock.series[1].points, [(50.0, 30.0), (99.0, 60.0)]);
        assert!(figure.to_svg().is_ok());
    }
}
