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

/// A slot's checksum: over its message sequence, length and payload, eight bytes at a step.
///
/// It guards against a torn slot (bytes of an earlier lap still showing), not against a forger,
/// and it runs twice per message on the fast path's critical path: each step is FNV-1a's
/// xor-and-multiply on a 64-bit word, rotated so that every bit reaches the low half the result
/// keeps. A step is a bijection of the running hash, so a slot that differs from the message in
/// one word has another 64-bit hash; the 32 bits kept then match by chance only. (Byte-wise
/// FNV-1a, a multiply per byte on the sender and again on the receiver, made the fast path
/// slower than the ordinary path from 1 KiB.)
pub(super) fn checksum(seq: u64, payload: &[u8]) -> u32 {
    const BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let step = |hash: u64, word: u64| (hash ^ word).wrapping_mul(PRIME).rotate_left(23);
    let mut hash = step(step(BASIS, seq), payload.len() as u64);
    let mut words = payload.chunks_exact(8);
    for word in &mut words {
        hash = step(hash, u64_at(word, 0).unwrap_or(0));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        // Zero-padded: the length, hashed first, tells the padding from payload.
        let mut bytes = [0u8; 8];
        bytes[..rest.len()].copy_from_slice(rest);
        hash = step(hash, u64::from_le_bytes(bytes));
    }
    (hash ^ (hash >> 32)) as u32
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

#[cfg(test)]
mod tests {
    use super::checksum;

    #[test]
    fn the_checksum_sees_every_byte_the_sequence_and_the_length() {
        let payload: Vec<u8> = (0..4072u32).map(|i| (i * 7 + 3) as u8).collect();
        let sum = checksum(9, &payload);
        assert_eq!(sum, checksum(9, &payload), "a function of its input only");
        assert_ne!(sum, checksum(10, &payload), "another message sequence");
        for len in [0, 1, 7, 8, 9, 4071] {
            assert_ne!(
                checksum(9, &payload[..len]),
                checksum(9, &payload[..len + 1]),
                "a message one byte longer (the padding is not payload), at {len}"
            );
        }
        for at in [0, 5, 8, 2047, 4064, 4071] {
            for bit in [0, 3, 7] {
                let mut torn = payload.clone();
                torn[at] ^= 1 << bit;
                assert_ne!(sum, checksum(9, &torn), "bit {bit} of byte {at}");
            }
        }
        // A torn slot: a run of bytes still holding an earlier lap's message.
        let mut stale = payload.clone();
        stale[1024..2048].fill(0);
        assert_ne!(sum, checksum(9, &stale));
    }
}
