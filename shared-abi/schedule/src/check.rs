//! What a group and an algorithm's parameters must satisfy, and how many rounds and steps they need.

use shared_abi::ids::PORTS_PER_NIC;

use crate::arith::{dissemination_rounds, distinct_offsets, floor_log2};
use crate::{Algorithm, GroupError, MAX_ROUNDS, Member, ScheduleError};

/// How many round numbers `algorithm` uses for a group of `members` (its rounds are numbered
/// `0..rounds`).
///
/// # Errors
/// The group size or the algorithm's parameters are out of range (as for [`crate::compile`]), or the
/// rounds do not fit in [`MAX_ROUNDS`].
pub fn rounds_needed(algorithm: Algorithm, members: usize) -> Result<usize, ScheduleError> {
    check_parameters(algorithm, members)?;
    let rounds = match algorithm {
        Algorithm::PairwiseExchange => pairwise_exchange_rounds(members),
        Algorithm::GatherBroadcast { .. } => 2,
        Algorithm::Dissemination { n } => dissemination_rounds(members, n),
    };
    if rounds > usize::from(MAX_ROUNDS) {
        return Err(ScheduleError::TooManyRounds { rounds });
    }
    Ok(rounds)
}

/// Pairwise exchange's `⌊log2 N⌋` exchange rounds, plus the fix-up's two when `N` is not a power
/// of two; also the length of its busiest rank's schedule (one step per round).
fn pairwise_exchange_rounds(members: usize) -> usize {
    let exchanges = floor_log2(members);
    if members.is_power_of_two() {
        exchanges
    } else {
        exchanges + 2
    }
}

/// The length of the longest schedule `algorithm` compiles to for any rank of a group of
/// `members`: an output buffer this long fits every rank's schedule.
///
/// The value may exceed [`crate::MAX_SCHEDULE_STEPS`]; [`crate::compile`] then refuses the group with
/// [`ScheduleError::TooManySteps`].
///
/// # Errors
/// As for [`rounds_needed`].
pub fn steps_needed(algorithm: Algorithm, members: usize) -> Result<usize, ScheduleError> {
    rounds_needed(algorithm, members)?;
    Ok(match algorithm {
        // The first `N - P` ranks add the fix-up's receive and send to the exchanges.
        Algorithm::PairwiseExchange => pairwise_exchange_rounds(members),
        // The root gathers from and broadcasts to up to `dimension` children. Relative rank 1
        // has the most children of any other rank and two more steps for its parent.
        Algorithm::GatherBroadcast { dimension, .. } => {
            let root = dimension.min(members - 1).saturating_mul(2);
            let first_child = dimension
                .min((members - 1).saturating_sub(dimension))
                .saturating_mul(2)
                .saturating_add(2);
            root.max(first_child)
        }
        // Every rank sends and receives once per distinct peer offset of every round.
        Algorithm::Dissemination { n } => {
            let mut steps = 0usize;
            let mut stride = 1usize;
            for _ in 0..dissemination_rounds(members, n) {
                steps =
                    steps.saturating_add(distinct_offsets(members, n, stride).saturating_mul(2));
                stride = stride.saturating_mul(n + 1);
            }
            steps
        }
    })
}

/// Checks the group and the rank; returns the group size.
pub(crate) fn check_group(members: &[Member], rank: usize) -> Result<usize, ScheduleError> {
    let count = members.len();
    if count == 0 {
        return Err(ScheduleError::EmptyGroup);
    }
    if rank >= count {
        return Err(ScheduleError::RankOutOfRange {
            rank,
            members: count,
        });
    }
    check_members(members)?;
    if count == 1 {
        return Err(ScheduleError::TrivialGroup);
    }
    Ok(count)
}

/// Checks that `members` can be a barrier group: at least one member, every port a port of a
/// NIC, no member named twice. A group of one passes (its barrier needs no NIC: see
/// [`ScheduleError::TrivialGroup`]).
///
/// # Errors
/// [`GroupError::Empty`]; [`GroupError::PortOutOfRange`] for the lowest rank whose port is out
/// of range; else [`GroupError::DuplicateMember`] for the first member named again.
pub fn check_members(members: &[Member]) -> Result<(), GroupError> {
    if members.is_empty() {
        return Err(GroupError::Empty);
    }
    for (rank, member) in members.iter().enumerate() {
        if member.port.index().is_none() {
            return Err(GroupError::PortOutOfRange {
                rank,
                port: member.port,
            });
        }
    }
    check_distinct(members)
}

/// Finds a member named twice. Ports are checked to be in range first.
fn check_distinct(members: &[Member]) -> Result<(), GroupError> {
    const KEYS: usize = (u16::MAX as usize + 1) * PORTS_PER_NIC;
    // One bit per possible member: linear time for any group, where comparing pairs would take
    // minutes on the largest groups pairwise exchange serves. 64 KiB of stack, on the host.
    let mut seen = [0u64; KEYS / 64];
    let key = |member: &Member| {
        usize::from(member.node.get()) * PORTS_PER_NIC + member.port.index().unwrap_or(0)
    };
    for (second, member) in members.iter().enumerate() {
        let key = key(member);
        let Some(word) = seen.get_mut(key / 64) else {
            continue;
        };
        let bit = 1u64 << (key % 64);
        if *word & bit != 0 {
            let first = members
                .iter()
                .position(|other| other == member)
                .unwrap_or(second);
            return Err(GroupError::DuplicateMember {
                first,
                second,
                member: *member,
            });
        }
        *word |= bit;
    }
    Ok(())
}

/// Checks the group size and the algorithm's parameters against it.
fn check_parameters(algorithm: Algorithm, members: usize) -> Result<(), ScheduleError> {
    match members {
        0 => return Err(ScheduleError::EmptyGroup),
        1 => return Err(ScheduleError::TrivialGroup),
        _ => {}
    }
    match algorithm {
        Algorithm::PairwiseExchange => Ok(()),
        Algorithm::GatherBroadcast { dimension, root } => {
            if dimension == 0 || dimension >= members {
                Err(ScheduleError::DimensionOutOfRange { dimension, members })
            } else if root >= members {
                Err(ScheduleError::RootOutOfRange { root, members })
            } else {
                Ok(())
            }
        }
        Algorithm::Dissemination { n } => {
            if n == 0 || n >= members {
                Err(ScheduleError::WaysOutOfRange { n, members })
            } else {
                Ok(())
            }
        }
    }
}
