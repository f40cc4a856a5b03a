//! The 1:P ping-pong of Hoefler et al., *Fast Barrier Synchronization for InfiniBand*, on the
//! emulated NIC: one process sends a one-byte message to `P` peers at once and waits for all `P`
//! replies; each peer answers the moment a message arrives. `RTT(P)` for `P = 1..=15`, then the
//! paper's LoP model fitted to the medians by least squares, and from the fit the n-way
//! dissemination `n` predicted best for each group size — written as a tuning file the library
//! reads (`nicbar::tuning`) when asked.
//!
//! `cargo xtask bench rttp` builds and runs it; `--help` lists the options. Every process is a
//! real process with its own port; the emulator runs in this process (one daemon, one unit per
//! process, the in-process wire), or as two daemons over UDP (`--udp`: the initiator on one,
//! the peers on the other). Bursts of every `P` are interleaved round by round, in an order
//! shuffled every round from a printed seed, so drift in the machine's load, and what one burst
//! leaves behind for the next, touch every `P` alike.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nicbar::tuning::Tuning;
use nicbar::{DmaBuffer, Event, NodeId, Port, PortId, Priority, Status, WaitMode};
use nicbar_emulator::fabric::FabricMap;
use nicbar_emulator::{Emulator, EmulatorConfig, FabricKey};
use nicbar_sim::cost::lop::{LopFit, RttPoint, fit_line, fit_lop};
use nicbar_system::{
    cores, cpu_model, free_udp_port, scratch_dir, shuffle, stop_all, wait_output, wait_with_timeout,
};
use rand_core::SeedableRng;
use rand_xoshiro::Xoshiro256StarStar;

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// A ping: one byte, as the paper's benchmark sends (it only notifies).
const PING: usize = 1;
/// The initiator's last message to each peer: stop.
const STOP: usize = 2;
/// Size class of the buffers (120 bytes at most).
const SIZE: u8 = 7;
/// The largest group size the tuning file covers (the cost model's largest).
const TUNED_UP_TO: usize = 65_536;

const HELP: &str = "\
bench_rttp: Hoefler et al.'s 1:P ping-pong RTT(P) on the emulated NIC, its LoP fit, and the
dissemination n the fit predicts best for each group size.

usage: bench_rttp [--max-peers P] [--round-trips N] [--csv FILE] [--write FILE] [--udp]
                  [--spin] [--seed S]

  --max-peers P     measure P = 1..=P peers (default 15, at most 63)
  --round-trips N   timed round trips per P (default 2000), after N/10 to warm up
  --csv FILE        write RTT(P) with both fits as CSV, and FILE's stem + -tuned.csv with
                    the predicted n per group size
  --write FILE      write the tuning file the library reads (see nicbar::tuning); an empty
                    FILE: where the library looks for it
  --udp             the initiator on one daemon, the peers on another, over UDP on loopback
  --spin            processes spin on their event rings instead of sleeping on doorbells
  --seed S          the seed of the order the P are measured in, shuffled every round
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

/// The round trips measured at one `P`, sorted, in µs.
struct Measured {
    peers: usize,
    rtt_us: Vec<f64>,
}

impl Measured {
    fn quantile(&self, q: f64) -> f64 {
        nicbar_system::quantile(&self.rtt_us, q)
    }
    fn mean(&self) -> f64 {
        nicbar_system::mean(&self.rtt_us)
    }
}

