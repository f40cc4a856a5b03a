//! A fabric that lets no one in: forged datagrams, sent from raw sockets with the real node's
//! source address, try to inject a message, complete a barrier, reset a connection with a newer
//! SYN and fill the connection table, and empty datagrams — while real messages and barriers run
//! between two daemons over UDP. Every forgery is dropped and counted (`unauthenticated`, its
//! header unread); a packet with a right code claiming another node than the one at its address
//! is counted `spoofed`; the real traffic stays exact.
//!
//! The test runs in a network namespace of its own (`unshare -rn`, which works for root and, with
//! user namespaces, for anyone), where raw sockets are allowed and nothing leaves the machine.

mod common;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nicbar::{Event, Group, Member, NodeId, Port, PortId, Priority, Status};
use nicbar_control::query_status;
use nicbar_emulator::fabric::FabricMap;
use nicbar_emulator::{Emulator, EmulatorConfig, FabricKey};
use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};
use shared_abi::packet::{PacketFlags, PacketHeader, PacketKind};
use zerocopy::little_endian::U32;

use common::netns::{forge, free_port};
use common::temp_dir;

const MESSAGES: u32 = 300;
const BARRIERS: usize = 100;
const SIZE: u8 = 7;

#[test]
fn forged_packets_are_dropped_and_counted_while_real_traffic_stays_exact() {
    common::netns::in_namespace(
        "spoofing",
        "forged_packets_are_dropped_and_counted_while_real_traffic_stays_exact",
        run_inside,
    );
}

/// A packet with the right authentication code under `key` (an attacker who holds the key).
fn signed(header: &PacketHeader, payload: &[u8], key: &FabricKey) -> Vec<u8> {
    let mut out = vec![0u8; shared_abi::packet::MAX_WIRE_LEN];
    let len = header.emit(payload, &mut out).unwrap();
    out.truncate(len);
    let tag = key.tag(&out);
    out.extend_from_slice(&tag);
    out
}

/// A packet with a made-up authentication code (the attacker has no key).
fn forged(header: &PacketHeader, payload: &[u8], salt: u8) -> Vec<u8> {
    let mut out = vec![0u8; shared_abi::packet::MAX_WIRE_LEN];
    let len = header.emit(payload, &mut out).unwrap();
    out.truncate(len);
    out.extend((0..16u8).map(|i| i.wrapping_mul(31) ^ salt));
    out
}

