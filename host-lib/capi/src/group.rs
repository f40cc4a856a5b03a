//! Barriers started from C: the glue of the three GM forms (a barrier the library refuses ends at
//! once, through the same event and callback as one the NIC ends), and nicbar_barrier, a whole
//! group barrier that waits in the library and keeps the events that arrive meanwhile.

use core::ffi::c_uint;
use std::time::{Duration, Instant};

use nicbar_rs::{
    Algorithm, BarrierError, BarrierId, Error, FailureReason, Group, Member, NodeId, PortId,
    ScheduleError, Step, WaitMode,
};
use shared_abi::ring::Wake;

use crate::barrier::{BarrierEnd, Waiter};
use crate::events::barrier_event;
use crate::state::PortState;
use crate::status::{fail, from_error, from_nic, set_last_error};
use crate::types::*;

/// How long past its own timeout a group barrier may go unreported before nicbar_barrier gives
/// up on the NIC.
const REPORT_GRACE: Duration = Duration::from_secs(2);

impl PortState {
    /// Ends a barrier at once, without the NIC: `status` says how. Its event and callback come
    /// from the next receive call and gm_unknown.
    fn end_barrier_locally(
        &mut self,
        callback: gm_send_completion_callback_t,
        context: usize,
        status: gm_status_t,
    ) {
        let kind = if status == GM_SUCCESS {
            GM_BARRIER_COMPLETED_EVENT
        } else {
            GM_BARRIER_FAILED_EVENT
        };
        self.deferred
            .push_back(barrier_event(kind, context, status, None));
        if callback.is_some() {
            self.complete(callback, context, status);
        }
    }

    /// Posts the barrier of `steps` for one of the GM forms, or ends it at once with the reason
    /// it cannot run.
    pub(crate) fn start_barrier(
        &mut self,
        steps: Result<Vec<Step>, String>,
        callback: gm_send_completion_callback_t,
        context: usize,
        function: &str,
    ) {
        let steps = match steps {
            Ok(steps) => steps,
            Err(why) => {
                set_last_error(format!("{function}: {why}"));
                return self.end_barrier_locally(callback, context, GM_INVALID_PARAMETER);
            }
        };
        if steps.is_empty() {
            // A barrier of one member: complete as soon as it is entered (the NIC refuses an
            // empty schedule).
            return self.end_barrier_locally(callback, context, GM_SUCCESS);
        }
        if let Some((status, why)) = self.dead() {
            set_last_error(format!("{function}: {why}"));
            return self.end_barrier_locally(callback, context, status);
        }
        let waiter = Waiter::Program { callback, context };
        // The paper's GM forms name no group: their barriers carry no identity (see
        // gm_barrier_send_with_callback's doc).
        if let Err(error) = self
            .barriers
            .start(&mut self.raw, &steps, BarrierId::NONE, waiter)
        {
            let status = fail(from_error(&error), format!("{function}: {error}"));
            self.end_barrier_locally(callback, context, status);
        }
    }

    /// gm_provide_barrier_buffer.
    pub(crate) fn provide_barrier_buffer(&mut self) -> gm_status_t {
        const FUNCTION: &str = "gm_provide_barrier_buffer";
        if let Some((status, why)) = self.dead() {
            return fail(status, format!("{FUNCTION}: {why}"));
        }
        match self.barriers.provide_buffer(&mut self.raw) {
            Ok(()) => GM_SUCCESS,
            Err(error) => fail(from_error(&error), format!("{FUNCTION}: {error}")),
        }
    }

