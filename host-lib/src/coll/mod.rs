//! Collectives over one port per process, as CollGM splits them (Hoefler et al., *CollGM*, a
//! Myrinet/GM optimized collective component for Open MPI): barriers and a short broadcast run
//! in the NIC, and broadcast, scatter, gather and all-to-all over messages, each in the
//! algorithms CollGM measured and chosen by communicator and message size.
//!
//! ```no_run
//! use nicbar::coll::{Bcast, DEFAULT_SEGMENT, Endpoint, Op, bcast};
//! use nicbar::{Group, Member, NodeId, Port, PortId};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut endpoint = Endpoint::new(Port::open(0, 1)?)?;
//! let members: Vec<Member> = (0..4).map(|n| Member::new(NodeId::new(n), PortId(1))).collect();
//! let group = Group::new(members.iter().copied())?;
//! // Every rank makes the same calls with the same context and sequence numbers.
//! let mut bytes = vec![0u8; 100_000];
//! let op = Op::new(&mut endpoint, &members, 5, 1)?.with_group(&group);
//! bcast(op, &mut bytes, 0, Bcast::Binomial, DEFAULT_SEGMENT)?;
//! let ticket = endpoint.barrier_start(&group);
//! # let _ = ticket;
//! # Ok(())
//! # }
//! ```
//!
//! # Layers
//!
//! Each module uses only those below it:
//!
//! - [`transfer`]: the NIC level (CollGM's "GM level") — reliable transfers of any length keyed
//!   by (communicator, operation, part) and sender: eager segments, rendezvous by RDMA put,
//!   forwarding from receive buffers, arrivals saved until wanted.
//! - `endpoint` ([`Endpoint`]): the port, its queue of barriers for the NIC (one runs at a
//!   time per port), and its transfers; `open` ([`open_port`]): the first free port of a NIC.
//! - `op` ([`Op`]): one collective operation's sends and receives with the wait between them.
//! - `pieces`: a long message as pieces of 256 KiB, each a message of its own, that a receiver
//!   passes on or copies out while the next lands (the long broadcasts and scatters).
//! - `algorithm` ([`Bcast`], [`Tree`], [`Alltoall`], [`Allreduce`]): the algorithms' names and the defaults
//!   without a map; [`map`]: the measured selection map (`cargo xtask tune`) that names them;
//!   [`select`]: the choice — the map's entry, else the default.
//! - the collectives over contiguous bytes: [`bcast`]; [`scatter`], [`gather`], [`scatterv`],
//!   [`gatherv`]; [`alltoall`], [`alltoallv`] (on the shapes of `topology`); [`allreduce`]
//!   with the caller's operation, and [`allreduce_start`], the same in the background (the
//!   endpoint keeps it, a [`Background`], and every wait on it moves it on). Packing other
//!   datatypes is the caller's.
//!
//! Every rank of a communicator calls the same operations in the same order with matching
//! lengths, as MPI requires; a rank whose lengths differ gets [`CollError::Length`], and a
//! rank that stops answering [`CollError::Timeout`] naming it.

mod algorithm;
mod allreduce;
mod alltoall;
mod bcast;
mod endpoint;
mod error;
pub mod map;
mod op;
mod open;
mod pieces;
mod scatter_gather;
pub mod select;
mod topology;
pub mod transfer;

pub use algorithm::{Allreduce, Alltoall, Bcast, Choice, Collective, Tree};
pub use allreduce::{Combine, allreduce, allreduce_start};
pub use alltoall::{alltoall, alltoallv};
pub use bcast::bcast;
pub use endpoint::{Background, BackgroundEnd, DEFAULT_TIMEOUT, Endpoint, Outcome};
pub use error::CollError;
pub use op::Op;
pub use open::{OpenError, Unit, open_port};
pub use scatter_gather::{gather, gatherv, scatter, scatterv};
pub use transfer::{TransferCounters, TransferError};

/// Bytes per segment of the segmented broadcasts (binary, split-binary, pipeline) when the
/// caller has no preference.
pub const DEFAULT_SEGMENT: usize = 32 * 1024;
