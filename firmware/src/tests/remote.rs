//! One-sided operations: puts, gets and atomics on registered process memory; their exactly-once
//! delivery through loss, duplication and reordering; and every refusal, each naming its rule and
//! leaving the target's memory untouched.

use shared_abi::event::{Event, EventKind, Status};
use shared_abi::ids::{NodeId, PortId};
use shared_abi::packet::PacketKind;
use shared_abi::rdma::{AtomicOp, RDMA_SEGMENT, RemotePointer};
use shared_abi::token::{SendKind, SendToken};

use super::*;

/// Bytes of process memory each test port has.
const MEMORY: usize = 256 * 1024;

/// Two nodes: node 0 port 1 initiates, node 1 port 2 is the target. Both processes have
/// [`MEMORY`] bytes registered (the initiator's filled with a pattern, the target's with
/// [`UNTOUCHED`]); the target allows remote access if `allow`. Returns the target region's key.
fn pair(allow: bool) -> (Net, u32) {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    net[0].wire().process[1] = (0..MEMORY).map(|i| (i * 7 + 3) as u8).collect();
    net[1].wire().process[2] = std::vec![UNTOUCHED; MEMORY];
    net[0]
        .nic
        .register_memory(PortId(1), PROCESS_BASE, MEMORY as u64, 0x1111_1100)
        .unwrap();
    let key = net[1]
        .nic
        .register_memory(PortId(2), PROCESS_BASE, MEMORY as u64, 0xabcd_ef00)
        .unwrap();
    if allow {
        net[1].nic.allow_remote_memory_access(PortId(2)).unwrap();
    }
    (net, key)
}

fn token(
    kind: SendKind,
    local: u64,
    remote: RemotePointer,
    length: u32,
    context: u64,
) -> SendToken {
    SendToken {
        kind,
        target_node: NodeId::new(1),
        target_port: PortId(2),
        length: length.into(),
        buffer: local.into(),
        remote: remote.to_u64().into(),
        context: context.into(),
        ..SendToken::default()
    }
}

fn atomic(
    op: AtomicOp,
    result: u64,
    remote: RemotePointer,
    operand: u64,
    compare: u64,
    context: u64,
) -> SendToken {
    SendToken {
        op,
        operand: operand.into(),
        compare: compare.into(),
        ..token(SendKind::ATOMIC, result, remote, 8, context)
    }
}

/// Where the atomics of the mixed test write their results.
const RESULTS: u64 = PROCESS_BASE + 200 * 1024;

/// Compares bytes and names the first difference (without printing kilobytes).
fn same(got: &[u8], expected: &[u8], what: &str, seed: u64) {
    assert_eq!(got.len(), expected.len(), "seed {seed}: {what}: length");
    if let Some(at) = got.iter().zip(expected).position(|(a, b)| a != b) {
        panic!(
            "seed {seed}: {what}: byte {at} is {:#04x}, expected {:#04x}",
            got[at], expected[at]
        );
    }
}

fn at(key: u32, offset: u32) -> RemotePointer {
    RemotePointer { key, offset }
}

fn sent(events: &[Event]) -> Vec<(Status, u64)> {
    events
        .iter()
        .filter(|e| e.kind == EventKind::SENT)
        .map(|e| (e.status, e.context.get()))
        .collect()
}

/// [`super::run_lossy`] with nothing to do between rounds.
pub(super) fn run_lossy(net: &mut Net, seed: u64, percent: u64, limit: Duration) {
    super::run_lossy(net, seed, percent, limit, &mut |_| {});
}