fn run_inside() {
    let dir = temp_dir("nicbar-spoofing");
    let (ip0, ip1) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
    let (a0, a1) = (
        SocketAddrV4::new(ip0, free_port(ip0)),
        SocketAddrV4::new(ip1, free_port(ip1)),
    );
    let mut fabric = FabricMap::new();
    fabric.insert(NodeId::new(0), SocketAddr::V4(a0));
    fabric.insert(NodeId::new(1), SocketAddr::V4(a1));
    let key = FabricKey::new(nicbar_control::server::random_key().unwrap());
    let spawn = |name: &str, node: u16| {
        let socket = dir.path().join(name);
        let mut config =
            EmulatorConfig::on_fabric(&socket, fabric.clone(), &[NodeId::new(node)]).unwrap();
        config.nic.fabric_key = Some(key);
        (Emulator::spawn(config).unwrap(), socket)
    };
    let (zero, zero_socket) = spawn("zero.sock", 0);
    let (one, one_socket) = spawn("one.sock", 1);

    // The attacker: forges from node 0's own address, so only the code can tell.
    let stop = Arc::new(AtomicBool::new(false));
    let forgeries = Arc::new(AtomicU64::new(0));
    let spoofed_nodes = Arc::new(AtomicU64::new(0));
    let attacker = {
        let (stop, forgeries, spoofed_nodes) =
            (stop.clone(), forgeries.clone(), spoofed_nodes.clone());
        std::thread::spawn(move || {
            let raw = socket(
                AddressFamily::Inet,
                SockType::Raw,
                SockFlag::empty(),
                SockProtocol::Raw,
            )
            .expect("a raw socket (the namespace gives this test the right)");
            let mut round = 0u32;
            while !stop.load(Ordering::Relaxed) {
                // A message "from node 0 port 5" to the real receiver.
                let mut data = PacketHeader::new(PacketKind::DATA, NodeId::new(0), NodeId::new(1));
                data.src_port = PortId(5);
                data.dst_port = PortId(2);
                data.size = SIZE;
                data.epoch = U32::new(round);
                data.seq = U32::new(round);
                forge(&raw, a0, a1, &forged(&data, b"forged message", 1));
                // Barrier packets of every round, as if node 0 port 1 had entered.
                for barrier_round in 0..4 {
                    let mut barrier =
                        PacketHeader::new(PacketKind::BARRIER, NodeId::new(0), NodeId::new(1));
                    barrier.src_port = PortId(1);
                    barrier.dst_port = PortId(2);
                    barrier.aux = barrier_round;
                    barrier.seq = U32::new(round);
                    forge(&raw, a0, a1, &forged(&barrier, &[], 2));
                }
                // A SYN of a much newer epoch: a reset, were it believed.
                let mut syn = PacketHeader::new(PacketKind::DATA, NodeId::new(0), NodeId::new(1));
                syn.flags |= PacketFlags::SYN;
                syn.epoch = U32::new(u32::MAX - round);
                forge(&raw, a0, a1, &forged(&syn, &[], 3));
                // An empty datagram, and one too short for a header.
                forge(&raw, a0, a1, &[]);
                forge(&raw, a0, a1, &[7; 5]);
                forgeries.fetch_add(8, Ordering::Relaxed);
                // Nodes 100..170 claimed from node 0's address: a connection-table flood. With a
                // made-up code it is a forgery like any other (the header is not looked at
                // before the code); with a right one (a holder of the key on the wrong address)
                // the node's address gives it away.
                for fake in 100..170u16 {
                    let flood =
                        PacketHeader::new(PacketKind::DATA, NodeId::new(fake), NodeId::new(1));
                    forge(&raw, a0, a1, &forged(&flood, &[], 4));
                    forge(&raw, a0, a1, &signed(&flood, &[], &key));
                }
                forgeries.fetch_add(70, Ordering::Relaxed);
                spoofed_nodes.fetch_add(70, Ordering::Relaxed);
                round += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    // Real traffic meanwhile: messages node 0 port 1 -> node 1 port 2, then barriers.
    let mut sender = Port::open_at(&zero_socket, 0, 1).unwrap();
    let mut receiver = Port::open_at(&one_socket, 0, 2).unwrap();
    for tag in 0..32 {
        let buffer = receiver.dma_alloc(128).unwrap();
        receiver
            .provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
            .map_err(|e| e.error)
            .unwrap();
    }
    let receiving = std::thread::spawn(move || {
        let mut next = 0u32;
        while next < MESSAGES {
            match receiver.blocking_receive().unwrap() {
                Event::Received {
                    buffer,
                    length,
                    sender_node,
                    sender_port,
                    status,
                    ..
                } => {
                    assert_eq!(status, Status::SUCCESS);
                    assert_eq!((sender_node, sender_port), (NodeId::new(0), PortId(1)));
                    assert_eq!(length, 4, "a message that was never sent arrived");
                    let index = u32::from_le_bytes(buffer[..4].try_into().unwrap());
                    assert_eq!(index, next, "messages out of order or duplicated");
                    next += 1;
                    receiver
                        .provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
                        .map_err(|e| e.error)
                        .unwrap();
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        receiver
    });
    let all_tokens = sender.send_tokens();
    let mut spare = Vec::new();
    for index in 0..MESSAGES {
        let mut buffer = match spare.pop() {
            Some(buffer) => buffer,
            None => sender.dma_alloc(128).unwrap(),
        };
        buffer[..4].copy_from_slice(&index.to_le_bytes());
        while sender.send_tokens() == 0 {
            if let Event::Sent { buffer, status, .. } = sender.blocking_receive().unwrap() {
                assert_eq!(status, Status::SUCCESS);
                spare.push(buffer);
            }
        }
        sender
            .send(buffer, 4, SIZE, Priority::LOW, NodeId::new(1), PortId(2), 0)
            .map_err(|e| e.error)
            .unwrap();
    }
    // Every send is acknowledged: its token comes back with SUCCESS.
    while sender.send_tokens() < all_tokens {
        if let Event::Sent { status, .. } = sender.blocking_receive().unwrap() {
            assert_eq!(status, Status::SUCCESS);
        }
    }
    let mut receiver = receiving.join().unwrap();
    let group = Group::new([
        Member::new(NodeId::new(0), PortId(1)),
        Member::new(NodeId::new(1), PortId(2)),
    ])
    .unwrap();
    let barriers = {
        let group = group.clone();
        std::thread::spawn(move || {
            for _ in 0..BARRIERS {
                receiver.barrier(&group).unwrap();
            }
            receiver
        })
    };
    for _ in 0..BARRIERS {
        sender.barrier(&group).unwrap();
    }
    let receiver = barriers.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    attacker.join().unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    let report = loop {
        let report = query_status(&one_socket).unwrap();
        let unit = &report.units[0];
        let counted = unit.counters.unauthenticated + unit.wire.spoofed;
        if counted >= forgeries.load(Ordering::Relaxed) + spoofed_nodes.load(Ordering::Relaxed)
            || Instant::now() > deadline
        {
            break report;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let unit = &report.units[0];
    eprintln!(
        "forged {} packets from node 0's address and {} claiming nodes 100..170: node 1 \
         counted {} unauthenticated and {} spoofed; {MESSAGES} messages and {BARRIERS} barriers \
         exact",
        forgeries.load(Ordering::Relaxed),
        spoofed_nodes.load(Ordering::Relaxed),
        unit.counters.unauthenticated,
        unit.wire.spoofed,
    );
    assert!(unit.counters.unauthenticated >= forgeries.load(Ordering::Relaxed));
    assert_eq!(unit.wire.spoofed, spoofed_nodes.load(Ordering::Relaxed));
    assert_eq!(unit.counters.no_connection, 0);
    let peers: Vec<u16> = unit.connections.iter().map(|c| c.peer).collect();
    assert!(
        peers.iter().all(|&peer| peer <= 1),
        "a forged node took a connection slot: {peers:?}"
    );
    assert!(
        unit.connections.iter().all(|c| c.give_ups == 0),
        "the real connection was reset: {:?}",
        unit.connections
    );
    assert_eq!(unit.counters.messages_delivered, u64::from(MESSAGES));
    drop((sender, receiver));
    drop((zero, one));
}
