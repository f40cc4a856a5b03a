//! `poll` and `poll_at` together: once `poll(now)` returns, `poll_at` names no instant that is not
//! after `now` (every poll of these tests checks it, [`Node::poll`]), and what `poll` walks on each
//! call (held sends, waiting events) is what there is, not every slot.

use core::time::Duration;

use shared_abi::event::{EventKind, Status};
use shared_abi::packet::{MAX_WIRE_LEN, PacketHeader, PacketKind, RejectReason};

use super::*;
use crate::connection::WINDOW;

/// The REJECT `from` sends for `packet` (its first transmission) with `reason`, as bytes.
fn reject_of(packet: &WirePacket, from: u16, reason: RejectReason) -> Vec<u8> {
    let refused = packet.header();
    let mut reject = PacketHeader::new(PacketKind::REJECT, NodeId::new(from), refused.src_node);
    reject.seq = refused.seq;
    reject.epoch = refused.epoch;
    reject.aux = reason.0;
    reject.transmission = refused.transmission;
    let mut bytes = [0u8; MAX_WIRE_LEN];
    let len = reject.emit(&[], &mut bytes).expect("a header fits");
    bytes[..len].to_vec()
}

#[test]
fn a_packet_held_behind_one_refused_later_names_no_past_deadline() {
    // Packet B waits for a wire that was full; packet A before it is then refused (busy) and
    // waits longer. Go-back-N sends nothing after A before A, so B's own time, once past, is not
    // a time at which there is anything to do: `poll_at` must name A's.
    let mut net = Net::new(2);
    let retry = net[0].nic.config().retry_interval;
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 2);
    send_message(&mut net, (0, 1), (1, 2), 0, 16);
    let a = net.poll(0);
    assert_eq!(a.len(), 1);
    net[0].wire().blocked = true;
    send_message(&mut net, (0, 1), (1, 2), 1, 16);
    assert!(net.poll(0).is_empty(), "the wire takes nothing");
    net[0].wire().blocked = false;
    let b_due = net.now.saturating_add(retry);

    net.advance(retry / 2);
    net.inject(0, &reject_of(&a[0], 1, RejectReason::BUSY));
    assert!(
        net[0].take_outbox().is_empty(),
        "A waits out the retry interval"
    );
    let a_due = net.now.saturating_add(retry);

    // B's time comes while A still waits: nothing goes, and nothing past is asked for.
    net.now = b_due;
    assert!(net.poll(0).is_empty(), "B waits behind A");
    assert_eq!(net[0].nic.poll_at(), Some(a_due));

    // At A's time both go, in order, and both arrive.
    net.now = a_due;
    let resent: Vec<u32> = net.poll(0).iter().map(WirePacket::seq).collect();
    assert_eq!(resent, [0, 1]);
    net.run_for(Duration::from_millis(50));
    assert_eq!(of_kind(&net[1].events(2), EventKind::RECEIVED).len(), 2);
    assert_eq!(
        summary(&net[0].events(1)),
        [
            (EventKind::SENT, Status::SUCCESS, 0),
            (EventKind::SENT, Status::SUCCESS, 1)
        ]
    );
}

