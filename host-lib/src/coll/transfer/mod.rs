//! The NIC level of the collectives (CollGM §3.2, its "GM level"): reliable transfers of any
//! length between the members of a group over nicbar messages, keyed by (communicator, operation,
//! part) and the sending port, and arrivals saved until they are wanted.
//!
//! A message is sent in segments of up to 64 KiB (less a header), each one NIC message, which
//! the NIC cuts into packets itself; [`segments`] alone cuts them. Every segment carries a small
//! header (the key, its offset and the message's total length), so the receiver assembles a
//! message whatever order its segments come in — a segment the NIC gave up on (after the
//! receiver-not-ready time, or the give-up time of a NIC that answered nothing) is sent again,
//! until the retry window closes, and may then arrive after the ones behind it.
//!
//! The port keeps [`RECEIVE_BUFFERS`] buffers provided at all times: each arrival is copied out
//! and its buffer provided again at once, so a sender waits only while its receiver is outside
//! the library. Arrivals nobody asked for yet wait in memory (the unexpected-event saving of
//! CollGM §3.2); a malformed or duplicated segment is dropped and counted, never trusted.
//!
//! A message of [`RENDEZVOUS_THRESHOLD`] bytes or more goes by rendezvous (CollGM §3.3) instead:
//!
//! 1. the sender sends a ready-to-send naming the message (key, length, the sender's id for it);
//! 2. the receiver answers at once, whatever it is doing in the library — wanted or not yet —
//!    with a clear-to-send naming a registered landing region of its own (a remote pointer) big
//!    enough, or with a refusal if it cannot register memory (the sender then sends eagerly);
//! 3. the sender puts the message into the landing region from a registered region of its own,
//!    [`PUT_CHUNK`] bytes per put, [`PUTS_IN_FLIGHT`] puts at once (a message staged by
//!    [`Transfers::stage`] is there already, once for all its receivers; other bytes are copied
//!    into a region now);
//! 4. when every put has completed at the target (its `OperationDone`: the bytes are in the
//!    receiver's memory), the sender sends a small "done"; the message has arrived, and stays
//!    where it landed until the caller takes it ([`Transfers::take_into`] copies it once, into
//!    the caller's buffer).
//!
//! A receiver that waits for a message before its ready-to-send came, and knows its length (as
//! every collective's receive does: [`Transfers::offer`]), does not wait to be asked: it sends
//! an *offer* at once, naming a landing region of that length. A sender that holds the offer
//! when it sends puts the message there with no ready-to-send — one round trip fewer in every
//! step whose receiver is first, and on a host with more processes than cores each leg of that
//! trip waits for a process to be scheduled. The two may cross: a ready-to-send of the offered
//! length that meets the offer is answered by it (the sender takes an offer as a clear-to-send),
//! one of another length voids it and is answered as ever, and an offer whose message comes
//! eagerly gives its region back when the message is whole. An offer is taken only from the
//! receiver it names, so a third port's offers change nothing.
//!
//! A rank that passes a message on (the inner ranks of a broadcast tree) can ask for it to be
//! *forwarded* ([`Transfers::forward`], CollGM §3.3's message forwarding): each eager segment of
//! it, as it arrives, goes on to the next ranks from the receive buffer it arrived in — the NIC
//! sends that very buffer to the first of them (a spare send buffer takes its place among the
//! provided ones), and a copy of it to the others — while it is also copied out for the caller.
//! The segment is on its way down the tree before the message is whole, and no copy is made
//! into a send buffer for the first child. A message that comes by rendezvous is passed on once
//! it is whole, put from the region it landed in.
//!
//! Data nobody asked for yet is bounded: what an endpoint holds of messages it has not asked
//! for (being assembled, arrived, or landing regions registered for them) stays under a limit
//! ([`UNEXPECTED_LIMIT`], `NICBAR_COLL_UNEXPECTED_BYTES`), each message counted as at least 4
//! KiB. Past it, a ready-to-send waits unanswered until there is room or the message is
//! asked for, and an eager message is dropped and remembered: asking for it then fails, naming
//! its sender and the limit. A message asked for is always taken. So a member that sends
//! garbage lengths cannot make another register or allocate gigabytes.
//!
//! Answering at once means a rendezvous needs no order among the ranks' receives: a collective
//! whose ranks wait for each other in any order still moves. Landing and source regions come
//! from one pool per endpoint (`pool`): registering is a round trip to the NIC and the
//! kernel, so a region is registered once and reused by later transfers of its size or less,
//! and only a few are kept when idle. A region is lent to the messages that use it and comes
//! back when the last lets go. The "done" waits for the puts' remote completion rather
//! than riding the connection's ordering behind them, so a put the NIC refused (a closed port, a
//! bad key) fails the send instead of handing the receiver bytes that never came.
//!
//! # Files
//!
//! `wire` (the bytes of segments and control messages), `pool` (registered regions),
//! `payload` (a message's bytes: owned, staged or landed in a region),
//! `records` (what is kept of each message), `transfers` (the state and its setup), `send`,
//! `arrive` and `post` (the three directions work moves in), `error` and `counters`.