fn orchestrate(args: &[String]) -> Result {
    let mut max_peers = 15usize;
    let mut round_trips = 2000usize;
    let mut csv: Option<PathBuf> = None;
    let mut write: Option<PathBuf> = None;
    let mut udp = false;
    let mut wait = "sleep";
    let mut seed = 20_260_601u64;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--max-peers" => max_peers = rest.next().ok_or("--max-peers needs a value")?.parse()?,
            "--round-trips" => {
                round_trips = rest.next().ok_or("--round-trips needs a value")?.parse()?
            }
            "--csv" => csv = Some(rest.next().ok_or("--csv needs a file")?.into()),
            "--write" => write = Some(rest.next().ok_or("--write needs a file")?.into()),
            "--udp" => udp = true,
            "--spin" => wait = "spin",
            "--seed" => seed = rest.next().ok_or("--seed needs a value")?.parse()?,
            other => return Err(format!("unknown argument {other:?}; see --help").into()),
        }
    }
    if !(3..=63).contains(&max_peers) {
        return Err("--max-peers must be 3..=63 (the fit has three unknowns)".into());
    }
    if round_trips == 0 {
        return Err("--round-trips must be at least 1".into());
    }
    let dir = scratch_dir("bench-rttp")?;
    println!("machine: {} cores, {}", cores(), cpu_model());
    let wire = if udp {
        "two daemons over UDP on loopback (initiator on one, peers on the other)"
    } else {
        "one daemon, in-process wire"
    };
    println!(
        "1:P ping-pong of {PING}-byte messages, P = 1..={max_peers}, {round_trips} timed round \
         trips per P (in an order shuffled every round, seed {seed}); {} processes, {wire}; processes {}\n",
        max_peers + 1,
        if wait == "spin" {
            "spin on their event rings"
        } else {
            "sleep on their doorbells"
        }
    );

    let started = Instant::now();
    let report = if udp {
        run_udp(&dir, max_peers, round_trips, wait, seed)?
    } else {
        let socket = dir.join("rttp.sock");
        let emulator = Emulator::spawn(EmulatorConfig::in_process(&socket, max_peers as u16 + 1))?;
        let peers: Vec<(PathBuf, u8)> = (1..=max_peers)
            .map(|unit| (socket.clone(), unit as u8))
            .collect();
        let report = run_processes(&socket, 0, &peers, round_trips, wait, seed)?;
        drop(emulator);
        report
    };
    println!("measured in {:.1?}", started.elapsed());
    let _ = std::fs::remove_dir_all(&dir);

    let mut measured: Vec<Measured> = (1..=max_peers)
        .map(|peers| Measured {
            peers,
            rtt_us: Vec::new(),
        })
        .collect();
    for line in report.lines() {
        let mut fields = line.split_whitespace();
        let (Some(peers), Some(ns)) = (fields.next(), fields.next()) else {
            continue;
        };
        let peers: usize = peers.parse()?;
        let ns: f64 = ns.parse()?;
        measured
            .get_mut(peers - 1)
            .ok_or("a report line for a P not measured")?
            .rtt_us
            .push(ns / 1e3);
    }
    for m in &mut measured {
        if m.rtt_us.is_empty() {
            return Err(format!("no round trips reported for P = {}", m.peers).into());
        }
        m.rtt_us.sort_by(f64::total_cmp);
    }

    let points: Vec<RttPoint> = measured
        .iter()
        .map(|m| RttPoint {
            peers: m.peers,
            rtt_us: m.quantile(0.5),
        })
        .collect();
    let lop = fit_lop(&points)?;
    let line = fit_line(&points)?;
    print_measurements(&measured, &lop, &line);
    print_fit(&lop, &line);
    let choices = print_predictions(&lop);

    if let Some(path) = &csv {
        std::fs::write(path, rttp_csv(&measured, &lop, &line))?;
        let tuned = tuned_csv_path(path);
        std::fs::write(&tuned, tuned_csv(&lop))?;
        println!("\nwrote {} and {}", path.display(), tuned.display());
    }
    if let Some(path) = &write {
        // An empty name: where the library looks.
        let path = if path.as_os_str().is_empty() {
            &nicbar::tuning::tuning_path().ok_or(
                "no tuning path: NICBAR_TUNING is off and neither XDG_CONFIG_HOME nor HOME is set",
            )?
        } else {
            path
        };
        let tuning = Tuning::from_choices(&choices);
        let comment = format!(
            "The n-way dissemination n predicted best per group size, from Hoefler et al.'s LoP model\n\
             fitted to the 1:P ping-pong of `cargo xtask bench rttp` ({wire}, P = 1..={max_peers}):\n\
             t(P) = {:.3} + {:.3}·(P-1) + {:.4}·(P-1)² µs one way (residuals' RMS {:.3} µs);\n\
             a round of n costs RTT(n) - t(1).\n\
             n never exceeds the largest P measured.",
            lop.single_us,
            lop.gap_us,
            lop.congestion_us,
            lop.rms_us() / 2.0
        );
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, tuning.to_text(&comment))?;
        println!(
            "wrote the tuning file {} ({} ranges, group sizes 2..={TUNED_UP_TO})",
            path.display(),
            tuning.dissemination.len()
        );
    }
    Ok(())
}