    /// nicbar_barrier: runs the group barrier of `members` in the NIC and waits for its end.
    pub(crate) fn group_barrier(
        &mut self,
        members: &[gm_barrier_peer_t],
        algorithm: c_uint,
        parameter: c_uint,
    ) -> gm_status_t {
        const FUNCTION: &str = "nicbar_barrier";
        let group = match group(members, algorithm, parameter) {
            Ok(group) => group,
            Err(why) => return fail(GM_INVALID_PARAMETER, format!("{FUNCTION}: {why}")),
        };
        if let Some((status, why)) = self.dead() {
            return fail(status, format!("{FUNCTION}: {why}"));
        }
        match self.run_group_barrier(&group) {
            Ok(()) => GM_SUCCESS,
            Err(error) => {
                if let BarrierError::Port(port_error) = &error
                    && matches!(port_error, Error::DaemonGone | Error::EventRing(_))
                {
                    self.die(port_error);
                }
                fail(status_of(&error), format!("{FUNCTION}: {error}"))
            }
        }
    }

    fn run_group_barrier(&mut self, group: &Group) -> Result<(), BarrierError> {
        let started = Instant::now();
        let rank = group_rank(group, self.raw.node_id(), self.raw.port_id())?;
        if group.len() == 1 {
            return Ok(());
        }
        if self.barriers.running() > 0 {
            return Err(BarrierError::Busy);
        }
        let algorithm = group.options().algorithm;
        let steps = schedule(group, algorithm, rank).map_err(BarrierError::Schedule)?;
        if self.barriers.buffers == 0 {
            self.barriers.provide_buffer(&mut self.raw)?;
        }
        self.library_barrier_end = None;
        // The group's identity, numbered as the Rust API's Port numbers it: a packet of an
        // earlier barrier (one that failed, or another group's) cannot complete this one, and
        // the job lets the NIC tell at once that a member's port closed for good.
        let barrier = self.barriers.numbering.next_id(group);
        let name = self
            .barriers
            .start(&mut self.raw, &steps, barrier, Waiter::Library)?;
        self.barriers.numbering.count(barrier);
        let timeout = self.barriers.timeout;
        let report_by = timeout.map(|timeout| started + timeout + REPORT_GRACE);
        loop {
            if let Some(end) = self.library_barrier_end.take()
                && end.name == name
            {
                if end.refused {
                    // The NIC never ran it: the members that did not see it number their next
                    // barrier the same.
                    self.barriers.numbering.give_back(end.barrier);
                }
                return outcome(group, &end);
            }
            match self.raw.next_event()? {
                Some(event) => {
                    if let Some(event) = self.translate(event) {
                        self.deferred.push_back(event);
                    }
                }
                None => {
                    let spin_until = WaitMode::default().spin_until(Instant::now(), report_by);
                    // Waiting for the barrier's end: sends' ends need not wake the process.
                    if !self.raw.wait(report_by, spin_until, Wake::UNLESS_SENT)? {
                        return Err(BarrierError::NoReport {
                            waited: started.elapsed(),
                        });
                    }
                }
            }
        }
    }
}

/// The group `members` describe, with the algorithm asked for.
fn group(
    members: &[gm_barrier_peer_t],
    algorithm: c_uint,
    parameter: c_uint,
) -> Result<Group, String> {
    if members.is_empty() {
        return Err("the group is empty (members NULL or count 0)".to_owned());
    }
    let count = members.len();
    let mut group_members = Vec::with_capacity(count);
    for member in members {
        let node = u16::try_from(member.node_id);
        let port_id = u8::try_from(member.port_id);
        let (Ok(node), Ok(port_id)) = (node, port_id) else {
            return Err(format!(
                "node {} port {} is not a port of a NIC",
                member.node_id, member.port_id
            ));
        };
        group_members.push(Member::new(NodeId::new(node), PortId(port_id)));
    }
    let algorithm = match algorithm {
        NICBAR_BARRIER_DEFAULT => nicbar_schedule::default_for(count),
        NICBAR_BARRIER_PAIRWISE_EXCHANGE => Algorithm::PairwiseExchange,
        NICBAR_BARRIER_GATHER_BROADCAST => Algorithm::GatherBroadcast {
            dimension: if parameter == 0 {
                2
            } else {
                parameter as usize
            }
            .min(count.saturating_sub(1).max(1)),
            root: 0,
        },
        NICBAR_BARRIER_DISSEMINATION => Algorithm::Dissemination {
            n: if parameter == 0 {
                1
            } else {
                parameter as usize
            },
        },
        other => return Err(format!("{other} is not a NICBAR_BARRIER_* algorithm")),
    };
    Group::new(group_members)
        .map(|group| group.with_algorithm(algorithm))
        .map_err(|error| error.to_string())
}

