//! Unit tests of the NIC's state machines against a fake host and a fake wire.
//!
//! The fake other side lives here. [`TestMemory`] is a port region in plain memory (safe code:
//! the firmware crate forbids `unsafe`); [`FakeHost`] is the process on one port — it writes the
//! region header, posts tokens with the ABI's ring [`Producer`]s and reads events with its
//! [`Consumer`]; [`FakeWire`] is the board, which keeps the regions and records every transmitted
//! packet (checking that the firmware only ever transmits well-formed packets). [`Net`] holds a
//! few NICs and one clock, and moves packets between them only when a test says so — deliver all
//! of them ([`Net::run`]), or drop, duplicate and reorder them by hand — so every test is
//! deterministic: no threads, no real clock, time only ever moves through [`Net::advance`] and
//! [`Net::run_until`].

extern crate std;

mod barrier;
mod broadcast;
mod kept;
mod poll;
mod ports;
mod properties;
mod rdma;
mod recv;
mod reduce;
mod remote;
mod sdma;
mod segment;
mod send;
mod session;

use core::cell::Cell;
use core::time::Duration;
use std::boxed::Box;
use std::vec::Vec;

use shared_abi::event::{Event, EventKind, Status};
use shared_abi::ids::{Generation, NodeId, PORTS_PER_NIC, PortId};
use shared_abi::packet::{Packet, PacketHeader, PacketKind};
use shared_abi::region::{RegionHeader, RegionLayout};
use shared_abi::ring::{
    Consumer, OutOfBounds, Producer, RingIndexes, SharedMemory, Wake, check_range,
};
use shared_abi::schedule::{Step, StepOp};
use shared_abi::token::{Priority, ReceiveKind, ReceiveToken, SendKind, SendToken};
use zerocopy::IntoBytes;

use crate::{Config, Hal, Instant, Nic, OpenError, TransmitError};

/// A port region in plain memory. Single-threaded, so an acquire load and a release store are a
/// plain read and write of the little-endian word.
pub(crate) struct TestMemory {
    bytes: Box<[Cell<u8>]>,
}

impl TestMemory {
    pub(crate) fn new(len: usize) -> Self {
        Self {
            bytes: (0..len).map(|_| Cell::new(0)).collect(),
        }
    }

    fn word_range(&self, offset: usize) -> Result<core::ops::Range<usize>, OutOfBounds> {
        check_range(self.bytes.len(), offset, 4)?;
        if offset % 4 != 0 {
            return Err(OutOfBounds { offset, len: 4 });
        }
        Ok(offset..offset + 4)
    }
}

impl SharedMemory for TestMemory {
    fn len(&self) -> usize {
        self.bytes.len()
    }

    fn load_acquire(&self, offset: usize) -> Result<u32, OutOfBounds> {
        let mut word = [0u8; 4];
        for (byte, cell) in word.iter_mut().zip(&self.bytes[self.word_range(offset)?]) {
            *byte = cell.get();
        }
        Ok(u32::from_le_bytes(word))
    }

    fn store_release(&self, offset: usize, value: u32) -> Result<(), OutOfBounds> {
        for (cell, byte) in self.bytes[self.word_range(offset)?]
            .iter()
            .zip(value.to_le_bytes())
        {
            cell.set(byte);
        }
        Ok(())
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds> {
        check_range(self.bytes.len(), offset, out.len())?;
        for (byte, cell) in out.iter_mut().zip(&self.bytes[offset..]) {
            *byte = cell.get();
        }
        Ok(())
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        check_range(self.bytes.len(), offset, data.len())?;
        for (cell, byte) in self.bytes[offset..].iter().zip(data) {
            cell.set(*byte);
        }
        Ok(())
    }
}

/// A packet the firmware put on the wire.
#[derive(Clone, Debug)]
pub(crate) struct WirePacket {
    /// The node the firmware addressed it to.
    pub(crate) to: NodeId,
    pub(crate) bytes: Vec<u8>,
    /// Sent on a route that never leaves the board ([`Hal::local_route`]): handed to
    /// [`crate::Nic::on_local_packet`].
    pub(crate) local: bool,
}

/// The packet in `bytes`, with or without an authentication code after it (a put's segment
/// longer than a wire's only without: it never left the board).
pub(crate) fn uncoded(bytes: &[u8]) -> Result<&[u8], shared_abi::packet::PacketError> {
    match Packet::new_checked_local(bytes) {
        Ok(_) => Ok(bytes),
        Err(error) => {
            let split = bytes.len().saturating_sub(shared_abi::packet::MAC_LEN);
            Packet::new_checked(&bytes[..split])
                .map(|_| &bytes[..split])
                .map_err(|_| error)
        }
    }
}

impl WirePacket {
    pub(crate) fn header(&self) -> PacketHeader {
        *Packet::new_checked_local(
            uncoded(&self.bytes).expect("recorded packets were checked on transmit"),
        )
        .expect("recorded packets were checked on transmit")
        .header()
    }

