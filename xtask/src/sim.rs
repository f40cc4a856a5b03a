//! `cargo xtask sim barrier`: the barrier cost model against the paper, then beyond it.
//!
//! Runs `nicbar_sim::cost`: every rank's compiled barrier schedule in virtual time, NIC-based
//! (equation 2) and host-based (equation 1), with costs fitted to the paper's LANai figures. It
//! prints the fit (which figures it used, which it did not), the model beside the paper at 2, 4,
//! 8 and 16 nodes with relative errors, the paper's qualitative statements checked, how the
//! 16-node predictions move with the one unfitted cost, and then the curves extended to 65,536
//! nodes (pairwise exchange, gather-broadcast at its best dimension, dissemination n = 1..4), with
//! the simulator's own wall time and peak memory at the largest size. The extension goes to a CSV.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use clap::{Args as ClapArgs, Subcommand, ValueEnum};
use nicbar_sim::cost::figures;
use nicbar_sim::cost::paper::{self, Card, ComparisonRow, Role};
use nicbar_sim::cost::params::{CostParams, Fit, FitAssumptions, fit};
use nicbar_sim::cost::schedules::{COMPILED_UP_TO, MAX_NODES, SchedulePolicy};
use nicbar_sim::cost::sweep::{
    DISSEMINATION_WAYS, MAX_GATHER_BROADCAST_DIMENSION, SizeReport, run_size,
};

use crate::{Result, workspace_root};

mod tune;

/// Options of `cargo xtask sim`.
#[derive(ClapArgs)]
pub(crate) struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Barrier latency from the cost model: the fit to the paper's LANai figures, the model
    /// beside the paper at 2-16 nodes, and the curves extended to 65,536 nodes.
    ///
    /// The costs (µs) are the terms of the paper's equations 1-2: Send (host posts a token),
    /// SDMA (NIC pulls a message), Network (transmit start to receive start), Recv (NIC takes a
    /// packet), RDMA (NIC pushes to the host), HRecv (host takes a message or notice), plus Step
    /// (the NIC's work per sending step of a schedule) and Xmit (a packet on the transmit
    /// channel), and the busy share (the part of Recv, SDMA and RDMA that holds the NIC
    /// processor). `--params` picks the fitted LANai 4.3 or 7.2 costs for the extension; any
    /// `--<cost>-us` or `--busy-share` flag overrides one of them; `--params custom` starts from
    /// none and needs all eight costs. The comparison with the paper always uses the fitted costs.
    Barrier(BarrierArgs),
    /// The self-tuning of n-way dissemination of Hoefler et al. (*Fast Barrier Synchronization
    /// for InfiniBand*) in the cost model, to 65,536 nodes: the model's own 1:P ping-pong, its
    /// LoP fit, and dissemination at the n the fit predicts best
    /// beside n = 1, pairwise exchange and gather-broadcast; `--rttp` adds the n a measured
    /// RTT(P) (`cargo xtask bench rttp`) predicts.
    Tune(tune::TuneArgs),
}

/// Which costs the extension runs with.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Preset {
    /// Fitted to the paper, LANai 4.3 (33 MHz).
    Lanai43,
    /// Fitted to the paper, LANai 7.2 (66 MHz).
    Lanai72,
    /// Only what the --<cost>-us flags give (all eight required).
    Custom,
}

/// Where the schedules come from.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Schedules {
    /// `compile` for every rank up to 4096 ranks, the compilers' formulas (checked against
    /// `compile` at sampled ranks) above.
    Auto,
    /// `compile` for every rank at every size (O(N²): minutes at 65,536).
    Compiled,
    /// The checked formulas at every size.
    Formula,
}

