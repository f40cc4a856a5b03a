//! bench_armci: the three measurements of Saify, *Optimizing Collective Communication Operations
//! in ARMCI*, on the emulated NIC, each optimisation beside its baseline in one run
//! (`cargo xtask bench armci` builds and runs it, and draws the figure).
//!
//! - AllFence latency: every rank puts 8 bytes to each of the other ranks, then AllFence, timed;
//!   one request at a time in rank order (the baseline), K at a time in a shuffled order, and
//!   waiting for the NIC's completions with no request (thesis ch. 3, Figures 3.3-3.6).
//! - Barrier latency: every rank puts `--put-bytes` to each other rank and calls the barrier at
//!   once, timed; AllFence (one at a time, and K = 8) followed by the NIC's barrier, against the
//!   fused fence-and-barrier (ch. 4, Figure 4.3).
//! - Lock latency under contention: every rank takes and gives up mutex 0 of rank 0 in a loop,
//!   the two calls timed; ticket lock against MCS queue lock (ch. 5, Figures 5.4-5.5).
//!
//! - Put ping-pong (`--pingpong-csv`): two ranks, each power of two from 1 byte to
//!   `--pingpong-max` (1 MiB), rank 0 puts the bytes and a flag into rank 1 (ARMCI_Put_flag) and
//!   waits for its own flag, which rank 1 sets with the same put back; one way is half the round
//!   trip (the median). Beside it in the same job, GM's message path between a second port of
//!   each rank (send, wait for the RECEIVED event, the buffer provided again: what gm_send and
//!   gm_receive run on), at every size whose buffers fit the port's DMA arena.
//!
//! One emulator daemon in this process with a NIC per rank; the ranks are this program again, in
//! the role `NICBAR_ARMCI_BENCH_ROLE=rank`. Each figure is the mean over the ranks of each rank's
//! mean. Prints a table and writes a CSV (`measurement,nodes,variant,k,us`).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use armci::{Armci, BarrierMode, Config, FenceMode, LockMode};
use nicbar::{Event, NodeId, Port, PortId, Priority, Status};
use nicbar_emulator::{Emulator, EmulatorConfig};

const ROLE: &str = "NICBAR_ARMCI_BENCH_ROLE";

/// The fence variants: a name, the mode.
fn fence_variants(nodes: usize) -> Vec<(String, FenceMode, usize)> {
    let servers = nodes - 1;
    let mut variants = vec![("one at a time".to_owned(), FenceMode::Sequential, 1)];
    for k in [1, 2, 4, 7] {
        if k <= servers {
            variants.push((format!("K={k}"), FenceMode::Outstanding(k), k));
        }
    }
    variants.push(("NIC completions".to_owned(), FenceMode::Completions, 0));
    variants
}

/// The barrier variants.
fn barrier_variants() -> Vec<(String, FenceMode, BarrierMode)> {
    vec![
        (
            "AllFence (one at a time) + barrier".to_owned(),
            FenceMode::Sequential,
            BarrierMode::FenceThenBarrier,
        ),
        (
            "AllFence (K=8) + barrier".to_owned(),
            FenceMode::Outstanding(8),
            BarrierMode::FenceThenBarrier,
        ),
        (
            "fused fence-barrier".to_owned(),
            FenceMode::Outstanding(8),
            BarrierMode::Fused,
        ),
    ]
}

fn mean_us(total: Duration, count: usize) -> f64 {
    total.as_secs_f64() * 1e6 / count.max(1) as f64
}