    pub(crate) fn payload(&self) -> &[u8] {
        let packet = uncoded(&self.bytes).expect("recorded packets were checked on transmit");
        &packet[shared_abi::packet::HEADER_LEN..]
    }

    pub(crate) fn kind(&self) -> PacketKind {
        self.header().kind
    }

    pub(crate) fn seq(&self) -> u32 {
        self.header().seq.get()
    }
}

/// The board: port regions, and a wire that records what is transmitted.
pub(crate) struct FakeWire {
    node: NodeId,
    regions: [Option<TestMemory>; PORTS_PER_NIC],
    /// Packets transmitted and not yet taken by the test.
    pub(crate) outbox: Vec<WirePacket>,
    /// Every packet ever transmitted (the outbox empties, this does not).
    pub(crate) transmitted: usize,
    /// While set, `transmit` refuses with [`TransmitError::WouldBlock`].
    pub(crate) blocked: bool,
    pub(crate) doorbells: [u32; PORTS_PER_NIC],
    /// The ordinary memory of each port's process: [`PROCESS_BASE`] is its first address.
    pub(crate) process: [Vec<u8>; PORTS_PER_NIC],
    /// Whether every route is local ([`Hal::local_route`]).
    pub(crate) local: bool,
    /// Whether the board builds puts' packets itself on every (local) route
    /// ([`Hal::gathers_toward`]).
    pub(crate) gathers: bool,
}

/// The first virtual address of a fake process's memory.
pub(crate) const PROCESS_BASE: u64 = 0x7f00_0000_0000;

impl FakeWire {
    fn process_range(
        &self,
        port: usize,
        address: u64,
        len: usize,
    ) -> Option<core::ops::Range<usize>> {
        let start = usize::try_from(address.checked_sub(PROCESS_BASE)?).ok()?;
        let end = start.checked_add(len)?;
        (end <= self.process.get(port)?.len()).then_some(start..end)
    }

    fn new(node: NodeId) -> Self {
        Self {
            node,
            regions: Default::default(),
            outbox: Vec::new(),
            transmitted: 0,
            blocked: false,
            doorbells: [0; PORTS_PER_NIC],
            process: Default::default(),
            local: false,
            gathers: false,
        }
    }

    pub(crate) fn map(&mut self, port: usize, memory: TestMemory) {
        self.regions[port] = Some(memory);
    }

    pub(crate) fn unmap(&mut self, port: usize) {
        self.regions[port] = None;
    }
}

impl Hal for FakeWire {
    type Memory = TestMemory;

    fn port_memory(&self, port: usize) -> Option<&TestMemory> {
        self.regions.get(port)?.as_ref()
    }

    fn transmit(&mut self, destination: NodeId, packet: &[u8]) -> Result<(), TransmitError> {
        if self.blocked {
            return Err(TransmitError::WouldBlock);
        }
        let header = *uncoded(packet)
            .and_then(Packet::new_checked)
            .unwrap_or_else(|error| panic!("the firmware transmitted a malformed packet: {error}"))
            .header();
        assert_eq!(
            header.src_node, self.node,
            "packet names another source node"
        );
        assert_eq!(
            header.dst_node, destination,
            "packet addressed to another node"
        );
        self.outbox.push(WirePacket {
            to: destination,
            bytes: packet.to_vec(),
            local: self.local,
        });
        self.transmitted += 1;
        Ok(())
    }

    fn local_route(&self, _destination: NodeId) -> bool {
        self.local
    }

    fn gathers_toward(&self, _destination: NodeId) -> bool {
        self.gathers
    }

