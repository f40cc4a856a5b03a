//! Properties over arbitrary input: tokens and packets from an untrusted other side, and
//! sequences of wire faults. The packet parser alone is fuzzed in `shared-abi`; here the NIC as a
//! whole takes the bytes.

use core::time::Duration;

use proptest::prelude::*;
use shared_abi::event::EventKind;
use shared_abi::ids::{NodeId, PortId};
use shared_abi::packet::{
    PACKET_MAGIC, Packet, PacketFlags, PacketHeader, PacketKind, WIRE_VERSION,
};
use shared_abi::token::{Priority, ReceiveKind, ReceiveToken, SendKind, SendToken};
use shared_abi::{MAX_SIZE_CLASS, max_length_for_size};

use super::*;

fn arena_len() -> u64 {
    Shape::default().layout().arena_len as u64
}

fn send_token_strategy() -> impl Strategy<Value = SendToken> {
    (
        prop_oneof![4 => Just(SendKind::DATA.0), 1 => Just(SendKind::BARRIER.0), 1 => any::<u8>()],
        prop_oneof![4 => 0u8..2, 1 => any::<u8>()],
        0u8..16,
        0u8..10,
        prop_oneof![4 => 0u32..5000, 1 => any::<u32>()],
        prop_oneof![4 => 0u64..70_000, 1 => any::<u64>()],
        any::<u64>(),
    )
        .prop_map(
            |(kind, priority, size, port, length, buffer, context)| SendToken {
                kind: SendKind(kind),
                priority: Priority(priority),
                size,
                target_node: NodeId::new(1),
                target_port: PortId(port),
                length: length.into(),
                buffer: buffer.into(),
                context: context.into(),
                ..SendToken::default()
            },
        )
}

