//! What an orderly close promises: a port that posts messages (or its part of a host-based
//! barrier) and closes at once — by dropping the `Port` — still gets every one of them to its
//! peers. Run many times over, through one daemon's in-process path and between two daemons over
//! UDP, because the race it guards against (the close served before the NIC read the send ring)
//! strikes only sometimes.
//!
//! `NICBAR_CLOSE_ITERATIONS=N` changes the number of iterations (default 1000).

use std::net::{SocketAddr, UdpSocket};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use nicbar::{
    BarrierOptions, Event, Group, Member, NodeId, Port, PortId, Priority, Status,
    max_length_for_size,
};
use nicbar_emulator::{Emulator, EmulatorConfig, EmulatorHandle, FabricKey, FabricMap};

/// Longest any one wait may take.
const BOUND: Duration = Duration::from_secs(20);
/// Messages the closing port posts per iteration.
const MESSAGES: usize = 16;
const SIZE: u8 = 7;

fn iterations() -> u32 {
    std::env::var("NICBAR_CLOSE_ITERATIONS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1000)
}

/// Where the closing port and its peer live.
struct Setup {
    /// (socket, unit) of the closing port.
    closer: (std::path::PathBuf, u8),
    /// (socket, unit) of the peer.
    peer: (std::path::PathBuf, u8),
    _daemons: Vec<EmulatorHandle>,
    dir: std::path::PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn directory(name: &str) -> std::path::PathBuf {
    nicbar_system::scratch_dir(&format!("close-{name}")).unwrap()
}

/// One daemon, two units: packets take the in-process path.
fn in_process(name: &str) -> Setup {
    let dir = directory(name);
    let socket = dir.join("control.sock");
    let daemon = Emulator::spawn(EmulatorConfig::in_process(&socket, 2)).unwrap();
    Setup {
        closer: (socket.clone(), 0),
        peer: (socket, 1),
        _daemons: vec![daemon],
        dir,
    }
}

fn free_udp_address() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Two daemons of one unit each, talking over UDP on the loopback interface.
fn over_udp(name: &str) -> Setup {
    let dir = directory(name);
    let mut fabric = FabricMap::new();
    fabric.insert(NodeId::new(0), free_udp_address());
    fabric.insert(NodeId::new(1), free_udp_address());
    let sockets = [dir.join("node0.sock"), dir.join("node1.sock")];
    // The two daemons of the fabric share its key.
    let key = Some(FabricKey::new([0x42; 32]));
    let daemons = (0..2u16)
        .map(|node| {
            let mut config = EmulatorConfig::on_fabric(
                &sockets[usize::from(node)],
                fabric.clone(),
                &[NodeId::new(node)],
            )
            .unwrap();
            config.nic.fabric_key = key;
            Emulator::spawn(config).unwrap()
        })
        .collect();
    Setup {
        closer: (sockets[0].clone(), 0),
        peer: (sockets[1].clone(), 0),
        _daemons: daemons,
        dir,
    }
}

fn open((socket, unit): &(std::path::PathBuf, u8), port: u8) -> Port {
    Port::open_at(socket, *unit, port).unwrap()
}

fn message(iteration: u32, index: usize) -> Vec<u8> {
    let max = max_length_for_size(SIZE) as usize;
    let length = 8 + (iteration as usize * 7 + index * 13) % (max - 8);
    let mut bytes = vec![0u8; length];
    bytes[..4].copy_from_slice(&iteration.to_le_bytes());
    bytes[4..8].copy_from_slice(&(index as u32).to_le_bytes());
    for (i, byte) in bytes.iter_mut().enumerate().skip(8) {
        *byte = (iteration as usize + index * 31 + i) as u8;
    }
    bytes
}

/// Each iteration a fresh port posts `MESSAGES` messages to the peer and is dropped at once;
/// the peer must receive every one of them, intact and once.
fn messages_survive_a_close(setup: &Setup) {
    let iterations = iterations();
    let mut peer = open(&setup.peer, 1);
    let target = (peer.node_id(), peer.port_id());
    let length = max_length_for_size(SIZE) as usize;
    for tag in 0..(2 * MESSAGES) as u32 {
        let buffer = peer.dma_alloc(length).unwrap();
        peer.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
            .unwrap();
    }
    let (go, ready) = mpsc::channel::<u32>();
    let closer = setup.closer.clone();
    let sender = thread::spawn(move || {
        while let Ok(iteration) = ready.recv() {
            let mut port = open(&closer, 2);
            for index in 0..MESSAGES {
                let bytes = message(iteration, index);
                let mut buffer = port.dma_alloc(bytes.len()).unwrap();
                buffer.copy_from_slice(&bytes);
                port.send(
                    buffer,
                    bytes.len(),
                    SIZE,
                    Priority::LOW,
                    target.0,
                    target.1,
                    index as u64,
                )
                .unwrap();
            }
            drop(port);
        }
    });
    for iteration in 0..iterations {
        go.send(iteration).unwrap();
        let mut seen = [false; MESSAGES];
        for _ in 0..MESSAGES {
            let event = peer.receive_timeout(BOUND).unwrap().unwrap_or_else(|| {
                panic!(
                    "iteration {iteration}: only {} of {MESSAGES} messages arrived within \
                     {BOUND:?} of a port that closed after posting them",
                    seen.iter().filter(|s| **s).count()
                )
            });
            let Event::Received {
                buffer,
                length,
                tag,
                status,
                ..
            } = event
            else {
                panic!("iteration {iteration}: unexpected {event:?}");
            };
            assert_eq!(status, Status::SUCCESS);
            let bytes = &buffer[..length];
            let got_iteration = u32::from_le_bytes(bytes[..4].try_into().unwrap());
            let index = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
            assert_eq!(got_iteration, iteration, "a message of another iteration");
            assert!(index < MESSAGES && !seen[index], "message {index} twice");
            assert_eq!(bytes, message(iteration, index), "message {index} corrupt");
            seen[index] = true;
            peer.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
                .unwrap();
        }
    }
    drop(go);
    sender.join().unwrap();
}

/// Each iteration a fresh port runs a host-based barrier with the peer and is dropped as soon as
/// it returns; the peer's barrier must complete (it needs the closing port's last message).
fn host_barrier_survives_a_close(setup: &Setup) {
    let iterations = iterations();
    let mut peer = open(&setup.peer, 3);
    let closer_member = {
        let probe = open(&setup.closer, 4);
        Member::new(probe.node_id(), PortId(4))
    };
    let group = Group::new([closer_member, Member::new(peer.node_id(), peer.port_id())]).unwrap();
    let options = BarrierOptions {
        timeout: Some(BOUND),
        ..BarrierOptions::for_members(2)
    };
    let (go, ready) = mpsc::channel::<u32>();
    let (opened, is_open) = mpsc::channel::<()>();
    let (done, finished) = mpsc::channel::<()>();
    let closer = setup.closer.clone();
    let closer_group = group.clone();
    let sender = thread::spawn(move || {
        while let Ok(iteration) = ready.recv() {
            let mut port = open(&closer, 4);
            // The peer enters once this port is open, so its message is not refused as sent to
            // a port not open yet: what is tested is the close alone.
            opened.send(()).unwrap();
            // A fresh port numbers its barriers from 0: each iteration is a group of its own.
            let closer_group = closer_group.clone().with_id(iteration);
            if let Err(error) = port.host_barrier(&closer_group, &options) {
                panic!("iteration {iteration}: the closing side's barrier failed: {error}");
            }
            drop(port);
            done.send(()).unwrap();
        }
    });
    for iteration in 0..iterations {
        go.send(iteration).unwrap();
        is_open.recv_timeout(BOUND).unwrap();
        if let Err(error) = peer.host_barrier(&group.clone().with_id(iteration), &options) {
            panic!(
                "iteration {iteration}: the peer's barrier failed (the closing port's message was \
                 lost?): {error}"
            );
        }
        finished.recv_timeout(BOUND).unwrap();
    }
    drop(go);
    sender.join().unwrap();
}

#[test]
fn messages_posted_before_a_close_arrive_in_process() {
    messages_survive_a_close(&in_process("messages"));
}

#[test]
fn messages_posted_before_a_close_arrive_over_udp() {
    messages_survive_a_close(&over_udp("messages-udp"));
}

#[test]
fn a_host_barrier_completes_when_the_last_member_closes_at_once_in_process() {
    host_barrier_survives_a_close(&in_process("host-barrier"));
}

#[test]
fn a_host_barrier_completes_when_the_last_member_closes_at_once_over_udp() {
    host_barrier_survives_a_close(&over_udp("host-barrier-udp"));
}

/// Each iteration the closing side enters a host-based barrier before its peer's port is open, so
/// its message is refused ("not open yet") and left for it to send again; the peer opens, enters,
/// and its message completes the closing side's barrier, which drops its port at once. The close
/// must send the refused message again before it lets go, or the peer waits for it in vain.
fn a_refused_host_message_is_sent_again_before_the_close(setup: &Setup) {
    let iterations = iterations().min(200);
    let closer_member = {
        let probe = open(&setup.closer, 5);
        Member::new(probe.node_id(), PortId(5))
    };
    let peer_member = {
        let probe = open(&setup.peer, 6);
        Member::new(probe.node_id(), PortId(6))
    };
    let options = BarrierOptions {
        timeout: Some(BOUND),
        ..BarrierOptions::for_members(2)
    };
    for iteration in 0..iterations {
        let group = Group::new([closer_member, peer_member])
            .unwrap()
            .with_id(iteration);
        let closer = setup.closer.clone();
        let closer_group = group.clone();
        let (sent, refused) = mpsc::channel::<()>();
        let closing = thread::spawn(move || {
            let mut port = open(&closer, 5);
            // The peer opens a moment after our barrier starts, so that our first message
            // usually meets a port not open yet (what the test is about); whatever the timing,
            // both barriers must complete.
            let barrier = thread::scope(|scope| {
                scope.spawn(|| {
                    thread::sleep(Duration::from_millis(1));
                    let _ = sent.send(());
                });
                port.host_barrier(&closer_group, &options)
            });
            if let Err(error) = barrier {
                panic!("iteration {iteration}: the closing side's barrier failed: {error}");
            }
            drop(port);
        });
        refused.recv_timeout(BOUND).unwrap();
        let mut peer = open(&setup.peer, 6);
        if let Err(error) = peer.host_barrier(&group, &options) {
            panic!(
                "iteration {iteration}: the peer's barrier failed (the closing side's refused \
                 message was never sent again?): {error}"
            );
        }
        closing.join().unwrap();
    }
}

#[test]
fn a_refused_host_message_is_sent_again_before_the_close_in_process() {
    a_refused_host_message_is_sent_again_before_the_close(&in_process("host-resend"));
}

#[test]
fn a_refused_host_message_is_sent_again_before_the_close_over_udp() {
    a_refused_host_message_is_sent_again_before_the_close(&over_udp("host-resend-udp"));
}