    fn transmit_gathered(
        &mut self,
        destination: NodeId,
        head: &[u8],
        source: crate::Gather,
    ) -> Result<(), crate::GatherError> {
        assert!(
            self.gathers,
            "gathered toward a node the board does not gather for"
        );
        if self.blocked {
            return Err(crate::GatherError::Transmit(TransmitError::WouldBlock));
        }
        let mut packet = head.to_vec();
        packet.resize(head.len() + source.len, 0);
        let data = &mut packet[head.len()..];
        match source.from {
            crate::GatherFrom::Process { address, ahead, .. } => {
                assert!(ahead >= source.len);
                self.read_process_memory(source.port, address, data)
            }
            crate::GatherFrom::Region { offset } => match self.port_memory(source.port) {
                Some(memory) => memory
                    .read(offset, data)
                    .map_err(|_| crate::MemoryFault::Refused),
                None => Err(crate::MemoryFault::Refused),
            },
        }
        .map_err(crate::GatherError::Memory)?;
        let header = *Packet::new_checked_local(&packet[..])
            .unwrap_or_else(|error| panic!("the firmware gathered a malformed packet: {error}"))
            .header();
        assert_eq!(header.src_node, self.node);
        assert_eq!(header.dst_node, destination);
        self.outbox.push(WirePacket {
            to: destination,
            bytes: packet,
            local: true,
        });
        self.transmitted += 1;
        Ok(())
    }

    fn notify_host(&mut self, port: usize) {
        self.doorbells[port] += 1;
    }

    fn read_process_memory(
        &mut self,
        port: usize,
        address: u64,
        out: &mut [u8],
    ) -> Result<(), crate::MemoryFault> {
        let range = self
            .process_range(port, address, out.len())
            .ok_or(crate::MemoryFault::Refused)?;
        out.copy_from_slice(&self.process[port][range]);
        Ok(())
    }

    fn write_process_memory(
        &mut self,
        port: usize,
        address: u64,
        data: &[u8],
    ) -> Result<(), crate::MemoryFault> {
        let range = self
            .process_range(port, address, data.len())
            .ok_or(crate::MemoryFault::Refused)?;
        self.process[port][range].copy_from_slice(data);
        Ok(())
    }
}

/// The shape of a port region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub(crate) send_entries: u32,
    pub(crate) receive_entries: u32,
    pub(crate) event_entries: u32,
    pub(crate) arena_len: usize,
}

impl Default for Shape {
    fn default() -> Self {
        // A send ring larger than `port::SEND_TOKENS`, so back-pressure is the NIC's, not the
        // ring's.
        Self {
            send_entries: 64,
            receive_entries: 64,
            event_entries: 128,
            arena_len: 64 * 1024,
        }
    }
}

impl Shape {
    pub(crate) fn layout(&self) -> RegionLayout {
        RegionLayout::standard(
            self.send_entries,
            self.receive_entries,
            self.event_entries,
            self.arena_len,
        )
    }
}

/// The process on one port: the host side of its three rings.
pub(crate) struct FakeHost {
    pub(crate) layout: RegionLayout,
    send: Producer<SendToken>,
    receive: Producer<ReceiveToken>,
    events: Consumer<Event>,
}

impl FakeHost {
    fn new(layout: RegionLayout) -> Self {
        Self {
            layout,
            send: Producer::new(layout.send_ring, 0),
            receive: Producer::new(layout.receive_ring, 0),
            events: Consumer::new(layout.event_ring, 0),
        }
    }

    /// A region of this layout with its header written, as the driver writes it before open.
    pub(crate) fn region(layout: &RegionLayout, header: &RegionHeader) -> TestMemory {
        let memory = TestMemory::new(layout.region_len);
        memory.write(0, header.as_bytes()).unwrap();
        memory
    }
}

/// One NIC and the processes on its ports.
pub(crate) struct Node {
    pub(crate) nic: Nic<FakeWire>,
    hosts: [Option<FakeHost>; PORTS_PER_NIC],
    /// Packets to a silent node vanish on the wire (it is switched off or unplugged).
    pub(crate) silent: bool,
}

impl Node {
    fn new(id: u16, config: Config) -> Self {
        Self::booted(id, config, 0)
    }

    /// Node `id` in its boot number `boot` (each boot has its own boot stamp and entropy).
    fn booted(id: u16, config: Config, boot: u8) -> Self {
        let node = NodeId::new(id);
        let mut entropy = [id as u8; 16];
        entropy[15] = boot;
        Self {
            nic: Nic::new(
                FakeWire::new(node),
                node,
                config,
                u32::from(id) + 1 + u32::from(boot) * 100,
                entropy,
            ),
            hosts: Default::default(),
            silent: false,
        }
    }

    pub(crate) fn id(&self) -> NodeId {
        self.nic.node()
    }

