//! nicbar-image: firmware image files and the flash devices they are written to.
//!
//! [`image`] reads and verifies image files (the layout is [`shared_abi::image`]); [`flash`]
//! writes a verified image to a flash device and reads it back. `nicctl image`, `nicctl flash`,
//! the QEMU NICs (which boot from a flashed device) and `cargo xtask image` stand on it. Progress
//! is reported through [`flash::Progress`]; drawing it is the caller's business.
#![forbid(unsafe_code)]

pub mod flash;
pub mod image;
