//! Barriers between real processes on the emulated NIC: 4, 8 and 16 processes (this test binary,
//! started again as children), one per NIC, with the fault injector losing, duplicating and
//! reordering packets; many consecutive barriers over changing subsets of the processes, with
//! every algorithm, in the NIC and on the host, and broadcasts run by the NIC (each member checks
//! the root's bytes); a member killed mid-barrier; and barriers between two `nicctl emulate`
//! daemons over UDP.
//!
//! Safety is checked the way a user could: a file of counters shared by all the processes, one
//! per process, which a process sets to the number of barriers it has entered right before it
//! enters the next; on leaving a barrier, a process reads every member's counter and checks that
//! each has entered this barrier (nobody left before everyone entered). Liveness: every wait is
//! bounded and fails loudly, naming what it waited for.
//!
//! The subsets and the fault injector come from one seed, printed; `NICBAR_TEST_SEED=S` replays it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nicbar::{
    Algorithm, BarrierError, BarrierOptions, FailureReason, Group, Member, NodeId, Port, PortId,
};
use nicbar_control::query_status;
use nicbar_emulator::fault::Rng;
use nicbar_emulator::{Emulator, EmulatorConfig, EmulatorHandle, FaultConfig};

mod common;
use common::{ChildProcess, ROLE, STAGE, hear, say, terminate, var};
use nicbar_system::free_udp_port;

fn seed() -> u64 {
    common::seed(0xba77_1e55)
}

fn temp_dir() -> tempfile::TempDir {
    common::temp_dir("nicbar-barrier")
}

/// Each barrier's timeout in the campaigns: far above any barrier's time through the faults, and
/// well below a stage.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(20);
/// The port every process of these tests opens on its NIC.
const PORT: u8 = 3;

// ---------------------------------------------------------------------------------------------
// Child processes.

/// The body of the child processes: one role each, chosen by `NICBAR_TEST_ROLE`.
#[test]
#[ignore = "the body of the child processes that the other tests start"]
fn child() {
    let role = std::env::var(ROLE).expect("started by another test, with NICBAR_TEST_ROLE");
    match role.as_str() {
        "campaign" => campaign_role(),
        "survivor" => survivor_role(),
        "victim" => victim_role(),
        other => panic!("unknown role {other}"),
    }
}

fn open_from_env() -> Port {
    let (unit, port) = (var("UNIT").parse().unwrap(), var("PORT").parse().unwrap());
    let port = Port::open_at(&PathBuf::from(var("SOCKET")), unit, port)
        .unwrap_or_else(|e| panic!("open: {e}"));
    say(&format!(
        "open node={} port={}",
        port.node_id().get(),
        port.port_id().0
    ));
    port
}

/// `node:port,node:port,...`
fn parse_world(text: &str) -> Vec<Member> {
    text.split(',')
        .map(|endpoint| {
            let (node, port) = endpoint.split_once(':').unwrap();
            Member::new(
                NodeId::new(node.parse().unwrap()),
                PortId(port.parse().unwrap()),
            )
        })
        .collect()
}

fn format_world(world: &[Member]) -> String {
    world
        .iter()
        .map(|m| format!("{}:{}", m.node.get(), m.port.0))
        .collect::<Vec<_>>()
        .join(",")
}

// ---------------------------------------------------------------------------------------------
// The campaign: many barriers over changing subsets.

/// Where a barrier runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Nic,
    Host,
    /// [`Port::nic_broadcast`] from a root that changes with every barrier (the stage's tree
    /// gives the dimension).
    Broadcast,
}

/// One stage of a campaign: `count` barriers of `algorithm` (adapted to each subset's size).
#[derive(Clone, Copy, Debug)]
struct Stage {
    mode: Mode,
    algorithm: Algorithm,
}

/// `nic:pe`, `host:gb2.1` (dimension 2, root 1), `nic:d3` (3-way dissemination).
fn parse_stage(text: &str) -> Stage {
    let (mode, algorithm) = text.split_once(':').unwrap();
    let mode = match mode {
        "nic" => Mode::Nic,
        "host" => Mode::Host,
        "bcast" => Mode::Broadcast,
        other => panic!("mode {other}"),
    };
    let algorithm = if algorithm == "pe" {
        Algorithm::PairwiseExchange
    } else if let Some(tree) = algorithm.strip_prefix("gb") {
        let (dimension, root) = tree.split_once('.').unwrap();
        Algorithm::GatherBroadcast {
            dimension: dimension.parse().unwrap(),
            root: root.parse().unwrap(),
        }
    } else if let Some(n) = algorithm.strip_prefix('d') {
        Algorithm::Dissemination {
            n: n.parse().unwrap(),
        }
    } else {
        panic!("algorithm {algorithm}")
    };
    Stage { mode, algorithm }
}

