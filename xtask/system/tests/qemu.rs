//! QEMU NICs from a test: the firmware image, built as CI builds it (`cargo xtask image`), boots
//! as two NICs under `qemu-system-riscv32`; this process opens ports on them through the user
//! library, exchanges messages, runs a barrier, closes and reopens a port, asks for the status,
//! and powers the NICs off; a NIC whose QEMU dies is reported; a process that keeps the
//! descriptor and mapping of a port it closed cannot touch the next owner's region.
//!
//! Skipped, with the reason printed, only when `qemu-system-riscv32` is not installed
//! (`cargo xtask qemu` installs it). Every wait is bounded and fails naming what it waited for.

mod common;

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::qemu_fabric::{STEP, fabric, provide, qemu_or_skip, send_and_check};
use nicbar::{Error, Group, NodeId, Port, PortId};
use nicbar_control::{Reply, Request};
use nicbar_qemu::QemuError;
use shared_abi::ring::SharedMemory;
use zerocopy::{FromZeros, IntoBytes};

#[test]
fn ports_messages_and_barriers_on_two_qemu_nics() {
    if !qemu_or_skip("ports_messages_and_barriers_on_two_qemu_nics") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fabric = fabric(&dir, 2);
    let socket = fabric.socket().to_owned();
    for report in fabric.reports() {
        assert_eq!(report.state, shared_abi::qemu::layout::GuestState::RUNNING);
        for (port, &(address, length)) in report.windows.iter().enumerate() {
            assert_eq!(
                (address, length as usize),
                (
                    shared_abi::qemu::layout::port_window_address(port).unwrap(),
                    shared_abi::qemu::layout::PORT_WINDOW_LEN
                ),
                "node {} port {port}",
                report.node
            );
        }
        assert!(report.stack_boot_high_water > 0 && report.stack_size > 0);
    }

    let mut a = Port::open_at(&socket, 0, 3).unwrap();
    let mut b = Port::open_at(&socket, 1, 3).unwrap();
    assert_eq!((a.node_id(), b.node_id()), (NodeId::new(0), NodeId::new(1)));
    assert!(matches!(
        Port::open_at(&socket, 0, 3),
        Err(Error::PortBusy { .. })
    ));
    assert!(matches!(
        Port::open_at(&socket, 2, 0),
        Err(Error::NoSuchUnit { .. })
    ));
    provide(&mut a, 4);
    provide(&mut b, 4);
    send_and_check(&mut a, &mut b, b"from node 0 through the switch");
    send_and_check(&mut b, &mut a, &[0xa5; 200]);

    let group = Group::from_endpoints([(NodeId::new(0), PortId(3)), (NodeId::new(1), PortId(3))])
        .unwrap()
        .with_timeout(STEP);
    std::thread::scope(|scope| {
        let other = scope.spawn(|| b.barrier(&group));
        a.barrier(&group).expect("node 0's barrier completes");
        other.join().unwrap().expect("node 1's barrier completes");
    });

    // Close and reopen: a new incarnation over cleared memory.
    let first = a.generation();
    a.close().unwrap();
    let mut a = Port::open_at(&socket, 0, 3).unwrap();
    assert!(
        a.generation().get() > first.get(),
        "a reopened port has a new generation"
    );
    provide(&mut a, 4);
    send_and_check(&mut b, &mut a, b"to the reopened port");

    let stream = UnixStream::connect(&socket).unwrap();
    let Reply::Status(status) = nicbar_control::call(&stream, &Request::Status, STEP)
        .unwrap()
        .0
    else {
        panic!("no status report");
    };
    assert_eq!(status.units.len(), 2);
    let unit0 = &status.units[0];
    assert_eq!(unit0.ports.len(), 1);
    assert_eq!(unit0.ports[0].owner_pid, Some(std::process::id()));
    assert_eq!(unit0.ports[0].generation, a.generation().get());

    drop((a, b));
    let report = fabric.stop();
    for node in &report.nodes {
        assert_eq!(
            node.exit.and_then(|status| status.code()),
            Some(0),
            "node {} powers off cleanly: {node}",
            node.node
        );
        assert_eq!(
            node.state,
            shared_abi::qemu::layout::GuestState::STOPPED,
            "{node}"
        );
        assert_eq!(node.counters.barriers_completed.get(), 1, "{node}");
        assert_eq!(node.counters.barriers_failed.get(), 0, "{node}");
        assert!(
            node.stack_high_water > 0 && node.stack_high_water < node.stack_size,
            "{node}"
        );
    }
    assert_eq!(report.nodes[0].counters.messages_delivered.get(), 2);
    assert_eq!(report.nodes[1].counters.messages_delivered.get(), 1);
    assert!(report.switch.moved >= 6, "{:?}", report.switch);
    assert!(!socket.exists(), "the socket is removed on stop");
}

#[test]
fn a_nic_whose_qemu_dies_is_reported() {
    if !qemu_or_skip("a_nic_whose_qemu_dies_is_reported") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fabric = fabric(&dir, 2);
    fabric.check_running().unwrap();
    let victim = fabric.reports()[1].pid;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + STEP;
    let error = loop {
        match fabric.check_running() {
            Err(error) => break error,
            Ok(()) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(()) => panic!("the death of node 1's QEMU was not noticed within {STEP:?}"),
        }
    };
    assert!(
        matches!(error, QemuError::Exited { node: 1, .. }),
        "{error}"
    );
    // The other NIC still serves ports.
    let port = Port::open_at(fabric.socket(), 0, 0).unwrap();
    assert_eq!(port.node_id(), NodeId::new(0));
    drop(port);
    let report = fabric.stop();
    assert_eq!(report.nodes[0].exit.and_then(|s| s.code()), Some(0));
    assert_eq!(
        report.nodes[1].exit.and_then(|s| s.code()),
        None,
        "killed by a signal"
    );
}