/// One rank: every measurement, every variant, printing `result` lines.
fn rank(iterations: usize, put_bytes: usize) {
    let mut armci = Armci::init_with(Config::default()).unwrap();
    let (me, size) = (armci.rank(), armci.size());
    let bases = armci.malloc(8 * size + put_bytes * size).unwrap();
    let warmup = iterations / 10 + 1;
    let word = [me as u8; 8];

    for (name, fence, k) in fence_variants(size) {
        armci.set_config(Config {
            fence,
            ..Config::default()
        });
        armci.barrier().unwrap();
        let mut total = Duration::ZERO;
        for i in 0..warmup + iterations {
            for step in 1..size {
                let to = (me + step) % size;
                armci.put(&word, bases[to] + 8 * me as u64, to).unwrap();
            }
            let started = Instant::now();
            armci.all_fence().unwrap();
            if i >= warmup {
                total += started.elapsed();
            }
        }
        println!(
            "result allfence {size} {k} {:.2} {name}",
            mean_us(total, iterations)
        );
    }

    let payload = vec![me as u8; put_bytes];
    let region = 8 * size as u64;
    for (name, fence, barrier) in barrier_variants() {
        armci.set_config(Config {
            fence,
            barrier,
            ..Config::default()
        });
        armci.barrier().unwrap();
        let mut total = Duration::ZERO;
        for i in 0..warmup + iterations {
            for step in 1..size {
                let to = (me + step) % size;
                armci
                    .put(&payload, bases[to] + region + (put_bytes * me) as u64, to)
                    .unwrap();
            }
            let started = Instant::now();
            armci.barrier().unwrap();
            if i >= warmup {
                total += started.elapsed();
            }
        }
        println!(
            "result barrier {size} 0 {:.2} {name}",
            mean_us(total, iterations)
        );
    }

    for (name, lock) in [
        ("ticket lock", LockMode::Ticket),
        ("MCS queue lock", LockMode::Mcs),
    ] {
        armci.barrier().unwrap();
        armci.set_config(Config {
            lock,
            ..Config::default()
        });
        armci.create_mutexes(1).unwrap();
        let (mut locking, mut unlocking) = (Duration::ZERO, Duration::ZERO);
        for i in 0..warmup + iterations {
            let started = Instant::now();
            armci.lock(0, 0).unwrap();
            let locked = Instant::now();
            armci.unlock(0, 0).unwrap();
            if i >= warmup {
                locking += locked - started;
                unlocking += locked.elapsed();
            }
        }
        armci.destroy_mutexes().unwrap();
        println!(
            "result lock {size} 0 {:.2} {name}",
            mean_us(locking, iterations)
        );
        println!(
            "result unlock {size} 0 {:.2} {name}",
            mean_us(unlocking, iterations)
        );
    }
    armci.finalize().unwrap();
}

/// Where the ping-pong's flag and bytes lie in each rank's allocation.
const FLAG: u64 = 0;
const PEER_PORT: u64 = 8;
const DATA: u64 = 64;
/// How long one round trip may take before the benchmark gives up.
const ROUND_TRIP_LIMIT: Duration = Duration::from_secs(30);

/// Each power of two from 1 to `max`.
fn pingpong_sizes(max: usize) -> Vec<usize> {
    std::iter::successors(Some(1usize), |&s| s.checked_mul(2))
        .take_while(|&s| s <= max)
        .collect()
}

/// Round trips at `size`: `iterations` up to 4 KiB, fewer above (at least 10).
fn round_trips(iterations: usize, size: usize) -> usize {
    (iterations * 4096 / size.max(4096)).max(10)
}

fn median_us(samples: &mut [Duration]) -> f64 {
    samples.sort();
    samples
        .get(samples.len() / 2)
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
}

/// The `int` flag at the start of this rank's allocation.
fn flag(armci: &Armci, base: u64) -> i32 {
    let mut word = [0u8; 4];
    if let Some(bytes) = armci.local_memory(base) {
        bytes.read(FLAG as usize, &mut word);
    }
    i32::from_ne_bytes(word)
}

/// Waits (by the clock) until this rank's flag is `value`.
fn wait_flag(armci: &Armci, base: u64, value: i32) {
    let deadline = Instant::now() + ROUND_TRIP_LIMIT;
    while flag(armci, base) != value {
        assert!(
            Instant::now() < deadline,
            "no flag {value} in {ROUND_TRIP_LIMIT:?}"
        );
        std::thread::yield_now();
    }
}

