//! `cargo xtask sim tune`: the self-tuning of n-way dissemination of Hoefler et al., *Fast
//! Barrier Synchronization for InfiniBand*, run inside the barrier cost model, to 65,536 nodes.
//!
//! For each mode (NIC-based, host-based) the model runs Hoefler et al.'s 1:P ping-pong
//! (a gather-broadcast star of P + 1 ranks), fits the LoP model to it, takes the n the fit predicts
//! best at each size, and simulates dissemination at that n beside n = 1, pairwise exchange and
//! gather-broadcast at its best dimension. With `--rttp CSV` it also runs the n that the
//! emulated NIC's measured RTT(P) (`cargo xtask bench rttp`) predicts, so the measured tuning is
//! tried on the model's costs too.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args as ClapArgs;
use nicbar_schedule::Algorithm;
use nicbar_sim::cost::Mode;
use nicbar_sim::cost::lop::{LopFit, RttPoint, fit_lop, model_rttp};
use nicbar_sim::cost::params::{FitAssumptions, fit};
use nicbar_sim::cost::schedules::{MAX_NODES, SchedulePolicy};
use nicbar_sim::cost::sweep::{run_algorithm, run_size};

use crate::{Result, workspace_root};

/// Options of `cargo xtask sim tune`.
#[derive(ClapArgs)]
pub(crate) struct TuneArgs {
    /// The largest group size (powers of two and a few sizes between, as `sim barrier`).
    #[arg(long, default_value_t = MAX_NODES as u64, value_parser = clap::value_parser!(u64).range(2..=MAX_NODES as u64))]
    max_nodes: u64,
    /// The ping-pong's largest P, in the model and as a cap on the tuned n.
    #[arg(long, default_value_t = 15)]
    max_peers: usize,
    /// Also run the n that a measured RTT(P) predicts: the bench-rttp.csv of `cargo xtask bench
    /// rttp` (its median column is refitted here).
    #[arg(long, value_name = "CSV")]
    rttp: Option<PathBuf>,
    /// The CSV of the results [default: target/sim-tune.csv in the workspace].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Worker threads.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    jobs: u64,
}

/// One size in one mode.
struct Row {
    mode: Mode,
    nodes: usize,
    pairwise: f64,
    gather_broadcast: (usize, f64),
    one: f64,
    tuned: (usize, f64, f64),
    measured: Option<(usize, f64)>,
}

pub(crate) fn run_tune(args: TuneArgs) -> Result<()> {
    let costs = fit(FitAssumptions::default())?.lanai43;
    println!(
        "== Hoefler et al.'s self-tuning in the cost model (LANai 4.3 costs, fitted as in `sim barrier`) =="
    );
    println!(
        "1:P ping-pong in the model = a gather-broadcast star of P + 1 ranks (P:1, then 1:P), P = \
         1..={}; LoP fit t(P) = t1 + g·(P-1) + c·(P-1)² one way, a round of n costing RTT(n) - t(1); the n it predicts best at each size \
         (n <= {}), simulated beside n = 1.",
        args.max_peers, args.max_peers
    );
    let measured = match &args.rttp {
        Some(path) => Some(measured_fit(path)?),
        None => None,
    };
    if let Some(fit) = &measured {
        println!(
            "measured RTT(P) ({}): t1 = {:.3} µs, g = {:.3} µs, c = {:+.4} µs, residuals RMS {:.3} µs",
            args.rttp
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string()),
            fit.single_us,
            fit.gap_us,
            fit.congestion_us,
            fit.rms_us()
        );
    }
    let sizes = super::extension_sizes(args.max_nodes as usize);
    let mut rows = Vec::new();
    for mode in [Mode::Nic, Mode::Host] {
        let points = model_rttp(&costs, mode, args.max_peers)?;
        let lop = fit_lop(&points)?;
        println!(
            "\n{mode}: model RTT(P) {} µs",
            points
                .iter()
                .map(|p| format!("{:.1}", p.rtt_us))
                .collect::<Vec<_>>()
                .join(" ")
        );
        println!(
            "  LoP fit: t1 = {:.3} µs, g = {:.3} µs (g / t1 = {:.2}), c = {:+.4} µs; residuals RMS \
             {:.3} µs, largest {:+.3} µs",
            lop.single_us,
            lop.gap_us,
            lop.gap_us / lop.single_us,
            lop.congestion_us,
            lop.rms_us(),
            lop.max_residual_us()
        );
        for &nodes in &sizes {
            rows.push(run_one(
                mode,
                nodes,
                &costs,
                &lop,
                measured.as_ref(),
                args.jobs,
            )?);
            if nodes >= 4096 {
                eprintln!("  {mode}, {nodes} nodes done");
            }
        }
        print_table(mode, &rows, measured.is_some());
    }
    let out = args
        .out
        .unwrap_or_else(|| crate::target_dir().join("sim-tune.csv"));
    let out = if out.is_absolute() {
        out
    } else {
        workspace_root().join(out)
    };
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&out, csv(&rows))?;
    println!("\nwrote {}", out.display());
    Ok(())
}

