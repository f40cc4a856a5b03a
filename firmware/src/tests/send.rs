//! SEND: the window, retransmission and its backoff, piggybacked acks, and giving up on a node.

use core::time::Duration;

use shared_abi::event::{EventKind, Status};
use shared_abi::ids::PortId;
use shared_abi::packet::{PacketFlags, PacketKind};

use super::*;
use crate::connection::WINDOW;

#[test]
fn at_most_a_window_of_packets_is_in_flight_and_each_ack_lets_one_more_go() {
    // Two ports share the connection, so the window (not a port's token limit) is what binds.
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(0, 2);
    net.open(1, 3);
    let per_port = WINDOW as u8;
    provide_buffers(&mut net, (1, 3), 2 * u32::from(per_port));
    for n in 0..per_port {
        send_message(&mut net, (0, 1), (1, 3), n, 16);
        send_message(&mut net, (0, 2), (1, 3), n + per_port, 16);
    }

    let first = net.poll(0);

    assert_eq!(first.len(), WINDOW);
    let seqs: Vec<u32> = first.iter().map(WirePacket::seq).collect();
    assert_eq!(seqs, (0..WINDOW as u32).collect::<Vec<_>>());
    assert!(net.poll(0).is_empty(), "the window is full");

    for packet in &first[..5] {
        net.deliver(packet);
    }
    for ack in net[1].take_outbox() {
        net.deliver(&ack);
    }
    let more: Vec<u32> = net[0].take_outbox().iter().map(WirePacket::seq).collect();
    assert_eq!(more, (WINDOW as u32..WINDOW as u32 + 5).collect::<Vec<_>>());

    for packet in &first[5..] {
        net.deliver(packet);
    }
    net.run();
    assert_eq!(
        of_kind(&net[1].events(3), EventKind::RECEIVED).len(),
        2 * WINDOW
    );
}

#[test]
fn a_lost_packet_is_retransmitted_after_the_timeout_with_everything_after_it() {
    let mut net = Net::new(2);
    let timeout = net[0].nic.config().retransmit_timeout;
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 3);
    for n in 0..3 {
        send_message(&mut net, (0, 1), (1, 2), n, 40);
    }
    let sent = net.poll(0);
    assert_eq!(sent.len(), 3);
    net.deliver(&sent[0]);
    // More packets follow packet 0: its ack waits for a packet to ride on, then goes alone.
    assert!(
        net[1].take_outbox().is_empty(),
        "the ack of packet 0 is delayed"
    );
    let ack_delay = net[1].nic.config().ack_delay();
    net.advance(ack_delay);
    let acks = net.poll(1);
    assert_eq!(acks.len(), 1, "the delayed ack goes alone after the delay");
    for ack in acks {
        net.deliver(&ack);
    }
    // The ack restarted the retransmission timer. Packet 1 is lost; packet 2 arrives, and the
    // NACK it causes is lost too.
    net.deliver(&sent[2]);
    assert_eq!(net[1].take_outbox().len(), 1, "the gap's NACK (lost)");

    net.advance(timeout - Duration::from_nanos(1));
    assert!(net.poll(0).is_empty(), "nothing before the timeout");
    net.advance(Duration::from_nanos(1));
    let resent = net.poll(0);

    let seqs: Vec<u32> = resent.iter().map(WirePacket::seq).collect();
    assert_eq!(
        seqs,
        [1, 2],
        "go-back-N from the lost packet, not before it"
    );
    assert!(resent.iter().all(|p| p.kind() == PacketKind::DATA));
    assert_eq!(resent[0].payload(), &payload(1, 40)[..]);
    for packet in &resent {
        net.deliver(packet);
    }
    net.run();
    let received = net[1].events(2);
    assert_eq!(received.len(), 3, "each message once: {received:?}");
    for (n, event) in received.iter().enumerate() {
        let bytes = net[1].read_arena(2, event.buffer.get(), event.length.get() as usize);
        assert_eq!(bytes, payload(n as u8, 40), "in order");
    }
    assert_eq!(of_kind(&net[0].events(1), EventKind::SENT).len(), 3);
}

