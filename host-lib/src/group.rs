//! Barrier groups: the members of a barrier by rank, and the options its barrier runs with.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use nicbar_schedule::{self, Algorithm, Member};
use shared_abi::ids::{BarrierId, NodeId, PortId};

use crate::failure::BarrierError;

/// Why a [`Group`] could not be built: the schedule crate's check of a member list
/// ([`nicbar_schedule::check_members`]), which every schedule compiler runs too, and
/// [`GroupError::RankOutOfRange`] for [`Group::subgroup`].
pub use nicbar_schedule::GroupError;

/// How a group's barrier runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarrierOptions {
    /// The algorithm the schedule is compiled from (default: [`nicbar_schedule::default_for`] the
    /// group's size, with the tuning file's dissemination n where there is one: see
    /// [`crate::tuning`]; every member must read the same file).
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

/// The environment variable that names the job a process belongs to (a number), for
/// [`Group::job`]'s default.
pub const JOB_ENV: &str = "NICBAR_JOB";

/// The members of a barrier, by rank: ports of NICs, each at most once. Every member builds the
/// same group (the same members in the same order) and the same options; each finds its own rank
/// from its port. Cloning is cheap (the member list is shared).
///
/// # Identity
///
/// Every barrier packet (NIC-based) and message (host-based) carries its barrier's identity: the
/// group's job and id, and the barrier's number in the group's sequence, which each port counts
/// for each group it runs barriers of. So a packet can only complete the very barrier it was sent
/// for — never a later barrier after a failure, nor another group's. Members must agree on both
/// numbers: the id defaults to a hash of the member list, which every member computes alike; two
/// groups of the same members whose barriers may interleave (an MPI communicator and its
/// duplicate) need distinct ids ([`Group::with_id`]). The job ([`Group::with_job`], by default
/// the number in [`JOB_ENV`], else 0) lets a NIC tell a late member at once that a port whose last
/// owner ran barriers of the same job has closed for good, instead of waiting for it to open
/// (paper §3.2): give each run of a job its own number, and 0 (no job) to always wait.
#[derive(Clone, Debug)]
pub struct Group {
    pub(crate) members: Arc<[Member]>,
    pub(crate) options: BarrierOptions,
    pub(crate) id: u32,
    pub(crate) job: u32,
}

impl Group {
    /// The group of `members`, rank `i` being the `i`-th, with [`BarrierOptions::for_members`].
    ///
    /// # Errors
    /// [`GroupError`]: no members, a port out of range, or a member named twice.
    pub fn new(members: impl IntoIterator<Item = Member>) -> Result<Self, GroupError> {
        let members: Arc<[Member]> = members.into_iter().collect();
        nicbar_schedule::check_members(&members)?;
        // The tuning file's dissemination n, where the user measured one (crate::tuning).
        let options = BarrierOptions {
            algorithm: crate::tuning::default_algorithm(members.len()),
            ..BarrierOptions::for_members(members.len())
        };
        let id = members_hash(&members);
        Ok(Self {
            members,
            options,
            id,
            job: job_from_env(),
        })
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
        group.job = self.job;
        Ok(group)
    }

    /// The group's id (see [Identity](Group#identity)).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The group's job (see [Identity](Group#identity)).
    pub fn job(&self) -> u32 {
        self.job
    }

    /// This group with id `id`: every member must use the same.
    #[must_use]
    pub fn with_id(mut self, id: u32) -> Self {
        self.id = id;
        self
    }

    /// This group in job `job`: every member must use the same (0: no job).
    #[must_use]
    pub fn with_job(mut self, job: u32) -> Self {
        self.job = job;
        self
    }

    /// The identity of barrier `sequence` of this group.
    pub(crate) fn barrier_id(&self, sequence: u32) -> BarrierId {
        BarrierId::new(self.job, self.id, sequence)
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

/// The numbers a port gives its barriers, per group: the sequence part of each barrier's
/// identity (see [Identity](Group#identity)). [`crate::Port`] keeps one; a library that runs
/// group barriers over a [`crate::RawPort`] (the C API's `nicbar_barrier`) keeps one per port
/// the same way, so that its barriers carry the same identities the Rust API's do.
#[derive(Clone, Debug, Default)]
pub struct BarrierNumbering {
    /// The number of the next barrier of each (job, group).
    next: HashMap<(u32, u32), u32>,
}

impl BarrierNumbering {
    /// No barrier numbered yet: every group's next barrier is number 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The identity of the next barrier of `group` (not yet counted: see
    /// [`BarrierNumbering::count`]).
    pub fn next_id(&self, group: &Group) -> BarrierId {
        let sequence = self.next.get(&(group.job, group.id)).copied().unwrap_or(0);
        group.barrier_id(sequence)
    }

    /// Counts barrier `barrier` as started: its group's next barrier is the one after it.
    pub fn count(&mut self, barrier: BarrierId) {
        self.next.insert(
            (barrier.job.get(), barrier.group.get()),
            barrier.sequence.get().wrapping_add(1),
        );
    }

    /// Barrier `barrier`, the last one counted of its group, never ran (the NIC refused it, or
    /// it could not be posted): its number is given back, so that the group's next barrier
    /// takes it, as the members that did not see it run number theirs.
    pub fn give_back(&mut self, barrier: BarrierId) {
        let key = (barrier.job.get(), barrier.group.get());
        if self.next.get(&key) == Some(&barrier.sequence.get().wrapping_add(1)) {
            self.next.insert(key, barrier.sequence.get());
        }
    }

    /// Starts `group`'s numbering afresh: its next barrier is number 0.
    pub fn restart(&mut self, group: &Group) {
        self.next.remove(&(group.job, group.id));
    }
}

/// A hash of the member list (FNV-1a over each member's node and port): every member of a
/// group computes the same.
fn members_hash(members: &[Member]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for member in members {
        let [lo, hi] = member.node.get().to_le_bytes();
        for byte in [lo, hi, member.port.0] {
            hash = (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193);
        }
    }
    hash
}

/// The job named by [`JOB_ENV`], or 0.
fn job_from_env() -> u32 {
    static JOB: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *JOB.get_or_init(|| {
        std::env::var(JOB_ENV)
            .ok()
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0)
    })
}

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
    fn successive_barriers_of_a_group_take_successive_numbers_and_a_refused_one_gives_its_back() {
        let group = Group::from_endpoints((0..2).map(|n| (NodeId::new(n), PortId(1))))
            .unwrap()
            .with_job(7);
        let other = group.clone().with_id(group.id() ^ 1);
        let mut numbering = BarrierNumbering::new();
        let first = numbering.next_id(&group);
        assert_eq!(first, BarrierId::new(7, group.id(), 0));
        numbering.count(first);
        let second = numbering.next_id(&group);
        assert_eq!(second, BarrierId::new(7, group.id(), 1));
        assert_eq!(
            numbering.next_id(&other).sequence.get(),
            0,
            "groups count apart"
        );
        numbering.count(second);
        numbering.give_back(second);
        assert_eq!(numbering.next_id(&group), second);
        numbering.count(second);
        numbering.give_back(first);
        assert_eq!(
            numbering.next_id(&group).sequence.get(),
            2,
            "only the last one counted gives its number back"
        );
        numbering.restart(&group);
        assert_eq!(numbering.next_id(&group), first);
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
