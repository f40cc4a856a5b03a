//! Broadcasts carried by the barrier engine: the root's bytes reach every member's completion
//! event, whatever the root, through loss, between ports of one NIC, and after the root closed;
//! bad tokens and bad packets are refused.

use core::time::Duration;

use nicbar_schedule::{Algorithm, Member};
use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{BarrierId, NodeId, PortId};
use shared_abi::packet::{
    BARRIER_PAYLOAD_LEN, BROADCAST_MAX, BarrierPayload, HEADER_LEN, PacketFlags, PacketHeader,
    PacketKind,
};
use shared_abi::schedule::Step;
use shared_abi::token::SendKind;
use zerocopy::IntoBytes;

use super::*;

/// Barrier `sequence` of one group.
fn nth(sequence: u32) -> BarrierId {
    BarrierId::new(9, 3, sequence)
}

/// `algorithm`'s schedule for `rank` of `members`.
fn schedule(members: &[(u16, u8)], rank: usize, algorithm: Algorithm) -> Vec<Step> {
    let group: Vec<Member> = members
        .iter()
        .map(|&(node, port)| Member::new(NodeId::new(node), PortId(port)))
        .collect();
    let mut out = [Step::default(); shared_abi::schedule::MAX_SCHEDULE_STEPS];
    let steps = nicbar_schedule::compile(algorithm, &group, rank, &mut out).unwrap();
    out[..steps].to_vec()
}

/// The binary gather-broadcast tree of `members` members rooted at rank `root`.
fn tree(members: usize, root: usize) -> Algorithm {
    Algorithm::GatherBroadcast {
        dimension: 2.min(members - 1),
        root,
    }
}

/// Every member of `members` starts broadcast `barrier` of `data` from rank `root` with
/// `algorithm` (context: the member's rank).
fn start_all(
    net: &mut Net,
    members: &[(u16, u8)],
    root: usize,
    algorithm: Algorithm,
    barrier: BarrierId,
    data: &[u8],
) {
    for (rank, &(node, port)) in members.iter().enumerate() {
        let steps = schedule(members, rank, algorithm);
        net[node].start_broadcast(port, &steps, (rank as u64, 0), barrier, members[root], data);
    }
}

/// Asserts that every member's one event is the broadcast's completion holding `data`.
fn assert_every_member_got(net: &mut Net, members: &[(u16, u8)], data: &[u8], what: &str) {
    for (rank, &(node, port)) in members.iter().enumerate() {
        let events = net[node].events(port);
        assert_eq!(
            summary(&events),
            [(EventKind::BARRIER_COMPLETED, Status::SUCCESS, rank as u64)],
            "{what}: rank {rank}"
        );
        assert_eq!(
            events[0].broadcast_data(),
            data,
            "{what}: rank {rank}'s bytes"
        );
    }
}

fn members_of(nodes: u16) -> Vec<(u16, u8)> {
    (0..nodes).map(|node| (node, 1)).collect()
}

fn open_all(net: &mut Net, members: &[(u16, u8)]) {
    for &(node, port) in members {
        net.open(node, port);
    }
}

#[test]
fn every_member_of_a_tree_gets_the_roots_bytes_from_every_root_and_of_every_length() {
    let members = members_of(6);
    let mut net = Net::new(6);
    open_all(&mut net, &members);
    let mut sequence = 0;
    for root in 0..members.len() {
        for len in [1, 8, 17, BROADCAST_MAX] {
            let data = payload(sequence as u8, len);
            start_all(
                &mut net,
                &members,
                root,
                tree(members.len(), root),
                nth(sequence),
                &data,
            );
            let carried = net.run();
            assert_every_member_got(
                &mut net,
                &members,
                &data,
                &std::format!("root {root}, {len} bytes"),
            );
            // The down-phase's packets carry the bytes; the up-phase's cannot have them yet.
            let barrier_packets: Vec<_> = carried
                .iter()
                .filter(|p| p.kind() == PacketKind::BARRIER)
                .collect();
            let carrying = barrier_packets
                .iter()
                .filter(|p| p.payload().len() == BARRIER_PAYLOAD_LEN + len)
                .count();
            assert_eq!(barrier_packets.len(), 2 * (members.len() - 1));
            assert_eq!(carrying, members.len() - 1, "one carrying packet per edge");
            sequence += 1;
        }
    }
}

