//! MVAPICH's RDMA fast path (Liu et al., *High Performance RDMA-Based MPI Implementation over
//! InfiniBand*) between real processes on the emulated NIC, through its fault injector: the
//! RDMA-write eager fast path (thousands of messages both ways, byte for byte and in order, rings wrapping
//! many times, long messages falling back; a ring run out of credit falling back in order and
//! recovering), and remote locks (eight contending processes, 100 critical sections each,
//! keeping a counter updated by plain get and put exact — with the passive lock while the target
//! process computes and never calls the library, and with the lock its process serves).
//!
//! The daemon runs in the test process; every process is this test binary in a role, on its own
//! NIC (unit), so its node id is its unit number.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{ChildProcess, ROLE, STAGE, hear, say, var};
use nicbar::fastpath::Stats;
use nicbar::{FastPath, FastPathConfig, LockMode, NodeId, PeerId, Port, PortId, Route};
use nicbar_emulator::{Emulator, EmulatorConfig, EmulatorHandle, FaultConfig};

/// Slots of each ring in the message tests.
const SLOTS: u32 = 8;
/// Payload bytes of a slot in the message tests.
const SLOT_PAYLOAD: usize = 96;
/// Messages the exchange sends ahead of those it received.
const WINDOW: u64 = 3;
/// How long the late process of the late-open test waits to connect.
const LATE_SETUP: Duration = Duration::from_secs(10);
/// The one message the late process sends.
const LATE_HELLO: &[u8] = b"opened late, connected all the same";

fn emulator(dir: &Path, units: u16, seed: u64) -> EmulatorHandle {
    let mut config = EmulatorConfig::in_process(dir.join("control.sock"), units);
    let faults = FaultConfig {
        loss: 0.03,
        duplicate: 0.03,
        reorder: 0.03,
        reorder_window: Duration::from_micros(200),
        ..FaultConfig::none(seed)
    };
    eprintln!("fault injector: {faults}");
    config.faults = Some(faults);
    Emulator::spawn(config).unwrap()
}

/// Message `index` from `sender`: its index in the first 8 bytes, then a pattern; lengths from 8
/// to twice a slot's payload, so some are too long for the fast path.
fn message(seed: u64, sender: u16, index: u64) -> Vec<u8> {
    let len = 8 + (index.wrapping_mul(37) % (2 * SLOT_PAYLOAD as u64)) as usize;
    let mut bytes = index.to_le_bytes().to_vec();
    bytes.extend((8..len).map(|i| {
        let x = (i as u64 ^ index << 16 ^ u64::from(sender) << 40)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ seed;
        (x >> 31) as u8
    }));
    bytes
}

fn stats_line(stats: &Stats) -> String {
    format!(
        "fast {} too_long {} no_credit {} no_ring {} received_fast {} received_ordinary {} credit_puts {}",
        stats.sent_fast,
        stats.fallback_too_long,
        stats.fallback_no_credit,
        stats.fallback_no_ring,
        stats.received_fast,
        stats.received_ordinary,
        stats.credit_puts
    )
}

/// The number after `word` in a stats line.
fn field(line: &str, word: &str) -> u64 {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == word)
        .unwrap_or_else(|| panic!("no {word} in {line}"));
    words[at + 1].parse().unwrap()
}

/// Opens this child's port and the fast path, connected to the units in `PEERS`.
fn open(config: FastPathConfig) -> (FastPath, Vec<PeerId>) {
    let socket = var("SOCKET");
    let unit: u8 = var("UNIT").parse().unwrap();
    let port = Port::open_at(Path::new(&socket), unit, 1).unwrap();
    let mut fast = FastPath::new(port, config).unwrap();
    let peers: Vec<PeerId> = var("PEERS")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|n| {
            fast.connect(NodeId::new(n.parse().unwrap()), PortId(1))
                .unwrap()
        })
        .collect();
    fast.wait_connected().unwrap();
    (fast, peers)
}

/// Receives the next message within a stage.
fn next(fast: &mut FastPath) -> nicbar::Message {
    fast.receive_timeout(STAGE)
        .unwrap()
        .expect("a message within the stage")
}

