//! Messages longer than a packet: cut into segments by the sending NIC, placed in order into the
//! one buffer of their size class, under the same flow control as one-packet messages.

use core::time::Duration;

use shared_abi::event::{EventKind, Status};
use shared_abi::max_length_for_size;
use shared_abi::packet::{DATA_SEGMENT, MAX_PACKET_LEN, PacketKind};
use shared_abi::token::Priority;

use super::remote::run_lossy;
use super::*;

/// Arena of both ports: room for two buffers of [`SIZE`] and the sender's messages.
const ARENA: usize = 512 * 1024;
/// Size class of the long messages: buffers of 128 KiB, holding 131,064 bytes.
const SIZE: u8 = 17;
/// A long message: 25 segments, the last one partial.
const LENGTH: usize = 100_000;
/// Where the receiver offers its buffers of [`SIZE`].
const BUFFERS: [u64; 2] = [0, 128 * 1024];

fn shape() -> Shape {
    Shape {
        arena_len: ARENA,
        ..Shape::default()
    }
}

/// Node 0 port 1 sends to node 1 port 2, both with large arenas.
fn pair() -> Net {
    let mut net = Net::new(2);
    net.open_with(0, 1, shape());
    net.open_with(1, 2, shape());
    net
}

/// Posts message `n` of `len` bytes from arena offset `at` of node 0 port 1 to node 1 port 2.
fn send_long(net: &mut Net, n: u8, len: usize, at: u64) {
    net[0].write_arena(1, at, &payload(n, len));
    net[0].post_send(
        1,
        &data_token(1, 2, SIZE, Priority::LOW, len as u32, at, u64::from(n)),
    );
    net.doorbell(0);
}

fn sent(events: &[Event]) -> Vec<(Status, u64)> {
    events
        .iter()
        .filter(|e| e.kind == EventKind::SENT)
        .map(|e| (e.status, e.context.get()))
        .collect()
}

#[test]
fn a_message_longer_than_a_packet_arrives_whole_in_one_buffer_and_completes_once_acknowledged() {
    let mut net = pair();
    net[1].provide_buffer(2, SIZE, Priority::LOW, BUFFERS[0], 7);
    net.doorbell(1);
    send_long(&mut net, 1, LENGTH, 0);

    let carried = net.run();

    let segments: Vec<&WirePacket> = carried
        .iter()
        .filter(|p| p.kind() == PacketKind::DATA_SEGMENT)
        .collect();
    assert_eq!(segments.len(), LENGTH.div_ceil(DATA_SEGMENT));
    assert!(
        carried.iter().all(|p| p.kind() != PacketKind::DATA),
        "a long message never goes as a one-packet message"
    );
    assert!(segments.iter().all(|p| p.bytes.len() <= MAX_PACKET_LEN));
    let received = net[1].events(2);
    assert_eq!(
        received.len(),
        1,
        "one event for the whole message: {received:?}"
    );
    let event = received[0];
    assert_eq!(
        (
            event.kind,
            event.status,
            event.length.get(),
            event.tag.get()
        ),
        (EventKind::RECEIVED, Status::SUCCESS, LENGTH as u32, 7)
    );
    assert_eq!((event.size, event.buffer.get()), (SIZE, BUFFERS[0]));
    assert_eq!(
        (event.peer_node, event.peer_port),
        (NodeId::new(0), PortId(1))
    );
    assert!(net[1].read_arena(2, BUFFERS[0], LENGTH) == payload(1, LENGTH));
    let capacity = max_length_for_size(SIZE) as usize;
    assert!(
        net[1]
            .read_arena(2, BUFFERS[0] + LENGTH as u64, capacity - LENGTH)
            .iter()
            .all(|&b| b == UNTOUCHED),
        "nothing past the message is written"
    );
    assert_eq!(sent(&net[0].events(1)), [(Status::SUCCESS, 1)]);
}

