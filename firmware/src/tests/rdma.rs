//! RDMA: receive buffers matched by size and priority, refusals, closed ports, and the event ring.

use core::time::Duration;

use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{NodeId, PortId};
use shared_abi::packet::{PacketKind, RejectReason};
use shared_abi::token::Priority;

use super::*;

/// Sends message `n` of `len` bytes with `size` and `priority` from node 0 port 1 to node 1
/// port 2.
fn send_sized(net: &mut Net, n: u8, size: u8, priority: Priority, len: usize) {
    let buffer = u64::from(n) * 1024;
    net[0].write_arena(1, buffer, &payload(n, len));
    net[0].post_send(
        1,
        &data_token(1, 2, size, priority, len as u32, buffer, u64::from(n)),
    );
}

#[test]
fn a_message_lands_only_in_a_buffer_of_its_size_and_priority() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    // Offered in an order where matching on size alone or priority alone picks a wrong one.
    let buffers = [
        (8, Priority::LOW, 0x8000, 1),
        (9, Priority::HIGH, 0x8400, 2),
        (9, Priority::LOW, 0x8800, 3),
        (8, Priority::HIGH, 0x8c00, 4),
    ];
    for (size, priority, at, tag) in buffers {
        net[1].provide_buffer(2, size, priority, at, tag);
    }
    net.doorbell(1);
    let messages = [
        (8, Priority::HIGH, 4),
        (9, Priority::LOW, 3),
        (8, Priority::LOW, 1),
        (9, Priority::HIGH, 2),
    ];

    for (n, (size, priority, expected_tag)) in messages.into_iter().enumerate() {
        send_sized(&mut net, n as u8, size, priority, 100);
        net.run();

        let received = net[1].events(2);
        assert_eq!(received.len(), 1, "message {n}");
        let event = received[0];
        assert_eq!(
            event.tag.get(),
            expected_tag,
            "message {n} (size {size}, {priority:?})"
        );
        assert_eq!((event.size, event.priority), (size, priority));
        let (_, _, at, _) = buffers[expected_tag as usize - 1];
        assert_eq!(event.buffer.get(), at);
        assert_eq!(net[1].read_arena(2, at, 100), payload(n as u8, 100));
        // The buffers still offered were not written.
        for (other_size, _, other_at, other_tag) in buffers {
            if messages[n + 1..].iter().any(|m| m.2 == other_tag) {
                let len = shared_abi::max_length_for_size(other_size) as usize;
                let bytes = net[1].read_arena(2, other_at, len);
                assert!(
                    bytes.iter().all(|b| *b == UNTOUCHED),
                    "buffer {other_tag} written"
                );
            }
        }
    }
}

#[test]
fn a_message_with_no_matching_buffer_is_refused_and_delivered_once_one_is_offered() {
    let mut net = Net::new(2);
    let retry = net[0].nic.config().retry_interval;
    net.open(0, 1);
    net.open(1, 2);
    net[1].provide_buffer(2, 8, Priority::LOW, 0x8000, 1);
    net[1].provide_buffer(2, 9, Priority::HIGH, 0x8400, 2);
    net.doorbell(1);
    send_sized(&mut net, 5, 8, Priority::HIGH, 60);
    let sent = net.poll(0);
    net.deliver(&sent[0]);

    let refusal = net[1].take_outbox();

    assert_eq!(refusal.len(), 1);
    let header = refusal[0].header();
    assert_eq!(header.kind, PacketKind::REJECT);
    assert_eq!(header.aux, RejectReason::NO_BUFFER.0);
    assert_eq!(header.seq.get(), 0);
    net.deliver(&refusal[0]);
    net.run_for(Duration::from_millis(20));
    assert!(
        net[1].events(2).is_empty(),
        "a mismatched buffer is never used"
    );
    assert!(
        net[1]
            .read_arena(2, 0x8000, 248)
            .iter()
            .all(|b| *b == UNTOUCHED)
    );
    assert!(
        net[1]
            .read_arena(2, 0x8400, 504)
            .iter()
            .all(|b| *b == UNTOUCHED)
    );
    assert!(net[0].events(1).is_empty(), "the sender holds the message");
    assert_eq!(net[0].nic.port_status(PortId(1)).unwrap().held_sends, 1);

    net[1].provide_buffer(2, 8, Priority::HIGH, 0x8800, 3);
    net.run_for(retry * 2);

    let received = net[1].events(2);
    assert_eq!(
        summary(&received),
        [(EventKind::RECEIVED, Status::SUCCESS, 0)]
    );
    assert_eq!(received[0].tag.get(), 3);
    assert_eq!(net[1].read_arena(2, 0x8800, 60), payload(5, 60));
    assert_eq!(
        summary(&net[0].events(1)),
        [(EventKind::SENT, Status::SUCCESS, 5)]
    );
    net.run_for(Duration::from_millis(100));
    assert!(net[1].events(2).is_empty(), "no duplicate");
    assert_eq!(
        net[1].nic.port_status(PortId(2)).unwrap().receive_buffers,
        2
    );
}

