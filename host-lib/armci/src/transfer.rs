//! Strided and vector transfers, and the non-blocking handles.
//!
//! A strided transfer (ARMCI_PutS, GetS, AccS) is cut into its contiguous runs: `count[0]` bytes
//! at each point of the `count[1..]` grid, the levels whose stride equals the run below them on
//! both sides merged first (a 2-D patch whose rows are whole is one run). Each run is one NIC
//! put or get of the staging area, never one per element; a vector transfer (PutV, GetV, AccV)
//! is one per segment. The gets of a transfer are all posted before the first is waited for, so
//! a transfer of many runs costs one round trip, not one per run. An accumulate takes the
//! target's accumulate lock once for all its runs.
//!
//! A non-blocking handle counts its operations still in the NIC: each put's end is the NIC's
//! report that the bytes are in the target's memory (remote completion), each get's that they
//! are here. [`Armci::wait_handle`] waits until the count is 0.

use crate::core::{Armci, PIECE};
use crate::error::ArmciError;
use crate::lock_state::LockName;
use crate::ops::Scale;

/// The deepest strided transfer ARMCI takes (`ARMCI_MAX_STRIDE_LEVEL`).
pub const MAX_STRIDE_LEVELS: usize = 8;

/// A strided transfer's shape: `count[0]` bytes per run, `count[1..]` runs at each level, the
/// source's and destination's byte strides between them (`strides[l]` for level `l + 1`).
#[derive(Clone, Copy, Debug)]
pub struct Strides<'a> {
    /// The source's strides, one per level.
    pub src: &'a [usize],
    /// The destination's strides, one per level.
    pub dst: &'a [usize],
    /// Bytes of a run, then the count at each level.
    pub count: &'a [usize],
}

/// The runs of a strided transfer: their length, and each one's offsets from the source's and
/// the destination's start, in ARMCI's order (level 1 fastest).
#[derive(Debug, PartialEq, Eq)]
pub struct Runs {
    /// Bytes of each run.
    pub len: usize,
    /// (source offset, destination offset) of each run.
    pub offsets: Vec<(usize, usize)>,
}

impl Strides<'_> {
    /// Checks the shape and cuts it into runs, merging the levels that continue a run.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`]: more than [`MAX_STRIDE_LEVELS`] levels, stride arrays shorter
    /// than the levels, or offsets that overflow.
    pub fn runs(&self) -> Result<Runs, ArmciError> {
        let levels = self.count.len().saturating_sub(1);
        if self.count.is_empty() || levels > MAX_STRIDE_LEVELS {
            return Err(ArmciError::Invalid(format!(
                "{levels} stride levels (ARMCI takes 0 to {MAX_STRIDE_LEVELS})"
            )));
        }
        if self.src.len() < levels || self.dst.len() < levels {
            return Err(ArmciError::Invalid(format!(
                "{levels} stride levels with {} source and {} destination strides",
                self.src.len(),
                self.dst.len()
            )));
        }
        let mut len = self.count[0];
        let mut level = 0;
        // Merge: a level whose stride is the run's length on both sides only lengthens the run.
        while level < levels && self.src[level] == len && self.dst[level] == len {
            len = len
                .checked_mul(self.count[level + 1])
                .ok_or_else(|| ArmciError::Invalid("a strided run overflows".to_owned()))?;
            level += 1;
        }
        let (src, dst, count) = (
            &self.src[level..levels],
            &self.dst[level..levels],
            &self.count[level + 1..],
        );
        let total = count.iter().try_fold(1usize, |n, &c| n.checked_mul(c));
        let total =
            total.ok_or_else(|| ArmciError::Invalid("a strided count overflows".to_owned()))?;
        if len == 0 || total == 0 {
            return Ok(Runs {
                len: 0,
                offsets: Vec::new(),
            });
        }
        let overflow = || ArmciError::Invalid("a strided offset overflows".to_owned());
        // The last run must be addressable on both sides: then every offset is.
        for (strides, name) in [(src, "source"), (dst, "destination")] {
            let last = strides
                .iter()
                .zip(count)
                .try_fold(len, |at, (&s, &c)| s.checked_mul(c - 1)?.checked_add(at));
            if last.is_none() {
                return Err(ArmciError::Invalid(format!(
                    "the strided {name} reaches past the address space"
                )));
            }
        }
        let mut offsets = Vec::with_capacity(total);
        let mut index = vec![0usize; count.len()];
        loop {
            let at = |strides: &[usize]| -> Option<usize> {
                strides
                    .iter()
                    .zip(&index)
                    .try_fold(0usize, |sum, (&s, &i)| sum.checked_add(s.checked_mul(i)?))
            };
            offsets.push((at(src).ok_or_else(overflow)?, at(dst).ok_or_else(overflow)?));
            // The next point of the grid, level 1 fastest.
            let mut carry = 0;
            while carry < index.len() {
                index[carry] += 1;
                if index[carry] < count[carry] {
                    break;
                }
                index[carry] = 0;
                carry += 1;
            }
            if carry == index.len() {
                break;
            }
        }
        Ok(Runs { len, offsets })
    }

    /// Bytes from the source's start to the end of its last run (0 for an empty transfer).
    pub fn src_extent(&self) -> Result<usize, ArmciError> {
        extent(self.src, self.count)
    }

    /// Bytes from the destination's start to the end of its last run.
    pub fn dst_extent(&self) -> Result<usize, ArmciError> {
        extent(self.dst, self.count)
    }
}

