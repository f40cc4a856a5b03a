//! The emulated wire: a packet a NIC transmits goes back into the same NIC (loopback), into the
//! inbox of another NIC of the same daemon (the in-process path), or out of the NIC's UDP socket
//! to the address the fabric map gives for the destination node. The fault injector, if on, sits
//! in front of all three.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use firmware::auth::FabricKey;
use firmware::{Instant, TransmitError};
use shared_abi::ids::NodeId;
use shared_abi::packet::{MAX_WIRE_LEN, PacketHeader};
use zerocopy::FromBytes;

use super::fabric::FabricMap;
use super::fault::FaultInjector;
use super::udp::{ReceiveBatch, SendBatch};
use nicbar_control::{WireCounters, doorbell};

/// Packets an in-process NIC's inbox holds before the wire drops what arrives (a switch with a
/// full output queue: the reliability protocol resends).
pub(crate) const INBOX_CAPACITY: usize = 8192;

/// Emptied packet buffers an inbox keeps for its pushers to fill again. A buffer allocated for
/// every in-process packet and freed after it showed as a fifth of the NIC thread's samples in
/// `malloc` and `free` during a long allreduce (a put's every 4 KiB segment is one), much of it
/// the packet's own stores draining; reusing them took its CPU per packet from about 510 to
/// 470 ns (docs/long-allreduce.md). A NIC drains its inbox each round, so a round's worth of
/// buffers keeps the allocator out of it.
const SPARE_BUFFERS: usize = 128;

/// Emptied buffers of packets longer than a wire's (the segments of puts, gets' data and long
/// messages between the NICs of one daemon, [`shared_abi::LOCAL_MTU_PAYLOAD`]) an inbox keeps:
/// fewer, each being fifteen times the size, so that a NIC keeps at most a megabyte of them.
const SPARE_LONG_BUFFERS: usize = 16;

/// Packets for one NIC from the other NICs of the daemon: a bounded lock-free queue that any NIC
/// thread pushes into and the receiving NIC's thread drains, with no system call while that
/// thread is awake ([`ThreadWake`]).
#[derive(Debug)]
pub(crate) struct Inbox {
    queue: ArrayQueue<Vec<u8>>,
    /// Buffers of packets the receiving NIC has handled, for the next pushes: those that
    /// held at most a wire's packet, and the longer ones.
    spares: ArrayQueue<Vec<u8>>,
    long_spares: ArrayQueue<Vec<u8>>,
    /// The thread that runs the receiving NIC.
    owner: Arc<ThreadWake>,
}

impl Inbox {
    /// An empty inbox of a NIC that `owner` runs.
    pub(crate) fn new(owner: Arc<ThreadWake>) -> Self {
        Self {
            queue: ArrayQueue::new(INBOX_CAPACITY),
            spares: ArrayQueue::new(SPARE_BUFFERS),
            long_spares: ArrayQueue::new(SPARE_LONG_BUFFERS),
            owner,
        }
    }

    /// Queues a copy of `packet` (in a spare buffer if there is one) and wakes the receiving
    /// NIC's thread if it sleeps; `false` if the inbox is full and the packet was dropped.
    fn push(&self, packet: &[u8]) -> bool {
        let mut buffer = self.spare(packet.len());
        buffer.clear();
        buffer.extend_from_slice(packet);
        self.push_owned(buffer)
    }

    /// Queues `packet` as it is, and wakes the receiving NIC's thread if it sleeps; `false` if
    /// the inbox is full and the packet was dropped.
    fn push_owned(&self, packet: Vec<u8>) -> bool {
        let queued = self.queue.push(packet).is_ok();
        self.owner.wake();
        queued
    }

    /// A buffer for a packet of `len` bytes: a spare one if there is one (holding the bytes of
    /// a packet before, all of which the caller writes over), else a new one.
    fn spare(&self, len: usize) -> Vec<u8> {
        let pool = if len > MAX_WIRE_LEN {
            &self.long_spares
        } else {
            &self.spares
        };
        pool.pop().unwrap_or_default()
    }

    /// Keeps the buffer of a packet taken from this inbox and handled, for a later push (or
    /// frees it if enough are kept).
    pub(crate) fn recycle(&self, buffer: Vec<u8>) {
        let pool = if buffer.capacity() > MAX_WIRE_LEN {
            &self.long_spares
        } else {
            &self.spares
        };
        // A full pool frees the buffer: nothing is lost but the allocation saved.
        let _ = pool.push(buffer);
    }

    /// Whether nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Moves everything queued into `out`.
    pub(crate) fn take_all(&self, out: &mut VecDeque<Vec<u8>>) {
        while let Some(packet) = self.queue.pop() {
            out.push_back(packet);
        }
    }
}