    /// Polls the NIC at `now` and checks what [`Nic::poll`] promises: once it returns, whatever
    /// was due at `now` is done, so [`Nic::poll_at`] names no instant that is not after `now`.
    pub(crate) fn poll(&mut self, now: Instant) -> bool {
        let busy = self.nic.poll(now);
        assert!(
            self.nic.work_sets_agree(),
            "{}: a work set disagrees with the work it stands for (`Nic::work_sets_agree`)",
            self.id()
        );
        let at = self.nic.poll_at();
        assert!(
            at.is_none_or(|at| at > now),
            "{}: after poll({now:?}) the NIC asks to be polled at {at:?}, which is not after now",
            self.id()
        );
        // The emulator skips the polls that follow one that found nothing, until a packet, a
        // call, `poll_at` or work a process posted: none may be owed anything.
        if !busy && !self.wire().blocked && !self.nic.host_work_waiting() {
            assert!(
                !self.nic.poll(now),
                "{}: a poll at {now:?} found nothing to do, no process had posted anything, and \
                 yet the next poll did something",
                self.id()
            );
        }
        busy
    }

    pub(crate) fn wire(&mut self) -> &mut FakeWire {
        self.nic.hal_mut()
    }

    fn memory(&self, port: u8) -> &TestMemory {
        self.nic
            .hal()
            .port_memory(usize::from(port))
            .expect("the port has a region mapped")
    }

    fn host(&mut self, port: u8) -> (&TestMemory, &mut FakeHost) {
        let host = self.hosts[usize::from(port)]
            .as_mut()
            .expect("a process holds the port");
        let memory = self
            .nic
            .hal()
            .port_memory(usize::from(port))
            .expect("the port has a region mapped");
        (memory, host)
    }

    /// Maps a fresh region of `shape` for `port`, with the header the driver would write after
    /// `edit` (to break it), and asks the NIC to open the port.
    pub(crate) fn try_open_with_header(
        &mut self,
        port: u8,
        shape: Shape,
        edit: impl FnOnce(&mut RegionHeader),
        now: Instant,
    ) -> Result<Generation, OpenError> {
        let layout = shape.layout();
        let mut header = layout.header(self.id(), PortId(port), 0, Generation::new(0));
        edit(&mut header);
        self.wire()
            .map(usize::from(port), FakeHost::region(&layout, &header));
        let opened = self.nic.open_port(PortId(port), now);
        if opened.is_ok() {
            self.hosts[usize::from(port)] = Some(FakeHost::new(layout));
        }
        opened
    }

    /// The process on `port` exits: the NIC closes the port, then the board unmaps its region.
    pub(crate) fn close(&mut self, port: u8, now: Instant) -> Option<Generation> {
        let closed = self.nic.close_port(PortId(port), now);
        self.wire().unmap(usize::from(port));
        self.hosts[usize::from(port)] = None;
        closed
    }

    pub(crate) fn post_send(&mut self, port: u8, token: &SendToken) {
        let (memory, host) = self.host(port);
        host.send.push(memory, token).expect("send ring has room");
    }

    pub(crate) fn post_receive(&mut self, port: u8, token: &ReceiveToken) {
        let (memory, host) = self.host(port);
        host.receive
            .push(memory, token)
            .expect("receive ring has room");
    }

    /// Offers a buffer of `size` and `priority` at arena offset `buffer` (GM's
    /// `gm_provide_receive_buffer_with_tag`), filled with a marker so a test can tell whether the
    /// NIC wrote it.
    pub(crate) fn provide_buffer(
        &mut self,
        port: u8,
        size: u8,
        priority: Priority,
        buffer: u64,
        tag: u32,
    ) {
        let length = shared_abi::max_length_for_size(size) as usize;
        self.write_arena(port, buffer, &std::vec![UNTOUCHED; length]);
        self.post_receive(port, &buffer_token(size, priority, buffer, tag));
    }

    /// `gm_provide_barrier_buffer`.
    pub(crate) fn provide_barrier_buffer(&mut self, port: u8) {
        self.post_receive(
            port,
            &ReceiveToken {
                kind: ReceiveKind::BARRIER,
                ..ReceiveToken::default()
            },
        );
    }

