//! The authenticated fabric: every packet on the wire carries a message authentication code
//! under the fabric key, checked before anything of the packet is parsed.
//!
//! The code is keyed BLAKE3 (its keyed-hash mode, a PRF under a 32-byte key; 32-bit words and
//! seven rounds, so it suits a NIC's 32-bit core as BLAKE2s did, and the 1 KiB chunks of a full
//! packet are compressed side by side with SIMD where the processor has it) truncated to a
//! 16-byte tag, appended to the packet as a trailer ([`MAC_LEN`] bytes). It covers every
//! byte of the header and payload — node ids, ports, epochs, sequence numbers, acks — so a packet
//! that was not made by a holder of the key is dropped and counted, never parsed: it cannot
//! deliver a message, complete a barrier, reset a connection with a forged SYN, or take a
//! connection slot.
//!
//! The fabric key itself authenticates only the session handshake ([`crate::session`]); every
//! other packet between two NICs carries a tag under the key of their session, derived here
//! ([`FabricKey::session_key`]) from the fabric key and the fresh nonces both NICs offered, as
//! WireGuard, QUIC and Noise derive per-session keys. A packet recorded in an earlier session —
//! before either NIC restarted, gave up on the other, or recycled the connection — fails its tag
//! and is dropped before it is parsed.
//!
//! With the crate feature `std` (the emulator and the simulator turn it on) the code is the
//! `blake3` crate's, which picks the widest SIMD the processor has when it runs; without it (the
//! NIC image, the fuzz targets) it is this module's plain 32-bit one, which links no panic path.
//! Both compute the same function, checked against the specification's test vectors.
//!
//! Without a key (a benchmark measuring what the code costs) packets carry no trailer; every NIC
//! of a fabric must agree. A board whose route to a node never leaves its own memory (the
//! emulator's NICs of one daemon) sends and takes those packets without the trailer too
//! ([`crate::Hal::local_route`], [`crate::Nic::on_local_packet`]).

pub use shared_abi::packet::MAC_LEN;

/// A fabric key: 32 secret bytes every NIC of the fabric holds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FabricKey([u8; 32]);

impl FabricKey {
    /// The code's name, for reports.
    pub const ALGORITHM: &'static str = "keyed BLAKE3, 16-byte tag";

