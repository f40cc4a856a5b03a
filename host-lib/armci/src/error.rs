//! How an ARMCI call fails.

use std::fmt;

use nicbar::{BarrierError, Status};

/// What went wrong in an ARMCI call.
#[derive(Debug)]
pub enum ArmciError {
    /// The job could not start: no rank, a rendezvous that failed, a bad setting.
    Launch(String),
    /// The port (opening it, posting to it, the daemon behind it).
    Port(nicbar::Error),
    /// The NIC refused or failed a put, get or atomic to `rank`: `status` names the rule
    /// (`TARGET_PORT_CLOSED` when the rank's process is gone).
    Operation {
        /// What the operation was.
        what: &'static str,
        /// The target rank.
        rank: usize,
        /// How it ended.
        status: Status,
    },
    /// The NIC's barrier failed (a member died or timed out).
    Barrier(BarrierError),
    /// A collective call waited longer than the configured timeout for `rank`.
    Timeout {
        /// What waited.
        what: &'static str,
        /// The rank it waited for.
        rank: usize,
    },
    /// A queued lock acquisition gave up: `rank`, ahead of this rank in the lock's queue, is
    /// gone (`gone`), or gave up itself because a rank further ahead is gone.
    LockAbandoned {
        /// Which lock.
        lock: String,
        /// The rank just ahead in the queue.
        rank: usize,
        /// Whether that rank's process is gone (else it gave up in turn).
        gone: bool,
    },
    /// A message from a peer that does not parse, or one that breaks the collective's order.
    Protocol(String),
    /// An argument the call cannot take: a rank out of range, an address outside every
    /// allocation of its rank, a misaligned word, an unknown operation or type.
    Invalid(String),
}

impl fmt::Display for ArmciError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Launch(why) => write!(f, "ARMCI could not start: {why}"),
            Self::Port(error) => write!(f, "the port: {error}"),
            Self::Operation { what, rank, status } => {
                write!(f, "{what} to rank {rank} failed: {status:?}")
            }
            Self::Barrier(error) => write!(f, "the barrier: {error}"),
            Self::Timeout { what, rank } => write!(f, "{what} waited too long for rank {rank}"),
            Self::LockAbandoned {
                lock,
                rank,
                gone: true,
            } => write!(
                f,
                "{lock}: rank {rank}, ahead of this rank in its queue, is gone; this \
                 acquisition gave up (what the lock protected may be half updated)"
            ),
            Self::LockAbandoned {
                lock,
                rank,
                gone: false,
            } => write!(
                f,
                "{lock}: rank {rank}, ahead of this rank in its queue, gave up because a rank \
                 ahead of it is gone; so did this acquisition"
            ),
            Self::Protocol(why) => write!(f, "a peer broke the protocol: {why}"),
            Self::Invalid(why) => write!(f, "invalid argument: {why}"),
        }
    }
}

impl std::error::Error for ArmciError {}

impl From<nicbar::Error> for ArmciError {
    fn from(error: nicbar::Error) -> Self {
        Self::Port(error)
    }
}

impl From<BarrierError> for ArmciError {
    fn from(error: BarrierError) -> Self {
        Self::Barrier(error)
    }
}

impl ArmciError {
    /// The C API's code for it: a negative number, one per kind.
    pub fn code(&self) -> i32 {
        match self {
            Self::Launch(_) => -1,
            Self::Port(_) => -2,
            Self::Operation { .. } => -3,
            Self::Barrier(_) => -4,
            Self::Timeout { .. } => -5,
            Self::Protocol(_) => -6,
            Self::Invalid(_) => -7,
            Self::LockAbandoned { .. } => -8,
        }
    }
}