    /// Writes `steps` at arena offset `SCHEDULE_AT` and posts a barrier token for them (after a
    /// barrier buffer: `gm_provide_barrier_buffer` then `gm_barrier_send_with_callback`).
    pub(crate) fn start_barrier(
        &mut self,
        port: u8,
        steps: &[Step],
        context: u64,
        timeout_us: u32,
    ) {
        self.provide_barrier_buffer(port);
        self.post_barrier_token(port, steps, context, timeout_us);
    }

    /// As [`Node::start_barrier`], for barrier `barrier` (job, group, sequence).
    pub(crate) fn start_barrier_of(
        &mut self,
        port: u8,
        steps: &[Step],
        context: u64,
        timeout_us: u32,
        barrier: shared_abi::ids::BarrierId,
    ) {
        self.provide_barrier_buffer(port);
        self.post_barrier_token_of(port, steps, context, timeout_us, barrier);
    }

    /// Writes `steps` into the arena and posts the barrier token alone.
    pub(crate) fn post_barrier_token(
        &mut self,
        port: u8,
        steps: &[Step],
        context: u64,
        timeout_us: u32,
    ) {
        self.post_barrier_token_of(
            port,
            steps,
            context,
            timeout_us,
            shared_abi::ids::BarrierId::NONE,
        );
    }

    /// As [`Node::post_barrier_token`], for barrier `barrier`.
    pub(crate) fn post_barrier_token_of(
        &mut self,
        port: u8,
        steps: &[Step],
        context: u64,
        timeout_us: u32,
        barrier: shared_abi::ids::BarrierId,
    ) {
        self.write_arena(port, SCHEDULE_AT, steps.as_bytes());
        self.post_send(
            port,
            &SendToken {
                kind: SendKind::BARRIER,
                length: (steps.len() as u32).into(),
                buffer: SCHEDULE_AT.into(),
                context: context.into(),
                timeout_us: timeout_us.into(),
                ..SendToken::default()
            }
            .with_barrier_id(barrier),
        );
    }

    /// Writes `steps` and then this member's `data` into the arena and posts a reduction token
    /// for barrier `barrier` combining with `spec` (after a barrier buffer).
    pub(crate) fn start_reduction(
        &mut self,
        port: u8,
        steps: &[Step],
        context: u64,
        barrier: shared_abi::ids::BarrierId,
        spec: shared_abi::reduce::ReduceSpec,
        data: &[u8],
    ) {
        self.provide_barrier_buffer(port);
        self.write_arena(port, SCHEDULE_AT, steps.as_bytes());
        let after = SCHEDULE_AT + core::mem::size_of_val(steps) as u64;
        self.write_arena(port, after, data);
        let mut token = SendToken {
            size: data.len() as u8,
            length: (steps.len() as u32).into(),
            buffer: SCHEDULE_AT.into(),
            context: context.into(),
            ..SendToken::default()
        }
        .with_barrier_id(barrier);
        token.set_reduce_spec(spec);
        self.post_send(port, &token);
    }

    /// Writes `steps` and then `data` into the arena and posts a broadcast token for barrier
    /// `barrier` rooted at `root` (after a barrier buffer).
    pub(crate) fn start_broadcast(
        &mut self,
        port: u8,
        steps: &[Step],
        (context, timeout_us): (u64, u32),
        barrier: shared_abi::ids::BarrierId,
        (root_node, root_port): (u16, u8),
        data: &[u8],
    ) {
        self.provide_barrier_buffer(port);
        self.write_arena(port, SCHEDULE_AT, steps.as_bytes());
        let after = SCHEDULE_AT + core::mem::size_of_val(steps) as u64;
        self.write_arena(port, after, data);
        self.post_send(
            port,
            &SendToken {
                kind: SendKind::BROADCAST,
                size: data.len() as u8,
                target_node: NodeId::new(root_node),
                target_port: PortId(root_port),
                length: (steps.len() as u32).into(),
                buffer: SCHEDULE_AT.into(),
                context: context.into(),
                timeout_us: timeout_us.into(),
                ..SendToken::default()
            }
            .with_barrier_id(barrier),
        );
    }

    pub(crate) fn write_arena(&mut self, port: u8, offset: u64, bytes: &[u8]) {
        let (memory, host) = self.host(port);
        let at = host
            .layout
            .arena_range(offset, bytes.len())
            .expect("inside the arena");
        memory.write(at, bytes).unwrap();
    }

    pub(crate) fn read_arena(&self, port: u8, offset: u64, len: usize) -> Vec<u8> {
        let layout = self.hosts[usize::from(port)].as_ref().unwrap().layout;
        let at = layout.arena_range(offset, len).expect("inside the arena");
        let mut out = std::vec![0; len];
        self.memory(port).read(at, &mut out).unwrap();
        out
    }