#[test]
fn the_sender_keeps_no_more_than_the_window_in_flight_and_completes_only_at_the_last_ack() {
    let mut net = pair();
    net[1].provide_buffer(2, SIZE, Priority::LOW, BUFFERS[0], 1);
    net.doorbell(1);
    send_long(&mut net, 1, LENGTH, 0);

    let first = net.poll(0);
    assert_eq!(
        first.len(),
        crate::connection::WINDOW,
        "the window's worth of segments, not the whole message"
    );
    // Everything but the last segment is acknowledged: no completion yet.
    for packet in &first {
        net.deliver(packet);
    }
    let acks = net.poll(1);
    for packet in &acks {
        net.deliver(packet);
    }
    assert!(sent(&net[0].events(1)).is_empty());
    net.run();
    assert_eq!(sent(&net[0].events(1)), [(Status::SUCCESS, 1)]);
}

#[test]
fn a_long_message_waits_for_a_buffer_of_its_size_and_priority_then_arrives() {
    let mut net = pair();
    send_long(&mut net, 3, LENGTH, 0);
    net.run_for(Duration::from_millis(5));
    assert!(net[1].events(2).is_empty(), "no buffer: nothing delivered");
    assert!(sent(&net[0].events(1)).is_empty(), "the sender holds it");

    // Buffers of another size or priority do not take it.
    net[1].provide_buffer(2, SIZE - 1, Priority::LOW, BUFFERS[0], 1);
    net[1].provide_buffer(2, SIZE, Priority::HIGH, BUFFERS[1], 2);
    net.doorbell(1);
    net.run_for(Duration::from_millis(5));
    assert!(net[1].events(2).is_empty());

    net[1].provide_buffer(2, SIZE, Priority::LOW, 256 * 1024, 3);
    net.doorbell(1);
    net.run_for(Duration::from_millis(5));
    let received = net[1].events(2);
    assert_eq!(
        summary(&received),
        [(EventKind::RECEIVED, Status::SUCCESS, 0)]
    );
    assert_eq!(received[0].tag.get(), 3);
    assert!(net[1].read_arena(2, 256 * 1024, LENGTH) == payload(3, LENGTH));
    let smaller = max_length_for_size(SIZE - 1) as usize;
    assert!(
        net[1]
            .read_arena(2, BUFFERS[0], smaller)
            .iter()
            .all(|&b| b == UNTOUCHED),
        "the buffer of another size class is untouched"
    );
    assert_eq!(sent(&net[0].events(1)), [(Status::SUCCESS, 3)]);
}

#[test]
fn long_and_short_messages_come_through_loss_duplication_and_reordering_byte_for_byte() {
    for seed in [1u64, 2, 3, 20_261_124] {
        let mut net = pair();
        net.open_with(0, 3, shape());
        for (tag, at) in BUFFERS.into_iter().enumerate() {
            net[1].provide_buffer(2, SIZE, Priority::LOW, at, tag as u32);
        }
        net[1].provide_buffer(2, 8, Priority::LOW, 256 * 1024, 9);
        net.doorbell(1);
        // Two long messages from port 1, and a short one from port 3 between them on the wire.
        send_long(&mut net, 1, LENGTH, 0);
        send_long(&mut net, 2, 70_001, 100_000);
        net[0].write_arena(3, 0, &payload(5, 200));
        net[0].post_send(3, &data_token(1, 2, 8, Priority::LOW, 200, 0, 5));
        net.doorbell(0);

        run_lossy(&mut net, seed, 10, Duration::from_secs(3));

        let received = net[1].events(2);
        assert_eq!(received.len(), 3, "seed {seed}: {received:?}");
        assert!(
            received.iter().all(|e| e.status == Status::SUCCESS),
            "seed {seed}: {received:?}"
        );
        let long: Vec<&Event> = received.iter().filter(|e| e.size == SIZE).collect();
        assert_eq!(
            long.iter().map(|e| e.length.get()).collect::<Vec<_>>(),
            [LENGTH as u32, 70_001],
            "seed {seed}: a port's messages arrive in the order posted"
        );
        for (event, n) in long.iter().zip([1u8, 2]) {
            let len = event.length.get() as usize;
            let got = net[1].read_arena(2, event.buffer.get(), len);
            let at = got.iter().zip(payload(n, len)).position(|(a, b)| *a != b);
            assert_eq!(at, None, "seed {seed}: message {n} differs at byte {at:?}");
        }
        assert_eq!(
            net[1].read_arena(2, 256 * 1024, 200),
            payload(5, 200),
            "seed {seed}"
        );
        let mut done = sent(&net[0].events(1));
        done.extend(sent(&net[0].events(3)));
        done.sort_unstable_by_key(|(_, context)| *context);
        assert_eq!(
            done,
            [
                (Status::SUCCESS, 1),
                (Status::SUCCESS, 2),
                (Status::SUCCESS, 5)
            ],
            "seed {seed}: each message completes once"
        );
    }
}

