//! What the transfers did, counted.

/// Counters of what the transfers did.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct TransferCounters {
    /// Messages delivered whole.
    pub messages_sent: u64,
    /// Messages received whole.
    pub messages_received: u64,
    /// Segments sent again after the NIC gave up on them.
    pub resent: u64,
    /// Messages that failed after their sender had stopped asking (the peer died after the
    /// operation ended here; its next operation with that peer fails on its own).
    pub late_failures: u64,
    /// Arrivals dropped: malformed, inconsistent or duplicated.
    pub dropped: u64,
    /// Messages sent by rendezvous (their data put into the receiver's memory).
    pub rendezvous_sent: u64,
    /// Messages received by rendezvous.
    pub rendezvous_received: u64,
    /// Ready-to-sends this endpoint refused (it could not register a landing region): those
    /// messages came eagerly.
    pub rendezvous_refused: u64,
    /// Landing regions offered before the sender's ready-to-send (the receiver waited for a
    /// message it knew the length of).
    pub rendezvous_offered: u64,
    /// Messages put into a landing region their receiver offered (no clear-to-send waited for).
    pub offers_taken: u64,
    /// Puts sent again after the NIC gave up on them.
    pub puts_resent: u64,
    /// Regions registered for rendezvous transfers.
    pub regions_registered: u64,
    /// Segments passed on as they arrived (forwarding), one per segment and rank.
    pub forwarded: u64,
    /// Messages not asked for yet that were refused for the limit of unexpected data (eager
    /// ones dropped, ready-to-sends kept waiting).
    pub over_limit: u64,
}
