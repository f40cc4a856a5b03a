//! Arrivals: the port's events taken, segments assembled, rendezvous answered, and the limit on
//! data nobody asked for yet.

use crate::{Event, Member, Port, RemotePointer, Status};

use super::payload::{Arrived, Payload};
use super::records::{Assembly, Landing, Rendezvous, SendId, SendRecord};
use super::transfers::Transfers;
use super::wire::{
    Control, ControlKind, FAILED_PART, HEADER_LEN, Header, Key, PACKET_PAYLOAD, PROBE_PART,
    RECEIVE_TAG, SEGMENT_PAYLOAD, segment_count,
};
use super::{REFUSED_KEEP, TransferError};

impl Transfers {
    /// Whether a message of `total` bytes from `at` may be held: always if it is the one asked
    /// for; else if it fits under the limit, and it is then counted against it.
    pub(super) fn admit(&mut self, at: (Member, Key), total: usize) -> bool {
        if self.wanted == Some(at) {
            return true;
        }
        // A message's bookkeeping costs too: it counts as a packet's worth at least.
        let cost = total.max(PACKET_PAYLOAD);
        if self.unexpected.saturating_add(cost) > self.unexpected_limit {
            self.counters.over_limit += 1;
            return false;
        }
        self.unexpected += cost;
        self.charged.insert(at, cost);
        true
    }

    /// What `at`'s message counted against the limit is free again.
    pub(super) fn uncharge(&mut self, at: (Member, Key)) {
        if let Some(cost) = self.charged.remove(&at) {
            self.unexpected = self.unexpected.saturating_sub(cost);
        }
    }

    /// The caller waits for the message `key` from `from` now: a ready-to-send of it kept
    /// waiting for room is answered at once.
    ///
    /// # Errors
    /// [`TransferError::OverLimit`] if it came before and was dropped for the limit.
    pub fn want(&mut self, port: &mut Port, from: Member, key: Key) -> Result<(), TransferError> {
        let at = (from, key);
        self.wanted = Some(at);
        if let Some(bytes) = self.over_limit.remove(&at) {
            return Err(TransferError::OverLimit {
                peer: from,
                bytes,
                limit: self.unexpected_limit,
            });
        }
        if let Some(index) = self
            .deferred
            .iter()
            .position(|(member, control)| *member == from && control.key == key)
            && let Some((member, control)) = self.deferred.remove(index)
        {
            self.ready(port, member, control);
        }
        Ok(())
    }

    /// The caller waits for the message `key` from `from`, of `length` bytes: if it will come by
    /// rendezvous and nothing of it is here yet, a landing region goes to `from` at once (an
    /// offer), so that the sender puts the message as soon as it sends it, with no ready-to-send
    /// and clear-to-send between. A ready-to-send that crosses the offer is answered by it; one
    /// of another length, or an eager message, makes it void.
    pub fn offer(&mut self, port: &mut Port, from: Member, key: Key, length: usize) {
        let at = (from, key);
        if !self.by_rendezvous(length)
            || length as u64 > shared_abi::rdma::MAX_RDMA_LENGTH
            || self.landing.contains_key(&at)
            || self.arrived.contains_key(&at)
            || self.assembling.contains_key(&at)
            || self.over_limit.contains_key(&at)
        {
            return;
        }
        let Ok(region) = self.pool.take(port, length) else {
            // The sender's ready-to-send is answered (or refused) when it comes.
            return;
        };
        let value = region.remote(0);
        self.landing.insert(
            at,
            Landing {
                id: None,
                total: length,
                region,
            },
        );
        self.counters.rendezvous_offered += 1;
        let offer = Control {
            kind: ControlKind::Offer,
            key,
            id: length as u64,
            value,
        };
        self.send_internal(from, offer);
    }

    /// Answers the ready-to-sends kept waiting, in order, while they fit under the limit.
    pub(super) fn answer_deferred(&mut self, port: &mut Port) {
        while let Some(&(member, control)) = self.deferred.front() {
            let total = usize::try_from(control.value).unwrap_or(usize::MAX);
            if self.unexpected.saturating_add(total.max(PACKET_PAYLOAD)) > self.unexpected_limit {
                return;
            }
            self.deferred.pop_front();
            self.ready(port, member, control);
        }
    }

