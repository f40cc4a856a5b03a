//! MPI_Allreduce over messages, for what the NIC does not combine (more than
//! [`crate::NIC_REDUCE_MAX`] bytes, or operations the NIC does not know): recursive doubling,
//! Rabenseifner's reduce-scatter and allgather, and the ring, each with the non-power-of-two
//! fix-up where it needs one (Thakur, Rabenseifner and Gropp, *Optimization of Collective
//! Communication Operations in MPICH*).
//!
//! The caller brings the operation as a function `combine(source, target)` that leaves
//! `source ∘ target` in `target`, elements of `element` bytes (MPI's `MPI_Reduce_local`
//! order): recursive doubling keeps the ranks' order (the lower ranks' value always on the
//! left), so it is right for operations that do not commute; Rabenseifner's and the ring need
//! commutative ones. Every rank ends with the same bits: recursive doubling combines the same
//! operands in the same order on every rank, and the other two compute each block once and
//! pass it on.

use super::algorithm::Allreduce;
use super::error::CollError;
use super::op::Op;

/// MPI_Allreduce of `buffer` (whole elements of `element` bytes) in place with `combine`
/// (`combine(source, target)` leaves `source ∘ target` in `target`); `commutative` says
/// whether the operation commutes (if not, recursive doubling runs whatever `algorithm` says).
///
/// # Errors
/// [`CollError::Argument`] when `buffer` is not whole elements; as [`super::scatter`]
/// otherwise.
pub fn allreduce(
    mut op: Op<'_>,
    buffer: &mut [u8],
    element: usize,
    combine: &mut dyn FnMut(&[u8], &mut [u8]),
    commutative: bool,
    algorithm: Allreduce,
) -> Result<(), CollError> {
    if element == 0 || buffer.len() % element != 0 {
        return Err(CollError::Argument(format!(
            "{} bytes are not whole elements of {element} bytes",
            buffer.len()
        )));
    }
    if op.size() == 1 || buffer.is_empty() {
        return op.finish();
    }
    let mut run = Reduction {
        op: &mut op,
        element,
        combine,
    };
    match algorithm {
        _ if !commutative => run.recursive_doubling(buffer)?,
        Allreduce::RecursiveDoubling => run.recursive_doubling(buffer)?,
        Allreduce::Rabenseifner => run.rabenseifner(buffer)?,
        Allreduce::Ring => run.ring(buffer)?,
    }
    op.finish()
}

/// The parts of one allreduce's messages: the fix-up's, then one per step of each phase.
const PART_FOLD: u32 = 0;
/// The fix-up's result, back to the ranks that sat out.
const PART_UNFOLD: u32 = 1;
/// The first part of the steps.
const PART_STEPS: u32 = 2;

/// One allreduce under way.
struct Reduction<'o, 'a, 'c> {
    op: &'o mut Op<'a>,
    element: usize,
    combine: &'c mut dyn FnMut(&[u8], &mut [u8]),
}

/// How the ranks stand for a power-of-two algorithm: the largest power of two not above the
/// group's size runs it; of the first `2 × extra` ranks, each even one first folds its vector
/// into the odd one after it and waits for the result.
struct Folded {
    /// The power of two.
    pof2: usize,
    /// The ranks over it.
    extra: usize,
    /// This rank's place among the `pof2` (None: it sat out).
    virtual_rank: Option<usize>,
}

impl Folded {
    fn new(size: usize, rank: usize) -> Self {
        let pof2 = 1 << (usize::BITS - 1 - size.leading_zeros());
        let extra = size - pof2;
        let virtual_rank = if rank < 2 * extra {
            (rank % 2 == 1).then_some(rank / 2)
        } else {
            Some(rank - extra)
        };
        Self {
            pof2,
            extra,
            virtual_rank,
        }
    }

    /// The real rank of virtual rank `v`.
    fn real(&self, v: usize) -> usize {
        if v < self.extra {
            2 * v + 1
        } else {
            v + self.extra
        }
    }
}