/// What the ABI promises for a data token: sent if every field is in range and the message lies
/// in the arena.
fn data_token_is_valid(token: &SendToken) -> bool {
    let length = u64::from(token.length.get());
    token.priority.is_valid()
        && (3..=MAX_SIZE_CLASS).contains(&token.size)
        && length <= u64::from(max_length_for_size(token.size))
        && token.target_port.index().is_some()
        && token
            .buffer
            .get()
            .checked_add(length)
            .is_some_and(|end| end <= arena_len())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_send_token_is_answered_once_by_a_packet_or_a_rejection(token in send_token_strategy()) {
        let mut net = Net::new(2);
        net.open(0, 1);
        net[0].post_send(1, &token);

        let sent = net.poll(0);
        let events = net[0].events(1);
        prop_assert!(net.poll(0).is_empty() && net[0].events(1).is_empty());

        // A message longer than a packet starts with its first segment (the rest follow as the
        // connection's queue takes them).
        let answered_by_packet = !sent.is_empty() && events.is_empty();
        let answered_by_rejection = sent.is_empty()
            && events.len() == 1
            && events[0].kind == EventKind::TOKEN_REJECTED
            && events[0].context == token.context;
        prop_assert!(answered_by_packet || answered_by_rejection, "{sent:?} {events:?}");
        // Size class 3 (empty messages) is left out of the oracle: see
        // `rdma::an_empty_message_of_size_class_3_is_sent_and_received`.
        if token.kind == SendKind::DATA && token.size != 3 {
            prop_assert_eq!(answered_by_packet, data_token_is_valid(&token));
        }
        if answered_by_packet {
            let length = token.length.get() as usize;
            if length <= shared_abi::MTU_PAYLOAD {
                prop_assert_eq!(sent.len(), 1);
                prop_assert_eq!(sent[0].kind(), PacketKind::DATA);
                prop_assert_eq!(sent[0].payload().len(), length);
            } else {
                prop_assert!(sent.iter().all(|p| p.kind() == PacketKind::DATA_SEGMENT));
                prop_assert!(sent.len() <= length.div_ceil(shared_abi::packet::DATA_SEGMENT));
            }
        }
    }

    #[test]
    fn any_receive_token_is_taken_or_rejected_once(
        kind in prop_oneof![4 => Just(ReceiveKind::BUFFER.0), 1 => Just(ReceiveKind::BARRIER.0), 1 => any::<u8>()],
        priority in prop_oneof![4 => 0u8..2, 1 => any::<u8>()],
        size in 0u8..16,
        buffer in prop_oneof![4 => 0u64..70_000, 1 => any::<u64>()],
        tag in any::<u32>(),
    ) {
        let token = ReceiveToken {
            kind: ReceiveKind(kind),
            priority: Priority(priority),
            size,
            tag: tag.into(),
            buffer: buffer.into(),
            ..ReceiveToken::default()
        };
        let mut net = Net::new(1);
        net.open(0, 1);
        net[0].post_receive(1, &token);

        net.poll(0);
        let events = net[0].events(1);
        let buffers = net[0].nic.port_status(PortId(1)).unwrap().receive_buffers;

        let valid_buffer = token.priority.is_valid()
            && (3..=MAX_SIZE_CLASS).contains(&size)
            && buffer
                .checked_add(u64::from(max_length_for_size(size)))
                .is_some_and(|end| end <= arena_len());
        let taken = buffers == 1 && events.is_empty();
        let rejected = buffers == 0
            && events.len() == 1
            && events[0].kind == EventKind::TOKEN_REJECTED
            && events[0].tag.get() == tag
            && events[0].detail.get() == 0x100 | u32::from(kind);
        if token.kind == ReceiveKind::BARRIER {
            prop_assert!(events.is_empty() && buffers == 0, "{events:?}");
        } else if token.kind == ReceiveKind::BUFFER && size == 3 {
            // Left out of the oracle: see
            // `rdma::an_empty_message_of_size_class_3_is_sent_and_received`.
            prop_assert!(taken || rejected, "{events:?}");
        } else if token.kind == ReceiveKind::BUFFER && valid_buffer {
            prop_assert!(taken, "{events:?}");
        } else {
            prop_assert!(rejected, "{events:?}");
        }
    }

    #[test]
    fn any_bytes_from_the_wire_are_parsed_or_counted_never_a_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
        well_formed_prefix in any::<bool>(),
    ) {
        let mut bytes = bytes;
        if well_formed_prefix && bytes.len() >= 8 {
            // Get past the magic and version checks most of the time.
            bytes[0] = PACKET_MAGIC;
            bytes[1] = WIRE_VERSION;
            bytes[2] = 1 + bytes[2] % 7;
            bytes[6..8].copy_from_slice(&1u16.to_le_bytes());
        }
        let mut net = Net::new(2);
        net.open(1, 2);
        provide_buffers(&mut net, (1, 2), 2);

        net.inject(1, &bytes);

        let for_us = Packet::new_checked(&bytes[..])
            .is_ok_and(|packet| packet.header().dst_node == NodeId::new(1));
        prop_assert_eq!(net[1].nic.counters().malformed_packets, u64::from(!for_us));
        if !for_us {
            prop_assert!(net[1].take_outbox().is_empty());
            prop_assert!(net[1].events(2).is_empty());
        }
    }

    #[test]
    fn any_headers_from_peers_never_panic_and_use_each_buffer_at_most_once(
        packets in proptest::collection::vec(
            (
                any::<[u8; shared_abi::packet::HEADER_LEN]>(),
                1u8..=7,
                0u16..3,
                proptest::collection::vec(any::<u8>(), 0..300),
            ),
            1..20,
        ),
    ) {
        let mut net = Net::new(2);
        net.open(1, 2);
        provide_buffers(&mut net, (1, 2), 4);
        for (raw, kind, source, payload) in &packets {
            let mut header: PacketHeader = zerocopy::FromBytes::read_from_bytes(&raw[..]).unwrap();
            header.magic = PACKET_MAGIC;
            header.version = WIRE_VERSION;
            header.kind = PacketKind(*kind);
            header.src_node = NodeId::new(if *source == 1 { 0 } else { *source });
            header.dst_node = NodeId::new(1);
            header.dst_port = PortId(header.dst_port.0 % 9);
            header.size = 8;
            header.flags &= PacketFlags::ACK_VALID | PacketFlags::SYN;
            let mut out = std::vec![0; shared_abi::packet::MAX_PACKET_LEN];
            let len = header.emit(payload, &mut out).unwrap();
            net.inject(1, &out[..len]);
            net.advance(Duration::from_micros(100));
        }
        net.poll(1);

        let events = net[1].events(2);
        let mut used: Vec<u64> = events.iter().map(|e| e.buffer.get()).collect();
        prop_assert!(events.iter().all(|e| e.kind == EventKind::RECEIVED));
        prop_assert_eq!(events.len() as u64, net[1].nic.counters().messages_delivered);
        used.sort_unstable();
        used.dedup();
        prop_assert_eq!(used.len(), events.len(), "a buffer used twice");
        prop_assert!(used.iter().all(|b| (RECEIVE_AREA..RECEIVE_AREA + 4 * 256).contains(b)));
        prop_assert!(events.iter().all(|e| e.length.get() <= max_length_for_size(8)));
    }
}

/// What the wire does next in [`any_pattern_of_loss_duplication_and_reordering_delivers_each_message_once_in_order`].
#[derive(Clone, Copy, Debug)]
enum WireAction {
    /// Delivers the in-flight packet at this index (modulo), so any order is possible.
    Deliver(usize),
    /// Loses it.
    Drop(usize),
    /// Delivers a copy and keeps it in flight.
    Duplicate(usize),
    /// Lets time pass (microseconds), then polls.
    Wait(u32),
}