/// This port's rank in `group`.
fn group_rank(group: &Group, node: NodeId, port: PortId) -> Result<usize, BarrierError> {
    let member = Member::new(node, port);
    group
        .rank_of(member)
        .ok_or(BarrierError::NotAMember { member })
}

/// The steps of `rank` in `group` under `algorithm`.
fn schedule(group: &Group, algorithm: Algorithm, rank: usize) -> Result<Vec<Step>, ScheduleError> {
    let mut steps = vec![Step::default(); nicbar_schedule::steps_needed(algorithm, group.len())?];
    let count = nicbar_schedule::compile(algorithm, group.members(), rank, &mut steps)?;
    steps.truncate(count);
    Ok(steps)
}

/// What a group barrier's end means.
fn outcome(group: &Group, end: &BarrierEnd) -> Result<(), BarrierError> {
    if end.status == GM_SUCCESS {
        return Ok(());
    }
    if end.refused {
        return Err(BarrierError::Refused {
            status: end.nic_status,
        });
    }
    let (node, port) = end.waiting_for.unwrap_or_default();
    let waiting_for = Member::new(NodeId::new(node), PortId(port));
    Err(BarrierError::Failed {
        waiting_for,
        rank: group.rank_of(waiting_for),
        reason: FailureReason::from_status(end.nic_status),
    })
}