mod arrive;
mod counters;
mod error;
mod payload;
mod pool;
mod post;
mod records;
mod send;
mod transfers;
mod wire;

pub use counters::TransferCounters;
pub use error::TransferError;
pub use payload::Payload;
pub use records::SendId;
pub use transfers::Transfers;
pub use wire::{
    BUFFER_LEN, FAILED_PART, HEADER_LEN, Key, PACKET_PAYLOAD, PROBE_PART, RECEIVE_TAG,
    SEGMENT_PAYLOAD, SIZE_CLASS, segments,
};

/// Receive buffers kept provided (the NIC holds 64 per port; the rest is the barriers' room).
pub const RECEIVE_BUFFERS: usize = 48;
/// Send buffers, so segments in the NIC at once (the NIC takes 32 sends per port).
pub const SEND_BUFFERS: usize = 24;
/// Messages of this many bytes or more go by rendezvous (RDMA put into the receiver's
/// registered memory); shorter ones eagerly, in segments. CollGM's rendezvous takes over at
/// 64 KiB, where GM's copies through receive buffers start to cost more than the handshake's two
/// extra messages, and so does this one since the NIC's puts read and write the ports' arenas
/// through its own mapping: from 64 KiB the rendezvous measured faster than eager even with four
/// processes a core (docs/mpi.md, "Rendezvous"). `NICBAR_COLL_RENDEZVOUS` (a byte count, or
/// `off`) changes it per process; the ranks need not agree, since each message's sender chooses
/// and a receiver takes either.
pub const RENDEZVOUS_THRESHOLD: usize = 64 * 1024;
/// Bytes each put of a rendezvous carries (the NIC cuts it into packets). A put that completes
/// brings the sender back to post the next, which on a host with more processes than cores
/// waits for the sender to be scheduled: 1 MiB puts took 0.86–0.99× the time of 64 KiB ones
/// for an allreduce of 1 to 16 MiB at 8 processes on 2 cores (docs/mpi.md, "Rendezvous").
pub const PUT_CHUNK: usize = 1024 * 1024;
/// Puts of one rendezvous in the NIC at once: enough to keep the wire busy while completions
/// come back, few enough to leave the port's send tokens to the eager segments.
pub const PUTS_IN_FLIGHT: usize = 4;
/// Bytes of messages not asked for yet an endpoint holds at most (`NICBAR_COLL_UNEXPECTED_BYTES`
/// changes it per process).
pub const UNEXPECTED_LIMIT: usize = 1 << 30;
/// Messages refused for the limit that are remembered (and ready-to-sends kept waiting for room);
/// past this many, they are dropped unremembered.
pub(super) const REFUSED_KEEP: usize = 4096;