#[derive(ClapArgs)]
struct BarrierArgs {
    /// Extend the curves up to this many nodes (powers of two, and a few sizes between).
    #[arg(long, default_value_t = MAX_NODES as u64, value_parser = clap::value_parser!(u64).range(2..=MAX_NODES as u64))]
    max_nodes: u64,
    /// The CSV of the extension [default: target/sim-barrier.csv in the workspace].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The costs of the extension.
    #[arg(long, value_enum, default_value = "lanai43")]
    params: Preset,
    /// Override Send, µs.
    #[arg(long)]
    send_us: Option<f64>,
    /// Override SDMA, µs.
    #[arg(long)]
    sdma_us: Option<f64>,
    /// Override Network, µs.
    #[arg(long)]
    network_us: Option<f64>,
    /// Override Recv, µs.
    #[arg(long)]
    recv_us: Option<f64>,
    /// Override RDMA, µs.
    #[arg(long)]
    rdma_us: Option<f64>,
    /// Override HRecv, µs.
    #[arg(long)]
    hrecv_us: Option<f64>,
    /// Override Step (the NIC's work per sending step), µs.
    #[arg(long)]
    step_us: Option<f64>,
    /// Override Xmit (a packet on the transmit channel), µs.
    #[arg(long)]
    xmit_us: Option<f64>,
    /// Override the busy share: the part of Recv, SDMA and RDMA that holds the NIC processor,
    /// 0..=1 (the fitted presets take 1).
    #[arg(long)]
    busy_share: Option<f64>,
    /// Where the schedules come from.
    #[arg(long, value_enum, default_value = "auto")]
    schedules: Schedules,
    /// Worker threads (runs at one size are spread over them; results do not depend on it).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    jobs: u64,
}

/// Runs `cargo xtask sim <what>`.
pub(crate) fn run(args: Args) -> Result<()> {
    match args.what {
        What::Barrier(args) => barrier(args),
        What::Tune(args) => tune::run_tune(args),
    }
}

/// Sizes not a power of two that the extension also runs.
const BETWEEN_SIZES: [usize; 9] = [3, 6, 12, 24, 48, 100, 1000, 10_000, 50_000];

