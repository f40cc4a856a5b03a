//! QEMU NICs whose wire is virtio-net: the firmware image boots as two NICs on one Ethernet
//! segment (`nicbar_qemu::VirtioNet::Wire`), this process opens a port on each, exchanges
//! messages and runs a barrier through their virtio-net devices (the switch moves nothing), and
//! puts forged frames on the segment: each is refused by the checks it fails, none is delivered.
//!
//! Skipped, with the reason printed, only when `qemu-system-riscv32` is not installed
//! (`cargo xtask qemu` installs it). Every wait is bounded and fails naming what it waited for.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use common::qemu_fabric::{STEP, image_path, provide, qemu_or_skip, send_and_check};
use nicbar::{Group, NodeId, Port, PortId};
use nicbar_image::image::ImageFile;
use nicbar_qemu::{QemuConfig, QemuFabric, VirtioNet};
use shared_abi::image::ImageTarget;
use shared_abi::packet::{HEADER_LEN, MAC_LEN, PacketHeader};
use shared_abi::qemu::net::{
    Endpoint, FABRIC_UDP_PORT, Ipv4Address, MAX_FRAME_LEN, build_udp, node_address, node_mac,
};
use zerocopy::{FromZeros, IntoBytes};

fn fabric(dir: &tempfile::TempDir) -> QemuFabric {
    let image = ImageFile::read_for_target(image_path(), ImageTarget::RISCV32IMAC)
        .expect("the image built by cargo xtask image verifies");
    let mut config = QemuConfig::new(dir.path().join("control.sock"), image, 2);
    config.echo_console = false;
    config.virtio_net = Some(VirtioNet::Wire);
    QemuFabric::spawn(config).expect("the QEMU NICs boot with virtio-net")
}

fn endpoint(node: u16) -> Endpoint {
    Endpoint {
        address: node_address(node),
        port: FABRIC_UDP_PORT,
    }
}

/// A frame to node 0 from `source`, carrying a packet header that names `claimed` as its
/// sender and a made-up authentication code.
fn frame_to_node0(source: Endpoint, source_mac_node: u16, claimed: u16) -> Vec<u8> {
    let mut header = PacketHeader::new_zeroed();
    header.src_node = shared_abi::ids::NodeId::new(claimed);
    header.dst_node = shared_abi::ids::NodeId::new(0);
    let mut payload = header.as_bytes().to_vec();
    payload.extend_from_slice(&[0x5a; MAC_LEN]);
    assert_eq!(payload.len(), HEADER_LEN + MAC_LEN);
    let mut frame = vec![0; MAX_FRAME_LEN];
    let len = build_udp(
        &mut frame,
        node_mac(source_mac_node),
        node_mac(0),
        source,
        endpoint(0),
        1,
        &payload,
    )
    .unwrap();
    frame.truncate(len);
    frame
}

#[test]
fn messages_and_a_barrier_through_virtio_net_and_forged_frames_refused() {
    if !qemu_or_skip("messages_and_a_barrier_through_virtio_net_and_forged_frames_refused") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fabric = fabric(&dir);
    let segment = fabric
        .virtio_segment()
        .expect("a wire on virtio-net has a segment");
    let socket = fabric.socket().to_owned();

    let mut a = Port::open_at(&socket, 0, 3).unwrap();
    let mut b = Port::open_at(&socket, 1, 3).unwrap();
    provide(&mut a, 4);
    provide(&mut b, 4);
    send_and_check(&mut a, &mut b, b"from node 0 through virtio-net");
    send_and_check(&mut b, &mut a, &[0xa5; 200]);
    let group = Group::from_endpoints([(NodeId::new(0), PortId(3)), (NodeId::new(1), PortId(3))])
        .unwrap()
        .with_timeout(STEP);
    std::thread::scope(|scope| {
        let other = scope.spawn(|| b.barrier(&group));
        a.barrier(&group).expect("node 0's barrier completes");
        other.join().unwrap().expect("node 1's barrier completes");
    });

    // Forged frames for node 0, as any process on the host could put them on the segment.
    let genuine = frame_to_node0(endpoint(1), 1, 1);
    let mut bad_ip_checksum = genuine.clone();
    bad_ip_checksum[14 + 12] ^= 1; // a bit of the source address
    let mut truncated = genuine.clone();
    truncated.truncate(14 + 20 + 4);
    let forged = [
        // Refused by the frame checks.
        bad_ip_checksum,
        truncated,
        // From an address that is no node of the fabric.
        frame_to_node0(
            Endpoint {
                address: Ipv4Address([10, 0, 0, 9]),
                port: FABRIC_UDP_PORT,
            },
            1,
            1,
        ),
        // From node 1's address, claiming to be node 0 (the binding of nodes to addresses).
        frame_to_node0(endpoint(1), 1, 0),
        // Well formed and from node 1's address: refused only by its authentication code.
        genuine,
    ];
    let sender = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    sender.set_multicast_loop_v4(true).unwrap();
    for frame in &forged {
        sender.send_to(frame, segment).unwrap();
    }

    // The NICs publish their counters each time they sleep: wait for node 0's to show them all.
    let (expected_errors, expected_unauthenticated) = (4, 1);
    let deadline = Instant::now() + STEP;
    loop {
        let reports = fabric.reports();
        let counters = &reports[0].counters;
        let (errors, unauthenticated) = (
            counters.receive_errors.get(),
            counters.unauthenticated.get(),
        );
        if (errors, unauthenticated) == (expected_errors, expected_unauthenticated) {
            break;
        }
        assert!(
            errors <= expected_errors && unauthenticated <= expected_unauthenticated,
            "node 0 counted {errors} receive errors and {unauthenticated} unauthenticated \
             packets, more than the forged frames"
        );
        assert!(
            Instant::now() < deadline,
            "node 0 counted {errors} of {expected_errors} receive errors and {unauthenticated} \
             of {expected_unauthenticated} unauthenticated packets within {STEP:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // The wire still works after them.
    send_and_check(&mut b, &mut a, b"after the forgeries");

    drop((a, b));
    let report = fabric.stop();
    for node in &report.nodes {
        assert_eq!(
            node.exit.and_then(|status| status.code()),
            Some(0),
            "{node}"
        );
        assert_eq!(node.counters.barriers_completed.get(), 1, "{node}");
        assert_eq!(node.counters.malformed_packets.get(), 0, "{node}");
    }
    assert_eq!(report.nodes[0].counters.messages_delivered.get(), 2);
    assert_eq!(report.nodes[1].counters.messages_delivered.get(), 1);
    assert_eq!(
        report.nodes[0].counters.receive_errors.get(),
        expected_errors
    );
    assert_eq!(report.nodes[1].counters.receive_errors.get(), 0);
    assert_eq!(
        report.switch.moved, 0,
        "every packet went through virtio-net: {:?}",
        report.switch
    );
}
