//! The transfers of one port: what they hold, and the calls that set them up and say how they
//! stand.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use shared_abi::ring::Wake;

use crate::{DmaBuffer, Error, Member, Port, Priority};

use super::counters::TransferCounters;
use super::payload::Arrived;
use super::pool::{Lent, RegionPool};
use super::records::{Assembly, InFlight, Landing, Outgoing, PutFlight, SendId, SendRecord};
use super::wire::{BUFFER_LEN, Control, Key, RECEIVE_TAG, SIZE_CLASS};
use super::{RECEIVE_BUFFERS, RENDEZVOUS_THRESHOLD, SEND_BUFFERS, UNEXPECTED_LIMIT};

/// The transfers of one port (the module's documentation says how they go).
///
/// The caller hands each of the port's events to [`Transfers::handle`] (which gives back those
/// that are not the transfers') and calls [`Transfers::post`] after, so that what waits goes out;
/// [`super::super::Endpoint::pump_transfers`] does both. Messages go out by
/// [`Transfers::send`] and [`Transfers::forward`], and come in by [`Transfers::want`] and
/// [`Transfers::take`].
pub struct Transfers {
    pub(super) spare: Vec<DmaBuffer>,
    pub(super) outgoing: VecDeque<Outgoing>,
    pub(super) resend: VecDeque<(DmaBuffer, u64)>,
    pub(super) in_flight: HashMap<u64, InFlight>,
    pub(super) sends: HashMap<SendId, SendRecord>,
    pub(super) assembling: HashMap<(Member, Key), Assembly>,
    pub(super) arrived: HashMap<(Member, Key), Arrived>,
    pub(super) provided: usize,
    pub(super) next_id: u64,
    pub(super) next_context: u64,
    /// How long a segment whose receiver takes nothing is sent again before the send fails.
    pub(super) retry_window: Duration,
    /// When each message's first give-up happened, for the retry window.
    pub(super) first_give_up: HashMap<SendId, Instant>,
    pub(super) counters: TransferCounters,
    /// Messages this long or longer go by rendezvous.
    pub(super) threshold: usize,
    /// Registered regions for rendezvous.
    pub(super) pool: RegionPool,
    /// Puts in the NIC, by context.
    pub(super) puts: HashMap<u64, PutFlight>,
    /// Source regions of sends forgotten while puts from them were in the NIC: let go when the
    /// last of those puts ends.
    pub(super) draining: HashMap<SendId, (Lent, usize)>,
    /// Rendezvous this endpoint answered, by sender and key.
    pub(super) landing: HashMap<(Member, Key), Landing>,
    /// Messages forwarded as they arrive, by sender and key: where each goes on to, a send (its
    /// record) per rank.
    pub(super) forwards: HashMap<(Member, Key), Vec<(Member, SendId)>>,
    /// Segments to forward that found no spare send buffer: (send, rank, the packet's bytes).
    pub(super) forward_backlog: VecDeque<(SendId, Member, Box<[u8]>)>,
    /// Receive buffers sent on by forwarding whose place among the provided ones no spare send
    /// buffer has taken yet.
    pub(super) lent: usize,
    /// The most bytes of messages not asked for yet that are held.
    pub(super) unexpected_limit: usize,
    /// Bytes held of messages not asked for yet (the sum of `charged`).
    pub(super) unexpected: usize,
    /// What each message held that was not asked for when it came counts against the limit.
    pub(super) charged: HashMap<(Member, Key), usize>,
    /// The message the caller waits for now.
    pub(super) wanted: Option<(Member, Key)>,
    /// Eager messages dropped for the limit, with their lengths.
    pub(super) over_limit: HashMap<(Member, Key), usize>,
    /// Ready-to-sends waiting for room under the limit, in arrival order.
    pub(super) deferred: VecDeque<(Member, Control)>,
    /// Landing regions receivers offered for messages not sent yet, by receiver and key: the
    /// remote pointer and the length offered.
    pub(super) offers: HashMap<(Member, Key), (u64, usize)>,
    /// Sends that found their receiver's offer: their puts start at the next post (id, remote
    /// pointer).
    pub(super) offered_sends: Vec<(SendId, u64)>,
    /// Operations a member said it failed, by (context, sequence, member): the rank it named
    /// (at most [`REFUSED_KEEP`] kept). Kept per sender too, so that a notice from a port
    /// outside the group cannot stand in for a member's.
    pub(super) failed: HashMap<(u32, u32, Member), u64>,
}

