//! The compilers proper: one emitter per algorithm, writing into the caller's buffer.

use crate::arith::{add_mod, dissemination_rounds, distinct_offsets, floor_log2, mul_mod, sub_mod};
use crate::check::{check_group, steps_needed};
use crate::{
    Algorithm, MAX_ROUNDS, MAX_SCHEDULE_STEPS, Member, ScheduleError, Step, StepCombine, StepOp,
};

/// Compiles `algorithm` for rank `rank` of the group `members` into `out`, and returns how many
/// steps it wrote (the schedule is `out[..count]`).
///
/// # Errors
/// The group is empty, has one member ([`ScheduleError::TrivialGroup`]: complete the barrier
/// without the NIC), names a port out of range or one member twice; `rank` or the algorithm's
/// parameters are out of range; the group needs too many rounds or too long a schedule for some
/// rank; or `out` is shorter than this rank's schedule (the error says how long it is). On error
/// the contents of `out` are unspecified.
pub fn compile(
    algorithm: Algorithm,
    members: &[Member],
    rank: usize,
    out: &mut [Step],
) -> Result<usize, ScheduleError> {
    check_group(members, rank)?;
    let longest = steps_needed(algorithm, members.len())?;
    if longest > MAX_SCHEDULE_STEPS {
        return Err(ScheduleError::TooManySteps { steps: longest });
    }
    let mut writer = StepWriter {
        out,
        members,
        written: 0,
    };
    match algorithm {
        Algorithm::PairwiseExchange => emit_pairwise_exchange(&mut writer, rank)?,
        Algorithm::GatherBroadcast { dimension, root } => {
            emit_gather_broadcast(&mut writer, rank, dimension, root)?;
        }
        Algorithm::Dissemination { n } => emit_dissemination(&mut writer, rank, n)?,
    }
    let available = writer.out.len();
    if writer.written > available {
        return Err(ScheduleError::OutputTooSmall {
            needed: writer.written,
            available,
        });
    }
    Ok(writer.written)
}

/// Compiles [`Algorithm::PairwiseExchange`] for `rank` of `members` into `out`; returns the number
/// of steps written.
///
/// With `N` members and `P` the largest power of two `<= N`, rank `i < P` exchanges with
/// `i XOR 2^b` in round `b` for `b = 0..log2 P`. A rank `e >= P` first sends to `e - P` (round
/// `log2 P`), which receives that before its exchanges; after them `e - P` sends the release to
/// `e` (round `log2 P + 1`), which waits for it. The fix-up's two rounds have numbers of their
/// own, so no (peer, round) pair is used twice.
///
/// # Errors
/// See [`compile`].
pub fn pairwise_exchange(
    members: &[Member],
    rank: usize,
    out: &mut [Step],
) -> Result<usize, ScheduleError> {
    compile(Algorithm::PairwiseExchange, members, rank, out)
}

/// Compiles [`Algorithm::GatherBroadcast`] for `rank` of `members` into `out`; returns the number
/// of steps written.
///
/// Ranks are relabelled relative to `root` (`v = (rank - root) mod N`); node `v` has the children
/// `dimension·v + 1 ..= dimension·v + dimension` below `N`. Gather (round 0): receive from each
/// child, then send to the parent. Broadcast (round 1): receive from the parent, then send to each
/// child. The root only gathers and then broadcasts.
///
/// # Errors
/// See [`compile`].
pub fn gather_broadcast(
    members: &[Member],
    rank: usize,
    dimension: usize,
    root: usize,
    out: &mut [Step],
) -> Result<usize, ScheduleError> {
    compile(
        Algorithm::GatherBroadcast { dimension, root },
        members,
        rank,
        out,
    )
}

/// Compiles [`Algorithm::Dissemination`] for `rank` of `members` into `out`; returns the number of
/// steps written.
///
/// In round `r` (`0..⌈log_{n+1} N⌉`) the rank sends to `(rank + j·(n+1)^r) mod N` and then
/// receives from `(rank - j·(n+1)^r) mod N`, `j = 1..=n` (Hoefler et al., *Fast Barrier
/// Synchronization for InfiniBand*, equations 1-2). On small groups some offsets `j·(n+1)^r`
/// coincide modulo `N` or vanish; those `j` are skipped. The skipped `j` depend only on `N`, `n`
/// and `r`, so when a rank skips sending to a peer in a round, that peer skips receiving from it in
/// the same round.
///
/// # Errors
/// See [`compile`].
pub fn dissemination(
    members: &[Member],
    rank: usize,
    n: usize,
    out: &mut [Step],
) -> Result<usize, ScheduleError> {
    compile(Algorithm::Dissemination { n }, members, rank, out)
}

