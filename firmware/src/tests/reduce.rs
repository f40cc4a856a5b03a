//! Reductions run by the barrier engine: every member's completion carries the combined value,
//! the same bytes on every member, over the wire and between ports of one NIC, through loss.

use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{BarrierId, NodeId, PortId};
use shared_abi::reduce::{ReduceOp, ReduceSpec, ReduceType};
use shared_abi::schedule::{MAX_SCHEDULE_STEPS, Step};

use super::*;

/// The allreduce schedule of `rank` among `members` (node, port) pairs.
fn schedule(members: &[(u16, u8)], rank: usize) -> Vec<Step> {
    let group: Vec<nicbar_schedule::Member> = members
        .iter()
        .map(|&(node, port)| nicbar_schedule::Member::new(NodeId::new(node), PortId(port)))
        .collect();
    let mut steps = std::vec![Step::default(); MAX_SCHEDULE_STEPS];
    let count = nicbar_schedule::allreduce(&group, rank, &mut steps).unwrap();
    steps.truncate(count);
    steps
}

/// Runs a u32 SUM allreduce of `values` over `members`, each on its own `(node, port)`, and
/// returns each member's completion (status, result bytes).
fn allreduce(net: &mut Net, members: &[(u16, u8)], values: &[u32]) -> Vec<(Status, Vec<u8>)> {
    let spec = ReduceSpec::new(ReduceOp::SUM, ReduceType::U32);
    let barrier = BarrierId::new(3, 9, 0);
    for (rank, &(node, port)) in members.iter().enumerate() {
        let data: Vec<u8> = [values[rank], values[rank] * 2]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        net[node].start_reduction(
            port,
            &schedule(members, rank),
            rank as u64,
            barrier,
            spec,
            &data,
        );
        net.run();
    }
    net.run_for(core::time::Duration::from_millis(50));
    members
        .iter()
        .map(|&(node, port)| {
            let events = net[node].events(port);
            assert_eq!(events.len(), 1, "node {node} port {port}: {events:?}");
            let event = events[0];
            assert_eq!(event.kind, EventKind::BARRIER_COMPLETED);
            (event.status, event.broadcast_data().to_vec())
        })
        .collect()
}

