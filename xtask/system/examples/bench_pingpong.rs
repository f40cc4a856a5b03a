//! One-way small-message latency through the emulated NIC, beside two references measured by the
//! same program in the same run: a shared-memory flag handoff between two processes, and a raw UDP
//! ping-pong on loopback.
//!
//! `cargo xtask bench pingpong` builds and runs it; `--help` lists the options. Every figure is a
//! round trip between two real processes, halved; the emulator (the NIC) runs in this process,
//! except for the GM C programs' pair (`--c-pingpong`), which run against `nicctl emulate
//! --units 2` with its default settings, waiting with gm_blocking_receive and then polling
//! gm_receive.
//!
//! With `--sweep MOST` it instead runs one curve from 0 bytes to `MOST` (each power of two and 3
//! bytes either side): a raw UDP ping-pong on loopback (messages longer than a datagram split and
//! counted back together), or with `--nic` the `Port` ping-pong between two ports of running
//! daemons, each length in receive buffers of its own size class. `cargo xtask bench pingpong
//! --curve` runs it beside GM's C ping-pong.
#![deny(unsafe_code)]

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nicbar::{
    DmaBuffer, Event, NodeId, Port, Priority, Status, WaitMode, max_length_for_size,
    min_size_for_length,
};
use nicbar_emulator::fabric::FabricMap;
use nicbar_emulator::{Emulator, EmulatorConfig, FabricKey};
use nicbar_system::{
    DATAGRAM_MOST, cores, cpu_model, curve_lengths, free_udp_port, median, receive_message,
    scratch_dir, send_message, set_receive_buffer, wait_output, wait_with_timeout,
};

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// Message length of every ping-pong.
const LENGTH: usize = 64;
/// Size class of the buffers (120 bytes at most).
const SIZE: u8 = 7;

const HELP: &str = "\
bench_pingpong: one-way latency of 64-byte messages through the emulated NIC, beside a
shared-memory flag handoff and a raw UDP ping-pong, measured in the same run.

usage: bench_pingpong [--round-trips N] [--csv FILE]
                      [--c-pingpong PROGRAM --nicctl NICCTL [--c-round-trips N]]

  --round-trips N    round trips per measurement (default 20000; the shared-memory
                     reference runs 10x as many)
  --csv FILE         also write the results as CSV
  --c-pingpong PROGRAM
                     also measure host-lib/examples/c/pingpong.c built as PROGRAM, against
                     `NICCTL emulate --units 2` (default settings): blocking on
                     gm_blocking_receive, then spinning on gm_receive, with their ratio
  --c-round-trips N  round trips of each C measurement (default 5000)

usage: bench_pingpong --sweep MOST [--round-trips N]
                      [--nic SOCKET_A,UNIT_A,NODE_A,SOCKET_B,UNIT_B,NODE_B]

  --sweep MOST       one curve from 0 bytes to MOST (each power of two and 3 bytes either
                     side), N round trips per length (default 100) after a tenth as many
                     (at least one) to warm up; prints `sweep BYTES MEDIAN_ROUND_TRIP_NS`
                     per length. Without --nic: raw UDP on loopback
  --nic ...          the Port ping-pong between port 2 of UNIT_A (node NODE_A) of the daemon
                     on SOCKET_A, which measures, and port 2 of UNIT_B (node NODE_B) of the
                     daemon on SOCKET_B; both spin on their event rings
";

fn main() -> Result {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--child") => child(&args[1..]),
        Some("--help" | "-h") => {
            print!("{HELP}");
            Ok(())
        }
        _ if args.iter().any(|arg| arg == "--sweep") => sweep(&args),
        _ => orchestrate(&args),
    }
}

/// Round trips per length of a sweep, unless `--round-trips` says.
const SWEEP_ROUND_TRIPS: usize = 100;