#[test]
fn a_broadcast_over_the_wire_holds_no_bytes_once_its_packets_are_acknowledged() {
    // Its packets' acks come after it ended (with the ack delay here, with the next barrier
    // otherwise): the bytes go then, and the next broadcast finds a free place.
    let members = members_of(4);
    let mut net = Net::new(4);
    open_all(&mut net, &members);
    let data = payload(7, 9);
    start_all(&mut net, &members, 1, tree(members.len(), 1), nth(0), &data);
    net.run();
    net.run_for(core::time::Duration::from_millis(50));
    assert_every_member_got(&mut net, &members, &data, "the broadcast");
    for &(node, port) in &members {
        let slot = net[node].nic.ports.slot(usize::from(port)).unwrap();
        let held = slot.broadcasts.get(Generation::new(1), nth(0));
        assert!(
            held.is_none(),
            "node {node} port {port} still holds {held:?}"
        );
    }
}

#[test]
fn any_barrier_schedule_carries_the_bytes_to_every_member() {
    let members = members_of(5);
    let mut net = Net::new(5);
    open_all(&mut net, &members);
    for (sequence, algorithm) in [
        Algorithm::Dissemination { n: 1 },
        Algorithm::Dissemination { n: 2 },
        Algorithm::PairwiseExchange,
    ]
    .into_iter()
    .enumerate()
    {
        let data = payload(40 + sequence as u8, 24);
        start_all(
            &mut net,
            &members,
            3,
            algorithm,
            nth(sequence as u32),
            &data,
        );
        net.run();
        assert_every_member_got(&mut net, &members, &data, &std::format!("{algorithm:?}"));
    }
}

#[test]
fn ports_of_one_nic_hand_the_bytes_on_without_the_wire() {
    // Three ports of node 0 and one of node 1; the root is a port of node 0, its children
    // include ports of the same NIC and the remote one.
    let members = [(0, 1), (0, 2), (1, 1), (0, 3)];
    let mut net = Net::new(2);
    open_all(&mut net, &members);
    for root in 0..members.len() {
        let data = payload(root as u8, 32);
        start_all(
            &mut net,
            &members,
            root,
            tree(members.len(), root),
            nth(root as u32),
            &data,
        );
        net.run();
        assert_every_member_got(&mut net, &members, &data, &std::format!("root {root}"));
    }
}

#[test]
fn lost_duplicated_and_reordered_packets_still_bring_every_member_the_bytes() {
    // Back-to-back broadcasts from changing roots, each member starting the next one as soon as
    // its event of the last one is in: a packet resent after its sender started the next
    // broadcast (or closed nothing yet, but moved on) must still carry its own broadcast's bytes.
    const BROADCASTS: u32 = 6;
    let members = members_of(5);
    for seed in 1..=32u64 {
        std::println!("seed {seed}");
        let root = |k: u32| (seed as usize + k as usize / 2) % 5;
        let data = |k: u32| {
            payload(
                (seed as u8).wrapping_mul(7).wrapping_add(k as u8),
                1 + (seed as usize * 5 + k as usize) % BROADCAST_MAX,
            )
        };
        let mut net = Net::new(5);
        open_all(&mut net, &members);
        let mut done = [0u32; 5];
        let start = |net: &mut Net, rank: usize, k: u32| {
            let steps = schedule(&members, rank, tree(members.len(), root(k)));
            let (node, port) = members[rank];
            net[node].start_broadcast(
                port,
                &steps,
                (u64::from(k), 0),
                nth(k),
                members[root(k)],
                &data(k),
            );
        };
        for rank in 0..members.len() {
            start(&mut net, rank, 0);
        }
        let mut between = |net: &mut Net| {
            for (rank, &(node, port)) in members.iter().enumerate() {
                for event in net[node].events(port) {
                    let k = done[rank];
                    assert_eq!(
                        (event.kind, event.status, event.context.get()),
                        (EventKind::BARRIER_COMPLETED, Status::SUCCESS, u64::from(k)),
                        "seed {seed}: rank {rank}, broadcast {k}"
                    );
                    assert_eq!(
                        event.broadcast_data(),
                        &data(k)[..],
                        "seed {seed}: rank {rank}, broadcast {k}"
                    );
                    done[rank] += 1;
                    if done[rank] < BROADCASTS {
                        start(net, rank, done[rank]);
                    }
                }
            }
        };
        run_lossy(&mut net, seed, 15, Duration::from_secs(5), &mut between);
        between(&mut net);
        assert_eq!(
            done, [BROADCASTS; 5],
            "seed {seed}: every broadcast completed everywhere"
        );
    }
}