fn extent(strides: &[usize], count: &[usize]) -> Result<usize, ArmciError> {
    let levels = count.len().saturating_sub(1);
    if count.is_empty() || strides.len() < levels {
        return Err(ArmciError::Invalid(
            "a strided shape without its strides".to_owned(),
        ));
    }
    if count.contains(&0) {
        return Ok(0);
    }
    strides[..levels]
        .iter()
        .zip(&count[1..])
        .try_fold(count[0], |at, (&s, &c)| {
            s.checked_mul(c - 1)?.checked_add(at)
        })
        .ok_or_else(|| ArmciError::Invalid("a strided extent overflows".to_owned()))
}

/// A non-blocking operation's handle ([`Armci::new_handle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle(pub(crate) u64);

impl Handle {
    /// The handle's number (never 0).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The handle numbered `number` (0 is none).
    pub fn from_number(number: u64) -> Option<Self> {
        (number != 0).then_some(Self(number))
    }
}

/// The handles of operations made with no handle of their own, one per target, whose wait is
/// ARMCI_WaitProc or ARMCI_WaitAll: numbers with the top bit set.
const IMPLICIT: u64 = 1 << 63;

impl Armci {
    /// A fresh handle for non-blocking operations.
    pub fn new_handle(&mut self) -> Handle {
        self.next_handle = self.next_handle.wrapping_add(1).max(1) & !IMPLICIT;
        Handle(self.next_handle)
    }

    /// The implicit handle of operations to `rank` made with no handle.
    pub fn implicit_handle(&self, rank: usize) -> Handle {
        Handle(IMPLICIT | rank as u64)
    }

    /// ARMCI_PutS: the strided patch at `src` (offsets from its start) to `dst` in `rank`'s
    /// memory, one NIC put per contiguous run; returns once `src` may be reused.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] for a bad shape, a source shorter than the shape, or a
    /// destination outside `rank`'s memory; a port error.
    pub fn put_strided(
        &mut self,
        src: &[u8],
        dst: u64,
        strides: Strides<'_>,
        rank: usize,
        handle: Option<Handle>,
    ) -> Result<(), ArmciError> {
        let runs = strides.runs()?;
        let pieces = self.strided_pieces(src, dst, &runs)?;
        self.put_pieces(&pieces, rank, handle)
    }

