//! One-sided operations between real processes on the emulated NIC: a 64 MiB put and get checked
//! byte for byte through 10 % loss, duplication and reordering; four processes each doing 10,000
//! NIC fetch-and-adds on one word; and every refusal, each naming the rule it broke with the
//! target's memory untouched.
//!
//! The daemon runs in the test process; the initiators and the target are children (this test
//! binary in a role), so the NIC reaches their memory across processes as it does for any
//! program (`process_vm_readv`/`process_vm_writev`).

mod common;

use std::path::Path;
use std::time::Duration;

use common::one_sided;
use common::{ChildProcess, ROLE, STAGE, var};
use nicbar::{NodeId, Port};
use nicbar_emulator::{Emulator, EmulatorConfig, EmulatorHandle, FaultConfig};

/// The big transfer's length.
const BIG: usize = 64 << 20;
/// Fetch-and-adds per adding process.
const ADDS: u64 = 10_000;

fn emulator(dir: &Path, units: u16, faults: Option<FaultConfig>) -> EmulatorHandle {
    let mut config = EmulatorConfig::in_process(dir.join("control.sock"), units);
    if let Some(faults) = faults {
        eprintln!("fault injector: {faults}");
    }
    config.faults = faults;
    Emulator::spawn(config).unwrap()
}

fn open_child_port() -> Port {
    let socket = var("SOCKET");
    let unit: u8 = var("UNIT").parse().unwrap();
    Port::open_at(Path::new(&socket), unit, 1).unwrap()
}

/// The body of the child processes: one role each, chosen by `NICBAR_TEST_ROLE`.
#[test]
#[ignore = "run by the other tests as a child process"]
fn child() {
    let role = std::env::var(ROLE).expect("started by another test, with NICBAR_TEST_ROLE");
    let mut port = open_child_port();
    one_sided::play(&role, &mut port, BIG, ADDS);
    let _ = port.close();
}

fn spawn(name: &str, role: &str, socket: &Path, unit: u16, env: &[(&str, String)]) -> ChildProcess {
    let mut all = vec![
        ("SOCKET", socket.display().to_string()),
        ("UNIT", unit.to_string()),
        ("TARGET_PORT", "1".to_owned()),
    ];
    all.extend(env.iter().cloned());
    ChildProcess::spawn(name, role, &all)
}

#[test]
fn a_64_mib_put_and_get_arrive_byte_for_byte_through_loss_duplication_and_reordering() {
    let seed = common::seed(13);
    let dir = common::temp_dir("nicbar-rdma");
    let faults = FaultConfig {
        loss: 0.1,
        duplicate: 0.1,
        reorder: 0.1,
        reorder_window: Duration::from_micros(200),
        ..FaultConfig::none(seed)
    };
    let daemon = emulator(dir.path(), 2, Some(faults));
    let socket = daemon.socket().to_owned();
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
        ],
    );
    let put = mover.expect("put done in", STAGE * 3);
    eprintln!("64 MiB put through faults: {put}");
    target.say(&format!("check {seed}"));
    assert_eq!(
        target.expect("checked", STAGE),
        "None",
        "the target holds every byte"
    );
    mover.say("get");
    let got = mover.expect("got", STAGE * 3);
    eprintln!("64 MiB get through faults: {got}");
    assert!(got.starts_with("None"), "the get brought every byte: {got}");
    mover.wait_success(STAGE);
    target.say("exit");
    target.wait_success(STAGE);
}

#[test]
fn four_processes_adding_10000_times_each_to_one_word_end_at_40000() {
    let seed = common::seed(21);
    let dir = common::temp_dir("nicbar-rdma");
    // A little loss and duplication: exactly-once must hold through them.
    let faults = FaultConfig {
        loss: 0.02,
        duplicate: 0.02,
        reorder: 0.02,
        ..FaultConfig::none(seed)
    };
    let daemon = emulator(dir.path(), 5, Some(faults));
    let socket = daemon.socket().to_owned();
    let mut target = spawn("target", "target", &socket, 4, &[]);
    let key = target.expect("key", STAGE);
    let mut adders: Vec<ChildProcess> = (0..4u16)
        .map(|unit| {
            spawn(
                &format!("adder {unit}"),
                "adder",
                &socket,
                unit,
                &[("KEY", key.clone()), ("TARGET_NODE", "4".to_owned())],
            )
        })
        .collect();
    for adder in adders.iter_mut() {
        let line = adder.expect("adds done", STAGE * 2);
        assert!(
            line.starts_with(&format!(", {ADDS} distinct previous values")),
            "{line}"
        );
        adder.wait_success(STAGE);
    }
    target.say("word");
    assert_eq!(target.expect("word", STAGE), (4 * ADDS).to_string());
    target.say("exit");
    target.wait_success(STAGE);
}

#[test]
fn every_refusal_names_its_rule_and_leaves_the_target_untouched() {
    let dir = common::temp_dir("nicbar-rdma");
    let daemon = emulator(dir.path(), 2, None);
    let mut initiator = Port::open_at(daemon.socket(), 0, 1).unwrap();
    let mut target = Port::open_at(daemon.socket(), 1, 2).unwrap();
    let node = NodeId::new(1);
    let local = initiator.register_memory(64 * 1024).unwrap();
    local.bytes().write(0, &[0xab; 64 * 1024]);
    let region = target.register_memory(4096).unwrap();
    one_sided::refusals_of_an_open_port(&mut initiator, &mut target, node, &local, &region, 20_000);
    initiator.fence(Some(node)).unwrap();

    // A deregistered region, then a closed port.
    one_sided::refusals_of_a_region_and_port_gone(&mut initiator, target, node, &local, &region);
    drop(daemon);
}