    /// Takes every event the NIC has published on `port`'s event ring.
    pub(crate) fn events(&mut self, port: u8) -> Vec<Event> {
        let (memory, host) = self.host(port);
        let mut events = Vec::new();
        while let Some(event) = host.events.pop(memory).expect("event ring intact") {
            events.push(event);
        }
        events
    }

    /// The process on `port` goes to sleep until its next event: it asks for a doorbell.
    pub(crate) fn sleep(&mut self, port: u8) {
        self.sleep_for(port, Wake::ANY);
    }

    /// The process on `port` goes to sleep asking a doorbell for what `wake` says.
    pub(crate) fn sleep_for(&mut self, port: u8, wake: Wake) {
        let (memory, host) = self.host(port);
        host.events.set_wake(memory, wake).unwrap();
    }

    /// Writes `value` over an index of one of `port`'s rings, as a buggy or hostile process could.
    pub(crate) fn forge_index(&mut self, port: u8, ring: Ring, index: Index, value: u32) {
        let (memory, host) = self.host(port);
        let ring = match ring {
            Ring::Send => host.layout.send_ring,
            Ring::Receive => host.layout.receive_ring,
            Ring::Event => host.layout.event_ring,
        };
        let field = match index {
            Index::Tail => core::mem::offset_of!(RingIndexes, tail),
            Index::Head => core::mem::offset_of!(RingIndexes, head),
        };
        memory.store_release(ring.offset + field, value).unwrap();
    }

    /// The head the NIC published for `port`'s send ring.
    pub(crate) fn send_ring_head(&mut self, port: u8) -> u32 {
        let (memory, host) = self.host(port);
        memory
            .load_acquire(host.layout.send_ring.offset + core::mem::offset_of!(RingIndexes, head))
            .unwrap()
    }

    /// After a `RING_CORRUPT`, the process restarts its send and receive rings where the NIC
    /// resynchronised them (the heads the NIC published).
    pub(crate) fn resynchronise_rings(&mut self, port: u8) {
        let (memory, host) = self.host(port);
        let head = |ring: shared_abi::ring::RingLayout| {
            memory
                .load_acquire(ring.offset + core::mem::offset_of!(RingIndexes, head))
                .unwrap()
        };
        host.send = Producer::new(host.layout.send_ring, head(host.layout.send_ring));
        host.receive = Producer::new(host.layout.receive_ring, head(host.layout.receive_ring));
    }

    /// Takes the packets the NIC transmitted since the last call.
    pub(crate) fn take_outbox(&mut self) -> Vec<WirePacket> {
        core::mem::take(&mut self.wire().outbox)
    }
}

pub(crate) enum Ring {
    Send,
    Receive,
    Event,
}

pub(crate) enum Index {
    Tail,
    Head,
}

/// What the fake host writes into a receive buffer before offering it.
pub(crate) const UNTOUCHED: u8 = 0xee;
/// Arena offset where barrier schedules are written (well clear of the message buffers tests
/// use).
pub(crate) const SCHEDULE_AT: u64 = 60 * 1024;

/// A few NICs on one wire, and the clock.
pub(crate) struct Net {
    pub(crate) nodes: Vec<Node>,
    pub(crate) now: Instant,
}

impl core::ops::Index<u16> for Net {
    type Output = Node;
    fn index(&self, node: u16) -> &Node {
        &self.nodes[usize::from(node)]
    }
}

impl core::ops::IndexMut<u16> for Net {
    fn index_mut(&mut self, node: u16) -> &mut Node {
        &mut self.nodes[usize::from(node)]
    }
}

/// Rounds of [`Net::run`] after which the wire is declared livelocked.
const MAX_ROUNDS: usize = 10_000;

impl Net {
    /// Nodes `0..nodes` with the default configuration, at time zero.
    pub(crate) fn new(nodes: u16) -> Self {
        Self::with_config(nodes, Config::default())
    }

    pub(crate) fn with_config(nodes: u16, config: Config) -> Self {
        Self {
            nodes: (0..nodes).map(|id| Node::new(id, config)).collect(),
            now: Instant::from_nanos(1_000_000),
        }
    }

    /// Opens `port` of `node` with the default region shape.
    pub(crate) fn open(&mut self, node: u16, port: u8) -> Generation {
        self.open_with(node, port, Shape::default())
    }