/// `--sweep`: one curve, raw UDP or (`--nic`) the `Port` ping-pong; prints each length's median
/// round trip.
fn sweep(args: &[String]) -> Result {
    let mut most: Option<usize> = None;
    let mut round_trips = SWEEP_ROUND_TRIPS;
    let mut nic: Option<String> = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--sweep" => most = Some(rest.next().ok_or("--sweep needs a length")?.parse()?),
            "--round-trips" => {
                round_trips = rest.next().ok_or("--round-trips needs a value")?.parse()?
            }
            "--nic" => nic = Some(rest.next().ok_or("--nic needs its six fields")?.clone()),
            other => return Err(format!("unknown argument {other:?}; see --help").into()),
        }
    }
    let most = most.ok_or("--sweep needs a length")?.to_string();
    let trips = round_trips.to_string();
    let text = match nic {
        None => {
            let port = free_udp_port("127.0.0.1")?.to_string();
            run_pair(
                &["udp-sweep", "b", &port, &trips, &most],
                &["udp-sweep", "a", &port, &trips, &most],
            )?
        }
        Some(fields) => {
            let [socket_a, unit_a, node_a, socket_b, unit_b, node_b] = fields
                .split(',')
                .collect::<Vec<_>>()
                .try_into()
                .map_err(|_| format!("--nic {fields:?}: six fields, comma-separated"))?;
            run_pair(
                &["nic-sweep", "b", socket_b, unit_b, node_a, &trips, &most],
                &["nic-sweep", "a", socket_a, unit_a, node_b, &trips, &most],
            )?
        }
    };
    let mut samples: Vec<(usize, f64)> = text
        .lines()
        .filter_map(|line| {
            let (bytes, ns) = line.split_once(' ')?;
            Some((bytes.parse().ok()?, ns.parse().ok()?))
        })
        .collect();
    samples.sort_by_key(|&(bytes, _)| bytes);
    for group in samples.chunk_by(|a, b| a.0 == b.0) {
        let mut round_trips_ns: Vec<f64> = group.iter().map(|&(_, ns)| ns).collect();
        if let Some(middle) = median(&mut round_trips_ns) {
            println!("sweep {} {middle:.0}", group[0].0);
        }
    }
    Ok(())
}

/// One measurement: its name, and one-way latencies in nanoseconds, sorted.
struct Measured {
    name: &'static str,
    one_way_ns: Vec<f64>,
}

impl Measured {
    fn quantile(&self, q: f64) -> f64 {
        nicbar_system::quantile(&self.one_way_ns, q)
    }
    fn mean(&self) -> f64 {
        nicbar_system::mean(&self.one_way_ns)
    }
}

