//! The barrier engine against the ports and the wire (the campaigns are the simulator's; these
//! pin down the contract, and the paper's §3.2 story).

use core::time::Duration;

use shared_abi::event::{Event, EventKind, Status};
use shared_abi::ids::{BarrierId, NodeId, PortId};
use shared_abi::packet::PacketKind;
use shared_abi::schedule::{Step, StepOp};
use shared_abi::token::SendKind;

use super::*;

fn completed(events: &[Event]) -> Vec<u64> {
    of_kind(events, EventKind::BARRIER_COMPLETED)
        .iter()
        .map(|e| e.context.get())
        .collect()
}

/// Asserts that `events` are one failure, of the barrier whose context is `context`, for
/// `status`, naming port `member.1` of node `member.0` as the member it waited for; `why` says
/// what the caller pins.
#[track_caller]
fn assert_failed_naming(
    events: &[Event],
    context: u64,
    status: Status,
    member: (u16, u8),
    why: &str,
) {
    assert_eq!(
        summary(events),
        [(EventKind::BARRIER_FAILED, status, context)],
        "{why}"
    );
    assert_eq!(
        (events[0].peer_node, events[0].peer_port),
        (NodeId::new(member.0), PortId(member.1)),
        "{why}"
    );
}

#[test]
fn a_two_node_pairwise_exchange_completes_on_both_with_the_token_context() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 1);
    net[0].start_barrier(1, &[exchange(1, 1, 0)], 0xa, 0);
    net[1].start_barrier(1, &[exchange(0, 1, 0)], 0xb, 0);

    let carried = net.run();

    assert_eq!(
        summary(&net[0].events(1)),
        [(EventKind::BARRIER_COMPLETED, Status::SUCCESS, 0xa)]
    );
    assert_eq!(
        summary(&net[1].events(1)),
        [(EventKind::BARRIER_COMPLETED, Status::SUCCESS, 0xb)]
    );
    assert_eq!(
        carried
            .iter()
            .filter(|p| p.kind() == PacketKind::BARRIER)
            .count(),
        2,
        "one barrier packet each way"
    );
    assert_eq!(net[0].nic.counters().barriers_completed, 1);
    assert!(!net[0].nic.port_status(PortId(1)).unwrap().barrier_running);
}

#[test]
fn a_barrier_token_without_a_barrier_buffer_or_during_a_barrier_is_rejected_busy() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net[0].post_barrier_token(1, &[exchange(1, 1, 0)], 0x51, 0);
    net.poll(0);

    let events = net[0].events(1);
    assert_eq!(
        summary(&events),
        [(EventKind::TOKEN_REJECTED, Status::BARRIER_BUSY, 0x51)]
    );
    assert_eq!(events[0].detail.get(), u32::from(SendKind::BARRIER.0));
    assert!(!net[0].nic.port_status(PortId(1)).unwrap().barrier_running);

    net[0].start_barrier(1, &[exchange(1, 1, 0)], 0x52, 0);
    net.poll(0);
    assert!(net[0].events(1).is_empty());
    net[0].start_barrier(1, &[exchange(1, 1, 0)], 0x53, 0);
    net.poll(0);
    assert_eq!(
        summary(&net[0].events(1)),
        [(EventKind::TOKEN_REJECTED, Status::BARRIER_BUSY, 0x53)],
        "one barrier of one identity at a time per port"
    );
}

#[test]
fn barriers_of_two_groups_complete_whatever_order_their_members_start_them_in() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 1);
    let group_a = BarrierId::new(5, 0xa, 0);
    let group_b = BarrierId::new(5, 0xb, 0);
    // Node 0 starts A then B; node 1 starts B then A (MPI orders collectives per communicator
    // only). Each token is taken before the next is written over the same schedule buffer.
    net[0].start_barrier_of(1, &[exchange(1, 1, 0)], 0xa0, 0, group_a);
    net.run();
    net[0].start_barrier_of(1, &[exchange(1, 1, 0)], 0xb0, 0, group_b);
    net.run();
    net[1].start_barrier_of(1, &[exchange(0, 1, 0)], 0xb1, 0, group_b);
    net.run();
    assert!(net[0].nic.port_status(PortId(1)).unwrap().barrier_running);
    net[1].start_barrier_of(1, &[exchange(0, 1, 0)], 0xa1, 0, group_a);
    net.run();

    let mut at_0 = completed(&net[0].events(1));
    at_0.sort_unstable();
    assert_eq!(at_0, [0xa0, 0xb0]);
    let mut at_1 = completed(&net[1].events(1));
    at_1.sort_unstable();
    assert_eq!(at_1, [0xa1, 0xb1]);
    assert!(!net[0].nic.port_status(PortId(1)).unwrap().barrier_running);
    assert_eq!(net[0].nic.counters().barriers_completed, 2);
}