#[test]
fn a_long_message_whose_receiver_closes_midway_fails_and_the_next_one_arrives() {
    let mut net = pair();
    net[1].provide_buffer(2, SIZE, Priority::LOW, BUFFERS[0], 1);
    net.doorbell(1);
    send_long(&mut net, 1, LENGTH, 0);
    for packet in net.poll(0).iter().take(5) {
        net.deliver(packet);
    }
    net.close(1, 2);
    net.run_for(Duration::from_millis(50));
    assert_eq!(
        sent(&net[0].events(1)),
        [(Status::TARGET_PORT_CLOSED, 1)],
        "the sender hears the target closed"
    );

    // The port opens again: a new long message arrives whole.
    net.open_with(1, 2, shape());
    net[1].provide_buffer(2, SIZE, Priority::LOW, BUFFERS[1], 2);
    net.doorbell(1);
    send_long(&mut net, 2, LENGTH, 0);
    net.run_for(Duration::from_millis(50));
    let received = net[1].events(2);
    assert_eq!(
        summary(&received),
        [(EventKind::RECEIVED, Status::SUCCESS, 0)]
    );
    assert!(net[1].read_arena(2, BUFFERS[1], LENGTH) == payload(2, LENGTH));
    assert_eq!(sent(&net[0].events(1)), [(Status::SUCCESS, 2)]);
}

#[test]
fn a_sender_that_closes_midway_gives_the_receive_buffer_back_incomplete() {
    let mut net = pair();
    net[1].provide_buffer(2, SIZE, Priority::LOW, BUFFERS[0], 4);
    net.doorbell(1);
    send_long(&mut net, 1, LENGTH, 0);
    for packet in net.poll(0).iter().take(5) {
        net.deliver(packet);
    }
    net.close(0, 1);
    net.run_for(Duration::from_millis(50));

    let received = net[1].events(2);
    assert_eq!(received.len(), 1, "{received:?}");
    let event = received[0];
    assert_eq!(
        (event.kind, event.status, event.tag.get()),
        (EventKind::RECEIVED, Status::INCOMPLETE, 4)
    );
    assert_eq!(
        event.length.get() as usize,
        5 * DATA_SEGMENT,
        "the bytes that arrived"
    );
    // The buffer is the process's again, and the next message from a new sender takes another.
    net.open_with(0, 1, shape());
    net[1].provide_buffer(2, SIZE, Priority::LOW, BUFFERS[1], 5);
    net.doorbell(1);
    send_long(&mut net, 6, LENGTH, 0);
    net.run_for(Duration::from_millis(50));
    let received = net[1].events(2);
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(
        (received[0].status, received[0].tag.get()),
        (Status::SUCCESS, 5)
    );
    assert!(net[1].read_arena(2, BUFFERS[1], LENGTH) == payload(6, LENGTH));
}