/// Compiles an allreduce (or reduce) of `members` for `rank` into `out`; returns the number of
/// steps written. It is the pairwise exchange's schedule — recursive doubling, with the
/// non-power-of-two fix-up (paper §5.1) — whose steps combine the values their packets carry:
/// each member sends its value so far, and combines what it receives in a fixed order, the
/// lower-ranked block's value on the left ([`StepCombine::PEER_LEFT`]); a member past the
/// largest power of two hands its value to its partner first and gets the result back
/// ([`StepCombine::REPLACE`]). No path counts a member twice, so operations that are not
/// idempotent (`SUM`, `PROD`, `LXOR`, `BXOR`) come out right; and every member computes the
/// same expression tree — `((x0 ⊕ x1) ⊕ (x2 ⊕ x3)) ⊕ …`, with `x_i ⊕ x_(i+2^k)` in place of `x_i`
/// for the fix-up's pairs — so the result is bit-identical on every member and from run to run,
/// whatever order packets arrive in.
///
/// # Errors
/// As [`compile`] with [`Algorithm::PairwiseExchange`].
pub fn allreduce(
    members: &[Member],
    rank: usize,
    out: &mut [Step],
) -> Result<usize, ScheduleError> {
    check_group(members, rank)?;
    let longest = steps_needed(Algorithm::PairwiseExchange, members.len())?;
    if longest > MAX_SCHEDULE_STEPS {
        return Err(ScheduleError::TooManySteps { steps: longest });
    }
    let mut writer = StepWriter {
        out,
        members,
        written: 0,
    };
    emit_allreduce(&mut writer, rank)?;
    let available = writer.out.len();
    if writer.written > available {
        return Err(ScheduleError::OutputTooSmall {
            needed: writer.written,
            available,
        });
    }
    Ok(writer.written)
}

fn emit_allreduce(writer: &mut StepWriter<'_>, rank: usize) -> Result<(), ScheduleError> {
    let members = writer.members.len();
    let exchanges = floor_log2(members);
    let power = 1usize << exchanges;
    let extra = members - power;
    let (pre_round, post_round) = (exchanges, exchanges + 1);
    if rank >= power {
        // Past the power of two: hand the value to the partner, take the result back.
        writer.push(StepOp::SEND, rank - power, pre_round)?;
        writer.push(StepOp::RECV, rank - power, post_round)?;
        return writer.annotate_last(StepCombine::REPLACE);
    }
    if rank < extra {
        // The partner ranks higher: its value goes on the right.
        writer.push(StepOp::RECV, rank + power, pre_round)?;
        writer.annotate_last(StepCombine::COMBINE)?;
    }
    for bit in 0..exchanges {
        let peer = rank ^ (1 << bit);
        writer.push(StepOp::EXCHANGE, peer, bit)?;
        let combine = if peer < rank {
            StepCombine::COMBINE.union(StepCombine::PEER_LEFT)
        } else {
            StepCombine::COMBINE
        };
        writer.annotate_last(combine)?;
    }
    if rank < extra {
        writer.push(StepOp::SEND, rank + power, post_round)?;
    }
    Ok(())
}

/// Fills `out` in order and counts past its end, so that a short buffer reports the length it
/// would have needed.
struct StepWriter<'a> {
    out: &'a mut [Step],
    members: &'a [Member],
    written: usize,
}

impl StepWriter<'_> {
    fn push(&mut self, op: StepOp, peer: usize, round: usize) -> Result<(), ScheduleError> {
        let member = self
            .members
            .get(peer)
            .ok_or(ScheduleError::RankOutOfRange {
                rank: peer,
                members: self.members.len(),
            })?;
        let round = u8::try_from(round)
            .ok()
            .filter(|round| *round < MAX_ROUNDS)
            .ok_or(ScheduleError::TooManyRounds {
                rounds: round.saturating_add(1),
            })?;
        if let Some(slot) = self.out.get_mut(self.written) {
            *slot = Step::new(op, member.node, member.port, round);
        }
        self.written += 1;
        Ok(())
    }

    /// Sets the treatment of the received value on the step written last.
    fn annotate_last(&mut self, combine: StepCombine) -> Result<(), ScheduleError> {
        if let Some(slot) = self
            .written
            .checked_sub(1)
            .and_then(|last| self.out.get_mut(last))
        {
            *slot = slot.with_combine(combine);
        }
        Ok(())
    }
}