#[test]
fn a_port_runs_as_many_barriers_as_it_has_barrier_buffers_and_refuses_one_more() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 1);
    let running = crate::port::RUNNING_BARRIERS as u32;
    for group in 0..running {
        net[0].start_barrier_of(
            1,
            &[exchange(1, 1, 0)],
            u64::from(group),
            0,
            BarrierId::new(5, group, 0),
        );
        net.run();
    }
    assert!(net[0].events(1).is_empty(), "every one runs");
    // One more barrier buffer than the port may hold waits in the receive ring: the token finds
    // no buffer of its own.
    net[0].start_barrier_of(
        1,
        &[exchange(1, 1, 0)],
        0xff,
        0,
        BarrierId::new(5, running, 0),
    );
    net.run();
    assert_eq!(
        summary(&net[0].events(1)),
        [(EventKind::TOKEN_REJECTED, Status::BARRIER_BUSY, 0xff)]
    );
    // Node 1 enters them in the opposite order: all complete.
    for group in (0..running).rev() {
        net[1].start_barrier_of(
            1,
            &[exchange(0, 1, 0)],
            u64::from(group),
            0,
            BarrierId::new(5, group, 0),
        );
        net.run();
    }
    let mut at_0 = completed(&net[0].events(1));
    at_0.sort_unstable();
    assert_eq!(at_0, (0..u64::from(running)).collect::<Vec<_>>());
}

#[test]
fn of_two_running_barriers_the_one_whose_member_is_missing_fails_naming_it() {
    let mut net = Net::new(3);
    net.open(0, 1);
    net.open(1, 1);
    net.open(2, 1);
    let with_1 = BarrierId::new(5, 0x1, 0);
    let with_2 = BarrierId::new(5, 0x2, 0);
    // Node 0 waits for node 2 (which never enters) and for node 1 (which enters): the first
    // fails naming node 2, the second completes.
    net[0].start_barrier_of(1, &[exchange(2, 1, 0)], 0x2, 1000, with_2);
    net.run();
    net[0].start_barrier_of(1, &[exchange(1, 1, 0)], 0x1, 1000, with_1);
    net.run();
    net.run_for(Duration::from_micros(200));
    net[1].start_barrier_of(1, &[exchange(0, 1, 0)], 0x11, 0, with_1);
    net.run_for(Duration::from_millis(5));

    let events = net[0].events(1);
    assert_eq!(
        summary(&events),
        [
            (EventKind::BARRIER_COMPLETED, Status::SUCCESS, 0x1),
            (EventKind::BARRIER_FAILED, Status::BARRIER_TIMED_OUT, 0x2)
        ]
    );
    assert_eq!(
        (events[1].peer_node, events[1].peer_port),
        (NodeId::new(2), PortId(1)),
        "the member really missing"
    );
    assert_eq!(completed(&net[1].events(1)), [0x11]);
}

#[test]
fn two_ports_of_one_nic_complete_a_barrier_with_no_packet_on_the_wire() {
    let mut net = Net::new(1);
    net.open(0, 1);
    net.open(0, 2);
    net[0].start_barrier(1, &[exchange(0, 2, 0)], 1, 0);
    net.run();
    assert!(net[0].events(1).is_empty(), "waits for port 2");
    net[0].start_barrier(2, &[exchange(0, 1, 0)], 2, 0);

    net.run_for(Duration::from_millis(10));

    assert_eq!(completed(&net[0].events(1)), [1]);
    assert_eq!(completed(&net[0].events(2)), [2]);
    assert_eq!(
        net[0].wire().transmitted,
        0,
        "paper §3.4: a flag, not a packet"
    );
}