    /// The key of these 32 bytes.
    pub const fn new(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The tag of `bytes` under this key.
    pub fn tag(&self, bytes: &[u8]) -> [u8; MAC_LEN] {
        #[cfg(feature = "std")]
        {
            // BLAKE3's output is extendable: its first 16 bytes are the 16-byte tag.
            blake3::keyed_hash(&self.0, bytes)
                .as_bytes()
                .first_chunk::<MAC_LEN>()
                .copied()
                .unwrap_or([0; MAC_LEN])
        }
        #[cfg(not(feature = "std"))]
        {
            portable::keyed_tag(&self.0, bytes)
        }
    }

    /// The key of the session between `a` and `b` (each a node id and the nonce it offered):
    /// two tags of the fabric key over the ordered pair, so both sides derive the same key and no
    /// one without the fabric key can. No heap, no panic: the image derives it too.
    pub fn session_key(&self, a: (u16, u64), b: (u16, u64)) -> FabricKey {
        let (low, high) = if a <= b { (a, b) } else { (b, a) };
        let mut input = [0u8; 37];
        let label = b"nicbar session key v1.";
        let fields = [
            &low.0.to_le_bytes()[..],
            &low.1.to_le_bytes()[..],
            &high.0.to_le_bytes()[..],
            &high.1.to_le_bytes()[..],
        ];
        let mut at = 0;
        for part in fields {
            for byte in part {
                if let Some(slot) = input.get_mut(at) {
                    *slot = *byte;
                }
                at += 1;
            }
        }
        let mut key = [0u8; 32];
        for (half, out) in key.chunks_exact_mut(MAC_LEN).enumerate() {
            // The label and the half's number after the fields (20 bytes): 37 bytes in all.
            for (slot, byte) in input.iter_mut().skip(20).zip(label.iter().take(16)) {
                *slot = *byte;
            }
            if let Some(last) = input.last_mut() {
                *last = half as u8;
            }
            out.copy_from_slice(&self.tag(&input));
        }
        FabricKey(key)
    }

    /// A nonce: a tag of the fabric key over a board's boot entropy and a counter, so that every
    /// draw of one boot differs and none can be foreseen without the key and the entropy. Never
    /// zero (zero means "none" on the wire).
    pub fn nonce(&self, entropy: &[u8; 16], counter: u64) -> u64 {
        let mut input = [0u8; 32];
        for (slot, byte) in input.iter_mut().zip(b"nicbar-n".iter()) {
            *slot = *byte;
        }
        for (slot, byte) in input.iter_mut().skip(8).zip(entropy.iter()) {
            *slot = *byte;
        }
        for (slot, byte) in input.iter_mut().skip(24).zip(counter.to_le_bytes().iter()) {
            *slot = *byte;
        }
        let tag = self.tag(&input);
        let nonce = tag
            .first_chunk::<8>()
            .copied()
            .map_or(0, u64::from_le_bytes);
        if nonce == 0 { 1 } else { nonce }
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

/// Keyed BLAKE3 in plain 32-bit arithmetic, written so that no panic path is linked: the NIC
/// image's MAC (the `blake3` crate's tree code keeps slice-index and unwrap panics a no_std build
/// cannot drop). One pass over the input, one chunk at a time, with the specification's stack of
/// subtree chaining values.
#[cfg(any(not(feature = "std"), test))]
mod portable {
    use super::MAC_LEN;

    const IV: [u32; 8] = [
        0x6A09_E667,
        0xBB67_AE85,
        0x3C6E_F372,
        0xA54F_F53A,
        0x510E_527F,
        0x9B05_688C,
        0x1F83_D9AB,
        0x5BE0_CD19,
    ];
    const CHUNK_START: u32 = 1;
    const CHUNK_END: u32 = 2;
    const PARENT: u32 = 4;
    const ROOT: u32 = 8;
    const KEYED_HASH: u32 = 16;
    const BLOCK_LEN: usize = 64;
    const CHUNK_LEN: usize = 1024;
    /// Subtrees a stack holds at most: one per bit of a chunk count.
    const STACK: usize = 54;

    #[inline(always)]
    fn g(state: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize, x: u32, y: u32) {
        state[a] = state[a].wrapping_add(state[b]).wrapping_add(x);
        state[d] = (state[d] ^ state[a]).rotate_right(16);
        state[c] = state[c].wrapping_add(state[d]);
        state[b] = (state[b] ^ state[c]).rotate_right(12);
        state[a] = state[a].wrapping_add(state[b]).wrapping_add(y);
        state[d] = (state[d] ^ state[a]).rotate_right(8);
        state[c] = state[c].wrapping_add(state[d]);
        state[b] = (state[b] ^ state[c]).rotate_right(7);
    }

    /// The compression function: the full 16-word output.
    fn compress(
        cv: &[u32; 8],
        block: &[u32; 16],
        counter: u64,
        block_len: u32,
        flags: u32,
    ) -> [u32; 16] {
        let mut state = [
            cv[0],
            cv[1],
            cv[2],
            cv[3],
            cv[4],
            cv[5],
            cv[6],
            cv[7],
            IV[0],
            IV[1],
            IV[2],
            IV[3],
            counter as u32,
            (counter >> 32) as u32,
            block_len,
            flags,
        ];
        let mut m = *block;
        for round in 0..7 {
            g(&mut state, 0, 4, 8, 12, m[0], m[1]);
            g(&mut state, 1, 5, 9, 13, m[2], m[3]);
            g(&mut state, 2, 6, 10, 14, m[4], m[5]);
            g(&mut state, 3, 7, 11, 15, m[6], m[7]);
            g(&mut state, 0, 5, 10, 15, m[8], m[9]);
            g(&mut state, 1, 6, 11, 12, m[10], m[11]);
            g(&mut state, 2, 7, 8, 13, m[12], m[13]);
            g(&mut state, 3, 4, 9, 14, m[14], m[15]);
            if round < 6 {
                // The message permutation (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8),
                // written out so that every index is a constant.
                m = [
                    m[2], m[6], m[3], m[10], m[7], m[0], m[4], m[13], m[1], m[11], m[12], m[5],
                    m[9], m[14], m[15], m[8],
                ];
            }
        }
        for i in 0..8 {
            state[i] ^= state[i + 8];
            state[i + 8] ^= cv[i];
        }
        state
    }

    fn first_half(words: [u32; 16]) -> [u32; 8] {
        let mut half = [0; 8];
        half.copy_from_slice(&words[..8]);
        half
    }

    /// Up to 64 bytes as a zero-padded block of little-endian words.
    fn block_words(bytes: &[u8]) -> [u32; 16] {
        let mut padded = [0u8; BLOCK_LEN];
        for (to, from) in padded.iter_mut().zip(bytes) {
            *to = *from;
        }
        let mut words = [0u32; 16];
        for (word, four) in words.iter_mut().zip(padded.chunks_exact(4)) {
            *word = four
                .first_chunk::<4>()
                .copied()
                .map_or(0, u32::from_le_bytes);
        }
        words
    }

    /// The last compression of a node: done once its place in the tree (root or not) is known.
    struct Output {
        cv: [u32; 8],
        block: [u32; 16],
        counter: u64,
        block_len: u32,
        flags: u32,
    }

    impl Output {
        fn chaining_value(&self) -> [u32; 8] {
            first_half(compress(
                &self.cv,
                &self.block,
                self.counter,
                self.block_len,
                self.flags,
            ))
        }

        fn root_words(&self) -> [u32; 16] {
            compress(&self.cv, &self.block, 0, self.block_len, self.flags | ROOT)
        }
    }

    /// Chunk number `counter` (at most 1 KiB; empty only for an empty input).
    fn chunk(key: &[u32; 8], chunk: &[u8], counter: u64) -> Output {
        let mut cv = *key;
        let mut start = CHUNK_START;
        let mut rest = chunk;
        while rest.len() > BLOCK_LEN {
            let (block, after) = rest.split_at(BLOCK_LEN);
            let flags = KEYED_HASH | start;
            cv = first_half(compress(&cv, &block_words(block), counter, 64, flags));
            start = 0;
            rest = after;
        }
        Output {
            cv,
            block: block_words(rest),
            counter,
            block_len: rest.len() as u32,
            flags: KEYED_HASH | start | CHUNK_END,
        }
    }

    fn parent(key: &[u32; 8], left: &[u32; 8], right: &[u32; 8]) -> Output {
        let mut block = [0u32; 16];
        for (to, from) in block.iter_mut().zip(left.iter().chain(right)) {
            *to = *from;
        }
        Output {
            cv: *key,
            block,
            counter: 0,
            block_len: BLOCK_LEN as u32,
            flags: KEYED_HASH | PARENT,
        }
    }

    /// The first [`MAC_LEN`] bytes of keyed BLAKE3 of `input` under `key`.
    pub(super) fn keyed_tag(key: &[u8; 32], input: &[u8]) -> [u8; MAC_LEN] {
        let mut key_words = [0u32; 8];
        for (word, four) in key_words.iter_mut().zip(key.chunks_exact(4)) {
            *word = four
                .first_chunk::<4>()
                .copied()
                .map_or(0, u32::from_le_bytes);
        }
        // Every chunk but the last goes onto the stack of complete subtrees, merged as the
        // chunk count's low zero bits say; the last is merged with the whole stack at the end.
        let mut stack = [[0u32; 8]; STACK];
        let mut depth = 0usize;
        let mut rest = input;
        let mut counter = 0u64;
        while rest.len() > CHUNK_LEN {
            let (this, after) = rest.split_at(CHUNK_LEN);
            let mut cv = chunk(&key_words, this, counter).chaining_value();
            counter += 1;
            let mut total = counter;
            while total & 1 == 0 {
                let Some(left) = depth.checked_sub(1).and_then(|top| stack.get(top)) else {
                    break;
                };
                cv = parent(&key_words, left, &cv).chaining_value();
                depth -= 1;
                total >>= 1;
            }
            if let Some(slot) = stack.get_mut(depth) {
                *slot = cv;
                depth += 1;
            }
            rest = after;
        }
        let mut output = chunk(&key_words, rest, counter);
        for left in stack.iter().take(depth).rev() {
            output = parent(&key_words, left, &output.chaining_value());
        }
        let words = output.root_words();
        let mut tag = [0u8; MAC_LEN];
        for (four, word) in tag.chunks_exact_mut(4).zip(words) {
            four.copy_from_slice(&word.to_le_bytes());
        }
        tag
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

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
        // The tag depends on the bytes and their length, not only on a prefix.
        assert_ne!(key.tag(&packet), key.tag(&packet[..8]));
    }

    #[test]
    fn a_full_packet_is_tagged_as_keyed_blake3_says() {
        // The reference: the keyed_hash vector of BLAKE3's test_vectors.json for an input of
        // 4096 bytes (byte i is i % 251) under the key "whats the Elvish word for friend",
        // truncated to the tag's length. A full packet spans four 1 KiB chunks, so this checks
        // the SIMD path this build takes against the specification.
        let key = FabricKey::new(*b"whats the Elvish word for friend");
        let input: std::vec::Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        let expected = [
            0xbe, 0xfc, 0x66, 0x0a, 0xea, 0x2f, 0x17, 0x18, 0x88, 0x4c, 0xd8, 0xde, 0xb9, 0x90,
            0x28, 0x11,
        ];
        assert_eq!(key.tag(&input), expected);
        // A packet as long as the longest on the wire also round-trips.
        let packet: std::vec::Vec<u8> = (0..shared_abi::packet::MAX_PACKET_LEN)
            .map(|i| i as u8)
            .collect();
        let mut wire = packet.clone();
        wire.extend_from_slice(&key.tag(&packet));
        assert_eq!(key.open(&wire), Some(&packet[..]));
        wire[2000] ^= 1;
        assert_eq!(key.open(&wire), None);
    }

    #[test]
    fn the_portable_code_follows_the_specification() {
        // BLAKE3's published keyed_hash vectors (input byte i is i % 251, the key "whats the
        // Elvish word for friend"), first 16 bytes: a single block, a chunk and a block, and a
        // tree of 31 chunks whose last is partial (merges at every level of the stack).
        let key = *b"whats the Elvish word for friend";
        let cases: [(usize, &str); 4] = [
            (0, "92b2b75604ed3c761f9d6f62392c8a92"),
            (1025, "357dc55de0c7e382c900fd6e320acc04"),
            (4096, "befc660aea2f1718884cd8deb9902811"),
            (31744, "efa53b389ab67c593dba624d898d0f73"),
        ];
        for (len, hex) in cases {
            let input: std::vec::Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let expected: std::vec::Vec<u8> = (0..MAC_LEN)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                .collect();
            assert_eq!(
                portable::keyed_tag(&key, &input)[..],
                expected[..],
                "{len} bytes"
            );
        }
    }

    /// With the `std` feature the tag is the `blake3` crate's: it must equal the portable code's
    /// (which the NIC image runs) at every packet length and beyond, or the NICs of one fabric
    /// would refuse each other's packets.
    #[cfg(feature = "std")]
    #[test]
    fn the_crate_and_the_portable_code_agree() {
        let seed = 0x6e69_6362_6172_u64;
        std::println!("seed {seed}");
        let mut state = seed;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut key = [0u8; 32];
        key.iter_mut().for_each(|b| *b = next() as u8);
        let fabric = FabricKey::new(key);
        let bytes: std::vec::Vec<u8> = (0..(1 << 20) + 7).map(|_| next() as u8).collect();
        let lengths = (0..=shared_abi::packet::MAX_WIRE_LEN).chain([
            8191,
            8192,
            8193,
            65536,
            65537 + 1024 * 5,
            bytes.len(),
        ]);
        for len in lengths {
            let input = &bytes[..len];
            assert_eq!(
                fabric.tag(input),
                portable::keyed_tag(&key, input),
                "{len} bytes"
            );
        }
    }

    #[test]
    fn the_key_is_never_printed() {
        use std::format;
        assert_eq!(format!("{:?}", FabricKey::new([0x55; 32])), "FabricKey(..)");
    }
}
