//! How a transfer fails.

use crate::{Member, Status};

/// Why a transfer failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransferError {
    /// The NIC could not deliver to `peer`: `status` says why (its port closed; or, for longer
    /// than the retry window, its NIC answered nothing or it had no buffer).
    Peer {
        /// The receiver.
        peer: Member,
        /// The send's end.
        status: Status,
    },
    /// The port failed under the transfers.
    Port(String),
    /// `peer`'s message came before it was asked for, and holding it would have passed this
    /// process's limit of unexpected data: it was dropped.
    OverLimit {
        /// The sender.
        peer: Member,
        /// The message's length.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
}

impl std::error::Error for TransferError {}

impl std::fmt::Display for TransferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Peer { peer, status } => {
                let why = match *status {
                    Status::TARGET_PORT_CLOSED => "its port closed".to_owned(),
                    Status::TARGET_NODE_UNREACHABLE => "its NIC stopped answering".to_owned(),
                    Status::SEND_TIMED_OUT => "it took no data for too long".to_owned(),
                    other => format!("the send ended with status {}", other.0),
                };
                write!(f, "sending to {peer} failed: {why}")
            }
            Self::Port(message) => write!(f, "the port failed: {message}"),
            Self::OverLimit { peer, bytes, limit } => write!(
                f,
                "the message of {bytes} bytes from {peer} came before it was asked for, past \
                 this process's limit of {limit} bytes of unexpected data, and was dropped \
                 (NICBAR_COLL_UNEXPECTED_BYTES raises the limit)"
            ),
        }
    }
}
