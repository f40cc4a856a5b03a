//! Events: what the NIC reports, turned into the C events it means, settling the records it
//! closes (a send's callback owed, a receive buffer back, a barrier ended).

use std::time::{Duration, Instant};

use nicbar_rs::WaitMode;
use nicbar_rs::raw::{self, RawEvent};
use shared_abi::event::{EventKind, Status};
use shared_abi::max_length_for_size;
use shared_abi::ring::Wake;
use shared_abi::token::Priority;

use crate::barrier::{BarrierEnd, BarrierRecords, Waiter};
use crate::events::{fatal_event, receive_event, simple_event};
use crate::state::PortState;
use crate::status::{from_nic, message};
use crate::types::*;

/// Empty polls of gm_receive between yields of the core.
const POLLS_PER_YIELD: u32 = 16;
/// Empty polls of gm_receive between checks that the daemon is still there.
const POLLS_PER_LIVENESS_CHECK: u32 = 1 << 14;

impl PortState {
    /// An event that needs no look at the NIC: deferred, unannounced completions, death.
    pub(crate) fn ready_event(&mut self) -> Option<gm_recv_event> {
        if !self.retries.is_empty() {
            self.post_due_retries(Instant::now());
        }
        if let Some(event) = self.deferred.pop_front() {
            return Some(event);
        }
        if self.unannounced {
            self.unannounced = false;
            return Some(simple_event(GM_SENT_EVENT));
        }
        if let Some(fatal) = self.fatal.as_ref().map(|(status, _)| fatal_event(*status)) {
            return Some(fatal);
        }
        let alarm = self.alarms.take_due(Instant::now())?;
        self.alarm_callbacks
            .push_back((alarm.callback, alarm.context, alarm.address));
        Some(simple_event(GM_ALARM_EVENT))
    }

    /// Whether an event is waiting (gm_receive_pending): one the library holds, or one in the
    /// event ring.
    pub(crate) fn pending(&self) -> bool {
        !self.deferred.is_empty()
            || self.unannounced
            || self.fatal.is_some()
            || self
                .alarms
                .next_due()
                .is_some_and(|due| due <= Instant::now())
            || self.raw.event_waiting().unwrap_or(true)
    }

    /// The next event for gm_receive: never waits.
    pub(crate) fn poll(&mut self) -> gm_recv_event {
        if let Some(event) = self.ready_event() {
            return event;
        }
        loop {
            match self.raw.next_event() {
                Ok(Some(event)) => {
                    if let Some(event) = self.translate(event) {
                        return event;
                    }
                }
                Ok(None) => {
                    self.empty_polls = self.empty_polls.wrapping_add(1);
                    if self.empty_polls % POLLS_PER_YIELD == 0 {
                        // A program spinning on gm_receive lets the NIC (a thread of the daemon
                        // here) have the core now and then: with more spinners than cores, a
                        // spin that never yields only delays the event it waits for.
                        std::thread::yield_now();
                    }
                    if self.empty_polls % POLLS_PER_LIVENESS_CHECK == 0
                        && let Err(error) = self.raw.check_daemon_alive()
                    {
                        self.die(&error);
                        return self.ready_event().unwrap_or_default();
                    }
                    return simple_event(GM_NO_RECV_EVENT);
                }
                Err(error) => {
                    self.die(&error);
                    return self.ready_event().unwrap_or_default();
                }
            }
        }
    }

    /// Waits up to `timeout` for the next event, as `mode` says.
    pub(crate) fn wait(&mut self, timeout: Duration, mode: WaitMode) -> Option<gm_recv_event> {
        let started = Instant::now();
        let mut deadline = match self.alarms.next_due() {
            Some(due) => due.min(started + timeout),
            None => started + timeout,
        };
        let give_up = deadline;
        let spin_until = mode.spin_until(started, Some(deadline));
        loop {
            if let Some(event) = self.ready_event() {
                return Some(event);
            }
            let waited = match self.raw.next_event() {
                Ok(Some(event)) => {
                    if let Some(event) = self.translate(event) {
                        return Some(event);
                    }
                    continue;
                }
                Ok(None) => {
                    // Wake for a send to a closed port that is due to be posted again.
                    deadline = self.next_retry().map_or(give_up, |due| due.min(give_up));
                    self.raw.wait(Some(deadline), spin_until, Wake::ANY)
                }
                Err(error) => Err(error),
            };
            match waited {
                Ok(true) => {}
                Ok(false) if deadline < give_up => {}
                Ok(false) => return None,
                Err(error) => {
                    self.die(&error);
                    return self.ready_event();
                }
            }
        }
    }

