//! Combining reduction payloads in the NIC: `out = left ⊕ right`, element by element, for the
//! operations and types of [`shared_abi::reduce`]. No heap, no panic, no floating-point
//! environment: the same bytes in give the same bytes out on every NIC.
//!
//! The order of the operands is the caller's: a schedule that combines in a fixed order (the
//! lower-ranked block's value on the left, whatever arrived first) gives every member the same
//! bits. Integers wrap; `MIN` and `MAX` on floating point keep the left operand unless the right
//! one compares strictly smaller (greater), so a NaN on the left stays and one on the right is
//! passed over, the same way every time; `MINLOC` and `MAXLOC` break ties by the smaller index.
//! A reproducible sum's accumulators merge exactly, so for it the order does not matter at all.

use shared_abi::reduce::{ReduceOp, ReduceRefusal, ReduceSpec, ReduceType};
use shared_abi::reproducible::ReproducibleSum;

/// Writes `left ⊕ right` into `out` (all three the same length).
///
/// # Errors
/// [`ReduceRefusal`]: the operation or type is unknown or not defined together, or the lengths
/// differ, are zero, too long or not whole elements. `out` is untouched then.
pub fn combine(
    spec: ReduceSpec,
    left: &[u8],
    right: &[u8],
    out: &mut [u8],
) -> Result<(), ReduceRefusal> {
    spec.check(out.len())?;
    if left.len() != out.len() || right.len() != out.len() {
        return Err(ReduceRefusal::BadLength(left.len().max(right.len())));
    }
    if spec.op == ReduceOp::SUM_REPRODUCIBLE {
        // Accumulators, merged exactly, in integers.
        let (Some(mut sum), Some(other)) = (
            ReproducibleSum::from_bytes(left),
            ReproducibleSum::from_bytes(right),
        ) else {
            return Err(ReduceRefusal::BadLength(out.len()));
        };
        sum.merge(&other);
        out.copy_from_slice(&sum.to_bytes());
        return Ok(());
    }
    let element = spec.element_size();
    let width = spec.datatype.size();
    if element == 0 {
        // `check` refused it already; said again so that no zero-size chunking (a panic path)
        // is linked.
        return Err(ReduceRefusal::UnknownType(spec.datatype.0));
    }
    for ((l, r), o) in left
        .chunks_exact(element)
        .zip(right.chunks_exact(element))
        .zip(out.chunks_exact_mut(element))
    {
        if spec.op.is_pairwise() {
            combine_pair(spec, width, l, r, o);
        } else {
            write(o, combine_value(spec, read(l), read(r)));
        }
    }
    Ok(())
}

/// The element `bytes` (little-endian, at most 8 of them), zero-extended.
fn read(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    for (to, from) in word.iter_mut().zip(bytes) {
        *to = *from;
    }
    u64::from_le_bytes(word)
}

/// Writes the low `out.len()` bytes of `value`, little-endian.
fn write(out: &mut [u8], value: u64) {
    for (to, from) in out.iter_mut().zip(value.to_le_bytes()) {
        *to = from;
    }
}

/// `a` sign-extended from `width` bytes.
fn signed(a: u64, width: usize) -> i64 {
    let shift = 64u32.saturating_sub(8 * width as u32).min(63);
    ((a << shift) as i64) >> shift
}

/// Whether element `a` is strictly less than `b` (both raw, of `datatype`).
fn less(datatype: ReduceType, a: u64, b: u64) -> bool {
    match datatype {
        ReduceType::F32 => f32::from_bits(a as u32) < f32::from_bits(b as u32),
        ReduceType::F64 => f64::from_bits(a) < f64::from_bits(b),
        t if t.is_signed() => signed(a, t.size()) < signed(b, t.size()),
        _ => a < b,
    }
}