/// Every algorithm, in the NIC and on the host.
fn stages(algorithms: &[&str]) -> String {
    algorithms
        .iter()
        .flat_map(|a| [format!("nic:{a}"), format!("host:{a}")])
        .collect::<Vec<_>>()
        .join(",")
}

/// `algorithm`'s parameters brought into range for a group of `members` (at least 2).
fn adapt(algorithm: Algorithm, members: usize) -> Algorithm {
    match algorithm {
        Algorithm::PairwiseExchange => Algorithm::PairwiseExchange,
        Algorithm::GatherBroadcast { dimension, root } => Algorithm::GatherBroadcast {
            dimension: dimension.min(members - 1),
            root: root % members,
        },
        Algorithm::Dissemination { n } => Algorithm::Dissemination {
            n: n.min(members - 1),
        },
    }
}

/// The next barrier's members, as ranks of the world in the order of the barrier's ranks: the
/// whole world a third of the time, else a random subset (of one member, now and then) in a random
/// order. Every process draws the same sequence from the seed.
fn draw_subset(rng: &mut Rng, world: usize) -> Vec<usize> {
    let mut ranks: Vec<usize> = (0..world).collect();
    let size = if rng.chance(1.0 / 3.0) {
        world
    } else {
        1 + (rng.next_u64() % world as u64) as usize
    };
    for i in 0..size {
        let j = i + (rng.next_u64() % (world - i) as u64) as usize;
        ranks.swap(i, j);
    }
    ranks.truncate(size);
    ranks
}

/// The shared counters: one `u64` per process of the world, at `8 * index`.
struct Counters(File);

impl Counters {
    fn open(path: &Path) -> Self {
        Self(
            File::options()
                .read(true)
                .write(true)
                .open(path)
                .unwrap_or_else(|e| panic!("counters {}: {e}", path.display())),
        )
    }

    fn set(&self, index: usize, value: u64) {
        self.0
            .write_all_at(&value.to_le_bytes(), 8 * index as u64)
            .unwrap();
    }

    fn get(&self, index: usize) -> u64 {
        let mut bytes = [0u8; 8];
        self.0.read_exact_at(&mut bytes, 8 * index as u64).unwrap();
        u64::from_le_bytes(bytes)
    }
}

