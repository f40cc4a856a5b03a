//! Barrier groups: the members of a barrier by rank, and the options its barrier runs with.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use nicbar_schedule::{self, Algorithm, Member};
use shared_abi::ids::{NodeId, PortId};

use crate::failure::BarrierError;

/// How a group's barrier runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarrierOptions {
    /// The algorithm the schedule is compiled from (default: [`nicbar_schedule::default_for`] the group's
    /// size).
    pub algorithm: Algorithm,
    /// Fail the barrier if it has not completed after this long; `None` for the NIC's default
    /// (30 s unless the daemon is configured otherwise; [`crate::DEFAULT_HOST_TIMEOUT`] for
    /// [`crate::Port::host_barrier`]).
    pub timeout: Option<Duration>,
}

impl BarrierOptions {
    /// The defaults for a group of `members`: [`nicbar_schedule::default_for`], and the NIC's timeout.
    pub const fn for_members(members: usize) -> Self {
        Self {
            algorithm: nicbar_schedule::default_for(members),
            timeout: None,
        }
    }

    /// These options with `algorithm`.
    #[must_use]
    pub const fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// These options with a `timeout`.
    #[must_use]
    pub const fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// The members of a barrier, by rank: ports of NICs, each at most once. Every member builds the
/// same group (the same members in the same order) and the same options; each finds its own rank
/// from its port. Cloning is cheap (the member list is shared).
#[derive(Clone, Debug)]
pub struct Group {
    pub(crate) members: Arc<[Member]>,
    pub(crate) options: BarrierOptions,
}

impl Group {
    /// The group of `members`, rank `i` being the `i`-th, with [`BarrierOptions::for_members`].
    ///
    /// # Errors
    /// [`GroupError`]: no members, a port out of range, or a member named twice.
    pub fn new(members: impl IntoIterator<Item = Member>) -> Result<Self, GroupError> {
        let members: Arc<[Member]> = members.into_iter().collect();
        if members.is_empty() {
            return Err(GroupError::Empty);
        }
        let mut seen = HashMap::with_capacity(members.len());
        for (rank, member) in members.iter().enumerate() {
            if member.port.index().is_none() {
                return Err(GroupError::PortOutOfRange {
                    rank,
                    port: member.port,
                });
            }
            if let Some(first) = seen.insert(*member, rank) {
                return Err(GroupError::DuplicateMember {
                    first,
                    second: rank,
                    member: *member,
                });
            }
        }
        let options = BarrierOptions::for_members(members.len());
        Ok(Self { members, options })
    }

    /// The group of the ports `(node, port)`, by rank.
    ///
    /// # Errors
    /// As [`Group::new`].
    pub fn from_endpoints(
        endpoints: impl IntoIterator<Item = (NodeId, PortId)>,
    ) -> Result<Self, GroupError> {
        Self::new(
            endpoints
                .into_iter()
                .map(|(node, port)| Member::new(node, port)),
        )
    }