    /// Whether any of the message `key` from `from` is here (a segment, or all of it).
    pub fn holds(&self, from: Member, key: Key) -> bool {
        self.assembling.contains_key(&(from, key)) || self.arrived.contains_key(&(from, key))
    }

    /// Whether the message `key` from `from` is here whole (and not taken yet).
    pub fn has_whole(&self, from: Member, key: Key) -> bool {
        self.arrived.contains_key(&(from, key))
    }

    /// The message from `from` under `key`, if it has arrived whole (it is then forgotten).
    pub fn take(&mut self, from: Member, key: Key) -> Option<Vec<u8>> {
        self.take_arrived(from, key).map(Arrived::into_vec)
    }

    /// Copies the message from `from` under `key` into `out`, if it has arrived whole (it is
    /// then forgotten): `Some(Ok(()))`, or `Some(Err(length))` if it is not `out`'s length (and
    /// is dropped).
    pub fn take_into(
        &mut self,
        from: Member,
        key: Key,
        out: &mut [u8],
    ) -> Option<Result<(), usize>> {
        let message = self.take_arrived(from, key)?;
        if message.len() != out.len() {
            return Some(Err(message.len()));
        }
        message.copy_to(out);
        Some(Ok(()))
    }

    fn take_arrived(&mut self, from: Member, key: Key) -> Option<Arrived> {
        let message = self.arrived.remove(&(from, key))?;
        self.counters.messages_received += 1;
        self.uncharge((from, key));
        if self.wanted == Some((from, key)) {
            self.wanted = None;
        }
        Some(message)
    }

    /// Takes `event` if it is the transfers' (a segment arrived, or a segment's send ended);
    /// returns it otherwise.
    pub fn handle(&mut self, port: &mut Port, event: Event) -> Option<Event> {
        match event {
            Event::Received {
                buffer,
                length,
                tag,
                sender_node,
                sender_port,
                status,
                ..
            } if tag == RECEIVE_TAG => {
                self.provided = self.provided.saturating_sub(1);
                let mut buffer = Some(buffer);
                if status == Status::SUCCESS {
                    let from = Member::new(sender_node, sender_port);
                    let accepted = match buffer.as_ref().and_then(|b| b.get(..length)) {
                        Some(bytes) => match Control::parse(bytes) {
                            Some(control) => {
                                self.control(port, from, control);
                                None
                            }
                            None => self.arrive(from, bytes),
                        },
                        None => {
                            self.counters.dropped += 1;
                            None
                        }
                    };
                    if let Some(key) = accepted
                        && let Some(arrived) = buffer.take()
                    {
                        buffer = self.forward_segment(from, key, arrived, length);
                    }
                }
                // Provided again at once: a receive token came back with the event. (A refused
                // buffer goes back to the arena; the others keep the port fed.) A buffer sent
                // on by forwarding is replaced by a spare send buffer.
                match buffer {
                    Some(buffer) => {
                        let _ = self.provide(port, buffer);
                    }
                    None => self.replenish(port),
                }
                None
            }
            Event::Sent {
                buffer,
                context,
                status,
                ..
            } if self.in_flight.contains_key(&context) => {
                self.sent(buffer, context, status);
                None
            }
            Event::OperationDone {
                context, status, ..
            } if self.puts.contains_key(&context) => {
                self.put_done(context, status);
                None
            }
            Event::SendRejected {
                buffer: Some(buffer),
                context,
                status,
                ..
            } if self.in_flight.contains_key(&context) => {
                // A refused token is not retried: what the NIC refuses, it refuses again.
                if let Some(flight) = self.in_flight.remove(&context) {
                    self.fail(flight, status);
                }
                self.spare.push(buffer);
                None
            }
            Event::ReceiveRejected {
                buffer: Some(_),
                tag,
                ..
            } if tag == RECEIVE_TAG => {
                self.provided = self.provided.saturating_sub(1);
                None
            }
            other => Some(other),
        }
    }