#[test]
fn parked_messages_take_the_room_the_window_makes_in_the_same_poll() {
    // A flow is parked (its receiver had no buffer); when its time comes the queue is full of
    // another port's messages, so only some of it goes back into the queue. An ack then opens the
    // window: the queue drains into it, and the rest of the parked flow must take the room in
    // that same poll, not stay parked and due with room for it.
    let mut net = Net::new(2);
    let retry = net[0].nic.config().retry_interval;
    net.open(0, 1);
    net.open(0, 2);
    net.open(1, 3);
    net.open(1, 4);
    for n in 0..20 {
        send_message(&mut net, (0, 1), (1, 3), n, 16);
    }
    let first = net.poll(0);
    assert_eq!(first.len(), WINDOW);
    // The receiver has no buffer for the first message: the flow parks, its 16 sequence slots go
    // again as cancelled packets.
    net.inject(0, &reject_of(&first[0], 1, RejectReason::NO_BUFFER));
    let cancelled = net[0].take_outbox();
    assert_eq!(cancelled.len(), WINDOW);
    assert!(cancelled.iter().all(|p| p.kind() == PacketKind::CANCELLED));
    // The window is full of them (their acks are held back), so port 2's messages wait in the
    // queue: 24 of its 32 places.
    for n in 0..24 {
        send_message(&mut net, (0, 2), (1, 4), 100 + n, 16);
    }
    net.doorbell(0);
    assert!(net[0].take_outbox().is_empty(), "the window is full");

    // The flow is due: 8 of its 20 messages fit in the queue.
    net.advance(retry);
    assert!(net.poll(0).is_empty(), "the window is still full");

    // The receiver takes the cancelled slots and acknowledges them: the queue drains into the
    // window, and each poll that makes room lets the parked flow take it (every poll checks
    // that nothing due is left behind).
    for packet in &cancelled {
        net.deliver(packet);
    }
    let acks = net[1].take_outbox();
    assert!(!acks.is_empty());
    for ack in &acks {
        net.deliver(ack);
    }
    assert!(!net[0].take_outbox().is_empty(), "the window opened");

    // Everything arrives once buffers are there (port 1's flow after its receiver provides).
    provide_buffers(&mut net, (1, 3), 20);
    provide_buffers(&mut net, (1, 4), 24);
    net.run_for(Duration::from_millis(200));
    assert_eq!(of_kind(&net[1].events(3), EventKind::RECEIVED).len(), 20);
    assert_eq!(of_kind(&net[1].events(4), EventKind::RECEIVED).len(), 24);
}

#[test]
fn held_sends_are_counted_as_tokens_are_taken_and_completed() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 3);
    for n in 0..3 {
        send_message(&mut net, (0, 1), (1, 2), n, 16);
    }
    net.doorbell(0);
    let held = |net: &Net| {
        net[0]
            .nic
            .port_status(PortId(1))
            .expect("the port is open")
            .held_sends
    };
    assert_eq!(held(&net), 3);
    net.run();
    assert_eq!(held(&net), 0);
    assert_eq!(of_kind(&net[0].events(1), EventKind::SENT).len(), 3);
}

#[test]
fn the_aborts_of_a_barrier_failed_by_a_give_up_go_in_the_same_poll() {
    // Node 0's barrier exchanges with node 1, then with node 2. Node 1 is silent: the give-up
    // (a connection timer, which runs after the barrier timers) fails the barrier, and node 2,
    // still owed a packet, is owed an abort at once. It goes in that poll; before, it waited
    // for the next one with `poll_at` naming time zero.
    let mut net = Net::new(3);
    net[1].silent = true;
    let config = *net[0].nic.config();
    net.open(0, 1);
    net.open(2, 1);
    net[0].start_barrier(1, &[exchange(1, 1, 0), exchange(2, 1, 1)], 0xab, 0);

    let carried = net.run_for(config.give_up_after + config.retransmit_timeout * 32);

    assert_eq!(
        summary(&net[0].events(1)),
        [(
            EventKind::BARRIER_FAILED,
            Status::TARGET_NODE_UNREACHABLE,
            0xab
        )]
    );
    assert!(
        carried
            .iter()
            .any(|p| p.to == NodeId::new(2) && p.kind() == PacketKind::BARRIER),
        "node 2 is told the barrier failed"
    );
}

#[test]
fn a_token_a_process_posts_is_work_waiting_until_a_poll_takes_it() {
    // A driver that skips the polls after one that found nothing must still see what processes
    // publish without a doorbell: a send token, a receive token.
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    net.run_for(Duration::from_millis(1));
    assert!(!net[0].nic.host_work_waiting(), "nothing posted yet");

    send_message(&mut net, (0, 1), (1, 2), 0, 16);
    assert!(net[0].nic.host_work_waiting(), "a send token waits");
    net.poll(0);
    assert!(!net[0].nic.host_work_waiting(), "the poll took it");

    let now = net.now;
    net[1].provide_buffer(2, 8, Priority::LOW, RECEIVE_AREA, 0);
    assert!(net[1].nic.host_work_waiting(), "a receive token waits");
    net[1].poll(now);
    assert!(!net[1].nic.host_work_waiting(), "the poll took it");
}
