//! The NIC's 8-byte allreduce against the NIC barrier it is built on, side by side in one run:
//! at each size, `N` members (threads of this process, each with its own port on its own NIC of
//! one in-process daemon) run back-to-back barriers (pairwise exchange, the allreduce's own
//! schedule) and back-to-back allreduces of one `f64` sum, alternating the two over several
//! rounds; the table gives each one's median over the rounds of the mean time per operation at
//! member 0, and their ratio.
//!
//! `cargo run --release -p nicbar-system --example bench_nic_allreduce -- --help` lists the
//! options. The members sleep on their doorbells while they wait, so on a host with fewer cores
//! than members and NIC threads the figures are the scheduler's as much as the NIC's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nicbar::{
    Algorithm, BarrierOptions, Group, Member, NodeId, Port, PortId, ReduceOp, ReduceSpec,
    ReduceType,
};
use nicbar_emulator::{Emulator, EmulatorConfig};
use nicbar_system::{cores, cpu_model, median, scratch_dir};

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const HELP: &str = "\
bench_nic_allreduce: the NIC's 8-byte allreduce against the NIC barrier (pairwise exchange, the
allreduce's schedule) on the emulated NIC, members as threads of one process, one NIC each.

usage: bench_nic_allreduce [--sizes 2,4,8] [--operations K] [--rounds R]

  --sizes LIST      member counts (default 2,4,8)
  --operations K    timed operations of each kind per round, after K/10 to warm up
                    (default 2000)
  --rounds R        rounds, each timing barriers then allreduces (default 3)
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
    println!("| members | NIC barrier µs | NIC allreduce, 8 B, µs | allreduce / barrier |");
    println!("|---|---|---|---|");
    for n in sizes {
        let (barrier, allreduce) = measure(n, operations, rounds)?;
        println!(
            "| {n} | {barrier:.1} | {allreduce:.1} | {:.2} |",
            allreduce / barrier
        );
    }
    Ok(())
}

/// The medians over `rounds` of member 0's mean barrier and allreduce times, in µs.
fn measure(n: usize, operations: usize, rounds: usize) -> Result<(f64, f64)> {
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
            std::thread::spawn(move || -> Result<Vec<(f64, f64)>> {
                let mut port = Port::open_at(&socket, rank as u8, 1)?;
                opened.wait();
                let spec = ReduceSpec::new(ReduceOp::SUM, ReduceType::F64);
                let mut times = Vec::new();
                for _ in 0..rounds {
                    let barrier = timed(operations, || Ok(port.barrier_with(&group, &options)?))?;
                    let allreduce = timed(operations, || {
                        let mut value = 1.0f64.to_le_bytes();
                        port.nic_allreduce(&group, spec, &mut value)?;
                        if f64::from_le_bytes(value) != n as f64 {
                            return Err(format!("the sum is {}", f64::from_le_bytes(value)).into());
                        }
                        Ok(())
                    })?;
                    times.push((barrier, allreduce));
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
    let mut barrier: Vec<f64> = at_zero.iter().map(|&(b, _)| b).collect();
    let mut allreduce: Vec<f64> = at_zero.iter().map(|&(_, a)| a).collect();
    Ok((
        median(&mut barrier).ok_or("no round")?,
        median(&mut allreduce).ok_or("no round")?,
    ))
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
