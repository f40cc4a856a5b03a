//! The nicbar ABI: every byte the host and the NIC agree on.
//!
//! This crate is the contract between the host side (`host-driver`, `host-lib`) and the NIC control
//! program (`firmware`). It holds the layouts of send tokens, receive tokens and events (the three
//! rings of a port), of the wire packet header, of the port region that a process maps, and of a
//! barrier schedule; and the single-producer/single-consumer ring protocol both sides run over
//! shared memory.
//!
//! Every layout is `#[repr(C)]`, derived with `zerocopy`, built from little-endian field types
//! (so alignment is 1 and there is no implicit padding), and its size is asserted at compile time.
//! Opcodes are transparent newtypes with associated constants, never Rust `enum`s: an unknown value
//! read from the other side is representable and is handled, not undefined behaviour.
//!
//! `unsafe` code lives only in [`ring::raw`], the one module that touches raw memory.
#![no_std]
#![deny(unsafe_code)]

pub mod event;
pub mod ids;
pub mod image;
pub mod packet;
pub mod qemu;
pub mod rdma;
pub mod reduce;
pub mod region;
pub mod reproducible;
pub mod ring;
pub mod schedule;
pub mod token;

/// The ABI version. Bumped on any change to a layout in this crate; a region, an image or a
/// packet carrying another version is refused.
pub const ABI_VERSION: u32 = 2;

/// Largest payload one wire packet carries, in bytes. A message up to this long travels in one
/// [`packet::PacketKind::DATA`] packet; a longer one is cut by the NIC into
/// [`packet::PacketKind::DATA_SEGMENT`] packets of [`packet::DATA_SEGMENT`] bytes.
pub const MTU_PAYLOAD: usize = 4096;

/// Largest payload of a put's packet on a route that never leaves the board's memory (between
/// the emulator's NICs of one daemon), where the board builds the packet itself from the
/// sender's memory: [`rdma::LOCAL_RDMA_SEGMENT`] bytes of data after the RDMA header, fifteen
/// times what a wire packet carries. Each packet costs the NIC about as much as its bytes do on
/// that route, so fewer of them move a long put at less than half the NIC's time per byte
/// (docs/long-allreduce.md). Within the header's 16-bit length.
pub const LOCAL_MTU_PAYLOAD: usize = rdma::LOCAL_RDMA_SEGMENT + rdma::RDMA_HEADER_LEN;
const _: () = assert!(LOCAL_MTU_PAYLOAD <= u16::MAX as usize);

/// Largest GM size class a port accepts: buffers of `2^size` bytes, holding at most
/// [`max_length_for_size`] bytes (GM's sizes on a 32-bit length, as GM 2 had them).
pub const MAX_SIZE_CLASS: u8 = 31;

/// The largest message length a buffer of size class `size` holds (GM's `gm_max_length_for_size`):
/// `2^size - 8`. Returns 0 for a size class out of range. A message of size class `k` fills a
/// receive buffer of class `k`, whatever the packets it travels in.
pub const fn max_length_for_size(size: u8) -> u32 {
    if size < 3 || size > MAX_SIZE_CLASS {
        return 0;
    }
    (1u32 << size) - 8
}

/// The smallest size class whose buffers hold `length` bytes (GM's `gm_min_size_for_length`), or
/// `None` if no size class does.
pub const fn min_size_for_length(length: u32) -> Option<u8> {
    let mut size = 3;
    while size <= MAX_SIZE_CLASS {
        if max_length_for_size(size) >= length {
            return Some(size);
        }
        size += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_trip() {
        assert_eq!(min_size_for_length(0), Some(3));
        assert_eq!(max_length_for_size(3), 0);
        assert_eq!(min_size_for_length(1), Some(4));
        assert_eq!(max_length_for_size(13), 8184);
        assert_eq!(min_size_for_length(MTU_PAYLOAD as u32), Some(13));
        assert_eq!(min_size_for_length(1 << 20), Some(21));
        assert_eq!(max_length_for_size(31), (1 << 31) - 8);
        assert_eq!(min_size_for_length((1 << 31) - 7), None);
        assert_eq!(max_length_for_size(2), 0);
        assert_eq!(max_length_for_size(32), 0);
        for length in (0..=3 * MTU_PAYLOAD as u32).chain([(1 << 30) - 8, (1 << 30) - 7]) {
            let size = min_size_for_length(length).unwrap();
            assert!(max_length_for_size(size) >= length);
            assert!(size == 3 || max_length_for_size(size - 1) < length);
        }
    }
}