impl Reduction<'_, '_, '_> {
    /// Receives `part` from `from` into `target` combined on the right: `target = received ∘
    /// target`.
    fn receive_left(&mut self, from: usize, part: u32, target: &mut [u8]) -> Result<(), CollError> {
        let data = self.op.receive(from, part, target.len())?;
        (self.combine)(&data, target);
        Ok(())
    }

    /// Receives `part` from `from` and combines it on the right of `target`: `target = target
    /// ∘ received`.
    fn receive_right(
        &mut self,
        from: usize,
        part: u32,
        target: &mut [u8],
    ) -> Result<(), CollError> {
        let mut data = self.op.receive(from, part, target.len())?;
        (self.combine)(target, &mut data);
        target.copy_from_slice(&data);
        Ok(())
    }

    /// The fix-up before a power-of-two algorithm: even ranks among the first `2 × extra`
    /// send their vector to the next rank, which combines it (the lower rank's on the left).
    fn fold(&mut self, folded: &Folded, buffer: &mut [u8]) -> Result<(), CollError> {
        let rank = self.op.rank();
        if rank < 2 * folded.extra {
            if rank % 2 == 0 {
                let data = self.op.stage(buffer);
                self.op.send(rank + 1, PART_FOLD, data);
            } else {
                self.receive_left(rank - 1, PART_FOLD, buffer)?;
            }
        }
        Ok(())
    }

    /// The fix-up after: the odd ranks among the first `2 × extra` send the result back.
    fn unfold(&mut self, folded: &Folded, buffer: &mut [u8]) -> Result<(), CollError> {
        let rank = self.op.rank();
        if rank < 2 * folded.extra {
            if rank % 2 == 1 {
                let data = self.op.stage(buffer);
                self.op.send(rank - 1, PART_UNFOLD, data);
            } else {
                self.op.receive_into(rank + 1, PART_UNFOLD, buffer)?;
            }
        }
        Ok(())
    }

    /// Recursive doubling: log2 steps, each exchanging the whole vector with the rank a power
    /// of two away and combining in rank order.
    fn recursive_doubling(&mut self, buffer: &mut [u8]) -> Result<(), CollError> {
        let rank = self.op.rank();
        let folded = Folded::new(self.op.size(), rank);
        self.fold(&folded, buffer)?;
        if let Some(me) = folded.virtual_rank {
            let mut mask = 1;
            let mut part = PART_STEPS;
            while mask < folded.pof2 {
                let peer = folded.real(me ^ mask);
                let data = self.op.stage(buffer);
                self.op.send(peer, part, data);
                if peer < rank {
                    self.receive_left(peer, part, buffer)?;
                } else {
                    self.receive_right(peer, part, buffer)?;
                }
                mask <<= 1;
                part += 1;
            }
        }
        self.unfold(&folded, buffer)
    }

    /// The byte range of block `index` of `blocks` (whole elements, as even as they come).
    fn block(&self, length: usize, blocks: usize, index: usize) -> std::ops::Range<usize> {
        let elements = length / self.element;
        let start = index * elements / blocks;
        let end = (index + 1) * elements / blocks;
        start * self.element..end * self.element
    }

    /// The bytes of blocks `first..last` of `blocks`.
    fn blocks(
        &self,
        length: usize,
        blocks: usize,
        first: usize,
        last: usize,
    ) -> std::ops::Range<usize> {
        self.block(length, blocks, first).start..self.block(length, blocks, last - 1).end
    }

    /// Rabenseifner's: a reduce-scatter by recursive halving (each step sends half of what is
    /// left to the partner and combines the other half with the partner's), then an allgather
    /// by recursive doubling; on `pof2` ranks after the fix-up.
    fn rabenseifner(&mut self, buffer: &mut [u8]) -> Result<(), CollError> {
        let length = buffer.len();
        let folded = Folded::new(self.op.size(), self.op.rank());
        self.fold(&folded, buffer)?;
        if let Some(me) = folded.virtual_rank {
            let pof2 = folded.pof2;
            let (mut first, mut last) = (0, pof2);
            let mut part = PART_STEPS;
            let mut mask = pof2 / 2;
            while mask > 0 {
                let peer = folded.real(me ^ mask);
                let middle = first + (last - first) / 2;
                let (kept, given) = if me & mask == 0 {
                    ((first, middle), (middle, last))
                } else {
                    ((middle, last), (first, middle))
                };
                let given = self.blocks(length, pof2, given.0, given.1);
                let kept_bytes = self.blocks(length, pof2, kept.0, kept.1);
                if !given.is_empty() {
                    let data = self.op.stage(&buffer[given]);
                    self.op.send(peer, part, data);
                }
                if !kept_bytes.is_empty() {
                    self.receive_left(peer, part, &mut buffer[kept_bytes])?;
                }
                (first, last) = kept;
                mask /= 2;
                part += 1;
            }
            let mut mask = 1;
            while mask < pof2 {
                let peer = folded.real(me ^ mask);
                let theirs = if me & mask == 0 {
                    (last, last + (last - first))
                } else {
                    (first - (last - first), first)
                };
                let mine = self.blocks(length, pof2, first, last);
                let theirs_bytes = self.blocks(length, pof2, theirs.0, theirs.1);
                if !mine.is_empty() {
                    let data = self.op.stage(&buffer[mine]);
                    self.op.send(peer, part, data);
                }
                if !theirs_bytes.is_empty() {
                    self.op
                        .receive_into(peer, part, &mut buffer[theirs_bytes])?;
                }
                (first, last) = (first.min(theirs.0), last.max(theirs.1));
                mask <<= 1;
                part += 1;
            }
        }
        self.unfold(&folded, buffer)
    }

    /// The ring: `size - 1` steps of a reduce-scatter, each passing one block to the next
    /// rank, then `size - 1` steps of an allgather around the same ring; every rank sends and
    /// receives about twice the vector whatever the size.
    fn ring(&mut self, buffer: &mut [u8]) -> Result<(), CollError> {
        let (size, rank) = (self.op.size(), self.op.rank());
        let length = buffer.len();
        let (next, previous) = ((rank + 1) % size, (rank + size - 1) % size);
        let mut part = PART_STEPS;
        for step in 0..size - 1 {
            let out = self.block(length, size, (rank + size - step) % size);
            let into = self.block(length, size, (rank + 2 * size - step - 1) % size);
            if !out.is_empty() {
                let data = self.op.stage(&buffer[out]);
                self.op.send(next, part, data);
            }
            if !into.is_empty() {
                self.receive_left(previous, part, &mut buffer[into])?;
            }
            part += 1;
        }
        for step in 0..size - 1 {
            let out = self.block(length, size, (rank + 1 + size - step) % size);
            let into = self.block(length, size, (rank + size - step) % size);
            if !out.is_empty() {
                let data = self.op.stage(&buffer[out]);
                self.op.send(next, part, data);
            }
            if !into.is_empty() {
                self.op.receive_into(previous, part, &mut buffer[into])?;
            }
            part += 1;
        }
        Ok(())
    }
}