#[test]
fn an_ack_rides_on_a_data_packet_going_the_other_way() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 1);
    provide_buffers(&mut net, (0, 1), 1);
    provide_buffers(&mut net, (1, 1), 1);
    send_message(&mut net, (0, 1), (1, 1), 1, 20);
    let from_0 = net.poll(0);
    assert_eq!(from_0.len(), 1);
    // Node 1's process has a reply queued when node 0's message arrives.
    send_message(&mut net, (1, 1), (0, 1), 2, 20);
    net.deliver(&from_0[0]);

    let from_1 = net[1].take_outbox();

    assert_eq!(from_1.len(), 1, "no standalone ACK: {from_1:?}");
    let header = from_1[0].header();
    assert_eq!(header.kind, PacketKind::DATA);
    assert!(header.flags.contains(PacketFlags::ACK_VALID));
    assert_eq!(
        header.ack.get(),
        1,
        "node 1 expects node 0's sequence number 1 next"
    );
    assert_eq!(header.ack_epoch, from_0[0].header().epoch);
    net.deliver(&from_1[0]);
    assert_eq!(
        summary(&net[0].events(1)),
        [
            (EventKind::SENT, Status::SUCCESS, 1),
            (EventKind::RECEIVED, Status::SUCCESS, 0)
        ]
    );
}

#[test]
fn each_consecutive_retransmission_timeout_doubles_the_interval_up_to_32_times() {
    let mut net = Net::new(2);
    net[1].silent = true;
    let timeout = net[0].nic.config().retransmit_timeout;
    net.open(0, 1);
    send_message(&mut net, (0, 1), (1, 1), 0, 8);
    assert_eq!(net.poll(0).len(), 1);
    let mut last = net.now;

    for (k, factor) in [1u32, 2, 4, 8, 16, 32, 32, 32].into_iter().enumerate() {
        let due = last.saturating_add(timeout * factor);
        assert_eq!(
            net[0].nic.poll_at(),
            Some(due),
            "retransmission {k}: poll_at"
        );
        net.now = Instant::from_nanos(due.as_nanos() - 1);
        assert!(net.poll(0).is_empty(), "retransmission {k}: not early");
        net.now = due;
        let resent = net.poll(0);
        assert_eq!(resent.len(), 1, "retransmission {k}");
        assert_eq!(resent[0].seq(), 0);
        last = due;
    }
}

#[test]
fn a_silent_node_fails_every_held_send_with_target_node_unreachable_and_the_nic_carries_on() {
    let mut net = Net::new(3);
    net[1].silent = true;
    let config = *net[0].nic.config();
    net.open(0, 1);
    net.open(0, 2);
    // More than a window: a window in flight and 8 still queued on the connection.
    let per_port = (WINDOW as u8 + 8) / 2;
    for n in 0..per_port {
        send_message(&mut net, (0, 1), (1, 1), n, 32);
        send_message(&mut net, (0, 2), (1, 1), n + per_port, 32);
    }
    let start = net.now;

    net.run_until(start.saturating_add(config.give_up_after - Duration::from_nanos(1)));
    assert!(
        net[0].events(1).is_empty() && net[0].events(2).is_empty(),
        "not before give-up"
    );

    let longest_interval = config.retransmit_timeout * 32;
    net.run_until(start.saturating_add(config.give_up_after + longest_interval));

    let per_port = u64::from(per_port);
    for (port, contexts) in [(1u8, 0..per_port), (2, per_port..2 * per_port)] {
        let events = net[0].events(port);
        assert_eq!(
            summary(&events),
            contexts
                .map(|c| (EventKind::SENT, Status::TARGET_NODE_UNREACHABLE, c))
                .collect::<Vec<_>>(),
            "port {port}"
        );
        assert!(events.iter().all(|e| e.peer_node == NodeId::new(1)));
        assert_eq!(net[0].nic.port_status(PortId(port)).unwrap().held_sends, 0);
    }

    // A live node is still reachable...
    net.open(2, 1);
    provide_buffers(&mut net, (2, 1), 1);
    send_message(&mut net, (0, 1), (2, 1), 50, 32);
    // ...and so is the silent one once it answers.
    net[1].silent = false;
    net.open(1, 1);
    provide_buffers(&mut net, (1, 1), 1);
    send_message(&mut net, (0, 2), (1, 1), 51, 32);
    net.run_for(Duration::from_millis(10));
    assert_eq!(
        summary(&net[0].events(1)),
        [(EventKind::SENT, Status::SUCCESS, 50)]
    );
    assert_eq!(
        summary(&net[0].events(2)),
        [(EventKind::SENT, Status::SUCCESS, 51)]
    );
    assert_eq!(of_kind(&net[2].events(1), EventKind::RECEIVED).len(), 1);
    assert_eq!(of_kind(&net[1].events(1), EventKind::RECEIVED).len(), 1);
}