/// Paper §3.2: A (node 0 port 1) sends its barrier packet to B (node 1 port 1), which is open but
/// has not started its barrier, so it is recorded as unexpected; B dies; A dies; A' and B' open
/// the same ports. B' must not take A's old packet for A''s. The wire runs quiet after each
/// death: the paper's precondition is that no old message is in the channel when a process
/// starts.
#[test]
fn a_barrier_packet_from_a_dead_process_does_not_complete_its_successor_s_peer() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 1);
    net[0].start_barrier(1, &[exchange(1, 1, 0)], 0xa, 0);
    let carried = net.run();
    assert!(
        carried
            .iter()
            .any(|p| p.kind() == PacketKind::BARRIER && p.to == NodeId::new(1))
    );
    net.close(1, 1); // B dies
    net.run();
    let events = net[0].events(1);
    assert_eq!(
        summary(&events),
        [(EventKind::BARRIER_FAILED, Status::TARGET_PORT_CLOSED, 0xa)],
        "A learns that B is gone"
    );
    net.close(0, 1); // A dies
    net.run();
    net.open(0, 1); // A'
    net.open(1, 1); // B'

    net[1].start_barrier(1, &[exchange(0, 1, 0)], 0xb2, 0);
    net.run_for(Duration::from_millis(50));

    assert_eq!(
        completed(&net[1].events(1)),
        [0u64; 0],
        "B' must wait for A'"
    );
    let status = net[1].nic.port_status(PortId(1)).unwrap();
    assert!(status.barrier_running);
    let progress = status
        .barrier
        .expect("the status shows the running barrier");
    assert_eq!((progress.step, progress.steps), (0, 1));
    assert_eq!(
        progress.waiting_for,
        Some((NodeId::new(0), PortId(1), 0)),
        "the status names the member the barrier waits for"
    );

    net[0].start_barrier(1, &[exchange(1, 1, 0)], 0xa2, 0);
    net.run_for(Duration::from_millis(50));
    assert_eq!(completed(&net[0].events(1)), [0xa2]);
    assert_eq!(completed(&net[1].events(1)), [0xb2]);
}

#[test]
fn a_barrier_packet_to_a_port_not_yet_open_is_retried_until_the_port_opens() {
    // Paper §3.2: a program's first act may be a barrier, before its peers have opened.
    let mut net = Net::new(2);
    net.open(0, 1);
    net[0].start_barrier(1, &[exchange(1, 1, 0)], 0xa, 0);
    net.run_for(Duration::from_millis(20));
    assert!(net[0].events(1).is_empty());

    net.open(1, 1);
    net[1].start_barrier(1, &[exchange(0, 1, 0)], 0xb, 0);
    net.run_for(Duration::from_millis(20));

    assert_eq!(completed(&net[0].events(1)), [0xa]);
    assert_eq!(completed(&net[1].events(1)), [0xb]);
}

#[test]
fn a_barrier_whose_peer_port_closes_fails_naming_that_node_and_port() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 3);
    net[0].start_barrier(1, &[exchange(1, 3, 0)], 0xc, 0);
    net.run();
    assert!(net[0].events(1).is_empty());

    net.close(1, 3);
    net.run_for(Duration::from_millis(10));

    let events = net[0].events(1);
    assert_failed_naming(
        &events,
        0xc,
        Status::TARGET_PORT_CLOSED,
        (1, 3),
        "the member whose port closed",
    );
    assert!(!net[0].nic.port_status(PortId(1)).unwrap().barrier_running);
}

#[test]
fn a_barrier_past_its_timeout_ends_with_barrier_timed_out() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 1);
    net[0].start_barrier(1, &[exchange(1, 1, 0)], 0xd, 1000);
    let start = net.now;

    net.run_until(start.saturating_add(Duration::from_micros(1000) - Duration::from_nanos(1)));
    assert!(net[0].events(1).is_empty(), "not before the timeout");
    net.run_until(start.saturating_add(Duration::from_micros(1000)));

    let events = net[0].events(1);
    assert_failed_naming(
        &events,
        0xd,
        Status::BARRIER_TIMED_OUT,
        (1, 1),
        "the member it waited for",
    );
    assert_eq!(net[0].nic.counters().barriers_failed, 1);
}

