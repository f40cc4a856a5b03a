//! ARMCI's data operations: put, get, accumulate, read-modify-write.
//!
//! Accumulate is a locked read-modify-write at the target: take the target's accumulate lock,
//! get the bytes, add `scale × src` here, put them back and wait until they are in the target's
//! memory, give the lock up. The NIC's atomics are 64-bit integer operations, which cannot add a
//! float or a double, nor add to a 32-bit integer without the carry spilling into its neighbour;
//! and every accumulate into one rank's memory must use the same mechanism, or the atomics and
//! the read-modify-writes would lose each other's updates. The lock is one per target rank (as
//! ARMCI's own shared-memory accumulate locks per process), so accumulates into different ranks
//! run in parallel, and its cost — four round trips — does not grow with the length.
//!
//! Read-modify-write on a `long` is one NIC atomic. On an `int` it is a compare-and-swap loop on
//! the 64-bit word that holds it: the other half of the word is rewritten with the value the NIC
//! read, so a plain CPU store by the target process to that other half at the same moment can be
//! lost (ARMCI promises atomicity only against other read-modify-writes).

use nicbar::{AtomicOp, RemotePointer};

use crate::core::{Armci, PIECE};
use crate::error::ArmciError;
use crate::lock_state::LockName;

/// The element type of an accumulate and its scale: `dst[i] += scale × src[i]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// `int` (ARMCI_ACC_INT), wrapping.
    Int(i32),
    /// `long` (ARMCI_ACC_LNG), wrapping.
    Long(i64),
    /// `float` (ARMCI_ACC_FLT).
    Float(f32),
    /// `double` (ARMCI_ACC_DBL).
    Double(f64),
}

impl Scale {
    /// Bytes of one element.
    pub fn element_len(self) -> usize {
        match self {
            Self::Int(_) | Self::Float(_) => 4,
            Self::Long(_) | Self::Double(_) => 8,
        }
    }
}

/// `target[i] += scale × source[i]` over native-endian elements of `scale`'s type.
pub(crate) fn accumulate(scale: Scale, target: &mut [u8], source: &[u8]) {
    macro_rules! each {
        ($t:ty, $n:literal, $f:expr) => {
            for (t, s) in target.chunks_exact_mut($n).zip(source.chunks_exact($n)) {
                let (Ok(tb), Ok(sb)) = (<[u8; $n]>::try_from(&*t), <[u8; $n]>::try_from(s)) else {
                    continue;
                };
                let value: $t = $f(<$t>::from_ne_bytes(tb), <$t>::from_ne_bytes(sb));
                t.copy_from_slice(&value.to_ne_bytes());
            }
        };
    }
    match scale {
        Scale::Int(k) => each!(i32, 4, |t: i32, s: i32| t.wrapping_add(k.wrapping_mul(s))),
        Scale::Long(k) => each!(i64, 8, |t: i64, s: i64| t.wrapping_add(k.wrapping_mul(s))),
        Scale::Float(k) => each!(f32, 4, |t: f32, s: f32| t + k * s),
        Scale::Double(k) => each!(f64, 8, |t: f64, s: f64| t + k * s),
    }
}

/// ARMCI_Rmw's operations, with their operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rmw {
    /// ARMCI_FETCH_AND_ADD: the `int` += the operand.
    FetchAndAdd(i32),
    /// ARMCI_FETCH_AND_ADD_LONG: the `long` += the operand.
    FetchAndAddLong(i64),
    /// ARMCI_SWAP: the `int` = the operand.
    Swap(i32),
    /// ARMCI_SWAP_LONG: the `long` = the operand.
    SwapLong(i64),
}

