//! bench_fastpath: the two measurements of Liu et al., *High Performance RDMA-Based MPI
//! Implementation over InfiniBand* (the fast path), and Li et al., *Efficient and Truly Passive
//! MPI-3 RMA Using InfiniBand Atomics* (the locks), on the emulated NIC, each beside its baselines
//! in one run, in interleaved rounds (`cargo xtask bench fastpath` builds and runs it, and draws
//! the figure).
//!
//! - One-way small-message latency by ping-pong between two processes, for each message length:
//!   the RDMA-write eager fast path (`FastPath::send`), the ordinary send/receive path through the
//!   same library (`FastPath::send_ordinary_path`), and a raw UDP ping-pong on loopback. Each
//!   round measures every length and path once, the paths in a rotating order.
//! - Lock acquire + release latency, a client process taking a lock hosted by a target process
//!   that is busy computing: the passive lock on NIC atomics (the target never calls the
//!   library), against the lock the target's process serves, with the target calling the library
//!   between compute chunks of `--compute-us`, and polling it continuously.
//!
//! Every figure is the median over the rounds of each round's median (and the same of the 99th
//! percentile). The NIC (the emulator) runs in this process; the two sides are this program
//! again (`--child ...`). Prints a table and writes a CSV
//! (`measurement,variant,bytes,p50_us,p99_us`).

use std::io::{BufRead, BufReader, Write};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use nicbar::{FastPath, FastPathConfig, LockMode, NodeId, Port, PortId, Route, WaitMode};
use nicbar_emulator::{Emulator, EmulatorConfig};
use nicbar_system::{cores, cpu_model, free_udp_port, median, scratch_dir};

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

const HELP: &str = "\
bench_fastpath: one-way latency of the RDMA-write eager fast path against the ordinary path and
raw UDP, and passive against served lock latency with the target computing (Liu et al.; Li et al.).

usage: bench_fastpath [--rounds N] [--round-trips N] [--sizes A,B,..] [--lock-pairs N]
                      [--compute-us N] [--csv FILE]
";

/// The ping-pong paths, in the order of the first round.
const PATHS: [&str; 3] = ["fast path", "ordinary path", "raw UDP"];
/// The lock variants, in the order of the first round.
const LOCKS: [&str; 3] = [
    "passive",
    "served (target polls between chunks)",
    "served (target polls)",
];
/// The lock target's mode while the ping-pongs run: resting, off the cores.
const IDLE: u8 = 3;

struct Options {
    rounds: usize,
    round_trips: usize,
    sizes: Vec<usize>,
    lock_pairs: usize,
    compute_us: u64,
    csv: Option<PathBuf>,
}

fn main() -> Result {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child(&args[1..]);
    }
    let mut options = Options {
        rounds: 5,
        round_trips: 2000,
        sizes: vec![8, 64, 256, 1024, 4072],
        lock_pairs: 500,
        compute_us: 200,
        csv: None,
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let mut value = || rest.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--rounds" => options.rounds = value()?.parse()?,
            "--round-trips" => options.round_trips = value()?.parse()?,
            "--sizes" => {
                options.sizes = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--lock-pairs" => options.lock_pairs = value()?.parse()?,
            "--compute-us" => options.compute_us = value()?.parse()?,
            "--csv" => options.csv = Some(value()?.into()),
            "--help" | "-h" => {
                print!("{HELP}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}; see --help").into()),
        }
    }
    if let Some(&too_long) = options
        .sizes
        .iter()
        .find(|&&s| s > nicbar::fastpath::MAX_MESSAGE)
    {
        return Err(format!(
            "{too_long} bytes: the ordinary path carries at most {}",
            nicbar::fastpath::MAX_MESSAGE
        )
        .into());
    }
    orchestrate(&options)
}

/// A child process of this program, talking in lines.
struct Side {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Side {
    fn spawn(args: &[String]) -> Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("--child")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    fn say(&mut self, line: &str) -> Result {
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        Ok(())
    }

    /// The next line that starts with `prefix`, without it.
    fn expect(&mut self, prefix: &str) -> Result<String> {
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line)? == 0 {
                return Err(format!("a benchmark process ended before `{prefix}`").into());
            }
            if let Some(rest) = line.trim().strip_prefix(prefix) {
                return Ok(rest.trim().to_owned());
            }
        }
    }

    fn finish(mut self) -> Result {
        let _ = self.say("exit");
        let status = self.child.wait()?;
        if !status.success() {
            return Err(format!("a benchmark process failed: {status}").into());
        }
        Ok(())
    }
}

