//! What the transfers keep of each message: its sends and their packets in the NIC, a
//! rendezvous's state, and a message being assembled.

use std::sync::Arc;

use crate::{Member, RemotePointer};

use super::TransferError;
use super::payload::Payload;
use super::pool::Lent;
use super::wire::{Key, segment_count};

/// Names a message posted with [`Transfers::send`](super::Transfers::send).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SendId(pub(super) u64);

/// A message not yet wholly handed to the NIC.
pub(super) struct Outgoing {
    pub(super) id: SendId,
    pub(super) to: Member,
    pub(super) key: Key,
    pub(super) data: Arc<[u8]>,
    /// Index of the next segment to post.
    pub(super) next: usize,
    /// A rendezvous control message: `data` goes as it is, in one packet, with no header.
    pub(super) control: bool,
}

impl Outgoing {
    /// Packets the message takes.
    pub(super) fn packets(&self) -> usize {
        if self.control {
            1
        } else {
            segment_count(self.data.len())
        }
    }
}

/// Where a rendezvous send stands.
pub(super) enum Rendezvous {
    /// The ready-to-send is out; the receiver's answer has not come.
    Asking { data: Payload },
    /// The receiver's landing region is known: the message is in `region` and goes there by
    /// puts.
    Putting {
        region: Lent,
        /// The landing region's remote pointer.
        remote: RemotePointer,
        total: usize,
        /// Offset of the first byte no put has carried yet.
        next: usize,
        /// Chunks to put again (their put was given up on): (offset, length).
        again: Vec<(usize, usize)>,
        /// Puts in the NIC.
        in_flight: usize,
        /// Bytes the target has.
        landed: usize,
    },
}

/// A put of a rendezvous in the NIC, by its context.
pub(super) struct PutFlight {
    pub(super) id: SendId,
    pub(super) to: Member,
    pub(super) offset: usize,
    pub(super) length: usize,
}

/// A rendezvous the receiver has answered or offered: where the message lands, until its
/// "done".
pub(super) struct Landing {
    /// The sender's id of the message; `None` for a landing this endpoint offered before the
    /// sender said it was ready (whatever id its "done" names).
    pub(super) id: Option<u64>,
    pub(super) total: usize,
    pub(super) region: Lent,
}

/// A segment in the NIC, by the send's context.
pub(super) struct InFlight {
    pub(super) id: SendId,
    pub(super) to: Member,
    pub(super) length: usize,
    /// A forwarded packet not yet handed to the NIC (its send's `unposted` still counts it).
    pub(super) fresh: bool,
}

/// A message's sends: segments not yet handed to the NIC, segments not yet delivered, its
/// error if one failed, and whether its sender has stopped asking (it was handed over whole).
pub(super) struct SendRecord {
    pub(super) unposted: usize,
    pub(super) undelivered: usize,
    pub(super) error: Option<TransferError>,
    pub(super) detached: bool,
    /// The rendezvous under way, if the message goes by one (`None` once its "done" is queued).
    pub(super) rendezvous: Option<(Member, Key, Rendezvous)>,
    /// A rendezvous control message of the transfers' own, not a caller's message.
    pub(super) internal: bool,
    /// The forward (sender and key) this send passes on, while none of its message has come.
    pub(super) awaiting: Option<(Member, Key)>,
}

impl SendRecord {
    /// The record of a message not yet handed to the NIC, in `packets` packets.
    pub(super) fn new(packets: usize) -> Self {
        Self {
            unposted: packets,
            undelivered: packets,
            error: None,
            detached: false,
            rendezvous: None,
            internal: false,
            awaiting: None,
        }
    }
}

/// A message being assembled from its segments.
pub(super) struct Assembly {
    pub(super) data: Vec<u8>,
    pub(super) arrived: Vec<bool>,
    pub(super) missing: usize,
}
