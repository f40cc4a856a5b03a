//! nicbar-armci-run: starts N ranks of an ARMCI program on the NICs of the local daemon.
//!
//! `nicbar-armci-run -n N [--units U] [--socket PATH] PROGRAM [ARGS...]` starts N processes of
//! PROGRAM, rank r with `NICBAR_ARMCI_RANK=r`, `NICBAR_ARMCI_SIZE=N`, `NICBAR_ARMCI_UNIT=r mod U`
//! and a fresh rendezvous directory (`NICBAR_ARMCI_DIR`), and waits for them all. It exits with
//! the first failing rank's status (and stops the others), or 0. The daemon must be running
//! (`nicctl emulate --units U`). `NICBAR_ARMCI_FENCE`, `_BARRIER` and `_LOCK` pass through.

use std::process::{Child, Command, ExitCode};
use std::time::Duration;

fn usage() -> ExitCode {
    eprintln!("usage: nicbar-armci-run -n N [--units U] [--socket PATH] PROGRAM [ARGS...]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut ranks, mut units, mut socket) = (None, 1usize, None);
    let program = loop {
        match args.next().as_deref() {
            Some("-n" | "--ranks") => ranks = args.next().and_then(|v| v.parse::<usize>().ok()),
            Some("--units") => match args.next().and_then(|v| v.parse().ok()) {
                Some(u) if u >= 1 => units = u,
                _ => return usage(),
            },
            Some("--socket") => socket = args.next(),
            Some(program) if !program.starts_with('-') => break program.to_owned(),
            _ => return usage(),
        }
    };
    let Some(ranks) = ranks.filter(|&n| (1..=armci::launch::MAX_RANKS).contains(&n)) else {
        return usage();
    };
    let rest: Vec<String> = args.collect();
    let directory = std::env::temp_dir().join(format!("nicbar-armci-{}", std::process::id()));
    if let Err(error) = std::fs::create_dir_all(&directory) {
        eprintln!(
            "nicbar-armci-run: cannot create {}: {error}",
            directory.display()
        );
        return ExitCode::FAILURE;
    }
    let mut children: Vec<(usize, Child)> = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let mut command = Command::new(&program);
        command
            .args(&rest)
            .env("NICBAR_ARMCI_RANK", rank.to_string())
            .env("NICBAR_ARMCI_SIZE", ranks.to_string())
            .env("NICBAR_ARMCI_UNIT", (rank % units).to_string())
            .env("NICBAR_ARMCI_DIR", &directory);
        if let Some(socket) = &socket {
            command.env("NICBAR_SOCKET", socket);
        }
        match command.spawn() {
            Ok(child) => children.push((rank, child)),
            Err(error) => {
                eprintln!("nicbar-armci-run: cannot start {program}: {error}");
                stop(&mut children);
                return ExitCode::FAILURE;
            }
        }
    }
    let mut failed = None;
    while !children.is_empty() && failed.is_none() {
        let mut index = 0;
        while index < children.len() {
            match children[index].1.try_wait() {
                Ok(Some(status)) => {
                    let (rank, _) = children.swap_remove(index);
                    if !status.success() {
                        eprintln!("nicbar-armci-run: rank {rank} ended with {status}");
                        failed = Some(status.code().unwrap_or(1));
                    }
                }
                Ok(None) => index += 1,
                Err(error) => {
                    eprintln!("nicbar-armci-run: waiting for a rank: {error}");
                    failed = Some(1);
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    stop(&mut children);
    let _ = std::fs::remove_dir_all(&directory);
    match failed {
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1).max(1)),
        None => ExitCode::SUCCESS,
    }
}

/// Stops the ranks still running (after one failed, so the others do not wait for it).
fn stop(children: &mut Vec<(usize, Child)>) {
    for (_, child) in children.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
    children.clear();
}
