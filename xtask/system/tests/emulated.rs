//! The emulated NIC with real processes and real sockets: processes (this test binary, started
//! again as children) open ports through the daemon's control socket and talk through their
//! mapped regions; the daemon runs in this process ([`Emulator::spawn`]) or as `nicctl emulate`.
//!
//! Every wait is on an event with a bounded timeout that fails loudly, naming what was awaited.
//! Randomness (fault injection, message lengths) comes from a seed that is printed;
//! `NICBAR_TEST_SEED=S` replays one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nicbar::{DmaBuffer, Error, Event, NodeId, Port, PortId, Priority, Status, WaitMode};
use nicbar_control::query_status;
use nicbar_emulator::fault::Rng;
use nicbar_emulator::{Emulator, EmulatorConfig, EmulatorHandle, FaultConfig};

mod common;
use common::{ChildProcess, ROLE, STAGE, hear, say, terminate, var};
use nicbar_system::free_udp_port;

fn seed() -> u64 {
    common::seed(0x5eed_2026)
}

fn temp_dir() -> tempfile::TempDir {
    common::temp_dir("nicbar-test")
}

/// Size class of every test message: buffers of 1024 bytes, messages of up to 1016.
const SIZE: u8 = 10;
/// Bytes before a test message's filler: sender node, sender port, sequence number.
const MESSAGE_HEADER: usize = 8;

// ---------------------------------------------------------------------------------------------
// Child processes.

/// The body of the child processes: one role each, chosen by `NICBAR_TEST_ROLE`.
#[test]
#[ignore = "the body of the child processes that the other tests start"]
fn child() {
    let role = std::env::var(ROLE).expect("started by another test, with NICBAR_TEST_ROLE");
    match role.as_str() {
        "stream" => stream_role(),
        "victim" => victim_role(),
        "flood" => flood_role(),
        "receiver" => receiver_role(),
        "holder" => holder_role(),
        "garbage" => garbage_role(),
        other => panic!("unknown role {other}"),
    }
}

fn endpoint(text: &str) -> (NodeId, PortId) {
    let (node, port) = text.split_once(':').unwrap();
    (
        NodeId::new(node.parse().unwrap()),
        PortId(port.parse().unwrap()),
    )
}

/// Opens `UNIT`/`PORT` through `SOCKET`, or, without it, through the library's default path
/// rule (which honours `NICBAR_SOCKET`).
fn open_from_env() -> Port {
    let (unit, port) = (var("UNIT").parse().unwrap(), var("PORT").parse().unwrap());
    let port = match std::env::var("NICBAR_TEST_SOCKET") {
        Ok(socket) => Port::open_at(&PathBuf::from(socket), unit, port),
        Err(_) => Port::open(unit, port),
    }
    .unwrap_or_else(|e| panic!("open: {e}"));
    say(&format!(
        "open node={} port={} pid={}",
        port.node_id().get(),
        port.port_id().0,
        std::process::id()
    ));
    port
}

// ---------------------------------------------------------------------------------------------
// Message traffic with checks: exactly once, in order, intact.

/// One port's side of a test exchange: it sends `count` numbered messages to each target and
/// expects `count` from each source, in order and intact.
struct Traffic {
    port: Port,
    free: Vec<DmaBuffer>,
    targets: Vec<(NodeId, PortId)>,
    next_seq: Vec<u32>,
    next_target: usize,
    count: u32,
    issued: u32,
    sent_ok: u32,
    expected: HashMap<(u16, u8), u32>,
    received: u32,
    rng: Rng,
}

impl Traffic {
    fn new(
        mut port: Port,
        targets: Vec<(NodeId, PortId)>,
        sources: &[(NodeId, PortId)],
        count: u32,
        seed: u64,
    ) -> Self {
        let free: Vec<DmaBuffer> = (0..48).map(|_| port.dma_alloc(1024).unwrap()).collect();
        for tag in 0..48 {
            let buffer = port.dma_alloc(1024).unwrap();
            port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
                .unwrap();
        }
        let stream = u64::from(port.node_id().get()) << 8 | u64::from(port.port_id().0);
        Self {
            free,
            next_seq: vec![0; targets.len()],
            targets,
            next_target: 0,
            count,
            issued: 0,
            sent_ok: 0,
            expected: sources
                .iter()
                .map(|(node, port)| ((node.get(), port.0), 0))
                .collect(),
            received: 0,
            rng: Rng::new(seed, stream),
            port,
        }
    }

    fn to_send(&self) -> u32 {
        self.count * self.targets.len() as u32
    }

    fn to_receive(&self) -> u32 {
        self.count * self.expected.len() as u32
    }

    fn done(&self) -> bool {
        self.sent_ok == self.to_send() && self.received == self.to_receive()
    }

    fn can_issue(&self) -> bool {
        self.issued < self.to_send() && !self.free.is_empty() && self.port.send_tokens() > 0
    }

    /// Sends while it has messages, buffers and tokens.
    fn issue(&mut self) {
        while self.can_issue() {
            let mut buffer = self.free.pop().unwrap();
            let target = loop {
                let t = self.next_target % self.targets.len();
                self.next_target += 1;
                if self.next_seq[t] < self.count {
                    break t;
                }
            };
            let seq = self.next_seq[target];
            self.next_seq[target] += 1;
            let length = MESSAGE_HEADER + (self.rng.next_u64() % 1009) as usize;
            fill(
                &mut buffer[..length],
                self.port.node_id().get(),
                self.port.port_id().0,
                seq,
            );
            let (node, port) = self.targets[target];
            self.port
                .send(
                    buffer,
                    length,
                    SIZE,
                    Priority::LOW,
                    node,
                    port,
                    u64::from(seq),
                )
                .unwrap_or_else(|e| panic!("send: {e}"));
            self.issued += 1;
        }
    }

