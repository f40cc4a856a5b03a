//! nicbar-control: the control protocol between a process and the NIC backend that serves it.
//!
//! This crate stands in the shared row of the layers: the user library is its client, and every
//! NIC backend (the emulator, QEMU NICs) serves it; it knows no firmware and no backend. A process
//! connects to the backend's Unix socket ([`socket_path`]), sends a [`Request`] and reads a
//! [`Reply`] ([`call`]); opening a port passes the port's region and two doorbells back as
//! descriptors, which the process maps ([`Mapping`]) and rings ([`doorbell`]). From then on the
//! process and the NIC talk through the mapping alone.
//!
//! - [`message`]: what is asked and answered; [`codec`]: its bytes; [`frame`]: how it travels.
//! - [`naming`]: the host names and unique ids of the fabric's nodes, the same rule for every
//!   backend.
//! - [`server`]: the one server every backend runs, over a [`server::PortBackend`].
//! - [`sys`] (mapping a region, adopting passed descriptors) is the crate's one `unsafe` module.
#![deny(unsafe_code)]

mod client;
pub mod codec;
pub mod doorbell;
pub mod frame;
pub mod message;
pub mod naming;
mod path;
pub mod process_memory;
pub mod server;
pub mod sys;

pub use client::{ConnectError, connect, query_status};
pub use frame::{MAX_FRAME, PROTOCOL_VERSION, call};
pub use message::{
    BarrierReport, ConnectionReport, ControlError, NicReport, NodeName, OpenedPort, PortReport,
    Reply, Request, StatusReport, UnitStatus, WireCounters,
};
pub use path::{
    ListenError, SOCKET_ENV, default_socket_path, listen, share_with_group, socket_path,
};
pub use sys::Mapping;