/// How other threads wake a NIC thread that sleeps in `epoll_wait`: its eventfd, rung only
/// while its sleeping flag is up.
///
/// The flag is the two-sided handshake of a sleeping consumer (a Dekker pair): the sleeper
/// raises the flag, issues a full fence, then looks at its inboxes once more before it waits; a
/// pusher queues, issues a full fence, then reads the flag. Whichever order the two run in,
/// either the sleeper sees the packet or the pusher sees the flag — a packet never waits for a
/// timeout. A thread that is awake costs its pushers no system call.
#[derive(Debug)]
pub(crate) struct ThreadWake {
    sleeping: AtomicBool,
    doorbell: OwnedFd,
}

impl ThreadWake {
    /// A wake-up for a thread that waits on `doorbell`.
    pub(crate) fn new(doorbell: OwnedFd) -> Self {
        Self {
            sleeping: AtomicBool::new(false),
            doorbell,
        }
    }

    /// The eventfd the thread waits on.
    pub(crate) fn doorbell(&self) -> &OwnedFd {
        &self.doorbell
    }

    /// Raises the sleeping flag; the caller then checks its inboxes once more before it waits.
    pub(crate) fn going_to_sleep(&self) {
        self.sleeping.store(true, Ordering::Relaxed);
        // Orders the flag before the caller's last look at its inboxes (see the type's doc).
        fence(Ordering::SeqCst);
    }

    /// Lowers the sleeping flag (the thread is awake again).
    pub(crate) fn awake(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// Rings the thread's doorbell if it sleeps. The first pusher to see the flag lowers it, so
    /// a burst of packets costs one system call.
    fn wake(&self) {
        // Orders the caller's push before the flag's read (see the type's doc).
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::AcqRel) {
            doorbell::ring(&self.doorbell);
        }
    }
}

/// The NICs of one daemon, for the in-process path.
#[derive(Debug, Default)]
pub(crate) struct LocalFabric {
    inboxes: Vec<(NodeId, Arc<Inbox>)>,
}

impl LocalFabric {
    /// A fabric of the given NICs.
    pub(crate) fn new(inboxes: Vec<(NodeId, Arc<Inbox>)>) -> Self {
        Self { inboxes }
    }

    fn inbox(&self, node: NodeId) -> Option<&Inbox> {
        self.inboxes
            .iter()
            .find(|(id, _)| *id == node)
            .map(|(_, inbox)| inbox.as_ref())
    }
}

/// A packet the fault injector holds back.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Delayed {
    at: Instant,
    order: u64,
    destination: NodeId,
    packet: Vec<u8>,
}

/// One NIC's side of the wire.
#[derive(Debug)]
pub(crate) struct Wire {
    node: NodeId,
    now: Instant,
    /// Packets the NIC sent to itself, delivered after its poll returns.
    pub(crate) loopback: VecDeque<Vec<u8>>,
    local: Arc<LocalFabric>,
    udp: Option<UdpSocket>,
    fabric: Arc<FabricMap>,
    faults: Option<FaultInjector>,
    delayed: BinaryHeap<Reverse<Delayed>>,
    delayed_order: u64,
    /// A UDP send would have blocked: poll again soon.
    pub(crate) blocked: bool,
    pub(crate) counters: WireCounters,
    /// Datagrams waiting for the end of the NIC's round ([`Wire::flush_udp`]), if the unit has
    /// a UDP socket.
    send_batch: Option<SendBatch>,
    /// The fabric key the NIC checks packets from the UDP wire under; `None` without
    /// authentication.
    key: Option<FabricKey>,
}

impl Wire {
    pub(crate) fn new(
        node: NodeId,
        local: Arc<LocalFabric>,
        udp: Option<UdpSocket>,
        fabric: Arc<FabricMap>,
        faults: Option<FaultInjector>,
        key: Option<FabricKey>,
    ) -> Self {
        let send_batch = udp.is_some().then(SendBatch::new);
        Self {
            node,
            now: Instant::ZERO,
            loopback: VecDeque::new(),
            local,
            udp,
            fabric,
            faults,
            delayed: BinaryHeap::new(),
            delayed_order: 0,
            blocked: false,
            counters: WireCounters::default(),
            send_batch,
            key,
        }
    }

    /// Whether the unit has a UDP socket.
    pub(crate) fn has_udp(&self) -> bool {
        self.udp.is_some()
    }

