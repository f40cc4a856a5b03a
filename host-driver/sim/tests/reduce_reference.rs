//! The NIC's reductions against a host-computed reference: every operation on every type at
//! every group size from 1 to 9, each member running its allreduce schedule
//! (`nicbar_schedule::allreduce`) with the firmware's combine (`firmware::reduce::combine`) over
//! a wire that delivers in a seeded random order. Every member's result must be the bytes the
//! host computes with native arithmetic in the schedule's documented order
//! (`nicbar_sim::reductions::reference`), and so the same on
//! every member and in every run.
//!
//! `NICBAR_SIM_SEED=S` replays one wire order; the seeds are printed on failure.

use std::collections::HashMap;

use firmware::reduce::combine;
use nicbar_schedule::{Member, StepCombine, StepOp, allreduce};
use nicbar_sim::reductions::reference;
use shared_abi::ids::{NodeId, PortId};
use shared_abi::reduce::{REDUCE_MAX, ReduceOp, ReduceSpec, ReduceType};
use shared_abi::schedule::{MAX_SCHEDULE_STEPS, Step};

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Runs the allreduce of `inputs` (one payload per member) through every member's schedule
/// with the firmware's combine; returns each member's result.
fn run_in_nics(spec: ReduceSpec, inputs: &[Vec<u8>], seed: u64) -> Vec<Vec<u8>> {
    let members = inputs.len();
    if members == 1 {
        return inputs.to_vec();
    }
    let group: Vec<Member> = (0..members)
        .map(|n| Member::new(NodeId::new(n as u16), PortId(1)))
        .collect();
    let schedules: Vec<Vec<Step>> = (0..members)
        .map(|rank| {
            let mut steps = vec![Step::default(); MAX_SCHEDULE_STEPS];
            let count = allreduce(&group, rank, &mut steps).unwrap();
            steps.truncate(count);
            steps
        })
        .collect();
    let mut values = inputs.to_vec();
    let mut at = vec![0usize; members];
    let mut sent = vec![false; members];
    let mut wire: Vec<(usize, usize, u8, Vec<u8>)> = Vec::new();
    let mut arrived: HashMap<(usize, usize, u8), Vec<u8>> = HashMap::new();
    let mut rng = Rng(seed);
    loop {
        let mut moved = false;
        for rank in 0..members {
            let Some(step) = schedules[rank].get(at[rank]).copied() else {
                continue;
            };
            let peer = usize::from(step.node.get());
            if (step.op == StepOp::SEND || step.op == StepOp::EXCHANGE) && !sent[rank] {
                wire.push((rank, peer, step.round, values[rank].clone()));
                sent[rank] = true;
                moved = true;
                if step.op == StepOp::SEND {
                    at[rank] += 1;
                    sent[rank] = false;
                    continue;
                }
            }
            if let Some(theirs) = arrived.remove(&(peer, rank, step.round)) {
                let mine = values[rank].clone();
                if step.combine.contains(StepCombine::REPLACE) {
                    values[rank] = theirs;
                } else {
                    let (left, right) = if step.combine.contains(StepCombine::PEER_LEFT) {
                        (&theirs, &mine)
                    } else {
                        (&mine, &theirs)
                    };
                    combine(spec, left, right, &mut values[rank]).unwrap();
                }
                at[rank] += 1;
                sent[rank] = false;
                moved = true;
            }
        }
        if !wire.is_empty() {
            let pick = (rng.next() % wire.len() as u64) as usize;
            let (from, to, round, value) = wire.remove(pick);
            arrived.insert((from, to, round), value);
            moved = true;
        }
        if !moved {
            break;
        }
    }
    assert!((0..members).all(|rank| at[rank] == schedules[rank].len()));
    values
}

/// A member's payload: values that cover signs, zero, one and extremes, and (for pairs) the
/// member's rank as the index, ties made likely by a small value range.
fn payload(spec: ReduceSpec, rank: usize, rng: &mut Rng) -> Vec<u8> {
    let width = spec.datatype.size();
    let element = spec.element_size();
    let count = REDUCE_MAX / element;
    let mut bytes = Vec::new();
    for _ in 0..count {
        let value: Vec<u8> = match spec.datatype {
            ReduceType::F32 => ((rng.next() % 2001) as f32 / 8.0 - 125.0)
                .to_le_bytes()
                .to_vec(),
            ReduceType::F64 => ((rng.next() % 2_000_001) as f64 / 1024.0 - 977.0)
                .to_le_bytes()
                .to_vec(),
            _ => {
                let raw = match rng.next() % 6 {
                    0 => 0,
                    1 => 1,
                    2 => u64::MAX,
                    3 => rng.next() % 4,
                    _ => rng.next(),
                };
                raw.to_le_bytes()[..width].to_vec()
            }
        };
        bytes.extend(value);
        if spec.op.is_pairwise() {
            bytes.extend((rank as i32).to_le_bytes());
        }
    }
    bytes
}

#[test]
fn every_operation_on_every_type_at_1_to_9_members_matches_the_host_on_every_member() {
    let seed: u64 = std::env::var("NICBAR_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let mut rng = Rng(seed);
    let mut cases = 0;
    for op in ReduceOp::ALL {
        for datatype in ReduceType::ALL {
            let spec = ReduceSpec::new(op, datatype);
            if spec.check(spec.element_size()).is_err() {
                continue;
            }
            for members in 1..=9 {
                let inputs: Vec<Vec<u8>> = (0..members)
                    .map(|rank| payload(spec, rank, &mut rng))
                    .collect();
                let expected = reference::allreduce(spec, &inputs);
                for run in 0..3 {
                    let wire_seed = rng.next();
                    let results = run_in_nics(spec, &inputs, wire_seed);
                    for (rank, result) in results.iter().enumerate() {
                        assert_eq!(
                            result, &expected,
                            "{op:?} on {datatype:?}, {members} members, rank {rank}, run {run} \
                             (seed {seed}, wire seed {wire_seed})"
                        );
                    }
                }
                cases += 1;
            }
        }
    }
    // (10 integer-only or any-type operations: 10 on 8 integer types, SUM PROD MIN MAX on 2
    // floating-point ones) plus MINLOC and MAXLOC on all 10, at 9 sizes.
    assert_eq!(cases, (10 * 8 + 4 * 2 + 2 * 10) * 9);
}
