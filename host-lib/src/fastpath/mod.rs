//! MVAPICH's RDMA-write eager fast path (Liu, Wu, Kini, Wyckoff, Panda, *High Performance
//! RDMA-Based MPI Implementation over InfiniBand*), over the port's puts, beside the ordinary
//! send/receive path it falls back to; and remote locks on the peers' memory (`lock`): truly
//! passive ones on NIC atomics, and the baseline the target's process serves.
//!
//! # The fast path
//!
//! Each receiver keeps, for each peer in its **polling set**, a persistent ring of fixed-size
//! slots in memory registered with its port. The sender keeps the mirror image: a staging ring
//! of the same slots in its own registered memory. Sending a small message is one put: the sender
//! fills staging slot `n % slots` and puts it into the receiver's slot `n % slots`. The receiver
//! learns of it by polling its memory — no event, no receive buffer, no NIC-to-host message
//! descriptor. A slot holds:
//!
//! ```text
//!  0  ring sequence (head flag)   u64   the slot's number on this ring, from 1; never repeats
//!  8  message sequence            u64   the pair's message number over both paths, from 1
//! 16  length                      u32
//! 20  checksum                    u32   over message sequence, length and payload (`layout`)
//! 24  acknowledgement             u64   slots the sender consumed of the reverse ring (credits)
//! 32  payload                     length bytes, padded to 8
//!  .  ring sequence (tail flag)   u64   the same number again, right after the payload
//! ```
//!
//! The receiver checks the head flag of its next slot against the ring sequence it expects; a
//! stale slot holds the number of a lap before, which is never the expected one, so no flag ever
//! needs clearing. It then reads the length, finds the tail flag right after the payload, and
//! waits for it to hold the same number. **Ordering:** the NIC applies a put's segments in
//! order, and writes each segment's bytes front to back (the emulated NIC: one
//! `process_vm_writev` per segment), so the tail flag, at the highest address the put writes, is
//! the last of its bytes to land — the same assumption MVAPICH makes of the HCA's DMA order. The
//! checksum guards the one place the assumption is weakest (a CPU may make the stores of one
//! string copy visible out of order): a slot whose tail flag holds but whose checksum does not is
//! read again until it does, and reported as corrupt if it never does.
//!
//! **Flow control:** a sender may have at most `slots` messages on a ring that the receiver has
//! not consumed. The receiver hands back credits by piggybacking its consumed count of the
//! reverse ring on every fast-path message it sends, and, when half a ring is consumed and
//! unreported, by a one-byte put of that count (modulo 256, which is unambiguous since a ring has
//! at most 128 slots) into a credit byte in the sender's registered memory. A byte cannot be
//! torn, so the sender reads it at any time; only one credit put per peer is in flight at once.
//!
//! **Fallback and order:** a message longer than the receiver's slots, one to a peer that has no
//! room left on its ring, and one to a peer outside the receiver's polling set, goes the ordinary
//! way: a message into a receive buffer the library keeps provided, tagged with the same
//! per-pair message sequence. The receiver delivers each pair's messages strictly by that
//! sequence, from whichever path holds the next one; a message that arrives ahead of its turn
//! waits in a small per-peer stash. So messages of one pair arrive in the order they were sent,
//! whichever path each took.
//!
//! **Polling set:** the receiver polls the rings of at most `polling_set` peers (MVAPICH bounds
//! it so that polling time does not grow with the number of connections): the first peers it
//! connects to. Peers beyond it get no ring, and their senders use the ordinary path.
//!
//! **Connection setup:** [`FastPath::connect`] registers the ring (and the credit byte) for the
//! peer and sends a hello over the ordinary path: the region's key, the ring's place and shape,
//! and the key of this process's lock region. A hello sent before the peer opened its port is
//! sent again. A hello whose numbers do not fit is refused (counted in [`Stats::rejected`]).

mod config;
mod connect;
mod context;
mod credit;
mod fast_path;
mod layout;
mod lock;
mod message;
mod peer;
mod progress;
mod receive;
mod remote_memory;
mod send;
mod stats;

pub use config::FastPathConfig;
pub use fast_path::FastPath;
pub use layout::{MAX_MESSAGE, MAX_SLOTS, SLOT_OVERHEAD};
pub use lock::LockMode;
pub use message::{Message, PeerId, Route};
pub use stats::Stats;
