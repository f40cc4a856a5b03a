//! Stale traffic cannot enter: genuine traffic between two daemons over UDP is captured from a
//! raw socket, then one side restarts (same fabric key) — the receiver, or the sender with an idle
//! gap past the give-up time — and the capture is sent again from the right source addresses.
//! Nothing of it is delivered, no barrier completes from it, and genuine traffic right after runs
//! unharmed.
//!
//! The test runs in a network namespace of its own (`unshare -rn`), as `spoofing.rs` does, where
//! raw sockets are allowed and nothing leaves the machine.

mod common;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nicbar::{Event, Group, Member, NodeId, Port, PortId, Priority, Status};
use nicbar_emulator::fabric::FabricMap;
use nicbar_emulator::{Emulator, EmulatorConfig, FabricKey};
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, recv, socket};

use common::netns::{forge, free_port};
use common::temp_dir;

const SIZE: u8 = 7;
const GIVE_UP: Duration = Duration::from_millis(300);

#[test]
fn a_capture_re_sent_after_a_restart_delivers_nothing_and_completes_nothing() {
    common::netns::in_namespace(
        "replay",
        "a_capture_re_sent_after_a_restart_delivers_nothing_and_completes_nothing",
        run_inside,
    );
}

/// UDP datagrams seen on the namespace's loopback: (source, destination, payload).
type Capture = Arc<Mutex<Vec<(SocketAddrV4, SocketAddrV4, Vec<u8>)>>>;

/// Records every UDP datagram to one of `ports` until `stop`.
fn capture(ports: [u16; 2], stop: Arc<AtomicBool>, into: Capture) -> std::thread::JoinHandle<()> {
    // Open before anything is sent, so the capture misses nothing.
    let raw = socket(
        AddressFamily::Inet,
        SockType::Raw,
        SockFlag::SOCK_NONBLOCK,
        SockProtocol::Udp,
    )
    .expect("a raw socket (the namespace gives this test the right)");
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            let Ok(len) = recv(
                std::os::fd::AsRawFd::as_raw_fd(&raw),
                &mut buffer,
                MsgFlags::MSG_DONTWAIT,
            ) else {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            };
            let ip = &buffer[..len];
            let header = usize::from(ip[0] & 0x0f) * 4;
            if ip.len() < header + 8 {
                continue;
            }
            let address = |at: usize| Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
            let port = |at: usize| u16::from_be_bytes([ip[at], ip[at + 1]]);
            let from = SocketAddrV4::new(address(12), port(header));
            let to = SocketAddrV4::new(address(16), port(header + 2));
            if ports.contains(&to.port()) {
                into.lock()
                    .unwrap()
                    .push((from, to, ip[header + 8..].to_vec()));
            }
        }
    })
}

/// Sends every captured datagram again, from its own source address.
fn replay(captured: &Capture) -> usize {
    let raw = socket(
        AddressFamily::Inet,
        SockType::Raw,
        SockFlag::empty(),
        SockProtocol::Raw,
    )
    .unwrap();
    let captured = captured.lock().unwrap();
    for (from, to, datagram) in captured.iter() {
        forge(&raw, *from, *to, datagram);
    }
    captured.len()
}