#[test]
fn a_message_to_a_closed_port_ends_with_target_port_closed_and_the_stream_goes_on() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 3);
    provide_buffers(&mut net, (1, 3), 1);
    send_message(&mut net, (0, 1), (1, 2), 77, 10);
    send_message(&mut net, (0, 1), (1, 3), 78, 10);

    net.run();

    let events = net[0].events(1);
    assert_eq!(
        summary(&events),
        [
            (EventKind::SENT, Status::TARGET_PORT_CLOSED, 77),
            (EventKind::SENT, Status::SUCCESS, 78)
        ]
    );
    assert_eq!(
        (events[0].peer_node, events[0].peer_port),
        (NodeId::new(1), PortId(2))
    );
    assert_eq!(of_kind(&net[1].events(3), EventKind::RECEIVED).len(), 1);
}

#[test]
fn events_wait_for_room_in_the_event_ring_and_none_is_lost() {
    const MESSAGES: u8 = 20;
    let mut net = Net::new(2);
    net.open(0, 1);
    let shape = Shape {
        event_entries: 8,
        ..Shape::default()
    };
    net.open_with(1, 2, shape);
    provide_buffers(&mut net, (1, 2), u32::from(MESSAGES));
    for n in 0..MESSAGES {
        send_message(&mut net, (0, 1), (1, 2), n, 50);
    }

    net.run();

    let status = net[1].nic.port_status(PortId(2)).unwrap();
    assert_eq!(status.pending_events, usize::from(MESSAGES) - 8);
    let mut received = net[1].events(2);
    assert_eq!(received.len(), 8, "a full ring's worth");
    while received.len() < usize::from(MESSAGES) {
        net.run();
        let more = net[1].events(2);
        assert!(
            !more.is_empty(),
            "the NIC refills the ring once the host takes events"
        );
        received.extend(more);
    }
    assert_eq!(net[1].nic.port_status(PortId(2)).unwrap().pending_events, 0);
    assert_eq!(received.len(), usize::from(MESSAGES));
    for (n, event) in received.iter().enumerate() {
        assert_eq!(event.kind, EventKind::RECEIVED);
        let bytes = net[1].read_arena(2, event.buffer.get(), 50);
        assert_eq!(bytes, payload(n as u8, 50), "event {n}: in order");
    }
}

#[test]
fn a_forged_event_ring_head_faults_only_that_port() {
    let mut net = Net::new(2);
    net.open(0, 1);
    provide_buffers(&mut net, (0, 1), 4);
    net.open(1, 2);
    net.open(1, 3);
    provide_buffers(&mut net, (1, 2), 4);
    provide_buffers(&mut net, (1, 3), 4);
    net[1].forge_index(2, Ring::Event, Index::Head, 1000);
    for n in 0..2 {
        send_message(&mut net, (0, 1), (1, 2), n, 20);
        send_message(&mut net, (0, 1), (1, 3), n + 10, 20);
    }

    net.run();

    assert_eq!(
        net[1].nic.port_status(PortId(2)).unwrap().faulted,
        Some(Status::RING_CORRUPT)
    );
    assert_eq!(net[1].nic.port_status(PortId(3)).unwrap().faulted, None);
    let received = net[1].events(3);
    assert_eq!(
        received.len(),
        2,
        "the neighbour on the same NIC is untouched"
    );
    for (event, n) in received.iter().zip([10u8, 11]) {
        assert_eq!(net[1].read_arena(3, event.buffer.get(), 20), payload(n, 20));
    }
    // The neighbour sends too.
    send_message(&mut net, (1, 3), (0, 1), 30, 20);
    net.run();
    assert_eq!(
        summary(&net[1].events(3)),
        [(EventKind::SENT, Status::SUCCESS, 30)]
    );
    assert_eq!(of_kind(&net[0].events(1), EventKind::RECEIVED).len(), 1);

    // A new process on the faulted port starts clean.
    net.close(1, 2);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 1);
    send_message(&mut net, (0, 1), (1, 2), 40, 20);
    net.run();
    let received = net[1].events(2);
    assert_eq!(of_kind(&received, EventKind::RECEIVED).len(), 1);
    assert_eq!(net[1].nic.port_status(PortId(2)).unwrap().faulted, None);
}

