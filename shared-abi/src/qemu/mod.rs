//! What the host and a NIC core on QEMU's `virt` machine agree on, besides the port ABI.
//!
//! The bootable firmware (`firmware/board`) and the host's QEMU backend (`nicbar-qemu`) both
//! compile these definitions: the guest-physical memory map ([`layout`]), the mailbox through
//! which the host opens and closes ports and the guest reports its state ([`layout::Mailbox`]),
//! the packet rings of the wire between QEMU NICs ([`wire`]), and the fabric's UDP/IPv4 framing for
//! a QEMU NIC whose MAC is a virtio-net device ([`net`]) with the ARP table that finds its
//! neighbours' MACs ([`neighbour`]). Each side maps the same memory
//! from its own end, so a layout change cannot leave one side behind.
//!
//! Everything here is safe code over [`crate::ring::SharedMemory`]: the raw mapping on either
//! side is someone else's (`RawMemory` over guest RAM in the firmware, a mapped memfd on the
//! host).

pub mod layout;
pub mod neighbour;
pub mod net;
pub mod wire;
