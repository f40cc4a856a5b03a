//! `cargo xtask soak [--minutes N] [--seed S]`: real processes on the emulated NIC for a while,
//! epoch after epoch, alternating between one daemon of six NICs and two daemons of three NICs
//! each talking over UDP, every daemon with the fault injector on (loss, duplication,
//! reordering).
//!
//! In each epoch six processes (`soak_worker`, one per NIC) run a plan of rounds drawn from the
//! seed: a barrier of a changing group — in the NIC, on the host, or fuzzy; pairwise exchange,
//! gather-broadcast or dissemination — with messages of random sizes to the next member before
//! it. In half the epochs one process is killed (`SIGKILL`) at a random moment; the next epoch
//! starts every process anew on the same ports. Processes exit as soon as their plan is done (the
//! orderly close delivers what they posted last).
//!
//! Checked: no process leaves a barrier before every member entered it, and every message arrives
//! once and intact (the workers check both); every barrier completes within its timeout or fails
//! naming a member that really is gone (killed, or itself ended by a failure); a message may be
//! missing only from a killed process; nothing hangs (each epoch has a deadline). On a violation or
//! a hang the soak prints each daemon's `nicctl status` (every port with its running barrier) and
//! the seed and epoch that replay it, and fails.

use std::io::Read;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;

use crate::command::{cargo, run};
use crate::{Result, target_dir, workspace_root};

/// Processes (and NICs) per epoch.
const RANKS: usize = 6;
/// How long no process may enter a new round before the soak takes the ports' status (less than
/// a worker's barrier timeout, so the barriers that stand still are still running).
const STALL: Duration = Duration::from_secs(3);
/// The longest an epoch may take before it counts as a hang.
const EPOCH_LIMIT: Duration = Duration::from_secs(90);
/// How long a daemon may take to listen.
const DAEMON_START: Duration = Duration::from_secs(30);

/// Options of `cargo xtask soak`.
#[derive(ClapArgs)]
pub(crate) struct Args {
    /// How long to run, in minutes (fractions allowed).
    #[arg(long, default_value_t = 1.0)]
    minutes: f64,
    /// The seed of every choice [default: drawn from the clock, and printed].
    #[arg(long)]
    seed: Option<u64>,
    /// Start at this epoch of the seed's sequence (to replay a failure without the epochs
    /// before it).
    #[arg(long, default_value_t = 0)]
    first_epoch: u64,
}

impl Args {
    /// A soak of `minutes` with a seed from the clock (printed), as CI runs it.
    /// The soak CI runs: `minutes` long, from [`CI_SEED`].
    pub(crate) fn short(minutes: f64) -> Self {
        Self {
            minutes,
            seed: Some(CI_SEED),
            first_epoch: 0,
        }
    }
}

/// The seed of CI's short soak: the one whose epoch 16 used to hang (every rank timed out naming
/// a live member, in a host-based barrier one rank skipped followed by a NIC-based one), before
/// barriers carried their identity, refused host-based messages were sent again from every call
/// that takes events, and a message waiting for a buffer stopped holding up its connection.
/// `cargo xtask soak` without `--seed` draws one.
pub(crate) const CI_SEED: u64 = 20_261_124;

/// The soak's draws (SplitMix64): a seed gives the same epochs every time.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(SplitMix64::seed_from_u64(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A running `nicctl emulate`; killed when dropped.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where rank `r` runs: its daemon's socket, its unit, and its node id.
#[derive(Clone)]
struct Place {
    socket: PathBuf,
    unit: u8,
    node: u16,
}

/// What the soak counted.
#[derive(Default)]
struct Totals {
    epochs: u64,
    barriers: u64,
    messages: u64,
    kills: u64,
    failures: u64,
    violations: u64,
}

