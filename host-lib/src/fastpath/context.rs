//! The context every put, operation and send of the fast path carries: what it was for (a tag in
//! the top byte), the peer, and a serial number, so that its completion finds its way back.

/// What an operation's or send's context names (the top byte).
pub(super) mod tag {
    pub(in crate::fastpath) const FAST_PUT: u64 = 1;
    pub(in crate::fastpath) const CREDIT_PUT: u64 = 2;
    pub(in crate::fastpath) const WAITED: u64 = 3;
    pub(in crate::fastpath) const HELLO: u64 = 4;
    pub(in crate::fastpath) const DATA: u64 = 5;
    pub(in crate::fastpath) const CONTROL: u64 = 6;
}

pub(super) fn context(tag: u64, peer: usize, serial: u64) -> u64 {
    tag << 56 | (peer as u64 & 0xff_ffff) << 32 | (serial & 0xffff_ffff)
}

pub(super) fn context_tag(context: u64) -> u64 {
    context >> 56
}

pub(super) fn context_peer(context: u64) -> usize {
    ((context >> 32) & 0xff_ffff) as usize
}
