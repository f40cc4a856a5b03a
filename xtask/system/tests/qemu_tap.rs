//! QEMU NICs on taps of a bridge (`nicbar_qemu::VirtioNet::Tap`), as on a fabric shared with
//! daemon NICs: in a network namespace of the test's own, two QEMU NICs exchange messages through
//! the bridge, the host's kernel reaches a QEMU NIC's UDP port (the firmware answers the kernel's
//! ARP for its address), and datagrams sent to that port from the host's addresses on the bridge
//! are each refused by the check they fail, none delivered; the NICs' traffic goes on after.
//!
//! Skipped, with the reason printed, when `qemu-system-riscv32` is not installed or no network
//! namespace can be made. Every wait is bounded and fails naming what it waited for.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use common::qemu_fabric::{STEP, image_path, provide, qemu_or_skip, send_and_check};
use nicbar::Port;
use nicbar_image::image::ImageFile;
use nicbar_qemu::{QemuConfig, QemuFabric, VirtioNet};
use shared_abi::image::ImageTarget;
use shared_abi::packet::{HEADER_LEN, MAC_LEN, PacketHeader};
use shared_abi::qemu::net::FABRIC_UDP_PORT;
use zerocopy::{FromZeros, IntoBytes};

/// The fabric's size: nodes 0 and 1 are the QEMU NICs; node 2's address is the bridge's (where a
/// daemon NIC would listen).
const NODE_COUNT: u16 = 3;

#[test]
fn forged_datagrams_from_the_host_to_a_qemu_nics_udp_port_are_refused() {
    let name = "forged_datagrams_from_the_host_to_a_qemu_nics_udp_port_are_refused";
    if !qemu_or_skip(name) {
        return;
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        println!("{name}: skipped, this machine has no /dev/net/tun (taps need it)");
        return;
    }
    // Built outside the namespace, where cargo runs.
    let _ = image_path();
    common::netns::in_namespace("qemu_tap", name, run_inside);
}

fn ip(arguments: &[&str]) {
    let status = Command::new("ip").args(arguments).status().unwrap();
    assert!(status.success(), "ip {}: {status}", arguments.join(" "));
}

/// A packet header naming `claimed` as its sender to node 0, and a made-up authentication code.
fn forged_packet(claimed: u16) -> Vec<u8> {
    let mut header = PacketHeader::new_zeroed();
    header.src_node = shared_abi::ids::NodeId::new(claimed);
    header.dst_node = shared_abi::ids::NodeId::new(0);
    let mut payload = header.as_bytes().to_vec();
    payload.extend_from_slice(&[0x5a; MAC_LEN]);
    assert_eq!(payload.len(), HEADER_LEN + MAC_LEN);
    payload
}

fn run_inside() {
    ip(&["link", "add", "nbbr0", "type", "bridge"]);
    ip(&["link", "set", "nbbr0", "mtu", "9000"]);
    for tap in ["nbtap0", "nbtap1"] {
        ip(&["tuntap", "add", "dev", tap, "mode", "tap"]);
        ip(&["link", "set", tap, "mtu", "9000", "master", "nbbr0", "up"]);
    }
    ip(&["link", "set", "nbbr0", "up"]);
    // Node 2's address (a node of the fabric with no NIC behind it) and one that is no node's.
    ip(&["addr", "add", "10.77.0.2/16", "dev", "nbbr0"]);
    ip(&["addr", "add", "10.77.0.9/16", "dev", "nbbr0"]);

    let dir = tempfile::tempdir().unwrap();
    let image = ImageFile::read_for_target(image_path(), ImageTarget::RISCV32IMAC)
        .expect("the image built by cargo xtask image verifies");
    let mut config = QemuConfig::new(dir.path().join("control.sock"), image, 2);
    config.echo_console = false;
    config.virtio_net = Some(VirtioNet::Tap);
    config.tap_prefix = "nbtap".to_owned();
    config.node_count = Some(NODE_COUNT);
    let fabric = QemuFabric::spawn(config).expect("the QEMU NICs boot on their taps");
    let socket = fabric.socket().to_owned();

    let mut a = Port::open_at(&socket, 0, 3).unwrap();
    let mut b = Port::open_at(&socket, 1, 3).unwrap();
    provide(&mut a, 4);
    provide(&mut b, 4);
    send_and_check(&mut a, &mut b, b"from node 0 through the bridge");
    send_and_check(&mut b, &mut a, &[0xa5; 200]);

    let node0 = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 0), FABRIC_UDP_PORT);
    let from = |address: [u8; 4], port: u16| {
        UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::from(address), port)).unwrap()
    };
    let node2 = from([10, 77, 0, 2], FABRIC_UDP_PORT);
    let stranger = from([10, 77, 0, 9], FABRIC_UDP_PORT);
    let node2_other_port = from([10, 77, 0, 2], FABRIC_UDP_PORT + 1);
    // Refused by the frame checks: from an address that is no node, from a node's address but
    // another port, claiming another sender than the node at its address, too short for a
    // header.
    stranger.send_to(&forged_packet(2), node0).unwrap();
    node2_other_port.send_to(&forged_packet(2), node0).unwrap();
    node2.send_to(&forged_packet(1), node0).unwrap();
    node2.send_to(&[7; 5], node0).unwrap();
    // Well formed, from node 2's address and port: refused only by its authentication code.
    node2.send_to(&forged_packet(2), node0).unwrap();

    // The NICs publish their counters each time they sleep: wait for node 0's to show them all
    // (which also shows the kernel found node 0's MAC: the firmware answered its ARP).
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
             packets, more than the forged datagrams"
        );
        assert!(
            Instant::now() < deadline,
            "node 0 counted {errors} of {expected_errors} receive errors and {unauthenticated} \
             of {expected_unauthenticated} unauthenticated packets within {STEP:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    send_and_check(&mut b, &mut a, b"after the forgeries");
    drop((a, b));
    let report = fabric.stop();
    for node in &report.nodes {
        assert_eq!(
            node.exit.and_then(|status| status.code()),
            Some(0),
            "{node}"
        );
        assert_eq!(node.counters.malformed_packets.get(), 0, "{node}");
    }
    assert_eq!(report.nodes[0].counters.messages_delivered.get(), 2);
    assert_eq!(report.nodes[1].counters.messages_delivered.get(), 1);
    assert_eq!(
        report.nodes[0].counters.receive_errors.get(),
        expected_errors
    );
    assert_eq!(report.switch.moved, 0, "{:?}", report.switch);
}