    /// Sends the datagrams the round batched, in order; what the socket cannot take now waits
    /// for the next round (`blocked` says to come back soon).
    pub(crate) fn flush_udp(&mut self) {
        let (Some(udp), Some(batch)) = (self.udp.as_ref(), self.send_batch.as_mut()) else {
            return;
        };
        if batch.is_empty() {
            return;
        }
        let flushed = batch.flush(udp);
        self.counters.undeliverable += flushed.dropped as u64;
        self.blocked |= flushed.blocked;
    }

    /// Sets the time the fault injector's delays count from (call before each NIC call).
    pub(crate) fn set_now(&mut self, now: Instant) {
        self.now = now;
    }

    /// Whether packets to `destination` stay in this daemon's memory (loopback, or the inbox of
    /// another of its NICs): they need no authentication code.
    pub(crate) fn is_local(&self, destination: NodeId) -> bool {
        destination == self.node || self.local.inbox(destination).is_some()
    }

    fn has_route(&self, destination: NodeId) -> bool {
        destination == self.node
            || self.local.inbox(destination).is_some()
            || (self.udp.is_some() && self.fabric.address(destination).is_some())
    }

    /// Puts one packet on the wire (through the fault injector).
    pub(crate) fn transmit(
        &mut self,
        destination: NodeId,
        packet: &[u8],
    ) -> Result<(), TransmitError> {
        if !self.has_route(destination) {
            self.counters.undeliverable += 1;
            return Err(TransmitError::NoRoute);
        }
        let Some(faults) = self.faults.as_mut() else {
            self.counters.transmitted += 1;
            return self.deliver(destination, packet);
        };
        let fate = faults.fate();
        self.counters.transmitted += 1;
        match fate {
            [None, None] => self.counters.lost += 1,
            [Some(_), Some(_)] => self.counters.duplicated += 1,
            _ => {}
        }
        for delay in fate.into_iter().flatten() {
            if delay.is_zero() {
                // Taken already as far as the NIC knows: a copy the socket refuses is lost.
                if self.deliver(destination, packet).is_err() {
                    self.counters.undeliverable += 1;
                }
            } else {
                self.counters.delayed += 1;
                self.delayed_order += 1;
                self.delayed.push(Reverse(Delayed {
                    at: self.now.saturating_add(delay),
                    order: self.delayed_order,
                    destination,
                    packet: packet.to_vec(),
                }));
            }
        }
        Ok(())
    }

    /// A buffer for a packet of `len` bytes toward `destination`, which stays in this daemon
    /// ([`Wire::is_local`]): a spare one of its inbox if there is one. Its bytes are the
    /// caller's to write over; [`Wire::transmit_local`] sends it.
    pub(crate) fn local_buffer(&self, destination: NodeId, len: usize) -> Vec<u8> {
        match self.local.inbox(destination) {
            Some(inbox) if destination != self.node => inbox.spare(len),
            _ => Vec::new(),
        }
    }

    /// [`Wire::transmit`] of a packet built in a buffer of its own toward a NIC of this daemon,
    /// which takes the buffer as it is: no copy, but the fault injector's.
    pub(crate) fn transmit_local(
        &mut self,
        destination: NodeId,
        packet: Vec<u8>,
    ) -> Result<(), TransmitError> {
        if self.faults.is_some() || !self.is_local(destination) {
            return self.transmit(destination, &packet);
        }
        self.counters.transmitted += 1;
        if destination == self.node {
            self.loopback.push_back(packet);
        } else if let Some(inbox) = self.local.inbox(destination)
            && !inbox.push_owned(packet)
        {
            self.counters.undeliverable += 1;
        }
        Ok(())
    }

