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
//! One emulator daemon in this process with a NIC per rank; the ranks are this program again, in
//! the role `NICBAR_ARMCI_BENCH_ROLE=rank`. Each figure is the mean over the ranks of each rank's
//! mean. Prints a table and writes a CSV (`measurement,nodes,variant,k,us`).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use armci::{Armci, BarrierMode, Config, FenceMode, LockMode};
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

/// A measurement: (measurement, nodes, k, variant) -> the ranks' figures.
type Results = Vec<((String, usize, usize, String), Vec<f64>)>;

fn run_job(size: usize, results: &mut Results) {
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
                .env(ROLE, "rank")
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
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let mut sizes = vec![2, 4, 8];
    let mut iterations = 300;
    let mut put_bytes = 100;
    let mut csv = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().expect("a value after the option");
        match arg.as_str() {
            "--sizes" => sizes = value().split(',').map(|s| s.parse().unwrap()).collect(),
            "--iterations" => iterations = value().parse().unwrap(),
            "--put-bytes" => put_bytes = value().parse().unwrap(),
            "--csv" => csv = Some(value()),
            other => panic!("unknown option {other}"),
        }
    }
    if std::env::var(ROLE).is_ok() {
        rank(iterations, put_bytes);
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
