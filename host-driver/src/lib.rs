//! host-driver: `nicctl`, the nicbar driver's command-line tool.
//!
//! This is the tools row of the host side: it parses command lines, draws progress bars and
//! prints JSON, and stands on the crates that do the work — the NIC backends (`nicbar-emulator`,
//! `nicbar-qemu`), the control protocol (`nicbar-control`, for `nicctl status`) and the image
//! tools (`nicbar-image`). None of those knows about a command line.
#![forbid(unsafe_code)]

pub mod cli;
