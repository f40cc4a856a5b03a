//! SDMA: send tokens in, checked, and queued as packets; bad tokens answered, never lost.

use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{NodeId, PortId};
use shared_abi::packet::{PacketFlags, PacketKind};
use shared_abi::token::{Priority, SendKind, SendToken};

use super::*;
use crate::connection::{QUEUE, WINDOW};
use crate::port::SEND_TOKENS;

#[test]
fn a_data_token_becomes_one_data_packet_with_the_token_fields_and_the_arena_bytes() {
    let mut net = Net::new(2);
    let generation = net.open(0, 1);
    let bytes = payload(7, 100);
    net[0].write_arena(1, 4096, &bytes);
    net[0].post_send(1, &data_token(1, 2, 7, Priority::HIGH, 100, 4096, 0xfeed));

    let sent = net.poll(0);

    assert_eq!(sent.len(), 1, "one token, one packet: {sent:?}");
    let packet = &sent[0];
    let header = packet.header();
    assert_eq!(packet.to, NodeId::new(1));
    assert_eq!(header.kind, PacketKind::DATA);
    assert_eq!(header.src_node, NodeId::new(0));
    assert_eq!(header.dst_node, NodeId::new(1));
    assert_eq!(header.src_port, PortId(1));
    assert_eq!(header.dst_port, PortId(2));
    assert_eq!(header.priority, Priority::HIGH.0);
    assert_eq!(header.size, 7);
    assert_eq!(header.length.get(), 100);
    assert_eq!(header.src_generation, generation);
    assert_eq!(header.seq.get(), 0);
    assert!(
        header.flags.contains(PacketFlags::SYN),
        "first packet of an epoch"
    );
    assert_eq!(packet.payload(), &bytes[..]);
    // The token stays inside the NIC until the message is acknowledged.
    assert!(net[0].events(1).is_empty());
    assert_eq!(net[0].nic.port_status(PortId(1)).unwrap().held_sends, 1);
}

#[test]
fn each_malformed_send_token_is_rejected_once_with_its_status_and_context() {
    let arena_len = Shape::default().layout().arena_len as u64;
    let good = data_token(1, 2, 8, Priority::LOW, 100, 0, 0);
    let cases = [
        (
            "unknown kind",
            SendToken {
                kind: SendKind(9),
                ..good
            },
            Status::INVALID_TOKEN,
        ),
        (
            "kind zero",
            SendToken {
                kind: SendKind(0),
                ..good
            },
            Status::INVALID_TOKEN,
        ),
        (
            "priority 2",
            SendToken {
                priority: Priority(2),
                ..good
            },
            Status::INVALID_TOKEN,
        ),
        (
            "size class 0",
            SendToken {
                size: 0,
                length: 0.into(),
                ..good
            },
            Status::INVALID_TOKEN,
        ),
        (
            "size class 2",
            SendToken {
                size: 2,
                length: 0.into(),
                ..good
            },
            Status::INVALID_TOKEN,
        ),
        (
            "size class 32",
            SendToken { size: 32, ..good },
            Status::INVALID_TOKEN,
        ),
        (
            "length above the size class",
            SendToken {
                length: 249.into(),
                ..good
            },
            Status::TOO_LONG,
        ),
        (
            "length u32::MAX",
            SendToken {
                length: u32::MAX.into(),
                ..good
            },
            Status::TOO_LONG,
        ),
        (
            "target port 8",
            SendToken {
                target_port: PortId(8),
                ..good
            },
            Status::INVALID_TOKEN,
        ),
        (
            "target port 255",
            SendToken {
                target_port: PortId(255),
                ..good
            },
            Status::INVALID_TOKEN,
        ),
        (
            "buffer past the arena",
            SendToken {
                buffer: arena_len.into(),
                ..good
            },
            Status::BAD_BUFFER,
        ),
        (
            "buffer overflowing the arena's end",
            SendToken {
                buffer: (arena_len - 50).into(),
                ..good
            },
            Status::BAD_BUFFER,
        ),
        (
            "buffer u64::MAX",
            SendToken {
                buffer: u64::MAX.into(),
                ..good
            },
            Status::BAD_BUFFER,
        ),
        (
            "empty message at u64::MAX",
            SendToken {
                buffer: u64::MAX.into(),
                length: 0.into(),
                ..good
            },
            Status::BAD_BUFFER,
        ),
    ];
    let mut net = Net::new(2);
    net.open(0, 1);
    for (n, (what, bad, status)) in cases.iter().enumerate() {
        let context = 1000 + n as u64;
        net[0].post_send(
            1,
            &SendToken {
                context: context.into(),
                ..*bad
            },
        );
        // The next good token still works.
        send_message(&mut net, (0, 1), (1, 2), n as u8, 10 + n);

        let sent = net.poll(0);
        let events = net[0].events(1);

        assert_eq!(
            summary(&events),
            [(EventKind::TOKEN_REJECTED, *status, context)],
            "{what}: {events:?}"
        );
        assert_eq!(
            events[0].detail.get(),
            u32::from(bad.kind.0),
            "{what}: detail names the kind"
        );
        assert_eq!(
            sent.len(),
            1,
            "{what}: only the good token is sent: {sent:?}"
        );
        assert_eq!(sent[0].kind(), PacketKind::DATA);
        assert_eq!(sent[0].payload(), &payload(n as u8, 10 + n)[..], "{what}");
        assert!(
            net.poll(0).is_empty() && net[0].events(1).is_empty(),
            "{what}: answered once"
        );
    }
    assert_eq!(net[0].nic.counters().tokens_rejected, cases.len() as u64);
}