/// Sends messages `(phase, 0..count)` from `sender` to node 1 port 2 and waits for every SENT.
fn send_phase(sender: &mut Port, phase: u32, count: u32) {
    for index in 0..count {
        let mut buffer = sender.dma_alloc(128).unwrap();
        buffer[..4].copy_from_slice(&phase.to_le_bytes());
        buffer[4..8].copy_from_slice(&index.to_le_bytes());
        sender
            .send(buffer, 8, SIZE, Priority::LOW, NodeId::new(1), PortId(2), 0)
            .map_err(|e| e.error)
            .unwrap();
        match sender.blocking_receive().unwrap() {
            Event::Sent { status, .. } => {
                assert_eq!(status, Status::SUCCESS, "phase {phase} message {index}")
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Takes `count` messages of `phase`, in order, at `receiver`.
fn receive_phase(receiver: &mut Port, phase: u32, count: u32) {
    for expected in 0..count {
        match receiver.receive_timeout(Duration::from_secs(10)).unwrap() {
            Some(Event::Received { buffer, status, .. }) => {
                assert_eq!(status, Status::SUCCESS);
                let got = u32::from_le_bytes(buffer[..4].try_into().unwrap());
                let index = u32::from_le_bytes(buffer[4..8].try_into().unwrap());
                assert_eq!(
                    (got, index),
                    (phase, expected),
                    "a stale or reordered message"
                );
                receiver
                    .provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
                    .map_err(|e| e.error)
                    .unwrap();
            }
            other => panic!("phase {phase} message {expected}: {other:?}"),
        }
    }
}

/// Nothing arrives at `receiver` for a while.
fn nothing_arrives(receiver: &mut Port, what: &str) {
    if let Some(event) = receiver
        .receive_timeout(Duration::from_millis(400))
        .unwrap()
    {
        panic!("{what}: {event:?} arrived");
    }
}

fn open_receiver(socket: &std::path::Path) -> Port {
    let mut receiver = Port::open_at(socket, 0, 2).unwrap();
    for tag in 0..32 {
        let buffer = receiver.dma_alloc(128).unwrap();
        receiver
            .provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
            .map_err(|e| e.error)
            .unwrap();
    }
    receiver
}

fn run_inside() {
    let dir = temp_dir("nicbar-replay");
    let (ip0, ip1) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
    let (a0, a1) = (
        SocketAddrV4::new(ip0, free_port(ip0)),
        SocketAddrV4::new(ip1, free_port(ip1)),
    );
    let mut fabric = FabricMap::new();
    fabric.insert(NodeId::new(0), SocketAddr::V4(a0));
    fabric.insert(NodeId::new(1), SocketAddr::V4(a1));
    let key = Some(FabricKey::new(
        nicbar_control::server::random_key().unwrap(),
    ));
    let spawn = |name: &str, node: u16| {
        let socket = dir.path().join(name);
        let mut config =
            EmulatorConfig::on_fabric(&socket, fabric.clone(), &[NodeId::new(node)]).unwrap();
        config.nic.fabric_key = key;
        config.nic.give_up_after = GIVE_UP;
        (Emulator::spawn(config).unwrap(), socket)
    };
    let group = Group::new([
        Member::new(NodeId::new(0), PortId(3)),
        Member::new(NodeId::new(1), PortId(2)),
    ])
    .unwrap();

    // Genuine traffic, captured: messages node 0 port 3 -> node 1 port 2, then barriers.
    let captured: Capture = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let recorder = capture([a0.port(), a1.port()], stop.clone(), captured.clone());
    let (zero, zero_socket) = spawn("zero.sock", 0);
    let (one, one_socket) = spawn("one.sock", 1);
    let mut sender = Port::open_at(&zero_socket, 0, 3).unwrap();
    let mut receiver = open_receiver(&one_socket);
    send_phase(&mut sender, 0, 30);
    receive_phase(&mut receiver, 0, 30);
    let barriers = {
        let group = group.clone();
        std::thread::spawn(move || {
            for _ in 0..20 {
                receiver.barrier(&group).unwrap();
            }
            receiver
        })
    };
    for _ in 0..20 {
        sender.barrier(&group).unwrap();
    }
    let receiver = barriers.join().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    recorder.join().unwrap();
    let held = captured.lock().unwrap().len();
    assert!(
        held >= 40,
        "the capture holds the traffic: {held} datagrams"
    );

    // 1. The receiver restarts (same key); a new process opens the port and enters a barrier
    // that node 0 has not entered. The capture comes again.
    // A new job: node 0's process starts again too, so both count barriers from the first (the
    // capture's barriers carry the same identities as the new job's). Its old port's close is
    // told to the old receiver before that goes.
    drop(sender);
    let mut sender = Port::open_at(&zero_socket, 0, 3).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    drop(receiver);
    drop(one);
    let (one, one_socket) = spawn("one-again.sock", 1);
    let mut receiver = open_receiver(&one_socket);
    let pending = receiver.barrier_start(&group).unwrap();
    let sent = replay(&captured);
    nothing_arrives(&mut receiver, "after the receiver restarted");
    if receiver.barrier_test(&pending).unwrap() {
        panic!(
            "the barrier ended before node 0 entered it: {:?}",
            receiver.barrier_wait(pending)
        );
    }
    // Genuine traffic right after: the barrier completes when node 0 enters, messages arrive.
    sender.barrier(&group).unwrap();
    receiver.barrier_wait(pending).unwrap();
    send_phase(&mut sender, 1, 20);
    receive_phase(&mut receiver, 1, 20);
    eprintln!("receiver restarted: {sent} captured datagrams re-sent, nothing taken");

    // 2. The sender restarts, talks to the receiver, the link idles past the give-up time, and
    // the capture comes again.
    drop(sender);
    drop(zero);
    let (zero, zero_socket) = spawn("zero-again.sock", 0);
    let mut sender = Port::open_at(&zero_socket, 0, 3).unwrap();
    // A new job: the receiver's process starts again too.
    drop(receiver);
    let mut receiver = open_receiver(&one_socket);
    // The handshake's cost: the first message after the restart (offer, answer, confirmation,
    // then the message and its ack) against the ones after it (printed, never asserted).
    let started = std::time::Instant::now();
    send_phase(&mut sender, 2, 1);
    let first = started.elapsed();
    let started = std::time::Instant::now();
    send_phase(&mut sender, 2, 10);
    let next = started.elapsed() / 10;
    eprintln!(
        "first message after the sender restarted: {:.0} us to its SENT; the next ones: {:.0} us \
         each",
        first.as_secs_f64() * 1e6,
        next.as_secs_f64() * 1e6
    );
    receive_phase(&mut receiver, 2, 1);
    let mut renumbered = 0;
    while renumbered < 10 {
        if let Some(Event::Received { buffer, .. }) =
            receiver.receive_timeout(Duration::from_secs(10)).unwrap()
        {
            let phase = u32::from_le_bytes(buffer[..4].try_into().unwrap());
            assert_eq!(phase, 2, "a stale message");
            receiver
                .provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
                .map_err(|e| e.error)
                .unwrap();
            renumbered += 1;
        }
    }
    std::thread::sleep(GIVE_UP + Duration::from_millis(200));
    let pending = receiver.barrier_start(&group).unwrap();
    let sent = replay(&captured);
    nothing_arrives(
        &mut receiver,
        "after the sender restarted and the link idled",
    );
    assert!(
        !receiver.barrier_test(&pending).unwrap(),
        "a barrier completed from the capture while the new node 0 never entered it"
    );
    sender.barrier(&group).unwrap();
    receiver.barrier_wait(pending).unwrap();
    send_phase(&mut sender, 3, 20);
    receive_phase(&mut receiver, 3, 20);
    eprintln!(
        "sender restarted, idle past give-up: {sent} captured datagrams re-sent, nothing taken"
    );

    // 3. The sender restarts and stays silent (no new session) past the give-up time.
    drop(sender);
    drop(zero);
    let (zero, zero_socket) = spawn("zero-third.sock", 0);
    drop(receiver);
    let mut receiver = open_receiver(&one_socket);
    std::thread::sleep(GIVE_UP + Duration::from_millis(200));
    let pending = receiver.barrier_start(&group).unwrap();
    replay(&captured);
    nothing_arrives(&mut receiver, "after the sender restarted silently");
    assert!(!receiver.barrier_test(&pending).unwrap());
    let mut sender = Port::open_at(&zero_socket, 0, 3).unwrap();
    sender.barrier(&group).unwrap();
    receiver.barrier_wait(pending).unwrap();
    send_phase(&mut sender, 4, 20);
    receive_phase(&mut receiver, 4, 20);
    drop((sender, receiver));
    drop((zero, one));
}