    /// Turns a raw event into the C event it means, settling the records it closes; `None` for
    /// an event that means nothing to the program (or names no record of this port).
    pub(crate) fn translate(&mut self, event: RawEvent) -> Option<gm_recv_event> {
        if let Some(done) = self.operation_event(&event) {
            return done;
        }
        if BarrierRecords::concerns(&event) {
            let end = self.barriers.on_event(&mut self.raw, &event)?;
            return self.barrier_ended(end);
        }
        match event.kind {
            EventKind::SENT => self.finish_send(event.context.get(), from_nic(event.status)),
            EventKind::RECEIVED => self.received(&event),
            EventKind::TOKEN_REJECTED if raw::is_ring_corrupt(&event) => {
                self.fatal.get_or_insert((
                    GM_FIRMWARE_ABORT,
                    "the NIC found the port's rings corrupt".to_owned(),
                ));
                self.ready_event()
            }
            EventKind::TOKEN_REJECTED if raw::is_receive_rejection(&event) => {
                let provided = self.take_receive(event.tag.get())?;
                let why = format!(
                    "the NIC refused it ({})",
                    message(from_nic(event.status)).to_string_lossy()
                );
                Some(self.refused_receive(provided.info, why))
            }
            EventKind::TOKEN_REJECTED => {
                self.finish_send(event.context.get(), from_nic(event.status))
            }
            _ => None,
        }
    }

    /// A barrier ended: the program's hear of it by an event (and a callback); nicbar_barrier's
    /// end is kept for it.
    pub(crate) fn barrier_ended(&mut self, end: BarrierEnd) -> Option<gm_recv_event> {
        match end.waiter {
            Waiter::Program { callback, context } => {
                if callback.is_some() {
                    self.complete(callback, context, end.status);
                }
                Some(end.event())
            }
            Waiter::Library => {
                self.library_barrier_end = Some(end);
                None
            }
        }
    }

    fn received(&mut self, event: &RawEvent) -> Option<gm_recv_event> {
        let provided = self.take_receive(event.tag.get())?;
        if event.buffer.get() != provided.arena_offset {
            // Not the buffer this tag was given with: the NIC misreported. The record is gone
            // either way; tell the program its buffer is back, unused.
            let why = format!(
                "the NIC reported arena offset {:#x} for the buffer at {:#x} (offset {:#x})",
                event.buffer.get(),
                provided.info.address,
                provided.arena_offset
            );
            return Some(self.refused_receive(provided.info, why));
        }
        if event.status == Status::INCOMPLETE {
            // The sender died (or withdrew the message) part way: the program hears of it by a
            // GM_BAD_RECV_TOKEN_EVENT, and gm_unknown gives the buffer back to the NIC instead
            // of ending the program (one process's death must not kill another).
            let why = format!(
                "a message longer than a packet from node {} port {} stopped part way ({} bytes \
                 arrived): its sender withdrew it",
                event.peer_node.get(),
                event.peer_port.0,
                event.length.get()
            );
            if self.cut_short.len() >= CUT_SHORT_KEPT {
                // The program handles GM_BAD_RECV_TOKEN_EVENT itself: forget the oldest.
                self.cut_short.pop_front();
            }
            self.cut_short.push_back(CutShort {
                address: provided.info.address,
                size: provided.info.size,
                priority: u32::from(provided.priority.0),
                tag: provided.info.tag,
                sender_node: event.peer_node.get(),
                sender_port: event.peer_port.0,
                arrived: event.length.get(),
            });
            return Some(self.refused_receive(provided.info, why));
        }
        if event.status != Status::SUCCESS {
            let why = format!("the NIC could not write the buffer ({:?})", event.status);
            return Some(self.refused_receive(provided.info, why));
        }
        let length = event
            .length
            .get()
            .min(max_length_for_size(provided.info.size));
        let kind = receive_kind(
            provided.priority == Priority::HIGH,
            event.peer_port == self.raw.port_id(),
            length <= NICBAR_FAST_RECV_MAX,
        );
        Some(receive_event(
            kind,
            provided.info,
            length,
            event.peer_node.get(),
            event.peer_port.0,
        ))
    }

    /// gm_unknown's part for a receive event the program passed on (GM 2's gm_unknown): a fast,
    /// peer or high-priority form comes back from the next receive call as the next plainer
    /// form ([`plainer_receive_kind`]); a GM_BAD_RECV_TOKEN_EVENT for a message cut short by its
    /// sender gives the buffer back to the NIC. Whether the event was one of these.
    pub(crate) fn unknown_receive(&mut self, mut recv: gm_recv_t) -> bool {
        let kind = recv.r#type.n;
        if kind == GM_BAD_RECV_TOKEN_EVENT {
            let address = u64::from_be(recv.buffer.n) as usize;
            let Some(index) = self.cut_short.iter().position(|c| c.address == address) else {
                return false;
            };
            let Some(cut) = self.cut_short.remove(index) else {
                return false;
            };
            eprintln!(
                "gm_unknown: a message from node {} port {} was cut short by its sender ({} \
                 bytes arrived); the receive buffer at {address:#x} is provided again",
                cut.sender_node, cut.sender_port, cut.arrived
            );
            self.provide(address, u32::from(cut.size), cut.priority, cut.tag);
            return true;
        }
        let Some(plainer) = plainer_receive_kind(kind) else {
            return false;
        };
        // A fast event's message is in the receive buffer already (`recv.message` is the
        // buffer): GM's copy into the buffer has nothing to move.
        recv.message = recv.buffer;
        recv.r#type.n = plainer;
        self.deferred.push_front(gm_recv_event { recv });
        true
    }