#[test]
fn forged_segments_are_taken_without_touching_memory_outside_the_buffer() {
    let mut net = pair();
    // A segment that continues no message is refused, a malformed one counted; neither writes.
    let mut header = PacketHeader::new(PacketKind::DATA_SEGMENT, NodeId::new(0), NodeId::new(1));
    header.dst_port = PortId(2);
    header.src_port = PortId(1);
    header.size = SIZE;
    header.flags = shared_abi::packet::PacketFlags::SYN;
    let mut out = [0u8; MAX_PACKET_LEN];
    let segment = shared_abi::packet::DataSegmentHeader {
        total: 100.into(),
        offset: 40.into(),
    };
    let mut bytes = segment.as_bytes().to_vec();
    bytes.extend([0x11u8; 60]);
    let len = header.emit(&bytes, &mut out).unwrap();
    net[1].provide_buffer(2, SIZE, Priority::LOW, BUFFERS[0], 1);
    net.doorbell(1);
    net.inject(1, &out[..len]);
    let answer = net[1].take_outbox();
    assert!(
        answer.iter().any(|p| p.kind() == PacketKind::REJECT
            && p.header().aux == shared_abi::packet::RejectReason::INCOMPLETE.0),
        "refused as continuing nothing: {answer:?}"
    );
    assert!(net[1].events(2).is_empty());
    let capacity = max_length_for_size(SIZE) as usize;
    assert!(
        net[1]
            .read_arena(2, BUFFERS[0], capacity)
            .iter()
            .all(|&b| b == UNTOUCHED)
    );

    // A first segment that claims more than its buffer holds: the buffer is filled up to its
    // size and not a byte past it.
    header.size = 8;
    net[1].provide_buffer(2, 8, Priority::LOW, 300 * 1024, 2);
    net[1].write_arena(2, 300 * 1024 + 248, &[UNTOUCHED; 64]);
    net.doorbell(1);
    let segment = shared_abi::packet::DataSegmentHeader {
        total: 5000.into(),
        offset: 0.into(),
    };
    let mut bytes = segment.as_bytes().to_vec();
    bytes.extend([0x22u8; 4000]);
    let len = header.emit(&bytes, &mut out).unwrap();
    net.inject(1, &out[..len]);
    assert_eq!(net[1].read_arena(2, 300 * 1024, 248), [0x22; 248]);
    assert_eq!(
        net[1].read_arena(2, 300 * 1024 + 248, 64),
        [UNTOUCHED; 64],
        "nothing past the size class's 248 bytes"
    );
}

#[test]
fn a_receiver_that_restarts_midway_fails_the_message_incomplete_and_takes_the_next() {
    // Replacing a node moves a whole NIC (about 800 KiB with the default connection table) by
    // value, which an unoptimised build stages on the stack more than once: more than a test
    // thread's default stack holds.
    std::thread::Builder::new()
        .stack_size(16 << 20)
        .spawn(receiver_restarts_midway)
        .expect("spawn the test thread")
        .join()
        .expect("the test passes");
}

fn receiver_restarts_midway() {
    let mut net = pair();
    net[1].provide_buffer(2, SIZE, Priority::LOW, BUFFERS[0], 1);
    net.doorbell(1);
    send_long(&mut net, 1, LENGTH, 0);
    let first = net.poll(0);
    for packet in first.iter().take(5) {
        net.deliver(packet);
    }
    for packet in net.poll(1) {
        net.deliver(&packet);
    }
    // Node 1 restarts: a new NIC that knows nothing of the message's start.
    let config = *net[1].nic.config();
    net.nodes[1] = Node::new(1, config);
    net.advance(Duration::from_secs(1));
    net.open_with(1, 2, shape());
    net[1].provide_buffer(2, SIZE, Priority::LOW, BUFFERS[1], 2);
    net.doorbell(1);
    net.run_for(Duration::from_millis(100));
    assert_eq!(
        sent(&net[0].events(1)),
        [(Status::INCOMPLETE, 1)],
        "the sender learns the rest cannot be placed"
    );
    assert!(
        net[1].events(2).is_empty(),
        "the new NIC delivers no part of a message it never saw begin"
    );

    send_long(&mut net, 2, LENGTH, 0);
    net.run_for(Duration::from_millis(100));
    let received = net[1].events(2);
    assert_eq!(
        summary(&received),
        [(EventKind::RECEIVED, Status::SUCCESS, 0)]
    );
    assert!(net[1].read_arena(2, BUFFERS[1], LENGTH) == payload(2, LENGTH));
    assert_eq!(sent(&net[0].events(1)), [(Status::SUCCESS, 2)]);
}