#[test]
fn a_ring_tail_forged_beyond_the_ring_is_ring_corrupt_and_the_port_keeps_working() {
    let shape = Shape::default();
    // One ring and one more ahead of the NIC's head, and behind it.
    let cases = [
        ("send", Ring::Send, shape.send_entries + 1),
        ("send", Ring::Send, u32::MAX),
        ("receive", Ring::Receive, shape.receive_entries + 1),
        ("receive", Ring::Receive, u32::MAX),
    ];
    for (ring, which, forged_tail) in cases {
        let mut net = Net::new(2);
        net.open(0, 1);
        net[0].forge_index(1, which, Index::Tail, forged_tail);

        let sent = net.poll(0);

        assert!(
            sent.is_empty(),
            "{ring} tail {forged_tail}: nothing read from a corrupt ring"
        );
        assert_eq!(
            summary(&net[0].events(1)),
            [(EventKind::TOKEN_REJECTED, Status::RING_CORRUPT, 0)],
            "{ring} tail {forged_tail}"
        );
        let status = net[0].nic.port_status(PortId(1)).unwrap();
        assert_eq!((status.faulted, status.receive_buffers), (None, 0));

        net[0].resynchronise_rings(1);
        send_message(&mut net, (0, 1), (1, 2), 3, 30);
        net[0].provide_buffer(1, 8, Priority::LOW, 0x8000, 1);
        let sent = net.poll(0);
        assert_eq!(
            sent.len(),
            1,
            "{ring} tail {forged_tail}: the port works after"
        );
        assert_eq!(sent[0].payload(), &payload(3, 30)[..]);
        assert!(net[0].events(1).is_empty());
        assert_eq!(
            net[0].nic.port_status(PortId(1)).unwrap().receive_buffers,
            1
        );
    }
}

#[test]
fn tokens_beyond_the_send_token_limit_wait_in_the_ring_and_none_is_lost() {
    const MESSAGES: u8 = SEND_TOKENS as u8 + 8;
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), u32::from(MESSAGES));
    for n in 0..MESSAGES {
        send_message(&mut net, (0, 1), (1, 2), n, 64);
    }

    let first = net.poll(0);

    // The NIC takes what it has room for: a send slot, and a place on the connection (in
    // flight, or queued behind the window).
    let taken = SEND_TOKENS.min(WINDOW + QUEUE);
    assert_eq!(first.len(), taken.min(WINDOW));
    assert_eq!(net[0].nic.port_status(PortId(1)).unwrap().held_sends, taken);
    assert_eq!(
        net[0].send_ring_head(1),
        taken as u32,
        "the rest stay in the ring"
    );
    assert!(net.poll(0).is_empty(), "no room, no progress, no loss");
    assert!(net[0].events(1).is_empty());

    for packet in &first {
        net.deliver(packet);
    }
    net.run();

    let sent = net[0].events(1);
    assert_eq!(sent.len(), usize::from(MESSAGES));
    assert!(
        sent.iter()
            .all(|e| e.kind == EventKind::SENT && e.status == Status::SUCCESS)
    );
    let mut contexts: Vec<u64> = sent.iter().map(|e| e.context.get()).collect();
    contexts.sort_unstable();
    assert_eq!(contexts, (0..u64::from(MESSAGES)).collect::<Vec<_>>());
    assert_eq!(net[0].send_ring_head(1), u32::from(MESSAGES));

    let received = net[1].events(2);
    assert_eq!(received.len(), usize::from(MESSAGES));
    for (n, event) in received.iter().enumerate() {
        assert_eq!(event.kind, EventKind::RECEIVED);
        let bytes = net[1].read_arena(2, event.buffer.get(), event.length.get() as usize);
        assert_eq!(
            bytes,
            payload(n as u8, 64),
            "message {n} arrives in order, once"
        );
    }
}
