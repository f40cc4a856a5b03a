//! board: what the host and the NIC core on QEMU's `virt` machine agree on, besides the port ABI.
//!
//! The bootable firmware is this package's binary (`src/main.rs`); this library is the part of
//! the board both sides compile: the guest-physical memory map ([`layout`]), the mailbox through
//! which the host opens and closes ports and the guest reports its state ([`layout::Mailbox`]),
//! and the packet rings of the wire between QEMU NICs ([`wire`]). The host side
//! (`host_driver::qemu`) maps the same memory from the other end and reads it with the same
//! definitions, so a layout change cannot leave one side behind.
//!
//! Everything here is `no_std`, safe code over [`shared_abi::ring::SharedMemory`]: the raw
//! mapping on either side is someone else's (`RawMemory` over guest RAM in the firmware, a
//! mapped memfd on the host).
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]

pub mod layout;
pub mod wire;