    /// The (source bytes, destination address) of each run.
    fn strided_pieces<'s>(
        &self,
        src: &'s [u8],
        dst: u64,
        runs: &Runs,
    ) -> Result<Vec<(&'s [u8], u64)>, ArmciError> {
        runs.offsets
            .iter()
            .map(|&(from, to)| {
                let bytes = src.get(from..from + runs.len).ok_or_else(|| {
                    ArmciError::Invalid(format!(
                        "a strided run at {from} of a {}-byte source",
                        src.len()
                    ))
                })?;
                Ok((bytes, dst.wrapping_add(to as u64)))
            })
            .collect()
    }

    /// Puts each (bytes, destination) to `rank`, one NIC put per piece (per 256 KiB of a long
    /// one), counted under `handle` if there is one; returns once the sources may be reused.
    ///
    /// # Errors
    /// A destination outside `rank`'s memory (checked for every piece before any is posted); a
    /// port error.
    pub fn put_pieces(
        &mut self,
        pieces: &[(&[u8], u64)],
        rank: usize,
        handle: Option<Handle>,
    ) -> Result<(), ArmciError> {
        let remotes = pieces
            .iter()
            .map(|&(bytes, dst)| self.resolve(rank, dst, bytes.len()))
            .collect::<Result<Vec<u64>, _>>()?;
        for (&(bytes, _), remote) in pieces.iter().zip(remotes) {
            if !bytes.is_empty() {
                self.put_remote_under(bytes, remote, rank, handle.map(|h| h.0))?;
            }
        }
        Ok(())
    }

    /// ARMCI_GetS: the strided patch at `src` in `rank`'s memory into `dst` (offsets from its
    /// start); every run's get is posted before the first is waited for. Returns once the bytes
    /// are here.
    ///
    /// # Errors
    /// As [`Armci::put_strided`]; the NIC's refusal.
    pub fn get_strided(
        &mut self,
        src: u64,
        dst: &mut [u8],
        strides: Strides<'_>,
        rank: usize,
    ) -> Result<(), ArmciError> {
        let runs = strides.runs()?;
        let mut pieces = Vec::with_capacity(runs.offsets.len());
        for &(from, to) in &runs.offsets {
            if to.checked_add(runs.len).is_none_or(|end| end > dst.len()) {
                return Err(ArmciError::Invalid(format!(
                    "a strided run at {to} of a {}-byte destination",
                    dst.len()
                )));
            }
            let remote = self.resolve(rank, src.wrapping_add(from as u64), runs.len)?;
            pieces.push((remote, to, runs.len));
        }
        self.get_runs(&pieces, dst, rank)
    }

    /// Gets each (remote pointer, offset in `dst`, length) of `rank` into `dst`, posting as many
    /// as the staging area holds before waiting for the oldest.
    fn get_runs(
        &mut self,
        runs: &[(u64, usize, usize)],
        dst: &mut [u8],
        rank: usize,
    ) -> Result<(), ArmciError> {
        let mut posted = std::collections::VecDeque::new();
        let pieces = runs.iter().flat_map(|&(remote, at, len)| {
            (0..len.div_ceil(PIECE)).map(move |i| {
                let skip = i * PIECE;
                (remote + skip as u64, at + skip, (len - skip).min(PIECE))
            })
        });
        let mut outcome = Ok(());
        for (remote, at, len) in pieces {
            let start = loop {
                if let Some(start) = self.staging.take(len) {
                    break start;
                }
                match posted.pop_front() {
                    Some(oldest) => outcome = outcome.and(self.land_waited(oldest, dst, rank)),
                    None => break self.lease(len)?,
                }
            };
            match self.post_retrying_get(remote, start, len, rank, None) {
                Ok(context) => posted.push_back((context, start, at, len)),
                Err(error) => {
                    self.staging.give_back(start);
                    outcome = outcome.and(Err(error));
                    break;
                }
            }
        }
        for oldest in posted {
            outcome = outcome.and(self.land_waited(oldest, dst, rank));
        }
        outcome
    }

    /// Waits for one get of [`Armci::get_runs`] and copies its bytes out.
    fn land_waited(
        &mut self,
        (context, start, at, len): (u64, usize, usize, usize),
        dst: &mut [u8],
        rank: usize,
    ) -> Result<(), ArmciError> {
        let outcome = self.wait_success(context, rank, "get");
        if outcome.is_ok() {
            self.staging
                .region
                .bytes()
                .read(start, &mut dst[at..at + len]);
        }
        self.staging.give_back(start);
        outcome.map(|_| ())
    }

    /// Posts a get of `len` bytes at `src` in `rank`'s memory, landed at `address` (the C
    /// API's) under `handle` when it ends.
    pub(crate) fn get_to_address(
        &mut self,
        src: u64,
        len: usize,
        address: u64,
        rank: usize,
        handle: Handle,
    ) -> Result<(), ArmciError> {
        let remote = self.resolve(rank, src, len)?;
        for skip in (0..len).step_by(PIECE) {
            let piece = (len - skip).min(PIECE);
            let start = self.lease(piece)?;
            let posted = self.post_retrying_get(
                remote + skip as u64,
                start,
                piece,
                rank,
                Some((address + skip as u64, handle.0)),
            );
            if let Err(error) = posted {
                self.staging.give_back(start);
                return Err(error);
            }
            self.handles.entry(handle.0).or_default().outstanding += 1;
        }
        Ok(())
    }

    /// ARMCI_AccS: `dst += scale × src` over each run of the strided patch, under one hold of
    /// `rank`'s accumulate lock.
    ///
    /// # Errors
    /// As [`Armci::put_strided`]; runs that are not whole elements.
    pub fn acc_strided(
        &mut self,
        scale: Scale,
        src: &[u8],
        dst: u64,
        strides: Strides<'_>,
        rank: usize,
    ) -> Result<(), ArmciError> {
        let runs = strides.runs()?;
        let pieces = self.strided_pieces(src, dst, &runs)?;
        self.acc_pieces(scale, &pieces, rank)
    }

    /// `dst += scale × bytes` for each (bytes, destination) of `rank`, under one hold of its
    /// accumulate lock.
    ///
    /// # Errors
    /// As [`Armci::acc`].
    pub fn acc_pieces(
        &mut self,
        scale: Scale,
        pieces: &[(&[u8], u64)],
        rank: usize,
    ) -> Result<(), ArmciError> {
        let mut remotes = Vec::with_capacity(pieces.len());
        for &(bytes, dst) in pieces {
            if bytes.len() % scale.element_len() != 0 {
                return Err(ArmciError::Invalid(format!(
                    "{} bytes are not whole elements of {scale:?}",
                    bytes.len()
                )));
            }
            remotes.push(self.resolve(rank, dst, bytes.len())?);
        }
        if pieces.iter().all(|(bytes, _)| bytes.is_empty()) {
            return Ok(());
        }
        self.acquire(LockName::Accumulate(rank))?;
        let mut result = Ok(());
        for (&(bytes, _), remote) in pieces.iter().zip(remotes) {
            if !bytes.is_empty() {
                result = self.accumulate_locked(scale, bytes, remote, rank);
                if result.is_err() {
                    break;
                }
            }
        }
        let released = self.release(LockName::Accumulate(rank));
        result.and(released)
    }

    /// ARMCI_Wait: returns once every operation under `handle` has ended (a put's bytes in its
    /// target's memory, a get's here), and forgets the handle.
    ///
    /// # Errors
    /// The first operation under it that failed; the port failing.
    pub fn wait_handle(&mut self, handle: Handle) -> Result<(), ArmciError> {
        while self
            .handles
            .get(&handle.0)
            .is_some_and(|state| state.outstanding > 0)
        {
            self.progress(None)?;
        }
        match self.handles.remove(&handle.0).and_then(|s| s.failure) {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    /// ARMCI_Test: whether every operation under `handle` has ended (then the handle is
    /// forgotten, as by [`Armci::wait_handle`]). Never blocks.
    ///
    /// # Errors
    /// As [`Armci::wait_handle`], once the operations have ended.
    pub fn test_handle(&mut self, handle: Handle) -> Result<bool, ArmciError> {
        self.poll()?;
        if self
            .handles
            .get(&handle.0)
            .is_some_and(|state| state.outstanding > 0)
        {
            return Ok(false);
        }
        self.wait_handle(handle).map(|()| true)
    }

    /// ARMCI_WaitProc (`Some(rank)`) or ARMCI_WaitAll (`None`): waits for the operations made
    /// with no handle, to `rank` or to anyone.
    ///
    /// # Errors
    /// As [`Armci::wait_handle`].
    pub fn wait_implicit(&mut self, rank: Option<usize>) -> Result<(), ArmciError> {
        let handles: Vec<u64> = match rank {
            Some(rank) => vec![self.implicit_handle(rank).0],
            None => self
                .handles
                .keys()
                .copied()
                .filter(|h| h & IMPLICIT != 0)
                .collect(),
        };
        let mut outcome = Ok(());
        for handle in handles {
            outcome = outcome.and(self.wait_handle(Handle(handle)));
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(src: &[usize], dst: &[usize], count: &[usize]) -> Runs {
        Strides { src, dst, count }.runs().unwrap()
    }

    #[test]
    fn whole_rows_merge_into_one_run_and_the_rest_stay_runs() {
        // A 4 x 3 patch of 8-byte elements: rows of 32 bytes in a 32-byte-wide array on both
        // sides are one run of 96 bytes.
        assert_eq!(
            runs(&[32], &[32], &[32, 3]),
            Runs {
                len: 96,
                offsets: vec![(0, 0)]
            }
        );
        // The same rows out of a 100-byte-wide source: three runs.
        assert_eq!(
            runs(&[100], &[32], &[32, 3]),
            Runs {
                len: 32,
                offsets: vec![(0, 0), (100, 32), (200, 64)]
            }
        );
        // Two levels, level 1 fastest; the first merges on both sides, the second does not.
        assert_eq!(
            runs(&[4, 40], &[4, 16], &[4, 2, 2]),
            Runs {
                len: 8,
                offsets: vec![(0, 0), (40, 16)]
            }
        );
        assert_eq!(runs(&[], &[], &[5]).offsets, [(0, 0)]);
        assert!(runs(&[8], &[8], &[8, 0]).offsets.is_empty());
    }

    #[test]
    fn bad_shapes_are_refused_and_extents_reach_the_last_byte() {
        assert!(
            Strides {
                src: &[8],
                dst: &[],
                count: &[8, 2]
            }
            .runs()
            .is_err()
        );
        let deep = [1usize; 10];
        assert!(
            Strides {
                src: &deep,
                dst: &deep,
                count: &deep
            }
            .runs()
            .is_err()
        );
        assert!(
            Strides {
                src: &[usize::MAX],
                dst: &[8],
                count: &[8, 3]
            }
            .runs()
            .is_err()
        );
        let shape = Strides {
            src: &[100, 1000],
            dst: &[8, 24],
            count: &[8, 3, 2],
        };
        assert_eq!(shape.src_extent().unwrap(), 1000 + 200 + 8);
        assert_eq!(shape.dst_extent().unwrap(), 24 + 16 + 8);
    }
}