#[test]
fn a_packet_the_wire_would_not_take_goes_on_a_later_poll_that_poll_at_asks_for() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 1);
    send_message(&mut net, (0, 1), (1, 2), 4, 20);
    net[0].wire().blocked = true;
    assert!(net.poll(0).is_empty());
    net[0].wire().blocked = false;

    let at = net[0].nic.poll_at();

    assert!(
        at.is_some(),
        "the NIC must ask to be polled again, or the message waits forever"
    );
    net.run_until(at.unwrap());
    net.run();
    assert_eq!(of_kind(&net[1].events(2), EventKind::RECEIVED).len(), 1);
    assert_eq!(
        summary(&net[0].events(1)),
        [(EventKind::SENT, Status::SUCCESS, 4)]
    );
}

#[test]
fn an_orderly_close_sends_what_the_nic_had_not_taken_yet_then_closes() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 20);
    // Posted, and the port closed before the NIC looked at its send ring.
    for n in 0..20 {
        send_message(&mut net, (0, 1), (1, 2), n, 16 + usize::from(n));
    }
    let now = net.now;
    assert!(net[0].nic.begin_close(PortId(1), now).is_some());
    assert!(net[0].nic.is_closing(PortId(1)));
    assert_eq!(net[0].nic.take_finished_closes(), 0, "not done yet");

    net.run();

    let received = of_kind(&net[1].events(2), EventKind::RECEIVED);
    assert_eq!(
        received.len(),
        20,
        "every message posted before the close arrived"
    );
    assert_eq!(
        net[0].nic.take_finished_closes(),
        1 << 1,
        "then the port closed"
    );
    assert!(net[0].nic.port_status(PortId(1)).is_none());
    assert!(
        net[0].events(1).is_empty(),
        "a closing port's process reads no events; none are written"
    );
}

#[test]
fn an_orderly_close_ends_within_its_bound_when_the_receiver_takes_nothing() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2); // provides no buffer: every message is refused for want of one
    for n in 0..4 {
        send_message(&mut net, (0, 1), (1, 2), n, 16);
    }
    let now = net.now;
    net[0].nic.begin_close(PortId(1), now);
    let config = *net[0].nic.config();
    net.run_for(config.receiver_not_ready_timeout / 2);
    assert!(net[0].nic.is_closing(PortId(1)), "still trying to deliver");

    net.run_for(config.receiver_not_ready_timeout + config.give_up_after);

    assert_eq!(net[0].nic.take_finished_closes(), 1 << 1);
    assert!(net[0].nic.port_status(PortId(1)).is_none());
}

