//! `cargo xtask bench rttp`: the 1:P ping-pong of Hoefler et al., *Fast Barrier Synchronization
//! for InfiniBand*, on the emulated NIC (the program is `xtask/system/examples/bench_rttp.rs`), its
//! LoP fit, the dissemination n predicted best per group size, and the tuning file the library
//! reads; table, CSVs and a figure.

use std::path::{Path, PathBuf};

use clap::Args as ClapArgs;

use super::{Csv, example};
use crate::Result;
use crate::command::run;
use crate::plot::{Axis, Colour, Figure, Panel, Series, Stroke};

/// Options of `cargo xtask bench rttp`.
#[derive(ClapArgs)]
pub(crate) struct Args {
    /// Measure P = 1..=MAX_PEERS peers (3..=63; one process per peer plus the initiator).
    #[arg(long, default_value_t = 15)]
    max_peers: usize,
    /// Timed round trips per P (after a tenth as many to warm up).
    #[arg(long, default_value_t = 2000)]
    round_trips: usize,
    /// Where to write bench-rttp.csv, bench-rttp-tuned.csv and bench-rttp.svg.
    #[arg(long, default_value = "target")]
    out: PathBuf,
    /// Only draw OUT/bench-rttp.svg from the CSVs in OUT, without measuring.
    #[arg(long)]
    plot_only: bool,
    /// Write the tuning file the library reads: to FILE, or without a value to where the library
    /// looks ($NICBAR_TUNING, else $XDG_CONFIG_HOME/nicbar/tuning, else
    /// ~/.config/nicbar/tuning).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "")]
    write: Option<PathBuf>,
    /// The initiator on one daemon, the peers on another, over UDP on loopback.
    #[arg(long)]
    udp: bool,
    /// Processes spin on their event rings instead of sleeping on doorbells (wants a core per
    /// process).
    #[arg(long)]
    spin: bool,
    /// The seed of the order the P are measured in (shuffled every round).
    #[arg(long)]
    seed: Option<u64>,
}

/// Runs `cargo xtask bench rttp`.
pub(crate) fn run_rttp(args: Args) -> Result<()> {
    let out = crate::workspace_root().join(&args.out);
    let csv = out.join("bench-rttp.csv");
    if !args.plot_only {
        std::fs::create_dir_all(&out)?;
        let mut command = example("bench_rttp")?;
        command.arg("--max-peers").arg(args.max_peers.to_string());
        command
            .arg("--round-trips")
            .arg(args.round_trips.to_string());
        command.arg("--csv").arg(&csv);
        if let Some(path) = &args.write {
            command.arg("--write").arg(path);
        }
        if args.udp {
            command.arg("--udp");
        }
        if args.spin {
            command.arg("--spin");
        }
        if let Some(seed) = args.seed {
            command.arg("--seed").arg(seed.to_string());
        }
        run(&mut command)?;
    }
    let svg = out.join("bench-rttp.svg");
    let tuned = out.join("bench-rttp-tuned.csv");
    figure(&read(&csv)?, &read(&tuned)?)?.write_svg(&svg)?;
    println!(
        "drew {} from {} and {}",
        svg.display(),
        csv.display(),
        tuned.display()
    );
    Ok(())
}

fn read(path: &Path) -> Result<Csv> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Csv::parse(&text).map_err(|e| format!("{}: {e}", path.display()).into())
}