#[test]
fn an_empty_message_of_size_class_3_is_sent_and_received() {
    // `min_size_for_length(0)` is 3, whose buffers hold `max_length_for_size(3) == 0` bytes.
    assert_eq!(shared_abi::min_size_for_length(0), Some(3));
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    net[1].provide_buffer(2, 3, Priority::LOW, 0x8000, 9);
    net[0].post_send(1, &data_token(1, 2, 3, Priority::LOW, 0, 0, 0x33));

    net.run();

    assert_eq!(
        summary(&net[0].events(1)),
        [(EventKind::SENT, Status::SUCCESS, 0x33)]
    );
    let received = net[1].events(2);
    assert_eq!(
        summary(&received),
        [(EventKind::RECEIVED, Status::SUCCESS, 0)]
    );
    assert_eq!((received[0].tag.get(), received[0].length.get()), (9, 0));
}

#[test]
fn only_a_sleeping_process_gets_a_doorbell_with_its_event() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 2);
    send_message(&mut net, (0, 1), (1, 2), 0, 10);
    net.run();
    assert_eq!(
        net[1].wire().doorbells[2],
        0,
        "an awake process polls its event ring"
    );

    net[1].sleep(2);
    send_message(&mut net, (0, 1), (1, 2), 1, 10);
    net.run();

    assert_eq!(net[1].wire().doorbells[2], 1);
    assert_eq!(of_kind(&net[1].events(2), EventKind::RECEIVED).len(), 2);
}

#[test]
fn a_process_asleep_for_all_but_sends_ends_is_rung_for_its_message_and_failures_only() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 2);
    provide_buffers(&mut net, (0, 1), 2);

    // Its own send's successful end: written, not rung for.
    net[0].sleep_for(1, Wake::UNLESS_SENT);
    send_message(&mut net, (0, 1), (1, 2), 0, 10);
    net.run();
    assert_eq!(net[0].wire().doorbells[1], 0);

    // The message it waits for: rung for, and the send's end is read with it.
    send_message(&mut net, (1, 2), (0, 1), 1, 10);
    net.run();
    assert_eq!(net[0].wire().doorbells[1], 1);
    assert_eq!(
        summary(&net[0].events(1)),
        [
            (EventKind::SENT, Status::SUCCESS, 0),
            (EventKind::RECEIVED, Status::SUCCESS, 0)
        ]
    );

    // A send that fails is news whatever the process waits for.
    net[0].sleep_for(1, Wake::UNLESS_SENT);
    send_message(&mut net, (0, 1), (1, 3), 2, 10);
    net.run();
    assert_eq!(net[0].wire().doorbells[1], 2);
    assert_eq!(
        summary(&net[0].events(1)),
        [(EventKind::SENT, Status::TARGET_PORT_CLOSED, 2)]
    );
}

#[test]
fn a_full_event_ring_rings_a_process_asleep_for_all_but_sends_ends() {
    const RING: u8 = 8;
    let mut net = Net::new(2);
    let shape = Shape {
        event_entries: u32::from(RING),
        ..Shape::default()
    };
    net.open_with(0, 1, shape);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), u32::from(RING));
    provide_buffers(&mut net, (0, 1), 1);
    net[0].sleep_for(1, Wake::UNLESS_SENT);
    for n in 0..RING {
        send_message(&mut net, (0, 1), (1, 2), n, 10);
    }
    net.run_for(Duration::from_millis(10));
    assert_eq!(
        net[0].wire().doorbells[1],
        0,
        "sends' ends only, and room left"
    );

    // The message the process waits for finds the ring full of sends' ends: the NIC cannot
    // write it until the process makes room, so it rings.
    send_message(&mut net, (1, 2), (0, 1), 0, 10);
    net.run_for(Duration::from_millis(10));
    assert_eq!(net[0].nic.port_status(PortId(1)).unwrap().pending_events, 1);
    assert_eq!(net[0].wire().doorbells[1], 1);
    let mut events = net[0].events(1);
    net.run_for(Duration::from_millis(10));
    events.extend(net[0].events(1));
    assert_eq!(of_kind(&events, EventKind::SENT).len(), usize::from(RING));
    assert_eq!(of_kind(&events, EventKind::RECEIVED).len(), 1);
}