#[test]
fn a_put_lands_in_the_target_memory_and_completes_only_on_the_targets_reply() {
    let (mut net, key) = pair(true);
    let length = 2 * RDMA_SEGMENT as u32 + 100;
    net[0].post_send(
        1,
        &token(SendKind::PUT, PROCESS_BASE + 5, at(key, 1000), length, 77),
    );
    net.doorbell(0);
    // Carry everything but the target's reply: every segment is taken and acknowledged.
    for _ in 0..50 {
        let mut moving = net.poll(0);
        moving.extend(
            net.poll(1)
                .into_iter()
                .filter(|p| p.kind() != PacketKind::RDMA_REPLY),
        );
        for packet in &moving {
            net.deliver(packet);
        }
    }
    let expected = net[0].wire().process[1][5..5 + length as usize].to_vec();
    assert_eq!(
        &net[1].wire().process[2][1000..1000 + length as usize],
        &expected[..],
        "every segment is in the target's memory"
    );
    assert!(
        sent(&net[0].events(1)).is_empty(),
        "acknowledged segments alone do not complete a put"
    );
    // The reply, unacknowledged, is sent again.
    net.run_for(Duration::from_millis(50));
    assert_eq!(sent(&net[0].events(1)), [(Status::SUCCESS, 77)]);
    let target = &net[1].wire().process[2];
    assert!(target[..1000].iter().all(|&b| b == UNTOUCHED));
    assert!(
        target[1000 + length as usize..]
            .iter()
            .all(|&b| b == UNTOUCHED)
    );
}

#[test]
fn puts_gets_and_atomics_come_through_loss_duplication_and_reordering_exactly_once() {
    for seed in [1u64, 2, 3, 20261124] {
        let (mut net, key) = pair(true);
        // A put, a get of what it wrote, and fetch-and-adds on one word, interleaved.
        let length = 5 * RDMA_SEGMENT as u32 + 17;
        net[0].post_send(
            1,
            &token(SendKind::PUT, PROCESS_BASE, at(key, 64), length, 1),
        );
        net[0].post_send(
            1,
            &token(
                SendKind::GET,
                PROCESS_BASE + 32 * 1024,
                at(key, 64),
                length,
                2,
            ),
        );
        for n in 0..6 {
            net[0].post_send(
                1,
                &atomic(
                    AtomicOp::FETCH_ADD,
                    RESULTS + 8 * n,
                    at(key, 0),
                    1 << n,
                    0,
                    10 + n,
                ),
            );
        }
        net.doorbell(0);
        run_lossy(&mut net, seed, 10, Duration::from_secs(3));
        let events = net[0].events(1);
        let mut done = sent(&events);
        done.sort_by_key(|(_, context)| *context);
        let contexts: Vec<u64> = done.iter().map(|(_, c)| *c).collect();
        assert_eq!(contexts, [1, 2, 10, 11, 12, 13, 14, 15], "seed {seed}");
        assert!(
            done.iter().all(|(status, _)| *status == Status::SUCCESS),
            "seed {seed}: {done:?}"
        );
        let source = net[0].wire().process[1][..length as usize].to_vec();
        let target = net[1].wire().process[2].clone();
        same(&target[64..64 + length as usize], &source, "put", seed);
        let got = &net[0].wire().process[1][32 * 1024..32 * 1024 + length as usize];
        same(got, &source, "get", seed);
        let results = &net[0].wire().process[1][RESULTS as usize - PROCESS_BASE as usize..][..48];
        let mut returned: Vec<u64> = results
            .chunks(8)
            .map(|word| u64::from_le_bytes(word.try_into().unwrap()))
            .collect();
        returned.sort_unstable();
        returned.dedup();
        assert_eq!(returned.len(), 6, "seed {seed}: each add wrote its result");
        // The word started as eight UNTOUCHED bytes; each add applied exactly once.
        let start = u64::from_le_bytes([UNTOUCHED; 8]);
        let word = u64::from_le_bytes(target[..8].try_into().unwrap());
        assert_eq!(word, start.wrapping_add(0b11_1111), "seed {seed}");
        // Every add saw a distinct previous value, and the results went to the process too.
        let mut previous: Vec<u64> = events
            .iter()
            .filter(|e| e.kind == EventKind::SENT && e.context.get() >= 10)
            .map(|e| e.buffer.get())
            .collect();
        previous.sort_unstable();
        previous.dedup();
        assert_eq!(previous.len(), 6, "seed {seed}");
    }
}