/// A long message bigger than the window and the queue together (59 segments): still being fed
/// when its first segment is refused.
const BIG: usize = 240_000;
/// Its size class: buffers of 256 KiB.
const BIG_SIZE: u8 = 18;

#[test]
fn a_long_message_waiting_for_a_buffer_is_parked_and_holds_up_neither_barriers_nor_other_ports() {
    let mut net = pair();
    net.open_with(0, 3, shape());
    net.open_with(1, 3, shape());
    // The receiving port has a buffer for a one-packet message, none for the long one; another
    // port of its node has one.
    net[1].provide_buffer(2, 8, Priority::LOW, 300 * 1024, 8);
    net[1].provide_buffer(3, 8, Priority::LOW, 0, 9);
    net.doorbell(1);
    // (Clear of the barrier schedule the sender's port writes at `SCHEDULE_AT`.)
    net[0].write_arena(1, 128 * 1024, &payload(1, BIG));
    net[0].post_send(
        1,
        &data_token(1, 2, BIG_SIZE, Priority::LOW, BIG as u32, 128 * 1024, 1),
    );
    net.doorbell(0);
    net.run_for(Duration::from_millis(1));
    // On the same connection: another port's message, and a barrier of the waiting pair of ports.
    net[0].write_arena(3, 0, &payload(5, 200));
    net[0].post_send(3, &data_token(1, 3, 8, Priority::LOW, 200, 0, 5));
    net.doorbell(0);
    net[0].start_barrier(1, &[exchange(1, 2, 0)], 0xb0, 0);
    net[1].start_barrier(2, &[exchange(0, 1, 0)], 0xb1, 0);
    // Then a one-packet message of the long one's flow, which must not overtake it (it waits in
    // the send ring: a port's later messages wait for its long message to be queued whole).
    net[0].write_arena(1, 400_000, &payload(4, 100));
    net[0].post_send(1, &data_token(1, 2, 8, Priority::LOW, 100, 400_000, 4));
    net.doorbell(0);
    let waiting = Duration::from_millis(20);
    let carried = net.run_for(waiting);

    let config = *net[0].nic.config();
    assert!(waiting < config.receiver_not_ready_timeout);
    assert_eq!(
        summary(&net[1].events(3)),
        [(EventKind::RECEIVED, Status::SUCCESS, 0)],
        "another port's message went past the waiting one"
    );
    assert_eq!(
        summary(&net[1].events(2)),
        [(EventKind::BARRIER_COMPLETED, Status::SUCCESS, 0xb1)],
        "the barrier went past it, and nothing of its flow was delivered"
    );
    let sender = net[0].events(1);
    assert_eq!(of_kind(&sender, EventKind::BARRIER_COMPLETED).len(), 1);
    assert!(of_kind(&sender, EventKind::SENT).is_empty(), "{sender:?}");
    // Parked, not sent again in a loop: the first window, then the refused segment alone about
    // once per retry interval.
    let segments = carried
        .iter()
        .filter(|p| p.kind() == PacketKind::DATA_SEGMENT)
        .count();
    let retries = (waiting.as_micros() / config.retry_interval.as_micros()) as usize;
    assert!(
        segments <= crate::connection::WINDOW + retries + 2,
        "{segments} segments sent in {waiting:?} (retry interval {:?})",
        config.retry_interval
    );

    // A buffer at last: the long message arrives whole, then the one behind it.
    net[1].provide_buffer(2, BIG_SIZE, Priority::LOW, 0, 7);
    net.doorbell(1);
    net.run_for(Duration::from_millis(20));
    let received = net[1].events(2);
    assert_eq!(
        received
            .iter()
            .map(|e| (e.status, e.length.get(), e.tag.get()))
            .collect::<Vec<_>>(),
        [(Status::SUCCESS, BIG as u32, 7), (Status::SUCCESS, 100, 8)],
        "a flow stays in order"
    );
    assert!(net[1].read_arena(2, 0, BIG) == payload(1, BIG));
    assert_eq!(net[1].read_arena(2, 300 * 1024, 100), payload(4, 100));
    assert_eq!(
        sent(&net[0].events(1)),
        [(Status::SUCCESS, 1), (Status::SUCCESS, 4)]
    );
}