    /// The group of this group's members at `ranks`, in that order (rank `i` of the new group is
    /// rank `ranks[i]` of this one), with this group's timeout and the default algorithm for its
    /// size.
    ///
    /// # Errors
    /// [`GroupError::RankOutOfRange`], or as [`Group::new`] (a rank given twice is a duplicate).
    pub fn subgroup(&self, ranks: &[usize]) -> Result<Self, GroupError> {
        let members = ranks
            .iter()
            .map(|&rank| {
                self.members
                    .get(rank)
                    .copied()
                    .ok_or(GroupError::RankOutOfRange {
                        rank,
                        members: self.members.len(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut group = Self::new(members)?;
        group.options.timeout = self.options.timeout;
        Ok(group)
    }

    /// The members, by rank.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// How many members the group has (never zero).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always `false`: a group has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The member at `rank`.
    pub fn member(&self, rank: usize) -> Option<Member> {
        self.members.get(rank).copied()
    }

    /// The rank of `member`, if it is one.
    pub fn rank_of(&self, member: Member) -> Option<usize> {
        self.members.iter().position(|m| *m == member)
    }

    /// The rank of port `port` of node `node`.
    ///
    /// # Errors
    /// [`BarrierError::NotAMember`] if it is not a member.
    pub(crate) fn rank_of_port(&self, node: NodeId, port: PortId) -> Result<usize, BarrierError> {
        let member = Member::new(node, port);
        self.rank_of(member)
            .ok_or(BarrierError::NotAMember { member })
    }

    /// The options [`crate::Port::barrier`] and [`crate::Port::barrier_start`] use.
    pub fn options(&self) -> &BarrierOptions {
        &self.options
    }

    /// This group with `options`.
    #[must_use]
    pub fn with_options(mut self, options: BarrierOptions) -> Self {
        self.options = options;
        self
    }

    /// This group with `algorithm`.
    #[must_use]
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.options.algorithm = algorithm;
        self
    }

    /// This group with a `timeout`.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.options.timeout = Some(timeout);
        self
    }
}

/// Why a [`Group`] could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupError {
    /// No members.
    Empty,
    /// A member's port is not a port of a NIC.
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
    /// A rank given to [`Group::subgroup`] is not a rank of the group.
    RankOutOfRange {
        /// The rank.
        rank: usize,
        /// The group's size.
        members: usize,
    },
}

impl std::fmt::Display for GroupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => f.write_str("a barrier group needs at least one member"),
            Self::PortOutOfRange { rank, port } => write!(
                f,
                "rank {rank} names {port}, but a NIC has ports 0..{}",
                shared_abi::ids::PORTS_PER_NIC
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

impl std::error::Error for GroupError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(node: u16, port: u8) -> Member {
        Member::new(NodeId::new(node), PortId(port))
    }

    #[test]
    fn groups_refuse_what_cannot_be_a_barrier() {
        assert_eq!(Group::new([]).unwrap_err(), GroupError::Empty);
        assert_eq!(
            Group::new([member(0, 1), member(1, 1), member(0, 1)]).unwrap_err(),
            GroupError::DuplicateMember {
                first: 0,
                second: 2,
                member: member(0, 1)
            }
        );
        assert_eq!(
            Group::new([member(0, 1), member(1, 8)]).unwrap_err(),
            GroupError::PortOutOfRange {
                rank: 1,
                port: PortId(8)
            }
        );
        let world = Group::from_endpoints((0..4).map(|n| (NodeId::new(n), PortId(2)))).unwrap();
        assert_eq!(world.len(), 4);
        assert_eq!(world.rank_of(member(2, 2)), Some(2));
        assert_eq!(world.rank_of(member(2, 3)), None);
        let sub = world.subgroup(&[3, 1]).unwrap();
        assert_eq!(sub.members(), &[member(3, 2), member(1, 2)]);
        assert_eq!(
            world.subgroup(&[1, 4]).unwrap_err(),
            GroupError::RankOutOfRange {
                rank: 4,
                members: 4
            }
        );
        assert!(matches!(
            world.subgroup(&[1, 1]).unwrap_err(),
            GroupError::DuplicateMember { .. }
        ));
        assert_eq!(
            Group::new([member(0, 1), member(1, 1), member(0, 1)])
                .unwrap_err()
                .to_string(),
            "ranks 0 and 2 are both node 0 port 1"
        );
    }

    #[test]
    fn default_options_follow_the_group_size_and_subgroups_keep_the_timeout() {
        let world = Group::from_endpoints((0..6).map(|n| (NodeId::new(n), PortId(1))))
            .unwrap()
            .with_timeout(Duration::from_secs(3));
        assert_eq!(world.options().algorithm, Algorithm::Dissemination { n: 1 });
        let four = world.subgroup(&[0, 1, 2, 3]).unwrap();
        assert_eq!(four.options().algorithm, Algorithm::PairwiseExchange);
        assert_eq!(four.options().timeout, Some(Duration::from_secs(3)));
    }
}
