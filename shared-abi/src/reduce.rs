//! Reductions in the NIC: the operation and the element type an allreduce or reduce combines
//! its members' payloads with (up to [`REDUCE_MAX`] bytes, the payload a barrier packet carries).
//!
//! Both are transparent newtypes over a byte, as every opcode of the ABI; an unknown value is
//! representable and refused ([`ReduceSpec::check`]). Elements are little-endian. `MINLOC` and
//! `MAXLOC` combine pairs: an element of the type followed by a little-endian `i32` index, packed
//! (no padding), as [`ReduceType::pair_size`] says; ties go to the smaller index, as MPI defines.
//! One operation is not MPI's: [`ReduceOp::SUM_REPRODUCIBLE`], whose members' values travel as
//! accumulators ([`crate::reproducible`]).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::reproducible::{ACCUMULATOR_LEN, ReproducibleSum};

/// The most bytes one reduction in the NIC combines (what a barrier packet carries beside its
/// header, as a broadcast's bytes).
pub const REDUCE_MAX: usize = crate::packet::BROADCAST_MAX;

/// A reduction's operation (MPI's predefined ones).
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    Immutable,
    KnownLayout,
    Unaligned,
)]
#[repr(transparent)]
pub struct ReduceOp(pub u8);

impl ReduceOp {
    /// Sum (integers wrap; floating point in IEEE 754 arithmetic).
    pub const SUM: Self = Self(1);
    /// Product (integers wrap).
    pub const PROD: Self = Self(2);
    /// Minimum.
    pub const MIN: Self = Self(3);
    /// Maximum.
    pub const MAX: Self = Self(4);
    /// Logical and (integers: 0 is false, anything else true; the result 0 or 1).
    pub const LAND: Self = Self(5);
    /// Logical or.
    pub const LOR: Self = Self(6);
    /// Logical exclusive or.
    pub const LXOR: Self = Self(7);
    /// Bitwise and (integers).
    pub const BAND: Self = Self(8);
    /// Bitwise or (integers).
    pub const BOR: Self = Self(9);
    /// Bitwise exclusive or (integers).
    pub const BXOR: Self = Self(10);
    /// The minimum value and the smallest index holding it (pairs).
    pub const MINLOC: Self = Self(11);
    /// The maximum value and the smallest index holding it (pairs).
    pub const MAXLOC: Self = Self(12);

    /// A floating-point sum whose bits do not depend on the order, the grouping, the algorithm
    /// or the group's size ([`crate::reproducible`]): one `F32` or `F64` value per member,
    /// carried in the NIC as a [`crate::reproducible::ReproducibleSum`] of
    /// [`crate::reproducible::ACCUMULATOR_LEN`] bytes. Not one of MPI's, so not in
    /// [`ReduceOp::ALL`].
    pub const SUM_REPRODUCIBLE: Self = Self(13);

    /// MPI's predefined operations, in number order.
    pub const ALL: [Self; 12] = [
        Self::SUM,
        Self::PROD,
        Self::MIN,
        Self::MAX,
        Self::LAND,
        Self::LOR,
        Self::LXOR,
        Self::BAND,
        Self::BOR,
        Self::BXOR,
        Self::MINLOC,
        Self::MAXLOC,
    ];

    /// Whether combining a value with itself gives it back (`MIN`, `MAX`, `LAND`, `LOR`,
    /// `BAND`, `BOR`, `MINLOC`, `MAXLOC`): only these may take schedules whose paths overlap
    /// (dissemination counts a member's value more than once).
    pub const fn is_idempotent(self) -> bool {
        matches!(self.0, 3 | 4 | 5 | 6 | 8 | 9 | 11 | 12)
    }

    /// Whether the operation combines pairs (value, index).
    pub const fn is_pairwise(self) -> bool {
        matches!(self.0, 11 | 12)
    }

    /// Whether the value names a known operation.
    pub const fn is_known(self) -> bool {
        self.0 >= 1 && self.0 <= 13
    }
}