fn expected(values: &[u32]) -> Vec<u8> {
    let sum: u32 = values.iter().sum();
    [sum, sum * 2]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

#[test]
fn every_member_of_an_allreduce_completes_with_the_sum_over_the_wire() {
    for size in 2..=5u16 {
        let mut net = Net::new(size);
        let members: Vec<(u16, u8)> = (0..size).map(|node| (node, 1)).collect();
        for &(node, port) in &members {
            net.open(node, port);
        }
        let values: Vec<u32> = (0..size as u32).map(|v| 10 + v * 7).collect();
        for (status, bytes) in allreduce(&mut net, &members, &values) {
            assert_eq!(status, Status::SUCCESS);
            assert_eq!(bytes, expected(&values), "{size} members");
        }
    }
}

#[test]
fn an_allreduce_between_ports_of_one_nic_never_touches_the_wire() {
    let mut net = Net::new(1);
    let members = [(0u16, 1u8), (0, 2), (0, 3)];
    for &(node, port) in &members {
        net.open(node, port);
    }
    let values = [1u32, 20, 300];
    for (status, bytes) in allreduce(&mut net, &members, &values) {
        assert_eq!(status, Status::SUCCESS);
        assert_eq!(bytes, expected(&values));
    }
    assert_eq!(net[0].wire().transmitted, 0);
}

#[test]
fn an_allreduce_between_ports_of_one_nic_leaves_no_value_behind() {
    // Nothing of it can be sent again on a route that loses nothing: the values each port sent
    // and took go with the reduction, and the port's table is empty for the next one.
    let mut net = Net::new(1);
    let members = [(0u16, 1u8), (0, 2), (0, 3), (0, 4), (0, 5)];
    for &(node, port) in &members {
        net.open(node, port);
    }
    let values = [1u32, 20, 300, 4000, 50000];
    for (status, bytes) in allreduce(&mut net, &members, &values) {
        assert_eq!(status, Status::SUCCESS);
        assert_eq!(bytes, expected(&values));
    }
    for &(_, port) in &members {
        let slot = net[0].nic.ports.slot(usize::from(port)).unwrap();
        let kept: Vec<_> = slot.reduce_values.keys().collect();
        assert!(kept.is_empty(), "port {port} still keeps {kept:?}");
    }
}

#[test]
fn an_allreduce_over_the_wire_leaves_no_sent_value_once_its_packets_are_acknowledged() {
    // A barrier packet's ack waits for the next barrier to carry it (or for the ack delay), so
    // the reduction ends with its packets unacknowledged: its values go when the acks come,
    // and the next reduction's steps look through an empty table, not a full one.
    let mut net = Net::new(4);
    let members: Vec<(u16, u8)> = (0..4).map(|node| (node, 1)).collect();
    for &(node, port) in &members {
        net.open(node, port);
    }
    let values = [5u32, 6, 7, 8];
    for (status, bytes) in allreduce(&mut net, &members, &values) {
        assert_eq!(status, Status::SUCCESS);
        assert_eq!(bytes, expected(&values));
    }
    for &(node, port) in &members {
        let slot = net[node].nic.ports.slot(usize::from(port)).unwrap();
        let kept: Vec<_> = slot.reduce_values.keys().collect();
        assert!(
            kept.is_empty(),
            "node {node} port {port} still keeps {kept:?}"
        );
    }
}

/// Runs an allreduce with `spec` over `members` (each a port on a node of its own), member
/// `rank` bringing `payloads[rank]`, through a lossy wire drawn from `seed`; checks every member
/// completed it and returns each one's result bytes.
fn lossy_allreduce(
    members: &[(u16, u8)],
    spec: ReduceSpec,
    payloads: &[Vec<u8>],
    seed: u64,
) -> Vec<Vec<u8>> {
    let mut net = Net::new(members.len() as u16);
    for &(node, port) in members {
        net.open(node, port);
    }
    for (rank, &(node, port)) in members.iter().enumerate() {
        net[node].start_reduction(
            port,
            &schedule(members, rank),
            rank as u64,
            BarrierId::new(3, 9, 0),
            spec,
            &payloads[rank],
        );
    }
    run_lossy(
        &mut net,
        seed,
        10,
        core::time::Duration::from_secs(2),
        &mut |_| {},
    );
    members
        .iter()
        .map(|&(node, port)| {
            let events = net[node].events(port);
            assert_eq!(events.len(), 1, "seed {seed}, node {node}: {events:?}");
            assert_eq!(
                (events[0].kind, events[0].status),
                (EventKind::BARRIER_COMPLETED, Status::SUCCESS),
                "seed {seed}, node {node}"
            );
            events[0].broadcast_data().to_vec()
        })
        .collect()
}

#[test]
fn an_allreduce_through_a_lossy_wire_gives_every_member_the_same_bytes() {
    let spec = ReduceSpec::new(ReduceOp::SUM, ReduceType::F64);
    let members = [(0u16, 1u8), (1, 1), (2, 1), (3, 1), (4, 1)];
    let values = [0.1f64, 0.2, 0.3, 1e16, -1e16];
    let payloads: Vec<Vec<u8>> = values.iter().map(|v| v.to_le_bytes().to_vec()).collect();
    // The schedule's tree for 5 members: ((x0 + x4) + x1) + (x2 + x3).
    let tree = ((values[0] + values[4]) + values[1]) + (values[2] + values[3]);
    for seed in 1..=6 {
        for (rank, result) in lossy_allreduce(&members, spec, &payloads, seed)
            .into_iter()
            .enumerate()
        {
            assert_eq!(
                result,
                tree.to_le_bytes(),
                "seed {seed}, rank {rank}: not the schedule's tree"
            );
        }
    }
}

#[test]
fn a_reproducible_sum_gives_the_same_accumulator_whichever_rank_holds_which_value() {
    use shared_abi::reproducible::ReproducibleSum;
    let spec = ReduceSpec::new(ReduceOp::SUM_REPRODUCIBLE, ReduceType::F64);
    let members = [(0u16, 1u8), (1, 1), (2, 1), (3, 1), (4, 1)];
    let values = [1e16f64, 0.1, -3.5e-3, 0.3, -1e16];
    let mut reference = ReproducibleSum::default();
    for value in values {
        reference.merge(&ReproducibleSum::of_f64(value));
    }
    for rotation in 0..values.len() {
        let payloads: Vec<Vec<u8>> = (0..values.len())
            .map(|rank| {
                let value = values[(rank + rotation) % values.len()];
                ReproducibleSum::of_f64(value).to_bytes().to_vec()
            })
            .collect();
        for (rank, result) in lossy_allreduce(&members, spec, &payloads, rotation as u64 + 1)
            .into_iter()
            .enumerate()
        {
            assert_eq!(
                result,
                reference.to_bytes(),
                "rotation {rotation}, rank {rank}"
            );
        }
    }
}
