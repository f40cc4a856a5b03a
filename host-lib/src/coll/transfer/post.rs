//! Posting: packets and puts handed to the NIC while send buffers and tokens last, and their
//! ends — delivered, sent again within the retry window, or failed.

use std::time::Instant;

use crate::{DmaBuffer, Error, Port, Priority, Status};

use super::records::{InFlight, PutFlight, Rendezvous, SendId, SendRecord};
use super::transfers::Transfers;
use super::wire::{BUFFER_LEN, Control, ControlKind, HEADER_LEN, Header, SIZE_CLASS, segments};
use super::{PUT_CHUNK, PUTS_IN_FLIGHT, TransferError};

impl Transfers {
    /// Posts what waits to go out while send buffers and tokens last: packets first, then puts.
    /// Returns whether it posted anything.
    pub fn post(&mut self, port: &mut Port) -> bool {
        self.pool.trim(port);
        self.replenish(port);
        self.answer_deferred(port);
        for (id, remote) in std::mem::take(&mut self.offered_sends) {
            self.start_puts(port, id, remote);
        }
        while !self.forward_backlog.is_empty() {
            let Some(mut buffer) = self.spare.pop() else {
                break;
            };
            if let Some((id, to, bytes)) = self.forward_backlog.pop_front() {
                buffer[..bytes.len()].copy_from_slice(&bytes);
                self.queue_packet(buffer, id, to, bytes.len());
            }
        }
        let packets = self.post_packets(port);
        self.post_puts(port) || packets
    }

    /// Posts packets (segments and control messages) while send buffers and tokens last.
    pub(super) fn post_packets(&mut self, port: &mut Port) -> bool {
        let mut posted = false;
        while let Some((buffer, context)) = self.resend.pop_front() {
            let Some(flight) = self.in_flight.get(&context) else {
                self.spare.push(buffer);
                continue;
            };
            let (id, to, length) = (flight.id, flight.to, flight.length);
            match port.send(
                buffer,
                length,
                SIZE_CLASS,
                Priority::LOW,
                to.node,
                to.port,
                context,
            ) {
                Ok(()) => {
                    posted = true;
                    if let Some(flight) = self.in_flight.get_mut(&context)
                        && flight.fresh
                    {
                        flight.fresh = false;
                        if let Some(record) = self.sends.get_mut(&id) {
                            record.unposted = record.unposted.saturating_sub(1);
                        }
                    }
                }
                Err(refused) if matches!(refused.error, Error::NoSendTokens) => {
                    self.resend.push_front((refused.buffer, context));
                    return posted;
                }
                Err(refused) => {
                    self.spare.push(refused.buffer);
                    if let Some(flight) = self.in_flight.remove(&context) {
                        self.fail(flight, Status::INVALID_TOKEN);
                    }
                }
            }
        }
        while let Some(message) = self.outgoing.front_mut() {
            let Some(mut buffer) = self.spare.pop() else {
                return posted;
            };
            let bytes = if message.control {
                let length = message.data.len().min(BUFFER_LEN);
                buffer[..length].copy_from_slice(&message.data[..length]);
                length
            } else {
                let (offset, length) = segments(message.data.len())
                    .nth(message.next)
                    .unwrap_or((0, 0));
                Header {
                    key: message.key,
                    offset: offset as u64,
                    total: message.data.len() as u64,
                }
                .write(&mut buffer[..HEADER_LEN]);
                buffer[HEADER_LEN..HEADER_LEN + length]
                    .copy_from_slice(&message.data[offset..offset + length]);
                HEADER_LEN + length
            };
            let (id, to) = (message.id, message.to);
            let context = self.next_context;
            match port.send(
                buffer,
                bytes,
                SIZE_CLASS,
                Priority::LOW,
                to.node,
                to.port,
                context,
            ) {
                Ok(()) => {
                    self.next_context += 1;
                    posted = true;
                    self.in_flight.insert(
                        context,
                        InFlight {
                            id,
                            to,
                            length: bytes,
                            fresh: false,
                        },
                    );
                    message.next += 1;
                    if let Some(record) = self.sends.get_mut(&id) {
                        record.unposted = record.unposted.saturating_sub(1);
                    }
                    if message.next >= message.packets() {
                        self.outgoing.pop_front();
                    }
                }
                Err(refused) if matches!(refused.error, Error::NoSendTokens) => {
                    self.spare.push(refused.buffer);
                    return posted;
                }
                Err(refused) => {
                    self.spare.push(refused.buffer);
                    if let Some(record) = self.sends.get_mut(&id) {
                        record.error = Some(TransferError::Port(refused.error.to_string()));
                    }
                    self.outgoing.pop_front();
                }
            }
        }
        posted
    }