/// A reduction's element type.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    Immutable,
    KnownLayout,
    Unaligned,
)]
#[repr(transparent)]
pub struct ReduceType(pub u8);

impl ReduceType {
    /// Signed 8-bit integer.
    pub const I8: Self = Self(1);
    /// Unsigned 8-bit integer.
    pub const U8: Self = Self(2);
    /// Signed 16-bit integer.
    pub const I16: Self = Self(3);
    /// Unsigned 16-bit integer.
    pub const U16: Self = Self(4);
    /// Signed 32-bit integer.
    pub const I32: Self = Self(5);
    /// Unsigned 32-bit integer.
    pub const U32: Self = Self(6);
    /// Signed 64-bit integer.
    pub const I64: Self = Self(7);
    /// Unsigned 64-bit integer.
    pub const U64: Self = Self(8);
    /// IEEE 754 binary32.
    pub const F32: Self = Self(9);
    /// IEEE 754 binary64.
    pub const F64: Self = Self(10);

    /// Every type, in number order.
    pub const ALL: [Self; 10] = [
        Self::I8,
        Self::U8,
        Self::I16,
        Self::U16,
        Self::I32,
        Self::U32,
        Self::I64,
        Self::U64,
        Self::F32,
        Self::F64,
    ];

    /// Bytes of one element; 0 for an unknown type.
    pub const fn size(self) -> usize {
        match self.0 {
            1 | 2 => 1,
            3 | 4 => 2,
            5 | 6 | 9 => 4,
            7 | 8 | 10 => 8,
            _ => 0,
        }
    }

    /// Bytes of one (value, index) pair of `MINLOC` and `MAXLOC`: the element and an `i32`.
    pub const fn pair_size(self) -> usize {
        match self.size() {
            0 => 0,
            size => size + 4,
        }
    }

    /// Whether the type is floating point.
    pub const fn is_float(self) -> bool {
        matches!(self.0, 9 | 10)
    }

    /// Whether the type is a signed integer.
    pub const fn is_signed(self) -> bool {
        matches!(self.0, 1 | 3 | 5 | 7)
    }
}

/// What one reduction combines: its operation and element type.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ReduceSpec {
    /// The operation.
    pub op: ReduceOp,
    /// The element type.
    pub datatype: ReduceType,
}

/// Why a reduction cannot run in the NIC.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ReduceRefusal {
    /// The operation is not one of [`ReduceOp::ALL`] nor [`ReduceOp::SUM_REPRODUCIBLE`].
    UnknownOp(u8),
    /// The type is not one of [`ReduceType::ALL`].
    UnknownType(u8),
    /// The operation is not defined on the type (a logical or bitwise operation on floating
    /// point, a reproducible sum of integers).
    NotDefined(ReduceOp, ReduceType),
    /// The payload is empty, longer than [`REDUCE_MAX`], or not a whole number of elements; a
    /// reproducible sum's is not one accumulator, or its value not one element.
    BadLength(usize),
}

impl ReduceSpec {
    /// `op` on `datatype`.
    pub const fn new(op: ReduceOp, datatype: ReduceType) -> Self {
        Self { op, datatype }
    }

    /// Bytes of one element as the operation combines it (a pair for `MINLOC` and `MAXLOC`).
    pub const fn element_size(self) -> usize {
        if self.op.is_pairwise() {
            self.datatype.pair_size()
        } else {
            self.datatype.size()
        }
    }

