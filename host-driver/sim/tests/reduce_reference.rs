//! The NIC's reductions against a host-computed reference: every operation on every type at
//! every group size from 1 to 9, each member running its allreduce schedule
//! (`nicbar_schedule::allreduce`) with the firmware's combine (`firmware::reduce::combine`) over
//! a wire that delivers in a seeded random order. Every member's result must be the bytes the
//! host computes with native arithmetic in the schedule's documented order, and so the same on
//! every member and in every run.
//!
//! `NICBAR_SIM_SEED=S` replays one wire order; the seeds are printed on failure.

use std::collections::HashMap;

use firmware::reduce::combine;
use nicbar_schedule::{Member, StepCombine, StepOp, allreduce};
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

/// One element's reference combination, in native arithmetic (`a ⊕ b`).
macro_rules! int_element {
    ($t:ty, $op:expr, $a:expr, $b:expr) => {{
        let (a, b) = (
            <$t>::from_le_bytes($a.try_into().unwrap()),
            <$t>::from_le_bytes($b.try_into().unwrap()),
        );
        let r: $t = match $op {
            ReduceOp::SUM => a.wrapping_add(b),
            ReduceOp::PROD => a.wrapping_mul(b),
            ReduceOp::MIN => a.min(b),
            ReduceOp::MAX => a.max(b),
            ReduceOp::LAND => <$t>::from(a != 0 && b != 0),
            ReduceOp::LOR => <$t>::from(a != 0 || b != 0),
            ReduceOp::LXOR => <$t>::from((a != 0) != (b != 0)),
            ReduceOp::BAND => a & b,
            ReduceOp::BOR => a | b,
            ReduceOp::BXOR => a ^ b,
            _ => unreachable!(),
        };
        r.to_le_bytes().to_vec()
    }};
}

macro_rules! float_element {
    ($t:ty, $op:expr, $a:expr, $b:expr) => {{
        let (a, b) = (
            <$t>::from_le_bytes($a.try_into().unwrap()),
            <$t>::from_le_bytes($b.try_into().unwrap()),
        );
        let r: $t = match $op {
            ReduceOp::SUM => a + b,
            ReduceOp::PROD => a * b,
            ReduceOp::MIN => {
                if b < a {
                    b
                } else {
                    a
                }
            }
            ReduceOp::MAX => {
                if b > a {
                    b
                } else {
                    a
                }
            }
            _ => unreachable!(),
        };
        r.to_le_bytes().to_vec()
    }};
}

/// `a < b` for one value of `datatype`, natively.
fn value_less(datatype: ReduceType, a: &[u8], b: &[u8]) -> bool {
    macro_rules! lt {
        ($t:ty) => {
            <$t>::from_le_bytes(a.try_into().unwrap()) < <$t>::from_le_bytes(b.try_into().unwrap())
        };
    }
    match datatype {
        ReduceType::I8 => lt!(i8),
        ReduceType::U8 => lt!(u8),
        ReduceType::I16 => lt!(i16),
        ReduceType::U16 => lt!(u16),
        ReduceType::I32 => lt!(i32),
        ReduceType::U32 => lt!(u32),
        ReduceType::I64 => lt!(i64),
        ReduceType::U64 => lt!(u64),
        ReduceType::F32 => lt!(f32),
        ReduceType::F64 => lt!(f64),
        _ => unreachable!(),
    }
}

/// `a ⊕ b` for whole payloads, natively.
fn reference_combine(spec: ReduceSpec, a: &[u8], b: &[u8]) -> Vec<u8> {
    let element = spec.element_size();
    let width = spec.datatype.size();
    let mut out = Vec::with_capacity(a.len());
    for (x, y) in a.chunks(element).zip(b.chunks(element)) {
        if spec.op.is_pairwise() {
            let (xv, yv) = (&x[..width], &y[..width]);
            let (xi, yi) = (
                i32::from_le_bytes(x[width..].try_into().unwrap()),
                i32::from_le_bytes(y[width..].try_into().unwrap()),
            );
            let better = if spec.op == ReduceOp::MINLOC {
                value_less(spec.datatype, yv, xv)
            } else {
                value_less(spec.datatype, xv, yv)
            };
            let tie = xv == yv;
            out.extend_from_slice(if better || (tie && yi < xi) { y } else { x });
            continue;
        }
        out.extend(match spec.datatype {
            ReduceType::I8 => int_element!(i8, spec.op, x, y),
            ReduceType::U8 => int_element!(u8, spec.op, x, y),
            ReduceType::I16 => int_element!(i16, spec.op, x, y),
            ReduceType::U16 => int_element!(u16, spec.op, x, y),
            ReduceType::I32 => int_element!(i32, spec.op, x, y),
            ReduceType::U32 => int_element!(u32, spec.op, x, y),
            ReduceType::I64 => int_element!(i64, spec.op, x, y),
            ReduceType::U64 => int_element!(u64, spec.op, x, y),
            ReduceType::F32 => float_element!(f32, spec.op, x, y),
            ReduceType::F64 => float_element!(f64, spec.op, x, y),
            _ => unreachable!(),
        });
    }
    out
}

/// The host's result: the schedule's documented tree — the fix-up's pairs `x_i ⊕ x_(i+p)`
/// first, then neighbours level by level, lower on the left.
fn reference(spec: ReduceSpec, inputs: &[Vec<u8>]) -> Vec<u8> {
    let members = inputs.len();
    let power = 1usize << (usize::BITS - 1 - members.leading_zeros());
    let mut level: Vec<Vec<u8>> = (0..power)
        .map(|i| match inputs.get(i + power) {
            Some(partner) => reference_combine(spec, &inputs[i], partner),
            None => inputs[i].clone(),
        })
        .collect();
    while level.len() > 1 {
        level = level
            .chunks(2)
            .map(|pair| reference_combine(spec, &pair[0], &pair[1]))
            .collect();
    }
    level.remove(0)
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
                let expected = reference(spec, &inputs);
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