impl Transfers {
    /// The transfers of `port`: its send buffers allocated and its receive buffers provided.
    ///
    /// # Errors
    /// What the port says when the arena has no room or a provide is refused.
    pub fn new(port: &mut Port, retry_window: Duration) -> Result<Self, Error> {
        let mut transfers = Self::empty(retry_window);
        // Peers put into this port's landing regions. (Without it their puts are refused and the
        // sends fail; a port that cannot register memory refuses rendezvous instead.)
        port.allow_remote_memory_access()?;
        for _ in 0..SEND_BUFFERS {
            transfers.spare.push(port.dma_alloc(BUFFER_LEN)?);
        }
        for _ in 0..RECEIVE_BUFFERS {
            let buffer = port.dma_alloc(BUFFER_LEN)?;
            transfers.provide(port, buffer)?;
        }
        Ok(transfers)
    }

    /// Transfers with no buffers yet.
    pub(super) fn empty(retry_window: Duration) -> Self {
        Self {
            spare: Vec::with_capacity(SEND_BUFFERS),
            outgoing: VecDeque::new(),
            resend: VecDeque::new(),
            in_flight: HashMap::new(),
            sends: HashMap::new(),
            assembling: HashMap::new(),
            arrived: HashMap::new(),
            provided: 0,
            next_id: 1,
            next_context: 1,
            retry_window,
            first_give_up: HashMap::new(),
            counters: TransferCounters::default(),
            threshold: RENDEZVOUS_THRESHOLD,
            pool: RegionPool::default(),
            puts: HashMap::new(),
            draining: HashMap::new(),
            landing: HashMap::new(),
            offers: HashMap::new(),
            offered_sends: Vec::new(),
            forwards: HashMap::new(),
            forward_backlog: VecDeque::new(),
            lent: 0,
            unexpected_limit: UNEXPECTED_LIMIT,
            unexpected: 0,
            charged: HashMap::new(),
            wanted: None,
            over_limit: HashMap::new(),
            deferred: VecDeque::new(),
            failed: HashMap::new(),
        }
    }

    /// Holds at most `limit` bytes of messages not asked for yet from now on.
    pub fn set_unexpected_limit(&mut self, limit: usize) {
        self.unexpected_limit = limit;
    }

    /// Messages of `threshold` bytes or more go by rendezvous from now on (`usize::MAX`: none).
    pub fn set_rendezvous_threshold(&mut self, threshold: usize) {
        self.threshold = threshold;
    }

    /// Whether a message of `length` bytes goes by rendezvous.
    pub fn by_rendezvous(&self, length: usize) -> bool {
        length >= self.threshold && length as u64 <= shared_abi::rdma::MAX_RDMA_LENGTH
    }

    /// What the transfers did so far.
    pub fn counters(&self) -> TransferCounters {
        TransferCounters {
            regions_registered: self.pool.registered,
            ..self.counters
        }
    }

    /// Whether anything waits to go out (puts in the NIC included: their ends are awaited).
    pub fn has_outgoing(&self) -> bool {
        !self.outgoing.is_empty()
            || !self.resend.is_empty()
            || !self.puts.is_empty()
            || !self.forward_backlog.is_empty()
    }

    /// What a process asleep on the port for these transfers must be woken for: every event
    /// while anything waits to go out (a send's end frees the buffer or token it waits for, or
    /// is a put's end) or receive buffers are lent to forwarding (a send's end gives one back),
    /// else every event but sends' ends, which it takes when it wakes for anything else.
    pub fn wake(&self) -> Wake {
        if self.has_outgoing() || self.lent > 0 {
            Wake::ANY
        } else {
            Wake::UNLESS_SENT
        }
    }

    /// Provides spare send buffers in the place of receive buffers forwarding sent on.
    pub(super) fn replenish(&mut self, port: &mut Port) {
        while self.lent > 0 {
            let Some(buffer) = self.spare.pop() else {
                return;
            };
            self.lent -= 1;
            let _ = self.provide(port, buffer);
        }
    }

    pub(super) fn provide(&mut self, port: &mut Port, buffer: DmaBuffer) -> Result<(), Error> {
        port.provide_receive_buffer(buffer, SIZE_CLASS, Priority::LOW, RECEIVE_TAG)
            .map_err(|refused| refused.error)?;
        self.provided += 1;
        Ok(())
    }

    pub(super) fn new_context(&mut self) -> u64 {
        let context = self.next_context;
        self.next_context += 1;
        context
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_picks_the_protocol() {
        let mut transfers = Transfers::empty(Duration::from_secs(1));
        assert!(!transfers.by_rendezvous(0));
        assert!(!transfers.by_rendezvous(RENDEZVOUS_THRESHOLD - 1));
        assert!(transfers.by_rendezvous(RENDEZVOUS_THRESHOLD));
        assert!(transfers.by_rendezvous(16 << 20));
        // Longer than one put can address: eagerly.
        assert!(!transfers.by_rendezvous(shared_abi::rdma::MAX_RDMA_LENGTH as usize + 1));
        transfers.set_rendezvous_threshold(usize::MAX);
        assert!(!transfers.by_rendezvous(16 << 20));
        transfers.set_rendezvous_threshold(100);
        assert!(!transfers.by_rendezvous(99));
        assert!(transfers.by_rendezvous(100));
    }
}