#[test]
fn a_root_that_closes_at_once_still_delivers_its_bytes_through_a_lost_packet() {
    let members = members_of(2);
    let mut net = Net::new(2);
    open_all(&mut net, &members);
    let data = payload(7, 20);
    start_all(&mut net, &members, 0, tree(members.len(), 0), nth(0), &data);
    // The leaf's gather packet reaches the root; the root's release is lost.
    for packet in net.poll(1) {
        net.deliver(&packet);
    }
    let lost = net.poll(0);
    assert!(lost.iter().any(|p| p.kind() == PacketKind::BARRIER));
    let root_events = net[0].events(1);
    assert_eq!(root_events[0].kind, EventKind::BARRIER_COMPLETED);
    assert_eq!(
        root_events[0].broadcast_data(),
        &data[..],
        "the root's event too"
    );
    net.close(0, 1);
    net.run_for(Duration::from_millis(50));

    let events = net[1].events(1);
    assert_eq!(
        summary(&events),
        [(EventKind::BARRIER_COMPLETED, Status::SUCCESS, 1)]
    );
    assert_eq!(events[0].broadcast_data(), &data[..]);
}

#[test]
fn a_broadcast_nobody_roots_completes_as_a_bad_schedule_on_every_member() {
    // Both name node 2 as the root, which is not a member: no bytes exist.
    let members = members_of(2);
    let mut net = Net::new(2);
    open_all(&mut net, &members);
    for (rank, &(node, port)) in members.iter().enumerate() {
        let steps = schedule(&members, rank, tree(members.len(), 0));
        net[node].start_broadcast(port, &steps, (rank as u64, 0), nth(0), (2, 1), &[1, 2]);
    }
    net.run();
    for (rank, &(node, port)) in members.iter().enumerate() {
        assert_eq!(
            summary(&net[node].events(port)),
            [(EventKind::BARRIER_FAILED, Status::BAD_SCHEDULE, rank as u64)]
        );
    }
}

#[test]
fn a_roots_token_with_no_bytes_too_many_or_no_identity_is_refused() {
    let members = members_of(2);
    let steps = schedule(&members, 0, tree(members.len(), 0));
    let cases: [(&[u8], BarrierId, Status); 3] = [
        (&[], nth(0), Status::TOO_LONG),
        (&[5; BROADCAST_MAX + 1], nth(0), Status::TOO_LONG),
        (&[5; 4], BarrierId::NONE, Status::INVALID_TOKEN),
    ];
    for (data, barrier, status) in cases {
        let mut net = Net::new(2);
        open_all(&mut net, &members);
        net[0].start_broadcast(1, &steps, (0x77, 0), barrier, (0, 1), data);
        net.poll(0);
        let events = net[0].events(1);
        assert_eq!(
            summary(&events),
            [(EventKind::TOKEN_REJECTED, status, 0x77)],
            "{} bytes, {barrier:?}",
            data.len()
        );
        assert_eq!(events[0].detail.get(), u32::from(SendKind::BROADCAST.0));
        assert!(!net[0].nic.port_status(PortId(1)).unwrap().barrier_running);
    }
}