#[test]
fn a_barrier_waiting_on_a_silent_node_fails_with_target_node_unreachable() {
    let mut net = Net::new(2);
    net[1].silent = true;
    let config = *net[0].nic.config();
    net.open(0, 1);
    net[0].start_barrier(1, &[exchange(1, 1, 0)], 0xe, 0);

    net.run_for(config.give_up_after + config.retransmit_timeout * 32);

    let events = net[0].events(1);
    assert_failed_naming(
        &events,
        0xe,
        Status::TARGET_NODE_UNREACHABLE,
        (1, 1),
        "the silent node",
    );
}

/// Barrier `sequence` of group 1 in job 5.
fn nth(sequence: u32) -> BarrierId {
    BarrierId::new(5, 1, sequence)
}

#[test]
fn a_failed_barriers_straggler_never_completes_the_next_barrier() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 1);
    // Node 0 enters barrier 0 and gives up on node 1, which enters it only afterwards: node 1
    // completes it (node 0 did enter), and node 1's packet of barrier 0 reaches node 0 late.
    net[0].start_barrier_of(1, &[exchange(1, 1, 0)], 0xa0, 1000, nth(0));
    net.run_for(Duration::from_micros(1000));
    assert_eq!(
        summary(&net[0].events(1)),
        [(EventKind::BARRIER_FAILED, Status::BARRIER_TIMED_OUT, 0xa0)]
    );
    net[1].start_barrier_of(1, &[exchange(0, 1, 0)], 0xb0, 0, nth(0));
    net.run();
    assert_eq!(
        summary(&net[1].events(1)),
        [(EventKind::BARRIER_COMPLETED, Status::SUCCESS, 0xb0)]
    );

    // Node 0's barrier 1 must not take that straggler: node 1 has not entered barrier 1.
    net[0].start_barrier_of(1, &[exchange(1, 1, 0)], 0xa1, 0, nth(1));
    net.run();
    assert!(
        net[0].events(1).is_empty(),
        "barrier 1 completed before its peer entered it"
    );
    net[1].start_barrier_of(1, &[exchange(0, 1, 0)], 0xb1, 0, nth(1));
    net.run();
    assert_eq!(completed(&net[0].events(1)), [0xa1]);
    assert_eq!(completed(&net[1].events(1)), [0xb1]);
}

#[test]
fn a_packet_of_another_group_completes_nothing() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 1);
    let group_x = BarrierId::new(5, 0x10, 0);
    let group_y = BarrierId::new(5, 0x20, 0);
    net[1].start_barrier_of(1, &[exchange(0, 1, 0)], 0xb, 0, group_x);
    net[0].start_barrier_of(1, &[exchange(1, 1, 0)], 0xa, 1000, group_y);
    net.run_for(Duration::from_micros(1000));
    assert_eq!(
        summary(&net[0].events(1)),
        [(EventKind::BARRIER_FAILED, Status::BARRIER_TIMED_OUT, 0xa)],
        "group Y's barrier must not complete on group X's packet"
    );
    assert!(net[1].events(1).is_empty());
    // Group X's packet is still waiting for node 0's barrier of group X.
    net[0].start_barrier_of(1, &[exchange(1, 1, 0)], 0xc, 0, group_x);
    net.run();
    assert_eq!(completed(&net[0].events(1)), [0xc]);
    assert_eq!(completed(&net[1].events(1)), [0xb]);
}

/// A gather-broadcast of two, port 1 at both nodes: the root's steps (receive from the leaf,
/// then release it) and the leaf's.
fn gather_broadcast_of_two(leaf: u16, root: u16) -> ([Step; 2], [Step; 2]) {
    let step = |op, node, round| Step::new(op, NodeId::new(node), PortId(1), round);
    (
        [step(StepOp::RECV, leaf, 0), step(StepOp::SEND, leaf, 1)],
        [step(StepOp::SEND, root, 0), step(StepOp::RECV, root, 1)],
    )
}