    pub(crate) fn open_with(&mut self, node: u16, port: u8, shape: Shape) -> Generation {
        let now = self.now;
        self[node]
            .try_open_with_header(port, shape, |_| {}, now)
            .unwrap_or_else(|error| panic!("open of node {node} port {port}: {error}"))
    }

    pub(crate) fn close(&mut self, node: u16, port: u8) -> Option<Generation> {
        let now = self.now;
        self[node].close(port, now)
    }

    /// Restarts `node`: a new NIC (its boot number `boot`) with the same configuration and no
    /// open ports.
    pub(crate) fn restart(&mut self, node: u16, boot: u8) {
        let config = *self[node].nic.config();
        self.nodes[usize::from(node)] = Node::booted(node, config, boot);
    }

    /// Polls `node` now and takes what it transmitted.
    pub(crate) fn poll(&mut self, node: u16) -> Vec<WirePacket> {
        let now = self.now;
        self[node].poll(now);
        self[node].take_outbox()
    }

    /// Hands `packet` to its destination (then polls the destination, as `on_packet` asks, so
    /// acks and events are due; what the destination transmits stays in its outbox). A packet
    /// for a silent or absent node is lost.
    pub(crate) fn deliver(&mut self, packet: &WirePacket) {
        let now = self.now;
        let Some(node) = self.nodes.iter_mut().find(|n| n.id() == packet.to) else {
            return;
        };
        if node.silent {
            return;
        }
        if packet.local {
            node.nic.on_local_packet(&packet.bytes, now);
        } else {
            node.nic.on_packet(&packet.bytes, now);
        }
        node.poll(now);
    }

    /// Rings `node`'s doorbell: the NIC polls now (takes the tokens just posted). What it
    /// transmits stays in its outbox.
    pub(crate) fn doorbell(&mut self, node: u16) {
        let now = self.now;
        self[node].poll(now);
    }

    /// Hands raw bytes to `node`.
    pub(crate) fn inject(&mut self, node: u16, bytes: &[u8]) {
        let now = self.now;
        self[node].nic.on_packet(bytes, now);
        self[node].poll(now);
    }

    /// Polls every node and delivers everything they transmit, until the wire is quiet at this
    /// instant. Returns the packets carried.
    pub(crate) fn run(&mut self) -> Vec<WirePacket> {
        let mut carried = Vec::new();
        for _ in 0..MAX_ROUNDS {
            let mut moving = Vec::new();
            for node in 0..self.nodes.len() as u16 {
                moving.extend(self.poll(node));
            }
            if moving.is_empty() {
                return carried;
            }
            for packet in &moving {
                self.deliver(packet);
            }
            carried.extend(moving);
        }
        panic!(
            "the wire is still busy after {MAX_ROUNDS} rounds at {:?}",
            self.now
        );
    }

    pub(crate) fn advance(&mut self, by: Duration) {
        self.now = self.now.saturating_add(by);
    }

    /// Runs the wire and every timer that falls due until `until`, jumping from one deadline the
    /// NICs ask for ([`Nic::poll_at`]) to the next; ends at `until`. Returns the packets carried.
    pub(crate) fn run_until(&mut self, until: Instant) -> Vec<WirePacket> {
        let mut carried = self.run();
        for _ in 0..MAX_ROUNDS {
            let next = self
                .nodes
                .iter()
                .filter_map(|node| node.nic.poll_at())
                .min();
            match next {
                Some(at) if at <= until => {
                    // Every node was just polled at `now` with nothing left to do: a deadline
                    // that is not after `now` is one the firmware will never clear.
                    assert!(
                        at > self.now,
                        "a NIC asks to be polled at {at:?}, not after now ({:?}), with nothing to do",
                        self.now
                    );
                    self.now = at;
                    carried.extend(self.run());
                }
                _ => {
                    self.now = until;
                    carried.extend(self.run());
                    return carried;
                }
            }
        }
        panic!("timers still firing after {MAX_ROUNDS} deadlines before {until:?}");
    }

    /// [`Net::run_until`] `now + by`.
    pub(crate) fn run_for(&mut self, by: Duration) -> Vec<WirePacket> {
        let until = self.now.saturating_add(by);
        self.run_until(until)
    }
}

