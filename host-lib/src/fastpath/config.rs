//! [`FastPathConfig`]: the rings, buffers, peers and locks a fast path is built with.

use std::time::Duration;

/// The fast path's shape on this side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastPathConfig {
    /// Slots of each ring this process receives on (1..=[`MAX_SLOTS`](super::MAX_SLOTS)); 0 turns
    /// the fast path off toward this process (every peer then uses the ordinary path to it).
    pub slots: u32,
    /// Payload bytes a slot holds (at most [`MAX_MESSAGE`](super::MAX_MESSAGE)); longer messages
    /// fall back.
    pub slot_payload: usize,
    /// Peers whose rings this process polls: the first this many it connects to.
    pub polling_set: usize,
    /// The most peers this process connects to.
    pub max_peers: usize,
    /// Receive buffers kept provided for the ordinary path.
    pub receive_buffers: usize,
    /// Lock words this process hosts for its peers ([`FastPath::lock`](super::FastPath::lock)).
    pub locks: usize,
    /// Bytes of shared memory after the lock words that peers read and write with
    /// [`FastPath::read_u64`](super::FastPath::read_u64) and
    /// [`FastPath::write_u64`](super::FastPath::write_u64) (whole 8-byte words).
    pub shared_bytes: usize,
    /// How long [`FastPath::wait_connected`](super::FastPath::wait_connected) and a send to a peer
    /// not yet connected wait.
    pub setup_timeout: Duration,
}

impl Default for FastPathConfig {
    fn default() -> Self {
        Self {
            slots: 32,
            slot_payload: 1024,
            polling_set: 8,
            max_peers: 64,
            receive_buffers: 32,
            locks: 1,
            shared_bytes: 64,
            setup_timeout: Duration::from_secs(30),
        }
    }
}
