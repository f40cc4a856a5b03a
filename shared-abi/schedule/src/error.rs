//! Why a group is not a barrier group, and why a schedule could not be compiled.

use core::fmt;

use shared_abi::ids::{PORTS_PER_NIC, PortId};

use crate::{MAX_ROUNDS, MAX_SCHEDULE_STEPS, Member};

/// Why a list of members is not a barrier group ([`crate::check_members`]), or a rank not one of
/// its ranks. The user library's `Group` reports these as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupError {
    /// No members.
    Empty,
    /// A member's port is not a port of a NIC (`>= PORTS_PER_NIC`).
    PortOutOfRange {
        /// The member's rank.
        rank: usize,
        /// Its port.
        port: PortId,
    },
    /// A member named twice: one port takes part in a barrier once.
    DuplicateMember {
        /// The first rank naming it.
        first: usize,
        /// The second.
        second: usize,
        /// The member.
        member: Member,
    },
    /// A rank is not a rank of the group.
    RankOutOfRange {
        /// The rank.
        rank: usize,
        /// The group's size.
        members: usize,
    },
}

impl fmt::Display for GroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("a barrier group needs at least one member"),
            Self::PortOutOfRange { rank, port } => write!(
                f,
                "rank {rank} names {port}, but a NIC has ports 0..{PORTS_PER_NIC}"
            ),
            Self::DuplicateMember {
                first,
                second,
                member,
            } => write!(f, "ranks {first} and {second} are both {member}"),
            Self::RankOutOfRange { rank, members } => {
                write!(f, "rank {rank} is not in a group of {members} members")
            }
        }
    }
}

impl core::error::Error for GroupError {}

/// Why a schedule could not be compiled.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ScheduleError {
    /// The group has no members.
    EmptyGroup,
    /// The group has a single member. Its barrier is complete as soon as it is entered; the NIC
    /// refuses an empty schedule, so the caller completes the barrier itself, without the NIC.
    TrivialGroup,
    /// The rank is not an index into the group.
    RankOutOfRange {
        /// The rank asked for.
        rank: usize,
        /// How many members the group has.
        members: usize,
    },
    /// A member's port id is not a port of a NIC (`>= PORTS_PER_NIC`).
    PortOutOfRange {
        /// The rank of the member.
        rank: usize,
        /// Its port id.
        port: PortId,
    },
    /// Two ranks name the same member: one port cannot take part in a barrier twice.
    DuplicateMember {
        /// The lower of the two ranks.
        first: usize,
        /// The higher one.
        second: usize,
        /// The member they both name.
        member: Member,
    },
    /// The gather-broadcast tree dimension is outside `1..=members-1`.
    DimensionOutOfRange {
        /// The dimension asked for.
        dimension: usize,
        /// How many members the group has.
        members: usize,
    },
    /// The gather-broadcast root is not a rank of the group.
    RootOutOfRange {
        /// The root asked for.
        root: usize,
        /// How many members the group has.
        members: usize,
    },
    /// The `n` of n-way dissemination is outside `1..=members-1`.
    WaysOutOfRange {
        /// The `n` asked for.
        n: usize,
        /// How many members the group has.
        members: usize,
    },
    /// The algorithm needs more round numbers than a step carries ([`MAX_ROUNDS`]).
    TooManyRounds {
        /// Round numbers the algorithm needs for this group.
        rounds: usize,
    },
    /// Some rank's schedule would be longer than the NIC takes ([`MAX_SCHEDULE_STEPS`]).
    TooManySteps {
        /// Steps of the longest schedule in the group.
        steps: usize,
    },
    /// The output buffer is shorter than this rank's schedule.
    OutputTooSmall {
        /// Steps this rank's schedule has.
        needed: usize,
        /// Steps the buffer holds.
        available: usize,
    },
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyGroup => f.write_str("the barrier group has no members"),
            Self::TrivialGroup => f.write_str(
                "the barrier group has one member: complete the barrier at once, without the NIC",
            ),
            Self::RankOutOfRange { rank, members } => GroupError::RankOutOfRange {
                rank: *rank,
                members: *members,
            }
            .fmt(f),
            Self::PortOutOfRange { rank, port } => GroupError::PortOutOfRange {
                rank: *rank,
                port: *port,
            }
            .fmt(f),
            Self::DuplicateMember {
                first,
                second,
                member,
            } => GroupError::DuplicateMember {
                first: *first,
                second: *second,
                member: *member,
            }
            .fmt(f),
            Self::DimensionOutOfRange { dimension, members } => write!(
                f,
                "gather-broadcast dimension {dimension} is outside 1..={} for {members} members",
                members.saturating_sub(1)
            ),
            Self::RootOutOfRange { root, members } => write!(
                f,
                "gather-broadcast root {root} is not a rank of a group of {members} members"
            ),
            Self::WaysOutOfRange { n, members } => write!(
                f,
                "dissemination n = {n} is outside 1..={} for {members} members",
                members.saturating_sub(1)
            ),
            Self::TooManyRounds { rounds } => write!(
                f,
                "the schedule needs {rounds} rounds, but steps carry at most {MAX_ROUNDS}"
            ),
            Self::TooManySteps { steps } => write!(
                f,
                "the longest schedule of the group has {steps} steps, but the NIC takes at most \
                 {MAX_SCHEDULE_STEPS}"
            ),
            Self::OutputTooSmall { needed, available } => write!(
                f,
                "the schedule has {needed} steps, but the output holds only {available}"
            ),
        }
    }
}

impl core::error::Error for ScheduleError {}

impl From<GroupError> for ScheduleError {
    fn from(error: GroupError) -> Self {
        match error {
            GroupError::Empty => Self::EmptyGroup,
            GroupError::PortOutOfRange { rank, port } => Self::PortOutOfRange { rank, port },
            GroupError::DuplicateMember {
                first,
                second,
                member,
            } => Self::DuplicateMember {
                first,
                second,
                member,
            },
            GroupError::RankOutOfRange { rank, members } => Self::RankOutOfRange { rank, members },
        }
    }
}