#[test]
fn atomics_compute_and_return_the_previous_value() {
    let (mut net, key) = pair(true);
    net[1].wire().process[2][8..16].copy_from_slice(&5u64.to_le_bytes());
    let result = PROCESS_BASE + 4096;
    let steps = [
        (AtomicOp::FETCH_ADD, 10, 0, 5, 15u64),
        (AtomicOp::COMPARE_SWAP, 99, 14, 15, 15),
        (AtomicOp::COMPARE_SWAP, 99, 15, 15, 99),
        (AtomicOp::SWAP, 7, 0, 99, 7),
    ];
    for (n, (op, operand, compare, old, new)) in steps.into_iter().enumerate() {
        net[0].post_send(
            1,
            &atomic(op, result, at(key, 8), operand, compare, n as u64),
        );
        net.doorbell(0);
        net.run();
        let events = net[0].events(1);
        assert_eq!(sent(&events), [(Status::SUCCESS, n as u64)], "{op:?}");
        assert_eq!(
            events[0].buffer.get(),
            old,
            "{op:?} returns the previous value"
        );
        let memory = &net[0].wire().process[1];
        assert_eq!(
            memory[4096..4104],
            old.to_le_bytes(),
            "and writes it to the result"
        );
        let word = &net[1].wire().process[2][8..16];
        assert_eq!(word, new.to_le_bytes(), "{op:?}");
    }
}

#[test]
fn every_refusal_names_its_rule_and_leaves_the_target_untouched() {
    let (mut net, key) = pair(false);
    let put = |remote: RemotePointer, length: u32, context: u64| {
        token(SendKind::PUT, PROCESS_BASE, remote, length, context)
    };
    let expect = |net: &mut Net, token: SendToken, status: Status| {
        net[0].post_send(1, &token);
        net.doorbell(0);
        net.run();
        let events = net[0].events(1);
        assert_eq!(events.len(), 1, "{status:?}: {events:?}");
        assert_eq!(events[0].status, status);
        assert!(
            net[1].wire().process[2].iter().all(|&b| b == UNTOUCHED),
            "{status:?}: the target's memory is untouched"
        );
        events[0]
    };
    // Remote access not allowed yet.
    let event = expect(
        &mut net,
        put(at(key, 0), 100, 1),
        Status::REMOTE_ACCESS_DENIED,
    );
    assert_eq!(event.kind, EventKind::SENT);
    net[1].nic.allow_remote_memory_access(PortId(2)).unwrap();
    // A key the target never gave.
    expect(&mut net, put(at(key ^ 0x100, 0), 100, 2), Status::BAD_KEY);
    // Reaching past the region's end, in a put of several segments (no segment is written).
    expect(
        &mut net,
        put(
            at(key, MEMORY as u32 - 2 * RDMA_SEGMENT as u32),
            3 * RDMA_SEGMENT as u32,
            3,
        ),
        Status::OUT_OF_BOUNDS,
    );
    expect(
        &mut net,
        token(
            SendKind::GET,
            PROCESS_BASE,
            at(key, MEMORY as u32 - 8),
            9,
            4,
        ),
        Status::OUT_OF_BOUNDS,
    );
    expect(
        &mut net,
        atomic(AtomicOp::FETCH_ADD, 0, at(key, MEMORY as u32), 1, 0, 5),
        Status::OUT_OF_BOUNDS,
    );
    // A misaligned word: refused by our NIC at once (a token refusal).
    let event = expect(
        &mut net,
        atomic(AtomicOp::SWAP, 0, at(key, 4), 1, 0, 6),
        Status::MISALIGNED,
    );
    assert_eq!(event.kind, EventKind::TOKEN_REJECTED);
    // A local buffer outside our registered memory.
    let event = expect(
        &mut net,
        token(
            SendKind::PUT,
            PROCESS_BASE + MEMORY as u64 - 10,
            at(key, 0),
            11,
            7,
        ),
        Status::NOT_REGISTERED,
    );
    assert_eq!(event.kind, EventKind::TOKEN_REJECTED);
    // A deregistered region.
    net[1]
        .nic
        .deregister_memory(PortId(2), PROCESS_BASE, MEMORY as u64)
        .unwrap();
    expect(&mut net, put(at(key, 0), 100, 8), Status::BAD_KEY);
    // A closed port.
    net.close(1, 2);
    expect(
        &mut net,
        put(at(key, 0), 100, 9),
        Status::TARGET_PORT_CLOSED,
    );
    expect(
        &mut net,
        token(SendKind::GET, PROCESS_BASE, at(key, 0), 100, 10),
        Status::TARGET_PORT_CLOSED,
    );
}