#[test]
fn a_port_gone_for_good_fails_its_jobs_late_peer_at_once() {
    let mut net = Net::new(2);
    net.open(0, 1);
    net.open(1, 1);
    // Node 1's process runs barriers of job 5 (a gather-broadcast rooted at it), gives up on
    // node 0 (not there yet) before it sent anything, and exits.
    let (root, leaf) = gather_broadcast_of_two(0, 1);
    net[1].start_barrier_of(1, &root, 0xb, 1000, nth(0));
    net.run_for(Duration::from_micros(1000));
    assert_eq!(net[1].nic.counters().barriers_failed, 1);
    net.close(1, 1);
    net.run();
    // Node 0's process of job 5 enters late: told at once, not at its 10 s timeout.
    let start = net.now;
    net[0].start_barrier_of(1, &leaf, 0xa, 10_000_000, nth(0));
    net.run_for(Duration::from_millis(10));
    let events = net[0].events(1);
    assert_failed_naming(
        &events,
        0xa,
        Status::TARGET_PORT_CLOSED,
        (1, 1),
        "the member gone for good",
    );
    assert!(net.now.saturating_since(start) <= Duration::from_millis(10));
    assert_eq!(net[1].nic.counters().barrier_targets_gone, 0);
    assert_eq!(net[0].nic.counters().barrier_targets_gone, 1);

    // Another job still waits for a late opener (§3.2): the port's next owner completes it.
    let other_job = BarrierId::new(6, 1, 0);
    net[0].start_barrier_of(1, &[exchange(1, 1, 0)], 0xa2, 10_000_000, other_job);
    net.run_for(Duration::from_millis(10));
    assert!(net[0].events(1).is_empty(), "job 6 waits for its member");
    net.open(1, 1);
    net[1].start_barrier_of(1, &[exchange(0, 1, 0)], 0xb2, 0, other_job);
    net.run_for(Duration::from_millis(10));
    assert_eq!(completed(&net[0].events(1)), [0xa2]);
    assert_eq!(completed(&net[1].events(1)), [0xb2]);
}

#[test]
fn a_local_port_gone_for_good_fails_its_jobs_late_peer_at_once() {
    let mut net = Net::new(1);
    net.open(0, 1);
    net.open(0, 2);
    let (root, leaf) = gather_broadcast_of_two(0, 0);
    let on_port = |steps: [Step; 2], port| {
        steps.map(|step| Step {
            port: PortId(port),
            ..step
        })
    };
    net[0].start_barrier_of(2, &on_port(root, 1), 0xb, 1000, nth(0));
    net.run_for(Duration::from_micros(1000));
    net.close(0, 2);
    net[0].start_barrier_of(1, &on_port(leaf, 2), 0xa, 10_000_000, nth(0));
    net.run_for(Duration::from_millis(1));
    let events = net[0].events(1);
    assert_eq!(
        summary(&events),
        [(EventKind::BARRIER_FAILED, Status::TARGET_PORT_CLOSED, 0xa)]
    );
    assert_eq!(events[0].peer_port, PortId(2));
}

#[test]
fn a_failure_reaches_every_member_still_waiting_naming_the_member_that_is_missing() {
    let step = |op, node: u16, round| Step::new(op, NodeId::new(node), PortId(1), round);
    let mut net = Net::new(3);
    net.open(0, 1);
    net.open(1, 1);
    // A gather-broadcast of three: node 0 gathers from 1 and 2, then releases them. Node 2 never
    // enters. Node 0 gives up on it after 1 ms; node 1 would wait 10 s for node 0.
    let root = [
        step(StepOp::RECV, 1, 0),
        step(StepOp::RECV, 2, 0),
        step(StepOp::SEND, 1, 1),
        step(StepOp::SEND, 2, 1),
    ];
    let leaf = [step(StepOp::SEND, 0, 0), step(StepOp::RECV, 0, 1)];
    net[0].start_barrier_of(1, &root, 0xa, 1000, nth(0));
    net[1].start_barrier_of(1, &leaf, 0xb, 10_000_000, nth(0));
    net.run_for(Duration::from_millis(5));

    let root_events = net[0].events(1);
    assert_eq!(
        summary(&root_events),
        [(EventKind::BARRIER_FAILED, Status::BARRIER_TIMED_OUT, 0xa)]
    );
    let leaf_events = net[1].events(1);
    assert_eq!(
        summary(&leaf_events),
        [(EventKind::BARRIER_FAILED, Status::BARRIER_TIMED_OUT, 0xb)],
        "the leaf learns of the failure from the root, long before its own timeout"
    );
    for events in [&root_events, &leaf_events] {
        assert_eq!(
            (events[0].peer_node, events[0].peer_port),
            (NodeId::new(2), PortId(1)),
            "every member names the member that never came, not the neighbour that gave up"
        );
    }
}