/// Two daemons over UDP: node 0 (the initiator) on one, nodes `1..=max_peers` on the other.
fn run_udp(
    dir: &Path,
    max_peers: usize,
    round_trips: usize,
    wait: &str,
    seed: u64,
) -> Result<String> {
    let mut fabric = FabricMap::new();
    for node in 0..=max_peers {
        fabric.insert(
            NodeId::new(node as u16),
            format!("127.0.0.1:{}", free_udp_port("127.0.0.1")?).parse()?,
        );
    }
    let (s0, s1) = (dir.join("udp0.sock"), dir.join("udp1.sock"));
    let key = Some(FabricKey::new(nicbar_control::server::random_key()?));
    let peer_nodes: Vec<NodeId> = (1..=max_peers).map(|n| NodeId::new(n as u16)).collect();
    let mut c0 = EmulatorConfig::on_fabric(&s0, fabric.clone(), &[NodeId::new(0)])?;
    let mut c1 = EmulatorConfig::on_fabric(&s1, fabric, &peer_nodes)?;
    c0.nic.fabric_key = key;
    c1.nic.fabric_key = key;
    let e0 = Emulator::spawn(c0)?;
    let e1 = Emulator::spawn(c1)?;
    // On the peers' daemon, node k is unit k - 1.
    let peers: Vec<(PathBuf, u8)> = (0..max_peers)
        .map(|unit| (s1.clone(), unit as u8))
        .collect();
    let report = run_processes(&s0, 0, &peers, round_trips, wait, seed);
    drop((e0, e1));
    report
}