    /// Checks one event and recycles its buffer.
    fn handle(&mut self, event: Event) {
        match event {
            Event::Received {
                buffer,
                length,
                sender_node,
                sender_port,
                status,
                ..
            } => {
                assert_eq!(
                    status,
                    Status::SUCCESS,
                    "receive from {sender_node} {sender_port}"
                );
                let key = (sender_node.get(), sender_port.0);
                let expected = self.expected.get_mut(&key).unwrap_or_else(|| {
                    panic!("a message from {sender_node} {sender_port}, which sends none here")
                });
                let seq = check(&buffer[..length], key.0, key.1);
                assert_eq!(
                    seq, *expected,
                    "from {sender_node} {sender_port}: message {seq} arrived, {expected} expected"
                );
                assert!(
                    seq < self.count,
                    "message {seq} beyond the {} sent",
                    self.count
                );
                *expected += 1;
                self.received += 1;
                self.port
                    .provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
                    .unwrap_or_else(|e| panic!("provide: {e}"));
            }
            Event::Sent {
                buffer,
                status,
                context,
                target_node,
                target_port,
            } => {
                assert_eq!(
                    status,
                    Status::SUCCESS,
                    "send {context} to {target_node} {target_port}"
                );
                self.sent_ok += 1;
                self.free.push(buffer);
            }
            other => panic!("unexpected event {other:?}"),
        }
    }

    fn progress(&self) -> String {
        format!(
            "{} {}: sent {}/{} (issued {}), received {}/{} {:?}",
            self.port.node_id(),
            self.port.port_id(),
            self.sent_ok,
            self.to_send(),
            self.issued,
            self.received,
            self.to_receive(),
            self.expected
        )
    }

    /// Runs alone until done, sleeping on the event doorbell between events.
    fn run(&mut self, deadline: Instant) {
        while !self.done() {
            assert!(Instant::now() < deadline, "stalled: {}", self.progress());
            self.issue();
            if let Some(event) = self
                .port
                .receive_timeout(Duration::from_millis(200))
                .unwrap_or_else(|e| panic!("receive: {e}"))
            {
                self.handle(event);
            }
        }
    }
}

/// Several [`Traffic`]s of this process, driven in turn until all are done.
fn run_together(traffic: &mut [&mut Traffic], deadline: Instant) {
    while !traffic.iter().all(|t| t.done()) {
        let progress: Vec<String> = traffic.iter().map(|t| t.progress()).collect();
        assert!(Instant::now() < deadline, "stalled: {progress:#?}");
        let mut idle = true;
        for t in traffic.iter_mut() {
            t.issue();
            while let Some(event) = t.port.receive().unwrap() {
                t.handle(event);
                idle = false;
            }
        }
        if idle && let Some(t) = traffic.iter_mut().find(|t| !t.done()) {
            // Nothing waiting anywhere: sleep on one port's doorbell, briefly, since another
            // port's event would not wake it.
            if let Some(event) = t.port.receive_timeout(Duration::from_millis(2)).unwrap() {
                t.handle(event);
            }
        }
    }
}

fn fill(bytes: &mut [u8], node: u16, port: u8, seq: u32) {
    bytes[..2].copy_from_slice(&node.to_le_bytes());
    bytes[2] = port;
    bytes[3] = 0;
    bytes[4..8].copy_from_slice(&seq.to_le_bytes());
    for (i, byte) in bytes[MESSAGE_HEADER..].iter_mut().enumerate() {
        *byte = filler(node, seq, i);
    }
}

fn filler(node: u16, seq: u32, i: usize) -> u8 {
    (seq.wrapping_mul(31) as usize + i * 7 + usize::from(node)) as u8
}

/// Checks a message's header names its sender and its filler is intact; returns its number.
fn check(bytes: &[u8], node: u16, port: u8) -> u32 {
    assert!(
        bytes.len() >= MESSAGE_HEADER,
        "a {} byte message",
        bytes.len()
    );
    assert_eq!(
        u16::from_le_bytes([bytes[0], bytes[1]]),
        node,
        "sender node"
    );
    assert_eq!(bytes[2], port, "sender port");
    let seq = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
    for (i, byte) in bytes[MESSAGE_HEADER..].iter().enumerate() {
        assert_eq!(*byte, filler(node, seq, i), "byte {i} of message {seq}");
    }
    seq
}

// ---------------------------------------------------------------------------------------------
// Roles.

/// Sends `COUNT` messages to each of `PEERS` and receives `COUNT` from each, after `go`.
fn stream_role() {
    let port = open_from_env();
    let peers: Vec<_> = var("PEERS").split(',').map(endpoint).collect();
    let count = var("COUNT").parse().unwrap();
    let mut traffic = Traffic::new(
        port,
        peers.clone(),
        &peers,
        count,
        var("SEED").parse().unwrap(),
    );
    assert_eq!(hear(), "go");
    traffic.run(Instant::now() + STAGE);
    let counters = traffic.port.counters();
    say(&format!(
        "done sent={} received={} doorbells={} sleeps={}",
        traffic.sent_ok, traffic.received, counters.doorbells, counters.sleeps
    ));
    assert_eq!(hear(), "finish");
    // Everything is acknowledged: nothing more may arrive (a duplicate would show up here).
    assert!(
        traffic.port.receive().unwrap().is_none(),
        "an event after the exchange finished"
    );
}