#[test]
fn a_duplicated_atomic_is_applied_once() {
    let (mut net, key) = pair(true);
    net[0].post_send(1, &atomic(AtomicOp::FETCH_ADD, 0, at(key, 0), 1, 0, 1));
    net.doorbell(0);
    let packets = net.poll(0);
    let request = packets
        .iter()
        .find(|p| p.kind() == PacketKind::ATOMIC)
        .expect("the atomic goes out");
    for _ in 0..3 {
        net.deliver(request);
    }
    net.run();
    let word = u64::from_le_bytes(net[1].wire().process[2][..8].try_into().unwrap());
    assert_eq!(word, u64::from_le_bytes([UNTOUCHED; 8]) + 1);
    assert_eq!(sent(&net[0].events(1)), [(Status::SUCCESS, 1)]);
}

#[test]
fn a_get_whose_target_closes_midway_fails_and_an_initiator_that_closes_stops_cleanly() {
    let (mut net, key) = pair(true);
    let length = 40 * RDMA_SEGMENT as u32;
    net[0].post_send(
        1,
        &token(SendKind::GET, PROCESS_BASE, at(key, 0), length, 1),
    );
    net.doorbell(0);
    // The request and a few data packets, then the target's process exits.
    for _ in 0..2 {
        let moving: Vec<_> = net.poll(0).into_iter().chain(net.poll(1)).collect();
        for packet in &moving {
            net.deliver(packet);
        }
    }
    net.close(1, 2);
    net.run_for(Duration::from_millis(100));
    assert_eq!(sent(&net[0].events(1)), [(Status::TARGET_PORT_CLOSED, 1)]);

    // Reopened, allowed, registered: a put whose initiator closes before it is done.
    net.open(1, 2);
    net[1].wire().process[2] = std::vec![UNTOUCHED; MEMORY];
    let key = net[1]
        .nic
        .register_memory(PortId(2), PROCESS_BASE, MEMORY as u64, 0x2222_2200)
        .unwrap();
    net[1].nic.allow_remote_memory_access(PortId(2)).unwrap();
    net[0].post_send(
        1,
        &token(SendKind::PUT, PROCESS_BASE, at(key, 0), length, 2),
    );
    net.doorbell(0);
    net.poll(0);
    net.close(0, 1);
    net.run_for(Duration::from_secs(10));
    assert!(net[0].nic.poll_at().is_none(), "nothing is left to do");
}

/// [`pair`] on a board that builds puts' packets itself ([`crate::Hal::gathers_toward`]):
/// every route is one that never leaves it.
fn gathering_pair() -> (Net, u32) {
    let (mut net, key) = pair(true);
    for node in 0..2 {
        net[node].wire().local = true;
        net[node].wire().gathers = true;
    }
    (net, key)
}

#[test]
fn a_put_the_board_gathers_goes_in_long_segments_and_lands_whole_through_loss() {
    use shared_abi::rdma::LOCAL_RDMA_SEGMENT;
    for seed in [1u64, 2, 3, 20261129] {
        let (mut net, key) = gathering_pair();
        let length = 3 * LOCAL_RDMA_SEGMENT as u32 + 100;
        net[0].post_send(
            1,
            &token(SendKind::PUT, PROCESS_BASE + 5, at(key, 1000), length, 7),
        );
        // A short one behind it, in one segment.
        net[0].post_send(
            1,
            &token(SendKind::PUT, PROCESS_BASE, at(key, 200_000), 300, 8),
        );
        net.doorbell(0);
        if seed == 1 {
            // Without loss: one packet per long segment, the last with the rest.
            let carried = net.run();
            let segments: Vec<usize> = carried
                .iter()
                .filter(|p| p.kind() == PacketKind::RDMA_WRITE)
                .map(|p| p.payload().len() - shared_abi::rdma::RDMA_HEADER_LEN)
                .collect();
            assert_eq!(
                segments,
                [
                    LOCAL_RDMA_SEGMENT,
                    LOCAL_RDMA_SEGMENT,
                    LOCAL_RDMA_SEGMENT,
                    100,
                    300
                ]
            );
        }
        run_lossy(&mut net, seed, 10, Duration::from_secs(3));
        let mut done = sent(&net[0].events(1));
        done.sort_by_key(|(_, context)| *context);
        assert_eq!(
            done,
            [(Status::SUCCESS, 7), (Status::SUCCESS, 8)],
            "seed {seed}"
        );
        let source = net[0].wire().process[1].clone();
        let target = &net[1].wire().process[2];
        same(
            &target[1000..1000 + length as usize],
            &source[5..5 + length as usize],
            "long put",
            seed,
        );
        same(&target[200_000..200_300], &source[..300], "short put", seed);
        assert!(
            target[..1000].iter().all(|&b| b == UNTOUCHED),
            "seed {seed}"
        );
        let end = 1000 + length as usize;
        assert!(
            target[end..200_000].iter().all(|&b| b == UNTOUCHED),
            "seed {seed}"
        );
    }
}