fn campaign_role() {
    let mut port = open_from_env();
    let index: usize = var("INDEX").parse().unwrap();
    let seed: u64 = var("SEED").parse().unwrap();
    let count: usize = var("COUNT").parse().unwrap();
    let stages: Vec<Stage> = var("STAGES").split(',').map(parse_stage).collect();
    let counters = Counters::open(Path::new(&var("COUNTERS")));
    assert_eq!(hear(), "go");
    let world = Group::new(parse_world(&var("WORLD"))).unwrap();
    assert_eq!(
        world.member(index),
        Some(Member::new(port.node_id(), port.port_id()))
    );
    let mut rng = Rng::new(seed, 0xba);
    let mut expected = vec![0u64; world.len()];
    let (mut mine, mut fuzzy_tests) = (0u64, 0u64);
    let started = Instant::now();
    for (number, stage) in stages.iter().enumerate() {
        let stage_started = Instant::now();
        let mut times = Vec::new();
        for barrier in 0..count {
            let subset = draw_subset(&mut rng, world.len());
            for &rank in &subset {
                expected[rank] += 1;
            }
            if !subset.contains(&index) {
                continue;
            }
            let group = world.subgroup(&subset).unwrap();
            let options = BarrierOptions::for_members(subset.len())
                .with_algorithm(adapt(stage.algorithm, subset.len().max(2)))
                .with_timeout(BARRIER_TIMEOUT);
            counters.set(index, expected[index]);
            let entered = Instant::now();
            let group = group.with_options(options);
            let result = match stage.mode {
                Mode::Host => port.host_barrier(&group, &options),
                Mode::Broadcast => {
                    let root = barrier % subset.len();
                    let sent = broadcast_bytes(seed, number, barrier);
                    let mut data = if subset[root] == index {
                        sent.clone()
                    } else {
                        vec![0; sent.len()]
                    };
                    port.nic_broadcast(&group, root, &mut data).map(|len| {
                        if len != sent.len() || data != sent {
                            say(&format!(
                                "failed: stage {number} broadcast {barrier} of {subset:?} from \
                                 {root}: got {len} bytes {data:?}, the root sent {sent:?}"
                            ));
                            panic!("wrong bytes");
                        }
                    })
                }
                // Every third NIC barrier is fuzzy: start, compute while testing, then wait.
                Mode::Nic if barrier % 3 == 2 => port
                    .barrier_start_with(&group, &options)
                    .and_then(|pending| {
                        for _ in 0..20 {
                            if port.barrier_test(&pending)? {
                                break;
                            }
                            fuzzy_tests += 1;
                            std::hint::black_box((0..200u64).sum::<u64>());
                        }
                        port.barrier_wait(pending)
                    }),
                Mode::Nic => port.barrier_with(&group, &options),
            };
            if let Err(error) = result {
                say(&format!(
                    "failed stage {number} {stage:?} barrier {barrier} of {subset:?}: {error}"
                ));
                panic!("{error}");
            }
            times.push(entered.elapsed());
            mine += 1;
            for &rank in &subset {
                let entries = counters.get(rank);
                if entries < expected[rank] {
                    say(&format!(
                        "failed safety: stage {number} {stage:?} barrier {barrier} of {subset:?}: \
                         left before world rank {rank} entered (it entered {entries} barriers, \
                         this is its {})",
                        expected[rank]
                    ));
                    panic!("safety");
                }
            }
        }
        times.sort();
        let p50 = times.get(times.len() / 2).copied().unwrap_or_default();
        say(&format!(
            "stage {number} {:?} {:?}: {} barriers, p50 {p50:?}, in {:?}",
            stage.mode,
            stage.algorithm,
            times.len(),
            stage_started.elapsed()
        ));
    }
    // Nothing of the barriers leaked out to the caller.
    if let Ok(Some(event)) = port.receive() {
        say(&format!("failed: a stray event {event:?}"));
        panic!("stray event");
    }
    say(&format!(
        "done barriers={mine} fuzzy-tests={fuzzy_tests} in {:?}",
        started.elapsed()
    ));
    // The port closes as the process ends, in order: the NIC first delivers what it posted (the
    // last host-based barrier's messages), so nobody needs to wait for the others.
}

/// The bytes broadcast `barrier` of stage `stage` carries (1 to 32 of them): every process
/// computes them, the root to send them and the others to check what came.
fn broadcast_bytes(seed: u64, stage: usize, barrier: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ (stage as u64) << 32 ^ barrier as u64, 0xbc);
    let len = 1 + (rng.next_u64() % nicbar::NIC_BROADCAST_MAX as u64) as usize;
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

/// Runs a campaign with one process per socket of `endpoints` ((socket, unit, node)), all on
/// port [`PORT`]; returns when every process checked every barrier.
fn campaign(dir: &Path, endpoints: &[(PathBuf, u8, u16)], stages: &str, count: usize, seed: u64) {
    let counters = dir.join("counters");
    std::fs::write(&counters, vec![0u8; 8 * endpoints.len()]).unwrap();
    let world: Vec<Member> = endpoints
        .iter()
        .map(|&(_, _, node)| Member::new(NodeId::new(node), PortId(PORT)))
        .collect();
    let mut children: Vec<ChildProcess> = endpoints
        .iter()
        .enumerate()
        .map(|(index, (socket, unit, _))| {
            let env = [
                ("SOCKET", socket.display().to_string()),
                ("UNIT", unit.to_string()),
                ("PORT", PORT.to_string()),
                ("INDEX", index.to_string()),
                ("WORLD", format_world(&world)),
                ("SEED", seed.to_string()),
                ("COUNT", count.to_string()),
                ("STAGES", stages.to_owned()),
                ("COUNTERS", counters.display().to_string()),
            ];
            ChildProcess::spawn(&format!("process {index}"), "campaign", &env)
        })
        .collect();
    for (child, member) in children.iter_mut().zip(&world) {
        let opened = child.expect("open", STAGE);
        assert_eq!(
            opened,
            format!("node={} port={}", member.node.get(), member.port.0)
        );
    }
    let started = Instant::now();
    for child in children.iter_mut() {
        child.say("go");
    }
    let stage_count = stages.split(',').count();
    for (index, child) in children.iter_mut().enumerate() {
        for _ in 0..stage_count {
            let line = child.expect("stage", STAGE);
            if index == 0 {
                eprintln!("process 0: stage {line}");
            }
        }
        let done = child.expect("done", STAGE);
        eprintln!("process {index}: {done}");
    }
    eprintln!(
        "{} processes, {} stages of {count} barriers, in {:?}",
        endpoints.len(),
        stage_count,
        started.elapsed()
    );
    for child in children.iter_mut() {
        child.wait_success(STAGE);
    }
}