/// Receives (and re-provides buffers) until killed, reporting every 100 messages.
fn victim_role() {
    let mut port = open_from_env();
    for tag in 0..32 {
        let buffer = port.dma_alloc(1024).unwrap();
        port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
            .unwrap();
    }
    let mut received = 0u64;
    loop {
        match port.blocking_receive().unwrap() {
            Event::Received { buffer, .. } => {
                received += 1;
                if received % 100 == 0 {
                    say(&format!("received {received}"));
                }
                port.provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
                    .unwrap();
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
}

/// After `go`, sends to `TARGET` until a send ends with TARGET_PORT_CLOSED; reports; after the
/// next `go`, sends `COUNT` more, all of which must arrive.
fn flood_role() {
    let mut port = open_from_env();
    let (node, target) = endpoint(&var("TARGET"));
    let mut free: Vec<DmaBuffer> = (0..32).map(|_| port.dma_alloc(1024).unwrap()).collect();
    assert_eq!(hear(), "go");
    let (mut outstanding, mut succeeded, mut closed, mut seq) = (0u32, 0u32, 0u32, 0u32);
    let deadline = Instant::now() + STAGE;
    while closed == 0 || outstanding > 0 {
        assert!(
            Instant::now() < deadline,
            "no TARGET_PORT_CLOSED: {succeeded} sends succeeded, {outstanding} outstanding"
        );
        while closed == 0 && port.send_tokens() > 0 && !free.is_empty() {
            let mut buffer = free.pop().unwrap();
            fill(
                &mut buffer[..64],
                port.node_id().get(),
                port.port_id().0,
                seq,
            );
            port.send(
                buffer,
                64,
                SIZE,
                Priority::LOW,
                node,
                target,
                u64::from(seq),
            )
            .unwrap();
            seq += 1;
            outstanding += 1;
        }
        match port.receive_timeout(Duration::from_millis(200)).unwrap() {
            Some(Event::Sent { buffer, status, .. }) => {
                outstanding -= 1;
                free.push(buffer);
                match status {
                    Status::SUCCESS => succeeded += 1,
                    Status::TARGET_PORT_CLOSED => closed += 1,
                    other => panic!("a send to the victim ended with {other:?}"),
                }
            }
            Some(other) => panic!("unexpected event {other:?}"),
            None => {}
        }
    }
    say(&format!("closed succeeded={succeeded} closed={closed}"));
    assert_eq!(hear(), "go");
    let count: u32 = var("COUNT").parse().unwrap();
    let mut sent = 0;
    let mut done = 0;
    let deadline = Instant::now() + STAGE;
    while done < count {
        assert!(
            Instant::now() < deadline,
            "{done}/{count} sends to the new owner done"
        );
        while sent < count && port.send_tokens() > 0 && !free.is_empty() {
            let mut buffer = free.pop().unwrap();
            fill(
                &mut buffer[..64],
                port.node_id().get(),
                port.port_id().0,
                sent,
            );
            port.send(
                buffer,
                64,
                SIZE,
                Priority::LOW,
                node,
                target,
                u64::from(sent),
            )
            .unwrap();
            sent += 1;
        }
        match port.receive_timeout(Duration::from_millis(200)).unwrap() {
            Some(Event::Sent { buffer, status, .. }) => {
                assert_eq!(status, Status::SUCCESS, "a send to the port's new owner");
                free.push(buffer);
                done += 1;
            }
            Some(other) => panic!("unexpected event {other:?}"),
            None => {}
        }
    }
    say("resent-ok");
}

/// Receives `COUNT` messages from `FROM`, in order.
fn receiver_role() {
    let port = open_from_env();
    let from = endpoint(&var("FROM"));
    let mut traffic = Traffic::new(port, Vec::new(), &[from], var("COUNT").parse().unwrap(), 0);
    traffic.run(Instant::now() + STAGE);
    say(&format!("done received={}", traffic.received));
}

/// Holds a port until told to `exit`, then closes it and waits for the daemon to confirm.
fn holder_role() {
    let port = open_from_env();
    assert_eq!(hear(), "exit");
    port.close().unwrap();
}

/// Writes garbage tokens straight into its send ring and reports the refusals; then breaks the
/// ring's index and reports that too.
fn garbage_role() {
    use shared_abi::token::{SendKind, SendToken};
    use zerocopy::FromBytes;

    let mut port = open_from_env();
    let mut rng = Rng::new(var("SEED").parse().unwrap(), 99);
    let mut bytes = [0u8; 64];
    for byte in bytes.iter_mut() {
        *byte = rng.next_u64() as u8;
    }
    if matches!(bytes[0], 1 | 2) {
        bytes[0] |= 0x80;
    }
    let random = SendToken::read_from_bytes(&bytes).unwrap();
    let data = |length: u32, size: u8, buffer: u64, port: u8| SendToken {
        kind: SendKind::DATA,
        size,
        length: length.into(),
        buffer: buffer.into(),
        target_node: NodeId::new(0),
        target_port: PortId(port),
        ..SendToken::default()
    };
    let tokens = [
        (random, Status::INVALID_TOKEN),
        (data(100, SIZE, 1 << 40, 1), Status::BAD_BUFFER),
        (data(8, 2, 0, 1), Status::INVALID_TOKEN),
        (data(2000, SIZE, 0, 1), Status::TOO_LONG),
        (data(8, SIZE, 0, 200), Status::INVALID_TOKEN),
    ];
    for (token, _) in &tokens {
        port.post_raw_send_token(token).unwrap();
    }
    let mut statuses = Vec::new();
    let deadline = Instant::now() + STAGE;
    while statuses.len() < tokens.len() {
        assert!(Instant::now() < deadline, "refusals so far: {statuses:?}");
        match port.receive_timeout(Duration::from_millis(200)).unwrap() {
            Some(Event::SendRejected { status, buffer, .. }) => {
                assert!(buffer.is_none(), "a raw token has no buffer of the library");
                statuses.push(status);
            }
            Some(other) => panic!("unexpected event {other:?}"),
            None => {}
        }
    }
    let wanted: Vec<Status> = tokens.iter().map(|(_, status)| *status).collect();
    assert_eq!(statuses, wanted, "the refusals, in token order");
    assert_eq!(
        port.send_tokens(),
        64,
        "every refusal returned its send token"
    );

    // The port still works: a message to itself (the NIC's loopback).
    let buffer = port.dma_alloc(1024).unwrap();
    port.provide_receive_buffer(buffer, SIZE, Priority::LOW, 7)
        .unwrap();
    let mut message = port.dma_alloc(1024).unwrap();
    fill(
        &mut message[..100],
        port.node_id().get(),
        port.port_id().0,
        0,
    );
    let (me, my_port) = (port.node_id(), port.port_id());
    port.send(message, 100, SIZE, Priority::LOW, me, my_port, 1)
        .unwrap();
    let (mut received, mut sent) = (false, false);
    while !(received && sent) {
        assert!(
            Instant::now() < deadline,
            "loopback: received {received}, sent {sent}"
        );
        match port.receive_timeout(Duration::from_millis(200)).unwrap() {
            Some(Event::Received {
                buffer,
                length,
                tag,
                ..
            }) => {
                assert_eq!((length, tag), (100, 7));
                check(&buffer[..length], me.get(), my_port.0);
                received = true;
            }
            Some(Event::Sent { status, .. }) => {
                assert_eq!(status, Status::SUCCESS);
                sent = true;
            }
            Some(other) => panic!("unexpected event {other:?}"),
            None => {}
        }
    }
    say(&format!("rejected {statuses:?}"));

    // An impossible producer index: the NIC reports the ring corrupt and resynchronises.
    port.scribble_send_ring_tail(0x8000_0000);
    loop {
        assert!(Instant::now() < deadline, "no RING_CORRUPT report");
        match port.receive_timeout(Duration::from_millis(200)).unwrap() {
            Some(Event::RingCorrupt) => break,
            Some(other) => panic!("unexpected event {other:?}"),
            None => {}
        }
    }
    say("ring-corrupt");
}

// ---------------------------------------------------------------------------------------------
// The tests.

fn emulator(dir: &Path, units: u16, faults: Option<FaultConfig>) -> EmulatorHandle {
    let mut config = EmulatorConfig::in_process(dir.join("control.sock"), units);
    if let Some(faults) = faults {
        eprintln!("fault injector: {faults}");
    }
    config.faults = faults;
    Emulator::spawn(config).unwrap()
}

fn env_of(socket: &Path, unit: u8, port: u8) -> Vec<(&'static str, String)> {
    vec![
        ("SOCKET", socket.display().to_string()),
        ("UNIT", unit.to_string()),
        ("PORT", port.to_string()),
    ]
}

/// Starts one process per unit (process `i` owns port `i % 7 + 1` of unit `i`), each sending
/// `count` messages to every other and checking what it receives; returns the daemon's report.
fn all_to_all(units: u8, count: u32, faults: FaultConfig) -> nicbar_control::StatusReport {
    let dir = temp_dir();
    let emulator = emulator(dir.path(), u16::from(units), Some(faults));
    let socket = emulator.socket().to_owned();
    let endpoints: Vec<(u8, u8)> = (0..units).map(|i| (i, i % 7 + 1)).collect();
    let peers = u32::from(units) - 1;
    let mut children: Vec<ChildProcess> = endpoints
        .iter()
        .map(|&(unit, port)| {
            let peers: Vec<String> = endpoints
                .iter()
                .filter(|&&other| other != (unit, port))
                .map(|(node, port)| format!("{node}:{port}"))
                .collect();
            let mut env = env_of(&socket, unit, port);
            env.push(("PEERS", peers.join(",")));
            env.push(("COUNT", count.to_string()));
            env.push(("SEED", faults.seed.to_string()));
            ChildProcess::spawn(&format!("process on unit {unit}"), "stream", &env)
        })
        .collect();
    for child in children.iter_mut() {
        child.expect("open", STAGE);
    }
    let started = Instant::now();
    for child in children.iter_mut() {
        child.say("go");
    }
    for child in children.iter_mut() {
        let done = child.expect("done", STAGE);
        eprintln!("{}: {done}", child.name);
        assert!(
            done.starts_with(&format!(
                "sent={} received={}",
                peers * count,
                peers * count
            )),
            "{done}"
        );
    }
    eprintln!(
        "{} messages among {units} processes in {:?}",
        u32::from(units) * peers * count,
        started.elapsed()
    );
    for child in children.iter_mut() {
        child.say("finish");
        child.wait_success(STAGE);
    }
    let report = query_status(&socket).unwrap();
    let wire = report.units.iter().fold((0, 0, 0), |acc, unit| {
        (
            acc.0 + unit.wire.lost,
            acc.1 + unit.wire.duplicated,
            acc.2 + unit.wire.delayed,
        )
    });
    let resent: u64 = report
        .units
        .iter()
        .flat_map(|unit| &unit.connections)
        .map(|c| c.resent)
        .sum();
    eprintln!(
        "lost {}, duplicated {}, delayed {}, resent {resent}",
        wire.0, wire.1, wire.2
    );
    assert!(
        wire.0 > 0 && wire.1 > 0 && wire.2 > 0,
        "the faults did not happen: {wire:?}"
    );
    assert!(resent > 0, "nothing was retransmitted");
    assert_eq!(report.fault_seed, Some(faults.seed));
    report
}

#[test]
fn four_processes_on_four_units_get_every_message_once_in_order_through_faults() {
    let faults = FaultConfig {
        loss: 0.15,
        duplicate: 0.1,
        reorder: 0.1,
        ..FaultConfig::none(seed())
    };
    all_to_all(4, 150, faults);
}

#[test]
fn sixteen_processes_on_sixteen_units_fit_two_cores() {
    let faults = FaultConfig {
        loss: 0.1,
        duplicate: 0.05,
        reorder: 0.05,
        ..FaultConfig::none(seed())
    };
    let report = all_to_all(16, 20, faults);
    assert_eq!(report.units.len(), 16);
}

#[test]
fn a_killed_process_releases_its_port_and_its_peers_are_told() {
    let seed = seed();
    let dir = temp_dir();
    let faults = FaultConfig {
        loss: 0.1,
        duplicate: 0.05,
        reorder: 0.05,
        ..FaultConfig::none(seed)
    };
    let emulator = emulator(dir.path(), 2, Some(faults));
    let socket = emulator.socket().to_owned();
    let mut victim = ChildProcess::spawn("victim", "victim", &env_of(&socket, 1, 2));
    victim.expect("open", STAGE);
    let mut flood_env = env_of(&socket, 0, 1);
    flood_env.push(("TARGET", "1:2".to_owned()));
    flood_env.push(("COUNT", "50".to_owned()));
    let mut flood = ChildProcess::spawn("flood", "flood", &flood_env);
    flood.expect("open", STAGE);
    flood.say("go");
    victim.expect("received 200", STAGE);
    // Mid-stream: SIGKILL, no chance to close anything.
    victim.child.kill().unwrap();
    let status = victim.wait(STAGE);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{status}"
    );
    let closed = flood.expect("closed", STAGE);
    eprintln!("flood: {closed}");

    // The daemon runs on, and the port is free again.
    let report = query_status(&socket).unwrap();
    assert!(
        report.units[1].ports.iter().all(|p| p.port != 2),
        "port 2 of unit 1 still open: {:?}",
        report.units[1].ports
    );
    let mut heir_env = env_of(&socket, 1, 2);
    heir_env.push(("FROM", "0:1".to_owned()));
    heir_env.push(("COUNT", "50".to_owned()));
    let mut heir = ChildProcess::spawn("new owner", "receiver", &heir_env);
    heir.expect("open", STAGE);
    flood.say("go");
    heir.expect("done received=50", STAGE);
    flood.expect("resent-ok", STAGE);
    heir.wait_success(STAGE);
    flood.wait_success(STAGE);
    let report = query_status(&socket).unwrap();
    let generation = report.units[1]
        .ports
        .iter()
        .find(|p| p.port == 2)
        .map(|p| p.generation);
    assert_eq!(generation, None, "the new owner exited and closed it too");
}

#[test]
fn an_owned_port_cannot_be_taken_and_errors_say_which() {
    let dir = temp_dir();
    let emulator = emulator(dir.path(), 1, None);
    let socket = emulator.socket().to_owned();
    // The holder finds the daemon through NICBAR_SOCKET, as any program would.
    let mut command =
        ChildProcess::command("holder", &[("UNIT", "0".into()), ("PORT", "5".into())]);
    command.env("NICBAR_SOCKET", &socket);
    let mut holder = ChildProcess::start("holder", command);
    let opened = holder.expect("open", STAGE);
    assert!(
        opened.ends_with(&format!("pid={}", holder.pid())),
        "{opened}"
    );
    match Port::open_at(&socket, 0, 5) {
        Err(Error::PortBusy {
            unit: 0,
            port: 5,
            owner_pid,
        }) => assert_eq!(owner_pid, holder.pid()),
        other => panic!("a second owner of port 5: {other:?}"),
    }
    let error = Port::open_at(&socket, 0, 5).unwrap_err().to_string();
    assert_eq!(
        error,
        format!("port 5 of unit 0 is owned by process {}", holder.pid())
    );
    assert!(matches!(
        Port::open_at(&socket, 3, 0),
        Err(Error::NoSuchUnit { unit: 3, units: 1 })
    ));
    assert!(matches!(
        Port::open_at(&socket, 0, 8),
        Err(Error::NoSuchPort { port: 8 })
    ));
    assert!(matches!(
        Port::open_at(&dir.path().join("nothing.sock"), 0, 0),
        Err(Error::DaemonUnreachable { .. })
    ));
    // This process owns a port too: another open of it, even from here, is refused.
    let mine = Port::open_at(&socket, 0, 6).unwrap();
    match Port::open_at(&socket, 0, 6) {
        Err(Error::PortBusy { owner_pid, .. }) => assert_eq!(owner_pid, std::process::id()),
        other => panic!("a second open of an owned port: {other:?}"),
    }
    drop(mine);
    // The holder closes and waits for the daemon's confirmation: the port is free at once.
    holder.say("exit");
    holder.wait_success(STAGE);
    let port = Port::open_at(&socket, 0, 5).unwrap();
    assert_eq!(
        (port.unit(), port.port_id(), port.node_id()),
        (0, PortId(5), NodeId::new(0))
    );
}

#[test]
fn garbage_in_one_ports_ring_is_refused_there_and_neighbours_carry_on() {
    let seed = seed();
    let dir = temp_dir();
    let emulator = emulator(dir.path(), 2, None);
    let socket = emulator.socket().to_owned();
    // Neighbours: port 4 of unit 0 (the garbage writer's NIC) and port 4 of unit 1.
    let near = Port::open_at(&socket, 0, 4).unwrap();
    let far = Port::open_at(&socket, 1, 4).unwrap();
    let near_id = (near.node_id(), near.port_id());
    let far_id = (far.node_id(), far.port_id());
    let mut near = Traffic::new(near, vec![far_id], &[far_id], 40, seed);
    let mut far = Traffic::new(far, vec![near_id], &[near_id], 40, seed);
    near.count = 20;
    far.count = 20;
    run_together(&mut [&mut near, &mut far], Instant::now() + STAGE);

    let mut env = env_of(&socket, 0, 3);
    env.push(("SEED", seed.to_string()));
    let mut garbage = ChildProcess::spawn("garbage writer", "garbage", &env);
    let rejected = garbage.expect("rejected", STAGE);
    eprintln!("garbage writer: rejected {rejected}");
    garbage.expect("ring-corrupt", STAGE);
    garbage.wait_success(STAGE);

    // The neighbours saw nothing of it (any stray event fails `handle`) and still talk.
    near.count = 40;
    far.count = 40;
    run_together(&mut [&mut near, &mut far], Instant::now() + STAGE);
    assert!(near.port.receive().unwrap().is_none());
    assert!(far.port.receive().unwrap().is_none());
    let report = query_status(&socket).unwrap();
    assert_eq!(
        report.units[0].counters.tokens_rejected, 6,
        "{:?}",
        report.units[0]
    );
    assert_eq!(report.units[1].counters.tokens_rejected, 0);
}

fn nicctl() -> Command {
    Command::new(common::nicctl())
}

/// Writes a fabric map of nodes 10 (127.0.0.1) and 11 (127.0.0.2) on free UDP ports.
fn two_node_map(dir: &Path) -> PathBuf {
    let map = dir.join("fabric.map");
    std::fs::write(
        &map,
        format!(
            "# two daemons on one host\nnode 10 127.0.0.1:{}\nnode 11 127.0.0.2:{}\n",
            free_udp_port("127.0.0.1").unwrap(),
            free_udp_port("127.0.0.2").unwrap()
        ),
    )
    .unwrap();
    map
}

/// Starts `nicctl emulate` for `node` of `map`, with faults from `seed`, and waits until it
/// listens; returns it and its socket.
fn start_daemon(dir: &Path, map: &Path, node: u16, seed: u64) -> (ChildProcess, PathBuf) {
    let socket = dir.join(format!("node{node}.sock"));
    let mut command = nicctl();
    command
        .arg("emulate")
        .arg("--socket")
        .arg(&socket)
        .arg("--fabric")
        .arg(map)
        .arg("--fabric-key")
        .arg(common::fabric_key(dir))
        .args(["--node", &node.to_string()])
        .args(["--loss", "0.1", "--duplicate", "0.05", "--reorder", "0.1"])
        .args(["--seed", &seed.to_string()])
        .stdout(Stdio::piped());
    let mut child = ChildProcess::start(&format!("daemon of node {node}"), command);
    child.expect("nicctl emulate: listening on", STAGE);
    (child, socket)
}

#[test]
fn two_daemons_talk_over_udp_through_faults() {
    let seed = seed();
    let dir = temp_dir();
    let map = two_node_map(dir.path());
    let (mut one, one_socket) = start_daemon(dir.path(), &map, 10, seed);
    let (mut two, two_socket) = start_daemon(dir.path(), &map, 11, seed + 1);
    let a = Port::open_at(&one_socket, 0, 1).unwrap();
    let b = Port::open_at(&two_socket, 0, 2).unwrap();
    assert_eq!(
        (a.node_id(), b.node_id()),
        (NodeId::new(10), NodeId::new(11))
    );
    let a_id = (a.node_id(), a.port_id());
    let b_id = (b.node_id(), b.port_id());
    let mut a = Traffic::new(a, vec![b_id], &[b_id], 200, seed);
    let mut b = Traffic::new(b, vec![a_id], &[a_id], 200, seed);
    let started = Instant::now();
    run_together(&mut [&mut a, &mut b], Instant::now() + STAGE);
    eprintln!("400 messages over UDP in {:?}", started.elapsed());

    let status = nicctl()
        .arg("status")
        .arg("--socket")
        .arg(&one_socket)
        .arg("--json")
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let unit = &report["units"][0];
    assert_eq!(unit["node"], 10);
    assert_eq!(unit["ports"][0]["owner_pid"], std::process::id());
    let connection = unit["connections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["peer"] == 11)
        .unwrap_or_else(|| panic!("no connection to node 11: {report}"));
    assert!(connection["sent"].as_u64().unwrap() >= 200, "{connection}");
    assert!(connection["resent"].as_u64().unwrap() > 0, "{connection}");
    let table = nicctl()
        .arg("status")
        .arg("--socket")
        .arg(&two_socket)
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.contains("RESENT") && table.contains("127.0.0.2:"),
        "{table}"
    );

    drop((a, b));
    terminate(&mut one);
    terminate(&mut two);
}

#[test]
fn a_restarted_daemon_is_reachable_again() {
    let seed = seed();
    let dir = temp_dir();
    let map = two_node_map(dir.path());
    let (mut one, one_socket) = start_daemon(dir.path(), &map, 10, seed);
    let (mut two, two_socket) = start_daemon(dir.path(), &map, 11, seed + 1);
    let a = Port::open_at(&one_socket, 0, 1).unwrap();
    let b = Port::open_at(&two_socket, 0, 2).unwrap();
    let a_id = (a.node_id(), a.port_id());
    let b_id = (b.node_id(), b.port_id());
    let mut a = Traffic::new(a, vec![b_id], &[b_id], 50, seed);
    let mut b = Traffic::new(b, vec![a_id], &[a_id], 50, seed);
    run_together(&mut [&mut a, &mut b], Instant::now() + STAGE);

    // Node 11's daemon restarts: node 10 keeps its connection state toward it, the new NIC has
    // none (and another boot nonce). Both directions must resynchronise, well before the
    // firmware's give-up time (whose failure, TARGET_NODE_UNREACHABLE, fails the exchange).
    drop(b);
    terminate(&mut two);
    let (mut two, two_socket) = start_daemon(dir.path(), &map, 11, seed + 2);
    let b = Port::open_at(&two_socket, 0, 2).unwrap();
    let mut a = Traffic::new(a.port, vec![b_id], &[b_id], 50, seed + 1);
    let mut b = Traffic::new(b, vec![a_id], &[a_id], 50, seed + 1);
    run_together(&mut [&mut a, &mut b], Instant::now() + STAGE);

    drop((a, b));
    terminate(&mut one);
    terminate(&mut two);
}

/// Reads a process's user + system CPU time in clock ticks from `/proc/<pid>/stat`.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn sixteen_idle_nics_with_open_ports_sleep() {
    let dir = temp_dir();
    let socket = dir.path().join("control.sock");
    let mut command = nicctl();
    command
        .arg("emulate")
        .arg("--socket")
        .arg(&socket)
        .args(["--units", "16"])
        .stdout(Stdio::piped());
    let mut daemon = ChildProcess::start("daemon of 16 units", command);
    daemon.expect("nicctl emulate: listening on", STAGE);
    let mut ports: Vec<Port> = (0..16)
        .map(|unit| Port::open_at(&socket, unit, 0).unwrap())
        .collect();
    // One round of traffic so every NIC has a connection, then silence.
    for port in ports.iter_mut() {
        let buffer = port.dma_alloc(1024).unwrap();
        port.provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
            .unwrap();
    }
    for (i, port) in ports.iter_mut().enumerate() {
        let buffer = port.dma_alloc(64).unwrap();
        let next = NodeId::new(((i + 1) % 16) as u16);
        port.send(buffer, 8, SIZE, Priority::LOW, next, PortId(0), 0)
            .unwrap();
    }
    for port in ports.iter_mut() {
        for _ in 0..2 {
            match port.receive_timeout(STAGE).unwrap() {
                Some(Event::Received { .. }) => {}
                Some(Event::Sent { status, .. }) => assert_eq!(status, Status::SUCCESS),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    // A process sleeping in blocking receive costs nothing either: measure both.
    let before = (cpu_ticks(daemon.pid()), cpu_ticks(std::process::id()));
    let window = Instant::now();
    let idle = ports[0].receive_timeout(Duration::from_secs(1)).unwrap();
    assert!(idle.is_none(), "an event on an idle port: {idle:?}");
    let elapsed = window.elapsed();
    let daemon_ticks = cpu_ticks(daemon.pid()) - before.0;
    eprintln!(
        "16 idle NICs with open ports: {daemon_ticks} ticks of CPU in {elapsed:?} (a tick is \
         1/100 s)"
    );
    assert!(
        daemon_ticks <= 5,
        "the idle daemon used {daemon_ticks} ticks in {elapsed:?}"
    );
    // Nobody left: with no port open the adaptive NIC thread (1 port + 1 thread would fit two
    // cores) has nothing to poll for and sleeps too.
    drop(ports);
    let before = cpu_ticks(daemon.pid());
    std::thread::sleep(Duration::from_secs(1));
    let unused_ticks = cpu_ticks(daemon.pid()) - before;
    assert!(
        unused_ticks <= 5,
        "the daemon with no port open used {unused_ticks} ticks in a second"
    );
    terminate(&mut daemon);
}

/// A port's default wait spins only a little: a process with nothing coming gives its core away
/// and sleeps on its doorbell.
#[test]
fn the_default_wait_sleeps_when_nothing_comes() {
    let dir = temp_dir();
    let emulator = emulator(dir.path(), 1, None);
    let mut port = Port::open_at(emulator.socket(), 0, 0).unwrap();
    let event = port.receive_timeout(Duration::from_millis(50)).unwrap();
    assert!(
        event.is_none(),
        "an event on a port nobody sends to: {event:?}"
    );
    assert!(
        port.counters().sleeps >= 1,
        "a port waiting 50 ms with nothing to come never slept"
    );
}

#[test]
fn a_waiting_process_learns_that_the_daemon_is_gone() {
    let dir = temp_dir();
    let emulator = emulator(dir.path(), 1, None);
    let mut port = Port::open_at(emulator.socket(), 0, 0).unwrap();
    // Spinning, a message to itself comes back without a sleep.
    port.set_wait_mode(WaitMode::Spin);
    let buffer = port.dma_alloc(1024).unwrap();
    port.provide_receive_buffer(buffer, SIZE, Priority::HIGH, 3)
        .unwrap();
    let mut message = port.dma_alloc(16).unwrap();
    message.copy_from_slice(b"sixteen bytes!!!");
    let (node, id) = (port.node_id(), port.port_id());
    port.send(message, 16, SIZE, Priority::HIGH, node, id, 42)
        .unwrap();
    let mut seen = (false, false);
    while seen != (true, true) {
        match port.receive_timeout(STAGE).unwrap() {
            Some(Event::Received {
                buffer,
                length,
                priority,
                tag,
                ..
            }) => {
                assert_eq!(
                    (&buffer[..length], priority, tag),
                    (&b"sixteen bytes!!!"[..], Priority::HIGH, 3)
                );
                seen.0 = true;
            }
            Some(Event::Sent {
                context, status, ..
            }) => {
                assert_eq!((context, status), (42, Status::SUCCESS));
                seen.1 = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(port.counters().sleeps, 0, "a spinning port slept");
    port.set_wait_mode(WaitMode::Sleep);
    emulator.stop();
    match port.receive_timeout(STAGE) {
        Err(Error::DaemonGone) => {}
        other => panic!("a wait on a port whose daemon stopped: {other:?}"),
    }
}

/// `nicctl emulate --threads 2 --idle poll` spreads four NICs over two threads, unit u on thread
/// u mod 2; `nicctl status` shows each thread's units, its policy and the CPU it used, in the
/// table and in JSON; a thread count the units cannot fill is refused before anything starts.
#[test]
fn nic_threads_and_their_idle_policy_show_in_the_status() {
    let dir = temp_dir();
    let socket = dir.path().join("control.sock");
    let mut command = nicctl();
    command
        .arg("emulate")
        .arg("--socket")
        .arg(&socket)
        .args(["--units", "4", "--threads", "2", "--idle", "poll"])
        .stdout(Stdio::piped());
    let mut daemon = ChildProcess::start("daemon of 4 units on 2 threads", command);
    daemon.expect("nicctl emulate: listening on", STAGE);
    // Messages between units of different threads (0 and 1) and of one thread (1 and 3).
    let mut ports: Vec<Port> = [0, 1, 3]
        .into_iter()
        .map(|unit| Port::open_at(&socket, unit, 1).unwrap())
        .collect();
    for (from, to) in [(0, 1), (1, 2), (2, 0)] {
        let buffer = ports[to].dma_alloc(1024).unwrap();
        ports[to]
            .provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
            .unwrap();
        let target = (ports[to].node_id(), ports[to].port_id());
        let mut message = ports[from].dma_alloc(64).unwrap();
        message[..14].copy_from_slice(b"across threads");
        ports[from]
            .send(message, 14, SIZE, Priority::LOW, target.0, target.1, 0)
            .unwrap();
    }
    for port in ports.iter_mut() {
        let mut got = 0;
        while got < 2 {
            match port.receive_timeout(STAGE).unwrap() {
                Some(Event::Received { length, .. }) => {
                    assert_eq!(length, 14);
                    got += 1;
                }
                Some(Event::Sent { status, .. }) => {
                    assert_eq!(status, Status::SUCCESS);
                    got += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    let table = nicctl()
        .arg("status")
        .arg("--socket")
        .arg(&socket)
        .output()
        .unwrap();
    assert!(table.status.success(), "{table:?}");
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains("NIC threads"), "{table}");
    assert!(table.contains("\n0       0,2    poll"), "{table}");
    assert!(table.contains("\n1       1,3    poll"), "{table}");
    let json = nicctl()
        .arg("status")
        .arg("--socket")
        .arg(&socket)
        .arg("--json")
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let threads: Vec<u64> = report["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|unit| unit["thread"].as_u64().unwrap())
        .collect();
    assert_eq!(threads, [0, 1, 0, 1]);
    // A polling thread spends CPU whether or not there is work.
    assert!(
        report["units"][0]["thread_cpu_ns"].as_u64().unwrap() > 0,
        "{report}"
    );
    drop(ports);
    terminate(&mut daemon);

    let refused = nicctl()
        .arg("emulate")
        .arg("--socket")
        .arg(dir.path().join("other.sock"))
        .args(["--units", "2", "--threads", "3"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("3 NIC threads for 2 units"), "{said}");
    assert!(!dir.path().join("other.sock").exists(), "nothing started");
}
