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
//!
//! An algorithm is a schedule of exchanges that depends only on the group's size, the rank and
//! the vector's length; [`allreduce`] runs it waiting, [`allreduce_start`] in the background
//! (MPI_Iallreduce), the same exchanges in the same order.

use std::ops::Range;

use crate::Member;

use super::algorithm::Allreduce;
use super::endpoint::{Background, Endpoint};
use super::error::CollError;
use super::op::{Op, Suspended};

/// An allreduce's combining function: `combine(source, target)` leaves `source ∘ target` in
/// `target`.
pub type Combine<'c> = dyn FnMut(&[u8], &mut [u8]) + 'c;

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
    let steps = schedule(&op, buffer.len(), element, commutative, algorithm)?;
    for exchange in &steps {
        let mut at = Progress::default();
        exchange.advance(&mut op, &mut at, buffer, element, combine, Wait::Yes)?;
    }
    op.finish()
}

/// MPI_Iallreduce: [`allreduce`] of `buffer` in the background, on `op`'s endpoint; returns
/// its ticket. Every wait on the endpoint progresses it, as [`Endpoint::background_end`] does,
/// which brings the result once it has ended.
///
/// ```no_run
/// use std::time::Duration;
/// use nicbar::coll::{Allreduce, Endpoint, Op, allreduce_start};
/// use nicbar::{Member, NodeId, Port, PortId};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut endpoint = Endpoint::new(Port::open(0, 1)?)?;
/// let members: Vec<Member> = (0..4).map(|n| Member::new(NodeId::new(n), PortId(1))).collect();
/// // A sum of little-endian u64s, as every rank calls it.
/// let add = |source: &[u8], target: &mut [u8]| {
///     for (a, b) in source.chunks_exact(8).zip(target.chunks_exact_mut(8)) {
///         let sum = u64::from_le_bytes(a.try_into().unwrap())
///             .wrapping_add(u64::from_le_bytes((&*b).try_into().unwrap()));
///         b.copy_from_slice(&sum.to_le_bytes());
///     }
/// };
/// let op = Op::new(&mut endpoint, &members, 5, 1)?;
/// let vector = vec![1u8; 1 << 20];
/// let ticket = allreduce_start(op, vector, 8, Box::new(add), true, Allreduce::Rabenseifner)?;
/// // ... compute, calling into the endpoint now and then ...
/// let sum = loop {
///     if let Some((outcome, sum)) = endpoint.background_end(ticket) {
///         outcome?;
///         break sum;
///     }
///     endpoint.wait(Duration::from_millis(1));
/// };
/// # let _ = sum;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// As [`allreduce`], for the arguments; the rest comes with its end.
pub fn allreduce_start(
    op: Op<'_>,
    buffer: Vec<u8>,
    element: usize,
    combine: Box<Combine<'static>>,
    commutative: bool,
    algorithm: Allreduce,
) -> Result<u64, CollError> {
    let steps = schedule(&op, buffer.len(), element, commutative, algorithm)?;
    Ok(op.into_background(|members, identity, suspended| {
        Box::new(InBackground {
            members,
            identity,
            suspended: Some(suspended),
            steps,
            step: 0,
            at: Progress::default(),
            element,
            buffer,
            combine,
        })
    }))
}

/// The schedule of an allreduce of `length` bytes of `element`-byte elements on `op`'s group.
fn schedule(
    op: &Op<'_>,
    length: usize,
    element: usize,
    commutative: bool,
    algorithm: Allreduce,
) -> Result<Vec<Exchange>, CollError> {
    if element == 0 || length % element != 0 {
        return Err(CollError::Argument(format!(
            "{length} bytes are not whole elements of {element} bytes"
        )));
    }
    let plan = Plan {
        size: op.size(),
        rank: op.rank(),
        length,
        element,
    };
    if plan.size == 1 || length == 0 {
        return Ok(Vec::new());
    }
    let mut steps = Vec::new();
    match algorithm {
        _ if !commutative => plan.recursive_doubling(&mut steps),
        Allreduce::RecursiveDoubling => plan.recursive_doubling(&mut steps),
        Allreduce::Rabenseifner => plan.rabenseifner(&mut steps),
        Allreduce::Ring => plan.ring(&mut steps),
    }
    Ok(steps)
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
#[derive(Clone, Copy, Debug, PartialEq)]
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
    fn range(&self, index: usize) -> Range<usize> {
        index * self.each..((index + 1) * self.each).min(self.len)
    }
}

/// The part piece `piece` of a step's message `part` goes as.
fn piece_part(part: u32, piece: usize) -> u32 {
    // Below 2^26 steps (a ring of 2^25 ranks) and PIECES pieces this stays in a u32.
    part * PIECES as u32 + piece as u32
}

