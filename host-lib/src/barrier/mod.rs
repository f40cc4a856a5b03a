//! Barriers: the NIC-based barrier at GM's level and at a group's, and the host-based baseline
//! that runs the very same schedule over ordinary messages.
//!
//! # Three levels
//!
//! - **GM's calls** (paper §5.2), which the C API wraps one to one:
//!   [`crate::Port::provide_barrier_buffer`] hands the NIC the receive token one barrier's end needs, and
//!   [`crate::Port::barrier_send`] writes a compiled schedule into the arena and posts the barrier send
//!   token. The end comes out of [`crate::Port::receive`] as [`crate::Event::BarrierCompleted`] or
//!   [`crate::Event::BarrierFailed`]. One barrier runs at a time per port; the NIC refuses a second
//!   one with `BARRIER_BUSY`.
//! - **Groups**: a [`Group`] lists its members (ports of NICs) by rank; [`crate::Port::barrier`] finds
//!   this port's rank in it, compiles the group's algorithm for that rank, and waits for the end.
//!   [`crate::Port::barrier_start`] / [`crate::Port::barrier_test`] / [`crate::Port::barrier_wait`] are the fuzzy
//!   barrier (Gupta, paper §1): start, compute, then test or wait. Events that arrive meanwhile
//!   are kept, in order, for the next [`crate::Port::receive`].
//!   [`crate::Port::persistent_barrier`] and [`crate::Port::persistent_allreduce`] compile a
//!   group's schedule once ([`PersistentCollective`], MPI's persistent collectives);
//!   [`crate::Port::persistent_start`] then starts it with one send token.
//! - **The host-based baseline**: [`crate::Port::host_barrier`] runs the schedule the NIC would run on
//!   the host instead, over small messages between the ports, so that NIC-based against
//!   host-based is the comparison of the paper's §6 with everything else equal.
//!
//! # The host-based barrier's messages
//!
//! A message says "round `r` of the sender's barrier"; the receiver counts them per (sender,
//! round), with room for the next barrier's as the NIC's unexpected-barrier record has (a peer is
//! at most one barrier ahead of any member it shares a barrier with). They travel as data messages
//! of size class [`HOST_BARRIER_SIZE`] and priority [`HOST_BARRIER_PRIORITY`], which are
//! **reserved** on ports that run host-based barriers: the port keeps receive buffers of that class
//! provided from its first host-based barrier on, and re-provides each as soon as its message is
//! counted (in any call that takes events: [`crate::Port::receive`] too). Do not provide buffers of that
//! class and priority yourself, and do not send such messages to those ports: a message of yours
//! that lands in one of the barrier's buffers is handed to you as an ordinary
//! [`crate::Event::Received`], but one of the barrier's messages landing in your buffer stalls a barrier
//! until its timeout.
//!
//! A send refused because the target port is not open (yet) or had no buffer is sent again every
//! [`HOST_RETRY_INTERVAL`] until the barrier's deadline, as the NIC does for barrier packets
//! (paper §3.2).
//!
//! # Modules
//!
//! Who takes part and how ([`Group`], [`BarrierOptions`]) and how a barrier fails
//! ([`BarrierError`]) are plain values below the port; the state the port keeps for barriers, and
//! the filter that takes barrier events out of its stream, are the port's (`port::barriers`); the
//! port's barrier calls are here: `nic` (the NIC-based barrier), `persistent` (its schedules
//! compiled once and started many times) and `host` (the host-based baseline).

mod host;
mod nic;
mod persistent;

pub use crate::failure::{BarrierError, FailureReason};
pub use crate::group::{BarrierNumbering, BarrierOptions, Group, GroupError, JOB_ENV};
pub use crate::port::barriers::{
    DEFAULT_HOST_TIMEOUT, HOST_BARRIER_PRIORITY, HOST_BARRIER_SIZE, HOST_RETRY_INTERVAL,
};
pub use nic::PendingBarrier;
pub use persistent::PersistentCollective;
