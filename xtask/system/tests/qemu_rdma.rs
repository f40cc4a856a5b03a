//! One-sided operations on QEMU NICs, between real processes: the firmware image boots as NICs
//! under `qemu-system-riscv32`, and every byte a put, get or atomic moves in or out of a process
//! goes through the guest's process-memory round trip (mailbox, doorbell, the hub's
//! `process_vm_readv`/`process_vm_writev`). A 1 MiB put and get checked byte for byte; three
//! processes fetch-and-adding on one word end exact; refusals each name their rule and leave the
//! target untouched, and registrations the daemon or the firmware refuse say why; a put whose
//! target is killed ends with an error, and the NIC serves the port's next owner.
//!
//! The NICs run in the test process (its hub reaches the children's memory as `nicctl qemu` does
//! any program's); the initiators and targets are children (this test binary in a role).
//! Skipped, with the reason printed, only when `qemu-system-riscv32` is not installed
//! (`cargo xtask qemu` installs it).

mod common;

use std::path::Path;

use common::one_sided::{self, completion};
use common::qemu_fabric::{fabric, qemu_or_skip};
use common::{ChildProcess, ROLE, STAGE, var};
use nicbar::{Error, NodeId, Port, PortId, Status};
use nicbar_control::{ControlError, Reply, Request};
use nicbar_qemu::{FabricReport, QemuFabric};

/// The big transfer's length.
const BIG: usize = 1 << 20;
/// Fetch-and-adds per adding process.
const ADDS: u64 = 1000;
/// Regions one port may register (the firmware core's `MEMORY_REGIONS`).
const FIRMWARE_REGIONS: usize = 16;

/// Stops the fabric and checks every NIC powered off cleanly; returns the reports.
fn stop(fabric: QemuFabric) -> FabricReport {
    let report = fabric.stop();
    for node in &report.nodes {
        assert_eq!(
            node.exit.and_then(|status| status.code()),
            Some(0),
            "node {} powers off cleanly: {node}",
            node.node
        );
        eprintln!("{node}");
    }
    report
}

/// The body of the child processes: one role each, chosen by `NICBAR_TEST_ROLE`.
#[test]
#[ignore = "run by the other tests as a child process"]
fn child() {
    let role = std::env::var(ROLE).expect("started by another test, with NICBAR_TEST_ROLE");
    let socket = var("SOCKET");
    let unit: u8 = var("UNIT").parse().unwrap();
    let port_id: u8 = var("PORT").parse().unwrap();
    let mut port = Port::open_at(Path::new(&socket), unit, port_id).unwrap();
    one_sided::play(&role, &mut port, BIG, ADDS);
    let _ = port.close();
}

fn spawn(name: &str, role: &str, socket: &Path, unit: u16, env: &[(&str, String)]) -> ChildProcess {
    let mut all = vec![
        ("SOCKET", socket.display().to_string()),
        ("UNIT", unit.to_string()),
        ("PORT", "1".to_owned()),
    ];
    all.extend(env.iter().cloned());
    ChildProcess::spawn(name, role, &all)
}

#[test]
fn a_1_mib_put_and_get_between_processes_on_two_qemu_nics_arrive_byte_for_byte() {
    if !qemu_or_skip("a_1_mib_put_and_get_between_processes_on_two_qemu_nics") {
        return;
    }
    let seed = common::seed(13);
    let dir = common::temp_dir("nicbar-qemu-rdma");
    let fabric = fabric(&dir, 2);
    let socket = fabric.socket().to_owned();
    let mut target = spawn("target", "target", &socket, 1, &[]);
    let key = target.expect("key", STAGE);
    let mut mover = spawn(
        "mover",
        "mover",
        &socket,
        0,
        &[
            ("SEED", seed.to_string()),
            ("KEY", key),
            ("TARGET_NODE", "1".to_owned()),
            ("TARGET_PORT", "1".to_owned()),
        ],
    );
    let put = mover.expect("put done in", STAGE);
    eprintln!("1 MiB put between QEMU NICs: {put}");
    target.say(&format!("check {seed}"));
    assert_eq!(
        target.expect("checked", STAGE),
        "None",
        "the target holds every byte"
    );
    mover.say("get");
    let got = mover.expect("got", STAGE);
    eprintln!("1 MiB get between QEMU NICs: {got}");
    assert!(got.starts_with("None"), "the get brought every byte: {got}");
    mover.wait_success(STAGE);
    target.say("exit");
    target.wait_success(STAGE);
    let report = stop(fabric);
    for node in &report.nodes {
        assert_eq!(node.counters.memory_faults.get(), 0, "{node}");
        // A MiB each way, at most a bounce buffer per round trip, on both NICs.
        let least = 2 * BIG as u32 / shared_abi::qemu::layout::MEMORY_BOUNCE_LEN as u32;
        assert!(node.counters.memory_accesses.get() >= least, "{node}");
    }
}