#[test]
fn a_ports_long_messages_to_two_ports_go_one_after_another_while_one_waits_for_a_buffer() {
    for seed in [1u64, 2, 3, 4, 5, 6, 7, 8] {
        let mut net = pair();
        net.open_with(1, 3, shape());
        net[1].provide_buffer(3, SIZE, Priority::LOW, BUFFERS[1], 3);
        net.doorbell(1);
        // Message 1 waits for a buffer at port 2; message 2, to port 3 which has one, is posted
        // after it from the same port.
        send_long(&mut net, 1, LENGTH, 0);
        net.run_for(Duration::from_millis(1));
        net[0].write_arena(1, 200_000, &payload(2, LENGTH));
        net[0].post_send(
            1,
            &data_token(1, 3, SIZE, Priority::LOW, LENGTH as u32, 200_000, 2),
        );
        net.doorbell(0);
        run_lossy(&mut net, seed, 10, Duration::from_millis(30));
        assert!(
            net[1].events(3).is_empty(),
            "seed {seed}: the port's second long message waits behind its first"
        );
        net[1].provide_buffer(2, SIZE, Priority::LOW, BUFFERS[0], 1);
        net.doorbell(1);
        run_lossy(&mut net, seed, 10, Duration::from_secs(3));
        for (port, at, n) in [(2u8, BUFFERS[0], 1u8), (3, BUFFERS[1], 2)] {
            let received = net[1].events(port);
            assert_eq!(
                received
                    .iter()
                    .map(|e| (e.status, e.length.get()))
                    .collect::<Vec<_>>(),
                [(Status::SUCCESS, LENGTH as u32)],
                "seed {seed}: port {port}"
            );
            assert!(
                net[1].read_arena(port, at, LENGTH) == payload(n, LENGTH),
                "seed {seed}: port {port}'s bytes"
            );
        }
        assert_eq!(
            sent(&net[0].events(1)),
            [(Status::SUCCESS, 1), (Status::SUCCESS, 2)],
            "seed {seed}"
        );
    }
}

#[test]
fn a_long_message_the_board_gathers_goes_in_long_segments_waits_for_its_buffer_and_arrives() {
    use shared_abi::packet::LOCAL_DATA_SEGMENT;
    for seed in [1u64, 2, 20261129] {
        let mut net = pair();
        for node in 0..2 {
            net[node].wire().local = true;
            net[node].wire().gathers = true;
        }
        // No buffer yet: the first segment is refused and the message waits, parked.
        send_long(&mut net, 1, LENGTH, 0);
        let refused = net.run();
        let lengths: Vec<usize> = refused
            .iter()
            .filter(|p| p.kind() == PacketKind::DATA_SEGMENT)
            .map(|p| p.payload().len() - 8)
            .collect();
        assert_eq!(
            lengths.first(),
            Some(&LOCAL_DATA_SEGMENT),
            "seed {seed}: one segment of fifteen pages first"
        );
        assert!(net[1].events(2).is_empty(), "seed {seed}");
        net[1].provide_buffer(2, SIZE, Priority::LOW, BUFFERS[1], 9);
        net.doorbell(1);
        run_lossy(&mut net, seed, 10, Duration::from_secs(3));
        let received = net[1].events(2);
        assert_eq!(received.len(), 1, "seed {seed}: {received:?}");
        let event = received[0];
        assert_eq!(
            (event.status, event.length.get(), event.tag.get()),
            (Status::SUCCESS, LENGTH as u32, 9),
            "seed {seed}"
        );
        assert!(
            net[1].read_arena(2, BUFFERS[1], LENGTH) == payload(1, LENGTH),
            "seed {seed}"
        );
        assert_eq!(
            sent(&net[0].events(1)),
            [(Status::SUCCESS, 1)],
            "seed {seed}"
        );
    }
}
