//! What the fast path did so far: counters of each route and each refusal.

/// What the fast path did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Messages sent by put into a ring.
    pub sent_fast: u64,
    /// Messages sent the ordinary way because they were longer than the receiver's slots.
    pub fallback_too_long: u64,
    /// Messages sent the ordinary way because the receiver's ring had no room (no credit).
    pub fallback_no_credit: u64,
    /// Messages sent the ordinary way because the receiver keeps no ring for this process
    /// (outside its polling set, or its fast path off), or because the caller asked.
    pub fallback_no_ring: u64,
    /// Messages received from rings.
    pub received_fast: u64,
    /// Messages received the ordinary way.
    pub received_ordinary: u64,
    /// Messages delivered after waiting for an earlier one of the same pair.
    pub reordered: u64,
    /// Credit puts sent (besides piggybacked acknowledgements).
    pub credit_puts: u64,
    /// Hellos, messages and slots refused as malformed, duplicated or from no known peer.
    pub rejected: u64,
    /// Hellos of this side that a peer's NIC refused because the peer's port was not open yet;
    /// each is sent again.
    pub hellos_refused: u64,
}
