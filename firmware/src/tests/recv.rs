//! RECV: in-order delivery, duplicates, gaps, acks, and anything the wire throws at it.

use core::time::Duration;

use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{NodeId, PortId};
use shared_abi::packet::{HEADER_LEN, PacketFlags, PacketHeader, PacketKind, WIRE_VERSION};
use zerocopy::little_endian::U32;

use super::*;

/// `header` followed by `payload`, as bytes on the wire.
fn bytes_of(header: PacketHeader, payload: &[u8]) -> Vec<u8> {
    let mut out = std::vec![0; HEADER_LEN + payload.len()];
    let len = header.emit(payload, &mut out).unwrap();
    out.truncate(len);
    out
}

#[test]
fn packets_in_order_are_delivered_once_each_in_order() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 3);
    for (n, len) in [(0u8, 1usize), (1, 248), (2, 0)] {
        send_message(&mut net, (0, 1), (1, 2), n, len);
    }

    net.run();

    let received = net[1].events(2);
    assert_eq!(received.len(), 3);
    for (event, (n, len)) in received.iter().zip([(0u8, 1usize), (1, 248), (2, 0)]) {
        assert_eq!(event.kind, EventKind::RECEIVED);
        assert_eq!(event.status, Status::SUCCESS);
        assert_eq!(event.peer_node, NodeId::new(0));
        assert_eq!(event.peer_port, PortId(1));
        assert_eq!(event.size, 8);
        assert_eq!(event.length.get() as usize, len);
        let bytes = net[1].read_arena(2, event.buffer.get(), len);
        assert_eq!(bytes, payload(n, len));
    }
    assert_eq!(net[1].nic.counters().messages_delivered, 3);
    assert_eq!(
        summary(&net[0].events(1)),
        (0..3)
            .map(|c| (EventKind::SENT, Status::SUCCESS, c))
            .collect::<Vec<_>>()
    );
    net.run_for(Duration::from_millis(100));
    assert!(
        net[1].events(2).is_empty() && net[0].events(1).is_empty(),
        "nothing twice"
    );
}

#[test]
fn a_duplicate_is_dropped_and_acknowledged_again() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 2);
    send_message(&mut net, (0, 1), (1, 2), 0, 30);
    let sent = net.poll(0);
    net.deliver(&sent[0]);
    let first_ack = net[1].take_outbox();
    assert_eq!(first_ack.len(), 1);
    assert_eq!(first_ack[0].kind(), PacketKind::ACK);

    // The ack is lost; the packet arrives again (a retransmission, or the wire duplicated it).
    net.deliver(&sent[0]);

    let again = net[1].take_outbox();
    assert_eq!(again.len(), 1, "acknowledged again: {again:?}");
    assert_eq!(again[0].kind(), PacketKind::ACK);
    assert_eq!(again[0].header().ack.get(), 1);
    assert_eq!(
        of_kind(&net[1].events(2), EventKind::RECEIVED).len(),
        1,
        "delivered once"
    );
    assert_eq!(net[1].nic.counters().messages_delivered, 1);
    net.deliver(&again[0]);
    assert_eq!(
        summary(&net[0].events(1)),
        [(EventKind::SENT, Status::SUCCESS, 0)]
    );
}

#[test]
fn a_gap_is_nacked_with_the_missing_sequence_number_and_the_sender_goes_back_at_once() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 3);
    for n in 0..3 {
        send_message(&mut net, (0, 1), (1, 2), n, 30);
    }
    let sent = net.poll(0);
    net.deliver(&sent[0]);
    net[1].take_outbox(); // node 1's ack of packet 0 is lost
    // Packet 1 is lost.
    net.deliver(&sent[2]);

    let nack = net[1].take_outbox();

    assert_eq!(nack.len(), 1);
    let header = nack[0].header();
    assert_eq!(header.kind, PacketKind::NACK);
    assert_eq!(header.ack.get(), 1, "names the missing sequence number");
    assert_eq!(header.ack_epoch, sent[0].header().epoch);
    assert_eq!(
        of_kind(&net[1].events(2), EventKind::RECEIVED).len(),
        1,
        "2 waits for 1"
    );

    net.deliver(&nack[0]);
    let resent = net[0].take_outbox();
    let seqs: Vec<u32> = resent.iter().map(WirePacket::seq).collect();
    assert_eq!(
        seqs,
        [1, 2],
        "back to the gap without waiting for a timeout"
    );
    for packet in &resent {
        net.deliver(packet);
    }
    net.run();
    let received = net[1].events(2);
    assert_eq!(received.len(), 2);
    for (event, n) in received.iter().zip([1u8, 2]) {
        let bytes = net[1].read_arena(2, event.buffer.get(), 30);
        assert_eq!(bytes, payload(n, 30));
    }
    assert_eq!(of_kind(&net[0].events(1), EventKind::SENT).len(), 3);
}

#[test]
fn two_packets_swapped_on_the_wire_are_delivered_in_the_order_they_were_sent() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 3);
    for n in 0..3 {
        send_message(&mut net, (0, 1), (1, 2), n, 30);
    }
    let sent = net.poll(0);

    net.deliver(&sent[0]);
    net.deliver(&sent[2]);
    assert_eq!(net[1].events(2).len(), 1, "2 is not delivered before 1");
    net.deliver(&sent[1]);
    net.run_for(Duration::from_millis(10));

    let received = net[1].events(2);
    assert_eq!(received.len(), 2, "each once: {received:?}");
    for (event, n) in received.iter().zip([1u8, 2]) {
        assert_eq!(net[1].read_arena(2, event.buffer.get(), 30), payload(n, 30));
    }
    assert_eq!(of_kind(&net[0].events(1), EventKind::SENT).len(), 3);
}