    /// Checks that the NIC can combine payloads of `len` bytes with this operation and type
    /// (for [`ReduceOp::SUM_REPRODUCIBLE`], accumulators: see [`ReduceSpec::check_value`] for
    /// what a member brings).
    ///
    /// # Errors
    /// [`ReduceRefusal`] says why not.
    pub const fn check(self, len: usize) -> Result<(), ReduceRefusal> {
        if !self.op.is_known() {
            return Err(ReduceRefusal::UnknownOp(self.op.0));
        }
        if self.datatype.size() == 0 {
            return Err(ReduceRefusal::UnknownType(self.datatype.0));
        }
        let logical_or_bitwise = matches!(self.op.0, 5..=10);
        let reproducible = self.op.0 == ReduceOp::SUM_REPRODUCIBLE.0;
        if (logical_or_bitwise && self.datatype.is_float())
            || (reproducible && !self.datatype.is_float())
        {
            return Err(ReduceRefusal::NotDefined(self.op, self.datatype));
        }
        if reproducible {
            return match len == ACCUMULATOR_LEN {
                true => Ok(()),
                false => Err(ReduceRefusal::BadLength(len)),
            };
        }
        let element = self.element_size();
        // `checked_rem`: no division-by-zero path in the firmware (the element is never 0 here).
        let whole = match len.checked_rem(element) {
            Some(rest) => rest == 0,
            None => false,
        };
        if len == 0 || len > REDUCE_MAX || !whole {
            return Err(ReduceRefusal::BadLength(len));
        }
        Ok(())
    }

    /// Checks what a member brings to the reduction: `len` bytes of elements, as
    /// [`ReduceSpec::check`] says, or one element for [`ReduceOp::SUM_REPRODUCIBLE`].
    ///
    /// # Errors
    /// [`ReduceRefusal`] says why not.
    pub const fn check_value(self, len: usize) -> Result<(), ReduceRefusal> {
        if self.op.0 != ReduceOp::SUM_REPRODUCIBLE.0 {
            return self.check(len);
        }
        if let Err(refusal) = self.check(ACCUMULATOR_LEN) {
            return Err(refusal);
        }
        match len == self.datatype.size() {
            true => Ok(()),
            false => Err(ReduceRefusal::BadLength(len)),
        }
    }

    /// Writes into `payload` what a member's `value` travels as in the NIC (the value itself,
    /// or a reproducible sum's accumulator); returns its length.
    ///
    /// # Errors
    /// As [`ReduceSpec::check_value`].
    pub fn payload(
        self,
        value: &[u8],
        payload: &mut [u8; REDUCE_MAX],
    ) -> Result<usize, ReduceRefusal> {
        self.check_value(value.len())?;
        if self.op != ReduceOp::SUM_REPRODUCIBLE {
            payload[..value.len()].copy_from_slice(value);
            return Ok(value.len());
        }
        // `check_value` took one element of a floating-point type.
        let mut bytes = [0; 8];
        bytes[..value.len()].copy_from_slice(value);
        let sum = match self.datatype {
            ReduceType::F32 => ReproducibleSum::of_f32(f32::from_le_bytes([
                bytes[0], bytes[1], bytes[2], bytes[3],
            ])),
            _ => ReproducibleSum::of_f64(f64::from_le_bytes(bytes)),
        };
        payload[..ACCUMULATOR_LEN].copy_from_slice(&sum.to_bytes());
        Ok(ACCUMULATOR_LEN)
    }