fn faults(seed: u64) -> FaultConfig {
    FaultConfig {
        loss: 0.05,
        duplicate: 0.05,
        reorder: 0.05,
        ..FaultConfig::none(seed)
    }
}

fn emulator(dir: &Path, units: u16, faults: Option<FaultConfig>) -> EmulatorHandle {
    let mut config = EmulatorConfig::in_process(dir.join("control.sock"), units);
    if let Some(faults) = faults {
        eprintln!("fault injector: {faults}");
    }
    config.faults = faults;
    Emulator::spawn(config).unwrap()
}

/// `processes` processes on as many units of a daemon in this process, through faults.
fn campaign_on_units(processes: u16, stages: &str, count: usize) {
    let seed = seed();
    let dir = temp_dir();
    let emulator = emulator(dir.path(), processes, Some(faults(seed)));
    let endpoints: Vec<(PathBuf, u8, u16)> = (0..processes)
        .map(|unit| (emulator.socket().to_owned(), unit as u8, unit))
        .collect();
    campaign(dir.path(), &endpoints, stages, count, seed);
    let report = query_status(emulator.socket()).unwrap();
    let lost: u64 = report.units.iter().map(|unit| unit.wire.lost).sum();
    let duplicated: u64 = report.units.iter().map(|unit| unit.wire.duplicated).sum();
    let delayed: u64 = report.units.iter().map(|unit| unit.wire.delayed).sum();
    eprintln!("the wire lost {lost}, duplicated {duplicated}, delayed {delayed} packets");
    assert!(
        lost > 0 && duplicated > 0 && delayed > 0,
        "the faults did not happen"
    );
}

#[test]
fn four_processes_run_every_algorithm_in_the_nic_and_on_the_host_through_faults() {
    campaign_on_units(
        4,
        &stages(&["pe", "gb1.0", "gb2.1", "gb3.3", "d1", "d2", "d3"]),
        300,
    );
}

#[test]
fn four_and_eight_processes_broadcast_in_the_nic_through_faults_every_member_gets_the_roots_bytes()
{
    campaign_on_units(4, "bcast:gb1.0,bcast:gb2.0,nic:d1,bcast:gb3.0", 200);
    campaign_on_units(8, "bcast:gb2.0,nic:pe,bcast:gb4.0", 100);
}

#[test]
fn eight_processes_run_barriers_over_changing_subsets_through_faults() {
    campaign_on_units(8, &stages(&["pe", "gb2.0", "gb3.5", "d1", "d3"]), 120);
}

#[test]
fn sixteen_processes_run_barriers_over_changing_subsets_through_faults() {
    campaign_on_units(16, &stages(&["pe", "gb4.7", "d2"]), 50);
}

// ---------------------------------------------------------------------------------------------
// A member killed in the middle of a barrier.

/// Enters one barrier of the world (`ALGORITHM`, `MODE`, timeout `TIMEOUT_MS`) that a member
/// never enters, and reports how it ended: `ended <rank> <reason> after <ms>`.
fn survivor_role() {
    let mut port = open_from_env();
    assert_eq!(hear(), "go");
    let world = Group::new(parse_world(&var("WORLD"))).unwrap();
    let stage = parse_stage(&var("STAGE"));
    let timeout = Duration::from_millis(var("TIMEOUT_MS").parse().unwrap());
    let options = BarrierOptions::for_members(world.len())
        .with_algorithm(stage.algorithm)
        .with_timeout(timeout);
    say("entering");
    let started = Instant::now();
    let result = match stage.mode {
        Mode::Nic => port.barrier_with(&world, &options),
        Mode::Host => port.host_barrier(&world, &options),
        Mode::Broadcast => port
            .nic_broadcast(&world.clone().with_options(options), 0, &mut [7; 8])
            .map(|_| ()),
    };
    match result {
        Err(BarrierError::Failed {
            waiting_for,
            rank: Some(rank),
            reason,
        }) => {
            assert_eq!(world.member(rank), Some(waiting_for));
            let reason = match reason {
                FailureReason::PeerPortClosed => "port-closed",
                FailureReason::TimedOut => "timed-out",
                other => panic!("{other:?}"),
            };
            say(&format!(
                "ended {rank} {reason} after {}",
                started.elapsed().as_millis()
            ));
        }
        other => {
            say(&format!("failed: the barrier ended with {other:?}"));
            panic!("{other:?}");
        }
    }
    assert_eq!(hear(), "finish");
}