/// `a ⊕ b` for one element (raw bits, zero-extended; the caller keeps the element's width).
fn combine_value(spec: ReduceSpec, a: u64, b: u64) -> u64 {
    let datatype = spec.datatype;
    match spec.op {
        ReduceOp::MIN => {
            if less(datatype, b, a) {
                b
            } else {
                a
            }
        }
        ReduceOp::MAX => {
            if less(datatype, a, b) {
                b
            } else {
                a
            }
        }
        ReduceOp::SUM | ReduceOp::PROD if datatype == ReduceType::F32 => {
            let (x, y) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
            let z = if spec.op == ReduceOp::SUM {
                x + y
            } else {
                x * y
            };
            u64::from(z.to_bits())
        }
        ReduceOp::SUM | ReduceOp::PROD if datatype == ReduceType::F64 => {
            let (x, y) = (f64::from_bits(a), f64::from_bits(b));
            let z = if spec.op == ReduceOp::SUM {
                x + y
            } else {
                x * y
            };
            z.to_bits()
        }
        // Wrapping arithmetic modulo 2^64 keeps the low bits right for every width and sign.
        ReduceOp::SUM => a.wrapping_add(b),
        ReduceOp::PROD => a.wrapping_mul(b),
        ReduceOp::LAND => u64::from(a != 0 && b != 0),
        ReduceOp::LOR => u64::from(a != 0 || b != 0),
        ReduceOp::LXOR => u64::from((a != 0) != (b != 0)),
        ReduceOp::BAND => a & b,
        ReduceOp::BOR => a | b,
        ReduceOp::BXOR => a ^ b,
        // Checked before: unreachable; keep the left operand.
        _ => a,
    }
}

