//! The host's reference for the NIC's reductions: the same operations in native Rust arithmetic,
//! combined in the order `nicbar_schedule::allreduce` documents. It shares no code with
//! `firmware::reduce`, so a disagreement between the two is a bug in one of them.

use shared_abi::reduce::{ReduceOp, ReduceSpec, ReduceType};

/// One integer element's `a ⊕ b`, natively.
macro_rules! int_element {
    ($t:ty, $op:expr, $a:expr, $b:expr) => {{
        let (a, b) = (
            <$t>::from_le_bytes($a.try_into().expect("one element")),
            <$t>::from_le_bytes($b.try_into().expect("one element")),
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
            other => panic!("{other:?} is not an operation on integers"),
        };
        r.to_le_bytes().to_vec()
    }};
}

/// One floating-point element's `a ⊕ b`, natively (`MIN`/`MAX` keep the left operand unless the
/// right one compares strictly smaller/greater, as MPI leaves NaN to the implementation).
macro_rules! float_element {
    ($t:ty, $op:expr, $a:expr, $b:expr) => {{
        let (a, b) = (
            <$t>::from_le_bytes($a.try_into().expect("one element")),
            <$t>::from_le_bytes($b.try_into().expect("one element")),
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
            other => panic!("{other:?} is not an operation on floating point"),
        };
        r.to_le_bytes().to_vec()
    }};
}

/// `a < b` for one value of `datatype`, natively.
fn value_less(datatype: ReduceType, a: &[u8], b: &[u8]) -> bool {
    macro_rules! lt {
        ($t:ty) => {
            <$t>::from_le_bytes(a.try_into().expect("one value"))
                < <$t>::from_le_bytes(b.try_into().expect("one value"))
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
        other => panic!("unknown type {other:?}"),
    }
}

/// `a ⊕ b` for whole payloads (the same length, whole elements of `spec`), natively.
///
/// # Panics
/// If `spec` is not one the NIC combines, or the payloads are not whole elements.
pub fn combine(spec: ReduceSpec, a: &[u8], b: &[u8]) -> Vec<u8> {
    let element = spec.element_size();
    let width = spec.datatype.size();
    let mut out = Vec::with_capacity(a.len());
    for (x, y) in a.chunks(element).zip(b.chunks(element)) {
        if spec.op.is_pairwise() {
            let (xv, yv) = (&x[..width], &y[..width]);
            let (xi, yi) = (
                i32::from_le_bytes(x[width..].try_into().expect("an index")),
                i32::from_le_bytes(y[width..].try_into().expect("an index")),
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
            other => panic!("unknown type {other:?}"),
        });
    }
    out
}

/// The allreduce of `inputs` (one payload per member, in rank order) in the schedule's
/// documented tree: the non-power-of-two fix-up's pairs `x_i ⊕ x_(i+p)` first (`p` the largest
/// power of two not above the group's size), then neighbours level by level, lower on the left.
///
/// # Panics
/// If `inputs` is empty, or as [`combine`].
pub fn allreduce(spec: ReduceSpec, inputs: &[Vec<u8>]) -> Vec<u8> {
    let members = inputs.len();
    assert!(members > 0, "an allreduce of nobody");
    let power = 1usize << (usize::BITS - 1 - members.leading_zeros());
    let mut level: Vec<Vec<u8>> = (0..power)
        .map(|i| match inputs.get(i + power) {
            Some(partner) => combine(spec, &inputs[i], partner),
            None => inputs[i].clone(),
        })
        .collect();
    while level.len() > 1 {
        level = level
            .chunks(2)
            .map(|pair| combine(spec, &pair[0], &pair[1]))
            .collect();
    }
    level.remove(0)
}