/// The GM status for a group barrier's failure.
fn status_of(error: &BarrierError) -> gm_status_t {
    match error {
        BarrierError::NotAMember { .. } | BarrierError::Schedule(_) => GM_INVALID_PARAMETER,
        BarrierError::Busy => GM_BUSY,
        BarrierError::Port(error) => from_error(error),
        BarrierError::Refused { status } => from_nic(*status),
        BarrierError::Failed { reason, .. } => match reason {
            FailureReason::PeerPortClosed => GM_SEND_TARGET_PORT_CLOSED,
            FailureReason::NodeUnreachable => GM_SEND_TARGET_NODE_UNREACHABLE,
            FailureReason::TimedOut => GM_TIMED_OUT,
            FailureReason::Other(status) => from_nic(*status),
        },
        BarrierError::NoReport { .. } => GM_TIMED_OUT,
        BarrierError::NotRunning => GM_INTERNAL_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_abi::event::Status;

    fn peer(node_id: u32, port_id: u32) -> gm_barrier_peer_t {
        gm_barrier_peer_t { node_id, port_id }
    }

    #[test]
    fn a_group_is_checked_and_takes_the_algorithm_asked_for() {
        let members: Vec<_> = (0..4).map(|n| peer(n, 2)).collect();
        let pe = group(&members, NICBAR_BARRIER_DEFAULT, 0).unwrap();
        assert_eq!(pe.options().algorithm, Algorithm::PairwiseExchange);
        let gb = group(&members, NICBAR_BARRIER_GATHER_BROADCAST, 0).unwrap();
        assert_eq!(
            gb.options().algorithm,
            Algorithm::GatherBroadcast {
                dimension: 2,
                root: 0
            }
        );
        let d = group(&members[..3], NICBAR_BARRIER_DISSEMINATION, 2).unwrap();
        assert_eq!(d.options().algorithm, Algorithm::Dissemination { n: 2 });
        assert!(
            group(&[], NICBAR_BARRIER_DEFAULT, 0)
                .unwrap_err()
                .contains("empty")
        );
        assert!(group(&[peer(0, 300)], NICBAR_BARRIER_DEFAULT, 0).is_err());
        assert!(group(&[peer(1, 2), peer(1, 2)], NICBAR_BARRIER_DEFAULT, 0).is_err());
        assert!(
            group(&members, 9, 0)
                .unwrap_err()
                .contains("NICBAR_BARRIER_")
        );
        let me = group_rank(&pe, NodeId::new(2), PortId(2)).unwrap();
        assert_eq!(me, 2);
        assert_eq!(
            status_of(&group_rank(&pe, NodeId::new(7), PortId(2)).unwrap_err()),
            GM_INVALID_PARAMETER
        );
        assert_eq!(
            schedule(&pe, Algorithm::PairwiseExchange, 0).unwrap().len(),
            2
        );
    }

    /// A private directory for a daemon's socket (the daemon refuses one others may write).
    fn private_dir(name: &str) -> std::path::PathBuf {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!("nicbar-capi-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        dir
    }

    #[test]
    fn a_group_barrier_meets_only_the_same_groups_barrier_of_the_same_number() {
        // Two ports run nicbar_barrier over the same two members: first the same group (they
        // meet), then node 0 that group's next barrier while node 1 runs the group of the same
        // members in the other order (another group id). Each barrier's packets carry its
        // group's identity, so the second pair never meet and both fail at their timeout;
        // without it the NIC could not tell them apart and both would complete.
        let dir = private_dir("group-identity");
        let socket = dir.join("control.sock");
        let emulator = nicbar_emulator::Emulator::spawn(
            nicbar_emulator::EmulatorConfig::in_process(&socket, 2),
        )
        .unwrap();
        let forward = [peer(0, 2), peer(1, 2)];
        let backward = [peer(1, 2), peer(0, 2)];
        // Neither port closes before both second barriers ended: a closed port would fail the
        // other's barrier at once (GM_SEND_TARGET_PORT_CLOSED) instead of at its timeout.
        let both_done = std::sync::Arc::new(std::sync::Barrier::new(2));
        let run = |unit: u8, second: [gm_barrier_peer_t; 2]| {
            let socket = socket.clone();
            let both_done = both_done.clone();
            std::thread::spawn(move || {
                let mut port =
                    PortState::new(nicbar_rs::RawPort::open_at(&socket, unit, 2).unwrap());
                port.barriers.timeout = Some(Duration::from_millis(500));
                let first = port.group_barrier(&forward, NICBAR_BARRIER_DEFAULT, 0);
                let second = port.group_barrier(&second, NICBAR_BARRIER_DEFAULT, 0);
                both_done.wait();
                (first, second)
            })
        };
        let zero = run(0, forward);
        let one = run(1, backward);
        let (zero, one) = (zero.join().unwrap(), one.join().unwrap());
        assert_eq!(
            (zero.0, one.0),
            (GM_SUCCESS, GM_SUCCESS),
            "the same group meets"
        );
        assert_eq!(
            (zero.1, one.1),
            (GM_TIMED_OUT, GM_TIMED_OUT),
            "another group's barrier over the same ports must not complete it"
        );
        drop(emulator);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_end_names_the_member_and_maps_to_gms_status() {
        let members: Vec<_> = (0..3).map(|n| peer(n, 2)).collect();
        let group = group(&members, NICBAR_BARRIER_DEFAULT, 0).unwrap();
        let end = BarrierEnd {
            name: 1,
            waiter: Waiter::Library,
            barrier: BarrierId::NONE,
            status: from_nic(Status::BARRIER_TIMED_OUT),
            waiting_for: Some((2, 2)),
            nic_status: Status::BARRIER_TIMED_OUT,
            refused: false,
        };
        let error = outcome(&group, &end).unwrap_err();
        assert_eq!(status_of(&error), GM_TIMED_OUT);
        assert!(
            error.to_string().contains("rank 2 (node 2 port 2)"),
            "{error}"
        );
        let refused = BarrierEnd {
            refused: true,
            nic_status: Status::BARRIER_BUSY,
            status: from_nic(Status::BARRIER_BUSY),
            waiting_for: None,
            ..end
        };
        assert_eq!(status_of(&outcome(&group, &refused).unwrap_err()), GM_BUSY);
        let done = BarrierEnd {
            status: GM_SUCCESS,
            ..end
        };
        assert!(outcome(&group, &done).is_ok());
    }
}