#[test]
fn a_message_waiting_for_a_buffer_holds_up_only_its_own_flow() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2); // no buffer yet
    net.open(1, 3);
    provide_buffers(&mut net, (1, 3), 1);
    // Two messages to the port without a buffer, then one to a port with one, then a barrier
    // between the first pair: all on the one connection from node 0 to node 1.
    send_message(&mut net, (0, 1), (1, 2), 0, 40);
    send_message(&mut net, (0, 1), (1, 2), 1, 41);
    send_message(&mut net, (0, 1), (1, 3), 2, 42);
    net.run_for(Duration::from_millis(1));
    net[0].start_barrier(1, &[exchange(1, 2, 0)], 0xb0, 0);
    net[1].start_barrier(2, &[exchange(0, 1, 0)], 0xb1, 0);
    net.run_for(Duration::from_millis(20));

    let config = *net[0].nic.config();
    assert!(Duration::from_millis(21) < config.receiver_not_ready_timeout);
    assert_eq!(
        summary(&net[1].events(3)),
        [(EventKind::RECEIVED, Status::SUCCESS, 0)],
        "another port's message went past the waiting one"
    );
    assert_eq!(
        summary(&net[1].events(2)),
        [(EventKind::BARRIER_COMPLETED, Status::SUCCESS, 0xb1)],
        "the barrier went past it"
    );
    let sender = net[0].events(1);
    assert!(of_kind(&sender, EventKind::BARRIER_COMPLETED).len() == 1);
    assert_eq!(
        of_kind(&sender, EventKind::SENT).len(),
        1,
        "only the message that found a buffer is done: {sender:?}"
    );

    // Buffers at last: the two waiting messages arrive, in the order they were sent.
    provide_buffers(&mut net, (1, 2), 2);
    net.run_for(Duration::from_millis(20));
    let received = net[1].events(2);
    assert_eq!(received.len(), 2, "{received:?}");
    let lengths: Vec<u32> = received.iter().map(|e| e.length.get()).collect();
    assert_eq!(lengths, [40, 41], "a flow stays in order");
    assert_eq!(of_kind(&net[0].events(1), EventKind::SENT).len(), 2);
}

#[test]
fn back_to_back_barriers_carry_each_others_acks_and_the_last_one_is_acked_after_the_delay() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 1);
    let acks = |packets: &[WirePacket]| {
        packets
            .iter()
            .filter(|packet| packet.kind() == PacketKind::ACK)
            .count()
    };
    let mut carried = Vec::new();
    for round in 0..8u64 {
        net[0].start_barrier(1, &[exchange(1, 1, 0)], round, 0);
        net[1].start_barrier(1, &[exchange(0, 1, 0)], round, 0);
        carried.extend(net.run());
        for node in 0..2 {
            let done = of_kind(&net[node].events(1), EventKind::BARRIER_COMPLETED);
            assert_eq!(done.len(), 1, "node {node}, barrier {round}: {done:?}");
        }
    }
    assert_eq!(
        acks(&carried),
        0,
        "each barrier's packet carries the ack of the one before; none goes alone"
    );

    let ack_delay = net[0].nic.config().ack_delay();
    let tail = net.run_for(ack_delay);
    assert_eq!(
        acks(&tail),
        2,
        "the last barrier's acks, one each way: {tail:?}"
    );
    let timeout = net[0].nic.config().retransmit_timeout;
    let later = net.run_for(4 * timeout);
    assert!(later.is_empty(), "nothing left to retransmit: {later:?}");
}

#[test]
fn the_last_message_of_a_burst_asks_for_its_ack_at_once_and_its_send_completes() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 3);
    for n in 0..3 {
        send_message(&mut net, (0, 1), (1, 2), n, 40);
    }
    let sent = net.poll(0);
    let asks: Vec<bool> = sent
        .iter()
        .map(|packet| packet.header().flags.contains(PacketFlags::ACK_REQUEST))
        .collect();
    assert_eq!(
        asks,
        [false, false, true],
        "only the burst's last packet asks"
    );
    for packet in &sent {
        net.deliver(packet);
    }
    let acks = net[1].take_outbox();
    assert_eq!(acks.len(), 1, "one ack, at once, for the three: {acks:?}");
    net.deliver(&acks[0]);
    assert_eq!(of_kind(&net[0].events(1), EventKind::SENT).len(), 3);
}