    /// A send ended: its callback is owed, and a GM_SENT_EVENT says so.
    fn finish_send(&mut self, context: u64, status: gm_status_t) -> Option<gm_recv_event> {
        let send = self.take_send(context)?;
        if self.retry_if_closed(&send, status) {
            // GM retries a send to a port that is not open yet until it opens or times out.
            return None;
        }
        self.send_ended(send.connection, status);
        self.complete(send.callback, send.context, status);
        self.unannounced = false;
        Some(simple_event(GM_SENT_EVENT))
    }
}

/// The receive form gm_unknown turns `kind` into: a fast form loses FAST, a peer form PEER,
/// GM_HIGH_RECV_EVENT becomes GM_RECV_EVENT; `None` for any other event.
pub(crate) fn plainer_receive_kind(kind: u8) -> Option<u8> {
    Some(match kind {
        GM_FAST_RECV_EVENT => GM_RECV_EVENT,
        GM_FAST_HIGH_RECV_EVENT => GM_HIGH_RECV_EVENT,
        GM_FAST_PEER_RECV_EVENT => GM_PEER_RECV_EVENT,
        GM_FAST_HIGH_PEER_RECV_EVENT => GM_HIGH_PEER_RECV_EVENT,
        GM_PEER_RECV_EVENT => GM_RECV_EVENT,
        GM_HIGH_PEER_RECV_EVENT => GM_HIGH_RECV_EVENT,
        GM_HIGH_RECV_EVENT => GM_RECV_EVENT,
        _ => return None,
    })
}

/// How many cut-short buffers are remembered for gm_unknown.
const CUT_SHORT_KEPT: usize = 64;

/// A receive buffer whose message was cut short by its sender: what gm_unknown needs to provide
/// it again, and what to say.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CutShort {
    pub(crate) address: usize,
    pub(crate) size: u8,
    pub(crate) priority: u32,
    pub(crate) tag: u32,
    pub(crate) sender_node: u16,
    pub(crate) sender_port: u8,
    pub(crate) arrived: u32,
}

/// The receive event type for a message: GM's fast events for small messages, peer events for
/// messages from a port with this port's id, high ones for high priority.
pub(crate) fn receive_kind(high: bool, peer: bool, fast: bool) -> u8 {
    match (fast, peer, high) {
        (false, false, false) => GM_RECV_EVENT,
        (false, false, true) => GM_HIGH_RECV_EVENT,
        (false, true, false) => GM_PEER_RECV_EVENT,
        (false, true, true) => GM_HIGH_PEER_RECV_EVENT,
        (true, false, false) => GM_FAST_RECV_EVENT,
        (true, false, true) => GM_FAST_HIGH_RECV_EVENT,
        (true, true, false) => GM_FAST_PEER_RECV_EVENT,
        (true, true, true) => GM_FAST_HIGH_PEER_RECV_EVENT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receive_kinds_are_gms() {
        assert_eq!(receive_kind(false, false, false), 11);
        assert_eq!(receive_kind(true, false, false), 12);
        assert_eq!(receive_kind(false, true, false), 13);
        assert_eq!(receive_kind(true, true, false), 14);
        assert_eq!(receive_kind(false, false, true), 15);
        assert_eq!(receive_kind(true, false, true), 16);
        assert_eq!(receive_kind(false, true, true), 17);
        assert_eq!(receive_kind(true, true, true), 18);
    }

    #[test]
    fn gm_unknown_takes_every_receive_form_to_gm_recv_event() {
        for high in [false, true] {
            for peer in [false, true] {
                for fast in [false, true] {
                    let mut kind = receive_kind(high, peer, fast);
                    let mut steps = 0;
                    while let Some(plainer) = plainer_receive_kind(kind) {
                        kind = plainer;
                        steps += 1;
                    }
                    assert_eq!(kind, GM_RECV_EVENT);
                    assert_eq!(steps, u32::from(high) + u32::from(peer) + u32::from(fast));
                }
            }
        }
        assert_eq!(plainer_receive_kind(GM_RECV_EVENT), None);
        assert_eq!(plainer_receive_kind(GM_SENT_EVENT), None);
        assert_eq!(plainer_receive_kind(GM_BAD_RECV_TOKEN_EVENT), None);
    }
}