fn barrier_packet(barrier: BarrierId, round: u8, extra: &[u8]) -> Vec<u8> {
    let mut header = PacketHeader::new(PacketKind::BARRIER, NodeId::new(0), NodeId::new(1));
    header.src_port = PortId(1);
    header.dst_port = PortId(1);
    header.aux = round;
    header.flags = PacketFlags::SYN;
    let body = BarrierPayload {
        barrier,
        ..BarrierPayload::default()
    };
    let mut payload = body.as_bytes().to_vec();
    payload.extend_from_slice(extra);
    let mut out = std::vec![0; shared_abi::packet::MAX_PACKET_LEN];
    let len = header.emit(&payload, &mut out).unwrap();
    out.truncate(len);
    out
}

#[test]
fn short_and_oversized_barrier_packets_are_refused_and_the_broadcast_goes_on() {
    // Node 1 is a leaf of node 0's tree; forged packets from "node 0" reach it first.
    let members = members_of(2);
    let mut net = Net::new(2);
    open_all(&mut net, &members);
    let data = payload(3, 16);
    start_all(&mut net, &members, 0, tree(members.len(), 0), nth(0), &data);
    let good = barrier_packet(nth(0), 1, &[0xbb; 8]);
    let short = {
        let mut bytes = good[..HEADER_LEN + BARRIER_PAYLOAD_LEN - 1].to_vec();
        bytes[14..16].copy_from_slice(&((BARRIER_PAYLOAD_LEN - 1) as u16).to_le_bytes());
        bytes
    };
    let oversized = barrier_packet(nth(0), 1, &[0xbb; BROADCAST_MAX + 1]);
    for (n, bytes) in [short, oversized].iter().enumerate() {
        net.inject(1, bytes);
        assert_eq!(net[1].nic.counters().malformed_packets, n as u64 + 1);
        assert!(net[1].events(1).is_empty());
    }
    net.run();
    assert_every_member_got(&mut net, &members, &data, "after the forged packets");
}

#[test]
fn bytes_for_another_barrier_never_reach_this_ones_event() {
    // A packet carrying bytes of barrier 1 reaches the leaf while it runs barrier 0: its own
    // broadcast still delivers its own root's bytes.
    let members = members_of(2);
    let mut net = Net::new(2);
    open_all(&mut net, &members);
    let data = payload(4, 12);
    start_all(&mut net, &members, 0, tree(members.len(), 0), nth(0), &data);
    net.inject(1, &barrier_packet(nth(1), 1, &[0xcc; 12]));
    net.run();
    assert_every_member_got(&mut net, &members, &data, "beside another barrier's bytes");
}

#[test]
fn a_lost_packet_carries_its_own_bytes_after_its_sender_ran_many_broadcasts_of_other_groups() {
    // Node 0 broadcasts to node 1 and the release is lost; before it is sent again, node 0 runs
    // many broadcasts with node 2 alone. The resent release still carries the first bytes.
    let mut net = Net::new(3);
    for node in 0..3 {
        net.open(node, 1);
    }
    let first = [(0, 1), (1, 1)];
    let data = payload(1, 30);
    start_all(
        &mut net,
        &first,
        0,
        tree(2, 0),
        BarrierId::new(9, 1, 0),
        &data,
    );
    for packet in net.poll(1) {
        net.deliver(&packet);
    }
    let lost = net.poll(0);
    assert!(lost.iter().any(|p| p.kind() == PacketKind::BARRIER));
    assert_eq!(net[0].events(1)[0].broadcast_data(), &data[..]);
    let other = [(0, 1), (2, 1)];
    for sequence in 0..20 {
        let bytes = payload(100 + sequence as u8, 9);
        start_all(
            &mut net,
            &other,
            sequence % 2,
            tree(2, sequence % 2),
            BarrierId::new(9, 2, sequence as u32),
            &bytes,
        );
        net.run();
        assert_every_member_got(
            &mut net,
            &other,
            &bytes,
            &std::format!("broadcast {sequence} of the other group"),
        );
    }
    net.run_for(Duration::from_millis(50));
    let events = net[1].events(1);
    assert_eq!(
        summary(&events),
        [(EventKind::BARRIER_COMPLETED, Status::SUCCESS, 1)]
    );
    assert_eq!(events[0].broadcast_data(), &data[..]);
}