/// One rank of the ping-pong job (two ranks): the put ping-pong, then the message one; prints
/// `pingpong SERIES BYTES ONE_WAY_US` lines (rank 0) and `skipped` lines for sizes that do not
/// fit.
fn pingpong(iterations: usize, max: usize) {
    let mut armci = Armci::init_with(Config::default()).unwrap();
    let me = armci.rank();
    assert_eq!(armci.size(), 2, "the ping-pong runs on two ranks");
    let peer = 1 - me;
    let bases = armci.malloc(DATA as usize + max).unwrap();
    let payload: Vec<u8> = (0..max).map(|i| (i * 7 + me) as u8).collect();
    let mut value = 0i32;
    for size in pingpong_sizes(max) {
        let trips = round_trips(iterations, size);
        let warmup = trips / 10 + 1;
        let mut samples = Vec::with_capacity(trips);
        armci.barrier().unwrap();
        for i in 0..warmup + trips {
            value += 1;
            let started = Instant::now();
            if me == 0 {
                armci
                    .put_flag(
                        &payload[..size],
                        bases[peer] + DATA,
                        bases[peer],
                        value,
                        peer,
                    )
                    .unwrap();
                wait_flag(&armci, bases[me], value);
            } else {
                wait_flag(&armci, bases[me], value);
                armci
                    .put_flag(
                        &payload[..size],
                        bases[peer] + DATA,
                        bases[peer],
                        value,
                        peer,
                    )
                    .unwrap();
            }
            if i >= warmup {
                samples.push(started.elapsed() / 2);
            }
        }
        if me == 0 {
            println!(
                "pingpong ARMCI_Put_flag {size} {:.3}",
                median_us(&mut samples)
            );
        }
    }

    // GM's message path between a second port of each rank.
    let socket = std::env::var_os("NICBAR_SOCKET").map(std::path::PathBuf::from);
    let unit: u8 = std::env::var("NICBAR_ARMCI_UNIT").unwrap().parse().unwrap();
    let mut port = armci::launch::open_free_port(socket.as_deref(), unit).unwrap();
    let mine = [
        u32::from(port.node_id().get()).to_le_bytes().as_slice(),
        &[port.port_id().0],
    ]
    .concat();
    armci.put(&mine, bases[peer] + PEER_PORT, peer).unwrap();
    armci.barrier().unwrap();
    let mut theirs = [0u8; 8];
    armci
        .local_memory(bases[me])
        .unwrap()
        .read(PEER_PORT as usize, &mut theirs);
    let node = NodeId::new(u16::from_le_bytes([theirs[0], theirs[1]]));
    let target = PortId(theirs[4]);
    for size in pingpong_sizes(max) {
        let class = nicbar::min_size_for_length(size as u32).unwrap();
        let buffers = port
            .dma_alloc(1 << class)
            .and_then(|receive| Ok((receive, port.dma_alloc(size)?)));
        // Every rank must agree to run the size: both buffers fit on both sides.
        let fits = buffers.is_ok();
        let mut agreed = [u8::from(fits)];
        armci
            .put(&agreed, bases[peer] + PEER_PORT + 7, peer)
            .unwrap();
        armci.barrier().unwrap();
        let mut other = [0u8];
        armci
            .local_memory(bases[me])
            .unwrap()
            .read((PEER_PORT + 7) as usize, &mut other);
        agreed[0] &= other[0];
        let Ok((receive, send)) = buffers else {
            if me == 0 {
                println!(
                    "skipped GM messages {size}: a {}-byte buffer of size class {class} and the message do not fit the port's DMA arena",
                    1usize << class
                );
            }
            armci.barrier().unwrap();
            continue;
        };
        if agreed[0] == 0 {
            armci.barrier().unwrap();
            continue;
        }
        port.provide_receive_buffer(receive, class, Priority::LOW, 0)
            .map_err(|e| e.error)
            .unwrap();
        let mut send = Some(send);
        armci.barrier().unwrap();
        let trips = round_trips(iterations, size);
        let warmup = trips / 10 + 1;
        let mut samples = Vec::with_capacity(trips);
        let mut last = None;
        for i in 0..warmup + trips {
            let started = Instant::now();
            send = Some(exchange(
                &mut port,
                send.take().unwrap(),
                size,
                class,
                (node, target),
                me == 0,
                i + 1 == warmup + trips,
                &mut last,
            ));
            if i >= warmup {
                samples.push(started.elapsed() / 2);
            }
        }
        // Both ranks are done with the size before its buffers go.
        armci.barrier().unwrap();
        drop(last);
        drop(send);
        if me == 0 {
            println!("pingpong GM messages {size} {:.3}", median_us(&mut samples));
        }
    }
    port.close().unwrap();
    armci.finalize().unwrap();
}

