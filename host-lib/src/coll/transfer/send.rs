//! Sending: messages queued eagerly or by rendezvous, forwards of arriving messages, and a
//! send's end as its sender sees it.

use std::sync::Arc;

use crate::{DmaBuffer, Member, Port};

use super::TransferError;
use super::payload::Payload;
use super::records::{InFlight, Outgoing, Rendezvous, SendId, SendRecord};
use super::transfers::Transfers;
use super::wire::{Control, ControlKind, Header, Key, segment_count};

impl Transfers {
    /// `bytes` ready to send to any number of receivers: staged in a registered region if they
    /// go by rendezvous (the puts then read them from there, with no copy per receiver), else
    /// owned. A port that cannot register memory gets owned bytes.
    pub fn stage(&mut self, port: &mut Port, bytes: &[u8]) -> Payload {
        if self.by_rendezvous(bytes.len())
            && let Ok(region) = self.pool.take(port, bytes.len())
        {
            region.bytes().write(0, bytes);
            return Payload::staged(region, bytes.len());
        }
        Payload::from(Arc::<[u8]>::from(bytes))
    }

    /// Queues `data` for `to` under `key`; it goes out as the NIC takes it, while the caller
    /// progresses ([`Transfers::post`]). [`Transfers::send_done`] says when it is delivered.
    pub fn send(&mut self, to: Member, key: Key, data: Payload) -> SendId {
        let id = SendId(self.next_id);
        self.next_id += 1;
        self.send_as(id, to, key, data);
        id
    }

    /// [`Transfers::send`] under the id `id` (a new one, or one a forward reserved).
    pub(super) fn send_as(&mut self, id: SendId, to: Member, key: Key, data: Payload) {
        let detached = self.sends.get(&id).is_some_and(|record| record.detached);
        if self.by_rendezvous(data.len()) {
            let length = data.len();
            // A landing region the receiver offered already (of this length): no ready-to-send,
            // the puts start at the next post.
            let offered = self
                .offers
                .remove(&(to, key))
                .filter(|&(_, offered)| offered == length);
            self.sends.insert(
                id,
                SendRecord {
                    detached,
                    rendezvous: Some((to, key, Rendezvous::Asking { data })),
                    ..SendRecord::new(usize::from(offered.is_none()))
                },
            );
            match offered {
                Some((remote, _)) => {
                    self.counters.offers_taken += 1;
                    self.offered_sends.push((id, remote));
                }
                None => {
                    let ready = Control {
                        kind: ControlKind::Ready,
                        key,
                        id: id.0,
                        value: length as u64,
                    };
                    self.queue_control(id, to, ready);
                }
            }
            return;
        }
        self.sends.insert(
            id,
            SendRecord {
                detached,
                ..SendRecord::new(0)
            },
        );
        self.queue_eager(id, to, key, data.owned());
    }

    /// Queues `data` for `to` under `key` as eager segments of the send `id`, which counts them.
    pub(super) fn queue_eager(&mut self, id: SendId, to: Member, key: Key, data: Arc<[u8]>) {
        if let Some(record) = self.sends.get_mut(&id) {
            record.unposted += segment_count(data.len());
            record.undelivered += segment_count(data.len());
        }
        self.outgoing.push_back(Outgoing {
            id,
            to,
            key,
            data,
            next: 0,
            control: false,
        });
    }

    /// Forwards the message `key` from `from` to each of `to` as it arrives (see the module's
    /// documentation); returns the sends' ids, in `to`'s order, for [`Transfers::send_done`].
    /// `None` if any of it has arrived already (the caller then sends it on itself once it is
    /// whole) or `to` is empty.
    pub fn forward(&mut self, from: Member, key: Key, to: &[Member]) -> Option<Vec<SendId>> {
        let at = (from, key);
        if to.is_empty()
            || self.forwards.contains_key(&at)
            || self.assembling.contains_key(&at)
            || self.arrived.contains_key(&at)
            || self.landing.contains_key(&at)
        {
            return None;
        }
        let mut sends = Vec::with_capacity(to.len());
        for &member in to {
            let id = SendId(self.next_id);
            self.next_id += 1;
            // One packet until the first segment tells the message's length.
            self.sends.insert(
                id,
                SendRecord {
                    awaiting: Some(at),
                    ..SendRecord::new(1)
                },
            );
            sends.push((member, id));
        }
        let ids = sends.iter().map(|&(_, id)| id).collect();
        self.forwards.insert(at, sends);
        Some(ids)
    }

    /// The segment in `buffer` (`length` bytes, accepted as a new segment of `key` from `from`)
    /// goes on to the ranks its message is forwarded to: `buffer` itself to the first, copies
    /// to the others. Gives `buffer` back if the message is not forwarded.
    pub(super) fn forward_segment(
        &mut self,
        from: Member,
        key: Key,
        buffer: DmaBuffer,
        length: usize,
    ) -> Option<DmaBuffer> {
        let at = (from, key);
        let Some(to) = self.forwards.get(&at).cloned() else {
            return Some(buffer);
        };
        // The first segment tells the message's length: the sends count its segments.
        let mut total = None;
        for &(_, id) in &to {
            if let Some(record) = self.sends.get_mut(&id)
                && record.awaiting.take().is_some()
            {
                let total = *total.get_or_insert_with(|| {
                    buffer
                        .get(..length)
                        .and_then(Header::parse)
                        .map_or(0, |header| header.total as usize)
                });
                record.unposted = segment_count(total);
                record.undelivered = segment_count(total);
            }
        }
        if !self.assembling.contains_key(&at) {
            // The last segment: the message is whole here.
            self.forwards.remove(&at);
        }
        for &(member, id) in to.iter().skip(1) {
            match self.spare.pop() {
                Some(mut copy) => {
                    copy[..length].copy_from_slice(&buffer[..length]);
                    self.queue_packet(copy, id, member, length);
                }
                None => {
                    self.forward_backlog
                        .push_back((id, member, Box::from(&buffer[..length])));
                }
            }
        }
        match to.first() {
            Some(&(member, id)) => {
                self.queue_packet(buffer, id, member, length);
                self.lent += 1;
                None
            }
            None => Some(buffer),
        }
    }