#[test]
fn fetch_and_adds_from_three_processes_on_qemu_nics_end_exact() {
    if !qemu_or_skip("fetch_and_adds_from_three_processes_on_qemu_nics_end_exact") {
        return;
    }
    let dir = common::temp_dir("nicbar-qemu-rdma");
    let fabric = fabric(&dir, 3);
    let socket = fabric.socket().to_owned();
    let mut target = spawn("target", "target", &socket, 2, &[]);
    let key = target.expect("key", STAGE);
    // Two adders on the other NICs and one on the target's own NIC (another port).
    let mut adders: Vec<ChildProcess> = [(0u16, 1u8), (1, 1), (2, 2)]
        .into_iter()
        .map(|(unit, port)| {
            let command = ChildProcess::command(
                "adder",
                &[
                    ("SOCKET", socket.display().to_string()),
                    ("UNIT", unit.to_string()),
                    ("PORT", port.to_string()),
                    ("KEY", key.clone()),
                    ("TARGET_NODE", "2".to_owned()),
                    ("TARGET_PORT", "1".to_owned()),
                ],
            );
            ChildProcess::start(&format!("adder on unit {unit} port {port}"), command)
        })
        .collect();
    for adder in adders.iter_mut() {
        let line = adder.expect("adds done", STAGE);
        eprintln!("{}: {line}", adder.name);
        assert!(
            line.starts_with(&format!(", {ADDS} distinct previous values")),
            "every add saw a value no other add of this process saw: {line}"
        );
        adder.wait_success(STAGE);
    }
    target.say("word");
    assert_eq!(target.expect("word", STAGE), (3 * ADDS).to_string());
    target.say("exit");
    target.wait_success(STAGE);
    let report = stop(fabric);
    assert_eq!(report.nodes[2].counters.memory_faults.get(), 0);
}

#[test]
fn a_target_killed_during_a_put_ends_it_with_an_error_and_the_nic_serves_the_next_owner() {
    if !qemu_or_skip("a_target_killed_during_a_put_ends_it_with_an_error") {
        return;
    }
    let seed = common::seed(29);
    let dir = common::temp_dir("nicbar-qemu-rdma");
    let fabric = fabric(&dir, 2);
    let socket = fabric.socket().to_owned();
    let mut initiator = Port::open_at(&socket, 0, 1).unwrap();
    let local = initiator.register_memory(BIG).unwrap();
    let patterned: Vec<u8> = (0..BIG).map(|i| one_sided::pattern(seed, i)).collect();
    local.bytes().write(0, &patterned);
    let node = NodeId::new(1);

    let mut doomed = spawn("doomed target", "target", &socket, 1, &[]);
    let key: u32 = doomed.expect("key", STAGE).parse().unwrap();
    let remote = nicbar::RemotePointer { key, offset: 0 }.to_u64();
    initiator
        .put(&local, 0, remote, BIG, node, PortId(1), 1)
        .unwrap();
    // At once: a MiB takes the NIC hundreds of round trips, the kill microseconds.
    doomed.child.kill().unwrap();
    let _ = doomed.child.wait();
    let (context, status, _) = completion(&mut initiator);
    assert_eq!(context, 1);
    eprintln!("the put to the killed target ended with {status:?}");
    assert!(
        [Status::MEMORY_FAULT, Status::TARGET_PORT_CLOSED].contains(&status),
        "a put whose target died ends with an error naming it, not {status:?}"
    );

    // The NIC goes on: the port's next owner gets every byte of a put.
    let mut target = spawn("next target", "target", &socket, 1, &[]);
    let key = target.expect("key", STAGE);
    let remote = nicbar::RemotePointer {
        key: key.parse().unwrap(),
        offset: 0,
    }
    .to_u64();
    initiator
        .put(&local, 0, remote, BIG, node, PortId(1), 2)
        .unwrap();
    assert_eq!(completion(&mut initiator), (2, Status::SUCCESS, 0));
    target.say(&format!("check {seed}"));
    assert_eq!(target.expect("checked", STAGE), "None");
    target.say("exit");
    target.wait_success(STAGE);
    drop(initiator);
    let report = stop(fabric);
    assert_eq!(report.nodes[0].counters.memory_faults.get(), 0);
}

