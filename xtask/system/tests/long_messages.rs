//! Messages longer than a packet between real processes on the emulated NIC: the NIC cuts them
//! into segments and places them, in order, into one receive buffer of their size class; checked
//! byte for byte through 10 % loss, duplication and reordering.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{ChildProcess, ROLE, STAGE, hear, say, var};
use nicbar::{Event, NodeId, Port, PortId, Priority, Status, max_length_for_size};
use nicbar_emulator::{Emulator, EmulatorConfig, FaultConfig};

/// The messages: exactly 1 MiB, then one that ends part way into a segment.
const LENGTHS: [usize; 2] = [1 << 20, 1_500_001];
/// Their size class: buffers of 2 MiB, holding 2 MiB - 8 bytes.
const SIZE: u8 = 21;

/// The byte at `index` of message `n` of the pattern of `seed`.
fn pattern(seed: u64, n: usize, index: usize) -> u8 {
    let x = (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed ^ (n as u64) << 40;
    (x >> 29) as u8 ^ (index >> 12) as u8
}

/// Waits for the next event on `port`, with a bound.
fn next_event(port: &mut Port) -> Event {
    let deadline = Instant::now() + STAGE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no event within {STAGE:?}");
        if let Some(event) = port.receive_timeout(left).unwrap() {
            return event;
        }
    }
}

/// The body of the child processes: one role each, chosen by `NICBAR_TEST_ROLE`.
#[test]
#[ignore = "run by the other tests as a child process"]
fn child() {
    let role = std::env::var(ROLE).expect("started by another test, with NICBAR_TEST_ROLE");
    let seed: u64 = var("SEED").parse().unwrap();
    let socket = var("SOCKET");
    let unit: u8 = var("UNIT").parse().unwrap();
    let mut port = Port::open_at(Path::new(&socket), unit, 1).unwrap();
    let capacity = max_length_for_size(SIZE) as usize;
    match role.as_str() {
        // Offers two buffers of SIZE, then checks each message as it arrives.
        "receiver" => {
            for tag in 0..LENGTHS.len() as u32 {
                let buffer = port.dma_alloc(capacity).unwrap();
                port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
                    .map_err(|e| e.error)
                    .unwrap();
            }
            say("ready");
            for (n, &length) in LENGTHS.iter().enumerate() {
                match next_event(&mut port) {
                    Event::Received {
                        buffer,
                        length: got,
                        size,
                        sender_node,
                        status,
                        ..
                    } => {
                        assert_eq!(status, Status::SUCCESS, "message {n}");
                        assert_eq!((got, size, sender_node), (length, SIZE, NodeId::new(0)));
                        let bad = buffer[..length]
                            .iter()
                            .enumerate()
                            .position(|(i, &b)| b != pattern(seed, n, i));
                        say(&format!("message {n} {bad:?}"));
                    }
                    other => panic!("unexpected event {other:?}"),
                }
            }
        }
        // Sends both messages back to back and waits for their completions.
        "sender" => {
            assert_eq!(hear(), "go");
            let started = Instant::now();
            for (n, &length) in LENGTHS.iter().enumerate() {
                let mut buffer = port.dma_alloc(length).unwrap();
                for (i, byte) in buffer[..length].iter_mut().enumerate() {
                    *byte = pattern(seed, n, i);
                }
                port.send(
                    buffer,
                    length,
                    SIZE,
                    Priority::LOW,
                    NodeId::new(1),
                    PortId(1),
                    n as u64,
                )
                .map_err(|e| e.error)
                .unwrap();
            }
            for n in 0..LENGTHS.len() as u64 {
                match next_event(&mut port) {
                    Event::Sent {
                        status, context, ..
                    } => assert_eq!((context, status), (n, Status::SUCCESS)),
                    other => panic!("unexpected event {other:?}"),
                }
            }
            say(&format!("sent in {:?}", started.elapsed()));
        }
        other => panic!("unknown role {other}"),
    }
    let _ = port.close();
}

#[test]
fn messages_of_a_mebibyte_and_more_arrive_byte_for_byte_through_loss_duplication_and_reordering() {
    let seed = common::seed(34);
    let dir = common::temp_dir("nicbar-long");
    let faults = FaultConfig {
        loss: 0.1,
        duplicate: 0.1,
        reorder: 0.1,
        reorder_window: Duration::from_micros(200),
        ..FaultConfig::none(seed)
    };
    eprintln!("fault injector: {faults}");
    let mut config = EmulatorConfig::in_process(dir.path().join("control.sock"), 2);
    config.faults = Some(faults);
    // Room for two buffers of 2 MiB, and for the sender's messages.
    config.region.arena_len = 8 << 20;
    let daemon = Emulator::spawn(config).unwrap();
    let socket = daemon.socket().display().to_string();
    let env = |unit: u16| {
        vec![
            ("SOCKET", socket.clone()),
            ("UNIT", unit.to_string()),
            ("SEED", seed.to_string()),
        ]
    };
    let mut receiver = ChildProcess::spawn("receiver", "receiver", &env(1));
    receiver.expect("ready", STAGE);
    let mut sender = ChildProcess::spawn("sender", "sender", &env(0));
    sender.say("go");
    for n in 0..LENGTHS.len() {
        assert_eq!(
            receiver.expect(&format!("message {n}"), STAGE * 2),
            "None",
            "message {n} arrived byte for byte (seed {seed})"
        );
    }
    eprintln!("sent in {}", sender.expect("sent in", STAGE));
    sender.wait_success(STAGE);
    receiver.wait_success(STAGE);
    drop(daemon);
}
