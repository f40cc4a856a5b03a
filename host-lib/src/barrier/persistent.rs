//! Persistent collectives (MPI's `MPI_Barrier_init`, `MPI_Allreduce_init`): a group's barrier or
//! allreduce compiled once, then started any number of times.
//!
//! [`Port::persistent_barrier`] and [`Port::persistent_allreduce`] find this port's rank in the
//! group and compile its schedule there and then; [`Port::persistent_start`] starts it as the
//! group's next barrier: one send token, one doorbell, no compilation, no allocation of a
//! schedule. The end comes as a barrier's ([`Port::barrier_test`], [`Port::barrier_wait`],
//! [`Port::nic_allreduce_wait`]).
//!
//! The NIC keeps the compiled steps between starts ([`crate::port::kept`]): the first start
//! posts them and has the NIC keep them, every later one names them, so a start writes nothing
//! but its token (and an allreduce's value) and the NIC reads no steps. A port has the NIC keep
//! [`shared_abi::token::KEPT_SCHEDULES`] schedules; a start of one that lost its slot to others
//! posts its steps again.

use std::sync::Arc;
use std::time::Instant;

use shared_abi::event::Status;
use shared_abi::reduce::ReduceSpec;
use shared_abi::schedule::Step;

use nicbar_schedule::Member;

use crate::failure::BarrierError;
use crate::group::Group;
use crate::port::Port;
use crate::port::barriers::{Carried, refused};

use super::PendingBarrier;

/// A group's barrier or allreduce compiled for this port's rank, to start again and again with
/// [`Port::persistent_start`] on the port that made it. Cloning it is cheap (the steps are
/// shared).
#[derive(Clone, Debug)]
pub struct PersistentCollective {
    /// The group as it was when compiled: its members, options and identity (job, id).
    group: Group,
    /// This port's compiled steps (empty in a group of one, where nothing runs).
    steps: Arc<[Step]>,
    /// The allreduce's operation and the bytes each start combines; `None` for a barrier.
    reduce: Option<(ReduceSpec, usize)>,
    /// The port it was compiled for.
    port: Member,
}

impl PersistentCollective {
    /// The group the collective runs on.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The compiled steps a start posts.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The allreduce's operation and length in bytes; `None` for a barrier.
    pub fn reduce(&self) -> Option<(ReduceSpec, usize)> {
        self.reduce
    }
}

impl Port {
    /// This port as a group member.
    fn member(&self) -> Member {
        Member::new(self.node_id(), self.port_id())
    }

    /// Compiles `group`'s barrier (its algorithm, this port's rank) once, for
    /// [`Port::persistent_start`]. Sends nothing and takes no barrier number.
    ///
    /// # Errors
    /// [`BarrierError::NotAMember`], [`BarrierError::Schedule`].
    pub fn persistent_barrier(&self, group: &Group) -> Result<PersistentCollective, BarrierError> {
        let rank = group.rank_of_port(self.node_id(), self.port_id())?;
        let steps = if group.len() == 1 {
            Arc::from([])
        } else {
            let algorithm = group.options.algorithm;
            let mut steps = vec![
                Step::default();
                nicbar_schedule::steps_needed(algorithm, group.len())
                    .map_err(BarrierError::Schedule)?
            ];
            let count = nicbar_schedule::compile(algorithm, &group.members, rank, &mut steps)
                .map_err(BarrierError::Schedule)?;
            steps.truncate(count);
            steps.into()
        };
        Ok(PersistentCollective {
            group: group.clone(),
            steps,
            reduce: None,
            port: self.member(),
        })
    }

    /// Compiles `group`'s allreduce (as [`Port::nic_allreduce`] runs it) of `length` bytes
    /// combined with `spec` once, for [`Port::persistent_start`]. Sends nothing and takes no
    /// barrier number.
    ///
    /// # Errors
    /// [`BarrierError::NotAMember`], [`BarrierError::Schedule`]; [`BarrierError::Refused`] with
    /// `TOO_LONG` for a `length` that is 0, over [`crate::NIC_REDUCE_MAX`] or not whole
    /// elements, `INVALID_TOKEN` for an operation not defined on the type.
    pub fn persistent_allreduce(
        &self,
        group: &Group,
        spec: ReduceSpec,
        length: usize,
    ) -> Result<PersistentCollective, BarrierError> {
        spec.check_value(length).map_err(refused)?;
        let rank = group.rank_of_port(self.node_id(), self.port_id())?;
        let steps = if group.len() == 1 {
            Arc::from([])
        } else {
            let mut steps = vec![Step::default(); nicbar_schedule::MAX_SCHEDULE_STEPS];
            let count = nicbar_schedule::allreduce(&group.members, rank, &mut steps)
                .map_err(BarrierError::Schedule)?;
            steps.truncate(count);
            steps.into()
        };
        Ok(PersistentCollective {
            group: group.clone(),
            steps,
            reduce: Some((spec, length)),
            port: self.member(),
        })
    }

    /// Starts `persistent` as its group's next barrier and returns at once; `data` is this
    /// member's value for an allreduce (its compiled length), ignored for a barrier. The end
    /// comes as a barrier's: [`Port::barrier_test`], then [`Port::barrier_wait`] (a barrier) or
    /// [`Port::nic_allreduce_wait`] (an allreduce's result). It takes the group's next barrier
    /// number, as every barrier of the group does, so every member starts it at the same point
    /// of the group's barriers.
    ///
    /// # Errors
    /// [`BarrierError::NotAMember`] on another port than the one it was compiled for;
    /// [`BarrierError::Refused`] with `TOO_LONG` for `data` of another length than compiled;
    /// [`BarrierError::Busy`] while the NIC runs as many of this port's barriers as it holds;
    /// [`BarrierError::Port`].
    pub fn persistent_start(
        &mut self,
        persistent: &PersistentCollective,
        data: &[u8],
    ) -> Result<PendingBarrier, BarrierError> {
        let started = Instant::now();
        if persistent.port != self.member() {
            // Its steps are another rank's.
            return Err(BarrierError::NotAMember {
                member: self.member(),
            });
        }
        let carried = match persistent.reduce {
            Some((_, length)) if data.len() != length => {
                return Err(BarrierError::Refused {
                    status: Status::TOO_LONG,
                });
            }
            Some((spec, _)) => Some(Carried::reduce(spec, data)?),
            None => None,
        };
        if persistent.steps.is_empty() {
            return Ok(PendingBarrier::complete(started));
        }
        let group = &persistent.group;
        self.check_room(group)?;
        self.post_compiled(
            group,
            persistent.steps.clone(),
            group.options.timeout,
            carried,
            started,
        )
    }
}
