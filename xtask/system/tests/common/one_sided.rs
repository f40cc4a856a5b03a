//! One-sided helpers the RDMA tests of both NICs share: the child processes' roles, waiting for
//! an operation's end, and the refusals every NIC must give.

use std::time::Instant;

use nicbar::{AtomicOp, Event, MemoryRegion, NodeId, Port, PortId, Status};

use super::{STAGE, hear, say, var};

/// Operations an adder keeps in flight.
const IN_FLIGHT: u64 = 8;

/// The next `OperationDone` of `port`: (context, status, value). Any other event fails.
pub(crate) fn completion(port: &mut Port) -> (u64, Status, u64) {
    let deadline = Instant::now() + STAGE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no completion within {STAGE:?}");
        match port.receive_timeout(left).unwrap() {
            Some(Event::OperationDone {
                context,
                status,
                value,
                ..
            }) => return (context, status, value),
            Some(other) => panic!("unexpected event {other:?}"),
            None => {}
        }
    }
}

/// The status of `port`'s next operation to end.
pub(crate) fn status_of(port: &mut Port) -> Status {
    completion(port).1
}

/// Whether no byte of `region` was written (it was registered zeroed).
pub(crate) fn untouched(region: &MemoryRegion) -> bool {
    region
        .bytes()
        .to_vec(0, region.len())
        .iter()
        .all(|&b| b == 0)
}

/// A put of `len` bytes from `local` to `remote` on port 2 of `node`; its status.
pub(crate) fn put(
    port: &mut Port,
    local: &MemoryRegion,
    node: NodeId,
    remote: u64,
    len: usize,
) -> Status {
    port.put(local, 0, remote, len, node, PortId(2), 7).unwrap();
    status_of(port)
}

/// The refusals of an open target port (port 2 of `node`, which has registered `region`, zeroed,
/// of 4,096 bytes, and not yet allowed remote access), each naming its rule and writing nothing;
/// then a put that is allowed lands where it should. `long` is a put of several packets longer
/// than the region. `local` holds 0xab bytes.
pub(crate) fn refusals_of_an_open_port(
    initiator: &mut Port,
    target: &mut Port,
    node: NodeId,
    local: &MemoryRegion,
    region: &MemoryRegion,
    long: usize,
) {
    assert_eq!(
        put(initiator, local, node, region.remote(0), 100),
        Status::REMOTE_ACCESS_DENIED,
        "before the target allows remote access"
    );
    target.allow_remote_memory_access().unwrap();
    let wrong_key = nicbar::RemotePointer {
        key: region.key() ^ 0x100,
        offset: 0,
    }
    .to_u64();
    assert_eq!(put(initiator, local, node, wrong_key, 100), Status::BAD_KEY);
    assert_eq!(
        put(initiator, local, node, region.remote(4000), 200),
        Status::OUT_OF_BOUNDS,
        "past the region's end"
    );
    assert_eq!(
        put(initiator, local, node, region.remote(0), long),
        Status::OUT_OF_BOUNDS,
        "a put of several packets longer than the region"
    );
    initiator
        .atomic(AtomicOp::SWAP, region.remote(4), 1, 0, node, PortId(2), 8)
        .unwrap();
    assert_eq!(status_of(initiator), Status::MISALIGNED);
    assert!(untouched(region), "no refused operation wrote a byte");

    // What is allowed works, and lands where it should.
    assert_eq!(
        put(initiator, local, node, region.remote(8), 100),
        Status::SUCCESS
    );
    assert_eq!(region.bytes().to_vec(8, 100), vec![0xab; 100]);
    assert_eq!(region.bytes().to_vec(0, 8), vec![0; 8]);
}

/// The refusals of a deregistered region, then of the closed target port (which this closes),
/// for puts and gets alike; a refused get writes nothing into `local`.
pub(crate) fn refusals_of_a_region_and_port_gone(
    initiator: &mut Port,
    mut target: Port,
    node: NodeId,
    local: &MemoryRegion,
    region: &MemoryRegion,
) {
    target.deregister_memory(region).unwrap();
    assert_eq!(
        put(initiator, local, node, region.remote(0), 100),
        Status::BAD_KEY
    );
    let remote = region.remote(0);
    target.close().unwrap();
    assert_eq!(
        put(initiator, local, node, remote, 100),
        Status::TARGET_PORT_CLOSED
    );
    initiator
        .get(remote, local, 0, 100, node, PortId(2), 9)
        .unwrap();
    assert_eq!(status_of(initiator), Status::TARGET_PORT_CLOSED);
    assert_eq!(
        local.bytes().to_vec(0, 100),
        vec![0xab; 100],
        "a refused get writes nothing"
    );
}