fn measured_fit(path: &PathBuf) -> Result<LopFit> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().ok_or("an empty CSV")?.split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| format!("{}: no column {name:?}", path.display()))
    };
    let (peers, median) = (column("peers")?, column("median_us")?);
    let mut points = Vec::new();
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split(',').collect();
        let field = |i: usize| fields.get(i).copied().ok_or("a short row");
        points.push(RttPoint {
            peers: field(peers)?.parse()?,
            rtt_us: field(median)?.parse()?,
        });
    }
    Ok(fit_lop(&points)?)
}

fn run_one(
    mode: Mode,
    nodes: usize,
    costs: &nicbar_sim::cost::CostParams,
    lop: &LopFit,
    measured: Option<&LopFit>,
    jobs: u64,
) -> Result<Row> {
    let pick = |pair: nicbar_sim::cost::sweep::Pair| match mode {
        Mode::Nic => pair.nic.latency,
        Mode::Host => pair.host.latency,
    };
    let report = run_size(nodes, costs, SchedulePolicy::Auto, jobs as usize)?;
    let (gb_dimension, gb) = match mode {
        Mode::Nic => report.gather_broadcast.best_nic(),
        Mode::Host => report.gather_broadcast.best_host(),
    };
    let latency_at = |n: usize| -> Result<f64> {
        if let Some((_, pair)) = report.dissemination.iter().find(|(ways, _)| *ways == n) {
            return Ok(pick(*pair));
        }
        let (pair, _) = run_algorithm(
            Algorithm::Dissemination { n },
            nodes,
            costs,
            SchedulePolicy::Auto,
        )?;
        Ok(pick(pair))
    };
    let (tuned_n, predicted) = lop.best_dissemination(nodes).unwrap_or((1, f64::NAN));
    let measured = match measured.and_then(|fit| fit.best_dissemination(nodes)) {
        Some((n, _)) => Some((n, latency_at(n)?)),
        None => None,
    };
    Ok(Row {
        mode,
        nodes,
        pairwise: pick(report.pairwise),
        gather_broadcast: (gb_dimension, gb.latency),
        one: latency_at(1)?,
        tuned: (tuned_n, latency_at(tuned_n)?, predicted),
        measured,
    })
}

fn print_table(mode: Mode, rows: &[Row], measured: bool) {
    println!(
        "{:>6} {:>9} {:>14} {:>9} {:>16} {:>10} {:>8}{}",
        "nodes",
        "PE",
        "GB best (d)",
        "D n=1",
        "D tuned (n)",
        "predicted",
        "n=1/tun",
        if measured {
            "   D measured-tuned (n)"
        } else {
            ""
        }
    );
    let mut wins = 0;
    let mut losses = 0;
    let mut ties = 0;
    for row in rows.iter().filter(|r| r.mode == mode) {
        let (n, latency, predicted) = row.tuned;
        let ratio = row.one / latency;
        if n > 1 {
            if latency < row.one * 0.999 {
                wins += 1;
            } else if latency > row.one * 1.001 {
                losses += 1;
            } else {
                ties += 1;
            }
        }
        let mut line = format!(
            "{:>6} {:>9.1} {:>14} {:>9.1} {:>16} {:>10.1} {:>7.2}x",
            row.nodes,
            row.pairwise,
            format!("{:.1} ({})", row.gather_broadcast.1, row.gather_broadcast.0),
            row.one,
            format!("{latency:.1} ({n})"),
            predicted,
            ratio
        );
        if let Some((n, latency)) = row.measured {
            let _ = write!(line, " {:>22}", format!("{latency:.1} ({n})"));
        }
        println!("{line}");
    }
    println!(
        "{mode}: where the fit chose n > 1, the tuned n beat n = 1 at {wins} sizes, lost at \
         {losses}, tied at {ties}."
    );
}

fn csv(rows: &[Row]) -> String {
    let mut out = String::from(
        "mode,nodes,pe_us,gb_best_us,gb_best_d,diss_n1_us,tuned_n,diss_tuned_us,predicted_tuned_us,\
         measured_tuned_n,diss_measured_tuned_us\n",
    );
    for row in rows {
        let mode = match row.mode {
            Mode::Nic => "nic",
            Mode::Host => "host",
        };
        let (measured_n, measured_us) = row
            .measured
            .map_or((String::new(), String::new()), |(n, us)| {
                (n.to_string(), format!("{us:.6}"))
            });
        let _ = writeln!(
            out,
            "{mode},{},{:.6},{:.6},{},{:.6},{},{:.6},{:.6},{measured_n},{measured_us}",
            row.nodes,
            row.pairwise,
            row.gather_broadcast.1,
            row.gather_broadcast.0,
            row.one,
            row.tuned.0,
            row.tuned.1,
            row.tuned.2,
        );
    }
    out
}
