//! Ports: open, close, generations, and one port's close never stalling another's traffic.

use core::time::Duration;

use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{Generation, NodeId, PortId};
use shared_abi::region::{RegionError, RegionHeader};
use zerocopy::FromBytes;

use super::*;

fn generation_in_header(node: &Node, port: u8) -> Generation {
    let mut header = [0u8; core::mem::size_of::<RegionHeader>()];
    node.memory(port).read(0, &mut header).unwrap();
    RegionHeader::read_from_bytes(&header[..])
        .unwrap()
        .generation
}

#[test]
fn generations_strictly_increase_across_reopen() {
    let mut net = Net::new(1);
    let mut previous = 0;
    for _ in 0..5 {
        let generation = net.open(0, 3);

        assert!(
            generation.get() > previous,
            "{} after {previous}",
            generation.get()
        );
        assert_eq!(
            generation_in_header(&net[0], 3),
            generation,
            "written for the process"
        );
        assert_eq!(
            net[0].nic.port_status(PortId(3)).unwrap().generation,
            generation
        );
        previous = generation.get();
        assert_eq!(net.close(0, 3), Some(generation));
    }
    assert_eq!(net.close(0, 3), None, "closing a closed port is a no-op");
}

#[test]
fn open_refuses_a_region_header_naming_another_node_or_port() {
    let mut net = Net::new(1);
    let now = net.now;
    let cases = [(NodeId::new(5), PortId(3)), (NodeId::new(0), PortId(4))];
    for (node, port) in cases {
        let opened = net[0].try_open_with_header(
            3,
            Shape::default(),
            |header| {
                header.node_id = node;
                header.port_id = port;
            },
            now,
        );

        assert_eq!(opened, Err(OpenError::WrongIdentity { node, port }));
        assert_eq!(net[0].nic.port_status(PortId(3)), None, "nothing changed");
    }
    assert!(
        net[0]
            .try_open_with_header(3, Shape::default(), |_| {}, now)
            .is_ok()
    );
}

/// What is wrong, how to make the header so, and the error open must give.
type BadHeaderCase = (&'static str, fn(&mut RegionHeader), RegionError);

#[test]
fn open_refuses_a_region_with_a_bad_magic_abi_version_or_length() {
    let mut net = Net::new(1);
    let now = net.now;
    let cases: [BadHeaderCase; 3] = [
        (
            "magic",
            |h| h.magic = 0x1234.into(),
            RegionError::BadMagic(0x1234),
        ),
        (
            "ABI version",
            |h| h.abi_version = (shared_abi::ABI_VERSION + 1).into(),
            RegionError::AbiMismatch(shared_abi::ABI_VERSION + 1),
        ),
        (
            "length",
            |h| h.region_len = 4096.into(),
            RegionError::LengthMismatch {
                header: 4096,
                actual: Shape::default().layout().region_len,
            },
        ),
    ];
    for (what, edit, error) in cases {
        let opened = net[0].try_open_with_header(2, Shape::default(), edit, now);

        assert_eq!(opened, Err(OpenError::BadRegion(error)), "{what}");
        assert_eq!(
            net[0].nic.port_status(PortId(2)),
            None,
            "{what}: nothing changed"
        );
    }
}

#[test]
fn open_refuses_an_open_port_a_port_beyond_the_nic_and_a_port_without_a_region() {
    let mut net = Net::new(1);
    let now = net.now;
    let generation = net.open(0, 1);

    assert_eq!(
        net[0].nic.open_port(PortId(1), now),
        Err(OpenError::AlreadyOpen(PortId(1)))
    );
    assert_eq!(
        net[0].nic.port_status(PortId(1)).unwrap().generation,
        generation
    );
    assert_eq!(
        net[0].nic.open_port(PortId(8), now),
        Err(OpenError::NoSuchPort(PortId(8)))
    );
    assert_eq!(
        net[0].nic.open_port(PortId(2), now),
        Err(OpenError::NoRegion(PortId(2)))
    );
}

#[test]
fn closing_a_port_with_data_in_flight_does_not_stall_the_other_ports() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(0, 2);
    net.open(1, 1);
    provide_buffers(&mut net, (1, 1), 8);
    for n in 0..5 {
        send_message(&mut net, (0, 1), (1, 1), n, 40);
    }
    let in_flight = net.poll(0);
    assert_eq!(in_flight.len(), 5);

    // Port 1's process dies with its packets lost on the wire; port 2 goes on.
    net.close(0, 1);
    for n in 10..13 {
        send_message(&mut net, (0, 2), (1, 1), n, 40);
    }
    net.run_for(Duration::from_millis(50));

    let received = net[1].events(1);
    assert_eq!(received.len(), 3, "only port 2's messages: {received:?}");
    for (event, n) in received.iter().zip(10u8..) {
        assert_eq!(event.peer_port, PortId(2));
        assert_eq!(net[1].read_arena(1, event.buffer.get(), 40), payload(n, 40));
    }
    assert_eq!(
        summary(&net[0].events(2)),
        (10..13)
            .map(|c| (EventKind::SENT, Status::SUCCESS, c))
            .collect::<Vec<_>>()
    );
}