fn barrier(args: BarrierArgs) -> Result<()> {
    let started = Instant::now();
    let policy = match args.schedules {
        Schedules::Auto => SchedulePolicy::Auto,
        Schedules::Compiled => SchedulePolicy::Compiled,
        Schedules::Formula => SchedulePolicy::Formula,
    };
    let fit = fit(FitAssumptions::default())?;
    let (params, label) = extension_params(&args, &fit)?;

    print_model(&fit);
    print_comparison(&fit, policy)?;
    print_sensitivity(policy)?;

    let sizes = extension_sizes(args.max_nodes as usize);
    let largest = sizes.last().copied().unwrap_or(2);
    println!(
        "\n== extension: {label}, {} sizes up to {largest} nodes ==",
        sizes.len()
    );
    println!("{}", describe_params(&params));
    let mut reports = Vec::new();
    let mut largest_run = None;
    let mut peak_reset = false;
    for &nodes in &sizes {
        let is_largest = nodes == largest;
        if is_largest {
            // Start the peak-memory count afresh so that it is this size's (Linux: writing 5 to
            // clear_refs resets VmHWM to the current resident set).
            peak_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        }
        if nodes >= 4096 {
            eprintln!("  {nodes} nodes: running ...");
        }
        let size_started = Instant::now();
        let report = run_size(nodes, &params, policy, args.jobs as usize)?;
        let wall = size_started.elapsed();
        eprintln!(
            "  {nodes} nodes: {} runs, {:.1} M events, {:.2} s{}",
            2 * (1 + report.gather_broadcast.results.len() + report.dissemination.len()),
            report.events as f64 / 1e6,
            wall.as_secs_f64(),
            if report.compiled {
                String::from(", schedules compiled")
            } else {
                format!(
                    ", schedules from formulas checked against compile at {} ranks",
                    report.checked_ranks
                )
            }
        );
        if is_largest {
            largest_run = Some((wall, report.events, memory_status(peak_reset)));
        }
        reports.push(report);
    }
    print_extension(&reports);

    let out = args
        .out
        .unwrap_or_else(|| crate::target_dir().join("sim-barrier.csv"));
    let out = if out.is_absolute() {
        out
    } else {
        workspace_root().join(out)
    };
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|error| format!("creating {}: {error}", parent.display()))?;
    }
    std::fs::write(&out, csv(&reports, &label))
        .map_err(|error| format!("writing {}: {error}", out.display()))?;

    if let Some((wall, events, memory)) = largest_run {
        println!("\n== the simulator itself at {largest} nodes ==");
        println!(
            "wall time {:.2} s for {} runs ({} NIC-based + host-based barriers), {:.1} M events, \
             {} worker threads",
            wall.as_secs_f64(),
            reports.last().map_or(0, |r| 2
                * (1 + r.gather_broadcast.results.len() + r.dissemination.len())),
            reports.last().map_or(0, |r| 1
                + r.gather_broadcast.results.len()
                + r.dissemination.len()),
            events as f64 / 1e6,
            args.jobs
        );
        println!("peak memory {memory}");
    }
    println!(
        "\nwrote {} ({} rows); total wall time {:.2} s",
        out.display(),
        csv_rows(&reports),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The costs of the extension, and how to call them.
fn extension_params(args: &BarrierArgs, fit: &Fit) -> Result<(CostParams, String)> {
    let overrides = [
        ("--send-us", args.send_us),
        ("--sdma-us", args.sdma_us),
        ("--network-us", args.network_us),
        ("--recv-us", args.recv_us),
        ("--rdma-us", args.rdma_us),
        ("--hrecv-us", args.hrecv_us),
        ("--step-us", args.step_us),
        ("--xmit-us", args.xmit_us),
    ];
    let (mut params, name) = match args.params {
        Preset::Lanai43 => (fit.lanai43, "LANai 4.3 (fitted)"),
        Preset::Lanai72 => (fit.lanai72, "LANai 7.2 (fitted)"),
        Preset::Custom => {
            let missing: Vec<&str> = overrides
                .iter()
                .filter(|(_, value)| value.is_none())
                .map(|(flag, _)| *flag)
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "--params custom needs every cost; missing {}",
                    missing.join(", ")
                )
                .into());
            }
            (CostParams::ZERO, "custom")
        }
    };
    let fields = [
        &mut params.send,
        &mut params.sdma,
        &mut params.network,
        &mut params.recv,
        &mut params.rdma,
        &mut params.hrecv,
        &mut params.step,
        &mut params.xmit,
    ];
    let mut changed = Vec::new();
    for (field, (flag, value)) in fields.into_iter().zip(overrides) {
        if let Some(value) = value {
            *field = value;
            changed.push(flag);
        }
    }
    if let Some(share) = args.busy_share {
        params.busy_share = share;
        changed.push("--busy-share");
    }
    params.check()?;
    let label = if changed.is_empty() || args.params == Preset::Custom {
        name.to_string()
    } else {
        format!("{name} with {} overridden", changed.join(", "))
    };
    Ok((params, label))
}

fn describe_params(params: &CostParams) -> String {
    let mut line = String::from("costs (µs):");
    for (name, value) in params.named() {
        let _ = write!(line, " {name} {value:.3}");
    }
    let _ = write!(line, "; busy share {}", params.busy_share);
    line
}