/// (a) RTT(P): the measured median with its 10th and 90th percentiles, the LoP fit and LogP's
/// straight line; (b) the dissemination latency the fit predicts against group size, at n = 1
/// and at the n predicted best.
fn figure(rttp: &Csv, tuned: &Csv) -> Result<Figure> {
    let column = |name: &str| rttp.column(name);
    let (peers, p10, median, p90, lop, line) = (
        column("peers")?,
        column("p10_us")?,
        column("median_us")?,
        column("p90_us")?,
        column("lop_fit_us")?,
        column("line_fit_us")?,
    );
    let mut ticks = Vec::new();
    let mut measured = Series::new("median", Colour::Palette(0), Stroke::Solid);
    let mut low = Series::unlabelled(Colour::Palette(0), Stroke::Dotted);
    let mut high = Series::unlabelled(Colour::Palette(0), Stroke::Dotted);
    let mut fitted = Series::new("LoP fit", Colour::Palette(1), Stroke::Dashed);
    let mut straight = Series::new("LogP line", Colour::Gray, Stroke::Dashed);
    for row in &rttp.rows {
        let p = Csv::number(row, peers)?.ok_or("a row without peers")?;
        ticks.push(p);
        let value = |index| -> Result<f64> {
            Csv::number(row, index)?.ok_or_else(|| format!("P = {p}: an empty field").into())
        };
        measured.point(p, value(median)?);
        low.point(p, value(p10)?);
        high.point(p, value(p90)?);
        fitted.point(p, value(lop)?);
        straight.point(p, value(line)?);
    }
    let mut round_trip = Panel::new(
        "(a) 1:P ping-pong round trip",
        Axis::linear("P (peers sent to at once)").with_ticks(&ticks),
        Axis::linear("RTT(P) (µs)").including(0.0),
    );
    round_trip.series = vec![measured, low, high, fitted, straight];
    round_trip.note(Stroke::Dotted, "10th / 90th percentile");

    let (processes, best_n, best, one) = (
        tuned.column("processes")?,
        tuned.column("best_n")?,
        tuned.column("predicted_best_us")?,
        tuned.column("predicted_n1_us")?,
    );
    let mut sizes = Vec::new();
    let mut at_one = Series::new("n = 1", Colour::Palette(2), Stroke::Solid);
    let mut at_best = Series::new("best n", Colour::Palette(3), Stroke::Solid);
    for row in &tuned.rows {
        let n = Csv::number(row, processes)?.ok_or("a row without processes")?;
        let (Some(b), Some(o), Some(_)) = (
            Csv::number(row, best)?,
            Csv::number(row, one)?,
            Csv::number(row, best_n)?,
        ) else {
            continue;
        };
        sizes.push(n);
        at_one.point(n, o);
        at_best.point(n, b);
    }
    let mut ticks: Vec<f64> = sizes
        .iter()
        .copied()
        .filter(|s| (*s as u64).is_power_of_two())
        .collect();
    ticks.dedup();
    let mut predicted = Panel::new(
        "(b) dissemination latency the fit predicts",
        Axis::log("processes").with_ticks(&ticks),
        Axis::log("predicted latency (µs)"),
    );
    predicted.series = vec![at_one, at_best];
    Ok(Figure {
        title: "Hoefler et al.'s 1:P ping-pong on the emulated NIC, its LoP fit and the tuned n"
            .into(),
        panels: vec![round_trip, predicted],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figure_draws_both_panels_from_the_two_csvs() {
        let rttp = Csv::parse(
            "peers,p10_us,median_us,p90_us,mean_us,lop_fit_us,line_fit_us,residual_us,samples\n\
             1,10,12,20,13,12.5,11,-0.5,100\n2,14,16,25,17,15.8,16,0.2,100\n\
             3,18,20,30,21,20.1,21,-0.1,100\n",
        )
        .expect("parses");
        let tuned = Csv::parse(
            "processes,best_n,predicted_best_us,predicted_n1_us\n2,1,6,6\n4,3,8,12\n8,2,14,18\n",
        )
        .expect("parses");
        let figure = figure(&rttp, &tuned).expect("draws");
        assert_eq!(figure.panels.len(), 2);
        assert_eq!(
            figure.panels[0].series[0].points,
            [(1.0, 12.0), (2.0, 16.0), (3.0, 20.0)]
        );
        assert_eq!(figure.panels[1].series[1].points[1], (4.0, 8.0));
        assert!(figure.to_svg().is_ok());
    }
}