    /// Posts the puts of rendezvous whose landing region is known, up to [`PUTS_IN_FLIGHT`]
    /// each, while send tokens last. Returns whether it posted any.
    pub(super) fn post_puts(&mut self, port: &mut Port) -> bool {
        let mut posted = false;
        for (&id, record) in &mut self.sends {
            if record.error.is_some() {
                continue;
            }
            let Some((
                to,
                _,
                Rendezvous::Putting {
                    region,
                    remote,
                    total,
                    next,
                    again,
                    in_flight,
                    ..
                },
            )) = &mut record.rendezvous
            else {
                continue;
            };
            while *in_flight < PUTS_IN_FLIGHT {
                let (offset, length) = match again.pop() {
                    Some(chunk) => chunk,
                    None if *next < *total => (*next, (*total - *next).min(PUT_CHUNK)),
                    None => break,
                };
                let Some(target) = remote.add(offset as u64) else {
                    record.error = Some(TransferError::Port(format!(
                        "the landing region's offset {offset} is past 4 GiB"
                    )));
                    break;
                };
                let context = self.next_context;
                match port.put(
                    region,
                    offset,
                    target.to_u64(),
                    length,
                    to.node,
                    to.port,
                    context,
                ) {
                    Ok(()) => {
                        self.next_context += 1;
                        posted = true;
                        *in_flight += 1;
                        if offset == *next {
                            *next += length;
                        }
                        self.puts.insert(
                            context,
                            PutFlight {
                                id,
                                to: *to,
                                offset,
                                length,
                            },
                        );
                    }
                    Err(Error::NoSendTokens) => {
                        if offset != *next {
                            again.push((offset, length));
                        }
                        return posted;
                    }
                    Err(error) => {
                        record.error = Some(TransferError::Port(error.to_string()));
                        break;
                    }
                }
            }
        }
        posted
    }

    /// A put of a rendezvous ended with `status`.
    pub(super) fn put_done(&mut self, context: u64, status: Status) {
        let Some(flight) = self.puts.remove(&context) else {
            return;
        };
        if let Some((_, left)) = self.draining.get_mut(&flight.id) {
            *left -= 1;
            if *left == 0 {
                self.draining.remove(&flight.id);
            }
            return;
        }
        let now = Instant::now();
        let retry_until = match self.first_give_up.get(&flight.id) {
            Some(first) => *first + self.retry_window,
            None => now + self.retry_window,
        };
        let Some(SendRecord {
            rendezvous:
                Some((
                    _,
                    _,
                    Rendezvous::Putting {
                        total,
                        again,
                        in_flight,
                        landed,
                        ..
                    },
                )),
            ..
        }) = self.sends.get_mut(&flight.id)
        else {
            return;
        };
        *in_flight = in_flight.saturating_sub(1);
        if status == Status::SUCCESS {
            *landed += flight.length;
            if *landed >= *total && *in_flight == 0 {
                self.landed(flight.id);
            }
            return;
        }
        let given_up =
            status == Status::SEND_TIMED_OUT || status == Status::TARGET_NODE_UNREACHABLE;
        if given_up && now < retry_until {
            // As an eager segment's: the target's NIC answered nothing for a while; the same
            // bytes to the same place again (a put is idempotent).
            again.push((flight.offset, flight.length));
            self.first_give_up.entry(flight.id).or_insert(now);
            self.counters.puts_resent += 1;
            return;
        }
        self.fail(
            InFlight {
                id: flight.id,
                to: flight.to,
                length: flight.length,
                fresh: false,
            },
            status,
        );
    }

    /// Every byte of the rendezvous `id` is in the receiver's memory: the source region is let
    /// go and the "done" is queued (the send is in the NIC's hands once it is).
    pub(super) fn landed(&mut self, id: SendId) {
        let Some(record) = self.sends.get_mut(&id) else {
            return;
        };
        let Some((to, key, Rendezvous::Putting { .. })) = record.rendezvous.take() else {
            return;
        };
        record.unposted += 1;
        record.undelivered += 1;
        self.counters.rendezvous_sent += 1;
        self.queue_control(
            id,
            to,
            Control {
                kind: ControlKind::Done,
                key,
                id: id.0,
                value: 0,
            },
        );
    }

    /// A segment's send ended with `status`.
    pub(super) fn sent(&mut self, buffer: DmaBuffer, context: u64, status: Status) {
        let Some(flight) = self.in_flight.remove(&context) else {
            self.spare.push(buffer);
            return;
        };
        if status == Status::SUCCESS {
            self.spare.push(buffer);
            if let Some(record) = self.sends.get_mut(&flight.id) {
                record.undelivered = record.undelivered.saturating_sub(1);
                if record.detached && record.undelivered == 0 && record.rendezvous.is_none() {
                    if !record.internal {
                        self.counters.messages_sent += 1;
                    }
                    self.forget_send(flight.id);
                }
            }
            return;
        }
        let now = Instant::now();
        let alive = self.sends.contains_key(&flight.id);
        let first = if alive {
            *self.first_give_up.entry(flight.id).or_insert(now)
        } else {
            now
        };
        let given_up =
            status == Status::SEND_TIMED_OUT || status == Status::TARGET_NODE_UNREACHABLE;
        if given_up && alive && now < first + self.retry_window {
            // The receiver had no buffer for the NIC's whole receiver-not-ready time (it is
            // outside the library: computing, or not scheduled), or its NIC answered nothing
            // for the NIC's give-up time (a busy host looks the same as a dead one for a while).
            // Send the same bytes again until the retry window closes; a closed port is final.
            self.counters.resent += 1;
            let context = self.new_context();
            self.in_flight.insert(context, flight);
            self.resend.push_back((buffer, context));
            return;
        }
        self.spare.push(buffer);
        self.fail(flight, status);
    }

    /// A segment of `flight`'s message failed for good with `status`: the message fails (or,
    /// if its sender stopped asking, is counted as a late failure).
    pub(super) fn fail(&mut self, flight: InFlight, status: Status) {
        match self.sends.get_mut(&flight.id) {
            Some(record) if record.detached => {
                self.counters.late_failures += 1;
                self.forget_send(flight.id);
            }
            Some(record) => {
                record.error.get_or_insert(TransferError::Peer {
                    peer: flight.to,
                    status,
                });
            }
            None => {}
        }
        self.outgoing.retain(|message| message.id != flight.id);
    }
}