/// (measurement, variant, bytes) -> each round's (p50, p99) in µs.
type Results = Vec<((String, String, usize), Vec<(f64, f64)>)>;

fn record(results: &mut Results, key: (String, String, usize), p50: f64, p99: f64) {
    match results.iter_mut().find(|(k, _)| *k == key) {
        Some((_, values)) => values.push((p50, p99)),
        None => results.push((key, vec![(p50, p99)])),
    }
}

fn orchestrate(options: &Options) -> Result {
    println!("machine: {} cores, {}", cores(), cpu_model());
    println!(
        "{} rounds; {} round trips per length and path per round; {} lock+unlock pairs per variant per round; target compute chunk {} µs",
        options.rounds, options.round_trips, options.lock_pairs, options.compute_us
    );
    let dir = scratch_dir("bench-fastpath")?;
    let socket = dir.join("control.sock");
    let daemon = Emulator::spawn(EmulatorConfig::in_process(&socket, 4))?;
    let s = socket.display().to_string();
    let udp = free_udp_port("127.0.0.1")?.to_string();
    let sizes: Vec<String> = options.sizes.iter().map(usize::to_string).collect();
    let sizes = sizes.join(",");
    let trips = options.round_trips.to_string();
    let mut a = Side::spawn(&[
        "pp".into(),
        "a".into(),
        s.clone(),
        "0".into(),
        "1".into(),
        udp.clone(),
        sizes.clone(),
        trips.clone(),
    ])?;
    let mut b = Side::spawn(&[
        "pp".into(),
        "b".into(),
        s.clone(),
        "1".into(),
        "0".into(),
        udp,
        sizes,
        trips,
    ])?;
    let mut target = Side::spawn(&[
        "target".into(),
        s.clone(),
        "2".into(),
        "3".into(),
        options.compute_us.to_string(),
    ])?;
    let mut client = Side::spawn(&[
        "client".into(),
        s.clone(),
        "3".into(),
        "2".into(),
        options.lock_pairs.to_string(),
    ])?;
    a.expect("ready")?;
    b.expect("ready")?;
    target.expect("ready")?;
    client.expect("ready")?;

    let mut results = Results::new();
    for round in 0..options.rounds {
        eprintln!("round {}/{}", round + 1, options.rounds);
        for &bytes in &options.sizes {
            for step in 0..PATHS.len() {
                let path = (round + step) % PATHS.len();
                b.say(&format!("serve {path} {bytes}"))?;
                a.say(&format!("measure {path} {bytes}"))?;
                let line = a.expect("result")?;
                b.expect("served")?;
                let (p50, p99) = pair(&line)?;
                record(
                    &mut results,
                    ("latency".into(), PATHS[path].into(), bytes),
                    p50,
                    p99,
                );
            }
        }
        for step in 0..LOCKS.len() {
            let variant = (round + step) % LOCKS.len();
            target.say(&format!("mode {variant}"))?;
            target.expect("mode")?;
            client.say(&format!("lock {variant}"))?;
            let line = client.expect("result")?;
            let (p50, p99) = pair(&line)?;
            record(
                &mut results,
                ("lock".into(), LOCKS[variant].into(), 0),
                p50,
                p99,
            );
        }
        // The target rests while the next round's ping-pongs run.
        target.say(&format!("mode {IDLE}"))?;
        target.expect("mode")?;
    }
    target.say("mode 9")?;
    for side in [a, b, client, target] {
        side.finish()?;
    }
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);

    let mut text = String::from("measurement,variant,bytes,p50_us,p99_us\n");
    println!(
        "\n{:<8} {:<38} {:>6} {:>10} {:>10}",
        "measure", "variant", "bytes", "p50 µs", "p99 µs"
    );
    let mut summary: Vec<(String, String, usize, f64)> = Vec::new();
    for ((measurement, variant, bytes), values) in &results {
        let mut p50s: Vec<f64> = values.iter().map(|v| v.0).collect();
        let mut p99s: Vec<f64> = values.iter().map(|v| v.1).collect();
        let (p50, p99) = (
            median(&mut p50s).unwrap_or(f64::NAN),
            median(&mut p99s).unwrap_or(f64::NAN),
        );
        println!("{measurement:<8} {variant:<38} {bytes:>6} {p50:>10.2} {p99:>10.2}");
        text.push_str(&format!(
            "{measurement},{variant},{bytes},{p50:.3},{p99:.3}\n"
        ));
        summary.push((measurement.clone(), variant.clone(), *bytes, p50));
    }
    let find = |m: &str, v: &str, b: usize| {
        summary
            .iter()
            .find(|s| s.0 == m && s.1 == v && s.2 == b)
            .map(|s| s.3)
    };
    for &bytes in &options.sizes {
        if let (Some(fast), Some(ordinary)) = (
            find("latency", PATHS[0], bytes),
            find("latency", PATHS[1], bytes),
        ) {
            println!(
                "{bytes} bytes: the fast path {:.2}x the ordinary path's latency",
                ordinary / fast
            );
        }
    }
    if let (Some(passive), Some(served)) = (find("lock", LOCKS[0], 0), find("lock", LOCKS[1], 0)) {
        println!(
            "lock + unlock with the target computing: passive {:.2}x served (polls every {} µs)",
            served / passive,
            options.compute_us
        );
    }
    if let Some(path) = &options.csv {
        std::fs::write(path, text)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn pair(line: &str) -> Result<(f64, f64)> {
    let mut words = line.split_whitespace();
    let p50 = words.next().ok_or("no p50")?.parse()?;
    let p99 = words.next().ok_or("no p99")?.parse()?;
    Ok((p50, p99))
}

/// Median and 99th percentile of `ns` (nanoseconds), in µs, as a `result` line's words.
fn summarise(ns: &mut [f64], halve: bool) -> String {
    ns.sort_by(f64::total_cmp);
    let scale = if halve { 2000.0 } else { 1000.0 };
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize] / scale;
    format!("{:.3} {:.3}", at(0.5), at(0.99))
}