/// Opens `port` of `unit` over a control connection of its own, as a process would, and returns
/// the connection and the region's descriptor (the doorbells are dropped).
fn open_raw(socket: &std::path::Path, unit: u8, port: u8) -> (UnixStream, std::os::fd::OwnedFd) {
    let stream = nicbar_control::connect(socket).unwrap();
    let request = Request::OpenPort {
        unit,
        port,
        abi_version: shared_abi::ABI_VERSION,
    };
    let (reply, fds) = nicbar_control::call(&stream, &request, STEP).unwrap();
    assert!(matches!(reply, Reply::Opened(_)), "{reply:?}");
    let region = fds.into_iter().next().expect("the region's descriptor");
    (stream, region)
}

/// A region's inode: the memory behind a descriptor, whoever holds it.
fn inode(fd: &std::os::fd::OwnedFd) -> u64 {
    nix::sys::stat::fstat(fd).unwrap().st_ino
}

#[test]
fn a_closed_ports_kept_mapping_cannot_reach_the_next_owner() {
    if !qemu_or_skip("a_closed_ports_kept_mapping_cannot_reach_the_next_owner") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fabric = fabric(&dir, 1);
    let socket = fabric.socket().to_owned();
    let window = shared_abi::qemu::layout::PORT_WINDOW_LEN;

    // The first owner of port 2 opens it, maps its region, closes the port, and keeps both the
    // descriptor and the mapping.
    let (first, kept_fd) = open_raw(&socket, 0, 2);
    let kept = nicbar_control::Mapping::open(&kept_fd).unwrap();
    assert!(matches!(
        nicbar_control::call(&first, &Request::ClosePort, STEP)
            .unwrap()
            .0,
        Reply::Closed
    ));

    // The next owner, through the library, and a peer on the same NIC.
    let mut next = Port::open_at(&socket, 0, 2).unwrap();
    let mut peer = Port::open_at(&socket, 0, 3).unwrap();
    // A receive buffer for every message each will take (send_and_check keeps them).
    provide(&mut next, 24);
    provide(&mut peer, 24);
    send_and_check(&mut peer, &mut next, b"before the old owner writes");

    // The old owner writes over every byte it can still reach: header, rings, arena.
    kept.memory().write(0, &vec![0x5a; window]).unwrap();

    // The next owner's port works on, both ways, many times over.
    for round in 0..20u8 {
        send_and_check(&mut peer, &mut next, &[round; 100]);
        send_and_check(&mut next, &mut peer, &[round ^ 0xff; 100]);
    }

    // A third owner sees a region of its own too: a different memory from the kept one, with a
    // fresh header and none of the old owner's bytes.
    next.close().unwrap();
    let (_third, third_fd) = open_raw(&socket, 0, 2);
    assert_ne!(inode(&third_fd), inode(&kept_fd));
    let third = nicbar_control::Mapping::open(&third_fd).unwrap();
    let mut bytes = vec![0u8; window];
    third.memory().read(0, &mut bytes).unwrap();
    assert!(
        !bytes.iter().all(|&b| b == 0x5a),
        "the third owner's region holds the old owner's bytes"
    );
    let mut header = shared_abi::region::RegionHeader::new_zeroed();
    third.memory().read(0, header.as_mut_bytes()).unwrap();
    shared_abi::region::RegionLayout::from_header(&header, window)
        .expect("the third owner's region has a valid header of its own");

    drop(peer);
    let report = fabric.stop();
    assert_eq!(report.nodes[0].exit.and_then(|s| s.code()), Some(0));
    assert_eq!(
        report.nodes[0].counters.messages_delivered.get(),
        41,
        "every message of the second owner was delivered"
    );
}

#[test]
fn a_port_opens_once_per_region_then_says_the_nic_must_restart() {
    if !qemu_or_skip("a_port_opens_once_per_region_then_says_the_nic_must_restart") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fabric = fabric(&dir, 1);
    let socket = fabric.socket().to_owned();
    let mut inodes = Vec::new();
    for _ in 0..shared_abi::qemu::layout::PORT_REGIONS {
        let (stream, region) = open_raw(&socket, 0, 5);
        inodes.push(inode(&region));
        assert!(matches!(
            nicbar_control::call(&stream, &Request::ClosePort, STEP)
                .unwrap()
                .0,
            Reply::Closed
        ));
    }
    inodes.sort_unstable();
    inodes.dedup();
    assert_eq!(
        inodes.len(),
        shared_abi::qemu::layout::PORT_REGIONS,
        "every open had a memory of its own"
    );
    let error = Port::open_at(&socket, 0, 5).unwrap_err();
    assert!(error.to_string().contains("restart the NIC"), "{error}");
    // The other ports are untouched.
    let port = Port::open_at(&socket, 0, 6).unwrap();
    drop(port);
    let report = fabric.stop();
    assert_eq!(report.nodes[0].exit.and_then(|s| s.code()), Some(0));
}
