//! One-sided helpers the RDMA tests of both NICs share: waiting for an operation's end, and the
//! refusals every NIC must give.

use std::time::Instant;

use nicbar::{AtomicOp, Event, MemoryRegion, NodeId, Port, PortId, Status};

use super::STAGE;

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