#[test]
fn a_gathered_put_whose_source_cannot_be_read_fails_and_the_next_goes_through() {
    use shared_abi::rdma::LOCAL_RDMA_SEGMENT;
    let (mut net, key) = gathering_pair();
    let length = 2 * LOCAL_RDMA_SEGMENT as u32;
    net[0].post_send(
        1,
        &token(SendKind::PUT, PROCESS_BASE, at(key, 0), length, 1),
    );
    // The process lost the put's second half (registered memory the host took back): the
    // board's read fails as it sends the second segment.
    let kept = net[0].wire().process[1][..LOCAL_RDMA_SEGMENT].to_vec();
    net[0].wire().process[1].truncate(LOCAL_RDMA_SEGMENT);
    net.doorbell(0);
    net.run_for(Duration::from_millis(50));
    assert_eq!(sent(&net[0].events(1)), [(Status::MEMORY_FAULT, 1)]);
    // The connection goes on: a put from memory that is there lands.
    net[0].post_send(
        1,
        &token(SendKind::PUT, PROCESS_BASE, at(key, 150_000), 4000, 2),
    );
    net.doorbell(0);
    net.run_for(Duration::from_millis(50));
    assert_eq!(sent(&net[0].events(1)), [(Status::SUCCESS, 2)]);
    same(
        &net[1].wire().process[2][150_000..154_000],
        &kept[..4000],
        "the put after the fault",
        0,
    );
}

#[test]
fn a_get_the_board_gathers_comes_back_in_long_segments_through_loss() {
    use shared_abi::rdma::LOCAL_RDMA_SEGMENT;
    for seed in [1u64, 2, 20261129] {
        let (mut net, key) = gathering_pair();
        let pattern: Vec<u8> = (0..MEMORY).map(|i| (i * 13 + 1) as u8).collect();
        net[1].wire().process[2] = pattern.clone();
        let length = 2 * LOCAL_RDMA_SEGMENT as u32 + 777;
        net[0].post_send(
            1,
            &token(SendKind::GET, PROCESS_BASE + 100, at(key, 50), length, 4),
        );
        net.doorbell(0);
        if seed == 1 {
            let carried = net.run();
            let data: Vec<usize> = carried
                .iter()
                .filter(|p| p.kind() == PacketKind::RDMA_READ_DATA)
                .map(|p| p.payload().len() - shared_abi::rdma::RDMA_HEADER_LEN)
                .collect();
            assert_eq!(data, [LOCAL_RDMA_SEGMENT, LOCAL_RDMA_SEGMENT, 777]);
        }
        run_lossy(&mut net, seed, 10, Duration::from_secs(3));
        assert_eq!(
            sent(&net[0].events(1)),
            [(Status::SUCCESS, 4)],
            "seed {seed}"
        );
        let got = &net[0].wire().process[1][100..100 + length as usize];
        same(got, &pattern[50..50 + length as usize], "get", seed);
    }
}

#[test]
fn a_gathered_get_whose_target_memory_cannot_be_read_fails_with_a_memory_fault() {
    use shared_abi::rdma::LOCAL_RDMA_SEGMENT;
    let (mut net, key) = gathering_pair();
    // The target's process lost the get's second half: its NIC's board fails to read it as it
    // sends that segment, and the get fails at the initiator instead of timing out.
    net[1].wire().process[2].truncate(LOCAL_RDMA_SEGMENT);
    net[0].post_send(
        1,
        &token(
            SendKind::GET,
            PROCESS_BASE,
            at(key, 0),
            2 * LOCAL_RDMA_SEGMENT as u32,
            6,
        ),
    );
    net.doorbell(0);
    net.run_for(Duration::from_millis(50));
    assert_eq!(sent(&net[0].events(1)), [(Status::MEMORY_FAULT, 6)]);
}