fn print_model(fit: &Fit) {
    println!("== the model ==");
    println!(
        "Every rank runs its compiled schedule (the steps the NIC runs) in virtual time; all enter at 0,
the latency is when the last leaves. Per node three serial servers: the host processor (Send,
HRecv), the NIC processor (Recv per packet, SDMA, RDMA, Step per sending step: one LANai runs
all four state machines and the one host-DMA engine), and the transmit channel (Xmit per packet;
reception is a separate channel, paper §2.2). A packet arrives Network after its transmission
starts. NIC-based: the host pays Send once, the NIC runs the steps back to back, then RDMA, then
the host HRecv (equation 2, plus Step). Host-based: the host runs the same steps; each send costs
it Send and the NIC SDMA (consecutive sends pipeline through the NIC), each receive waits for
Recv+RDMA at the NIC and costs the host HRecv as it arrives (equation 1). The busy share is
the part of Recv, SDMA and RDMA that holds the NIC processor; the rest (packet interface, DMA)
is delay only. The fitted presets take 1: all of it."
    );
    println!("\n== the fit ==");
    println!(
        "Figure 5's curves are not legible in the project's copy of the paper, so its two-node
points cannot be read. Fitted to the three figures the text states that are not the 16-node ones:
  LANai 7.2, 8 nodes, PE: NIC-based {} µs, host-based {} µs (§6)
  LANai 4.3, 8 nodes, PE: factor {} (§6)
Never fitted, predicted below: LANai 4.3, 16 nodes: PE {} µs and {}x, GB {} µs and {}x.
Ties: Send = HRecv = h (host, same on both cards); SDMA = Recv = RDMA = o and Step = t (NIC,
x{} on the LANai 4.3 for its 33 MHz against 66 MHz). Not fitted: Network {} µs (cut-through
switch, 'small' in §2.2), Xmit {:.2} µs (40 bytes at 1.28 Gbit/s).
Busy share 1 (not fitted: no usable figure depends on it).
Solved exactly: h = {:.3} µs, o = {:.3} µs and t = {:.3} µs on the LANai 7.2.",
        figures::LANAI72_PE8_NIC_US,
        figures::LANAI72_PE8_HOST_US,
        figures::LANAI43_PE8_FACTOR,
        figures::LANAI43_PE16_NIC_US,
        figures::LANAI43_PE16_FACTOR,
        figures::LANAI43_GB16_NIC_US,
        figures::LANAI43_GB16_FACTOR,
        fit.assumptions.clock_ratio,
        fit.assumptions.network,
        fit.assumptions.xmit,
        fit.host_call,
        fit.nic_pass_lanai72,
        fit.step_lanai72,
    );
    println!("{:>10} {}", "LANai 4.3", describe_params(&fit.lanai43));
    println!("{:>10} {}", "LANai 7.2", describe_params(&fit.lanai72));
}

/// `value` with its paper counterpart and the relative error, or a dash.
fn paper_cell(model: f64, paper: Option<paper::PaperValue>, decimals: usize) -> String {
    match paper {
        None => format!("{model:>8.decimals$} {:>8} {:>7}", "-", ""),
        Some(value) => {
            let error = paper::relative_error(model, value.value) * 100.0;
            let mark = match (value.role, value.derived) {
                (Role::Fitted, _) => "f",
                (Role::Predicted, true) => "d",
                (Role::Predicted, false) => "",
            };
            format!(
                "{model:>8.decimals$} {:>8} {:>+6.1}%",
                format!("{:.decimals$}{mark}", value.value),
                error
            )
        }
    }
}

fn print_comparison(fit: &Fit, policy: SchedulePolicy) -> Result<()> {
    let rows = paper::compare(fit, policy)?;
    println!("\n== the model beside the paper ==");
    println!(
        "model | paper | relative error. Paper values: f = fitted to, d = derived (NIC-based x factor), \
         plain = stated and predicted; - = not stated in the text."
    );
    println!(
        "{:<9} {:>5} {:<2} {:>8} {:>8} {:>7}  {:>8} {:>8} {:>7}  {:>8} {:>8} {:>7}  GB dims NIC/host",
        "card",
        "nodes",
        "",
        "NIC µs",
        "paper",
        "err",
        "host µs",
        "paper",
        "err",
        "factor",
        "paper",
        "err",
    );
    for row in &rows {
        print_comparison_row(row);
    }
    let mut scored = Vec::new();
    for row in &rows {
        for (what, model, paper) in ["NIC", "host", "factor"]
            .into_iter()
            .zip(row.model())
            .zip(row.paper)
            .map(|((what, model), paper)| (what, model, paper))
        {
            if let Some(paper) = paper.filter(|paper| paper.role == Role::Predicted) {
                scored.push(format!(
                    "{} {} {what} {:+.1}%",
                    row.nodes,
                    row.family,
                    paper::relative_error(model, paper.value) * 100.0
                ));
            }
        }
    }
    println!("Predicted, never fitted: {}.", scored.join(", "));
    println!("\nThe paper's statements about its measurements, checked on the model:");
    for check in paper::checks(&rows) {
        println!(
            "  [{}] {}\n        {}",
            if check.holds { "agrees" } else { "DISAGREES" },
            check.statement,
            check.detail
        );
    }
    Ok(())
}