    /// Puts `packet` on its route: a copy into the loopback queue or another NIC's inbox, or a
    /// datagram sent straight from the NIC's packet buffer.
    fn deliver(&mut self, destination: NodeId, packet: &[u8]) -> Result<(), TransmitError> {
        if destination == self.node {
            self.loopback.push_back(packet.to_vec());
            return Ok(());
        }
        if let Some(inbox) = self.local.inbox(destination) {
            if !inbox.push(packet) {
                self.counters.undeliverable += 1;
            }
            return Ok(());
        }
        let (Some(udp), Some(address)) = (self.udp.as_ref(), self.fabric.address(destination))
        else {
            return Err(TransmitError::NoRoute);
        };
        if let Some(batch) = self.send_batch.as_mut() {
            if batch.push(address, packet) {
                return Ok(());
            }
            // A full batch goes out now, and the packet joins the next.
            let flushed = batch.flush(udp);
            self.counters.undeliverable += flushed.dropped as u64;
            if batch.push(address, packet) {
                return Ok(());
            }
            self.blocked = true;
            return Err(TransmitError::WouldBlock);
        }
        match udp.send_to(packet, address) {
            Ok(_) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                self.blocked = true;
                Err(TransmitError::WouldBlock)
            }
            Err(_) => {
                // An ICMP error from an earlier datagram, or a route gone: the datagram is lost,
                // as on a real wire; the reliability protocol takes it from here.
                self.counters.undeliverable += 1;
                Ok(())
            }
        }
    }

    /// Delivers the held-back packets that are due.
    pub(crate) fn release_due(&mut self) {
        while let Some(Reverse(next)) = self.delayed.peek() {
            if next.at > self.now {
                break;
            }
            let Some(Reverse(due)) = self.delayed.pop() else {
                break;
            };
            if self.deliver(due.destination, &due.packet).is_err() {
                self.counters.undeliverable += 1;
            }
        }
    }

    /// When the next held-back packet is due.
    pub(crate) fn next_release(&self) -> Option<Instant> {
        self.delayed.peek().map(|Reverse(next)| next.at)
    }

    /// Takes the datagrams waiting on the UDP socket into `batch` (one system call) and lists
    /// in `accepted` those to hand to the NIC ([`firmware::Nic::on_packet`], which checks each
    /// one's authentication code before it parses anything), in order; returns whether any came.
    ///
    /// Drops, and counts, datagrams from addresses that are not on the fabric map and those
    /// longer than any packet (`strangers`). A node is bound to its fabric address: a
    /// datagram whose header names another node than the one at its address is dropped and
    /// counted `spoofed` only once its code has been checked and found right (a holder of the key
    /// sent it from the wrong address); with a wrong code it goes to the NIC like any forgery,
    /// which drops it and counts it `unauthenticated`. A datagram too short to name a node (an
    /// empty one included) goes to the NIC too, which counts it the same way (`malformed_packets`
    /// without authentication). Nothing else of a datagram is looked at here.
    pub(crate) fn receive_udp(
        &mut self,
        batch: &mut ReceiveBatch,
        accepted: &mut Vec<usize>,
    ) -> bool {
        accepted.clear();
        let Some(udp) = self.udp.as_ref() else {
            return false;
        };
        // An error (an ICMP report of an earlier send) is consumed by this call; the socket stays
        // readable if datagrams follow it, and the next round takes them.
        let count = batch.receive(udp).unwrap_or(0);
        for index in 0..count {
            let Some((bytes, len, from)) = batch.datagram(index) else {
                continue;
            };
            let Some(node) = from
                .and_then(|from| self.fabric.node_at(from))
                .filter(|_| len < RECEIVE_BUFFER)
            else {
                self.counters.strangers += 1;
                continue;
            };
            if self.spoofed(bytes, node) {
                self.counters.spoofed += 1;
                continue;
            }
            accepted.push(index);
        }
        self.counters.received += accepted.len() as u64;
        count > 0
    }

    /// Whether `bytes`, which came from `node`'s address, is a packet a holder of the key made
    /// that names another node as its source. Its code is checked before the claim counts; one
    /// with a wrong code is no one's packet (the NIC drops it as unauthenticated).
    fn spoofed(&self, bytes: &[u8], node: NodeId) -> bool {
        let claimed = PacketHeader::read_from_prefix(bytes)
            .ok()
            .map(|(header, _)| header.src_node);
        match claimed {
            Some(claimed) if claimed != node => match self.key {
                Some(key) => key.open(bytes).is_some(),
                // Without authentication anyone may write any header: the address is all
                // there is to go by.
                None => true,
            },
            // Names the node at its address, or names none: the NIC checks it.
            _ => false,
        }
    }
}

/// The receive buffer [`Wire::receive_udp`] needs: one byte more than the longest packet, so a
/// longer datagram shows as one.
pub(crate) const RECEIVE_BUFFER: usize = shared_abi::packet::MAX_WIRE_LEN + 1;

/// Binds the UDP socket of a NIC at `address`, non-blocking, with room for bursts.
pub(crate) fn bind_udp(address: SocketAddr) -> io::Result<UdpSocket> {
    let socket = UdpSocket::bind(address)?;
    socket.set_nonblocking(true)?;
    let _ = nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBuf, &(4 << 20));
    let _ = nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::SndBuf, &(4 << 20));
    Ok(socket)
}

/// How long to sleep at most while a UDP send is blocked.
pub(crate) const BLOCKED_RETRY: Duration = Duration::from_millis(1);

#[cfg(test)]
mod tests {
    use super::*;
    use shared_abi::packet::PacketKind;