fn wire_action() -> impl Strategy<Value = WireAction> {
    prop_oneof![
        6 => any::<usize>().prop_map(WireAction::Deliver),
        2 => any::<usize>().prop_map(WireAction::Drop),
        1 => any::<usize>().prop_map(WireAction::Duplicate),
        1 => (0u32..5000).prop_map(WireAction::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_pattern_of_loss_duplication_and_reordering_delivers_each_message_once_in_order(
        forward in 1u8..12,
        backward in 0u8..6,
        actions in proptest::collection::vec(wire_action(), 0..80),
    ) {
        messages_survive(forward, backward, &actions)?;
    }
}

/// Node 0 port 1 sends `forward` messages to node 1 port 2, which sends `backward` back, over a
/// wire that does `actions`; then the wire heals. Each message must arrive once, in order, and
/// each send complete with success.
fn messages_survive(
    forward: u8,
    backward: u8,
    actions: &[WireAction],
) -> Result<(), TestCaseError> {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (0, 1), u32::from(backward));
    provide_buffers(&mut net, (1, 2), u32::from(forward));
    for n in 0..forward {
        send_message(&mut net, (0, 1), (1, 2), n, 20 + usize::from(n));
    }
    for n in 0..backward {
        send_message(&mut net, (1, 2), (0, 1), 100 + n, 30);
    }
    let mut in_flight: Vec<WirePacket> = Vec::new();
    for action in actions.iter().copied() {
        in_flight.extend(net.poll(0));
        in_flight.extend(net.poll(1));
        if in_flight.is_empty() {
            net.advance(Duration::from_micros(500));
            continue;
        }
        match action {
            WireAction::Deliver(i) => {
                let packet = in_flight.remove(i % in_flight.len());
                net.deliver(&packet);
            }
            WireAction::Drop(i) => {
                in_flight.remove(i % in_flight.len());
            }
            WireAction::Duplicate(i) => {
                let packet = in_flight[i % in_flight.len()].clone();
                net.deliver(&packet);
            }
            WireAction::Wait(us) => net.advance(Duration::from_micros(u64::from(us))),
        }
    }
    // The wire heals (what was still in flight is lost) and the protocol catches up.
    net[0].take_outbox();
    net[1].take_outbox();
    net.run_for(Duration::from_millis(500));

    let events_0 = net[0].events(1);
    let events_1 = net[1].events(2);
    for (node, port, events, first, count, len) in [
        (1u16, 2u8, &events_1, 0u8, forward, None),
        (0, 1, &events_0, 100, backward, Some(30)),
    ] {
        let received = of_kind(events, EventKind::RECEIVED);
        prop_assert_eq!(received.len(), usize::from(count), "node {}", node);
        for (event, n) in received.iter().zip(first..) {
            let len = len.unwrap_or(20 + usize::from(n));
            prop_assert_eq!(
                net[node].read_arena(port, event.buffer.get(), len),
                payload(n, len)
            );
        }
    }
    let sent_0 = of_kind(&events_0, EventKind::SENT);
    let sent_1 = of_kind(&events_1, EventKind::SENT);
    prop_assert_eq!(sent_0.len(), usize::from(forward));
    prop_assert_eq!(sent_1.len(), usize::from(backward));
    prop_assert!(
        sent_0
            .iter()
            .chain(&sent_1)
            .all(|e| e.status == shared_abi::event::Status::SUCCESS)
    );
    Ok(())
}

#[test]
fn regression_a_duplicated_and_reordered_stream_still_delivers_everything() {
    use WireAction::{Deliver, Drop, Duplicate, Wait};
    let actions = [
        Duplicate(7927942412964498696),
        Deliver(5191713227241874033),
        Deliver(4616193473777691225),
        Drop(15554338047895510363),
        Wait(4121),
        Deliver(2578577620770269946),
        Deliver(11450913022756345559),
        Deliver(10413686037771357427),
        Deliver(13764483028777932317),
        Drop(14054248012637223440),
        Drop(6882761122186664351),
        Drop(11059593373110881598),
        Deliver(6089084850526159674),
        Deliver(5499878485076528732),
        Duplicate(14564299591674019517),
        Deliver(6717319160894451084),
        Deliver(446760376345169260),
        Deliver(573723889023045354),
        Drop(9175582698561990345),
        Deliver(5651943132944204800),
        Drop(2896325036535870004),
        Deliver(17758202525070251881),
        Deliver(4964071340456765164),
        Deliver(7846994028916485357),
        Deliver(4811312125608531653),
        Wait(3935),
        Deliver(11370121228601527959),
        Deliver(13262772847241156749),
        Deliver(7626577067578844081),
        Wait(2491),
        Duplicate(17738435115324910109),
        Deliver(6779321075101031222),
        Deliver(11025987384137888770),
        Deliver(13035486251303090073),
        Drop(5132366212164394477),
        Deliver(2776949281210404583),
        Duplicate(14314422431411355008),
    ];
    messages_survive(4, 1, &actions).unwrap();
}