/// The byte at `index` of the pattern of `seed`.
pub(crate) fn pattern(seed: u64, index: usize) -> u8 {
    let x = (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
    (x >> 29) as u8 ^ (index >> 12) as u8
}

/// A child process's one-sided role on `port` (its peer: node `TARGET_NODE`, port
/// `TARGET_PORT`, region key `KEY`):
/// - "target" registers `big` zeroed bytes and lets peers reach them, then answers
///   "check SEED" (the first byte that is not the pattern) and "word" (its first word);
/// - "mover" puts `big` bytes of the pattern of `SEED` into the target, then, told "get", gets
///   them back into another region and says where the first difference is;
/// - "adder" does `adds` fetch-and-adds of 1 on the target's word 0, a few at a time, and says
///   how many distinct values came back.
pub(crate) fn play(role: &str, port: &mut Port, big: usize, adds: u64) {
    match role {
        "target" => {
            let region = port.register_memory(big).unwrap();
            port.allow_remote_memory_access().unwrap();
            say(&format!("key {}", region.key()));
            loop {
                let line = hear();
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.as_slice() {
                    ["check", seed] => {
                        let seed: u64 = seed.parse().unwrap();
                        let bytes = region.bytes().to_vec(0, big);
                        let bad = bytes
                            .iter()
                            .enumerate()
                            .position(|(i, &b)| b != pattern(seed, i));
                        say(&format!("checked {bad:?}"));
                    }
                    ["word"] => say(&format!("word {}", region.bytes().load_u64(0))),
                    _ => break,
                }
            }
        }
        "mover" => {
            let seed: u64 = var("SEED").parse().unwrap();
            let (remote, target, target_port) = peer();
            let source = port.register_memory(big).unwrap();
            let patterned: Vec<u8> = (0..big).map(|i| pattern(seed, i)).collect();
            source.bytes().write(0, &patterned);
            let started = Instant::now();
            port.put(&source, 0, remote, big, target, target_port, 1)
                .unwrap();
            assert_eq!(completion(port), (1, Status::SUCCESS, 0));
            say(&format!("put done in {:?}", started.elapsed()));
            assert_eq!(hear(), "get");
            let back = port.register_memory(big).unwrap();
            let started = Instant::now();
            port.get(remote, &back, 0, big, target, target_port, 2)
                .unwrap();
            assert_eq!(completion(port), (2, Status::SUCCESS, 0));
            let got = back.bytes().to_vec(0, big);
            let bad = got.iter().zip(&patterned).position(|(a, b)| a != b);
            say(&format!("got {bad:?} in {:?}", started.elapsed()));
        }
        "adder" => {
            let (remote, target, target_port) = peer();
            let mut posted = 0u64;
            let mut previous = Vec::with_capacity(adds as usize);
            let started = Instant::now();
            while (previous.len() as u64) < adds {
                while posted < adds && posted - previous.len() as u64 <= IN_FLIGHT {
                    port.atomic(
                        AtomicOp::FETCH_ADD,
                        remote,
                        1,
                        0,
                        target,
                        target_port,
                        posted,
                    )
                    .unwrap();
                    posted += 1;
                }
                let (_, status, value) = completion(port);
                assert_eq!(status, Status::SUCCESS);
                previous.push(value);
            }
            let took = started.elapsed();
            previous.sort_unstable();
            previous.dedup();
            say(&format!(
                "adds done, {} distinct previous values in {took:?}",
                previous.len()
            ));
        }
        other => panic!("unknown role {other}"),
    }
}

/// The peer's region (a remote pointer to its start), node and port, from the environment.
fn peer() -> (u64, NodeId, PortId) {
    let key: u32 = var("KEY").parse().unwrap();
    let remote = nicbar::RemotePointer { key, offset: 0 }.to_u64();
    let node = NodeId::new(var("TARGET_NODE").parse().unwrap());
    (remote, node, PortId(var("TARGET_PORT").parse().unwrap()))
}