fn print_comparison_row(row: &ComparisonRow) {
    let [nic, host, factor] = row.model();
    let [paper_nic, paper_host, paper_factor] = row.paper;
    let dims = row
        .dimensions
        .map(|(nic, host)| format!("{nic}/{host}"))
        .unwrap_or_default();
    let card = match row.card {
        Card::Lanai43 => "LANai 4.3",
        Card::Lanai72 => "LANai 7.2",
    };
    println!(
        "{card:<9} {:>5} {:<2} {}  {}  {}  {dims}",
        row.nodes,
        row.family.to_string(),
        paper_cell(nic, paper_nic, 2),
        paper_cell(host, paper_host, 2),
        paper_cell(factor, paper_factor, 3),
    );
}

fn print_sensitivity(policy: SchedulePolicy) -> Result<()> {
    println!("\n== what the 16-node LANai 4.3 predictions rest on (neither value is fitted) ==");
    println!(
        "Network: refitted under each value. Busy share: the part of Recv, SDMA and RDMA that holds
the NIC processor (the rest is packet-interface and DMA time). Pairwise exchange never queues, so
no fitted figure depends on the busy share; it only moves the fan-in and fan-out of GB."
    );
    println!(
        "{:>10} {:>6} {:>7} {:>7} {:>7}  {:>9} {:>7}  {:>9} {:>9} {:>7}",
        "Network", "busy", "h", "o 4.3", "t 4.3", "PE NIC", "factor", "GB NIC", "GB host", "factor"
    );
    let mut variants: Vec<(f64, f64)> = [0.25, 0.5, 1.0, 2.0, 4.0]
        .into_iter()
        .map(|network| (network, 1.0))
        .collect();
    variants.extend([0.75, 0.5, 0.25].map(|share| (1.0, share)));
    for row in paper::sensitivity(&variants, policy)? {
        let (gb_nic, gb_host) = row.gather_broadcast;
        println!(
            "{:>10.2} {:>6.2} {:>7.3} {:>7.3} {:>7.3}  {:>9.2} {:>7.3}  {:>9.2} {:>9.2} {:>7.3}",
            row.network,
            row.busy_share,
            row.fit.host_call,
            row.fit.lanai43.recv,
            row.fit.lanai43.step,
            row.pairwise.nic.latency,
            row.pairwise.factor(),
            gb_nic,
            gb_host,
            gb_host / gb_nic
        );
    }
    println!(
        "{:>10} {:>6} {:>7} {:>7} {:>7}  {:>9.2} {:>7.3}  {:>9.2} {:>9.2} {:>7.3}",
        "paper",
        "",
        "",
        "",
        "",
        figures::LANAI43_PE16_NIC_US,
        figures::LANAI43_PE16_FACTOR,
        figures::LANAI43_GB16_NIC_US,
        figures::LANAI43_GB16_NIC_US * figures::LANAI43_GB16_FACTOR,
        figures::LANAI43_GB16_FACTOR
    );
    Ok(())
}

