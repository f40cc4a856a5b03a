//! One process of the quick start's cluster: `cargo xtask demo` starts a `nicctl emulate` daemon
//! with one NIC per process and runs this example once per rank.
//!
//! Every rank opens port 1 of the NIC whose unit number is its rank (node ids `0..N`, as
//! `nicctl emulate --units N` gives them), or, when its daemon runs fewer units (one daemon of one
//! unit per host), of unit rank modulo their number; its node id must be its rank. Then:
//!
//! 1. ranks 0 and 1 ping-pong 64-byte messages; rank 0 prints the one-way latency (half the round
//!    trip), p50;
//! 2. all ranks run barriers — in the NIC and on the host, with pairwise exchange,
//!    gather-broadcast (tree dimension 2, or 1 between two processes, where a node has at most one
//!    child) and dissemination (n = 1) — and rank 0 prints the mean and p50 latency of each, and
//!    the NIC/host ratio of the means.
//!
//! Latencies are measured at rank 0 over back-to-back barriers (each one timed from its entry to
//! its exit), as the paper's §6 did.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nicbar::{
    Algorithm, BarrierOptions, DmaBuffer, Event, Group, Member, NodeId, Port, PortId, Priority,
    Status, WaitMode,
};

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

const HELP: &str = "\
cluster: one process of the nicbar quick start (cargo xtask demo runs one per rank)

usage: cluster --rank R --nodes N [--socket PATH] [--barriers K] [--round-trips M] [--spin | --sleep]

  --rank R          this process's rank: it opens port 1 of NIC unit R (R modulo the
                    daemon's units if it runs fewer), whose node id must be R
  --nodes N         how many processes (and NICs) the cluster has
  --socket PATH     the daemon's control socket (default: $NICBAR_SOCKET, else the default path)
  --barriers K      barriers timed per algorithm and side (default 3000)
  --round-trips M   ping-pong round trips between ranks 0 and 1 (default 5000)
  --spin            wait for events spinning only
  --sleep           wait for events asleep on the doorbell at once
                    (default: spin 20 us, yielding the core, then sleep)
";

/// The port every rank opens.
const PORT: u8 = 1;
/// Size class of the ping-pong messages (up to 120 bytes).
const SIZE: u8 = 7;
/// Ping-pong message length.
const LENGTH: usize = 64;
/// Barrier timeout: generous, so a stalled cluster fails loudly instead of hanging.
const TIMEOUT: Duration = Duration::from_secs(30);

struct Options {
    rank: usize,
    nodes: usize,
    socket: Option<PathBuf>,
    barriers: usize,
    round_trips: usize,
    /// How the port waits for events.
    wait: WaitMode,
}

fn parse() -> Result<Option<Options>> {
    let mut options = Options {
        rank: usize::MAX,
        nodes: 0,
        socket: None,
        barriers: 3000,
        round_trips: 5000,
        wait: WaitMode::default(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--help" | "-h" => return Ok(None),
            "--rank" => options.rank = value("--rank")?.parse()?,
            "--nodes" => options.nodes = value("--nodes")?.parse()?,
            "--socket" => options.socket = Some(value("--socket")?.into()),
            "--barriers" => options.barriers = value("--barriers")?.parse()?,
            "--round-trips" => options.round_trips = value("--round-trips")?.parse()?,
            "--spin" => options.wait = WaitMode::Spin,
            "--sleep" => options.wait = WaitMode::Sleep,
            other => return Err(format!("unknown argument {other}; see --help").into()),
        }
    }
    if options.nodes < 2 || options.nodes > 256 {
        return Err("--nodes must be within 2..=256".into());
    }
    if options.rank >= options.nodes {
        return Err(format!("--rank must be within 0..{}", options.nodes).into());
    }
    if options.barriers == 0 || options.round_trips == 0 {
        return Err("--barriers and --round-trips must be at least 1".into());
    }
    Ok(Some(options))
}