/// Runs the soak.
pub(crate) fn run_soak(args: Args) -> Result<()> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    println!("soak: seed {seed} (replay: cargo xtask soak --seed {seed})");
    run(cargo().current_dir(workspace_root()).args([
        "build",
        "-p",
        "host-driver",
        "--bin",
        "nicctl",
        "-p",
        "nicbar-system",
        "--example",
        "soak_worker",
    ]))?;
    let built = target_dir().join("debug");
    let nicctl = built.join("nicctl");
    let worker = built.join("examples").join("soak_worker");
    let dir = std::env::temp_dir().join(format!("nicbar-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = soak(
        &nicctl,
        &worker,
        &dir,
        (seed, args.first_epoch),
        args.minutes,
    );
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn soak(
    nicctl: &Path,
    worker: &Path,
    dir: &Path,
    (seed, first_epoch): (u64, u64),
    minutes: f64,
) -> Result<()> {
    let faults = |seed: u64| {
        [
            "--loss".to_owned(),
            "0.01".to_owned(),
            "--duplicate".to_owned(),
            "0.01".to_owned(),
            "--reorder".to_owned(),
            "0.02".to_owned(),
            "--reorder-window-us".to_owned(),
            "300".to_owned(),
            "--seed".to_owned(),
            seed.to_string(),
        ]
    };
    // One daemon, six NICs.
    let single_socket = dir.join("single.sock");
    let mut single_args = vec![
        "--units".to_owned(),
        RANKS.to_string(),
        "--first-node".to_owned(),
        "0".to_owned(),
    ];
    single_args.extend(faults(seed));
    let single = start_daemon(nicctl, &single_socket, &single_args)?;
    // Two daemons of three NICs, over UDP.
    let map = dir.join("fabric.map");
    let mut lines = String::from("# the soak's two daemons\n");
    for node in 10..10 + RANKS as u16 {
        let port = UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
        lines.push_str(&format!("node {node} 127.0.0.1:{port}\n"));
    }
    std::fs::write(&map, lines)?;
    // The fabric's key, shared by its two daemons (made afresh each soak).
    let key = dir.join("fabric.key");
    let _ = std::fs::remove_file(&key);
    run(Command::new(nicctl).arg("keygen").arg(&key))?;
    let mut pair = Vec::new();
    for half in 0..2u16 {
        let socket = dir.join(format!("udp{half}.sock"));
        let nodes: Vec<String> = (0..3).map(|i| (10 + half * 3 + i).to_string()).collect();
        let mut daemon_args = vec![
            "--fabric".to_owned(),
            map.display().to_string(),
            "--fabric-key".to_owned(),
            key.display().to_string(),
            "--node".to_owned(),
            nodes.join(","),
        ];
        daemon_args.extend(faults(seed.wrapping_add(u64::from(half) + 1)));
        pair.push(start_daemon(nicctl, &socket, &daemon_args)?);
    }
    let single_places: Vec<Place> = (0..RANKS)
        .map(|rank| Place {
            socket: single.socket.clone(),
            unit: rank as u8,
            node: rank as u16,
        })
        .collect();
    let udp_places: Vec<Place> = (0..RANKS)
        .map(|rank| Place {
            socket: pair[rank / 3].socket.clone(),
            unit: (rank % 3) as u8,
            node: 10 + rank as u16,
        })
        .collect();
    let daemons = [&single, &pair[0], &pair[1]];

    let until = Instant::now() + Duration::from_secs_f64(minutes.max(0.0) * 60.0);
    let mut rng = Rng::new(seed);
    let mut totals = Totals::default();
    let mut epoch = 0u64;
    while epoch < first_epoch {
        draw_epoch(&mut rng, RANKS);
        epoch += 1;
    }
    while Instant::now() < until || epoch == first_epoch {
        let places = if epoch % 2 == 0 {
            &single_places
        } else {
            &udp_places
        };
        let show_status = || {
            let mut report = String::new();
            for daemon in daemons {
                report.push_str(&format!(
                    "soak: nicctl status --socket {}\n",
                    daemon.socket.display()
                ));
                if let Ok(output) = Command::new(nicctl)
                    .arg("status")
                    .arg("--socket")
                    .arg(&daemon.socket)
                    .output()
                {
                    report.push_str(&String::from_utf8_lossy(&output.stdout));
                    report.push_str(&String::from_utf8_lossy(&output.stderr));
                }
            }
            report
        };
        let outcome = run_epoch(
            worker,
            dir,
            places,
            (seed, epoch),
            &mut rng,
            &mut totals,
            &show_status,
        );
        if let Err(error) = outcome {
            eprintln!("soak: epoch {epoch} (seed {seed}): {error}");
            eprint!("{}", show_status());
            return Err(format!(
                "the soak failed in epoch {epoch}; replay: cargo xtask soak --seed {seed} \
                 --first-epoch {epoch}"
            )
            .into());
        }
        epoch += 1;
    }
    totals.epochs = epoch - first_epoch;
    println!(
        "soak: {} epochs, {} barriers completed, {} messages checked, {} processes killed, {} \
         barriers failed naming a member that was gone, {} violations (seed {seed})",
        totals.epochs,
        totals.barriers,
        totals.messages,
        totals.kills,
        totals.failures,
        totals.violations
    );
    Ok(())
}

fn start_daemon(nicctl: &Path, socket: &Path, args: &[String]) -> Result<Daemon> {
    let child = Command::new(nicctl)
        .arg("emulate")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|error| format!("cannot start {}: {error}", nicctl.display()))?;
    let daemon = Daemon {
        child,
        socket: socket.to_owned(),
    };
    let deadline = Instant::now() + DAEMON_START;
    while !socket.exists() {
        if Instant::now() > deadline {
            return Err(format!("the daemon did not listen on {}", socket.display()).into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(daemon)
}

/// An epoch's rounds, and the rank to kill and when (in half the epochs).
fn draw_epoch(rng: &mut Rng, ranks: usize) -> (u64, Option<(usize, Duration)>) {
    let rounds = 10 + rng.below(40);
    let kill = (rng.below(2) == 0).then(|| {
        (
            rng.below(ranks as u64) as usize,
            Duration::from_millis(5 + rng.below(400)),
        )
    });
    (rounds, kill)
}

/// How a worker ended.
enum Ending {
    Killed,
    Exited(i32, String),
}

/// Runs one epoch; `show_status` gives the daemons' status. It is taken while the processes run
/// — on a hang, and whenever no process has entered a new round for a while — and printed if the
/// epoch fails, so each port still shows its running barrier and whom it waits for.
fn run_epoch(
    worker: &Path,
    dir: &Path,
    places: &[Place],
    (seed, epoch): (u64, u64),
    rng: &mut Rng,
    totals: &mut Totals,
    show_status: &dyn Fn() -> String,
) -> Result<()> {
    let counters = dir.join("counters");
    std::fs::write(&counters, vec![0u8; 8 * places.len()])?;
    let (rounds, kill) = draw_epoch(rng, places.len());
    let nodes: Vec<String> = places.iter().map(|p| p.node.to_string()).collect();
    let nodes = nodes.join(",");
    let started = Instant::now();
    // Each epoch is a job of its own (never 0): a port its predecessor left is gone for good to
    // this epoch only once this epoch's own process on it has run a barrier and closed.
    let job = (seed ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15)) as u32 | 1;
    let mut children: Vec<Option<Child>> = Vec::new();
    for (rank, place) in places.iter().enumerate() {
        let child = Command::new(worker)
            .env("NICBAR_SOCKET", &place.socket)
            .env("NICBAR_JOB", job.to_string())
            .args(["--rank", &rank.to_string()])
            .args(["--nodes", &nodes])
            .args(["--unit", &place.unit.to_string()])
            .args(["--seed", &seed.to_string()])
            .args(["--epoch", &epoch.to_string()])
            .args(["--rounds", &rounds.to_string()])
            .arg("--counters")
            .arg(&counters)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|error| format!("cannot start {}: {error}", worker.display()))?;
        children.push(Some(child));
    }
    let mut endings: Vec<Option<Ending>> = (0..places.len()).map(|_| None).collect();
    let mut killed = None;
    // The rounds the processes entered, when they last changed, and the status taken when they
    // stood still for long.
    let (mut entered, mut moved, mut stalled) = (Vec::new(), Instant::now(), None::<String>);
    loop {
        let now_entered = std::fs::read(&counters).unwrap_or_default();
        if now_entered != entered {
            (entered, moved) = (now_entered, Instant::now());
        } else if stalled.is_none() && moved.elapsed() > STALL {
            stalled = Some(format!(
                "soak: no process entered a new round for {STALL:?} ({:.1} s into the epoch); \
                 the ports then:\n{}",
                started.elapsed().as_secs_f64(),
                show_status()
            ));
        }
        if let Some((victim, after)) = kill
            && killed.is_none()
            && started.elapsed() >= after
        {
            killed = Some(victim);
            if endings[victim].is_none()
                && let Some(child) = children[victim].as_mut()
            {
                let _ = child.kill();
                totals.kills += 1;
            }
        }
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot.as_mut() else {
                continue;
            };
            if let Some(status) = child.try_wait()? {
                let mut out = String::new();
                if let Some(mut stdout) = child.stdout.take() {
                    let _ = stdout.read_to_string(&mut out);
                }
                endings[rank] = Some(match status.code() {
                    Some(code) => Ending::Exited(code, out),
                    None => Ending::Killed,
                });
                *slot = None;
            }
        }
        if endings.iter().all(Option::is_some) {
            break;
        }
        if started.elapsed() > EPOCH_LIMIT {
            eprintln!("soak: epoch {epoch} (seed {seed}) hangs; the ports as they are:");
            eprint!("{}", show_status());
            for child in children.iter_mut().flatten() {
                let _ = child.kill();
                let _ = child.wait();
            }
            return Err(format!(
                "hang: epoch {epoch} ({rounds} rounds) still running after {EPOCH_LIMIT:?}; \
                 unfinished ranks: {:?}",
                endings
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.is_none())
                    .map(|(r, _)| r)
                    .collect::<Vec<_>>()
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // A member is gone if it was killed or ended by a failure of its own.
    let gone = |rank: usize| match endings.get(rank) {
        Some(Some(Ending::Killed)) => true,
        Some(Some(Ending::Exited(code, _))) => *code != 0,
        _ => false,
    };
    let mut problems = Vec::new();
    for (rank, ending) in endings.iter().enumerate() {
        let Some(Ending::Exited(code, out)) = ending else {
            continue;
        };
        let last = out.lines().last().unwrap_or("").to_owned();
        let named = |prefix: &str| {
            last.split(prefix)
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|r| r.parse::<usize>().ok())
        };
        match code {
            0 => {
                for field in last.split_whitespace() {
                    if let Some(n) = field.strip_prefix("barriers=") {
                        totals.barriers += n.parse::<u64>().unwrap_or(0);
                    }
                    if let Some(n) = field.strip_prefix("messages=") {
                        totals.messages += n.parse::<u64>().unwrap_or(0);
                    }
                }
            }
            3 => match named("naming rank ") {
                Some(other) if killed.is_some() && other != rank && gone(other) => {
                    totals.failures += 1;
                }
                _ => problems.push(format!(
                    "rank {rank}: {last} (killed: {killed:?}; a failure must name a member that \
                     is gone)"
                )),
            },
            4 => match named("from rank ") {
                Some(other) if killed == Some(other) => totals.failures += 1,
                _ => problems.push(format!("rank {rank}: {last} (killed: {killed:?})")),
            },
            _ => problems.push(format!("rank {rank} exited {code}: {out}")),
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    totals.violations += problems.len() as u64;
    if let Some(stalled) = stalled {
        eprint!("{stalled}");
    }
    Err(problems.join("\n").into())
}
