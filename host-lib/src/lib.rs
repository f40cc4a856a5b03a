//! host-lib: the nicbar user library.
//!
//! A process opens a port ([`Port::open`]), allocates DMA buffers from the port's arena
//! ([`Port::dma_alloc`]), posts send and receive tokens into the port's memory-mapped rings
//! ([`Port::send`], [`Port::provide_receive_buffer`]) and takes events from its event ring
//! ([`Port::receive`], [`Port::blocking_receive`]) — no system call per message: the NIC's
//! doorbell is rung only when the NIC sleeps and asked for it, and a waiting process sleeps on its
//! own doorbell only when its event ring is empty (or spins, by [`WaitMode`]).
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
//! The library stands on the ABI (`shared_abi`), the schedule compiler (`nicbar_schedule`) and the
//! control protocol (`nicbar_control`) alone — never on a NIC backend, the firmware or the
//! driver's tools: a port looks the same whichever backend serves it (`nicctl emulate`, QEMU
//! NICs). `unsafe` code lives in one module, [`dma`]'s views of buffer bytes; the mapping itself
//! is the control protocol's.
#![deny(unsafe_code)]

pub mod barrier;
pub mod capi;
pub mod dma;
mod error;
mod event;
mod port;

pub use barrier::{
    BarrierError, BarrierOptions, DEFAULT_HOST_TIMEOUT, FailureReason, Group, GroupError,
    HOST_BARRIER_PRIORITY, HOST_BARRIER_SIZE, HOST_RETRY_INTERVAL, PendingBarrier,
};
pub use dma::DmaBuffer;
pub use error::{BufferError, Error};
pub use event::Event;
pub use nicbar_schedule::{Algorithm, Member, ScheduleError};
pub use port::{Port, PortCounters, WaitMode};
pub use shared_abi::event::Status;
pub use shared_abi::ids::{NodeId, PortId};
pub use shared_abi::schedule::{Step, StepOp};
pub use shared_abi::token::Priority;
pub use shared_abi::{max_length_for_size, min_size_for_length};
