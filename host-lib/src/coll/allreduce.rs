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
//!
//! Every step's message goes in pieces of [`PIECE`] bytes, each a message of its own whose
//! landing the receiver offers ahead: the sender stages the next piece while the NIC puts one
//! and the receiver combines the one before, so the three passes over a long vector overlap
//! and each reads what the last wrote while it is still in the caches.

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

/// Bytes of one piece of a step's message (less, to whole elements): a long step goes as pieces
/// of their own, so that the sender stages a piece while the NIC puts the one before and the
/// receiver combines the one before that, each pass reading what the last one wrote while it is
/// still in the caches (whole messages went through the three passes one after the other, each
/// over megabytes that had left them). 256 KiB: at 16 MiB and 8 processes on two cores, 128 and
/// 256 KiB ran ahead of 512 KiB, 1 and 2 MiB, and 64 KiB (eager pieces) behind them all.
const PIECE: usize = 256 << 10;
/// Most pieces of one message (a longer one takes longer pieces): a message's pieces go as
/// parts `part × PIECES + piece`, so the fix-up's two parts and the steps' stay apart.
const PIECES: usize = 64;
/// Pieces whose landing is offered ahead of the one the receiver waits for.
const OFFERED_AHEAD: usize = 2;

/// How a step takes what it receives.
#[derive(Clone, Copy)]
enum Take {
    /// Combined on the left of what is there: `target = received ∘ target`.
    Left,
    /// Combined on the right: `target = target ∘ received`.
    Right,
    /// Copied over what is there.
    Copy,
}

/// The pieces a message of `len` bytes goes in, each whole elements of `element` bytes.
struct Pieces {
    len: usize,
    each: usize,
}

impl Pieces {
    fn new(len: usize, element: usize) -> Self {
        let each = PIECE.max(len.div_ceil(PIECES)).div_ceil(element).max(1) * element;
        Self { len, each }
    }

    fn count(&self) -> usize {
        self.len.div_ceil(self.each)
    }

    /// Piece `index`'s bytes, from the message's start.
    fn range(&self, index: usize) -> std::ops::Range<usize> {
        index * self.each..((index + 1) * self.each).min(self.len)
    }
}

/// The part piece `piece` of a step's message `part` goes as.
fn piece_part(part: u32, piece: usize) -> u32 {
    // Below 2^26 steps (a ring of 2^25 ranks) and PIECES pieces this stays in a u32.
    part * PIECES as u32 + piece as u32
}

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

    /// One step, both ways as `part`: sends `buffer[out]` to `to` and takes what `from` sends
    /// into `buffer[into]` as `take` says, a piece at a time ([`PIECE`]) — its landing offered
    /// ahead, the next piece staged and sent before this rank waits for the one it takes, so
    /// that staging, putting and combining overlap. Either range may be empty.
    fn exchange(
        &mut self,
        (to, from): (usize, usize),
        part: u32,
        buffer: &mut [u8],
        out: std::ops::Range<usize>,
        into: std::ops::Range<usize>,
        take: Take,
    ) -> Result<(), CollError> {
        let outgoing = Pieces::new(out.len(), self.element);
        let incoming = Pieces::new(into.len(), self.element);
        for piece in 0..incoming.count().min(OFFERED_AHEAD) {
            self.op
                .offer(from, piece_part(part, piece), incoming.range(piece).len());
        }
        let mut sent = 0;
        for piece in 0..incoming.count().max(outgoing.count()) {
            // One piece ahead of the one taken: the first two go before the first wait.
            while sent < outgoing.count() && sent <= piece + 1 {
                let bytes = outgoing.range(sent);
                let data = self
                    .op
                    .stage(&buffer[out.start + bytes.start..out.start + bytes.end]);
                self.op.send(to, piece_part(part, sent), data);
                sent += 1;
            }
            if piece < incoming.count() {
                let ahead = piece + OFFERED_AHEAD;
                if ahead < incoming.count() {
                    self.op
                        .offer(from, piece_part(part, ahead), incoming.range(ahead).len());
                }
                let bytes = incoming.range(piece);
                let target = &mut buffer[into.start + bytes.start..into.start + bytes.end];
                let part = piece_part(part, piece);
                match take {
                    Take::Left => self.receive_left(from, part, target)?,
                    Take::Right => self.receive_right(from, part, target)?,
                    Take::Copy => self.op.receive_into(from, part, target)?,
                }
            }
        }
        Ok(())
    }

    /// The fix-up before a power-of-two algorithm: even ranks among the first `2 × extra`
    /// send their vector to the next rank, which combines it (the lower rank's on the left).
    fn fold(&mut self, folded: &Folded, buffer: &mut [u8]) -> Result<(), CollError> {
        let rank = self.op.rank();
        if rank < 2 * folded.extra {
            let whole = 0..buffer.len();
            let (peer, out, into) = if rank % 2 == 0 {
                (rank + 1, whole, 0..0)
            } else {
                (rank - 1, 0..0, whole)
            };
            self.exchange((peer, peer), PART_FOLD, buffer, out, into, Take::Left)?;
        }
        Ok(())
    }

    /// The fix-up after: the odd ranks among the first `2 × extra` send the result back.
    fn unfold(&mut self, folded: &Folded, buffer: &mut [u8]) -> Result<(), CollError> {
        let rank = self.op.rank();
        if rank < 2 * folded.extra {
            let whole = 0..buffer.len();
            let (peer, out, into) = if rank % 2 == 1 {
                (rank - 1, whole, 0..0)
            } else {
                (rank + 1, 0..0, whole)
            };
            self.exchange((peer, peer), PART_UNFOLD, buffer, out, into, Take::Copy)?;
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
                let take = if peer < rank { Take::Left } else { Take::Right };
                let whole = 0..buffer.len();
                self.exchange((peer, peer), part, buffer, whole.clone(), whole, take)?;
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
                self.exchange((peer, peer), part, buffer, given, kept_bytes, Take::Left)?;
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
                self.exchange((peer, peer), part, buffer, mine, theirs_bytes, Take::Copy)?;
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
            self.exchange((next, previous), part, buffer, out, into, Take::Left)?;
            part += 1;
        }
        for step in 0..size - 1 {
            let out = self.block(length, size, (rank + 1 + size - step) % size);
            let into = self.block(length, size, (rank + size - step) % size);
            self.exchange((next, previous), part, buffer, out, into, Take::Copy)?;
            part += 1;
        }
        Ok(())
    }
}