fn orchestrate(args: &[String]) -> Result {
    let mut round_trips = 20_000usize;
    let mut csv: Option<PathBuf> = None;
    let mut c_pingpong: Option<PathBuf> = None;
    let mut nicctl: Option<PathBuf> = None;
    let mut c_round_trips = 5_000usize;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--round-trips" => {
                round_trips = rest.next().ok_or("--round-trips needs a value")?.parse()?
            }
            "--csv" => csv = Some(rest.next().ok_or("--csv needs a file")?.into()),
            "--c-pingpong" => {
                c_pingpong = Some(rest.next().ok_or("--c-pingpong needs a program")?.into())
            }
            "--nicctl" => nicctl = Some(rest.next().ok_or("--nicctl needs a program")?.into()),
            "--c-round-trips" => {
                c_round_trips = rest
                    .next()
                    .ok_or("--c-round-trips needs a value")?
                    .parse()?
            }
            other => return Err(format!("unknown argument {other:?}; see --help").into()),
        }
    }
    let dir = scratch_dir("bench-pingpong")?;
    println!("machine: {} cores, {}", cores(), cpu_model());
    println!(
        "{round_trips} round trips of {LENGTH}-byte messages per measurement; each side a separate process\n"
    );

    let mut results = Vec::new();

    println!("[1/6] shared-memory flag handoff (both processes spin)");
    let flags = dir.join("flags");
    std::fs::write(&flags, [0u8; 128])?;
    let shm_trips = (round_trips * 10).to_string();
    results.push(pair(
        "shared-memory handoff",
        &["shm", "b", flags.to_str().ok_or("path")?, &shm_trips],
        &["shm", "a", flags.to_str().ok_or("path")?, &shm_trips],
    )?);

    println!("[2/6] raw UDP on loopback (blocking sockets)");
    let port = free_udp_port("127.0.0.1")?.to_string();
    let trips = round_trips.to_string();
    results.push(pair(
        "raw UDP loopback",
        &["udp", "b", &port, &trips],
        &["udp", "a", &port, &trips],
    )?);

    for (label, name, mode) in [
        (
            "[3/6] emulated NIC, in-process path, processes spin",
            "NIC in-process, spin",
            "spin",
        ),
        (
            "[4/6] emulated NIC, in-process path, processes sleep",
            "NIC in-process, sleep",
            "sleep",
        ),
    ] {
        println!("{label}");
        let socket = dir.join(format!("{mode}.sock"));
        let emulator = Emulator::spawn(EmulatorConfig::in_process(&socket, 2))?;
        let s = socket.to_str().ok_or("path")?.to_string();
        results.push(pair(
            name,
            &["nic", "b", &s, "1", "0", mode, &trips],
            &["nic", "a", &s, "0", "1", mode, &trips],
        )?);
        drop(emulator);
    }

    // Packets between NICs of one daemon carry no code (they never leave its memory): what the
    // fabric's code costs is measured over UDP, with and without it, side by side.
    for (label, name, mode, authenticate) in [
        (
            "[5/6] emulated NIC over UDP (two daemons), processes spin",
            "NIC over UDP, spin",
            "spin",
            true,
        ),
        (
            "[6/6] emulated NIC over UDP (two daemons), processes sleep",
            "NIC over UDP, sleep",
            "sleep",
            true,
        ),
        // Sleeping, not spinning: four spinning threads on a small machine measure the
        // scheduler more than the code.
        (
            "[+] emulated NIC over UDP (two daemons), processes sleep, packets not authenticated",
            "NIC over UDP, sleep, no auth",
            "sleep",
            false,
        ),
    ] {
        println!("{label}");
        let mut fabric = FabricMap::new();
        fabric.insert(
            NodeId::new(0),
            format!("127.0.0.1:{}", free_udp_port("127.0.0.1")?).parse()?,
        );
        fabric.insert(
            NodeId::new(1),
            format!("127.0.0.1:{}", free_udp_port("127.0.0.1")?).parse()?,
        );
        let (s0, s1) = (
            dir.join(format!("udp0-{mode}-{authenticate}.sock")),
            dir.join(format!("udp1-{mode}-{authenticate}.sock")),
        );
        // Both daemons share one fabric key, as every daemon of a real fabric does.
        let key = authenticate
            .then(|| nicbar_control::server::random_key().map(FabricKey::new))
            .transpose()?;
        let mut c0 = EmulatorConfig::on_fabric(&s0, fabric.clone(), &[NodeId::new(0)])?;
        let mut c1 = EmulatorConfig::on_fabric(&s1, fabric, &[NodeId::new(1)])?;
        c0.nic.fabric_key = key;
        c1.nic.fabric_key = key;
        c0.authenticate = authenticate;
        c1.authenticate = authenticate;
        let e0 = Emulator::spawn(c0)?;
        let e1 = Emulator::spawn(c1)?;
        let (a, b) = (
            s0.to_str().ok_or("path")?.to_string(),
            s1.to_str().ok_or("path")?.to_string(),
        );
        results.push(pair(
            name,
            &["nic", "b", &b, "0", "0", mode, &trips],
            &["nic", "a", &a, "0", "1", mode, &trips],
        )?);
        drop((e0, e1));
    }

    if let Some(program) = &c_pingpong {
        let nicctl = nicctl
            .as_deref()
            .ok_or("--c-pingpong needs --nicctl to start the daemon")?;
        println!(
            "[C] GM ping-pong (pingpong.c, {c_round_trips} round trips) against `nicctl emulate \
             --units 2`, default settings: gm_blocking_receive, then polling gm_receive"
        );
        let socket = dir.join("gm.sock");
        let _daemon = start_nicctl(nicctl, &socket)?;
        for (name, mode) in [
            ("GM C, gm_blocking_receive", "block"),
            ("GM C, polling gm_receive", "poll"),
        ] {
            results.push(c_pair(name, program, &socket, mode, c_round_trips)?);
        }
    }

    println!(
        "\n{:<26} {:>12} {:>12} {:>12}",
        "one-way latency", "p50 (µs)", "mean (µs)", "p99 (µs)"
    );
    for m in &results {
        println!(
            "{:<26} {:>12.2} {:>12.2} {:>12.2}",
            m.name,
            m.quantile(0.5) / 1e3,
            m.mean() / 1e3,
            m.quantile(0.99) / 1e3
        );
    }
    let p50 = |name: &str| {
        results
            .iter()
            .find(|m| m.name == name)
            .map_or(f64::NAN, |m| m.quantile(0.5))
    };
    let shm = p50("shared-memory handoff");
    let udp = p50("raw UDP loopback");
    println!("\ncomparisons (p50, one way):");
    for name in ["NIC in-process, spin", "NIC in-process, sleep"] {
        println!(
            "  {name:<24} - shared-memory handoff = {:>8.2} µs  (target: within 2 µs)",
            (p50(name) - shm) / 1e3
        );
    }
    for name in ["NIC over UDP, spin", "NIC over UDP, sleep"] {
        println!(
            "  {name:<24} / raw UDP loopback      = {:>8.2}x    (target: within 1.5x)",
            p50(name) / udp
        );
    }
    if c_pingpong.is_some() {
        let (blocking, polling) = (
            p50("GM C, gm_blocking_receive"),
            p50("GM C, polling gm_receive"),
        );
        println!(
            "  {:<24} / gm_blocking_receive   = {:>8.2}x    (target: within 2x; {:.2} µs \
             against {:.2} µs)",
            "GM C, polling gm_receive",
            polling / blocking,
            polling / 1e3,
            blocking / 1e3
        );
    }
    let key = FabricKey::new([0x5a; 32]);
    for (what, len) in [
        ("a 40-byte barrier or ack packet", 40usize),
        ("a 4 KiB data packet", 4136),
    ] {
        let packet = vec![0xa5u8; len];
        let rounds = 20_000u32;
        let started = Instant::now();
        let mut sink = 0u8;
        for _ in 0..rounds {
            sink ^= key.tag(std::hint::black_box(&packet))[0];
        }
        std::hint::black_box(sink);
        println!(
            "  the code of {what}: {:.2} µs to make (as much again to check)",
            started.elapsed().as_secs_f64() * 1e6 / f64::from(rounds)
        );
    }
    println!(
        "  over UDP, sleeping, one way: {:.2} µs with authentication (keyed BLAKE3), {:.2} \
         without (the difference beside the code's own cost above is the run's noise)",
        p50("NIC over UDP, sleep") / 1e3,
        p50("NIC over UDP, sleep, no auth") / 1e3
    );
    if let Some(path) = csv {
        let mut text = String::from("measurement,p50_us,mean_us,p99_us\n");
        for m in &results {
            text += &format!(
                "{},{:.3},{:.3},{:.3}\n",
                m.name,
                m.quantile(0.5) / 1e3,
                m.mean() / 1e3,
                m.quantile(0.99) / 1e3
            );
        }
        std::fs::write(&path, text)?;
        println!("\nwrote {}", path.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Runs the responder `b` and the initiator `a` as two processes; `a` prints one round trip in
/// nanoseconds per line.
fn pair(name: &'static str, b: &[&str], a: &[&str]) -> Result<Measured> {
    let text = run_pair(b, a)?;
    let mut one_way_ns: Vec<f64> = text
        .lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .map(|rtt| rtt / 2.0)
        .collect();
    if one_way_ns.is_empty() {
        return Err(format!("{name}: the initiator reported nothing").into());
    }
    one_way_ns.sort_by(f64::total_cmp);
    Ok(Measured { name, one_way_ns })
}

/// Runs this program's children: the responder with arguments `b`, the initiator with `a`;
/// returns what the initiator printed.
fn run_pair(b: &[&str], a: &[&str]) -> Result<String> {
    let exe = std::env::current_exe()?;
    let mut responder = Command::new(&exe)
        .arg("--child")
        .args(b)
        .stdout(Stdio::null())
        .spawn()?;
    let initiator = Command::new(&exe)
        .arg("--child")
        .args(a)
        .stdout(Stdio::piped())
        .spawn()?;
    let output = wait_output(initiator, Duration::from_secs(300));
    let responder_done = wait_with_timeout(&mut responder, Duration::from_secs(30));
    let output = output?;
    responder_done?;
    Ok(String::from_utf8(output)?)
}

/// A `nicctl emulate` daemon, stopped when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `nicctl emulate --units 2` with its default settings on `socket`, and waits until it
/// answers there.
fn start_nicctl(nicctl: &Path, socket: &Path) -> Result<Daemon> {
    let mut daemon = Daemon(
        Command::new(nicctl)
            .args(["emulate", "--units", "2", "--socket"])
            .arg(socket)
            .stdout(Stdio::null())
            .spawn()?,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while nicbar_control::query_status(socket).is_err() {
        if let Some(status) = daemon.0.try_wait()? {
            return Err(format!("nicctl emulate exited ({status}) before it listened").into());
        }
        if Instant::now() > deadline {
            return Err(format!("nicctl emulate did not listen on {}", socket.display()).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(daemon)
}

/// Runs the C ping-pong between units 1 (the responder) and 0 (which measures and prints each
/// round trip in nanoseconds) of the daemon on `socket`, both waiting as `mode` says (`block` or
/// `poll`); the first tenth of the round trips is the warm-up.
fn c_pair(
    name: &'static str,
    program: &Path,
    socket: &Path,
    mode: &str,
    round_trips: usize,
) -> Result<Measured> {
    let trips = round_trips.to_string();
    let mut responder = Command::new(program)
        .args(["1", "0", &trips, mode])
        .env("NICBAR_SOCKET", socket)
        .stdout(Stdio::null())
        .spawn()?;
    let initiator = Command::new(program)
        .args(["0", "1", &trips, mode, "times"])
        .env("NICBAR_SOCKET", socket)
        .stdout(Stdio::piped())
        .spawn()?;
    let output = wait_output(initiator, Duration::from_secs(600));
    if output.is_err() {
        let _ = responder.kill();
    }
    let responder_done = wait_with_timeout(&mut responder, Duration::from_secs(30));
    let output = output?;
    responder_done?;
    let text = String::from_utf8(output)?;
    let round_trips_ns: Vec<f64> = text
        .lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .collect();
    let mut one_way_ns: Vec<f64> = round_trips_ns
        .iter()
        .skip(warm_up(round_trips_ns.len()))
        .map(|rtt| rtt / 2.0)
        .collect();
    if one_way_ns.is_empty() {
        return Err(format!("{name}: the initiator reported nothing").into());
    }
    one_way_ns.sort_by(f64::total_cmp);
    Ok(Measured { name, one_way_ns })
}

fn child(args: &[String]) -> Result {
    let arg = |i: usize| {
        args.get(i)
            .map(String::as_str)
            .ok_or("missing child argument")
    };
    match (arg(0)?, arg(1)?) {
        ("shm", role) => shm(role, Path::new(arg(2)?), arg(3)?.parse()?),
        ("udp", role) => udp(role, arg(2)?.parse()?, arg(3)?.parse()?),
        ("udp-sweep", role) => {
            udp_sweep(role, arg(2)?.parse()?, arg(3)?.parse()?, arg(4)?.parse()?)
        }
        ("nic-sweep", role) => nic_sweep(
            role,
            Path::new(arg(2)?),
            arg(3)?.parse()?,
            arg(4)?.parse()?,
            arg(5)?.parse()?,
            arg(6)?.parse()?,
        ),
        ("nic", role) => nic(
            role,
            Path::new(arg(2)?),
            arg(3)?.parse()?,
            arg(4)?.parse()?,
            arg(5)?,
            arg(6)?.parse()?,
        ),
        other => Err(format!("unknown child role {other:?}").into()),
    }
}

fn warm_up(round_trips: usize) -> usize {
    round_trips / 10
}

/// The shared-memory reference: two flags on separate cache lines of a file both processes map.
#[allow(
    unsafe_code,
    reason = "the shared-memory reference maps a file and spins on atomics in it"
)]
fn shm(role: &str, path: &Path, round_trips: usize) -> Result {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    // SAFETY: the file is 128 bytes, made by the parent for this benchmark only; both processes
    // access it solely through the atomics below.
    let map = unsafe { memmap2::MmapMut::map_mut(&file)? };
    let base = map.as_ptr();
    // SAFETY: offsets 0 and 64 are 8-aligned (the mapping is page-aligned) and within the 128
    // bytes; the mapping outlives these references (it lives to the end of this function), and
    // every access to the words is atomic.
    let (ping, pong) = unsafe {
        (
            &*(base.cast::<AtomicU64>()),
            &*(base.add(64).cast::<AtomicU64>()),
        )
    };
    let total = warm_up(round_trips) + round_trips;
    let mut out = String::new();
    for i in 1..=total as u64 {
        if role == "a" {
            let start = Instant::now();
            ping.store(i, Ordering::Release);
            while pong.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
            if i as usize > warm_up(round_trips) {
                out += &format!("{}\n", start.elapsed().as_nanos());
            }
        } else {
            while ping.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
            pong.store(i, Ordering::Release);
        }
    }
    print!("{out}");
    Ok(())
}

/// The raw UDP reference: blocking sockets on loopback.
fn udp(role: &str, port: u16, round_trips: usize) -> Result {
    let total = warm_up(round_trips) + round_trips;
    let mut buffer = [0u8; LENGTH];
    if role == "b" {
        let socket = UdpSocket::bind(("127.0.0.1", port))?;
        socket.set_read_timeout(Some(Duration::from_secs(30)))?;
        for _ in 0..total {
            let (_, from) = socket.recv_from(&mut buffer)?;
            socket.send_to(&buffer, from)?;
        }
        return Ok(());
    }
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    socket.connect(("127.0.0.1", port))?;
    socket.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut out = String::new();
    let mut i = 0;
    while i < total {
        let start = Instant::now();
        socket.send(&buffer)?;
        match socket.recv(&mut buffer) {
            Ok(_) => {}
            // The responder may not be bound yet on the first try: send again.
            Err(error)
                if i == 0
                    && matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::ConnectionRefused
                            | std::io::ErrorKind::TimedOut
                    ) =>
            {
                continue;
            }
            Err(error) => return Err(error.into()),
        }
        if i >= warm_up(round_trips) {
            out += &format!("{}\n", start.elapsed().as_nanos());
        }
        i += 1;
    }
    print!("{out}");
    Ok(())
}

/// The emulated NIC: port 1 on `unit` of the daemon at `socket`, ping-pong with port 1 of `peer`.
fn nic(role: &str, socket: &Path, unit: u8, peer: u16, mode: &str, round_trips: usize) -> Result {
    let mut port = Port::open_at(socket, unit, 1)?;
    port.set_wait_mode(match mode {
        "spin" => WaitMode::Spin,
        _ => WaitMode::Sleep,
    });
    for tag in 0..16 {
        let buffer = port.dma_alloc(128)?;
        port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
            .map_err(|e| e.error)?;
    }
    let peer = NodeId::new(peer);
    let total = warm_up(round_trips) + round_trips;
    let mut spare: Vec<DmaBuffer> = Vec::new();
    let mut out = String::new();
    if role == "b" {
        // Wait for the first ping however long the initiator takes to open its port.
        for _ in 0..total {
            await_message(&mut port, &mut spare)?;
            send(&mut port, &mut spare, peer, SMALL)?;
        }
    } else {
        for i in 0..total {
            let start = Instant::now();
            if i == 0 {
                // The responder may not have opened its port yet.
                if first_ping(&mut port, &mut spare, peer, SMALL)?.is_none() {
                    await_message(&mut port, &mut spare)?;
                }
            } else {
                send(&mut port, &mut spare, peer, SMALL)?;
                await_message(&mut port, &mut spare)?;
            }
            if i >= warm_up(round_trips) {
                out += &format!("{}\n", start.elapsed().as_nanos());
            }
        }
    }
    // Let the last send complete before the port closes.
    while port.send_tokens() < 64 {
        port.blocking_receive()?;
    }
    print!("{out}");
    Ok(())
}

/// What one ping-pong sends: its length, and the size class of the buffers it goes in.
#[derive(Clone, Copy, Debug)]
struct Shape {
    length: usize,
    size: u8,
}

/// The fixed-length ping-pong's messages.
const SMALL: Shape = Shape {
    length: LENGTH,
    size: SIZE,
};

/// The `Port` ping-pong at every length of the curve to `most`: port 3 of `unit` of the daemon
/// on `socket` with port 3 of node `peer`, spinning on the event ring. One receive buffer of each
/// size class the curve uses is provided up front, and one given back as soon as its message is
/// read (before the answer goes), so a message always finds one: the exchange is in lockstep.
/// The initiator (`a`) prints `LENGTH NANOSECONDS` per timed round trip.
fn nic_sweep(
    role: &str,
    socket: &Path,
    unit: u8,
    peer: u16,
    round_trips: usize,
    most: usize,
) -> Result {
    let mut port = Port::open_at(socket, unit, 3)?;
    port.set_wait_mode(WaitMode::Spin);
    let lengths = curve_lengths(most);
    let shapes = lengths
        .iter()
        .map(|&length| {
            let size = u32::try_from(length)
                .ok()
                .and_then(min_size_for_length)
                .ok_or_else(|| format!("no size class holds {length} bytes"))?;
            Ok(Shape { length, size })
        })
        .collect::<Result<Vec<Shape>>>()?;
    let mut sizes: Vec<u8> = shapes.iter().map(|shape| shape.size).collect();
    sizes.dedup();
    for size in sizes {
        let buffer = port.dma_alloc(max_length_for_size(size) as usize)?;
        port.provide_receive_buffer(buffer, size, Priority::LOW, 0)
            .map_err(|e| e.error)?;
    }
    let peer = NodeId::new(peer);
    let warm = warm_up(round_trips).max(1);
    let mut spare: Vec<DmaBuffer> = Vec::new();
    let mut out = String::new();
    let mut first = true;
    for shape in shapes {
        for i in 0..warm + round_trips {
            let start = Instant::now();
            let length = if role == "b" {
                let length = await_message(&mut port, &mut spare)?;
                send(&mut port, &mut spare, peer, shape)?;
                length
            } else if std::mem::take(&mut first) {
                match first_ping(&mut port, &mut spare, peer, shape)? {
                    Some(length) => length,
                    None => await_message(&mut port, &mut spare)?,
                }
            } else {
                send(&mut port, &mut spare, peer, shape)?;
                await_message(&mut port, &mut spare)?
            };
            if length != shape.length {
                return Err(format!("a {length}-byte message where {shape:?} was due").into());
            }
            if role == "a" && i >= warm {
                out += &format!("{} {}\n", shape.length, start.elapsed().as_nanos());
            }
        }
    }
    while port.send_tokens() < 64 {
        port.blocking_receive()?;
    }
    print!("{out}");
    Ok(())
}

/// The raw UDP reference at every length of the curve to `most`: each message sent whole in
/// datagrams of at most 64 KiB less the headers, the receiver counting its bytes back together
/// ([`send_message`], [`receive_message`]); blocking sockets on loopback with receive buffers
/// room for the longest. After a handshake (empty datagrams) the responder (`b`, on `port`)
/// answers each message with one as long; the initiator (`a`) prints `LENGTH NANOSECONDS` per
/// timed round trip.
fn udp_sweep(role: &str, port: u16, round_trips: usize, most: usize) -> Result {
    let lengths = curve_lengths(most);
    let longest = lengths.last().copied().unwrap_or(0);
    let mut message = vec![0x5au8; longest];
    let mut datagram = vec![0u8; DATAGRAM_MOST];
    let socket = if role == "b" {
        UdpSocket::bind(("127.0.0.1", port))?
    } else {
        UdpSocket::bind("127.0.0.1:0")?
    };
    set_receive_buffer(&socket, 4 << 20);
    if role == "b" {
        socket.set_read_timeout(Some(Duration::from_secs(30)))?;
        let (_, from) = socket.recv_from(&mut datagram)?;
        socket.connect(from)?;
        socket.send(&[])?;
    } else {
        socket.connect(("127.0.0.1", port))?;
        socket.set_read_timeout(Some(Duration::from_millis(200)))?;
        let give_up = Instant::now() + Duration::from_secs(30);
        loop {
            socket.send(&[])?;
            match socket.recv(&mut datagram) {
                Ok(_) => break,
                // The responder may not be bound yet: say hello again.
                Err(error)
                    if Instant::now() < give_up
                        && matches!(
                            error.kind(),
                            std::io::ErrorKind::WouldBlock
                                | std::io::ErrorKind::ConnectionRefused
                                | std::io::ErrorKind::TimedOut
                        ) => {}
                Err(error) => return Err(error.into()),
            }
        }
    }
    // A lost datagram (none is, on loopback with these buffers) ends the run here.
    socket.set_read_timeout(Some(Duration::from_secs(10)))?;
    let warm = warm_up(round_trips).max(1);
    let mut number = 0u32;
    let mut out = String::new();
    for length in lengths {
        let message = &mut message[..length];
        for i in 0..warm + round_trips {
            number = number.wrapping_add(1);
            if role == "b" {
                receive_message(&socket, number, message, &mut datagram)?;
                send_message(&socket, number, message, &mut datagram)?;
                continue;
            }
            let start = Instant::now();
            send_message(&socket, number, message, &mut datagram)?;
            receive_message(&socket, number, message, &mut datagram)?;
            if i >= warm {
                out += &format!("{length} {}\n", start.elapsed().as_nanos());
            }
        }
    }
    print!("{out}");
    Ok(())
}

/// Sends the first ping until it is delivered, again after each TARGET_PORT_CLOSED while the
/// responder opens its port (for 30 s at most); returns the answer's length if it came too.
fn first_ping(
    port: &mut Port,
    spare: &mut Vec<DmaBuffer>,
    to: NodeId,
    shape: Shape,
) -> Result<Option<usize>> {
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut answered = None;
    loop {
        send(port, spare, to, shape)?;
        loop {
            match port.blocking_receive()? {
                Event::Received {
                    buffer,
                    length,
                    size,
                    ..
                } => {
                    port.provide_receive_buffer(buffer, size, Priority::LOW, 0)
                        .map_err(|e| e.error)?;
                    answered = Some(length);
                }
                Event::Sent { buffer, status, .. } => {
                    spare.push(buffer);
                    if status == Status::SUCCESS {
                        return Ok(answered);
                    }
                    if status != Status::TARGET_PORT_CLOSED || Instant::now() > give_up {
                        return Err(format!("the first ping failed: {status:?}").into());
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
                other => return Err(format!("unexpected event {other:?}").into()),
            }
        }
    }
}

/// Waits for the next message, gives its buffer back at its size class, and returns its length.
fn await_message(port: &mut Port, spare: &mut Vec<DmaBuffer>) -> Result<usize> {
    loop {
        match port.blocking_receive()? {
            Event::Received {
                buffer,
                length,
                size,
                ..
            } => {
                port.provide_receive_buffer(buffer, size, Priority::LOW, 0)
                    .map_err(|e| e.error)?;
                return Ok(length);
            }
            Event::Sent { buffer, status, .. } if status == Status::SUCCESS => spare.push(buffer),
            other => return Err(format!("unexpected event {other:?}").into()),
        }
    }
}

/// Sends a `shape` message from the smallest spare buffer that holds its size class (a new one
/// of that class if none does).
fn send(port: &mut Port, spare: &mut Vec<DmaBuffer>, to: NodeId, shape: Shape) -> Result {
    let needed = max_length_for_size(shape.size) as usize;
    let fitting = spare
        .iter()
        .enumerate()
        .filter(|(_, buffer)| buffer.len() >= needed)
        .min_by_key(|(_, buffer)| buffer.len())
        .map(|(at, _)| at);
    let buffer = match fitting {
        Some(at) => spare.swap_remove(at),
        None => port.dma_alloc(needed)?,
    };
    // The peer's port has this one's number.
    let peer_port = port.port_id();
    port.send(
        buffer,
        shape.length,
        shape.size,
        Priority::LOW,
        to,
        peer_port,
        0,
    )
    .map_err(|e| e.error)?;
    Ok(())
}
