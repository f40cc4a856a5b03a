//! Sessions: every connection over an authenticated fabric runs inside a session bound to both
//! NICs' current incarnations, so that traffic recorded before either NIC restarted, gave up on the
//! other, or recycled the connection can never be taken again.
//!
//! Each NIC draws a fresh nonce for every session it offers ([`crate::auth::FabricKey::nonce`],
//! from the board's boot entropy and a counter). The handshake is three HELLO packets under the
//! fabric key ([`shared_abi::packet::HelloPayload`]): an offer `(a, 0)`, an answer `(b, a)` that
//! shows the answerer saw `a`, and a confirmation `(a, b)` that shows the opener saw `b`. Each side
//! establishes the session `(a, b)` when the other shows it saw its own offer, and from then on
//! every packet between the two is tagged under the key derived from the fabric key and both
//! nonces ([`crate::auth::FabricKey::session_key`]). A NIC binds each nonce it offers at most
//! once: an answer of another incarnation (a replayed HELLO) gets a fresh offer, never the old
//! session back, and a packet of any earlier session fails its tag before it is parsed.
//!
//! A new session does not by itself mean the peer lost its state (an idle give-up, a replayed
//! "no session" notice): each HELLO names the session whose reliability state its sender still
//! holds, and the streams go on across the new session when both hold the same one; otherwise
//! both start afresh (a new transmit epoch, an empty receive state), so nothing is delivered
//! twice and nothing of an old incarnation is delivered at all.
//!
//! Opening offers are sent again with exponential backoff (as retransmissions are), and a NIC
//! answers packets it cannot authenticate with at most one "no session" notice per
//! retransmission interval, so a flood of replayed packets costs the victim almost nothing.

use shared_abi::ids::NodeId;
use shared_abi::packet::{HelloFlags, HelloPayload, PacketHeader, PacketKind};
use zerocopy::little_endian::U64;

use crate::auth::FabricKey;
use crate::connection::Connection;
use crate::time::Instant;
use crate::{Hal, Nic};

/// Largest factor the interval between opening offers grows to (2^5 = 32 times the first).
const MAX_HELLO_BACKOFF: u32 = 5;

/// An established session: our nonce, the peer's, and the key derived from both.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bound {
    pub(crate) ours: u64,
    pub(crate) theirs: u64,
    pub(crate) key: FabricKey,
}

/// A nonce we offered and have not bound yet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Offer {
    pub(crate) ours: u64,
    /// The peer's offer we answer (its nonce, the session it said it keeps, and the key of the
    /// pair), or `None` for an opening offer of ours.
    pub(crate) answering: Option<(u64, (u64, u64), FabricKey)>,
}

/// A connection's session state.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Session {
    /// Whether the connection needs a session at all: only over an authenticated fabric, on a
    /// route that leaves the board ([`crate::Hal::local_route`]).
    pub(crate) keyed: bool,
    pub(crate) bound: Option<Bound>,
    /// The session before `bound`, when the new one went on with its streams: its packets still
    /// in flight are taken (they are of the same streams, so a duplicate is one), and each asks
    /// for our confirmation again, until the peer has it.
    pub(crate) previous: Option<Bound>,
    pub(crate) offer: Option<Offer>,
    /// The session (our nonce, theirs) whose reliability state this connection holds.
    pub(crate) kept: Option<(u64, u64)>,
    /// A HELLO is owed now (an answer, or the confirmation of a session we just established).
    pub(crate) hello_now: bool,
    /// When to send our opening offer again, and how many times it has gone unanswered.
    pub(crate) hello_at: Option<Instant>,
    pub(crate) hello_backoff: u32,
}

impl Session {
    /// Whether sequenced and control packets may go out: no session is needed, or one is
    /// established.
    pub(crate) fn open(&self) -> bool {
        !self.keyed || self.bound.is_some()
    }
}

impl<H: Hal, const C: usize> Nic<H, C> {
    /// A fresh nonce (zero without a fabric key, when no session is ever needed).
    fn draw_nonce(&mut self) -> u64 {
        self.nonce_counter = self.nonce_counter.wrapping_add(1);
        self.config
            .fabric_key
            .map_or(0, |key| key.nonce(&self.boot_entropy, self.nonce_counter))
    }

