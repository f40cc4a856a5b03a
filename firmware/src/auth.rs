//! The authenticated fabric: every packet on the wire carries a message authentication code
//! under the fabric key, checked before anything of the packet is parsed.
//!
//! The code is keyed BLAKE2s (RFC 7693; designed for 8- to 32-bit processors such as a NIC's)
//! with a 16-byte tag, appended to the packet as a trailer ([`MAC_LEN`] bytes). It covers every
//! byte of the header and payload — node ids, ports, epochs, sequence numbers, acks — so a packet
//! that was not made by a holder of the key is dropped and counted, never parsed: it cannot
//! deliver a message, complete a barrier, reset a connection with a forged SYN, or take a
//! connection slot. A replayed packet is a real packet of an earlier moment, which the
//! reliability protocol already takes as a duplicate or as a packet of an old epoch.
//!
//! Without a key (a NIC whose packets never leave one trusted process, or a benchmark measuring
//! what the code costs) packets carry no trailer; every NIC of a fabric must agree.

use blake2::Blake2sMac;
use blake2::digest::consts::U16;
use blake2::digest::{KeyInit, Mac};
pub use shared_abi::packet::MAC_LEN;

/// A fabric key: 32 secret bytes every NIC of the fabric holds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FabricKey([u8; 32]);

impl FabricKey {
    /// The code's name, for reports.
    pub const ALGORITHM: &'static str = "keyed BLAKE2s, 16-byte tag";

    /// The key of these 32 bytes.
    pub const fn new(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The tag of `bytes` under this key.
    pub fn tag(&self, bytes: &[u8]) -> [u8; MAC_LEN] {
        let mut mac = <Blake2sMac<U16> as KeyInit>::new(&self.0.into());
        mac.update(bytes);
        mac.finalize().into_bytes().into()
    }

    /// The packet inside `wire` if its trailer is the right tag of the rest, compared in constant
    /// time; `None` for a forged, corrupted or truncated packet.
    pub fn open<'a>(&self, wire: &'a [u8]) -> Option<&'a [u8]> {
        let split = wire.len().checked_sub(MAC_LEN)?;
        let (packet, tag) = wire.split_at(split);
        let expected = self.tag(packet);
        let difference = expected
            .iter()
            .zip(tag)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        (difference == 0).then_some(packet)
    }
}

impl core::fmt::Debug for FabricKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("FabricKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tagged_packet_opens_and_any_change_is_refused() {
        let key = FabricKey::new([7; 32]);
        let packet = [1u8, 2, 3, 4, 5, 6, 7, 8, 9];
        let mut wire = packet.to_vec();
        wire.extend_from_slice(&key.tag(&packet));
        assert_eq!(key.open(&wire), Some(&packet[..]));
        for byte in 0..wire.len() {
            let mut changed = wire.clone();
            changed[byte] ^= 0x40;
            assert_eq!(key.open(&changed), None, "byte {byte} changed");
        }
        for cut in 0..wire.len() {
            assert_eq!(key.open(&wire[..cut]), None, "cut at {cut}");
        }
        assert_eq!(FabricKey::new([8; 32]).open(&wire), None, "another key");
        // RFC 7693's keyed BLAKE2s: the tag depends on the key, the bytes and the tag length.
        assert_ne!(key.tag(&packet), key.tag(&packet[..8]));
    }

    #[test]
    fn the_key_is_never_printed() {
        extern crate std;
        use std::format;
        assert_eq!(format!("{:?}", FabricKey::new([0x55; 32])), "FabricKey(..)");
    }
}
