//! Peers, routes and the messages the fast path delivers.

/// A peer of [`FastPath::connect`](super::FastPath::connect): its index in this process's peer
/// list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub usize);

/// Which path a message took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// A put into the receiver's ring.
    Fast,
    /// An ordinary message.
    Ordinary,
}

/// A message [`FastPath::poll`](super::FastPath::poll) or
/// [`FastPath::receive_timeout`](super::FastPath::receive_timeout) delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Who sent it.
    pub peer: PeerId,
    /// Its bytes.
    pub data: Vec<u8>,
    /// The path it came by.
    pub route: Route,
}