#[test]
fn a_late_member_names_the_member_that_never_came_not_one_that_entered_and_exited() {
    // Pairwise exchange of four (each node's port 1): round 0 with node ^ 1, round 1 with
    // node ^ 2. Node 2 dies between barriers; nodes 1 and 3 enter the next one, fail and exit
    // before node 0 enters it. Node 1 had sent node 0 its packet of round 0: it entered.
    let schedule = |node: u16| [exchange(node ^ 1, 1, 0), exchange(node ^ 2, 1, 1)];
    let mut net = Net::new(4);
    for node in 0..4 {
        net.open(node, 1);
    }
    for node in 0..4 {
        net[node].start_barrier_of(1, &schedule(node), 0x10, 10_000_000, nth(0));
    }
    net.run();
    for node in 0..4 {
        assert_eq!(completed(&net[node].events(1)), [0x10]);
    }
    net.close(2, 1);
    net.run();
    for node in [1, 3] {
        net[node].start_barrier_of(1, &schedule(node), 0x11, 10_000_000, nth(1));
    }
    net.run_for(Duration::from_millis(1));
    for node in [1, 3] {
        let events = net[node].events(1);
        let why = std::format!("node {node}");
        assert_failed_naming(&events, 0x11, Status::TARGET_PORT_CLOSED, (2, 1), &why);
        net.close(node, 1);
    }
    net.run();

    net[0].start_barrier_of(1, &schedule(0), 0xa, 10_000_000, nth(1));
    net.run_for(Duration::from_millis(10));
    assert_failed_naming(
        &net[0].events(1),
        0xa,
        Status::TARGET_PORT_CLOSED,
        (2, 1),
        "told at once, and node 1 entered this barrier before it exited: node 2 is the member \
         that never came",
    );
}

#[test]
fn a_port_that_closes_right_after_its_barrier_failed_still_sends_the_abort_it_owes() {
    // Node 1 receives from node 2, then releases node 0. Node 2 exits; node 1's barrier fails
    // on the notice, and node 1's process exits at once — before the NIC's next poll, which
    // would have sent node 0 the abort. The close sends it first: node 0 names node 2, not
    // node 1.
    let step = |op, node: u16, round| Step::new(op, NodeId::new(node), PortId(1), round);
    let mut net = Net::new(3);
    for node in 0..3 {
        net.open(node, 1);
    }
    net[0].start_barrier_of(1, &[step(StepOp::RECV, 1, 1)], 0xa, 10_000_000, nth(0));
    let middle = [step(StepOp::EXCHANGE, 2, 0), step(StepOp::SEND, 0, 1)];
    net[1].start_barrier_of(1, &middle, 0xb, 10_000_000, nth(0));
    net.run();
    net.close(2, 1);
    let now = net.now;
    for packet in net.poll(2) {
        net[1].nic.on_packet(&packet.bytes, now);
    }
    let why = "node 1's own barrier";
    assert_failed_naming(
        &net[1].events(1),
        0xb,
        Status::TARGET_PORT_CLOSED,
        (2, 1),
        why,
    );
    net.close(1, 1);
    net.run();
    assert_failed_naming(
        &net[0].events(1),
        0xa,
        Status::TARGET_PORT_CLOSED,
        (2, 1),
        "node 0 learns at once (node 1 had sent it nothing: no close notice would come), and \
         names the member that left first, not the one that passed the news on",
    );
}