/// Powers of two from 2 to `max_nodes`, the sizes of [`BETWEEN_SIZES`] below it, and `max_nodes`.
fn extension_sizes(max_nodes: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = (1..=16)
        .map(|log| 1usize << log)
        .chain(BETWEEN_SIZES)
        .chain([max_nodes])
        .filter(|&nodes| (2..=max_nodes).contains(&nodes))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

fn print_extension(reports: &[SizeReport]) {
    println!(
        "\nGB: root 0, the best of every dimension 1..N-1 up to 64 nodes, of {{1, 2, 3, 4, 6, 8, 12, \
         16, 24, 32, 48, 63}} above; the NIC holds 128 steps a schedule and a GB node has 2d+2, so \
         d <= {MAX_GATHER_BROADCAST_DIMENSION}. Dissemination: n = {:?}. Schedules: compile for every \
         rank up to {COMPILED_UP_TO} nodes, checked formulas above.",
        DISSEMINATION_WAYS
    );
    for (title, pick) in [
        ("NIC-based latency, µs", 0usize),
        ("host-based latency, µs", 1),
        ("factor of improvement (host-based / NIC-based)", 2),
    ] {
        println!("\n{title}");
        let mut header = format!("{:>6} {:>10} {:>14}", "nodes", "PE", "GB (d)");
        for n in DISSEMINATION_WAYS {
            let _ = write!(header, " {:>10}", format!("D n={n}"));
        }
        println!("{header}");
        for report in reports {
            let gb = &report.gather_broadcast;
            let ((nic_d, nic), (host_d, host)) = (gb.best_nic(), gb.best_host());
            let (pe, gb_cell) = match pick {
                0 => (
                    format!("{:.1}", report.pairwise.nic.latency),
                    format!("{:.1} ({nic_d})", nic.latency),
                ),
                1 => (
                    format!("{:.1}", report.pairwise.host.latency),
                    format!("{:.1} ({host_d})", host.latency),
                ),
                _ => (
                    format!("{:.3}", report.pairwise.factor()),
                    format!("{:.3}", host.latency / nic.latency),
                ),
            };
            let mut line = format!("{:>6} {pe:>10} {gb_cell:>14}", report.nodes);
            for n in DISSEMINATION_WAYS {
                let cell = report
                    .dissemination
                    .iter()
                    .find(|(ways, _)| *ways == n)
                    .map(|(_, pair)| match pick {
                        0 => format!("{:.1}", pair.nic.latency),
                        1 => format!("{:.1}", pair.host.latency),
                        _ => format!("{:.3}", pair.factor()),
                    })
                    .unwrap_or_else(|| "-".into());
                let _ = write!(line, " {cell:>10}");
            }
            println!("{line}");
        }
    }
}

const CSV_HEADER: &str = "costs,nodes,algorithm,parameter,nic_us,host_us,factor,nic_packets,\
host_packets,nic_events,host_events,schedules\n";

fn csv(reports: &[SizeReport], label: &str) -> String {
    let mut out = String::from(CSV_HEADER);
    for report in reports {
        let source = if report.compiled {
            "compiled"
        } else {
            "formulas"
        };
        let mut row = |algorithm: &str, parameter: String, pair: &nicbar_sim::cost::sweep::Pair| {
            let _ = writeln!(
                out,
                "{label},{},{algorithm},{parameter},{:.6},{:.6},{:.6},{},{},{},{},{source}",
                report.nodes,
                pair.nic.latency,
                pair.host.latency,
                pair.factor(),
                pair.nic.packets,
                pair.host.packets,
                pair.nic.events,
                pair.host.events,
            );
        };
        row("PE", String::new(), &report.pairwise);
        for (dimension, pair) in &report.gather_broadcast.results {
            row("GB", format!("d={dimension}"), pair);
        }
        for (n, pair) in &report.dissemination {
            row("dissemination", format!("n={n}"), pair);
        }
        let gb = &report.gather_broadcast;
        let ((nic_d, nic), (host_d, host)) = (gb.best_nic(), gb.best_host());
        let _ = writeln!(
            out,
            "{label},{},GB-best,d={nic_d}/{host_d},{:.6},{:.6},{:.6},{},{},{},{},{source}",
            report.nodes,
            nic.latency,
            host.latency,
            host.latency / nic.latency,
            nic.packets,
            host.packets,
            nic.events,
            host.events,
        );
    }
    out
}

fn csv_rows(reports: &[SizeReport]) -> usize {
    reports
        .iter()
        .map(|r| 2 + r.gather_broadcast.results.len() + r.dissemination.len())
        .sum()
}

/// `VmHWM` (peak resident set) and `VmRSS` from `/proc/self/status`; `reset` says whether the
/// peak was reset when the largest size began.
fn memory_status(reset: bool) -> String {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return "unknown (no /proc/self/status)".into();
    };
    let field = |name: &str| {
        status
            .lines()
            .find(|line| line.starts_with(name))
            .map(|line| line[name.len()..].trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    format!(
        "VmHWM {} (peak resident set {}), VmRSS {} now",
        field("VmHWM:"),
        if reset {
            "since the largest size began"
        } else {
            "of the whole process: the kernel refused to reset it"
        },
        field("VmRSS:")
    )
}