    /// A packet of `kind` from `source` to node 1, with the code `key` gives it (a made-up one
    /// without a key).
    fn packet(source: u16, key: Option<&FabricKey>) -> Vec<u8> {
        let header = PacketHeader::new(PacketKind::DATA, NodeId::new(source), NodeId::new(1));
        let mut out = vec![0u8; shared_abi::packet::MAX_WIRE_LEN];
        let len = header.emit(&[], &mut out).unwrap();
        out.truncate(len);
        let tag = key.map_or([0x5a; firmware::auth::MAC_LEN], |key| key.tag(&out));
        out.extend_from_slice(&tag);
        out
    }

    #[test]
    fn a_recycled_buffer_carries_the_next_packet_and_only_it() {
        let inbox = Inbox::new(Arc::new(ThreadWake::new(doorbell::new().unwrap())));
        assert!(inbox.push(&[1; 4096]));
        let mut taken = VecDeque::new();
        inbox.take_all(&mut taken);
        let first = taken.pop_front().unwrap();
        let reused = first.as_ptr();
        inbox.recycle(first);
        // A shorter packet in the buffer of a longer one: nothing of the old one stays.
        assert!(inbox.push(&[2; 100]));
        inbox.take_all(&mut taken);
        let second = taken.pop_front().unwrap();
        assert_eq!(second, [2; 100]);
        assert_eq!(
            second.as_ptr(),
            reused,
            "the buffer came back for the next packet"
        );
        for _ in 0..SPARE_BUFFERS + 1 {
            inbox.recycle(vec![0; 8]);
        }
        assert_eq!(inbox.spares.len(), SPARE_BUFFERS, "the pool is bounded");
        // A long packet's buffer goes back to a pool of its own, bounded too, and serves the
        // next long packet, never a short one.
        for _ in 0..SPARE_LONG_BUFFERS + 1 {
            inbox.recycle(vec![0; MAX_WIRE_LEN + 1]);
        }
        assert_eq!(inbox.long_spares.len(), SPARE_LONG_BUFFERS);
        assert!(inbox.spare(100).capacity() <= MAX_WIRE_LEN);
        assert!(inbox.spare(MAX_WIRE_LEN + 1).capacity() > MAX_WIRE_LEN);
    }

    #[test]
    fn a_claim_of_another_node_counts_as_spoofed_only_with_a_right_code() {
        let key = FabricKey::new([7; 32]);
        let wire_socket = bind_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let node_zero = UdpSocket::bind("127.0.0.1:0").unwrap();
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = wire_socket.local_addr().unwrap();
        let mut fabric = FabricMap::new();
        fabric.insert(NodeId::new(0), node_zero.local_addr().unwrap());
        fabric.insert(NodeId::new(1), to);
        let mut wire = Wire::new(
            NodeId::new(1),
            Arc::new(LocalFabric::default()),
            Some(wire_socket),
            Arc::new(fabric),
            None,
            Some(key),
        );
        let sent: [(&str, Vec<u8>); 5] = [
            ("an empty datagram", Vec::new()),
            ("node 5 claimed, made-up code", packet(5, None)),
            ("node 5 claimed, right code", packet(5, Some(&key))),
            ("node 0 from its own address", packet(0, Some(&key))),
            ("too short for a header", vec![1, 2, 3]),
        ];
        for (_, datagram) in &sent {
            node_zero.send_to(datagram, to).unwrap();
        }
        stranger.send_to(&packet(0, Some(&key)), to).unwrap();
        let mut batch = ReceiveBatch::new(RECEIVE_BUFFER);
        let mut accepted = Vec::new();
        let mut handed = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let dropped = |wire: &Wire| (wire.counters.spoofed + wire.counters.strangers) as usize;
        while handed.len() + dropped(&wire) < sent.len() + 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "datagrams missing: {:?}",
                wire.counters
            );
            wire.receive_udp(&mut batch, &mut accepted);
            for &index in &accepted {
                handed.push(batch.datagram(index).unwrap().0.to_vec());
            }
        }
        assert_eq!(wire.counters.spoofed, 1, "only the claim with a right code");
        assert_eq!(wire.counters.strangers, 1);
        assert_eq!(wire.counters.received, 4);
        // The rest go to the NIC, whose check of the code drops all but node 0's packet
        // (counted `unauthenticated`): an empty datagram is counted there too.
        let expected: Vec<Vec<u8>> = [0, 1, 3, 4].iter().map(|&i| sent[i].1.clone()).collect();
        assert_eq!(handed, expected);
        let authentic = handed.iter().filter(|d| key.open(d).is_some()).count();
        assert_eq!(authentic, 1);
    }
}
