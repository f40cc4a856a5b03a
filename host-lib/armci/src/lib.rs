//! nicbar-armci: ARMCI, the one-sided communication library, over nicbar ports — put, get,
//! accumulate, read-modify-write, fences, barriers and mutexes on the NIC's RDMA and atomics.
//!
//! This crate stands on the nicbar user library (`host-lib`) and nothing else: each rank of a job
//! opens one port, registers its memory with it, and reaches its peers' memory through the NIC
//! with no help from their processes (ARMCI's "truly one-sided" progress rule: the NIC plays the
//! server thread ARMCI ran on GM). It offers a Rust API ([`Armci`]) and ARMCI's C API
//! (`libarmci`, the header `include/armci.h`), and Saify's three optimisations of ARMCI's
//! synchronisation (*Optimizing Collective Communication Operations in ARMCI*, M.S. thesis, The
//! Ohio State University, 2002) beside the baselines they replaced, chosen by [`Config`]:
//! - AllFence with K acknowledgement requests outstanding in a shuffled server order, against
//!   one request at a time ([`FenceMode`]; thesis ch. 3);
//! - the fused fence-and-barrier with per-pair operation counters, against AllFence followed by
//!   a barrier ([`BarrierMode`]; ch. 4);
//! - the MCS software queue lock on NIC swap and compare-and-swap, against the ticket lock
//!   ([`LockMode`]; ch. 5).
//!
//! # Modules
//!
//! - `launch`: a rank's place — rank and size from the launcher (`nicbar-armci-run` or
//!   `mpirun`), a free port, and the rendezvous through which the ranks learn each other's ports.
//! - `core`: the process — its port, peers, registered memory, the operations and messages in
//!   flight, and the one progress engine that files the port's events.
//! - `collective`, `sync`, `lock`, `ops`, `transfer` (strided, vector, non-blocking), `groups`
//!   (process groups and the `armci_msg_*` collectives): the calls, each over `core`.
//! - `ffi`: the C API, the crate's one module with `unsafe` code.
#![deny(unsafe_code)]

mod collective;
pub mod config;
mod core;
mod error;
pub mod ffi;
mod groups;
pub mod launch;
mod lock;
mod lock_state;
mod ops;
mod sync;
mod transfer;

pub use crate::config::{BarrierMode, Config, FenceMode, LockMode};
pub use crate::core::Armci;
pub use crate::error::ArmciError;
pub use crate::groups::{Elements, ReduceOp, WORLD_GROUP};
pub use crate::lock::Grant;
pub use crate::ops::{Rmw, Scale};
pub use crate::transfer::{Handle, MAX_STRIDE_LEVELS, Runs, Strides};