fn emit_pairwise_exchange(writer: &mut StepWriter<'_>, rank: usize) -> Result<(), ScheduleError> {
    let members = writer.members.len();
    let exchanges = floor_log2(members);
    let power = 1usize << exchanges;
    let extra = members - power;
    let (pre_round, post_round) = (exchanges, exchanges + 1);
    if rank >= power {
        // An extra rank: announce arrival to its partner, then wait for the release.
        writer.push(StepOp::SEND, rank - power, pre_round)?;
        return writer.push(StepOp::RECV, rank - power, post_round);
    }
    if rank < extra {
        writer.push(StepOp::RECV, rank + power, pre_round)?;
    }
    for bit in 0..exchanges {
        writer.push(StepOp::EXCHANGE, rank ^ (1 << bit), bit)?;
    }
    if rank < extra {
        writer.push(StepOp::SEND, rank + power, post_round)?;
    }
    Ok(())
}

fn emit_gather_broadcast(
    writer: &mut StepWriter<'_>,
    rank: usize,
    dimension: usize,
    root: usize,
) -> Result<(), ScheduleError> {
    let members = writer.members.len();
    let relative = sub_mod(rank, root, members);
    let first_child = relative.saturating_mul(dimension).saturating_add(1);
    let last_child = relative
        .saturating_mul(dimension)
        .saturating_add(dimension)
        .min(members - 1);
    let parent = (relative != 0).then(|| add_mod((relative - 1) / dimension, root, members));
    let children = (first_child..=last_child).map(|child| add_mod(child, root, members));
    gather_broadcast_steps(parent, children, |op, peer, round| {
        writer.push(op, peer, round)
    })
}

/// The steps of one node of a gather-broadcast tree, in the order the NIC runs them, whatever
/// the tree's shape: receive from each of `children` (the gather, round 0), send to `parent` and
/// receive from it (unless the node is the root: round 0, then round 1), then send to each of
/// `children` (the broadcast, round 1). Each step goes to `step(op, peer, round)` in turn; the
/// first error it returns ends the layout.
///
/// [`gather_broadcast`] lays out its `dimension`-ary trees with it; a caller whose tree is given
/// node by node (GM's `gm_barrier_send_with_callback` names a parent and children) lays out the
/// same steps.
///
/// # Errors
/// The first error of `step`.
pub fn gather_broadcast_steps<P: Copy, E>(
    parent: Option<P>,
    children: impl Iterator<Item = P> + Clone,
    mut step: impl FnMut(StepOp, P, usize) -> Result<(), E>,
) -> Result<(), E> {
    const GATHER: usize = 0;
    const BROADCAST: usize = 1;
    for child in children.clone() {
        step(StepOp::RECV, child, GATHER)?;
    }
    if let Some(parent) = parent {
        step(StepOp::SEND, parent, GATHER)?;
        step(StepOp::RECV, parent, BROADCAST)?;
    }
    for child in children {
        step(StepOp::SEND, child, BROADCAST)?;
    }
    Ok(())
}

fn emit_dissemination(
    writer: &mut StepWriter<'_>,
    rank: usize,
    n: usize,
) -> Result<(), ScheduleError> {
    let members = writer.members.len();
    let mut stride = 1usize;
    for round in 0..dissemination_rounds(members, n) {
        let kept = distinct_offsets(members, n, stride);
        // Hoefler et al., listing 1: all of a round's notifications go out before its waits.
        for j in 1..=kept {
            let offset = mul_mod(j, stride, members);
            writer.push(StepOp::SEND, add_mod(rank, offset, members), round)?;
        }
        for j in 1..=kept {
            let offset = mul_mod(j, stride, members);
            writer.push(StepOp::RECV, sub_mod(rank, offset, members), round)?;
        }
        stride = stride.saturating_mul(n + 1);
    }
    Ok(())
}