fn main() -> std::process::ExitCode {
    let options = match parse() {
        Ok(Some(options)) => options,
        Ok(None) => {
            print!("{HELP}");
            return std::process::ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("cluster: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let rank = options.rank;
    match run(&options) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cluster: rank {rank}: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(options: &Options) -> Result {
    let rank = options.rank;
    let open = |unit: u8| match &options.socket {
        Some(socket) => Port::open_at(socket, unit, PORT),
        None => Port::open(unit, PORT),
    };
    // Unit `rank` of a daemon that runs one NIC per rank; with fewer units (one daemon of one
    // unit per host, across hosts), unit `rank` modulo the daemon's units.
    let mut unit = u8::try_from(rank)?;
    let mut opened = open(unit);
    if let Err(nicbar::Error::NoSuchUnit { units, .. }) = opened
        && units > 0
    {
        unit = u8::try_from(rank % usize::from(units))?;
        opened = open(unit);
    }
    let mut port =
        opened.map_err(|error| format!("cannot open port {PORT} of unit {unit}: {error}"))?;
    port.set_wait_mode(options.wait);
    if usize::from(port.node_id().get()) != rank {
        return Err(format!(
            "unit {unit} is {}, not node {rank}: start the daemon with \
             `nicctl emulate --units {}`, or across hosts give rank {rank}'s daemon \
             `--node {rank}` on the fabric map",
            port.node_id(),
            options.nodes
        )
        .into());
    }
    let world = Group::from_endpoints(
        (0..options.nodes).map(|node| (NodeId::new(node as u16), PortId(PORT))),
    )?
    .with_timeout(TIMEOUT);
    if rank < 2 {
        // The ping-pong's buffers are in place before the first message.
        for tag in 0..4 {
            let buffer = port.dma_alloc(128)?;
            port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
                .map_err(|e| e.error)?;
        }
    }
    // Everyone is here: a barrier waits for ports that are not open yet (paper §3.2).
    port.barrier(&world)?;

    if rank < 2 {
        let round_trip = ping_pong(&mut port, rank, options.round_trips)?;
        if rank == 0 {
            println!(
                "ping-pong, rank 0 <-> rank 1, {} round trips of {LENGTH} B: one-way latency \
                 p50 {} (round trip p50 {})",
                options.round_trips,
                micros(round_trip / 2),
                micros(round_trip)
            );
        }
    }
    port.barrier(&world)?;

    let dimension = tree_dimension(options.nodes);
    let algorithms = [
        ("pairwise exchange".to_owned(), Algorithm::PairwiseExchange),
        (
            format!("gather-broadcast, dimension {dimension}"),
            Algorithm::GatherBroadcast { dimension, root: 0 },
        ),
        (
            "dissemination, n = 1".to_owned(),
            Algorithm::Dissemination { n: 1 },
        ),
    ];
    let mut rows = Vec::new();
    for (name, algorithm) in algorithms {
        let options_for = world.options().with_algorithm(algorithm);
        let nic = time_barriers(&mut port, &world, &options_for, options.barriers, false)?;
        let host = time_barriers(&mut port, &world, &options_for, options.barriers, true)?;
        if rank == 0 {
            println!(
                "{name}: {} barriers each; NIC-based mean {}, host-based mean {}",
                options.barriers,
                micros(nic.0),
                micros(host.0)
            );
        }
        rows.push((name, nic, host));
    }
    if rank == 0 {
        println!();
        println!(
            "barrier latency among {} processes, measured at rank 0 ({} barriers per cell)",
            options.nodes, options.barriers
        );
        println!(
            "{:<30} {:>10} {:>10} {:>10} {:>10} {:>9}",
            "algorithm", "NIC mean", "NIC p50", "host mean", "host p50", "NIC/host"
        );
        for (name, nic, host) in &rows {
            println!(
                "{:<30} {:>10} {:>10} {:>10} {:>10} {:>9.2}",
                name,
                micros(nic.0),
                micros(nic.1),
                micros(host.0),
                micros(host.1),
                nic.0.as_secs_f64() / host.0.as_secs_f64()
            );
        }
        println!("(NIC/host below 1: the barrier in the NIC is the faster one)");
    }
    // The port closes in order as it drops: what it posted last still reaches the others.
    Ok(())
}

/// The gather-broadcast tree's dimension among `nodes` processes: 2, within the `1..=nodes - 1`
/// children a node can have.
fn tree_dimension(nodes: usize) -> usize {
    nodes.saturating_sub(1).clamp(1, 2)
}

fn micros(duration: Duration) -> String {
    format!("{:.1} us", duration.as_secs_f64() * 1e6)
}

/// Runs `count` barriers of `group` (after a tenth as many to warm up, and one NIC barrier to
/// start together), each timed from entry to exit; returns their mean and p50.
fn time_barriers(
    port: &mut Port,
    group: &Group,
    options: &BarrierOptions,
    count: usize,
    on_host: bool,
) -> Result<(Duration, Duration)> {
    let warm_up = count / 10;
    port.barrier(group)?;
    let mut times = Vec::with_capacity(count);
    for i in 0..warm_up + count {
        let started = Instant::now();
        if on_host {
            port.host_barrier(group, options)?;
        } else {
            port.barrier_with(group, options)?;
        }
        if i >= warm_up {
            times.push(started.elapsed());
        }
    }
    let mean = times.iter().sum::<Duration>() / count as u32;
    times.sort();
    Ok((mean, times[times.len() / 2]))
}

/// Ping-pong between ranks 0 and 1: rank 0 sends, rank 1 echoes. Returns rank 0's round-trip
/// p50 (rank 1's own figure means nothing).
fn ping_pong(port: &mut Port, rank: usize, round_trips: usize) -> Result<Duration> {
    let peer = Member::new(NodeId::new(1 - rank as u16), PortId(PORT));
    let send_tokens = port.send_tokens();
    let mut spare: Vec<DmaBuffer> = Vec::new();
    let warm_up = round_trips / 10;
    let mut times = Vec::with_capacity(round_trips);
    for i in 0..warm_up + round_trips {
        let started = Instant::now();
        if rank == 0 {
            send(port, &mut spare, peer)?;
            await_message(port, &mut spare)?;
        } else {
            await_message(port, &mut spare)?;
            send(port, &mut spare, peer)?;
        }
        if i >= warm_up {
            times.push(started.elapsed());
        }
    }
    // The last SENT events, before the barriers start.
    while port.send_tokens() < send_tokens {
        match port.receive_timeout(TIMEOUT)? {
            Some(Event::Sent { buffer, status, .. }) if status == Status::SUCCESS => {
                spare.push(buffer);
            }
            other => return Err(format!("unexpected {other:?}").into()),
        }
    }
    times.sort();
    Ok(times[times.len() / 2])
}

fn send(port: &mut Port, spare: &mut Vec<DmaBuffer>, to: Member) -> Result {
    let buffer = match spare.pop() {
        Some(buffer) => buffer,
        None => port.dma_alloc(128)?,
    };
    port.send(buffer, LENGTH, SIZE, Priority::LOW, to.node, to.port, 0)
        .map_err(|e| e.error)?;
    Ok(())
}

/// Waits for a message, provides its buffer again, and keeps the buffers SENT events return.
fn await_message(port: &mut Port, spare: &mut Vec<DmaBuffer>) -> Result {
    loop {
        match port.receive_timeout(TIMEOUT)? {
            Some(Event::Received { buffer, .. }) => {
                port.provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
                    .map_err(|e| e.error)?;
                return Ok(());
            }
            Some(Event::Sent { buffer, status, .. }) if status == Status::SUCCESS => {
                spare.push(buffer);
            }
            Some(other) => return Err(format!("unexpected {other:?}").into()),
            None => return Err(format!("no message within {TIMEOUT:?}").into()),
        }
    }
}