/// `MINLOC` / `MAXLOC` of two (value, index) pairs of `width`-byte values.
fn combine_pair(spec: ReduceSpec, width: usize, left: &[u8], right: &[u8], out: &mut [u8]) {
    let value = |pair: &[u8]| read(pair.get(..width).unwrap_or(&[]));
    let index = |pair: &[u8]| read(pair.get(width..).unwrap_or(&[])) as u32 as i32;
    let (a, b) = (value(left), value(right));
    let better = if spec.op == ReduceOp::MINLOC {
        less(spec.datatype, b, a)
    } else {
        less(spec.datatype, a, b)
    };
    let tie = !less(spec.datatype, a, b) && !less(spec.datatype, b, a) && {
        // Floating point: only equal values tie (a NaN ties with nothing).
        match spec.datatype {
            ReduceType::F32 => f32::from_bits(a as u32) == f32::from_bits(b as u32),
            ReduceType::F64 => f64::from_bits(a) == f64::from_bits(b),
            _ => true,
        }
    };
    let take_right = better || (tie && index(right) < index(left));
    let chosen = if take_right { right } else { left };
    for (to, from) in out.iter_mut().zip(chosen) {
        *to = *from;
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use shared_abi::reduce::REDUCE_MAX;
    use std::vec;
    use std::vec::Vec;

    /// A small deterministic generator (the values cover signs, zero, extremes).
    struct Values(u64);

    impl Values {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            match self.0 % 8 {
                0 => 0,
                1 => u64::MAX,
                2 => 1,
                _ => self.0,
            }
        }
    }

    /// The reference: the operation on native typed values.
    macro_rules! reference_int {
        ($t:ty, $op:expr, $a:expr, $b:expr) => {{
            let (a, b): ($t, $t) = ($a as $t, $b as $t);
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

    macro_rules! reference_float {
        ($t:ty, $bits:ty, $op:expr, $a:expr, $b:expr) => {{
            let (a, b) = (<$t>::from_bits($a as $bits), <$t>::from_bits($b as $bits));
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
            r.to_bits().to_le_bytes().to_vec()
        }};
    }

    fn reference(spec: ReduceSpec, a: u64, b: u64) -> Vec<u8> {
        let op = spec.op;
        match spec.datatype {
            ReduceType::I8 => reference_int!(i8, op, a, b),
            ReduceType::U8 => reference_int!(u8, op, a, b),
            ReduceType::I16 => reference_int!(i16, op, a, b),
            ReduceType::U16 => reference_int!(u16, op, a, b),
            ReduceType::I32 => reference_int!(i32, op, a, b),
            ReduceType::U32 => reference_int!(u32, op, a, b),
            ReduceType::I64 => reference_int!(i64, op, a, b),
            ReduceType::U64 => reference_int!(u64, op, a, b),
            ReduceType::F32 => reference_float!(f32, u32, op, a, b),
            ReduceType::F64 => reference_float!(f64, u64, op, a, b),
            _ => unreachable!(),
        }
    }

    fn defined(spec: ReduceSpec) -> bool {
        spec.check(spec.element_size()).is_ok()
    }

    #[test]
    fn every_operation_on_every_type_matches_native_arithmetic() {
        let mut values = Values(0x9e37_79b9_7f4a_7c15);
        let mut checked = 0;
        for datatype in ReduceType::ALL {
            for op in ReduceOp::ALL.into_iter().filter(|op| !op.is_pairwise()) {
                let spec = ReduceSpec::new(op, datatype);
                if !defined(spec) {
                    assert!(datatype.is_float(), "{op:?} on {datatype:?} refused");
                    continue;
                }
                let width = datatype.size();
                let count = REDUCE_MAX / width;
                let (mut left, mut right, mut expected) = (vec![], vec![], vec![]);
                for _ in 0..count {
                    let (a, b) = (values.next(), values.next());
                    left.extend_from_slice(&a.to_le_bytes()[..width]);
                    right.extend_from_slice(&b.to_le_bytes()[..width]);
                    expected.extend(reference(spec, a, b));
                }
                let mut out = vec![0u8; left.len()];
                combine(spec, &left, &right, &mut out).unwrap();
                assert_eq!(out, expected, "{op:?} on {datatype:?}");
                checked += 1;
            }
        }
        // 10 operations on 8 integer types, 4 on 2 floating-point ones.
        assert_eq!(checked, 10 * 8 + 4 * 2);
    }

    #[test]
    fn minloc_and_maxloc_pick_the_extreme_and_break_ties_by_the_smaller_index() {
        for datatype in ReduceType::ALL {
            let width = datatype.size();
            let pair = |value: u64, index: i32| {
                let mut bytes = value.to_le_bytes()[..width].to_vec();
                bytes.extend_from_slice(&index.to_le_bytes());
                bytes
            };
            // Two and three, in the type's own encoding.
            let (two, three) = match datatype {
                ReduceType::F32 => (u64::from(2.0f32.to_bits()), u64::from(3.0f32.to_bits())),
                ReduceType::F64 => (2.0f64.to_bits(), 3.0f64.to_bits()),
                _ => (2, 3),
            };
            for (op, winner) in [(ReduceOp::MINLOC, two), (ReduceOp::MAXLOC, three)] {
                let spec = ReduceSpec::new(op, datatype);
                let mut out = vec![0u8; width + 4];
                combine(spec, &pair(two, 7), &pair(three, 1), &mut out).unwrap();
                let index = if winner == two { 7 } else { 1 };
                assert_eq!(out, pair(winner, index), "{op:?} on {datatype:?}");
                combine(spec, &pair(three, 1), &pair(two, 7), &mut out).unwrap();
                assert_eq!(out, pair(winner, index), "{op:?} on {datatype:?}, swapped");
                combine(spec, &pair(two, 5), &pair(two, 3), &mut out).unwrap();
                assert_eq!(out, pair(two, 3), "{op:?} on {datatype:?}: a tie");
            }
        }
        // Signed values compare as signed: -1 is the minimum of i8.
        let spec = ReduceSpec::new(ReduceOp::MINLOC, ReduceType::I8);
        let mut out = [0u8; 5];
        combine(spec, &[1, 0, 0, 0, 0], &[0xff, 9, 0, 0, 0], &mut out).unwrap();
        assert_eq!(out, [0xff, 9, 0, 0, 0]);
    }

    #[test]
    fn bad_specs_and_lengths_are_refused_and_leave_the_output_alone() {
        let mut out = [0xaa; 8];
        let sum = ReduceSpec::new(ReduceOp::SUM, ReduceType::U32);
        assert_eq!(
            combine(sum, &[0; 4], &[0; 8], &mut out),
            Err(ReduceRefusal::BadLength(8))
        );
        assert_eq!(
            combine(sum, &[0; 6], &[0; 6], &mut out[..6]),
            Err(ReduceRefusal::BadLength(6))
        );
        assert_eq!(
            combine(
                ReduceSpec::new(ReduceOp::BAND, ReduceType::F64),
                &[0; 8],
                &[0; 8],
                &mut out
            ),
            Err(ReduceRefusal::NotDefined(ReduceOp::BAND, ReduceType::F64))
        );
        assert_eq!(
            combine(
                ReduceSpec::new(ReduceOp(99), ReduceType::U8),
                &[0; 8],
                &[0; 8],
                &mut out
            ),
            Err(ReduceRefusal::UnknownOp(99))
        );
        assert_eq!(out, [0xaa; 8]);
    }
}
