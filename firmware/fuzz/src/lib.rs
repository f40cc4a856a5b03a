//! The bodies of nicbar's fuzz targets, as plain functions.
//!
//! Each `fuzz_targets/NAME.rs` calls the function of the same name here, and `tests/corpus.rs`
//! replays every input of `corpus/NAME/` through it as an ordinary test (on a stable toolchain,
//! without the fuzzing engine), so what the fuzzer once found stays checked.
//!
//! A function returns normally for every input the code under test handles; it panics where a
//! parser or the firmware panicked, or where one of the properties it asserts fails (a checked
//! packet re-emits to the same bytes, a parsed region layout lies inside the region, the firmware
//! transmits only well-formed packets from its own node and writes only known events).
#![forbid(unsafe_code)]

mod hal;
mod nic;
mod parsers;

pub use nic::{nic_packets, nic_sequence};
pub use parsers::{image, packet, region};

/// A target's body: runs one input, panics on a failure.
pub type Body = fn(&[u8]);

/// Every target: its name (the binary's and the corpus directory's) and its body.
pub const TARGETS: &[(&str, Body)] = &[
    ("packet", packet),
    ("image", image),
    ("region", region),
    ("nic_packets", nic_packets),
    ("nic_sequence", nic_sequence),
];