impl Armci {
    /// ARMCI_Put: copies `src` to `dst` (an address in `rank`'s memory from
    /// [`Armci::malloc`]). Returns once `src` may be reused; the bytes are in `rank`'s memory
    /// after [`Armci::fence`], [`Armci::all_fence`] or [`Armci::barrier`].
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] if `dst` is not in `rank`'s allocated memory; a port error.
    pub fn put(&mut self, src: &[u8], dst: u64, rank: usize) -> Result<(), ArmciError> {
        let remote = self.resolve(rank, dst, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.put_remote(src, remote, rank)
    }

    /// ARMCI_Put_flag: puts `src` to `dst` at `rank`, then stores `value` in the `int` at `flag`
    /// there. The NIC applies one port's operations toward a node in the order they were posted
    /// (the fences rest on the same rule), so the flag lands after the bytes: a process that sees
    /// it set sees them. Returns once `src` may be reused.
    ///
    /// # Errors
    /// As [`Armci::put`], for the bytes and the flag.
    pub fn put_flag(
        &mut self,
        src: &[u8],
        dst: u64,
        flag: u64,
        value: i32,
        rank: usize,
    ) -> Result<(), ArmciError> {
        let remote = self.resolve(rank, dst, src.len())?;
        let flag_remote = self.resolve(rank, flag, 4)?;
        if !src.is_empty() {
            self.put_remote(src, remote, rank)?;
        }
        self.put_remote(&value.to_ne_bytes(), flag_remote, rank)
    }

    /// ARMCI_Get: copies `dst.len()` bytes at `src` (an address in `rank`'s memory from
    /// [`Armci::malloc`]) into `dst`; returns once they are there.
    ///
    /// # Errors
    /// As [`Armci::put`]; the NIC's refusal.
    pub fn get(&mut self, src: u64, dst: &mut [u8], rank: usize) -> Result<(), ArmciError> {
        let remote = self.resolve(rank, src, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.get_remote(remote, dst, rank)
    }

    /// ARMCI_Acc: `dst[i] += scale × src[i]` for the elements of `scale`'s type in `src`
    /// (native byte order), atomically with respect to every other accumulate into `rank`'s
    /// memory; returns once the sums are in `rank`'s memory.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] if `src` is not whole elements or `dst` not in `rank`'s memory;
    /// an operation failing.
    pub fn acc(
        &mut self,
        scale: Scale,
        src: &[u8],
        dst: u64,
        rank: usize,
    ) -> Result<(), ArmciError> {
        if src.len() % scale.element_len() != 0 {
            return Err(ArmciError::Invalid(format!(
                "{} bytes are not whole elements of {scale:?}",
                src.len()
            )));
        }
        let remote = self.resolve(rank, dst, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.acquire(LockName::Accumulate(rank))?;
        let result = self.accumulate_locked(scale, src, remote, rank);
        let released = self.release(LockName::Accumulate(rank));
        result.and(released)
    }

    pub(crate) fn accumulate_locked(
        &mut self,
        scale: Scale,
        src: &[u8],
        remote: u64,
        rank: usize,
    ) -> Result<(), ArmciError> {
        let pointer = RemotePointer::from_u64(remote);
        let mut bytes = Vec::new();
        for (index, piece) in src.chunks(PIECE).enumerate() {
            let at = RemotePointer {
                key: pointer.key,
                offset: pointer.offset + (index * PIECE) as u32,
            }
            .to_u64();
            bytes.resize(piece.len(), 0);
            self.get_remote(at, &mut bytes, rank)?;
            accumulate(scale, &mut bytes, piece);
            self.put_remote_complete(&bytes, at, rank)?;
        }
        Ok(())
    }

    /// ARMCI_Rmw: applies `op` to the `int` or `long` at `dst` (an address in `rank`'s memory
    /// from [`Armci::malloc`], aligned to its size) and returns its previous value.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] for a misaligned or foreign address; the atomic failing.
    pub fn rmw(&mut self, op: Rmw, dst: u64, rank: usize) -> Result<i64, ArmciError> {
        match op {
            Rmw::FetchAndAddLong(v) | Rmw::SwapLong(v) => {
                if dst % 8 != 0 {
                    return Err(ArmciError::Invalid(format!(
                        "a long at {dst:#x} is not 8-byte aligned"
                    )));
                }
                let remote = self.resolve(rank, dst, 8)?;
                let nic_op = if matches!(op, Rmw::SwapLong(_)) {
                    AtomicOp::SWAP
                } else {
                    AtomicOp::FETCH_ADD
                };
                Ok(self.atomic(nic_op, rank, remote, v as u64, 0)? as i64)
            }
            Rmw::FetchAndAdd(v) | Rmw::Swap(v) => {
                if dst % 4 != 0 {
                    return Err(ArmciError::Invalid(format!(
                        "an int at {dst:#x} is not 4-byte aligned"
                    )));
                }
                let word = dst & !7;
                let shift = (dst - word) * 8;
                let remote = self.resolve(rank, word, 8)?;
                let mask = u64::from(u32::MAX) << shift;
                // The word as the NIC holds it; then compare-and-swap until no one came between.
                let mut current = self.atomic(AtomicOp::FETCH_ADD, rank, remote, 0, 0)?;
                loop {
                    let old = (current >> shift) as u32 as i32;
                    let new = match op {
                        Rmw::FetchAndAdd(_) => old.wrapping_add(v),
                        _ => v,
                    };
                    let word_new = (current & !mask) | (u64::from(new as u32) << shift);
                    let seen =
                        self.atomic(AtomicOp::COMPARE_SWAP, rank, remote, word_new, current)?;
                    if seen == current {
                        return Ok(i64::from(old));
                    }
                    current = seen;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Copy, const N: usize>(values: &[T], to: fn(T) -> [u8; N]) -> Vec<u8> {
        values.iter().flat_map(|&v| to(v)).collect()
    }

    #[test]
    fn accumulate_scales_each_type_and_wraps_integers() {
        let mut target = bytes(&[1i32, i32::MAX], i32::to_ne_bytes);
        accumulate(
            Scale::Int(2),
            &mut target,
            &bytes(&[3i32, 1], i32::to_ne_bytes),
        );
        assert_eq!(target, bytes(&[7i32, i32::MIN + 1], i32::to_ne_bytes));

        let mut target = bytes(&[10i64], i64::to_ne_bytes);
        accumulate(
            Scale::Long(-3),
            &mut target,
            &bytes(&[4i64], i64::to_ne_bytes),
        );
        assert_eq!(target, bytes(&[-2i64], i64::to_ne_bytes));

        let mut target = bytes(&[0.5f32], f32::to_ne_bytes);
        accumulate(
            Scale::Float(0.5),
            &mut target,
            &bytes(&[3.0f32], f32::to_ne_bytes),
        );
        assert_eq!(target, bytes(&[2.0f32], f32::to_ne_bytes));

        let mut target = bytes(&[1.0f64, 2.0], f64::to_ne_bytes);
        accumulate(
            Scale::Double(2.0),
            &mut target,
            &bytes(&[0.25f64, -1.0], f64::to_ne_bytes),
        );
        assert_eq!(target, bytes(&[1.5f64, 0.0], f64::to_ne_bytes));
    }
}
