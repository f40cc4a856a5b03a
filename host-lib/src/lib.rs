//! host-lib: the nicbar user library.
//!
//! A process opens a port ([`Port::open`]), allocates DMA buffers from the port's arena
//! ([`Port::dma_alloc`]), posts send and receive tokens into the port's memory-mapped rings
//! ([`Port::send`], [`Port::provide_receive_buffer`]) and takes events from its event ring
//! ([`Port::receive`], [`Port::blocking_receive`]) — no system call per message: the NIC's
//! doorbell is rung only when the NIC sleeps and asked for it, and a waiting process spins 20 µs
//! on its event ring, then sleeps on its own doorbell until an event comes ([`WaitMode`] chooses
//! otherwise).
//!
//! As in GM, the process holds send tokens (one per send ring slot; a SENT event returns one) and
//! receive tokens, and a buffer belongs to the NIC from the send or provide until the event that
//! ends its use: [`DmaBuffer`] is moved in and handed back in the [`Event`].
//!
//! Barriers run inside the NIC ([`barrier`], paper §5.2): GM's two calls
//! ([`Port::provide_barrier_buffer`], [`Port::barrier_send`]), a whole barrier over a [`Group`]
//! ([`Port::barrier`], or start/test/wait for a fuzzy barrier), and the host-based baseline that
//! runs the same schedule over messages ([`Port::host_barrier`]).
//!
//! # Layers
//!
//! Each module uses only those below it:
//!
//! - [`raw`]: the port at the level of its rings — open and close over the control socket, the
//!   mapped region, tokens posted as given (contexts and tags the caller's), raw events, waits.
//!   The C API (crate `nicbar-capi`) stands on it directly. Its `control` module is the one place
//!   that uses the daemon's code.
//! - [`dma`] (`raw::dma`): DMA buffers from a port's arena, the one module with `unsafe` code
//!   (the views of a buffer's bytes).
//! - `endpoint`: sends and receive buffers as [`DmaBuffer`]s the port holds while the NIC uses
//!   them, and raw events turned into [`Event`]s.
//! - `group` and `failure`: plain values — a barrier's members and options ([`Group`]), and how
//!   a barrier fails ([`BarrierError`]).
//! - [`Port`]: the endpoint with waiting, the events kept for later, and what the port keeps for
//!   barriers with the filter that takes barrier events out of its stream (`port::barriers`).
//! - [`barrier`]: the port's barrier calls — the NIC-based barrier and the host-based baseline.
//! - [`coll`]: collectives over a port — barriers queued for the NIC, and broadcast, scatter,
//!   gather and all-to-all over messages (CollGM's algorithms, transfers eager or by rendezvous).
#![deny(unsafe_code)]

mod arena;
pub mod barrier;
pub mod coll;
mod endpoint;
mod error;
mod event;
mod failure;
pub mod fastpath;
mod group;
mod port;
pub mod raw;
pub mod tuning;

pub use raw::dma;

pub use barrier::{
    BarrierError, BarrierNumbering, BarrierOptions, DEFAULT_HOST_TIMEOUT, FailureReason, Group,
    GroupError, HOST_BARRIER_PRIORITY, HOST_BARRIER_SIZE, HOST_RETRY_INTERVAL, JOB_ENV,
    PendingBarrier, PersistentCollective,
};
pub use dma::{BufferError, DmaBuffer};
pub use error::Error;
pub use event::{BroadcastData, Event};

/// The most bytes [`Port::nic_broadcast`] carries: what the NIC's completion event holds inline.
pub const NIC_BROADCAST_MAX: usize = shared_abi::packet::BROADCAST_MAX;
pub use fastpath::{FastPath, FastPathConfig, LockMode, Message, PeerId, Route};
pub use nicbar_schedule::{Algorithm, Member, ScheduleError};
pub use port::Port;
pub use port::memory::MemoryRegion;
pub use raw::memory::SharedBytes;
pub use raw::{PortCounters, RawEvent, RawPort, WaitMode};
pub use shared_abi::event::Status;
pub use shared_abi::ids::{BarrierId, NodeId, PortId};
pub use shared_abi::rdma::{AtomicOp, RemotePointer};
pub use shared_abi::reduce::{REDUCE_MAX as NIC_REDUCE_MAX, ReduceOp, ReduceSpec, ReduceType};
pub use shared_abi::schedule::{Step, StepOp};
pub use shared_abi::token::Priority;
pub use shared_abi::{max_length_for_size, min_size_for_length};
