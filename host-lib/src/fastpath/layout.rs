//! The bytes of the fast path: the limits of a ring and its slots, a slot's checksum, the
//! ordinary messages' header and kinds, and the little-endian readers that parse them (the slot
//! layout itself is drawn in the module's documentation).

use shared_abi::MTU_PAYLOAD;

/// Bytes of the header of every ordinary message the fast path sends: its kind and the pair's
/// message sequence.
pub(super) const ORDINARY_HEADER: usize = 16;
/// The longest message [`FastPath::send`](super::FastPath::send) takes: what one ordinary message
/// carries after its header.
pub const MAX_MESSAGE: usize = BUFFER_LEN - ORDINARY_HEADER;
/// The most slots a ring may have (credits travel modulo 256).
pub const MAX_SLOTS: u32 = 128;
/// Bytes a slot takes besides its payload: the header and the tail flag.
pub const SLOT_OVERHEAD: usize = 40;
/// The size class of every ordinary message: the largest whose messages are one packet.
pub(super) const SIZE_CLASS: u8 = 12;
/// Bytes of each receive buffer: what a message of [`SIZE_CLASS`] holds (GM's
/// `gm_max_length_for_size`).
pub(super) const BUFFER_LEN: usize = shared_abi::max_length_for_size(SIZE_CLASS) as usize;
const _: () = assert!(
    BUFFER_LEN <= MTU_PAYLOAD,
    "an ordinary message is one packet"
);
/// Bytes of a staging slot: the longest slot there is.
pub(super) const STAGING_SLOT: usize = SLOT_OVERHEAD + MAX_MESSAGE.div_ceil(8) * 8;

/// Ordinary message kinds (the first byte).
pub(super) mod kind {
    pub(in crate::fastpath) const HELLO: u8 = 1;
    pub(in crate::fastpath) const DATA: u8 = 2;
    pub(in crate::fastpath) const LOCK_REQUEST: u8 = 3;
    pub(in crate::fastpath) const LOCK_GRANT: u8 = 4;
    pub(in crate::fastpath) const LOCK_RELEASE: u8 = 5;
}

/// FNV-1a over a slot's message sequence, length and payload.
pub(super) fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in seq
        .to_le_bytes()
        .iter()
        .chain((payload.len() as u32).to_le_bytes().iter())
        .chain(payload)
    {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

pub(super) fn align8(len: usize) -> usize {
    len.div_ceil(8) * 8
}

pub(super) fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    bytes
        .get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

pub(super) fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let b = bytes.get(at..at + 8)?;
    let mut word = [0u8; 8];
    word.copy_from_slice(b);
    Some(u64::from_le_bytes(word))
}
