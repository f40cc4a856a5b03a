//! What this process keeps for each peer: its ring, its credits both ways, the sequences of the
//! pair's messages, the stash of those out of turn, and what the peer's hello said.

use std::collections::BTreeMap;
use std::time::Instant;

use shared_abi::ids::{NodeId, PortId};

use super::message::Route;

/// What this process learnt of a peer from its hello.
#[derive(Clone, Copy, Debug)]
pub(super) struct Remote {
    pub(super) ring_key: u32,
    pub(super) ring_offset: u32,
    pub(super) credit_offset: u32,
    pub(super) slots: u32,
    pub(super) slot_size: usize,
    pub(super) lock_key: u32,
    pub(super) locks: u32,
    pub(super) lock_len: u32,
}

#[derive(Debug)]
pub(super) struct Peer {
    pub(super) node: NodeId,
    pub(super) port: PortId,
    /// Where the peer's ring lies in the receiving region, its slots (0: not in the polling set)
    /// and their size.
    pub(super) ring: usize,
    pub(super) slots: u32,
    pub(super) slot_size: usize,
    /// Where the credit byte the peer puts lies in the receiving region; the byte credits to it
    /// are sent from follows 8 bytes on.
    pub(super) credit: usize,
    pub(super) remote: Option<Remote>,
    /// This side's hello reached the peer's port (its send ended in success): until then a
    /// refused one may still have to be sent again.
    pub(super) hello_delivered: bool,
    pub(super) hello_retry: Option<Instant>,
    /// Sending: the next message sequence, fast-path slots used, and slots the peer consumed.
    pub(super) next_seq: u64,
    pub(super) fast_sent: u64,
    pub(super) fast_credited: u64,
    /// Receiving: the next message sequence to deliver, slots consumed, consumption reported.
    pub(super) expected: u64,
    pub(super) consumed: u64,
    pub(super) reported: u64,
    pub(super) credit_in_flight: bool,
    pub(super) stash: BTreeMap<u64, (Vec<u8>, Route)>,
    pub(super) torn_since: Option<Instant>,
    pub(super) failed: Option<String>,
}
