//! Schedules the NIC keeps between barriers: a start that names a kept schedule runs its steps
//! without the host posting them again, and never runs steps that another schedule, another
//! port or an earlier open of the port left behind.

use shared_abi::event::{Event, EventKind, Status};
use shared_abi::ids::BarrierId;
use shared_abi::reduce::{ReduceOp, ReduceSpec, ReduceType};
use shared_abi::schedule::Step;
use shared_abi::token::{ScheduleSource, SendKind, SendToken};

use super::*;

const TAG: u64 = 0x5eed;
/// Where a kept start's value goes: nowhere near the posted schedule.
const VALUE_AT: u64 = SCHEDULE_AT + 2048;

/// A barrier token of sequence `sequence` (job 1, group 2) whose `count` steps come from
/// `source` under `tag`, with `buffer` pointing at the posted steps or, for kept steps, at what
/// follows them.
fn start(source: ScheduleSource, count: usize, tag: u64, sequence: u32, buffer: u64) -> SendToken {
    SendToken {
        kind: SendKind::BARRIER,
        schedule: source,
        length: (count as u32).into(),
        buffer: buffer.into(),
        context: u64::from(sequence).into(),
        compare: tag.into(),
        ..SendToken::default()
    }
    .with_barrier_id(BarrierId::new(1, 2, sequence))
}

/// Posts `steps` in the arena with a start that keeps them in `slot` under `tag`.
fn keep(node: &mut Node, port: u8, steps: &[Step], slot: u8, sequence: u32) {
    node.provide_barrier_buffer(port);
    node.write_arena(port, SCHEDULE_AT, steps.as_bytes());
    let token = start(
        ScheduleSource::keep(slot),
        steps.len(),
        TAG,
        sequence,
        SCHEDULE_AT,
    );
    node.post_send(port, &token);
}

/// A start of the `count` steps kept in `slot` under `tag`.
fn run_kept(node: &mut Node, port: u8, slot: u8, count: usize, tag: u64, sequence: u32) {
    node.provide_barrier_buffer(port);
    let token = start(ScheduleSource::kept(slot), count, tag, sequence, VALUE_AT);
    node.post_send(port, &token);
}

fn outcomes(events: &[Event]) -> Vec<(EventKind, Status, u64)> {
    summary(events)
}

/// Ports 1 and 2 of one NIC keep their halves of a pairwise barrier in slot 0 by running it once.
fn kept_pair() -> Net {
    let mut net = Net::new(1);
    net.open(0, 1);
    net.open(0, 2);
    keep(&mut net[0], 1, &[exchange(0, 2, 0)], 0, 0);
    keep(&mut net[0], 2, &[exchange(0, 1, 0)], 0, 0);
    net.run();
    for port in [1, 2] {
        assert_eq!(
            outcomes(&net[0].events(port)),
            [(EventKind::BARRIER_COMPLETED, Status::SUCCESS, 0)]
        );
    }
    net
}

#[test]
fn a_kept_schedule_runs_again_though_the_arena_no_longer_holds_it() {
    let mut net = kept_pair();
    for port in [1, 2] {
        // A zeroed step is not a step: a start that read the arena would be refused.
        net[0].write_arena(port, SCHEDULE_AT, &[0; 8]);
    }
    for sequence in 1..=3 {
        run_kept(&mut net[0], 1, 0, 1, TAG, sequence);
        run_kept(&mut net[0], 2, 0, 1, TAG, sequence);
        net.run();
        for port in [1, 2] {
            assert_eq!(
                outcomes(&net[0].events(port)),
                [(
                    EventKind::BARRIER_COMPLETED,
                    Status::SUCCESS,
                    u64::from(sequence)
                )],
                "port {port}, start {sequence}"
            );
        }
    }
}

#[test]
fn a_start_naming_another_tag_count_or_slot_is_refused_and_touches_no_other_port() {
    let mut net = kept_pair();
    let refused = [
        (0, 1, TAG + 1, Status::BAD_SCHEDULE),
        (0, 2, TAG, Status::BAD_SCHEDULE),
        (1, 1, TAG, Status::BAD_SCHEDULE),
    ];
    for (sequence, &(slot, count, tag, status)) in (1..).zip(&refused) {
        run_kept(&mut net[0], 1, slot, count, tag, sequence);
        net.run();
        assert_eq!(
            outcomes(&net[0].events(1)),
            [(EventKind::TOKEN_REJECTED, status, u64::from(sequence))],
            "slot {slot}, {count} steps, tag {tag:#x}"
        );
    }
    let beyond = start(ScheduleSource(0x4f), 1, TAG, 9, VALUE_AT);
    net[0].post_send(1, &beyond);
    net.run();
    assert_eq!(
        outcomes(&net[0].events(1)),
        [(EventKind::TOKEN_REJECTED, Status::INVALID_TOKEN, 9)]
    );
    // The refusals changed nothing that was kept.
    run_kept(&mut net[0], 1, 0, 1, TAG, 10);
    run_kept(&mut net[0], 2, 0, 1, TAG, 10);
    net.run();
    for port in [1, 2] {
        assert_eq!(
            outcomes(&net[0].events(port)),
            [(EventKind::BARRIER_COMPLETED, Status::SUCCESS, 10)]
        );
    }
}

#[test]
fn kept_schedules_end_with_the_port() {
    let mut net = kept_pair();
    net.close(0, 1);
    net.open(0, 1);
    run_kept(&mut net[0], 1, 0, 1, TAG, 1);
    net.run();
    assert_eq!(
        outcomes(&net[0].events(1)),
        [(EventKind::TOKEN_REJECTED, Status::BAD_SCHEDULE, 1)]
    );
}

#[test]
fn a_kept_allreduce_reads_each_start_s_value_where_its_token_points() {
    let spec = ReduceSpec::new(ReduceOp::SUM, ReduceType::U32);
    let mut net = Net::new(1);
    net.open(0, 1);
    net.open(0, 2);
    for sequence in 0..3u32 {
        for (port, peer) in [(1u8, 2u8), (2, 1)] {
            let value = (u32::from(port) * 100 + sequence).to_le_bytes();
            let node = &mut net[0];
            node.provide_barrier_buffer(port);
            let mut token = if sequence == 0 {
                let steps = [
                    exchange(0, peer, 0).with_combine(shared_abi::schedule::StepCombine::COMBINE)
                ];
                node.write_arena(port, SCHEDULE_AT, steps.as_bytes());
                node.write_arena(port, SCHEDULE_AT + 8, &value);
                start(ScheduleSource::keep(0), 1, TAG, sequence, SCHEDULE_AT)
            } else {
                node.write_arena(port, VALUE_AT, &value);
                start(ScheduleSource::kept(0), 1, TAG, sequence, VALUE_AT)
            };
            token.size = value.len() as u8;
            token.set_reduce_spec(spec);
            node.post_send(port, &token);
        }
        net.run();
        let sum = (100 + sequence) + (200 + sequence);
        for port in [1, 2] {
            let events = net[0].events(port);
            assert_eq!(
                outcomes(&events),
                [(
                    EventKind::BARRIER_COMPLETED,
                    Status::SUCCESS,
                    u64::from(sequence)
                )]
            );
            assert_eq!(
                events[0].broadcast_data(),
                sum.to_le_bytes(),
                "start {sequence}"
            );
        }
    }
}