    /// A segment arrived from `from`: checked, stored, and its message completed when whole.
    /// Returns the message's key if the segment was taken (not malformed, not a duplicate).
    pub(super) fn arrive(&mut self, from: Member, bytes: &[u8]) -> Option<Key> {
        let Some(header) = Header::parse(bytes) else {
            self.counters.dropped += 1;
            return None;
        };
        let payload = &bytes[HEADER_LEN..];
        if header.key.part == PROBE_PART {
            // Its delivery was all it asked.
            return None;
        }
        if header.key.part == FAILED_PART {
            self.note_failed(from, header.key, payload);
            return None;
        }
        let (Ok(offset), Ok(total)) = (
            usize::try_from(header.offset),
            usize::try_from(header.total),
        ) else {
            self.counters.dropped += 1;
            return None;
        };
        let index = offset / SEGMENT_PAYLOAD;
        let fits = offset % SEGMENT_PAYLOAD == 0
            && total <= isize::MAX as usize
            && offset <= total
            && payload.len() == (total - offset).min(SEGMENT_PAYLOAD)
            && index < segment_count(total);
        let key = (from, header.key);
        if !fits || self.arrived.contains_key(&key) {
            self.counters.dropped += 1;
            return None;
        }
        let new = !self.assembling.contains_key(&key);
        if new {
            // A new message: the rest of one dropped for the limit stays dropped, and one that
            // does not fit under the limit is dropped (and remembered).
            if self.over_limit.contains_key(&key) {
                self.counters.dropped += 1;
                return None;
            }
            if !self.admit(key, total) {
                self.counters.dropped += 1;
                if self.over_limit.len() < REFUSED_KEEP {
                    self.over_limit.insert(key, total);
                }
                return None;
            }
        }
        if new && total == payload.len() {
            // The whole message in one segment (every eager one but the last 40 bytes below
            // the rendezvous): taken as it is, with no buffer zeroed to assemble it in.
            self.whole(key, payload.to_vec());
            return Some(header.key);
        }
        let assembly = match self.assembling.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let mut data = Vec::new();
                if data.try_reserve_exact(total).is_err() {
                    self.uncharge(key);
                    self.counters.dropped += 1;
                    return None;
                }
                data.resize(total, 0);
                let count = segment_count(total);
                entry.insert(Assembly {
                    data,
                    arrived: vec![false; count],
                    missing: count,
                })
            }
        };
        if assembly.data.len() != total || assembly.arrived[index] {
            self.counters.dropped += 1;
            return None;
        }
        assembly.data[offset..offset + payload.len()].copy_from_slice(payload);
        assembly.arrived[index] = true;
        assembly.missing -= 1;
        if assembly.missing == 0
            && let Some(done) = self.assembling.remove(&key)
        {
            self.whole(key, done.data);
        }
        Some(header.key)
    }

    /// The eager message `key` is whole: it has arrived.
    fn whole(&mut self, key: (Member, Key), data: Vec<u8>) {
        // A landing region offered for it is not needed.
        if self
            .landing
            .get(&key)
            .is_some_and(|landing| landing.id.is_none())
        {
            self.landing.remove(&key);
        }
        self.arrived.insert(key, Arrived::Assembled(data));
    }

    /// A member's notice that its operation `key` failed ([`FAILED_PART`]); a malformed one is
    /// dropped, and past [`REFUSED_KEEP`] notices kept, later ones are. A sender's first
    /// notice for an operation stands.
    fn note_failed(&mut self, from: Member, key: Key, payload: &[u8]) {
        let (Ok(named), true) = (
            <[u8; 8]>::try_from(payload),
            self.failed.len() < REFUSED_KEEP,
        ) else {
            self.counters.dropped += 1;
            return;
        };
        self.failed
            .entry((key.context, key.sequence, from))
            .or_insert(u64::from_le_bytes(named));
    }

    /// Whether one of `members` said operation `sequence` of the communicator `context` failed:
    /// the first such member's index in `members` and the rank it named (`u64::MAX`: none).
    /// Every member's notice for the operation is taken with it; notices from ports outside
    /// `members` are never taken, and stay counted against [`REFUSED_KEEP`].
    pub fn failed(
        &mut self,
        context: u32,
        sequence: u32,
        members: &[Member],
    ) -> Option<(usize, u64)> {
        if self.failed.is_empty() {
            return None;
        }
        let mut first = None;
        for (index, &member) in members.iter().enumerate() {
            if let Some(named) = self.failed.remove(&(context, sequence, member)) {
                first.get_or_insert((index, named));
            }
        }
        first
    }

    /// A rendezvous control message `control` arrived from `from`.
    pub(super) fn control(&mut self, port: &mut Port, from: Member, control: Control) {
        match control.kind {
            ControlKind::Ready => self.ready(port, from, control),
            ControlKind::Clear | ControlKind::Refuse => self.answered(port, from, control),
            ControlKind::Offer => self.offered(port, from, control),
            ControlKind::Done => {
                let key = (from, control.key);
                match self.landing.remove(&key) {
                    Some(landing) if landing.id.is_none_or(|id| id == control.id) => {
                        // The message stays where it landed: passed on from there, and copied
                        // out once, into the buffer of the caller who takes it.
                        self.counters.rendezvous_received += 1;
                        let (region, total) = (landing.region, landing.total);
                        self.forward_whole(key, Payload::staged(region.clone(), total));
                        self.arrived.insert(key, Arrived::Landed(region, total));
                    }
                    Some(other) => {
                        self.landing.insert(key, other);
                        self.counters.dropped += 1;
                    }
                    None => self.counters.dropped += 1,
                }
            }
        }
    }

    /// `from` is ready to send a message by rendezvous: a landing region goes back to it at
    /// once (or a refusal, if none can be registered: the message then comes eagerly).
    pub(super) fn ready(&mut self, port: &mut Port, from: Member, control: Control) {
        let key = (from, control.key);
        let Ok(total) = usize::try_from(control.value) else {
            self.counters.dropped += 1;
            return;
        };
        if let Some(landing) = self.landing.get(&key)
            && landing.id.is_none()
        {
            if landing.total == total {
                // It crossed this endpoint's offer, which the sender takes as its answer.
                return;
            }
            // Another length than offered: the offer is void, and this one is answered.
            self.landing.remove(&key);
        }
        if control.value > shared_abi::rdma::MAX_RDMA_LENGTH
            || self.landing.contains_key(&key)
            || self.arrived.contains_key(&key)
            || self.assembling.contains_key(&key)
        {
            self.counters.dropped += 1;
            return;
        }
        if !self.admit(key, total) {
            // No room under the limit of unexpected data: the answer waits for room, or for
            // the caller to ask for this message.
            if self.deferred.len() < REFUSED_KEEP
                && !self
                    .deferred
                    .iter()
                    .any(|(member, c)| *member == from && c.key == control.key)
            {
                self.deferred.push_back((from, control));
            } else {
                self.counters.dropped += 1;
            }
            return;
        }
        // As an eager message's assembly: a length this process cannot hold is refused, not
        // an abort.
        let room = Vec::<u8>::new().try_reserve_exact(total).is_ok();
        let region = if room {
            self.pool.take(port, total).ok()
        } else {
            None
        };
        let answer = match region {
            Some(region) => {
                let value = region.remote(0);
                self.landing.insert(
                    key,
                    Landing {
                        id: Some(control.id),
                        total,
                        region,
                    },
                );
                Control {
                    kind: ControlKind::Clear,
                    value,
                    ..control
                }
            }
            None => {
                self.uncharge(key);
                self.counters.rendezvous_refused += 1;
                Control {
                    kind: ControlKind::Refuse,
                    value: 0,
                    ..control
                }
            }
        };
        self.send_internal(from, answer);
    }

    /// The receiver `from` answered the ready-to-send of a message of ours: the puts start, or
    /// the message goes eagerly.
    pub(super) fn answered(&mut self, port: &mut Port, from: Member, control: Control) {
        let id = SendId(control.id);
        if self.asking(id, from, control.key).is_none() {
            self.counters.dropped += 1;
            return;
        }
        match control.kind {
            ControlKind::Clear => self.start_puts(port, id, control.value),
            _ => self.send_eagerly(id),
        }
    }

    /// The receiver `from` offered a landing region for a message of ours: taken as the
    /// clear-to-send of a send of it that asked already, else kept for the send to come.
    pub(super) fn offered(&mut self, port: &mut Port, from: Member, control: Control) {
        let Ok(length) = usize::try_from(control.id) else {
            self.counters.dropped += 1;
            return;
        };
        let asking = self
            .sends
            .keys()
            .copied()
            .find_map(|id| self.asking(id, from, control.key).map(|len| (id, len)));
        match asking {
            Some((id, len)) if len == length => {
                self.counters.offers_taken += 1;
                self.start_puts(port, id, control.value);
            }
            // Another length: the receiver answers the ready-to-send itself.
            Some(_) => {}
            None if self.offers.len() < REFUSED_KEEP => {
                self.offers
                    .insert((from, control.key), (control.value, length));
            }
            None => self.counters.dropped += 1,
        }
    }

    /// Landing regions held for messages that have not arrived (answered or offered).
    pub fn landings(&self) -> usize {
        self.landing.len()
    }

    /// Whether `to` offered a landing region for the message `key`, not sent yet.
    pub fn offered_to(&self, to: Member, key: Key) -> bool {
        self.offers.contains_key(&(to, key))
    }

    /// The length of send `id` if it is of `key` to `to` and waits for the receiver's answer.
    fn asking(&self, id: SendId, to: Member, key: Key) -> Option<usize> {
        match self.sends.get(&id) {
            Some(SendRecord {
                error: None,
                rendezvous: Some((t, k, Rendezvous::Asking { data })),
                ..
            }) if *t == to && *k == key => Some(data.len()),
            _ => None,
        }
    }

    /// Send `id`, which waited for the receiver's answer, goes eagerly (refused).
    fn send_eagerly(&mut self, id: SendId) {
        let Some(record) = self.sends.get_mut(&id) else {
            return;
        };
        if let Some((to, key, Rendezvous::Asking { data })) = record.rendezvous.take() {
            self.queue_eager(id, to, key, data.owned());
        }
    }

    /// Send `id`, which waited for the receiver's answer, is put into the landing region at
    /// `remote`: from where it is staged, or from a region it is copied into now (or eagerly,
    /// if this side cannot register one).
    pub(super) fn start_puts(&mut self, port: &mut Port, id: SendId, remote: u64) {
        let Some(record) = self.sends.get_mut(&id) else {
            return;
        };
        let Some((to, key, Rendezvous::Asking { data })) = record.rendezvous.take() else {
            return;
        };
        let region = match data.region() {
            Some(staged) => Some(staged.clone()),
            None => self.pool.take(port, data.len()).ok().inspect(|region| {
                region.bytes().write(0, &data.owned());
            }),
        };
        let Some(region) = region else {
            self.queue_eager(id, to, key, data.owned());
            return;
        };
        record.rendezvous = Some((
            to,
            key,
            Rendezvous::Putting {
                region,
                remote: RemotePointer::from_u64(remote),
                total: data.len(),
                next: 0,
                again: Vec::new(),
                in_flight: 0,
                landed: 0,
            },
        ));
        if data.is_empty() {
            self.landed(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::coll::transfer::segments;
    use crate::{NodeId, PortId};

    /// The segment of a message of `total` bytes (every byte its offset's low byte) at `index`.
    fn segment(key: Key, total: usize, index: usize) -> Vec<u8> {
        let (offset, length) = segments(total).nth(index).unwrap();
        let mut bytes = vec![0u8; HEADER_LEN];
        Header {
            key,
            offset: offset as u64,
            total: total as u64,
        }
        .write(&mut bytes);
        bytes.extend((offset..offset + length).map(|at| at as u8));
        bytes
    }

    #[test]
    fn segments_in_any_order_make_the_message_and_duplicates_are_dropped() {
        let mut transfers = Transfers::empty(Duration::from_secs(1));
        let from = Member::new(NodeId::new(3), PortId(2));
        let key = Key {
            context: 1,
            sequence: 2,
            part: 0,
        };
        let total = 3 * SEGMENT_PAYLOAD + 100;
        for index in [3, 1, 1, 0] {
            transfers.arrive(from, &segment(key, total, index));
        }
        assert_eq!(transfers.take(from, key), None, "a segment is missing");
        transfers.arrive(from, &segment(key, total, 2));
        let message = transfers.take(from, key).expect("whole");
        assert!(message.iter().enumerate().all(|(at, &b)| b == at as u8));
        assert_eq!(transfers.counters().dropped, 1);
        // Another sender's message under the same key is another message.
        let other = Member::new(NodeId::new(4), PortId(2));
        transfers.arrive(other, &segment(key, 0, 0));
        assert_eq!(transfers.take(other, key), Some(Vec::new()));
    }

    #[test]
    fn a_message_of_one_segment_is_taken_as_it_comes_and_counted_a_packet_at_least() {
        let mut transfers = Transfers::empty(Duration::from_secs(1));
        transfers.set_unexpected_limit(2 * PACKET_PAYLOAD);
        let from = Member::new(NodeId::new(1), PortId(1));
        let key = |sequence| Key {
            context: 1,
            sequence,
            part: 0,
        };
        // Two short messages fill the limit (a packet's worth each); the first's duplicate,
        // a third short one and one a segment long are dropped.
        let first = segment(key(1), 10, 0);
        transfers.arrive(from, &first);
        transfers.arrive(from, &first);
        transfers.arrive(from, &segment(key(2), 1, 0));
        transfers.arrive(from, &segment(key(3), 1, 0));
        let counters = transfers.counters();
        assert_eq!((counters.dropped, counters.over_limit), (2, 1));
        assert_eq!(transfers.take(from, key(1)), Some((0..10).collect()));
        assert_eq!(transfers.take(from, key(2)), Some(vec![0]));
        assert_eq!(transfers.take(from, key(3)), None);
        transfers.arrive(from, &segment(key(4), SEGMENT_PAYLOAD, 0));
        assert_eq!(transfers.take(from, key(4)), None, "over the limit");
        transfers.set_unexpected_limit(SEGMENT_PAYLOAD);
        transfers.arrive(from, &segment(key(5), SEGMENT_PAYLOAD, 0));
        let message = transfers.take(from, key(5)).expect("under the limit");
        assert!(message.iter().enumerate().all(|(at, &b)| b == at as u8));
    }

    #[test]
    fn malformed_segments_are_dropped() {
        let mut transfers = Transfers::empty(Duration::from_secs(1));
        let from = Member::new(NodeId::new(0), PortId(1));
        let key = Key {
            context: 0,
            sequence: 0,
            part: 0,
        };
        let good = segment(key, 10, 0);
        // Too short, a payload longer than the total says, an offset off the grid, a total
        // changed between segments.
        let mut long = good.clone();
        long.push(0);
        let mut shifted = segment(key, 2 * SEGMENT_PAYLOAD, 1);
        shifted[16] = 1;
        transfers.arrive(from, &good[..HEADER_LEN - 1]);
        transfers.arrive(from, &long);
        transfers.arrive(from, &shifted);
        transfers.arrive(from, &segment(key, 2 * SEGMENT_PAYLOAD, 0));
        transfers.arrive(from, &segment(key, 3 * SEGMENT_PAYLOAD, 2));
        assert_eq!(transfers.counters().dropped, 4);
        assert_eq!(transfers.take(from, key), None);
    }

    /// A failed operation's notice from `from`, naming `rank`.
    fn notice(transfers: &mut Transfers, from: Member, key: Key, rank: u64) {
        let mut bytes = vec![0u8; HEADER_LEN];
        let key = Key {
            part: FAILED_PART,
            ..key
        };
        Header {
            key,
            offset: 0,
            total: 8,
        }
        .write(&mut bytes);
        bytes.extend(rank.to_le_bytes());
        transfers.arrive(from, &bytes);
    }

    #[test]
    fn a_notice_from_outside_the_group_hides_no_members_notice() {
        let mut transfers = Transfers::empty(Duration::from_secs(1));
        let members: Vec<Member> = (0..3)
            .map(|node| Member::new(NodeId::new(node), PortId(1)))
            .collect();
        let stranger = Member::new(NodeId::new(9), PortId(1));
        let key = Key {
            context: 7,
            sequence: 3,
            part: 0,
        };
        // The forged notice comes first and names member 1; the real one, from member 2,
        // names member 0.
        notice(&mut transfers, stranger, key, 1);
        notice(&mut transfers, members[2], key, 0);
        notice(&mut transfers, members[2], key, 1);
        assert_eq!(
            transfers.failed(7, 3, &members),
            Some((2, 0)),
            "its first notice"
        );
        assert_eq!(
            transfers.failed(7, 3, &members),
            None,
            "taken, the stranger's ignored"
        );
        // Another operation's notice is its own, and a malformed one is dropped.
        notice(
            &mut transfers,
            members[1],
            Key { sequence: 4, ..key },
            u64::MAX,
        );
        assert_eq!(transfers.failed(7, 3, &members), None);
        assert_eq!(transfers.failed(7, 4, &members), Some((1, u64::MAX)));
        let dropped = transfers.counters().dropped;
        let mut short = segment(
            Key {
                part: FAILED_PART,
                ..key
            },
            8,
            0,
        );
        short.pop();
        transfers.arrive(members[0], &short);
        assert_eq!(transfers.counters().dropped, dropped + 1);
        assert_eq!(transfers.failed(7, 3, &members), None);
    }
}