/// One round trip of the message ping-pong: the first rank sends then waits for the reply, the
/// other waits then replies. A received buffer goes back to the NIC at once (before this rank
/// replies or sends again), except in the last round, where it is kept in `last`. Returns the
/// send buffer once its SENT event gave it back.
#[allow(clippy::too_many_arguments, reason = "one round trip's whole state")]
fn exchange(
    port: &mut Port,
    send: nicbar::DmaBuffer,
    size: usize,
    class: u8,
    (node, target): (NodeId, PortId),
    first: bool,
    last_round: bool,
    last: &mut Option<nicbar::DmaBuffer>,
) -> nicbar::DmaBuffer {
    let deadline = Instant::now() + ROUND_TRIP_LIMIT;
    let mut sent = None;
    let mut received = false;
    let mut posted = false;
    let mut pending = Some(send);
    loop {
        if !posted && (first || received) {
            port.send(
                pending.take().unwrap(),
                size,
                class,
                Priority::LOW,
                node,
                target,
                0,
            )
            .map_err(|e| e.error)
            .unwrap();
            posted = true;
        }
        if posted
            && received
            && let Some(buffer) = sent.take()
        {
            return buffer;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match port.receive_timeout(left).unwrap() {
            Some(Event::Received {
                buffer,
                status,
                length,
                ..
            }) => {
                assert_eq!((status, length), (Status::SUCCESS, size));
                if last_round {
                    *last = Some(buffer);
                } else {
                    port.provide_receive_buffer(buffer, class, Priority::LOW, 0)
                        .map_err(|e| e.error)
                        .unwrap();
                }
                received = true;
            }
            Some(Event::Sent { buffer, status, .. }) => {
                assert_eq!(
                    status,
                    Status::SUCCESS,
                    "a {size}-byte message to {node:?} {target:?}"
                );
                sent = Some(buffer);
            }
            Some(other) => eprintln!("pingpong: an event aside: {other:?}"),
            None => panic!("no event in {ROUND_TRIP_LIMIT:?}"),
        }
    }
}

/// A measurement: (measurement, nodes, k, variant) -> the ranks' figures.
type Results = Vec<((String, usize, usize, String), Vec<f64>)>;

/// Runs `size` ranks of this program in `role` against a fresh emulator; returns their
/// standard outputs.
fn spawn_job(size: usize, role: &str) -> Vec<String> {
    let dir =
        std::env::temp_dir().join(format!("nicbar-bench-armci-{}-{size}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let daemon = Emulator::spawn(EmulatorConfig::in_process(
        dir.join("control.sock"),
        size as u16,
    ))
    .unwrap();
    let children: Vec<_> = (0..size)
        .map(|rank| {
            Command::new(std::env::current_exe().unwrap())
                .args(std::env::args().skip(1))
                .env(ROLE, role)
                .env("NICBAR_SOCKET", daemon.socket())
                .env("NICBAR_ARMCI_RANK", rank.to_string())
                .env("NICBAR_ARMCI_SIZE", size.to_string())
                .env("NICBAR_ARMCI_UNIT", rank.to_string())
                .env("NICBAR_ARMCI_DIR", dir.join("rendezvous"))
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outputs = Vec::new();
    for mut child in children {
        let mut output = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut output)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "a rank of {size} failed: {status}\n{output}"
        );
        outputs.push(output);
    }
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
    outputs
}

/// Runs Saify's measurements on `size` ranks into `results`.
fn run_job(size: usize, results: &mut Results) {
    for output in spawn_job(size, "rank") {
        for line in output.lines() {
            let Some(rest) = line.find("result ").map(|at| &line[at + 7..]) else {
                continue;
            };
            let words: Vec<&str> = rest.splitn(5, ' ').collect();
            let [measurement, nodes, k, us, variant] = words[..] else {
                continue;
            };
            let key = (
                measurement.to_owned(),
                nodes.parse().unwrap(),
                k.parse().unwrap(),
                variant.to_owned(),
            );
            let us: f64 = us.parse().unwrap();
            match results.iter_mut().find(|(k, _)| *k == key) {
                Some((_, values)) => values.push(us),
                None => results.push((key, vec![us])),
            }
        }
    }
}

/// Runs the ping-pong job and writes its CSV (`series,bytes,one_way_us,bandwidth_mb_s`).
fn run_pingpong(csv: &str) {
    let outputs = spawn_job(2, "pingpong");
    let mut text = String::from("series,bytes,one_way_us,bandwidth_mb_s\n");
    println!(
        "{:<16} {:>8} {:>12} {:>12}",
        "series", "bytes", "one way µs", "MB/s"
    );
    for line in outputs.iter().flat_map(|o| o.lines()) {
        if line.starts_with("skipped ") {
            println!("{line}");
            continue;
        }
        let Some(rest) = line.strip_prefix("pingpong ") else {
            continue;
        };
        let words: Vec<&str> = rest.rsplitn(3, ' ').collect();
        let [us, bytes, series] = words[..] else {
            continue;
        };
        let (us, bytes): (f64, f64) = (us.parse().unwrap(), bytes.parse().unwrap());
        let mb_s = bytes / us;
        println!("{series:<16} {bytes:>8} {us:>12.2} {mb_s:>12.1}");
        text.push_str(&format!("{series},{bytes},{us:.3},{mb_s:.3}\n"));
    }
    std::fs::write(csv, text).unwrap();
    eprintln!("wrote {csv}");
}

fn main() {
    let mut sizes = vec![2, 4, 8];
    let mut iterations = 300;
    let mut put_bytes = 100;
    let mut csv = None;
    let (mut pingpong_csv, mut pingpong_max, mut pingpong_iterations) = (None, 1 << 20, 200);
    let mut only_pingpong = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().expect("a value after the option");
        match arg.as_str() {
            "--sizes" => sizes = value().split(',').map(|s| s.parse().unwrap()).collect(),
            "--iterations" => iterations = value().parse().unwrap(),
            "--put-bytes" => put_bytes = value().parse().unwrap(),
            "--csv" => csv = Some(value()),
            "--pingpong-csv" => pingpong_csv = Some(value()),
            "--pingpong-max" => pingpong_max = value().parse().unwrap(),
            "--pingpong-iterations" => pingpong_iterations = value().parse().unwrap(),
            "--only-pingpong" => only_pingpong = true,
            other => panic!("unknown option {other}"),
        }
    }
    match std::env::var(ROLE).as_deref() {
        Ok("pingpong") => return pingpong(pingpong_iterations, pingpong_max),
        Ok(_) => return rank(iterations, put_bytes),
        Err(_) => {}
    }
    if let Some(path) = &pingpong_csv {
        eprintln!("bench armci: put ping-pong and GM messages, 1 byte to {pingpong_max} bytes");
        run_pingpong(path);
    }
    if only_pingpong {
        return;
    }
    let mut results = Results::new();
    for &size in &sizes {
        eprintln!("bench armci: {size} ranks, {iterations} iterations");
        run_job(size, &mut results);
    }
    let mut text = String::from("measurement,nodes,variant,k,us\n");
    println!(
        "{:<10} {:>5}  {:<36} {:>10}",
        "measure", "nodes", "variant", "mean µs"
    );
    for ((measurement, nodes, k, variant), values) in &results {
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        println!("{measurement:<10} {nodes:>5}  {variant:<36} {mean:>10.1}");
        text.push_str(&format!("{measurement},{nodes},{variant},{k},{mean:.2}\n"));
    }
    // The factors the thesis reports, at the largest size.
    if let Some(&largest) = sizes.iter().max() {
        let find = |m: &str, v: &str| {
            results
                .iter()
                .find(|((mm, n, _, vv), _)| mm == m && *n == largest && vv == v)
                .map(|(_, values)| values.iter().sum::<f64>() / values.len() as f64)
        };
        if let Some(base) = find("allfence", "one at a time") {
            let best = results
                .iter()
                .filter(|((m, n, _, v), _)| m == "allfence" && *n == largest && v.starts_with("K="))
                .map(|(_, values)| values.iter().sum::<f64>() / values.len() as f64)
                .fold(f64::INFINITY, f64::min);
            println!(
                "AllFence at {largest} nodes: best K {:.2}x the one-at-a-time baseline",
                base / best
            );
        }
        if let (Some(base), Some(fused)) = (
            find("barrier", "AllFence (one at a time) + barrier"),
            find("barrier", "fused fence-barrier"),
        ) {
            println!(
                "barrier at {largest} nodes: fused {:.2}x AllFence + barrier",
                base / fused
            );
        }
        if let (Some(t), Some(m)) = (find("lock", "ticket lock"), find("lock", "MCS queue lock")) {
            println!("lock at {largest} nodes: MCS {:.2}x the ticket lock", t / m);
        }
    }
    if let Some(path) = csv {
        std::fs::write(&path, text).unwrap();
        eprintln!("wrote {path}");
    }
}