/// Opens its port and never enters the barrier; it is killed.
fn victim_role() {
    let _port = open_from_env();
    hear();
    panic!("the victim was to be killed, not told to go on");
}

/// How each survivor's barrier ended: (world rank it waited for, reason, milliseconds).
type Ending = (usize, String, u64);

/// Four processes enter a barrier of `stage` (timeout `timeout`), except the last, which is
/// killed with SIGKILL once the others' barriers are running and a barrier packet from each of
/// the world ranks `senders` (those whose schedules send to it) has reached its NIC. Returns how
/// each survivor's barrier ended.
fn kill_a_member(stage: &str, timeout: Duration, senders: &[u16]) -> Vec<Ending> {
    const MEMBERS: u16 = 4;
    let seed = seed();
    let dir = temp_dir();
    let emulator = emulator(dir.path(), MEMBERS, Some(faults(seed)));
    let socket = emulator.socket().to_owned();
    let world: Vec<Member> = (0..MEMBERS)
        .map(|node| Member::new(NodeId::new(node), PortId(PORT)))
        .collect();
    let mut processes: Vec<ChildProcess> = (0..MEMBERS)
        .map(|unit| {
            let env = [
                ("SOCKET", socket.display().to_string()),
                ("UNIT", unit.to_string()),
                ("PORT", PORT.to_string()),
                ("WORLD", format_world(&world)),
                ("STAGE", stage.to_owned()),
                ("TIMEOUT_MS", timeout.as_millis().to_string()),
            ];
            let role = if unit == MEMBERS - 1 {
                "victim"
            } else {
                "survivor"
            };
            ChildProcess::spawn(&format!("{role} on unit {unit}"), role, &env)
        })
        .collect();
    for process in processes.iter_mut() {
        process.expect("open", STAGE);
    }
    let mut victim = processes.pop().unwrap();
    for survivor in processes.iter_mut() {
        survivor.say("go");
        survivor.expect("entering", STAGE);
    }
    if stage.starts_with("nic") {
        // Kill it only once every survivor's barrier runs in its NIC, and every survivor's NIC
        // has reached the victim's (a barrier packet of each arrived there). A barrier that
        // starts after the member died cannot tell it from one that has not opened its port yet
        // (paper §3.2); and the victim's NIC tells of the death only the NICs it has a connection
        // with when the port closes.
        let survivors = processes.len();
        let deadline = Instant::now() + STAGE;
        loop {
            let report = query_status(&socket).unwrap();
            let running = report.units[..survivors].iter().all(|unit| {
                unit.ports
                    .iter()
                    .any(|port| port.port == PORT && port.barrier_running)
            });
            let reached = senders.iter().all(|&node| {
                report.units[survivors]
                    .connections
                    .iter()
                    .any(|c| c.peer == node && c.received > 0)
            });
            if running && reached {
                break;
            }
            assert!(Instant::now() < deadline, "the barriers did not start");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    victim.child.kill().unwrap();
    let status = victim.wait(STAGE);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{status}"
    );
    let endings = processes
        .iter_mut()
        .map(|survivor| {
            let ended = survivor.expect("ended", timeout + STAGE);
            eprintln!("{}: ended {ended}", survivor.name);
            let fields: Vec<&str> = ended.split_whitespace().collect();
            (
                fields[0].parse().unwrap(),
                fields[1].to_owned(),
                fields[3].parse().unwrap(),
            )
        })
        .collect();
    for survivor in processes.iter_mut() {
        survivor.say("finish");
        survivor.wait_success(STAGE);
    }
    endings
}

#[test]
fn a_killed_member_fails_every_barrier_that_waits_for_it_naming_it() {
    const VICTIM: usize = 3;
    let timeout = Duration::from_secs(20);
    // 3-way dissemination among four is all-to-all: every survivor waits for the victim
    // directly, and its NIC learns of the port's death at once, long before the timeout.
    for (rank, reason, millis) in kill_a_member("nic:d3", timeout, &[0, 1, 2]) {
        assert_eq!((rank, reason.as_str()), (VICTIM, "port-closed"));
        assert!(u128::from(millis) < timeout.as_millis() / 2, "{millis} ms");
    }
}

#[test]
fn with_pairwise_exchange_the_death_reaches_every_survivor_naming_the_victim() {
    const VICTIM: usize = 3;
    let timeout = Duration::from_secs(20);
    let endings = kill_a_member("nic:pe", timeout, &[1, 2]);
    // Ranks 2 and 1 exchange with the victim: their NICs fail them at once, naming it. Rank 0
    // never talks to the victim: it waits for rank 2, whose failed barrier tells it (an abort
    // naming the victim), long before its own timeout.
    for (rank, (named, reason, millis)) in endings.iter().enumerate() {
        assert_eq!(
            (*named, reason.as_str()),
            (VICTIM, "port-closed"),
            "rank {rank}"
        );
        assert!(
            u128::from(*millis) < timeout.as_millis() / 2,
            "rank {rank}: {millis} ms"
        );
    }
}

#[test]
fn on_the_host_a_killed_member_fails_the_others_at_their_timeout_naming_it() {
    const VICTIM: usize = 3;
    let timeout = Duration::from_secs(2);
    // The host learns of a dead port only from its sends to it: every survivor sends to the
    // victim in all-to-all dissemination, and gives up waiting for it at the timeout.
    for (rank, reason, millis) in kill_a_member("host:d3", timeout, &[]) {
        assert_eq!((rank, reason.as_str()), (VICTIM, "port-closed"));
        assert!(
            u128::from(millis) >= timeout.as_millis() - 10,
            "{millis} ms"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Two daemons over UDP.

/// Starts `nicctl emulate` for `nodes` of `map`, with faults from `seed`, and waits until it
/// listens; returns it and its socket.
fn start_daemon(dir: &Path, map: &Path, nodes: &str, seed: u64) -> (ChildProcess, PathBuf) {
    let socket = dir.join(format!("daemon-{nodes}.sock"));
    let mut command = Command::new(common::nicctl());
    command
        .arg("emulate")
        .arg("--socket")
        .arg(&socket)
        .arg("--fabric")
        .arg(map)
        .arg("--fabric-key")
        .arg(common::fabric_key(dir))
        .args(["--node", nodes])
        .args(["--loss", "0.05", "--duplicate", "0.05", "--reorder", "0.05"])
        .args(["--seed", &seed.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut daemon = ChildProcess::start(&format!("daemon of nodes {nodes}"), command);
    daemon.expect("nicctl emulate: listening on", STAGE);
    (daemon, socket)
}

#[test]
fn four_processes_on_two_daemons_run_barriers_over_udp_through_faults() {
    let seed = seed();
    let dir = temp_dir();
    let map = dir.path().join("fabric.map");
    std::fs::write(
        &map,
        format!(
            "# two daemons of two NICs each on one host\n\
             node 10 127.0.0.1:{}\nnode 11 127.0.0.1:{}\n\
             node 12 127.0.0.2:{}\nnode 13 127.0.0.2:{}\n",
            free_udp_port("127.0.0.1").unwrap(),
            free_udp_port("127.0.0.1").unwrap(),
            free_udp_port("127.0.0.2").unwrap(),
            free_udp_port("127.0.0.2").unwrap(),
        ),
    )
    .unwrap();
    let (mut one, one_socket) = start_daemon(dir.path(), &map, "10,11", seed);
    let (mut two, two_socket) = start_daemon(dir.path(), &map, "12,13", seed + 1);
    let endpoints = [
        (one_socket.clone(), 0, 10),
        (one_socket.clone(), 1, 11),
        (two_socket.clone(), 0, 12),
        (two_socket.clone(), 1, 13),
    ];
    campaign(
        dir.path(),
        &endpoints,
        &stages(&["pe", "gb2.0", "d1"]),
        100,
        seed,
    );
    // The barriers crossed the wire between the daemons, and the faults hit them.
    let report = query_status(&one_socket).unwrap();
    let toward_two: Vec<_> = report
        .units
        .iter()
        .flat_map(|unit| &unit.connections)
        .filter(|c| c.peer == 12 || c.peer == 13)
        .collect();
    let sent: u64 = toward_two.iter().map(|c| c.sent).sum();
    let resent: u64 = toward_two.iter().map(|c| c.resent).sum();
    eprintln!("node 10 and 11 sent {sent} packets to 12 and 13, {resent} again");
    assert!(sent > 0 && resent > 0, "{toward_two:?}");
    terminate(&mut one);
    terminate(&mut two);
}
