//! The NIC's 8-byte allreduce against the NIC barrier it is built on, side by side in one run:
//! at each size, `N` members (threads of this process, each with its own port on its own NIC of
//! one in-process daemon) run back-to-back barriers (pairwise exchange, the allreduce's own
//! schedule), back-to-back allreduces of one `f64` sum and as many reproducible sums of one
//! `f64` (whose packets carry 32-byte accumulators), taking turns over several rounds; the table
//! gives each one's median over the rounds of the mean time per operation at member 0, and the
//! ratios.
//!
//! `cargo run --release -p nicbar-system --example bench_nic_allreduce -- --help` lists the
//! options. The members sleep on their doorbells while they wait, so on a host with fewer cores
//! than members and NIC threads the figures are the scheduler's as much as the NIC's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nicbar::{
    Algorithm, BarrierOptions, Group, Member, NodeId, Port, PortId, ReduceOp, ReduceSpec,
    ReduceType, WaitMode,
};
use nicbar_emulator::{Emulator, EmulatorConfig};
use nicbar_system::{cores, cpu_model, median, scratch_dir};

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const HELP: &str = "\
bench_nic_allreduce: the NIC's 8-byte allreduce (an ordinary and a reproducible sum) against
the NIC barrier (pairwise exchange, the allreduce's schedule) on the emulated NIC, members as
threads of one process, one NIC each.

usage: bench_nic_allreduce [--sizes 2,4,8] [--operations K] [--rounds R]

  --sizes LIST      member counts (default 2,4,8)
  --operations K    timed operations of each kind per round, after K/10 to warm up
                    (default 2000)
  --rounds R        rounds, each timing barriers, sums and reproducible sums (default 3)
";

fn main() -> Result {
    let mut sizes = vec![2usize, 4, 8];
    let mut operations = 2000usize;
    let mut rounds = 3usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--sizes" => {
                sizes = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<std::result::Result<_, _>>()?;
            }
            "--operations" => operations = value()?.parse()?,
            "--rounds" => rounds = value()?.parse()?,
            "--help" | "-h" => {
                print!("{HELP}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}; see --help").into()),
        }
    }
    if sizes.iter().any(|&n| !(2..=256).contains(&n)) || operations == 0 || rounds == 0 {
        return Err("sizes are 2 to 256 members; operations and rounds at least 1".into());
    }
    println!(
        "machine: {} cores, {}; {rounds} rounds of {operations} operations; members sleep while they wait",
        cores(),
        cpu_model()
    );
    println!(
        "| members | NIC barrier µs | NIC allreduce, 8 B, µs | allreduce / barrier | reproducible sum µs | reproducible / allreduce |"
    );
    println!("|---|---|---|---|---|---|");
    for n in sizes {
        let [barrier, allreduce, reproducible] = measure(n, operations, rounds)?;
        println!(
            "| {n} | {barrier:.1} | {allreduce:.1} | {:.2} | {reproducible:.1} | {:.2} |",
            allreduce / barrier,
            reproducible / allreduce
        );
    }
    Ok(())
}

/// The medians over `rounds` of member 0's mean barrier, sum and reproducible sum times, in µs.
fn measure(n: usize, operations: usize, rounds: usize) -> Result<[f64; 3]> {
    let dir = scratch_dir("bench-nic-allreduce")?;
    let daemon = Emulator::spawn(EmulatorConfig::in_process(
        dir.join("control.sock"),
        n as u16,
    ))?;
    let members: Vec<Member> = (0..n)
        .map(|node| Member::new(NodeId::new(node as u16), PortId(1)))
        .collect();
    let group = Group::new(members)?.with_timeout(Duration::from_secs(60));
    let options = BarrierOptions::for_members(n)
        .with_algorithm(Algorithm::PairwiseExchange)
        .with_timeout(Duration::from_secs(60));
    // Every port opens before any member starts, as processes of a job do.
    let opened = Arc::new(std::sync::Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|rank| {
            let (socket, group, opened) =
                (daemon.socket().to_owned(), group.clone(), opened.clone());
            std::thread::spawn(move || -> Result<Vec<[f64; 3]>> {
                let mut port = Port::open_at(&socket, rank as u8, 1)?;
                // Members sleep while they wait, as this benchmark's figures always had them.
                port.set_wait_mode(WaitMode::Sleep);
                opened.wait();
                let mut times = Vec::new();
                for _ in 0..rounds {
                    let barrier = timed(operations, || Ok(port.barrier_with(&group, &options)?))?;
                    let [sum, reproducible] =
                        [ReduceOp::SUM, ReduceOp::SUM_REPRODUCIBLE].map(|op| {
                            let spec = ReduceSpec::new(op, ReduceType::F64);
                            timed(operations, || {
                                let mut value = 1.0f64.to_le_bytes();
                                port.nic_allreduce(&group, spec, &mut value)?;
                                match f64::from_le_bytes(value) {
                                    sum if sum == n as f64 => Ok(()),
                                    sum => Err(format!("the {op:?} is {sum}").into()),
                                }
                            })
                        });
                    times.push([barrier, sum?, reproducible?]);
                }
                port.close()?;
                Ok(times)
            })
        })
        .collect();
    let mut at_zero = Vec::new();
    for (rank, thread) in threads.into_iter().enumerate() {
        let times = thread
            .join()
            .map_err(|_| format!("member {rank} panicked"))??;
        if rank == 0 {
            at_zero = times;
        }
    }
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
    let mut medians = [0.0; 3];
    for (kind, out) in medians.iter_mut().enumerate() {
        let mut times: Vec<f64> = at_zero.iter().map(|t| t[kind]).collect();
        *out = median(&mut times).ok_or("no round")?;
    }
    Ok(medians)
}

/// The mean time of `operations` calls of `operation` in µs, after `operations / 10` untimed.
fn timed(operations: usize, mut operation: impl FnMut() -> Result) -> Result<f64> {
    for _ in 0..operations / 10 {
        operation()?;
    }
    let started = Instant::now();
    for _ in 0..operations {
        operation()?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / operations as f64)
}