/// Starts the peers (`(socket, unit)` each; node `i + 1` is the `i`-th) and the initiator (unit
/// `unit` of the daemon at `socket`, node 0), and returns the initiator's report.
fn run_processes(
    socket: &Path,
    unit: u8,
    peers: &[(PathBuf, u8)],
    round_trips: usize,
    wait: &str,
    seed: u64,
) -> Result<String> {
    let exe = std::env::current_exe()?;
    let mut children: Vec<Child> = Vec::new();
    for (peer_socket, peer_unit) in peers {
        let spawned = Command::new(&exe)
            .arg("--child")
            .arg("peer")
            .arg(peer_socket)
            .args([&peer_unit.to_string(), wait])
            .stdout(Stdio::null())
            .spawn();
        match spawned {
            Ok(child) => children.push(child),
            Err(error) => {
                stop_all(&mut children);
                return Err(error.into());
            }
        }
    }
    let initiator = Command::new(&exe)
        .arg("--child")
        .arg("initiator")
        .arg(socket)
        .args([
            &unit.to_string(),
            &peers.len().to_string(),
            &round_trips.to_string(),
            wait,
            &seed.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn();
    let initiator = match initiator {
        Ok(child) => child,
        Err(error) => {
            stop_all(&mut children);
            return Err(error.into());
        }
    };
    let limit = Duration::from_secs(60 + (round_trips * peers.len()) as u64 / 20);
    let output = wait_output(initiator, limit);
    let mut failed = output.as_ref().err().map(ToString::to_string);
    for (index, child) in children.iter_mut().enumerate() {
        // The peers end at the initiator's stop message; one that did not is killed.
        if let Err(error) = wait_with_timeout(child, Duration::from_secs(30)) {
            failed.get_or_insert_with(|| format!("peer {}: {error}", index + 1));
        }
    }
    match failed {
        Some(why) => Err(why.into()),
        None => Ok(String::from_utf8(output?)?),
    }
}

fn child(args: &[String]) -> Result {
    let arg = |i: usize| {
        args.get(i)
            .map(String::as_str)
            .ok_or("missing child argument")
    };
    let wait_mode = |text: &str| {
        if text == "spin" {
            WaitMode::Spin
        } else {
            WaitMode::Sleep
        }
    };
    match arg(0)? {
        "peer" => peer(Path::new(arg(1)?), arg(2)?.parse()?, wait_mode(arg(3)?)),
        "initiator" => initiator(
            Path::new(arg(1)?),
            arg(2)?.parse()?,
            arg(3)?.parse()?,
            arg(4)?.parse()?,
            wait_mode(arg(5)?),
            arg(6)?.parse()?,
        ),
        other => Err(format!("unknown child role {other:?}").into()),
    }
}

/// Opens port 1 of `unit` with receive buffers provided and `mode` set.
fn open(socket: &Path, unit: u8, mode: WaitMode, buffers: u32) -> Result<Port> {
    let mut port = Port::open_at(socket, unit, 1)?;
    port.set_wait_mode(mode);
    for tag in 0..buffers {
        let buffer = port.dma_alloc(128)?;
        port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
            .map_err(|e| e.error)?;
    }
    Ok(port)
}

/// A peer: answers every ping from its sender at once, until the stop message.
fn peer(socket: &Path, unit: u8, mode: WaitMode) -> Result {
    let mut port = open(socket, unit, mode, 16)?;
    let mut spare: Vec<DmaBuffer> = Vec::new();
    loop {
        match port.blocking_receive()? {
            Event::Received {
                buffer,
                length,
                sender_node,
                ..
            } => {
                port.provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
                    .map_err(|e| e.error)?;
                if length == STOP {
                    break;
                }
                send(&mut port, &mut spare, sender_node, PING)?;
            }
            Event::Sent { buffer, status, .. } if status == Status::SUCCESS => spare.push(buffer),
            other => return Err(format!("peer: unexpected event {other:?}").into()),
        }
    }
    // Let the last reply complete before the port closes.
    while port.send_tokens() < 64 {
        match port.blocking_receive()? {
            Event::Sent { .. } => {}
            Event::Received { buffer, .. } => port
                .provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
                .map_err(|e| e.error)?,
            other => return Err(format!("peer: unexpected event {other:?}").into()),
        }
    }
    Ok(())
}

/// The initiator (node 0): reaches every peer once, then for each round and each `P` (in an order
/// shuffled every round from `seed`) sends a ping to peers `1..=P` back to back and waits for the `P`
/// replies; prints `P nanoseconds` per timed round trip.
fn initiator(
    socket: &Path,
    unit: u8,
    max_peers: usize,
    round_trips: usize,
    mode: WaitMode,
    seed: u64,
) -> Result {
    let mut port = open(socket, unit, mode, 64)?;
    let mut spare: Vec<DmaBuffer> = Vec::new();
    for node in 1..=max_peers {
        reach(&mut port, &mut spare, NodeId::new(node as u16))?;
    }
    let warm_up = round_trips / 10;
    let mut out = String::with_capacity(round_trips * max_peers * 12);
    let mut rng = Xoshiro256StarStar::seed_from_u64(seed);
    let mut order: Vec<usize> = (1..=max_peers).collect();
    for round in 0..warm_up + round_trips {
        // A fresh order every round (Fisher-Yates): whatever a burst leaves behind (its peers
        // waking again for their replies' completions) falls on a random next P, not always on
        // P + 1.
        shuffle(&mut order, &mut rng);
        for &peers in &order {
            let start = Instant::now();
            for node in 1..=peers {
                send(&mut port, &mut spare, NodeId::new(node as u16), PING)?;
            }
            let mut replies = 0;
            let mut completed = 0;
            while replies < peers {
                match port.blocking_receive()? {
                    Event::Received { buffer, .. } => {
                        port.provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
                            .map_err(|e| e.error)?;
                        replies += 1;
                    }
                    Event::Sent { buffer, status, .. } if status == Status::SUCCESS => {
                        spare.push(buffer);
                        completed += 1;
                    }
                    other => return Err(format!("initiator: unexpected event {other:?}").into()),
                }
            }
            let elapsed = start.elapsed();
            // Untimed: every send's completion, so the next burst starts from a quiet port.
            while completed < peers {
                match port.blocking_receive()? {
                    Event::Sent { buffer, status, .. } if status == Status::SUCCESS => {
                        spare.push(buffer);
                        completed += 1;
                    }
                    other => return Err(format!("initiator: unexpected event {other:?}").into()),
                }
            }
            if round >= warm_up {
                let _ = writeln!(out, "{peers} {}", elapsed.as_nanos());
            }
        }
    }
    for node in 1..=max_peers {
        send(&mut port, &mut spare, NodeId::new(node as u16), STOP)?;
    }
    while port.send_tokens() < 64 {
        match port.blocking_receive()? {
            Event::Sent { status, .. } if status == Status::SUCCESS => {}
            other => return Err(format!("initiator: unexpected event {other:?}").into()),
        }
    }
    print!("{out}");
    Ok(())
}

/// Pings `to` until the ping is delivered — again after each TARGET_PORT_CLOSED while the peer
/// opens its port, for 30 s at most — and waits for its answer.
fn reach(port: &mut Port, spare: &mut Vec<DmaBuffer>, to: NodeId) -> Result {
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut answered = false;
    let mut delivered = false;
    while !delivered {
        send(port, spare, to, PING)?;
        loop {
            match port.blocking_receive()? {
                Event::Received { buffer, .. } => {
                    port.provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
                        .map_err(|e| e.error)?;
                    answered = true;
                }
                Event::Sent { buffer, status, .. } => {
                    spare.push(buffer);
                    if status == Status::SUCCESS {
                        delivered = true;
                        break;
                    }
                    if status != Status::TARGET_PORT_CLOSED || Instant::now() > give_up {
                        return Err(format!("the first ping to {to:?} failed: {status:?}").into());
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
                other => return Err(format!("unexpected event {other:?}").into()),
            }
        }
    }
    while !answered {
        match port.blocking_receive()? {
            Event::Received { buffer, .. } => {
                port.provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
                    .map_err(|e| e.error)?;
                answered = true;
            }
            other => return Err(format!("unexpected event {other:?}").into()),
        }
    }
    Ok(())
}

fn send(port: &mut Port, spare: &mut Vec<DmaBuffer>, to: NodeId, length: usize) -> Result {
    let buffer = match spare.pop() {
        Some(buffer) => buffer,
        None => port.dma_alloc(128)?,
    };
    port.send(buffer, length, SIZE, Priority::LOW, to, PortId(1), 0)
        .map_err(|e| e.error)?;
    Ok(())
}

fn print_measurements(measured: &[Measured], lop: &LopFit, line: &LopFit) {
    println!(
        "\n{:>3} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10}",
        "P", "p10 µs", "median µs", "p90 µs", "mean µs", "LoP fit", "residual", "RTT/P", "line fit"
    );
    for (m, residual) in measured.iter().zip(&lop.residuals_us) {
        println!(
            "{:>3} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>+10.2} {:>9.2} {:>10.2}",
            m.peers,
            m.quantile(0.1),
            m.quantile(0.5),
            m.quantile(0.9),
            m.mean(),
            lop.rtt_us(m.peers),
            residual,
            m.quantile(0.5) / m.peers as f64,
            line.rtt_us(m.peers),
        );
    }
}

fn print_fit(lop: &LopFit, line: &LopFit) {
    println!(
        "\nLoP fit (least squares to the medians), one way t(P) = RTT(P)/2 = t1 + g·(P-1) + c·(P-1)²:"
    );
    println!(
        "  t1 = {:.3} µs (one message alone), g = {:.3} µs (each further message of a burst), \
         c = {:+.4} µs",
        lop.single_us, lop.gap_us, lop.congestion_us
    );
    println!(
        "  residuals of RTT: RMS {:.3} µs, largest {:+.3} µs; a further message costs {:.2} of a \
         lone one (g / t1)",
        lop.rms_us(),
        lop.max_residual_us(),
        lop.gap_us / lop.single_us
    );
    println!(
        "LogP's straight line (c = 0): t1 = {:.3} µs, g = {:.3} µs, residuals RMS {:.3} µs, \
         largest {:+.3} µs",
        line.single_us,
        line.gap_us,
        line.rms_us(),
        line.max_residual_us()
    );
}

/// The sizes the prediction table prints.
fn table_sizes() -> Vec<usize> {
    let mut sizes: Vec<usize> = (2..=16).collect();
    sizes.extend([24, 32, 64, 128, 256, 1024, 4096, 16_384, 65_536]);
    sizes
}

/// Prints the prediction at a few sizes; returns the best `n` for every size `2..=TUNED_UP_TO`.
fn print_predictions(lop: &LopFit) -> Vec<(usize, u32)> {
    println!(
        "\npredicted n-way dissemination latency, T(N, n) = sum over rounds of RTT(burst) - t(1) (µs):"
    );
    println!(
        "{:>6} {:>10} {:>10} {:>10} {:>10} {:>8} {:>10} {:>8}",
        "N", "n=1", "n=2", "n=3", "n=4", "best n", "best", "vs n=1"
    );
    for n in table_sizes() {
        let cell = |ways: usize| {
            lop.dissemination_us(n, ways)
                .map_or("-".to_string(), |us| format!("{us:.1}"))
        };
        if let Some((best, us)) = lop.best_dissemination(n) {
            let one = lop.dissemination_us(n, 1).unwrap_or(f64::NAN);
            println!(
                "{n:>6} {:>10} {:>10} {:>10} {:>10} {best:>8} {us:>10.1} {:>7.2}x",
                cell(1),
                cell(2),
                cell(3),
                cell(4),
                one / us
            );
        }
    }
    (2..=TUNED_UP_TO)
        .filter_map(|n| lop.best_dissemination(n).map(|(best, _)| (n, best as u32)))
        .collect()
}

fn rttp_csv(measured: &[Measured], lop: &LopFit, line: &LopFit) -> String {
    let mut text = String::from(
        "peers,p10_us,median_us,p90_us,mean_us,lop_fit_us,line_fit_us,residual_us,samples\n",
    );
    for (m, residual) in measured.iter().zip(&lop.residuals_us) {
        let _ = writeln!(
            text,
            "{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{}",
            m.peers,
            m.quantile(0.1),
            m.quantile(0.5),
            m.quantile(0.9),
            m.mean(),
            lop.rtt_us(m.peers),
            line.rtt_us(m.peers),
            residual,
            m.rtt_us.len()
        );
    }
    text
}

fn tuned_csv_path(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or_else(|| "bench-rttp".into(), |s| s.to_string_lossy().into_owned());
    path.with_file_name(format!("{stem}-tuned.csv"))
}

fn tuned_csv(lop: &LopFit) -> String {
    let mut text = String::from("processes,best_n,predicted_best_us,predicted_n1_us\n");
    for n in table_sizes() {
        if let (Some((best, us)), Some(one)) =
            (lop.best_dissemination(n), lop.dissemination_us(n, 1))
        {
            let _ = writeln!(text, "{n},{best},{us:.3},{one:.3}");
        }
    }
    text
}