    /// Queues `buffer`, a packet of `length` bytes of the send `id` to `to`, ahead of the
    /// segments still to be copied. It counts as handed to the NIC once posted.
    pub(super) fn queue_packet(
        &mut self,
        buffer: DmaBuffer,
        id: SendId,
        to: Member,
        length: usize,
    ) {
        self.counters.forwarded += 1;
        let context = self.new_context();
        self.in_flight.insert(
            context,
            InFlight {
                id,
                to,
                length,
                fresh: true,
            },
        );
        self.resend.push_back((buffer, context));
    }

    /// A message forwarded as it arrived came whole by rendezvous instead: it goes on to the
    /// forward's ranks as ordinary sends under the ids they were given (from the region it
    /// landed in).
    pub(super) fn forward_whole(&mut self, at: (Member, Key), data: Payload) {
        let Some(to) = self.forwards.remove(&at) else {
            return;
        };
        for (member, id) in to {
            if self.sends.contains_key(&id) {
                self.send_as(id, member, at.1, data.clone());
            }
        }
    }

    /// Queues the control message `control` for `to` as a packet of the send `id`.
    pub(super) fn queue_control(&mut self, id: SendId, to: Member, control: Control) {
        self.outgoing.push_back(Outgoing {
            id,
            to,
            key: control.key,
            data: Arc::new(control.to_bytes()),
            next: 0,
            control: true,
        });
    }

    /// Sends `control` to `to` as a message of the transfers' own: nobody waits for it, and its
    /// failure is counted as a late one (the peer's own wait then fails).
    pub(super) fn send_internal(&mut self, to: Member, control: Control) {
        let id = SendId(self.next_id);
        self.next_id += 1;
        self.sends.insert(
            id,
            SendRecord {
                detached: true,
                internal: true,
                ..SendRecord::new(1)
            },
        );
        self.queue_control(id, to, control);
    }

    /// Whether the message `id` is wholly in the NIC's hands (`Ok(true)`: the NIC delivers it
    /// reliably from there, as an eager send) or still waiting for send buffers or tokens
    /// (`Ok(false)`). An unknown id counts as in the NIC's hands.
    ///
    /// # Errors
    /// How the send failed (the message is then forgotten).
    pub fn send_done(&mut self, id: SendId) -> Result<bool, TransferError> {
        let Some(record) = self.sends.get(&id) else {
            return Ok(true);
        };
        if let Some(error) = record.error.clone() {
            self.forget_send(id);
            return Err(error);
        }
        Ok(record.unposted == 0 && record.rendezvous.is_none())
    }

    /// The sender asks no more about message `id`: it is forgotten once delivered, and a failure
    /// after this is counted ([`late_failures`](super::TransferCounters::late_failures))
    /// instead of reported.
    pub fn detach(&mut self, id: SendId) {
        let Some(record) = self.sends.get_mut(&id) else {
            return;
        };
        if record.detached {
            return;
        }
        record.detached = true;
        let (failed, rendezvous, undelivered) = (
            record.error.is_some(),
            record.rendezvous.is_some(),
            record.undelivered,
        );
        if self.forward_not_started(id) {
            // The operation ended (failed) before the message it was to forward came: nothing
            // goes on to this rank.
            self.forget_send(id);
        } else if failed {
            self.counters.late_failures += 1;
            self.forget_send(id);
        } else if rendezvous {
            // The operation ended (failed) mid-rendezvous: the message is abandoned, and the
            // receiver's wait for its "done" fails on its own.
            self.forget_send(id);
        } else if undelivered == 0 {
            self.counters.messages_sent += 1;
            self.forget_send(id);
        }
    }

    /// Whether `id` is a send of a forward whose message has not begun to arrive (it is then
    /// taken out of the forward).
    pub(super) fn forward_not_started(&mut self, id: SendId) -> bool {
        let Some(at) = self.sends.get_mut(&id).and_then(|r| r.awaiting.take()) else {
            return false;
        };
        if let Some(to) = self.forwards.get_mut(&at) {
            to.retain(|&(_, i)| i != id);
            if to.is_empty() {
                self.forwards.remove(&at);
            }
        }
        true
    }

    /// Forgets `id`'s record and queued packets, and its rendezvous's source region (let go at
    /// once, or, while puts from it are in the NIC, once they end).
    pub(super) fn forget_send(&mut self, id: SendId) {
        if let Some(SendRecord {
            rendezvous:
                Some((
                    _,
                    _,
                    Rendezvous::Putting {
                        region, in_flight, ..
                    },
                )),
            ..
        }) = self.sends.remove(&id)
        {
            if in_flight > 0 {
                self.draining.insert(id, (region, in_flight));
            }
        }
        self.first_give_up.remove(&id);
        self.outgoing.retain(|message| message.id != id);
    }
}
