//! How a collective fails: one error per cause, each naming the rank it is about where there is
//! one.

use std::time::Duration;

use super::transfer::TransferError;

/// Why a collective failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CollError {
    /// Sending to `rank` failed.
    Peer {
        /// The receiver's rank.
        rank: usize,
        /// How.
        error: TransferError,
    },
    /// `rank`'s data did not come within the timeout.
    Timeout {
        /// The rank waited for.
        rank: usize,
        /// How long.
        waited: Duration,
    },
    /// `rank` sent another length than this rank expects (the ranks' counts or types differ).
    Length {
        /// The sender.
        rank: usize,
        /// What this rank expected.
        expected: usize,
        /// What came.
        got: usize,
    },
    /// The NIC's broadcast failed: the member it waited for (if it names one) and how.
    Nic {
        /// The rank the NIC waited for.
        rank: Option<usize>,
        /// What happened.
        message: String,
    },
    /// Rank `by` gave the collective up, having found `rank` missing (if it named one); this
    /// rank, waiting on it, fails alike.
    GaveUp {
        /// The rank that gave up.
        by: usize,
        /// The rank it found missing.
        rank: Option<usize>,
    },
    /// The arguments cannot describe the operation.
    Argument(String),
    /// The port failed.
    Port(String),
}

impl CollError {
    /// The rank that is missing, if the failure is one: a peer the NIC could not reach, one
    /// whose data did not come, or the one a rank that gave up named. (A rank that sent a wrong length is named in the message
    /// alone: it is there.)
    pub fn rank(&self) -> Option<usize> {
        match self {
            Self::Peer { rank, .. } | Self::Timeout { rank, .. } => Some(*rank),
            Self::Nic { rank, .. } | Self::GaveUp { rank, .. } => *rank,
            Self::Length { .. } | Self::Argument(_) | Self::Port(_) => None,
        }
    }
}

impl std::error::Error for CollError {}

impl std::fmt::Display for CollError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Peer { rank, error } => write!(f, "rank {rank}: {error}"),
            Self::Timeout { rank, waited } => write!(
                f,
                "waited {:.1} s for rank {rank}'s data: is it still running this collective?",
                waited.as_secs_f64()
            ),
            Self::Length {
                rank,
                expected,
                got,
            } => write!(
                f,
                "rank {rank} sent {got} bytes where {expected} were expected (do the ranks' \
                 counts and datatypes match?)"
            ),
            Self::Nic { message, .. } => write!(f, "the NIC's broadcast failed: {message}"),
            Self::GaveUp {
                by,
                rank: Some(rank),
            } => {
                write!(
                    f,
                    "rank {by} gave this collective up for want of rank {rank}"
                )
            }
            Self::GaveUp { by, rank: None } => write!(f, "rank {by} gave this collective up"),
            Self::Argument(message) => write!(f, "{message}"),
            Self::Port(message) => write!(f, "the port failed: {message}"),
        }
    }
}
