//! How a barrier fails: the reasons the NIC reports, and the errors of the port's barrier calls.

use std::time::Duration;

use nicbar_schedule::{Member, ScheduleError};
use shared_abi::event::Status;

use crate::error::Error;

/// Why a barrier ended without completing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureReason {
    /// The member's port closed (its process exited or died).
    PeerPortClosed,
    /// The member's NIC stopped answering.
    NodeUnreachable,
    /// The barrier's timeout expired while it waited for the member.
    TimedOut,
    /// Another status the NIC reported.
    Other(Status),
}

impl FailureReason {
    /// The reason a NIC status names.
    pub fn from_status(status: Status) -> Self {
        match status {
            Status::TARGET_PORT_CLOSED => Self::PeerPortClosed,
            Status::TARGET_NODE_UNREACHABLE => Self::NodeUnreachable,
            Status::BARRIER_TIMED_OUT => Self::TimedOut,
            other => Self::Other(other),
        }
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PeerPortClosed => f.write_str("its port closed"),
            Self::NodeUnreachable => f.write_str("its node is unreachable"),
            Self::TimedOut => f.write_str("the barrier timed out"),
            Self::Other(status) => write!(f, "the NIC reported status {}", status.0),
        }
    }
}

/// A group barrier did not complete.
#[derive(Debug)]
pub enum BarrierError {
    /// This port is not a member of the group.
    NotAMember {
        /// This port.
        member: Member,
    },
    /// The group's algorithm does not compile for it (a parameter out of range for its size,
    /// too many rounds or steps).
    Schedule(ScheduleError),
    /// The port runs as many barriers as the NIC does at once
    /// ([`shared_abi::schedule::RUNNING_BARRIERS`]), or one of the same identity.
    Busy,
    /// The port failed (the daemon is gone, no tokens, the arena is full, ...).
    Port(Error),
    /// The NIC refused the barrier token.
    Refused {
        /// Why (`BARRIER_BUSY` after repeated attempts, `BAD_SCHEDULE`, `BAD_BUFFER`).
        status: Status,
    },
    /// The barrier ended without completing, while it waited for `waiting_for`.
    Failed {
        /// The member it waited for.
        waiting_for: Member,
        /// That member's rank in the group, if it is one.
        rank: Option<usize>,
        /// Why it gave up.
        reason: FailureReason,
    },
    /// The NIC did not report the barrier's end within its timeout and a grace period after
    /// it. The barrier may still be running in the NIC: the port refuses new barriers until its
    /// end event comes.
    NoReport {
        /// How long the wait lasted.
        waited: Duration,
    },
    /// [`crate::Port::barrier_wait`] or [`crate::Port::barrier_test`] was given a barrier this port is not
    /// running (it was started on another port).
    NotRunning,
}

impl std::fmt::Display for BarrierError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotAMember { member } => {
                write!(f, "{member} is not a member of the barrier group")
            }
            Self::Schedule(error) => write!(f, "the barrier schedule does not compile: {error}"),
            Self::Busy => f.write_str(
                "the port already runs as many barriers as the NIC does at once, or one of the same identity",
            ),
            Self::Port(error) => write!(f, "{error}"),
            Self::Refused { status } => {
                write!(f, "the NIC refused the barrier (status {})", status.0)
            }
            Self::Failed {
                waiting_for,
                rank,
                reason,
            } => match rank {
                Some(rank) => write!(
                    f,
                    "the barrier failed waiting for rank {rank} ({waiting_for}): {reason}"
                ),
                None => write!(f, "the barrier failed waiting for {waiting_for}: {reason}"),
            },
            Self::NoReport { waited } => write!(
                f,
                "the NIC did not report the barrier's end within {waited:?}"
            ),
            Self::NotRunning => f.write_str("that barrier is not running on this port"),
        }
    }
}

impl std::error::Error for BarrierError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Port(error) => Some(error),
            Self::Schedule(error) => Some(error),
            _ => None,
        }
    }
}

impl From<Error> for BarrierError {
    fn from(error: Error) -> Self {
        Self::Port(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_abi::ids::{NodeId, PortId};

    fn member(node: u16, port: u8) -> Member {
        Member::new(NodeId::new(node), PortId(port))
    }

    #[test]
    fn failures_name_the_rank_and_the_reason() {
        let error = BarrierError::Failed {
            waiting_for: member(3, 1),
            rank: Some(2),
            reason: FailureReason::from_status(Status::TARGET_PORT_CLOSED),
        };
        assert_eq!(
            error.to_string(),
            "the barrier failed waiting for rank 2 (node 3 port 1): its port closed"
        );
        assert_eq!(
            FailureReason::from_status(Status::BARRIER_TIMED_OUT),
            FailureReason::TimedOut
        );
        assert_eq!(
            FailureReason::from_status(Status::TARGET_NODE_UNREACHABLE),
            FailureReason::NodeUnreachable
        );
        assert_eq!(
            FailureReason::from_status(Status::NO_RESOURCES),
            FailureReason::Other(Status::NO_RESOURCES)
        );
    }
}