/// One step, both ways as `part`: `buffer[out]` goes to `to`, and what `from` sends is taken
/// into `buffer[into]` as `take` says. Either range may be empty.
#[derive(Clone, Debug, PartialEq)]
struct Exchange {
    to: usize,
    from: usize,
    part: u32,
    out: Range<usize>,
    into: Range<usize>,
    take: Take,
}

/// How far an exchange has come: its first landings offered, the pieces sent, offered and
/// taken.
#[derive(Default)]
struct Progress {
    sent: usize,
    offered: usize,
    taken: usize,
}

/// Whether an exchange waits for what it receives, or leaves off until called again.
#[derive(Clone, Copy, PartialEq)]
enum Wait {
    Yes,
    No,
}

impl Exchange {
    /// Runs the exchange a piece at a time ([`PIECE`]) from where `at` says — landings
    /// offered two pieces ahead of the one taken, the next piece staged and sent before this
    /// rank waits for the one it takes, so that staging, putting and combining overlap — to its end (true), or
    /// with [`Wait::No`] until a piece it takes has not come (false).
    fn advance(
        &self,
        op: &mut Op<'_>,
        at: &mut Progress,
        buffer: &mut [u8],
        element: usize,
        combine: &mut Combine<'_>,
        wait: Wait,
    ) -> Result<bool, CollError> {
        let outgoing = Pieces::new(self.out.len(), element);
        let incoming = Pieces::new(self.into.len(), element);
        loop {
            // Landings first, so that the peer's puts may start before this rank stages.
            while at.offered < incoming.count().min(at.taken + OFFERED_AHEAD + 1) {
                let length = incoming.range(at.offered).len();
                op.offer(self.from, piece_part(self.part, at.offered), length);
                at.offered += 1;
            }
            // One piece ahead of the one taken: the first two go before the first wait; all
            // that are left once nothing more comes.
            while at.sent < outgoing.count()
                && (at.sent <= at.taken + 1 || at.taken == incoming.count())
            {
                let bytes = outgoing.range(at.sent);
                let data = op.stage(&buffer[self.out.start + bytes.start..][..bytes.len()]);
                op.send(self.to, piece_part(self.part, at.sent), data);
                at.sent += 1;
            }
            if at.taken == incoming.count() {
                return Ok(true);
            }
            let bytes = incoming.range(at.taken);
            let target = &mut buffer[self.into.start + bytes.start..][..bytes.len()];
            let part = piece_part(self.part, at.taken);
            let took = match (self.take, wait) {
                (Take::Copy, Wait::Yes) => op.receive_into(self.from, part, target).map(|()| true),
                (Take::Copy, Wait::No) => op.try_receive_into(self.from, part, target),
                (take, wait) => {
                    let data = match wait {
                        Wait::Yes => Some(op.receive(self.from, part, target.len())?),
                        Wait::No => op.try_receive(self.from, part, target.len())?,
                    };
                    match (data, take) {
                        (None, _) => Ok(false),
                        (Some(data), Take::Left) => {
                            combine(&data, target);
                            Ok(true)
                        }
                        (Some(mut data), _) => {
                            combine(target, &mut data);
                            target.copy_from_slice(&data);
                            Ok(true)
                        }
                    }
                }
            }?;
            if !took {
                return Ok(false);
            }
            at.taken += 1;
        }
    }
}

/// What an allreduce's schedule depends on.
struct Plan {
    size: usize,
    rank: usize,
    length: usize,
    element: usize,
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

impl Plan {
    /// The exchange with `peer` (both ways) as `part`.
    fn with(peer: usize, part: u32, out: Range<usize>, into: Range<usize>, take: Take) -> Exchange {
        Exchange {
            to: peer,
            from: peer,
            part,
            out,
            into,
            take,
        }
    }

    /// The fix-up before a power-of-two algorithm: even ranks among the first `2 × extra`
    /// send their vector to the next rank, which combines it (the lower rank's on the left).
    fn fold(&self, folded: &Folded, steps: &mut Vec<Exchange>) {
        if self.rank < 2 * folded.extra {
            let whole = 0..self.length;
            steps.push(if self.rank % 2 == 0 {
                Self::with(self.rank + 1, PART_FOLD, whole, 0..0, Take::Left)
            } else {
                Self::with(self.rank - 1, PART_FOLD, 0..0, whole, Take::Left)
            });
        }
    }

    /// The fix-up after: the odd ranks among the first `2 × extra` send the result back.
    fn unfold(&self, folded: &Folded, steps: &mut Vec<Exchange>) {
        if self.rank < 2 * folded.extra {
            let whole = 0..self.length;
            steps.push(if self.rank % 2 == 1 {
                Self::with(self.rank - 1, PART_UNFOLD, whole, 0..0, Take::Copy)
            } else {
                Self::with(self.rank + 1, PART_UNFOLD, 0..0, whole, Take::Copy)
            });
        }
    }

