//! Put, get and atomic latency and bandwidth through the emulated NIC, from 8 B to 16 MiB, on the
//! in-process path (two units of one daemon) and over UDP between two daemons, beside two
//! references measured by the same program in the same run: `memcpy` inside one process, and a raw
//! UDP stream between the same two processes on loopback.
//!
//! `cargo xtask bench rdma` builds and runs it; `--help` lists the options. Two processes take
//! part: a target, which registers 16 MiB on a port of each path, allows remote access and runs
//! the raw UDP stream's receiver; and an initiator, which measures. The initiator interleaves the
//! measurements: every round takes one sample of every (path, operation, size) in an order
//! shuffled from the printed seed, so a slow moment of the machine spreads over all of them
//! instead of one; the tables report medians over the rounds.
//!
//! - latency: one operation alone, from posting it to its completion event (a put's means the
//!   data is in the target's memory);
//! - bandwidth: a burst of operations of that size, [`IN_FLIGHT`] outstanding at a time (the
//!   NIC's limit per node), bytes over the time from the first post to the last completion;
//! - `memcpy`: one copy of that many bytes between two buffers of the initiator;
//! - raw UDP stream: the burst's bytes sent in datagrams of at most one put segment's data to the
//!   target's socket, bytes that arrived over the time from the first send to the receiver's
//!   report. Each datagram is as long as the put's packet that carries as much data (header,
//!   one-sided header and authentication code included), and its data takes the copies a put's
//!   does outside the kernel: the sender copies it out of a source buffer into the datagram (the
//!   NIC reading the initiator's memory into its packet buffer), the receiver from its datagram
//!   into a destination buffer (the NIC writing the target's memory);
//! - the fabric's authentication code: what tagging and checking one full packet costs here.

use std::io::{BufRead, BufReader, Write};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nicbar::{AtomicOp, Event, MemoryRegion, NodeId, Port, PortId, Status, WaitMode};
use nicbar_emulator::fabric::FabricMap;
use nicbar_emulator::{Emulator, EmulatorConfig, FabricKey};
use nicbar_system::{
    cores, cpu_model, free_udp_port, median, scratch_dir, set_receive_buffer, shuffle,
    wait_with_timeout,
};
use rand_core::SeedableRng;
use rand_xoshiro::Xoshiro256StarStar;
use shared_abi::packet::{MAX_PACKET_LEN, MAX_WIRE_LEN};
use shared_abi::rdma::RDMA_SEGMENT;

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// The largest operation, and the bytes each side registers per path.
const REGION: usize = 16 << 20;
/// The sizes measured: 8 B, then 64 B to 16 MiB by fours (1 MiB among them).
const SIZES: [usize; 11] = [
    8,
    64,
    256,
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
];
/// Operations a bandwidth burst keeps outstanding: the NIC's limit toward one node
/// (`firmware::RDMA_OPS`).
const IN_FLIGHT: usize = 8;
/// The target's node on both paths: unit 1 of the in-process daemon, node 1 of the UDP fabric.
const TARGET_NODE: NodeId = NodeId::new(1);
/// Bytes a bandwidth burst moves at least (fewer operations of the largest sizes), and at most
/// this many operations of the smallest.
const BURST_BYTES: usize = 8 << 20;
const BURST_OPERATIONS: usize = 1000;
/// Latency samples per round aim at this many bytes (more samples of the small sizes).
const LATENCY_BYTES: usize = 256 << 10;
const LATENCY_SAMPLES: usize = 20;
/// One operation's longest wait before the benchmark gives up.
const OPERATION_LIMIT: Duration = Duration::from_secs(60);

const HELP: &str = "\
bench_rdma: put and get latency and bandwidth (8 B to 16 MiB) and atomic latency through the
emulated NIC, in-process and over UDP between two daemons, beside memcpy and a raw UDP stream,
interleaved in rounds; medians.

usage: bench_rdma [--rounds N] [--csv FILE] [--seed N] [--spin] [--no-auth]

  --rounds N   rounds of interleaved samples (default 5)
  --csv FILE   also write the medians as CSV
  --seed N     the seed of each round's order (default: from the clock; printed)
  --spin       processes spin on their event rings instead of sleeping on doorbells
  --no-auth    packets not authenticated (both paths), to see what the code costs
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