fn open(
    socket: &str,
    unit: &str,
    peer: &str,
    slot_payload: usize,
) -> Result<(FastPath, nicbar::PeerId)> {
    let mut port = Port::open_at(Path::new(socket), unit.parse()?, 1)?;
    port.set_wait_mode(WaitMode::Spin);
    let mut fast = FastPath::new(
        port,
        FastPathConfig {
            slot_payload,
            ..FastPathConfig::default()
        },
    )?;
    let peer = fast.connect(NodeId::new(peer.parse()?), PortId(1))?;
    fast.wait_connected()?;
    Ok((fast, peer))
}

fn hear() -> Result<String> {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(line.trim().to_owned())
}

fn say(line: &str) -> Result {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

fn child(args: &[String]) -> Result {
    let arg = |i: usize| {
        args.get(i)
            .map(String::as_str)
            .ok_or("missing child argument")
    };
    match arg(0)? {
        "pp" => ping_pong(
            arg(1)?,
            arg(2)?,
            arg(3)?,
            arg(4)?,
            arg(5)?.parse()?,
            arg(7)?.parse()?,
        ),
        "target" => lock_target(arg(1)?, arg(2)?, arg(3)?, arg(4)?.parse()?),
        "client" => lock_client(arg(1)?, arg(2)?, arg(3)?, arg(4)?.parse()?),
        other => Err(format!("unknown child {other:?}").into()),
    }
}

/// Waits for the next message from the fast path (either route), spinning.
fn next(fast: &mut FastPath) -> Result<nicbar::Message> {
    fast.receive_timeout(Duration::from_secs(30))?
        .ok_or_else(|| "no message within 30 s".into())
}

/// One side of the ping-pongs: `a` measures, `b` answers, each batch on command.
fn ping_pong(
    role: &str,
    socket: &str,
    unit: &str,
    peer: &str,
    udp_port: u16,
    trips: usize,
) -> Result {
    let (mut fast, peer) = open(socket, unit, peer, nicbar::fastpath::MAX_MESSAGE)?;
    let udp = if role == "b" {
        UdpSocket::bind(("127.0.0.1", udp_port))?
    } else {
        let socket = UdpSocket::bind("127.0.0.1:0")?;
        socket.connect(("127.0.0.1", udp_port))?;
        socket
    };
    udp.set_read_timeout(Some(Duration::from_secs(30)))?;
    say("ready")?;
    let warm = trips / 10 + 1;
    let mut buffer = vec![0u8; 65_536];
    loop {
        let line = hear()?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let (path, bytes): (usize, usize) = match words.as_slice() {
            ["serve" | "measure", path, bytes] => (path.parse()?, bytes.parse()?),
            _ => break,
        };
        let data = vec![0x5a; bytes];
        let mut ns = Vec::with_capacity(trips);
        for i in 0..warm + trips {
            let started = Instant::now();
            match (role, path) {
                ("a", 0 | 1) => {
                    if path == 0 {
                        fast.send(peer, &data)?;
                    } else {
                        fast.send_ordinary_path(peer, &data)?;
                    }
                    let got = next(&mut fast)?;
                    if got.data.len() != bytes {
                        return Err("a reply of the wrong length".into());
                    }
                }
                ("b", 0 | 1) => {
                    let got = next(&mut fast)?;
                    if got.route == Route::Fast || path == 0 {
                        fast.send(peer, &got.data)?;
                    } else {
                        fast.send_ordinary_path(peer, &got.data)?;
                    }
                }
                ("a", _) => {
                    udp.send(&data)?;
                    let n = udp.recv(&mut buffer)?;
                    if n != bytes {
                        return Err("a UDP reply of the wrong length".into());
                    }
                }
                _ => {
                    let (n, from) = udp.recv_from(&mut buffer)?;
                    udp.send_to(&buffer[..n], from)?;
                }
            }
            if i >= warm {
                ns.push(started.elapsed().as_nanos() as f64);
            }
        }
        if role == "a" {
            say(&format!("result {}", summarise(&mut ns, true)))?;
        } else {
            say("served")?;
        }
    }
    fast.flush()?;
    Ok(())
}

/// The lock's host: computes, and in the served modes calls the library between chunks of
/// `compute_us` (mode 1) or continuously (mode 2); in mode 0 (passive) it never calls it; in
/// mode [`IDLE`] it rests (checking its mode every millisecond), so the ping-pongs have the cores.
fn lock_target(socket: &str, unit: &str, peer: &str, compute_us: u64) -> Result {
    let (mut fast, _) = open(socket, unit, peer, 64)?;
    let mode = Arc::new(AtomicU8::new(IDLE));
    let setter = Arc::clone(&mode);
    std::thread::spawn(move || {
        while let Ok(line) = hear() {
            let value: u8 = line
                .strip_prefix("mode ")
                .and_then(|m| m.parse().ok())
                .unwrap_or(9);
            setter.store(value, Ordering::Release);
            let _ = say("mode");
            if value == 9 {
                break;
            }
        }
    });
    say("ready")?;
    let mut work = 0u64;
    let chunk = Duration::from_micros(compute_us);
    loop {
        match mode.load(Ordering::Acquire) {
            0 => {
                let until = Instant::now() + chunk;
                while Instant::now() < until {
                    for i in 0..1000u64 {
                        work = std::hint::black_box(work.wrapping_mul(31).wrapping_add(i));
                    }
                }
            }
            1 => {
                let until = Instant::now() + chunk;
                while Instant::now() < until {
                    for i in 0..1000u64 {
                        work = std::hint::black_box(work.wrapping_mul(31).wrapping_add(i));
                    }
                }
                fast.poll()?;
            }
            2 => {
                fast.poll()?;
            }
            IDLE => std::thread::sleep(Duration::from_millis(1)),
            _ => break,
        }
    }
    std::hint::black_box(work);
    Ok(())
}

/// The lock's client: `lock V` takes and gives up lock 0 of the target `pairs` times as variant
/// V says, timing each pair.
fn lock_client(socket: &str, unit: &str, peer: &str, pairs: usize) -> Result {
    let (mut fast, target) = open(socket, unit, peer, 64)?;
    // The client sleeps while it waits for completions: the target computes on one core.
    fast.port_mut().set_wait_mode(WaitMode::Sleep);
    say("ready")?;
    let warm = pairs / 10 + 1;
    loop {
        let line = hear()?;
        let Some(variant) = line.strip_prefix("lock ") else {
            break;
        };
        let mode = if variant == "0" {
            LockMode::Passive
        } else {
            LockMode::Served
        };
        let mut ns = Vec::with_capacity(pairs);
        for i in 0..warm + pairs {
            let started = Instant::now();
            fast.lock(target, 0, mode)?;
            fast.unlock(target, 0, mode)?;
            if i >= warm {
                ns.push(started.elapsed().as_nanos() as f64);
            }
        }
        // The last release reaches the target before the next variant starts.
        fast.flush()?;
        say(&format!("result {}", summarise(&mut ns, false)))?;
    }
    Ok(())
}