    /// Recursive doubling: log2 steps, each exchanging the whole vector with the rank a power
    /// of two away and combining in rank order.
    fn recursive_doubling(&self, steps: &mut Vec<Exchange>) {
        let folded = Folded::new(self.size, self.rank);
        self.fold(&folded, steps);
        if let Some(me) = folded.virtual_rank {
            let mut mask = 1;
            let mut part = PART_STEPS;
            while mask < folded.pof2 {
                let peer = folded.real(me ^ mask);
                let take = if peer < self.rank {
                    Take::Left
                } else {
                    Take::Right
                };
                let whole = 0..self.length;
                steps.push(Self::with(peer, part, whole.clone(), whole, take));
                mask <<= 1;
                part += 1;
            }
        }
        self.unfold(&folded, steps);
    }

    /// The byte range of block `index` of `blocks` (whole elements, as even as they come).
    fn block(&self, blocks: usize, index: usize) -> Range<usize> {
        let elements = self.length / self.element;
        let start = index * elements / blocks;
        let end = (index + 1) * elements / blocks;
        start * self.element..end * self.element
    }

    /// The bytes of blocks `first..last` of `blocks`.
    fn blocks(&self, blocks: usize, first: usize, last: usize) -> Range<usize> {
        self.block(blocks, first).start..self.block(blocks, last - 1).end
    }

    /// Rabenseifner's: a reduce-scatter by recursive halving (each step sends half of what is
    /// left to the partner and combines the other half with the partner's), then an allgather
    /// by recursive doubling; on `pof2` ranks after the fix-up.
    fn rabenseifner(&self, steps: &mut Vec<Exchange>) {
        let folded = Folded::new(self.size, self.rank);
        self.fold(&folded, steps);
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
                let given = self.blocks(pof2, given.0, given.1);
                let kept_bytes = self.blocks(pof2, kept.0, kept.1);
                steps.push(Self::with(peer, part, given, kept_bytes, Take::Left));
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
                let mine = self.blocks(pof2, first, last);
                let theirs_bytes = self.blocks(pof2, theirs.0, theirs.1);
                steps.push(Self::with(peer, part, mine, theirs_bytes, Take::Copy));
                (first, last) = (first.min(theirs.0), last.max(theirs.1));
                mask <<= 1;
                part += 1;
            }
        }
        self.unfold(&folded, steps);
    }

    /// The ring: `size - 1` steps of a reduce-scatter, each passing one block to the next
    /// rank, then `size - 1` steps of an allgather around the same ring; every rank sends and
    /// receives about twice the vector whatever the size.
    fn ring(&self, steps: &mut Vec<Exchange>) {
        let (size, rank) = (self.size, self.rank);
        let (next, previous) = ((rank + 1) % size, (rank + size - 1) % size);
        let mut part = PART_STEPS;
        for (phase, take) in [(0, Take::Left), (1, Take::Copy)] {
            for step in 0..size - 1 {
                let out = self.block(size, (rank + phase + size - step) % size);
                let into = self.block(size, (rank + phase + 2 * size - step - 1) % size);
                steps.push(Exchange {
                    to: next,
                    from: previous,
                    part,
                    out,
                    into,
                    take,
                });
                part += 1;
            }
        }
    }
}

/// An allreduce in the background ([`allreduce_start`]): its schedule, how far it has come,
/// and its vector, owned until it ends.
struct InBackground {
    members: Vec<Member>,
    identity: (usize, u32, u32),
    /// None while a poll runs it.
    suspended: Option<Suspended>,
    steps: Vec<Exchange>,
    step: usize,
    at: Progress,
    element: usize,
    buffer: Vec<u8>,
    combine: Box<Combine<'static>>,
}

impl InBackground {
    /// Runs what can run now on `op`; true once every step is done and every send is in the
    /// NIC's hands.
    fn run(&mut self, op: &mut Op<'_>) -> Result<bool, CollError> {
        let waiting_for = self
            .steps
            .get(self.step)
            .map_or(self.identity.0, |e| e.from);
        op.poll(waiting_for)?;
        while let Some(exchange) = self.steps.get(self.step) {
            let (buffer, combine) = (&mut self.buffer, &mut *self.combine);
            if !exchange.advance(op, &mut self.at, buffer, self.element, combine, Wait::No)? {
                return Ok(false);
            }
            self.step += 1;
            self.at = Progress::default();
        }
        op.try_finish()
    }
}

impl Background for InBackground {
    fn poll(&mut self, endpoint: &mut Endpoint) -> Option<Result<(), CollError>> {
        let suspended = self.suspended.take()?;
        // Lent to the operation while it runs.
        let members = std::mem::take(&mut self.members);
        let mut op = Op::resume(endpoint, &members, self.identity, suspended);
        let ended = match self.run(&mut op) {
            Ok(false) => {
                self.suspended = Some(op.suspend());
                None
            }
            ended => {
                // Ended, well or not: its sends are the NIC's alone from here.
                drop(op);
                Some(ended.map(|_| ()))
            }
        };
        self.members = members;
        ended
    }

    fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buffer)
    }
}