    /// Writes into `value` the result a reduction's combined `payload` stands for (the payload
    /// itself, or a reproducible sum rounded to the type); returns its length (at most
    /// `value.len()` bytes are written).
    pub fn result(self, payload: &[u8], value: &mut [u8]) -> usize {
        let mut rounded = [0u8; 8];
        let result = match (self.op, ReproducibleSum::from_bytes(payload)) {
            (ReduceOp::SUM_REPRODUCIBLE, Some(sum)) if self.datatype == ReduceType::F32 => {
                rounded[..4].copy_from_slice(&sum.to_f32().to_le_bytes());
                &rounded[..4]
            }
            (ReduceOp::SUM_REPRODUCIBLE, Some(sum)) => {
                rounded = sum.to_f64().to_le_bytes();
                &rounded[..]
            }
            // Not an accumulator: no result.
            (ReduceOp::SUM_REPRODUCIBLE, None) => &[],
            _ => payload,
        };
        let len = result.len().min(value.len());
        value[..len].copy_from_slice(&result[..len]);
        result.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_operations_that_give_a_value_back_are_idempotent() {
        let idempotent: [ReduceOp; 8] = [
            ReduceOp::MIN,
            ReduceOp::MAX,
            ReduceOp::LAND,
            ReduceOp::LOR,
            ReduceOp::BAND,
            ReduceOp::BOR,
            ReduceOp::MINLOC,
            ReduceOp::MAXLOC,
        ];
        for op in ReduceOp::ALL {
            assert_eq!(op.is_idempotent(), idempotent.contains(&op), "{op:?}");
        }
    }

    #[test]
    fn a_spec_is_checked_for_op_type_and_length() {
        let sum = ReduceSpec::new(ReduceOp::SUM, ReduceType::F64);
        assert_eq!(sum.check(32), Ok(()));
        assert_eq!(sum.check(0), Err(ReduceRefusal::BadLength(0)));
        assert_eq!(sum.check(12), Err(ReduceRefusal::BadLength(12)));
        assert_eq!(sum.check(40), Err(ReduceRefusal::BadLength(40)));
        assert_eq!(
            ReduceSpec::new(ReduceOp::BXOR, ReduceType::F32).check(4),
            Err(ReduceRefusal::NotDefined(ReduceOp::BXOR, ReduceType::F32))
        );
        assert_eq!(
            ReduceSpec::new(ReduceOp(0), ReduceType::U8).check(1),
            Err(ReduceRefusal::UnknownOp(0))
        );
        assert_eq!(
            ReduceSpec::new(ReduceOp::SUM, ReduceType(11)).check(1),
            Err(ReduceRefusal::UnknownType(11))
        );
        // MINLOC on f64 pairs: 12 bytes each, two fit.
        let minloc = ReduceSpec::new(ReduceOp::MINLOC, ReduceType::F64);
        assert_eq!(minloc.element_size(), 12);
        assert_eq!(minloc.check(24), Ok(()));
        assert_eq!(minloc.check(16), Err(ReduceRefusal::BadLength(16)));
    }

    #[test]
    fn a_reproducible_sum_takes_one_float_and_travels_as_an_accumulator() {
        let double = ReduceSpec::new(ReduceOp::SUM_REPRODUCIBLE, ReduceType::F64);
        assert_eq!(double.check_value(8), Ok(()));
        assert_eq!(double.check_value(16), Err(ReduceRefusal::BadLength(16)));
        assert_eq!(double.check(ACCUMULATOR_LEN), Ok(()));
        assert_eq!(double.check(8), Err(ReduceRefusal::BadLength(8)));
        let integer = ReduceSpec::new(ReduceOp::SUM_REPRODUCIBLE, ReduceType::I64);
        assert_eq!(
            integer.check_value(8),
            Err(ReduceRefusal::NotDefined(
                ReduceOp::SUM_REPRODUCIBLE,
                ReduceType::I64
            ))
        );
        let mut payload = [0; REDUCE_MAX];
        assert_eq!(
            double.payload(&2.5f64.to_le_bytes(), &mut payload),
            Ok(ACCUMULATOR_LEN)
        );
        let mut value = [0; 8];
        assert_eq!(double.result(&payload[..ACCUMULATOR_LEN], &mut value), 8);
        assert_eq!(f64::from_le_bytes(value), 2.5);
        assert_eq!(
            double.result(&payload[..8], &mut value),
            0,
            "not an accumulator"
        );
        let single = ReduceSpec::new(ReduceOp::SUM_REPRODUCIBLE, ReduceType::F32);
        assert_eq!(
            single.payload(&(-0.75f32).to_le_bytes(), &mut payload),
            Ok(ACCUMULATOR_LEN)
        );
        let mut value = [0; 4];
        assert_eq!(single.result(&payload[..ACCUMULATOR_LEN], &mut value), 4);
        assert_eq!(f32::from_le_bytes(value), -0.75);
        // Every other operation travels as its value.
        let sum = ReduceSpec::new(ReduceOp::SUM, ReduceType::I32);
        assert_eq!(sum.payload(&[1, 0, 0, 0, 2, 0, 0, 0], &mut payload), Ok(8));
        assert_eq!(payload[..8], [1, 0, 0, 0, 2, 0, 0, 0]);
    }
}