#[test]
fn refusals_on_qemu_nics_name_their_rule_and_leave_the_target_untouched() {
    if !qemu_or_skip("refusals_on_qemu_nics_name_their_rule_and_leave_the_target_untouched") {
        return;
    }
    let dir = common::temp_dir("nicbar-qemu-rdma");
    let fabric = fabric(&dir, 2);
    let mut initiator = Port::open_at(fabric.socket(), 0, 1).unwrap();
    let mut target = Port::open_at(fabric.socket(), 1, 2).unwrap();
    let node = NodeId::new(1);
    let local = initiator.register_memory(16 * 1024).unwrap();
    local.bytes().write(0, &[0xab; 16 * 1024]);
    let region = target.register_memory(4096).unwrap();
    one_sided::refusals_of_an_open_port(&mut initiator, &mut target, node, &local, &region, 10_000);

    // A registration the firmware refuses comes back in words: its table is full.
    let mut fillers = Vec::new();
    let refusal = loop {
        match target.register_memory(64) {
            Ok(region) => fillers.push(region),
            Err(error) => break error,
        }
        assert!(fillers.len() <= 64, "the region table never filled");
    };
    assert!(
        matches!(&refusal, Error::Refused(reason) if reason.contains("table of registered regions is full")),
        "{refusal}"
    );
    assert_eq!(fillers.len(), FIRMWARE_REGIONS - 1);
    for filler in &fillers {
        target.deregister_memory(filler).unwrap();
    }

    // Registrations the daemon refuses before the firmware sees them, in words, on a control
    // connection of its own (as a process's library speaks it).
    let stream = nicbar_control::connect(fabric.socket()).unwrap();
    let open = Request::OpenPort {
        unit: 1,
        port: 3,
        abi_version: shared_abi::ABI_VERSION,
    };
    let (reply, _fds) = nicbar_control::call(&stream, &open, STAGE).unwrap();
    assert!(matches!(reply, Reply::Opened(_)), "{reply:?}");
    let register = |address: u64, length: u64| {
        let request = Request::RegisterMemory { address, length };
        match nicbar_control::call(&stream, &request, STAGE).unwrap().0 {
            Reply::Error(ControlError::MemoryRefused(reason)) => reason,
            other => panic!("registering {length} bytes at {address:#x}: {other:?}"),
        }
    };
    // Page 0 is never mapped.
    let unmapped = register(16, 64);
    assert!(unmapped.contains("not wholly mapped"), "{unmapped}");
    let past_the_end = register(local.bytes().as_ptr() as u64, 1 << 40);
    assert!(past_the_end.contains("not wholly mapped"), "{past_the_end}");
    drop(stream);

    // A deregistered region, then a closed port.
    one_sided::refusals_of_a_region_and_port_gone(&mut initiator, target, node, &local, &region);
    drop(initiator);
    let report = stop(fabric);
    assert_eq!(report.nodes[1].counters.memory_faults.get(), 0);
}