    fn session_key(&self, peer: NodeId, ours: u64, theirs: u64) -> Option<FabricKey> {
        let key = self.config.fabric_key?;
        Some(key.session_key((self.node.get(), ours), (peer.get(), theirs)))
    }

    /// Opens the packet in `wire` from a keyed fabric: under the session (or the answered offer)
    /// of the connection to the node the packet names as its source, or, for a HELLO, under the
    /// fabric key. The named source only picks the keys to try; nothing else is read before a
    /// tag checks. Returns the packet and whether it came under a session key.
    pub(crate) fn open_keyed<'a>(
        &mut self,
        fabric: FabricKey,
        wire: &'a [u8],
        now: Instant,
    ) -> Option<(&'a [u8], bool)> {
        let claimed = wire
            .get(4..6)
            .and_then(|two| two.first_chunk::<2>())
            .map(|two| NodeId::new(u16::from_le_bytes(*two)));
        let index = claimed.and_then(|peer| self.connection_index(peer));
        if let Some(index) = index
            && let Some(connection) = self.connections.get(index)
        {
            let session = connection.session;
            if let Some(bound) = session.bound
                && let Some(packet) = bound.key.open(wire)
            {
                return Some((packet, true));
            }
            if let Some(previous) = session.previous
                && let Some(packet) = previous.key.open(wire)
            {
                if let Some(connection) = self.connections.get_mut(index) {
                    connection.session.hello_now = true;
                }
                return Some((packet, true));
            }
            if let Some(offer) = session.offer
                && let Some((theirs, kept, key)) = offer.answering
                && let Some(packet) = key.open(wire)
            {
                // The peer established the session we offered and its confirmation was lost or
                // is behind this packet: this packet shows it saw our nonce.
                self.establish(index, offer.ours, theirs, kept, false, now);
                return Some((packet, true));
            }
        }
        if let Some(packet) = fabric.open(wire) {
            return Some((packet, false));
        }
        self.counters.unauthenticated += 1;
        // A packet we cannot authenticate from a node we hold no session with: the node may hold
        // one with an earlier incarnation of ours. Say so (paced: a flood of replays costs at most
        // one notice per retransmission interval).
        let without_session = index
            .and_then(|index| self.connections.get(index))
            .is_none_or(|connection| {
                connection.session.keyed && connection.session.bound.is_none()
            });
        let due = self
            .no_session_sent_at
            .is_none_or(|at| now.saturating_since(at) >= self.config.retransmit_timeout);
        if let Some(peer) = claimed
            && peer != self.node
            && !self.hal.local_route(peer)
            && without_session
            && due
        {
            self.no_session_sent_at = Some(now);
            self.send_hello(peer, HelloFlags::NO_SESSION, [0; 4]);
        }
        None
    }

    /// A HELLO under the fabric key, already checked and addressed to us.
    pub(crate) fn take_hello(&mut self, header: &PacketHeader, payload: &[u8], now: Instant) {
        let Ok((hello, _)) = <HelloPayload as zerocopy::FromBytes>::read_from_prefix(payload)
        else {
            return;
        };
        let peer = header.src_node;
        let flags = HelloFlags(header.aux);
        let (theirs, echo) = (hello.nonce.get(), hello.echo.get());
        let their_kept = (hello.kept_ours.get(), hello.kept_theirs.get());
        if flags == HelloFlags::NO_SESSION {
            // Only a connection with packets in flight cares: it offers a new session (keeping
            // the one it has until the new one is bound, so a replayed notice changes nothing).
            if let Some(index) = self.connection_index(peer)
                && let Some(connection) = self.connections.get_mut(index)
                && connection.session.keyed
                && connection.session.offer.is_none()
                && !connection.sent.is_empty()
            {
                let ours = self.draw_nonce();
                if let Some(connection) = self.connections.get_mut(index) {
                    connection.session.offer = Some(Offer {
                        ours,
                        answering: None,
                    });
                    connection.session.hello_at = Some(now);
                }
            }
            return;
        }
        if flags == HelloFlags::BUSY {
            if let Some(index) = self.connection_index(peer)
                && let Some(connection) = self.connections.get_mut(index)
                && connection
                    .session
                    .offer
                    .is_some_and(|o| o.ours == echo && echo != 0)
            {
                // Alive but without room for us: do not give up on it yet.
                connection.last_progress = now;
            }
            return;
        }
        if theirs == 0 {
            return;
        }
        let Some(index) = self.connection_for(peer, now) else {
            self.counters.no_connection += 1;
            self.send_hello(peer, HelloFlags::BUSY, [0, theirs, 0, 0]);
            return;
        };
        let Some(connection) = self.connections.get_mut(index) else {
            return;
        };
        connection.last_heard = now;
        let session = connection.session;
        if !session.keyed {
            return;
        }
        // The other side has the session already when it confirms: no confirmation back.
        let confirm = flags != HelloFlags::CONFIRM;
        if let Some(offer) = session.offer
            && echo == offer.ours
        {
            match offer.answering {
                // The answer to our opening offer, or the other side establishing what we
                // offered: established.
                None => self.establish(index, offer.ours, theirs, their_kept, confirm, now),
                Some((answered, kept, _)) if answered == theirs => {
                    self.establish(index, offer.ours, theirs, kept, confirm, now);
                }
                // It saw our offer but speaks with another nonce: answer that one.
                Some(_) => self.answer(index, offer.ours, theirs, their_kept),
            }
            return;
        }
        if let Some(bound) = session.bound
            && bound.theirs == theirs
        {
            if echo == bound.ours && flags != HelloFlags::CONFIRM {
                // It still waits for us to show we saw its offer (our confirmation was lost).
                if let Some(connection) = self.connections.get_mut(index) {
                    connection.session.hello_now = true;
                }
            }
            // Otherwise a duplicate of the handshake that made the session we have.
            return;
        }
        if flags == HelloFlags::CONFIRM || echo != 0 {
            // An answer to, or a confirmation of, an offer that is not ours now: one of an
            // earlier incarnation's (a replay), or of an offer we have since bound. Answering it
            // would only start a handshake between two NICs that have a session already.
            return;
        }
        // A new offer (the peer restarted or gave up), or one of another incarnation: our unbound
        // nonce (a fresh one if we have none) answers it, and the session we have stays until the
        // new one is bound — a replayed HELLO gets an answer no live NIC confirms. A nonce is
        // bound at most once, so answering several offers with it never revives an old session.
        let ours = match session.offer {
            Some(offer) => offer.ours,
            None => self.draw_nonce(),
        };
        self.answer(index, ours, theirs, their_kept);
    }

    fn answer(&mut self, index: usize, ours: u64, theirs: u64, their_kept: (u64, u64)) {
        let Some(peer) = self.connections.get(index).map(|c| c.peer) else {
            return;
        };
        let Some(key) = self.session_key(peer, ours, theirs) else {
            return;
        };
        if let Some(connection) = self.connections.get_mut(index) {
            connection.session.offer = Some(Offer {
                ours,
                answering: Some((theirs, their_kept, key)),
            });
            connection.session.hello_now = true;
        }
    }

    /// Binds the session (ours, theirs), confirming it to the peer if `confirm`. The streams go on if the peer holds the reliability
    /// state of the same session we hold; otherwise both start afresh.
    fn establish(
        &mut self,
        index: usize,
        ours: u64,
        theirs: u64,
        their_kept: (u64, u64),
        confirm: bool,
        now: Instant,
    ) {
        let Some(peer) = self.connections.get(index).map(|c| c.peer) else {
            return;
        };
        let Some(key) = self.session_key(peer, ours, theirs) else {
            return;
        };
        let kept = self.connections.get(index).and_then(|c| c.session.kept);
        let continues = kept.is_some_and(|(k_ours, k_theirs)| their_kept == (k_theirs, k_ours));
        self.epoch_counter = self.epoch_counter.wrapping_add(1);
        let epoch = self.epoch_counter;
        let Some(connection) = self.connections.get_mut(index) else {
            return;
        };
        connection.session.previous = if continues {
            connection.session.bound
        } else {
            None
        };
        connection.session.bound = Some(Bound { ours, theirs, key });
        connection.session.offer = None;
        // Confirmed at once (unless the other side has it already), so it switches as we did.
        connection.session.hello_now = confirm;
        connection.session.kept = Some((ours, theirs));
        connection.session.hello_at = None;
        connection.session.hello_backoff = 0;
        connection.counters.sessions += 1;
        connection.last_progress = now;
        if continues {
            // Whatever was held back for the handshake goes now.
            if let Some(front) = connection.sent.front().map(|d| d.seq) {
                connection.go_back_to(front);
            }
            return;
        }
        // The peer holds nothing of ours: what it sent before is gone with it, and what we have in
        // flight starts a new epoch it will follow from the start.
        connection.forget_peer_stream();
        connection.restart_epoch(epoch);
        self.abandon_assemblies(index);
    }

    /// Sends the HELLO the connection owes or has due. Returns whether one went out.
    pub(crate) fn transmit_hello(&mut self, index: usize, now: Instant) -> bool {
        let retransmit_timeout = self.config.retransmit_timeout;
        let Some(connection) = self.connections.get_mut(index) else {
            return false;
        };
        if !connection.session.keyed {
            return false;
        }
        // Something to send and no session: open one.
        let waiting = !connection.sent.is_empty() || !connection.queue.is_empty();
        if connection.session.bound.is_none() && connection.session.offer.is_none() && waiting {
            let ours = self.draw_nonce();
            let Some(connection) = self.connections.get_mut(index) else {
                return false;
            };
            connection.session.offer = Some(Offer {
                ours,
                answering: None,
            });
            connection.session.hello_at = Some(now);
            connection.session.hello_backoff = 0;
        }
        let Some(connection) = self.connections.get_mut(index) else {
            return false;
        };
        let session = &mut connection.session;
        if session.offer.is_some() && waiting && session.hello_at.is_none() {
            session.hello_at = Some(now.saturating_add(retransmit_timeout));
        }
        let offer_due = session.offer.is_some() && session.hello_at.is_some_and(|at| at <= now);
        if !session.hello_now && !offer_due {
            return false;
        }
        let answering_now = session.hello_now;
        session.hello_now = false;
        let kept = session.kept.unwrap_or((0, 0));
        let (flags, fields) = match (session.offer, session.bound) {
            (Some(offer), _) => {
                // An answer echoes the offer it answers; a repeated offer echoes nothing, so the
                // peer answers it whatever it answered last (the offer we answered may have been
                // a replay, whose answer a live peer ignores).
                let echo = offer
                    .answering
                    .filter(|_| answering_now)
                    .map_or(0, |(theirs, _, _)| theirs);
                (HelloFlags(0), [offer.ours, echo, kept.0, kept.1])
            }
            (None, Some(bound)) => (
                HelloFlags::CONFIRM,
                [bound.ours, bound.theirs, kept.0, kept.1],
            ),
            (None, None) => return false,
        };
        if offer_due {
            if waiting {
                // Unanswered offers are paced as retransmissions are.
                let interval = retransmit_timeout.saturating_mul(1 << session.hello_backoff);
                session.hello_at = Some(now.saturating_add(interval));
                session.hello_backoff = (session.hello_backoff + 1).min(MAX_HELLO_BACKOFF);
            } else {
                // Nothing waits for the session any more: the offer stands, unrepeated.
                session.hello_at = None;
            }
        }
        let peer = connection.peer;
        self.send_hello(peer, flags, fields);
        true
    }

    /// When the connection's opening offer is due again, if one is.
    pub(crate) fn hello_due_at(connection: &Connection) -> Option<Instant> {
        let session = &connection.session;
        session.offer.and(session.hello_at)
    }

    /// The connection gave up on its peer: the session ends with it (the next packet opens a new
    /// one); the reliability state it kept stays, as it does without sessions.
    pub(crate) fn end_session(connection: &mut Connection) {
        connection.session.bound = None;
        connection.session.previous = None;
        connection.session.offer = None;
        connection.session.hello_at = None;
        connection.session.hello_backoff = 0;
        connection.session.hello_now = false;
    }

    fn send_hello(&mut self, peer: NodeId, flags: HelloFlags, fields: [u64; 4]) {
        let Some(fabric) = self.config.fabric_key else {
            return;
        };
        let mut header = PacketHeader::new(PacketKind::HELLO, self.node, peer);
        header.aux = flags.0;
        let payload = HelloPayload {
            nonce: U64::new(fields[0]),
            echo: U64::new(fields[1]),
            kept_ours: U64::new(fields[2]),
            kept_theirs: U64::new(fields[3]),
        };
        let Some(len) = header.emit(zerocopy::IntoBytes::as_bytes(&payload), &mut self.scratch)
        else {
            return;
        };
        let _ = self.transmit_sealed(peer, len, Some(fabric));
    }
}