/// A data send token.
pub(crate) fn data_token(
    target_node: u16,
    target_port: u8,
    size: u8,
    priority: Priority,
    length: u32,
    buffer: u64,
    context: u64,
) -> SendToken {
    SendToken {
        kind: SendKind::DATA,
        priority,
        size,
        target_node: NodeId::new(target_node),
        target_port: PortId(target_port),
        length: length.into(),
        buffer: buffer.into(),
        context: context.into(),
        ..SendToken::default()
    }
}

/// A receive buffer token.
pub(crate) fn buffer_token(size: u8, priority: Priority, buffer: u64, tag: u32) -> ReceiveToken {
    ReceiveToken {
        kind: ReceiveKind::BUFFER,
        priority,
        size,
        tag: tag.into(),
        buffer: buffer.into(),
        ..ReceiveToken::default()
    }
}

/// One pairwise-exchange step with `(node, port)` in `round`.
pub(crate) fn exchange(node: u16, port: u8, round: u8) -> Step {
    Step::new(StepOp::EXCHANGE, NodeId::new(node), PortId(port), round)
}

/// Distinct, recognisable payload bytes for message `n`.
pub(crate) fn payload(n: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| n.wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

/// The events of `kind` among `events`.
pub(crate) fn of_kind(events: &[Event], kind: EventKind) -> Vec<Event> {
    events.iter().filter(|e| e.kind == kind).copied().collect()
}

/// The `(kind, status, context)` of each event, for compact assertions.
pub(crate) fn summary(events: &[Event]) -> Vec<(EventKind, Status, u64)> {
    events
        .iter()
        .map(|e| (e.kind, e.status, e.context.get()))
        .collect()
}

/// Sends message `n` (`len` bytes of [`payload`]) from `(from_node, from_port)` to
/// `(to_node, to_port)` with size class 8, low priority, from arena slot `n` (256 bytes each),
/// context `n`.
pub(crate) fn send_message(
    net: &mut Net,
    (from_node, from_port): (u16, u8),
    (to_node, to_port): (u16, u8),
    n: u8,
    len: usize,
) {
    let buffer = u64::from(n) * 256;
    net[from_node].write_arena(from_port, buffer, &payload(n, len));
    net[from_node].post_send(
        from_port,
        &data_token(
            to_node,
            to_port,
            8,
            Priority::LOW,
            len as u32,
            buffer,
            u64::from(n),
        ),
    );
}

/// Offers `count` buffers of size class 8, low priority, at arena offsets `32 KiB + i * 256`,
/// tagged `i`, on `(node, port)`, and rings the doorbell so the NIC takes them.
pub(crate) fn provide_buffers(net: &mut Net, (node, port): (u16, u8), count: u32) {
    for tag in 0..count {
        net[node].provide_buffer(
            port,
            8,
            Priority::LOW,
            RECEIVE_AREA + u64::from(tag) * 256,
            tag,
        );
    }
    net.doorbell(node);
}

/// Arena offset of the receive buffers [`provide_buffers`] offers.
pub(crate) const RECEIVE_AREA: u64 = 32 * 1024;

/// Runs every node of `net` over a lossy wire: each packet is lost, duplicated or held back
/// one round with the odds `percent` each, drawn from `seed`, calling `between` after every round,
/// until the wire is quiet and no timer falls due before `limit`.
pub(crate) fn run_lossy(
    net: &mut Net,
    seed: u64,
    percent: u64,
    limit: Duration,
    between: &mut dyn FnMut(&mut Net),
) {
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % 100
    };
    let end = net.now.saturating_add(limit);
    let nodes = net.nodes.len() as u16;
    let mut held: Vec<WirePacket> = Vec::new();
    for _ in 0..200_000 {
        between(net);
        let mut moving = Vec::new();
        for node in 0..nodes {
            moving.extend(net.poll(node));
        }
        let late = core::mem::take(&mut held);
        if moving.is_empty() && late.is_empty() {
            match net.nodes.iter().filter_map(|n| n.nic.poll_at()).min() {
                Some(at) if at <= end => {
                    net.now = at.max(net.now);
                    continue;
                }
                _ => return,
            }
        }
        for packet in moving {
            let roll = next();
            if roll < percent {
                continue;
            } else if roll < 2 * percent {
                net.deliver(&packet);
                net.deliver(&packet);
            } else if roll < 3 * percent {
                held.push(packet);
            } else {
                net.deliver(&packet);
            }
        }
        for packet in late {
            net.deliver(&packet);
        }
        net.advance(Duration::from_micros(20));
    }
    panic!("the lossy wire of seed {seed} never went quiet");
}
