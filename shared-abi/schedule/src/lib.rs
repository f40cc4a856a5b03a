//! nicbar-schedule: compilers from barrier algorithms to schedules (pairwise exchange, gather-broadcast, n-way
//! dissemination).
//!
//! The host turns a group (one [`Member`] per rank) and its own rank into the list of [`Step`]s its
//! NIC runs: the host computes the pairings and the tree, the NIC only follows them (paper §5.1).
//! Every rank compiles its own schedule from the same member list. The compilers are
//! deterministic, so the schedules agree: whenever rank `a` sends to rank `b` in round `r` (a
//! `SEND` or `EXCHANGE` step), rank `b` has exactly one step that receives from `a` in round `r`
//! (a `RECV` or `EXCHANGE` step), and the other way round.
//!
//! What the NIC's matching needs, and every compiler here guarantees:
//!
//! - In one schedule, a (peer, round) pair occurs at most once on the sending side and at most once
//!   on the receiving side. So one barrier puts at most one packet of a round on each
//!   (sender, receiver) pair, which is what the unexpected-barrier record counts on (room for the
//!   current barrier's packet and the next barrier's). The same peer and round may occur once on
//!   each side: that is exactly what an `EXCHANGE` step is, and n-way dissemination on a small
//!   group sends to and receives from the same peer in one round as separate steps.
//! - No step names the rank's own member.
//! - Rounds are below [`MAX_ROUNDS`] and no rank's schedule is longer than
//!   [`MAX_SCHEDULE_STEPS`]. These limits are checked for the whole group, not for the calling rank
//!   alone, so a group that is too large for an algorithm fails on every rank the same way instead
//!   of leaving the ranks that compiled waiting for the ones that could not.
//!
//! A group of one member has nothing to wait for, and the NIC refuses an empty schedule: the
//! compilers return [`ScheduleError::TrivialGroup`], and the caller completes that barrier at once
//!
//! [`check_members`] is the one check of what a group may be (members, ports, duplicates), with
//! its [`GroupError`]: the user library's `Group` runs it when a group is built, and every
//! compiler runs it again before it reads the members.
//!
//! This crate is host logic in the shared row of the layers: the user library compiles a group's
//! schedule with it, and the simulator's cost model and the firmware's tests use the very same
//! code, so there is one copy of the algorithms and of their modular arithmetic ([`arith`]). The
//! bytes of a schedule — [`Step`] and its limits — belong to the ABI (`shared_abi::schedule`) and
//! are re-exported here.
#![no_std]
#![forbid(unsafe_code)]

pub mod arith;
mod check;
mod compile;
mod error;

pub use check::{check_members, rounds_needed, steps_needed};
pub use compile::{
    allreduce, compile, dissemination, gather_broadcast, gather_broadcast_steps, pairwise_exchange,
};
pub use error::{GroupError, ScheduleError};
pub use shared_abi::schedule::{MAX_ROUNDS, MAX_SCHEDULE_STEPS, Step, StepCombine, StepOp};

use core::fmt;

use shared_abi::ids::{NodeId, PortId};

/// One member of a barrier group: a port on a NIC. A group is a slice of members; a rank is an
/// index into it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Member {
    /// The member's NIC.
    pub node: NodeId,
    /// The member's port on that NIC.
    pub port: PortId,
}

impl Member {
    /// The member at `port` of `node`.
    pub const fn new(node: NodeId, port: PortId) -> Self {
        Self { node, port }
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.node, self.port)
    }
}

/// A barrier algorithm and its parameters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Algorithm {
    /// Recursive-doubling pairwise exchange as in MPICH (paper §5.1), with the fix-up for groups
    /// whose size is not a power of two: `⌊log2 N⌋` exchange rounds, plus one message before and
    /// one after them between each extra rank and its partner.
    PairwiseExchange,
    /// Gather-and-broadcast over a tree in which every node has up to `dimension` children
    /// (paper §5.1), rooted at rank `root`.
    GatherBroadcast {
        /// Most children per node, `1..=N-1` (1 is a chain, `N-1` a star).
        dimension: usize,
        /// The rank at the root of the tree, `0..N`.
        root: usize,
    },
    /// n-way dissemination (Hoefler, Mehlan, Mietke, Rehm, *Fast Barrier Synchronization for
    /// InfiniBand*, equations 1-2): `⌈log_{n+1} N⌉` rounds, in each of which a rank notifies `n`
    /// peers and waits for `n`. `n = 1` is the classic dissemination barrier.
    Dissemination {
        /// Peers notified per round, `1..=N-1`.
        n: usize,
    },
}

/// The algorithm to use for a group of `members` until measurements say otherwise.
///
/// Pairwise exchange when `members` is a power of two, one-way dissemination otherwise:
///
/// - Dissemination with `n = 1` takes `⌈log2 N⌉` rounds of one send and one receive per rank, for
///   every `N`, with no fix-up.
/// - Pairwise exchange takes the same `log2 N` rounds when `N` is a power of two, and each rank
///   talks to `log2 N` peers, both ways, instead of up to `2·⌈log2 N⌉` distinct ones: fewer
///   connections carry the barrier. It is also the algorithm the paper measured fastest on the NIC
///   (§6). For other sizes its fix-up puts two more message latencies on the critical path
///   (`⌊log2 N⌋ + 2` rounds against `⌈log2 N⌉`).
/// - Gather-broadcast takes two message latencies per tree level, and a node of dimension `d`
///   handles `2·d` packets one after another on the NIC's slow processor; which dimension wins
///   depends on the NIC and the size (the paper sweeps them all, §6). Not a blind default.
///
/// Dissemination with larger `n` trades rounds for packets per round, which pays only as far as
/// the NIC overlaps consecutive sends (Hoefler et al. §2): also a choice for measurements.
/// For 0 or 1 members the answer does not matter: compiling reports the group as empty or
/// trivial.
pub const fn default_for(members: usize) -> Algorithm {
    if members.is_power_of_two() {
        Algorithm::PairwiseExchange
    } else {
        Algorithm::Dissemination { n: 1 }
    }
}

#[cfg(test)]
mod tests;
