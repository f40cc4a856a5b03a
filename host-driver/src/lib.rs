//! host-driver: device access for nicbar: opening ports, loading and flashing firmware; the
//! emulated NIC and the deterministic simulator live here.
//!
//! This is the host side under the user library (`host-lib`): the part that knows where a NIC is
//! and how to put firmware on it. [`image`] reads and verifies firmware image files (the layout
//! is [`shared_abi::image`]); [`flash`] writes a verified image to a flash device and reads it
//! back; [`cli`] implements the subcommands of the `nicctl` tool on top of them.
//!
//! The backends that stand in for NIC hardware live here too: the deterministic simulator
//! ([`sim`]), which runs many copies of the real firmware core in one process over a simulated
//! wire in virtual time, the emulated NIC (a daemon serving real processes over a real wire), and
//! QEMU NICs ([`qemu`]: the flashed firmware image running as the NIC core under QEMU).
//! Each module owns one backend or one tool; they share only the firmware core and the ABI.
#![deny(unsafe_code)]

pub mod cli;
pub mod emulator;
pub mod flash;
pub mod image;
pub mod qemu;
pub mod sim;