#[test]
#[ignore = "run by the other tests as a child process"]
fn child() {
    let role = std::env::var(ROLE).expect("started by another test, with NICBAR_TEST_ROLE");
    let seed: u64 = var("SEED").parse().unwrap();
    let unit: u16 = var("UNIT").parse().unwrap();
    let message_config = FastPathConfig {
        slots: SLOTS,
        slot_payload: SLOT_PAYLOAD,
        ..FastPathConfig::default()
    };
    match role.as_str() {
        // Sends COUNT messages to the one peer while receiving COUNT from it, checking each.
        "exchange" => {
            let count: u64 = var("COUNT").parse().unwrap();
            let (mut fast, peers) = open(message_config);
            let peer = peers[0];
            let other = var("PEERS").parse::<u16>().unwrap();
            let (mut sent, mut received) = (0u64, 0u64);
            while sent < count || received < count {
                // At most WINDOW messages ahead of what came back, so that the rings, not the
                // scheduler, decide the paths.
                let may_send = sent < count && sent < received + WINDOW;
                if may_send {
                    fast.send(peer, &message(seed, unit, sent)).unwrap();
                    sent += 1;
                }
                let got = if may_send {
                    fast.poll().unwrap()
                } else {
                    Some(next(&mut fast))
                };
                if let Some(got) = got {
                    assert_eq!(got.peer, peer);
                    assert_eq!(
                        got.data,
                        message(seed, other, received),
                        "message {received} byte for byte and in order"
                    );
                    received += 1;
                }
            }
            fast.flush().unwrap();
            say(&format!("done {}", stats_line(&fast.stats())));
            // Keep serving the peer's last credits until the parent ends the run.
            assert_eq!(hear(), "exit");
        }
        // Sends on command: `send N` sends N messages and reports the routes' counts.
        "sender" => {
            let (mut fast, peers) = open(message_config);
            let mut next_index = 0u64;
            loop {
                let line = hear();
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.as_slice() {
                    ["send", n] => {
                        let n: u64 = n.parse().unwrap();
                        for _ in 0..n {
                            // Short messages only: every one fits a slot.
                            let mut data = message(seed, unit, next_index);
                            data.truncate(SLOT_PAYLOAD);
                            fast.send(peers[0], &data).unwrap();
                            next_index += 1;
                        }
                        say(&format!("sent {}", stats_line(&fast.stats())));
                    }
                    _ => break,
                }
            }
            fast.flush().unwrap();
        }
        // Receives on command: `receive N` takes N messages, checks them, reports their routes.
        "receiver" => {
            let (mut fast, peers) = open(message_config);
            let other = var("PEERS").parse::<u16>().unwrap();
            let mut next_index = 0u64;
            loop {
                let line = hear();
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.as_slice() {
                    ["receive", n] => {
                        let n: u64 = n.parse().unwrap();
                        let mut routes = String::new();
                        for _ in 0..n {
                            let got = next(&mut fast);
                            assert_eq!(got.peer, peers[0]);
                            let mut expected = message(seed, other, next_index);
                            expected.truncate(SLOT_PAYLOAD);
                            assert_eq!(got.data, expected, "message {next_index}");
                            routes.push(if got.route == Route::Fast { 'F' } else { 'O' });
                            next_index += 1;
                        }
                        // Every credit put has landed before the parent hears of it.
                        fast.flush().unwrap();
                        say(&format!("received {routes}"));
                    }
                    _ => break,
                }
            }
        }
        // Hosts lock 0 and the counter; computes (passive) or serves (served) until told to stop.
        "target" => {
            let (mut fast, _) = open(FastPathConfig::default());
            let region = fast.lock_region().clone();
            say("ready");
            let stop = Arc::new(AtomicBool::new(false));
            let flag = Arc::clone(&stop);
            std::thread::spawn(move || {
                let _ = hear();
                flag.store(true, Ordering::Release);
            });
            let mut work = 0u64;
            if var("MODE") == "passive" {
                // Computes and never calls the library until told to stop.
                while !stop.load(Ordering::Acquire) {
                    for i in 0..10_000u64 {
                        work = std::hint::black_box(work.wrapping_mul(31).wrapping_add(i));
                    }
                }
            } else {
                while !stop.load(Ordering::Acquire) {
                    assert!(fast.poll().unwrap().is_none());
                }
            }
            std::hint::black_box(work);
            say(&format!(
                "counter {} lock {}",
                region.bytes().load_u64(8),
                region.bytes().load_u64(0)
            ));
        }
        // Takes the target's lock ITERATIONS times, incrementing the counter by get and put.
        "contender" => {
            let iterations: u64 = var("ITERATIONS").parse().unwrap();
            let mode = if var("MODE") == "passive" {
                LockMode::Passive
            } else {
                LockMode::Served
            };
            let (mut fast, peers) = open(FastPathConfig::default());
            say("connected");
            assert_eq!(hear(), "go");
            let target = peers[0];
            for _ in 0..iterations {
                fast.lock(target, 0, mode).unwrap();
                let value = fast.read_u64(target, 0).unwrap();
                fast.write_u64(target, 0, value + 1).unwrap();
                fast.unlock(target, 0, mode).unwrap();
            }
            fast.flush().unwrap();
            say("done");
            assert_eq!(hear(), "exit");
        }
        // Connects to a peer whose port is not open yet and waits until its hello was refused;
        // then connects, and calls the library no more until told to receive.
        "early" => {
            let unit: u8 = var("UNIT").parse().unwrap();
            let port = Port::open_at(Path::new(&var("SOCKET")), unit, 1).unwrap();
            let mut fast = FastPath::new(port, FastPathConfig::default()).unwrap();
            let other = NodeId::new(var("PEERS").parse().unwrap());
            let peer = fast.connect(other, PortId(1)).unwrap();
            let deadline = Instant::now() + STAGE;
            while fast.stats().hellos_refused == 0 {
                assert!(
                    Instant::now() < deadline,
                    "no refusal of the hello within a stage"
                );
                assert!(fast.poll().unwrap().is_none());
            }
            say("refused");
            fast.wait_connected().unwrap();
            say("connected");
            assert_eq!(hear(), "receive");
            let got = next(&mut fast);
            assert_eq!((got.peer, got.data.as_slice()), (peer, LATE_HELLO));
            say("received");
            assert_eq!(hear(), "exit");
        }
        // Opens its port late, connects within LATE_SETUP and sends one message.
        "late" => {
            let config = FastPathConfig {
                setup_timeout: LATE_SETUP,
                ..FastPathConfig::default()
            };
            let (mut fast, peers) = open(config);
            say("connected");
            fast.send(peers[0], LATE_HELLO).unwrap();
            fast.flush().unwrap();
            say("sent");
            assert_eq!(hear(), "exit");
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn(
    role: &str,
    socket: &Path,
    unit: u16,
    peers: &str,
    seed: u64,
    env: &[(&str, String)],
) -> ChildProcess {
    let mut all = vec![
        ("SOCKET", socket.display().to_string()),
        ("UNIT", unit.to_string()),
        ("PEERS", peers.to_owned()),
        ("SEED", seed.to_string()),
    ];
    all.extend(env.iter().cloned());
    ChildProcess::spawn(&format!("{role} {unit}"), role, &all)
}

#[test]
fn thousands_of_messages_both_ways_arrive_byte_for_byte_in_order_through_faults() {
    let seed = common::seed(1);
    let dir = common::temp_dir("nicbar-fastpath");
    let daemon = emulator(dir.path(), 2, seed);
    let socket = daemon.socket().to_owned();
    let count = 3000u64;
    let env = [("COUNT", count.to_string())];
    let mut a = spawn("exchange", &socket, 0, "1", seed, &env);
    let mut b = spawn("exchange", &socket, 1, "0", seed, &env);
    for side in [&mut a, &mut b] {
        let line = side.expect("done", STAGE * 2);
        eprintln!("{}: {line}", side.name);
        let fast = field(&line, "fast");
        let too_long = field(&line, "too_long");
        assert_eq!(
            fast + too_long + field(&line, "no_credit") + field(&line, "no_ring"),
            count,
            "every message took one path"
        );
        assert_eq!(field(&line, "no_ring"), 0);
        // Half the lengths exceed a slot; most of the others must go fast, wrapping the ring.
        assert!(too_long > count / 3, "long messages fell back: {line}");
        assert!(
            fast / u64::from(SLOTS) > 50,
            "the ring wrapped many times: {line}"
        );
        assert!(
            field(&line, "received_fast") / u64::from(SLOTS) > 50,
            "{line}"
        );
        assert_eq!(
            field(&line, "received_fast") + field(&line, "received_ordinary"),
            count
        );
    }
    for side in [&mut a, &mut b] {
        side.say("exit");
    }
    a.wait_success(STAGE);
    b.wait_success(STAGE);
}

#[test]
fn a_peer_that_opens_late_connects_though_the_other_stopped_calling_the_library() {
    // The early process's hello is refused (the late one's port is not open); it connects once
    // the late one opens and says hello, then calls the library no more. Its hello must still
    // reach the late one, whose connection would otherwise time out.
    let seed = common::seed(5);
    let dir = common::temp_dir("nicbar-fastpath");
    let daemon = emulator(dir.path(), 2, seed);
    let socket = daemon.socket().to_owned();
    let mut early = spawn("early", &socket, 0, "1", seed, &[]);
    early.expect("refused", STAGE);
    let mut late = spawn("late", &socket, 1, "0", seed, &[]);
    late.expect("connected", STAGE);
    early.expect("connected", STAGE);
    late.expect("sent", STAGE);
    early.say("receive");
    early.expect("received", STAGE);
    for side in [&mut early, &mut late] {
        side.say("exit");
    }
    early.wait_success(STAGE);
    late.wait_success(STAGE);
}

#[test]
fn a_ring_out_of_credit_falls_back_in_order_and_recovers() {
    let seed = common::seed(2);
    let dir = common::temp_dir("nicbar-fastpath");
    let daemon = emulator(dir.path(), 2, seed);
    let socket = daemon.socket().to_owned();
    let mut sender = spawn("sender", &socket, 0, "1", seed, &[]);
    let mut receiver = spawn("receiver", &socket, 1, "0", seed, &[]);
    let extra = 20u64;
    let first = u64::from(SLOTS) + extra;

    // The receiver takes nothing yet: the ring fills, and the rest fall back.
    sender.say(&format!("send {first}"));
    let line = sender.expect("sent", STAGE);
    assert_eq!(field(&line, "fast"), u64::from(SLOTS), "{line}");
    assert_eq!(field(&line, "no_credit"), extra, "{line}");
    receiver.say(&format!("receive {first}"));
    let routes = receiver.expect("received", STAGE);
    assert_eq!(
        routes,
        format!(
            "{}{}",
            "F".repeat(SLOTS as usize),
            "O".repeat(extra as usize)
        ),
        "the fast-path messages first, then the fallback ones: the order sent"
    );

    // The credits came back: a whole ring goes fast again, and the stream stays in order.
    let second = 5 * u64::from(SLOTS);
    sender.say(&format!("send {}", u64::from(SLOTS)));
    let line = sender.expect("sent", STAGE);
    assert_eq!(field(&line, "fast"), 2 * u64::from(SLOTS), "{line}");
    assert_eq!(field(&line, "no_credit"), extra, "{line}");
    receiver.say(&format!("receive {}", u64::from(SLOTS)));
    assert_eq!(
        receiver.expect("received", STAGE),
        "F".repeat(SLOTS as usize)
    );
    // And with both running, everything arrives whichever path it takes.
    receiver.say(&format!("receive {second}"));
    sender.say(&format!("send {second}"));
    let line = sender.expect("sent", STAGE);
    let routes = receiver.expect("received", STAGE);
    assert_eq!(routes.len() as u64, second);
    assert!(field(&line, "fast") > 2 * u64::from(SLOTS), "{line}");
    sender.say("exit");
    receiver.say("exit");
    sender.wait_success(STAGE);
    receiver.wait_success(STAGE);
}

/// Eight contenders take the target's lock 0 in `mode` and add 1 to its counter by get and put
/// inside; the counter must end exact.
fn contend(mode: &str, default_seed: u64) {
    let seed = common::seed(default_seed);
    let contenders = 8u16;
    let iterations = 100u64;
    let dir = common::temp_dir("nicbar-fastpath");
    let daemon = emulator(dir.path(), contenders + 1, seed);
    let socket = daemon.socket().to_owned();
    let all: Vec<String> = (1..=contenders).map(|u| u.to_string()).collect();
    let mut target = spawn(
        "target",
        &socket,
        0,
        &all.join(","),
        seed,
        &[("MODE", mode.to_owned())],
    );
    let env = [
        ("MODE", mode.to_owned()),
        ("ITERATIONS", iterations.to_string()),
    ];
    let mut children: Vec<ChildProcess> = (1..=contenders)
        .map(|unit| spawn("contender", &socket, unit, "0", seed, &env))
        .collect();
    target.expect("ready", STAGE);
    for child in children.iter_mut() {
        child.expect("connected", STAGE);
    }
    for child in children.iter_mut() {
        child.say("go");
    }
    for child in children.iter_mut() {
        child.expect("done", STAGE * 2);
    }
    target.say("stop");
    let line = target.expect("counter", STAGE);
    assert_eq!(
        line,
        format!("{} lock 0", u64::from(contenders) * iterations),
        "every increment made under the lock counted once, and the lock free at the end"
    );
    target.wait_success(STAGE);
    for child in children.iter_mut() {
        child.say("exit");
        child.wait_success(STAGE);
    }
}

#[test]
fn a_passive_lock_is_mutually_exclusive_while_its_target_only_computes() {
    contend("passive", 3);
}

#[test]
fn a_served_lock_is_mutually_exclusive_while_its_target_serves() {
    contend("served", 4);
}