#[test]
fn malformed_packets_are_counted_and_ignored() {
    let mut net = Net::new(2);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 1);
    let mut header = PacketHeader::new(PacketKind::DATA, NodeId::new(0), NodeId::new(1));
    header.dst_port = PortId(2);
    header.size = 8;
    header.flags = PacketFlags::SYN;
    let good = bytes_of(header, b"hello");
    let with = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = good.clone();
        edit(&mut bytes);
        bytes
    };
    let cases: [(&str, Vec<u8>); 15] = [
        ("empty", Vec::new()),
        ("one byte", std::vec![0x4e]),
        ("a header short by one", good[..HEADER_LEN - 1].to_vec()),
        (
            "payload shorter than its length",
            good[..good.len() - 1].to_vec(),
        ),
        ("bytes after the payload", with(&|b| b.push(0))),
        ("bad magic", with(&|b| b[0] = 0x4f)),
        ("bad version", with(&|b| b[1] = WIRE_VERSION + 1)),
        (
            "the previous wire version",
            with(&|b| b[1] = WIRE_VERSION - 1),
        ),
        (
            "a barrier packet without its barrier's identity",
            bytes_of(
                PacketHeader {
                    kind: PacketKind::BARRIER,
                    ..header
                },
                b"hello",
            ),
        ),
        ("kind zero", with(&|b| b[2] = 0)),
        (
            "kind fourteen (past the last kind, a long message's segment)",
            with(&|b| b[2] = 14),
        ),
        ("kind 255", with(&|b| b[2] = 0xff)),
        (
            "another node id",
            bytes_of(
                PacketHeader {
                    dst_node: NodeId::new(7),
                    ..header
                },
                b"hi",
            ),
        ),
        ("garbage", (0..200u8).map(|i| i.wrapping_mul(37)).collect()),
        ("length field beyond the MTU", with(&|b| b[15] = 0xff)),
    ];
    for (n, (what, bytes)) in cases.iter().enumerate() {
        net.inject(1, bytes);

        assert_eq!(
            net[1].nic.counters().malformed_packets,
            n as u64 + 1,
            "{what}: counted"
        );
        assert!(net[1].take_outbox().is_empty(), "{what}: no answer");
        assert!(net[1].events(2).is_empty(), "{what}: nothing delivered");
        assert_eq!(
            net[1].nic.connection_counters().count(),
            0,
            "{what}: no connection"
        );
    }

    net.inject(1, &good);
    let received = net[1].events(2);
    assert_eq!(
        of_kind(&received, EventKind::RECEIVED).len(),
        1,
        "a good packet still works"
    );
    assert_eq!(net[1].read_arena(2, received[0].buffer.get(), 5), b"hello");
}

#[test]
fn an_ack_beyond_what_was_sent_frees_nothing() {
    let mut net = Net::new(2);
    net.open(0, 1);
    for n in 0..3 {
        send_message(&mut net, (0, 1), (1, 2), n, 10);
    }
    let sent = net.poll(0);
    assert_eq!(sent.len(), 3);
    let epoch = sent[0].header().epoch;
    let ack = |ack: u32, ack_epoch: U32| {
        let mut header = PacketHeader::new(PacketKind::ACK, NodeId::new(1), NodeId::new(0));
        header.flags = PacketFlags::ACK_VALID;
        header.ack = ack.into();
        header.ack_epoch = ack_epoch;
        bytes_of(header, &[])
    };

    for (what, forged) in [
        ("one past what was sent", ack(4, epoch)),
        ("far beyond", ack(1000, epoch)),
        ("half the sequence space away", ack(3 + (1 << 31), epoch)),
        ("behind, wrapped", ack(u32::MAX, epoch)),
        (
            "all of it, in another epoch",
            ack(3, (epoch.get() ^ 1).into()),
        ),
    ] {
        net.inject(0, &forged);
        assert!(net[0].events(1).is_empty(), "{what}: no send completed");
        assert_eq!(
            net[0].nic.port_status(PortId(1)).unwrap().held_sends,
            3,
            "{what}"
        );
    }

    // The same ack for exactly what was sent completes all three (the forgeries were well
    // formed; only their numbers were wrong).
    net.inject(0, &ack(3, epoch));
    assert_eq!(
        summary(&net[0].events(1)),
        (0..3)
            .map(|c| (EventKind::SENT, Status::SUCCESS, c))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_local_route_carries_no_code_and_only_the_local_entry_takes_its_packets() {
    let config = crate::Config {
        fabric_key: Some(crate::auth::FabricKey::new([3; 32])),
        ..crate::Config::default()
    };
    let mut net = Net::with_config(2, config);
    net[0].wire().local = true;
    net[1].wire().local = true;
    net.open(0, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 1);
    send_message(&mut net, (0, 1), (1, 2), 0, 100);
    let sent = net.poll(0);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].bytes.len(), HEADER_LEN + 100, "no trailer");

    // Handed in as if from the wire, the uncoded packet is refused before it is parsed.
    let now = net.now;
    net[1].nic.on_packet(&sent[0].bytes, now);
    assert_eq!(net[1].nic.counters().unauthenticated, 1);
    assert!(net[1].events(2).is_empty());

    // Over the local route it is taken.
    net[1].nic.on_local_packet(&sent[0].bytes, now);
    net[1].poll(now);
    let received = of_kind(&net[1].events(2), EventKind::RECEIVED);
    assert_eq!(received.len(), 1);
    assert_eq!(
        net[1].read_arena(2, received[0].buffer.get(), 100),
        payload(0, 100)
    );
}