/// The medians of one series at one size.
struct Row {
    series: String,
    bytes: usize,
    latency_us: Option<f64>,
    bandwidth_mb_s: Option<f64>,
    samples: usize,
}

fn orchestrate(args: &[String]) -> Result {
    let mut rounds = 5usize;
    let mut csv: Option<PathBuf> = None;
    let mut seed: Option<u64> = None;
    let mut spin = false;
    let mut authenticate = true;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--rounds" => rounds = rest.next().ok_or("--rounds needs a value")?.parse()?,
            "--csv" => csv = Some(rest.next().ok_or("--csv needs a file")?.into()),
            "--seed" => seed = Some(rest.next().ok_or("--seed needs a value")?.parse()?),
            "--spin" => spin = true,
            "--no-auth" => authenticate = false,
            other => return Err(format!("unknown argument {other:?}; see --help").into()),
        }
    }
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let dir = scratch_dir("bench-rdma")?;
    println!("machine: {} cores, {}", cores(), cpu_model());
    mac_cost();
    println!(
        "{rounds} rounds, seed {seed}; processes {}; packets {}authenticated",
        if spin { "spin" } else { "sleep on doorbells" },
        if authenticate { "" } else { "not " }
    );

    // The in-process path: two units of one daemon.
    let local_socket = dir.join("local.sock");
    let mut local = EmulatorConfig::in_process(&local_socket, 2);
    local.authenticate = authenticate;
    let _local = Emulator::spawn(local)?;
    // UDP: two daemons of one node each, sharing a fabric key.
    let mut fabric = FabricMap::new();
    for node in 0..2 {
        fabric.insert(
            NodeId::new(node),
            format!("127.0.0.1:{}", free_udp_port("127.0.0.1")?).parse()?,
        );
    }
    let (udp0, udp1) = (dir.join("udp0.sock"), dir.join("udp1.sock"));
    let key = Some(FabricKey::new(nicbar_control::server::random_key()?));
    let mut c0 = EmulatorConfig::on_fabric(&udp0, fabric.clone(), &[NodeId::new(0)])?;
    let mut c1 = EmulatorConfig::on_fabric(&udp1, fabric, &[NodeId::new(1)])?;
    for config in [&mut c0, &mut c1] {
        config.nic.fabric_key = key;
        config.authenticate = authenticate;
    }
    let _udp0 = Emulator::spawn(c0)?;
    let _udp1 = Emulator::spawn(c1)?;

    let mode = if spin { "spin" } else { "sleep" };
    let exe = std::env::current_exe()?;
    let mut target = Command::new(&exe)
        .args(["--child", "target", mode])
        .arg(&local_socket)
        .arg(&udp1)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut target_in = target.stdin.take().ok_or("no stdin")?;
    let mut target_out = BufReader::new(target.stdout.take().ok_or("no stdout")?);
    let mut ready = String::new();
    target_out.read_line(&mut ready)?;
    let words: Vec<&str> = ready.split_whitespace().collect();
    let ["ready", local_key, udp_key, stream_port] = words.as_slice() else {
        let _ = target.kill();
        return Err(format!("the target said {ready:?}").into());
    };
    let initiator = Command::new(&exe)
        .args(["--child", "initiator", mode])
        .arg(&local_socket)
        .arg(&udp0)
        .args([
            *local_key,
            *udp_key,
            *stream_port,
            &rounds.to_string(),
            &seed.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()?;
    let output = initiator.wait_with_output();
    let _ = writeln!(target_in, "exit");
    drop(target_in);
    let target_done = wait_with_timeout(&mut target, Duration::from_secs(30));
    let output = output?;
    if !output.status.success() {
        return Err(format!("the initiator failed: {}", output.status).into());
    }
    target_done?;
    for (path, socket) in [
        ("in-process", &local_socket),
        ("UDP", &udp0),
        ("UDP", &udp1),
    ] {
        print_counters(path, socket);
    }

    // (series, bytes) -> latency samples (ns), bandwidth samples (bytes/s).
    let mut samples: Vec<(String, usize, Vec<f64>, Vec<f64>)> = Vec::new();
    for line in String::from_utf8(output.stdout)?.lines() {
        let words: Vec<&str> = line.split('\t').collect();
        let [series, metric, bytes, value] = words.as_slice() else {
            continue;
        };
        let (bytes, value): (usize, f64) = (bytes.parse()?, value.parse()?);
        let index = match samples
            .iter()
            .position(|(s, b, _, _)| s == series && *b == bytes)
        {
            Some(index) => index,
            None => {
                samples.push((series.to_string(), bytes, Vec::new(), Vec::new()));
                samples.len() - 1
            }
        };
        let entry = &mut samples[index];
        match *metric {
            "latency" => entry.2.push(value),
            _ => entry.3.push(value),
        }
    }
    samples.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    let rows: Vec<Row> = samples
        .iter_mut()
        .map(|(series, bytes, latency, bandwidth)| Row {
            series: series.clone(),
            bytes: *bytes,
            latency_us: median(latency).map(|ns| ns / 1e3),
            bandwidth_mb_s: median(bandwidth).map(|b| b / 1e6),
            samples: latency.len().max(bandwidth.len()),
        })
        .collect();
    report(&rows);
    if let Some(path) = csv {
        let mut text = String::from("series,bytes,latency_us,bandwidth_mb_s,samples\n");
        for row in &rows {
            let field = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
            text += &format!(
                "{},{},{},{},{}\n",
                row.series,
                row.bytes,
                field(row.latency_us),
                field(row.bandwidth_mb_s),
                row.samples
            );
        }
        std::fs::write(&path, text)?;
        println!("\nwrote {}", path.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// What the fabric's authentication code costs per full packet on this machine: the median over
/// batches of the time to tag one packet of the largest size and to check it (each end of the
/// wire does one of the two per packet).
fn mac_cost() {
    const BATCH: u32 = 200;
    let key = FabricKey::new([0x5a; 32]);
    let packet: Vec<u8> = (0..MAX_PACKET_LEN).map(|i| i as u8).collect();
    let mut wire = packet.clone();
    wire.extend_from_slice(&key.tag(&packet));
    let (mut tag, mut open) = (Vec::new(), Vec::new());
    for _ in 0..25 {
        let start = Instant::now();
        for _ in 0..BATCH {
            std::hint::black_box(key.tag(std::hint::black_box(&packet)));
        }
        tag.push(start.elapsed().as_nanos() as f64 / f64::from(BATCH));
        let start = Instant::now();
        for _ in 0..BATCH {
            assert!(key.open(std::hint::black_box(&wire)).is_some());
        }
        open.push(start.elapsed().as_nanos() as f64 / f64::from(BATCH));
    }
    let (tag, open) = (
        median(&mut tag).unwrap_or(0.0) / 1e3,
        median(&mut open).unwrap_or(0.0) / 1e3,
    );
    println!(
        "fabric MAC ({}), per {MAX_PACKET_LEN}-byte packet: tag {tag:.2} µs, check {open:.2} µs \
         ({:.0} MB/s each way)",
        FabricKey::ALGORITHM,
        MAX_PACKET_LEN as f64 / ((tag + open) / 2.0),
    );
}

/// The reliability protocol's counters of every connection of the daemon at `socket`: how much
/// was sent again, refused or dropped while the benchmark ran.
fn print_counters(path: &str, socket: &Path) {
    let Ok(status) = nicbar_control::query_status(socket) else {
        return;
    };
    for unit in status.units {
        for c in unit.connections {
            println!(
                "{path} node {} -> {}: sent {} resent {} received {} acks {}/{} nacks {}/{} \
                 rejects {}/{} drops {}; wire: undeliverable {}",
                unit.node,
                c.peer,
                c.sent,
                c.resent,
                c.received,
                c.acks_sent,
                c.acks_received,
                c.nacks_sent,
                c.nacks_received,
                c.rejects_sent,
                c.rejects_received,
                c.drops,
                unit.wire.undeliverable
            );
        }
    }
}

/// The tables and the ratios the targets name.
fn report(rows: &[Row]) {
    let find = |series: &str, bytes: usize| {
        rows.iter()
            .find(|row| row.series == series && row.bytes == bytes)
    };
    let latency = |series: &str, bytes: usize| find(series, bytes).and_then(|r| r.latency_us);
    let bandwidth = |series: &str, bytes: usize| find(series, bytes).and_then(|r| r.bandwidth_mb_s);
    let cell = |v: Option<f64>| {
        v.map_or_else(
            || format!("{:>11}", "-"),
            |v| {
                if v < 10.0 {
                    format!("{v:>11.3}")
                } else {
                    format!("{v:>11.1}")
                }
            },
        )
    };
    let size = |bytes: usize| {
        if bytes >= 1 << 20 {
            format!("{} MiB", bytes >> 20)
        } else if bytes >= 1 << 10 {
            format!("{} KiB", bytes >> 10)
        } else {
            format!("{bytes} B")
        }
    };
    println!("\nlatency, median (µs): one operation alone, post to completion");
    let latency_series = [
        "put in-process",
        "get in-process",
        "put UDP",
        "get UDP",
        "memcpy",
    ];
    print!("{:>8}", "size");
    for series in latency_series {
        print!(" {series:>11}");
    }
    println!();
    for bytes in SIZES {
        print!("{:>8}", size(bytes));
        for series in latency_series {
            print!(" {}", cell(latency(series, bytes)));
        }
        println!();
    }
    println!(
        "{:>8} {} {:>11} {} {:>11}   (atomic fetch-and-add)",
        "atomic",
        cell(latency("atomic in-process", 8)),
        "",
        cell(latency("atomic UDP", 8)),
        ""
    );
    println!(
        "\nbandwidth, median (MB/s): bursts, {IN_FLIGHT} operations outstanding; memcpy one copy"
    );
    let bandwidth_series = [
        "put in-process",
        "get in-process",
        "put UDP",
        "get UDP",
        "memcpy",
        "raw UDP stream",
    ];
    print!("{:>8}", "size");
    for series in bandwidth_series {
        print!(" {:>11}", series.trim_start_matches("raw "));
    }
    println!();
    for bytes in SIZES {
        print!("{:>8}", size(bytes));
        for series in bandwidth_series {
            print!(" {}", cell(bandwidth(series, bytes)));
        }
        println!();
    }
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
        _ => "-".into(),
    };
    const MIB: usize = 1 << 20;
    println!("\ntargets (medians):");
    println!(
        "  put in-process / memcpy bandwidth at  1 MiB = {}  (target: >= 0.5)",
        ratio(bandwidth("put in-process", MIB), bandwidth("memcpy", MIB)),
    );
    for bytes in [MIB, 16 * MIB] {
        println!(
            "  put UDP / raw UDP stream bandwidth at {:>6} = {}  (target: >= 0.8)",
            size(bytes),
            ratio(
                bandwidth("put UDP", bytes),
                bandwidth("raw UDP stream", bytes)
            ),
        );
    }
    for path in ["in-process", "UDP"] {
        println!(
            "  atomic / 8-byte put round trip, {path:<10} = {}  (target: <= 1.5; {} µs against {} \
             µs)",
            ratio(
                latency(&format!("atomic {path}"), 8),
                latency(&format!("put {path}"), 8)
            ),
            cell(latency(&format!("atomic {path}"), 8)).trim(),
            cell(latency(&format!("put {path}"), 8)).trim(),
        );
    }
}

fn child(args: &[String]) -> Result {
    let arg = |i: usize| {
        args.get(i)
            .map(String::as_str)
            .ok_or("missing child argument")
    };
    let mode = match arg(1)? {
        "spin" => WaitMode::Spin,
        _ => WaitMode::Sleep,
    };
    match arg(0)? {
        "target" => target(mode, Path::new(arg(2)?), Path::new(arg(3)?)),
        "initiator" => initiator(
            mode,
            [Path::new(arg(2)?), Path::new(arg(3)?)],
            [arg(4)?.parse()?, arg(5)?.parse()?],
            arg(6)?.parse()?,
            arg(7)?.parse()?,
            arg(8)?.parse()?,
        ),
        other => Err(format!("unknown child role {other:?}").into()),
    }
}

/// The raw UDP stream's datagram: a burst number and an end mark, then data.
const STREAM_HEADER: usize = 8;
/// Bytes of a stream datagram before its data: as many as a put packet's headers and code.
const STREAM_OVERHEAD: usize = MAX_WIRE_LEN - RDMA_SEGMENT;
/// Marks the end of a burst: the receiver answers with what arrived.
const STREAM_END: u32 = 1 << 31;

/// The target: port 1 on unit 1 of the in-process daemon and on the second UDP daemon, 16 MiB
/// registered on each with remote access allowed, and the raw UDP stream's receiver. Prints its
/// keys and stream port, then waits for a line on stdin.
fn target(mode: WaitMode, local: &Path, udp: &Path) -> Result {
    let mut ports = [Port::open_at(local, 1, 1)?, Port::open_at(udp, 0, 1)?];
    let mut keys = [0u32; 2];
    let mut regions = Vec::new();
    for (port, key) in ports.iter_mut().zip(keys.iter_mut()) {
        port.set_wait_mode(mode);
        let region = port.register_memory(REGION)?;
        port.allow_remote_memory_access()?;
        *key = region.key();
        regions.push(region);
    }
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    set_receive_buffer(&socket, 8 << 20);
    let stream_port = socket.local_addr()?.port();
    std::thread::spawn(move || stream_receiver(&socket));
    println!("ready {} {} {stream_port}", keys[0], keys[1]);
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    drop(regions);
    for port in ports {
        let _ = port.close();
    }
    Ok(())
}

/// Counts the bytes of each burst from its first datagram; at its end mark, answers the sender
/// with the burst number and the bytes that arrived.
fn stream_receiver(socket: &UdpSocket) {
    let mut buffer = vec![0u8; 65536];
    let mut destination = vec![0u8; REGION];
    let mut burst = u32::MAX;
    let mut bytes = 0u64;
    while let Ok((len, from)) = socket.recv_from(&mut buffer) {
        let Some(header) = buffer.get(..STREAM_HEADER) else {
            continue;
        };
        let number = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        if number & STREAM_END != 0 {
            let number = number & !STREAM_END;
            let arrived = if number == burst { bytes } else { 0 };
            let mut answer = [0u8; 12];
            answer[..4].copy_from_slice(&number.to_le_bytes());
            answer[4..].copy_from_slice(&arrived.to_le_bytes());
            let _ = socket.send_to(&answer, from);
            continue;
        }
        if number != burst {
            burst = number;
            bytes = 0;
        }
        let data = buffer.get(STREAM_OVERHEAD..len).unwrap_or(&[]);
        let at = (bytes as usize % REGION).min(REGION - data.len());
        destination[at..at + data.len()].copy_from_slice(data);
        std::hint::black_box(&mut destination);
        bytes += data.len() as u64;
    }
}

/// One route to the target: a port, its registered source and destination, the target's key.
struct Route {
    name: &'static str,
    port: Port,
    source: MemoryRegion,
    destination: MemoryRegion,
    key: u32,
}

/// What one sample measures.
#[derive(Clone, Copy, Debug)]
enum Item {
    Put(usize, usize),
    Get(usize, usize),
    Atomic(usize),
    Memcpy(usize),
    Stream(usize),
}

/// The initiator: port 1 on unit 0 of the in-process daemon and on the first UDP daemon; runs
/// `rounds` rounds of every item in a shuffled order and prints each sample as
/// `series<TAB>latency|bandwidth<TAB>bytes<TAB>value` (nanoseconds; bytes per second).
fn initiator(
    mode: WaitMode,
    sockets: [&Path; 2],
    keys: [u32; 2],
    stream_port: u16,
    rounds: usize,
    seed: u64,
) -> Result {
    let mut paths = Vec::new();
    for ((socket, unit), (name, key)) in sockets
        .into_iter()
        .zip([0u8, 0])
        .zip(["in-process", "UDP"].into_iter().zip(keys))
    {
        let mut port = Port::open_at(socket, unit, 1)?;
        port.set_wait_mode(mode);
        let source = port.register_memory(REGION)?;
        let pattern: Vec<u8> = (0..REGION).map(|i| (i * 131 + 7) as u8).collect();
        source.bytes().write(0, &pattern);
        let destination = port.register_memory(REGION)?;
        paths.push(Route {
            name,
            port,
            source,
            destination,
            key,
        });
    }
    let copy_from = vec![0x5au8; REGION];
    let mut copy_to = vec![0u8; REGION];
    let stream = UdpSocket::bind("127.0.0.1:0")?;
    stream.connect(("127.0.0.1", stream_port))?;
    stream.set_read_timeout(Some(Duration::from_millis(100)))?;

    let mut items = Vec::new();
    for path in 0..paths.len() {
        for &bytes in &SIZES {
            items.push(Item::Put(path, bytes));
            items.push(Item::Get(path, bytes));
        }
        items.push(Item::Atomic(path));
    }
    for &bytes in &SIZES {
        items.push(Item::Memcpy(bytes));
        items.push(Item::Stream(bytes));
    }
    // A first pass of every item warms caches, connections and page tables; not reported.
    let mut rng = Xoshiro256StarStar::seed_from_u64(seed);
    let mut out = String::new();
    let mut burst = 0u32;
    for round in 0..=rounds {
        shuffle(&mut items, &mut rng);
        let mut lines = String::new();
        for &item in &items {
            match item {
                Item::Put(path, bytes) | Item::Get(path, bytes) => {
                    let path = &mut paths[path];
                    let put = matches!(item, Item::Put(..));
                    let series = format!("{} {}", if put { "put" } else { "get" }, path.name);
                    for _ in 0..latency_samples(bytes) {
                        let started = Instant::now();
                        operate(path, put, bytes, 1)?;
                        lines += &sample(&series, "latency", bytes, started.elapsed().as_nanos());
                    }
                    let count = burst_operations(bytes);
                    let started = Instant::now();
                    operate(path, put, bytes, count)?;
                    lines += &rate(&series, bytes, count * bytes, started.elapsed());
                }
                Item::Atomic(path) => {
                    let path = &mut paths[path];
                    let series = format!("atomic {}", path.name);
                    for _ in 0..LATENCY_SAMPLES {
                        let started = Instant::now();
                        let remote = nicbar::RemotePointer {
                            key: path.key,
                            offset: 0,
                        }
                        .to_u64();
                        path.port.atomic(
                            AtomicOp::FETCH_ADD,
                            remote,
                            1,
                            0,
                            TARGET_NODE,
                            PortId(1),
                            0,
                        )?;
                        completion(&mut path.port)?;
                        lines += &sample(&series, "latency", 8, started.elapsed().as_nanos());
                    }
                }
                Item::Memcpy(bytes) => {
                    // Enough copies to time well; each sample is one copy's time.
                    let copies = (LATENCY_BYTES / bytes).clamp(1, 1000);
                    for _ in 0..latency_samples(bytes) {
                        let started = Instant::now();
                        for _ in 0..copies {
                            copy_to[..bytes].copy_from_slice(&copy_from[..bytes]);
                            std::hint::black_box(&mut copy_to);
                        }
                        let each = started.elapsed() / copies as u32;
                        lines += &sample("memcpy", "latency", bytes, each.as_nanos());
                        lines += &rate("memcpy", bytes, bytes, each);
                    }
                }
                Item::Stream(bytes) => {
                    burst = burst.wrapping_add(1) & !STREAM_END;
                    let total = burst_operations(bytes) * bytes;
                    let started = Instant::now();
                    let chunk = bytes.min(RDMA_SEGMENT);
                    let arrived = udp_stream(&stream, burst, total, &copy_from, chunk)?;
                    lines += &rate("raw UDP stream", bytes, arrived, started.elapsed());
                }
            }
        }
        if round > 0 {
            out += &lines;
        }
        eprintln!("round {round} of {rounds} done");
    }
    print!("{out}");
    for path in paths {
        drop((path.source, path.destination));
        let _ = path.port.close();
    }
    Ok(())
}

fn latency_samples(bytes: usize) -> usize {
    (LATENCY_BYTES / bytes).clamp(1, LATENCY_SAMPLES)
}

fn burst_operations(bytes: usize) -> usize {
    (BURST_BYTES / bytes).clamp(2, BURST_OPERATIONS)
}

fn sample(series: &str, metric: &str, bytes: usize, value: u128) -> String {
    format!("{series}\t{metric}\t{bytes}\t{value}\n")
}

fn rate(series: &str, bytes: usize, moved: usize, elapsed: Duration) -> String {
    let per_second = moved as f64 / elapsed.as_secs_f64().max(1e-9);
    format!("{series}\tbandwidth\t{bytes}\t{per_second:.0}\n")
}

/// `count` puts (or gets) of `bytes` each on `path`, [`IN_FLIGHT`] outstanding at a time; returns
/// when every one has completed.
fn operate(path: &mut Route, put: bool, bytes: usize, count: usize) -> Result {
    let remote = nicbar::RemotePointer {
        key: path.key,
        offset: 0,
    }
    .to_u64();
    let node = TARGET_NODE;
    let (mut posted, mut done) = (0, 0);
    while done < count {
        while posted < count && posted - done < IN_FLIGHT {
            if put {
                path.port
                    .put(&path.source, 0, remote, bytes, node, PortId(1), 0)?;
            } else {
                path.port
                    .get(remote, &path.destination, 0, bytes, node, PortId(1), 0)?;
            }
            posted += 1;
        }
        completion(&mut path.port)?;
        done += 1;
    }
    Ok(())
}

/// Waits for the next one-sided completion; an operation that did not succeed ends the run.
fn completion(port: &mut Port) -> Result {
    match port.receive_timeout(OPERATION_LIMIT)? {
        Some(Event::OperationDone { status, .. }) if status == Status::SUCCESS => Ok(()),
        Some(Event::OperationDone { status, kind, .. }) => {
            Err(format!("an operation of kind {kind:?} failed: {status:?}").into())
        }
        Some(other) => Err(format!("unexpected event {other:?}").into()),
        None => Err(format!("no completion within {OPERATION_LIMIT:?}").into()),
    }
}

/// Sends `total` bytes of `source` (from its start again past its end) to the receiver in
/// datagrams of `chunk` data bytes, each copied into the datagram after as many bytes as a put
/// packet's headers and code; then the end mark until the receiver answers. Returns the bytes
/// that arrived.
fn udp_stream(
    socket: &UdpSocket,
    burst: u32,
    total: usize,
    source: &[u8],
    chunk: usize,
) -> Result<usize> {
    let mut datagram = vec![0u8; STREAM_OVERHEAD + chunk];
    datagram[..4].copy_from_slice(&burst.to_le_bytes());
    let mut sent = 0;
    while sent < total {
        let len = chunk.min(total - sent);
        let at = (sent % source.len()).min(source.len() - len);
        datagram[STREAM_OVERHEAD..STREAM_OVERHEAD + len].copy_from_slice(&source[at..at + len]);
        match socket.send(&datagram[..STREAM_OVERHEAD + len]) {
            Ok(_) => sent += len,
            // A full socket buffer: the kernel drops nothing on loopback by blocking instead.
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error.into()),
        }
    }
    let mut end = [0u8; STREAM_HEADER];
    end[..4].copy_from_slice(&(burst | STREAM_END).to_le_bytes());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut answer = [0u8; 12];
    loop {
        socket.send(&end)?;
        match socket.recv(&mut answer) {
            Ok(12) if answer[..4] == burst.to_le_bytes() => {
                let mut arrived = [0u8; 8];
                arrived.copy_from_slice(&answer[4..]);
                return Ok(u64::from_le_bytes(arrived) as usize);
            }
            Ok(_) => {}
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(error) => return Err(error.into()),
        }
        if Instant::now() > deadline {
            return Err("the raw UDP stream's receiver did not answer".into());
        }
    }
}
