//! The firmware's [`Hal`] on this board: port regions are the PCI windows the host's memfds
//! appear in, the wire is the packet rings in the shared area (or, when the host asks for it, UDP
//! datagrams through the virtio-net device, [`crate::virtio_net`], with ARP to find the peers'
//! MACs and answer for this node's address: `shared_abi::qemu::neighbour`), and the host's
//! doorbells are bytes on the UART.
#![allow(
    unsafe_code,
    reason = "wrapping the port windows and the shared area as raw memory"
)]

use core::ptr::NonNull;
use core::time::Duration;

use firmware::{Hal, MemoryFault, TransmitError};
use shared_abi::ids::{NodeId, PORTS_PER_NIC};
use shared_abi::packet::{MAX_WIRE_LEN, PacketHeader};
use shared_abi::qemu::layout::{
    DOORBELL_MEMORY, DOORBELL_PORT_EVENT, DOORBELL_WIRE, MEMORY_BOUNCE_LEN, MEMORY_BOUNCE_OFFSET,
    MemoryDirection, MemoryStatus, PortError, SHARED_AREA_BASE, SHARED_AREA_LEN, WIRE_RECEIVE,
    WIRE_TRANSMIT, offsets,
};
use shared_abi::qemu::wire::{PacketConsumer, PacketProducer};
use shared_abi::region::{RegionHeader, RegionLayout};
use shared_abi::ring::raw::RawMemory;
use shared_abi::ring::{Consumer, RingError, SharedMemory};
use shared_abi::token::{ReceiveToken, SendToken};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use shared_abi::qemu::neighbour::{Neighbours, Resolution};
use shared_abi::qemu::net::{
    self, ARP_LEN, Arp, ArpOperation, ETHERNET_HEADER_LEN, Endpoint, FABRIC_UDP_PORT, Frame,
    MAX_FRAME_LEN, MacAddress, address_node, build_arp, build_udp, node_address, node_mac,
};

use crate::clint::MachineTimer;
use crate::pci::PortWindows;
use crate::uart::Ns16550;
use crate::virtio_net::{self, VirtioNet};

/// How long the core waits for the host to answer one process-memory access before it reports
/// a fault (the NIC does nothing else meanwhile: the core's calls are synchronous).
const MEMORY_TIMEOUT: Duration = Duration::from_secs(1);
/// How often, while it waits, the core rings the host again (in case the UART dropped the
/// doorbell byte).
const MEMORY_DOORBELL_AGAIN: Duration = Duration::from_millis(5);
/// How long the core spins on the answer before it waits for an interrupt: a QEMU vCPU that
/// spins takes a host CPU from the very thread that would answer it.
const MEMORY_SPIN: Duration = Duration::from_micros(20);
/// Neighbours whose MAC addresses the board keeps (one per peer of a QEMU fabric of a handful of
/// nodes; a larger fabric replaces entries in turn and asks again).
const NEIGHBOURS: usize = 16;

/// The shared area: the mailbox and the wire rings.
pub(crate) fn shared_area() -> RawMemory {
    let base = core::ptr::with_exposed_provenance_mut::<u8>(SHARED_AREA_BASE as usize);
    // SAFETY: the shared area is RAM the linker script leaves to the host and the firmware
    // (outside the image, .bss and stack), page-aligned, mapped for the whole run; the host
    // writes it concurrently, which `RawMemory` is built for (atomics and volatile copies only).
    unsafe { RawMemory::new(NonNull::new_unchecked(base), SHARED_AREA_LEN) }
}

/// A port the firmware serves: its window and the layout its header gave.
pub(crate) struct AttachedPort {
    memory: RawMemory,
    layout: RegionLayout,
}

/// What [`BoardHal::take_datagram`] found.
pub(crate) enum Datagram {
    /// Nothing waits.
    None,
    /// A frame for another MAC address (the segment carries every NIC's frames to every NIC):
    /// ignored.
    NotForUs,
    /// A frame that is not a fabric packet for this node (refused by [`net::parse_frame`], for
    /// another address or port, or from an address that is no node): dropped.
    Dropped,
    /// An ARP packet from a node of the fabric: taken into the neighbour table, and answered if
    /// it asked for this node's address.
    Arp,
    /// A packet of this many bytes, copied out; not yet authenticated.
    Packet(usize),
}

/// The board the firmware core runs on.
pub(crate) struct BoardHal {
    node: NodeId,
    node_count: u16,
    /// The wire through virtio-net, when the host asked for it.
    net: Option<VirtioNet>,
    /// The device's MAC address (zero without one).
    mac: MacAddress,
    /// The MAC addresses of the fabric's nodes, learned by ARP.
    neighbours: Neighbours<NEIGHBOURS>,
    /// A frame being built or taken apart.
    frame: [u8; MAX_FRAME_LEN],
    /// The next IPv4 identification.
    identification: u16,
    /// A packet this NIC sent to itself on the virtio-net wire, which no switch turns back (a
    /// bridge never sends a frame out of the port it came in by), and its length (0: none).
    loopback: [u8; MAX_WIRE_LEN],
    loopback_len: usize,
    windows: PortWindows,
    ports: [Option<AttachedPort>; PORTS_PER_NIC],
    shared: RawMemory,
    transmit_ring: PacketProducer,
    receive_ring: PacketConsumer,
    uart: Ns16550<MachineTimer>,
    timer: MachineTimer,
    /// The last process-memory access posted ([`shared_abi::qemu::layout::MemoryAccess::request`]).
    memory_request: u32,
    /// Process-memory accesses the host answered.
    pub(crate) memory_accesses: u32,
    /// Process-memory accesses refused by the host or unanswered in time.
    pub(crate) memory_faults: u32,
    /// Of those, the ones unanswered in time.
    pub(crate) memory_timeouts: u32,
    /// Packets went into the transmit ring since the switch was last offered a doorbell.
    transmitted_since_doorbell: bool,
    /// Packets put into the transmit ring.
    pub(crate) packets_transmitted: u32,
    /// Transmissions refused for a full (or broken) transmit ring.
    pub(crate) transmit_full: u32,
}

impl BoardHal {
    /// The board for a fabric of `node_count` nodes, with the port windows PCI enumeration
    /// found.
    pub(crate) fn new(
        node: NodeId,
        node_count: u16,
        net: Option<VirtioNet>,
        windows: PortWindows,
        uart: Ns16550<MachineTimer>,
        timer: MachineTimer,
    ) -> Self {
        let shared = shared_area();
        // Take up where the mailbox stands (zero in fresh RAM).
        let memory_request = shared.load_acquire(offsets::MEMORY_REQUEST).unwrap_or(0);
        let mac = net.as_ref().map(VirtioNet::mac).unwrap_or_default();
        Self {
            node,
            node_count,
            net,
            mac,
            neighbours: Neighbours::new(),
            frame: [0; MAX_FRAME_LEN],
            identification: 0,
            loopback: [0; MAX_WIRE_LEN],
            loopback_len: 0,
            windows,
            ports: Default::default(),
            shared,
            transmit_ring: PacketProducer::new(WIRE_TRANSMIT),
            receive_ring: PacketConsumer::new(WIRE_RECEIVE),
            uart,
            timer,
            memory_request,
            memory_accesses: 0,
            memory_faults: 0,
            memory_timeouts: 0,
            transmitted_since_doorbell: false,
            packets_transmitted: 0,
            transmit_full: 0,
        }
    }

    /// Whether the wire is virtio-net.
    pub(crate) fn wire_is_virtio_net(&self) -> bool {
        self.net.is_some()
    }

    /// Whether a frame waits on the virtio-net device (or a packet this NIC sent itself);
    /// acknowledges the device's interrupt.
    pub(crate) fn datagram_waiting(&mut self) -> bool {
        let received = self.net.as_mut().is_some_and(|net| {
            net.acknowledge_interrupts();
            net.has_received()
        });
        received || self.loopback_len != 0
    }

    /// Takes the next frame from the virtio-net device and, if it is a fabric datagram for this
    /// node from another node of the fabric, copies its payload into `out`; an ARP packet from a
    /// node of the fabric goes to the neighbour table (and is answered if it asks for this node).
    /// Every frame is checked before any field of it is used ([`net::parse_frame`]).
    pub(crate) fn take_datagram(&mut self, out: &mut [u8]) -> Datagram {
        if self.loopback_len != 0 {
            let len = core::mem::take(&mut self.loopback_len);
            return match (out.get_mut(..len), self.loopback.get(..len)) {
                (Some(slot), Some(packet)) => {
                    slot.copy_from_slice(packet);
                    Datagram::Packet(len)
                }
                _ => Datagram::Dropped,
            };
        }
        let Some(net) = self.net.as_mut() else {
            return Datagram::None;
        };
        let Some(len) = net.receive(&mut self.frame) else {
            return Datagram::None;
        };
        let destination = self.frame.get(..6);
        let broadcast = destination == Some(&MacAddress::BROADCAST.0[..]);
        if destination != Some(&self.mac.0[..]) && !broadcast {
            return Datagram::NotForUs;
        }
        let datagram = match net::parse_frame(self.frame.get(..len).unwrap_or(&[])) {
            Ok(Frame::Udp(datagram)) if !broadcast => datagram,
            Ok(Frame::Arp(arp)) => return self.take_arp(arp),
            // Broadcasts other than ARP are not the fabric's.
            Ok(Frame::Udp(_)) => return Datagram::NotForUs,
            Err(_) => return Datagram::Dropped,
        };
        let from_node =
            address_node(datagram.source.address).filter(|&node| node < self.node_count);
        let for_us = datagram.destination
            == Endpoint {
                address: node_address(self.node.get()),
                port: FABRIC_UDP_PORT,
            };
        if from_node.is_none() || !for_us || datagram.source.port != FABRIC_UDP_PORT {
            return Datagram::Dropped;
        }
        // Each node is bound to its address, as on the emulator's UDP wire: a packet whose
        // header names another sender than the node at the datagram's source is dropped.
        let claimed = PacketHeader::read_from_prefix(datagram.payload)
            .ok()
            .map(|(header, _)| header.src_node.get());
        if claimed != from_node {
            return Datagram::Dropped;
        }
        match out.get_mut(..datagram.payload.len()) {
            Some(slot) => {
                slot.copy_from_slice(datagram.payload);
                Datagram::Packet(datagram.payload.len())
            }
            None => Datagram::Dropped,
        }
    }

    /// Takes an ARP packet in: one from an address that is no node of the fabric is ignored;
    /// one from a node is merged into the neighbour table, and answered if it asked for this
    /// node's address (a reply that finds the transmit queue full is dropped: the requester
    /// asks again).
    fn take_arp(&mut self, arp: Arp) -> Datagram {
        if address_node(arp.sender_ip).is_none_or(|node| node >= self.node_count) {
            return Datagram::NotForUs;
        }
        let own = (node_address(self.node.get()), self.mac);
        if let Some(reply) = self.neighbours.on_arp(&arp, own).reply {
            self.send_arp(reply.target_mac, &reply);
        }
        Datagram::Arp
    }

    /// Sends one ARP packet to `destination`.
    fn send_arp(&mut self, destination: MacAddress, arp: &Arp) {
        let mut frame = [0u8; ETHERNET_HEADER_LEN + ARP_LEN];
        if let (Some(net), Ok(len)) = (self.net.as_mut(), build_arp(&mut frame, destination, arp)) {
            let _ = net.transmit(frame.get(..len).unwrap_or(&[]));
        }
    }

    /// The MAC address to send `address`'s datagrams to: the one ARP gave, or, until it has,
    /// the node-named MAC (a QEMU NIC's), with a request for the real one broadcast at most
    /// once per `shared_abi::qemu::neighbour::REQUEST_INTERVAL`.
    fn neighbour_mac(&mut self, destination: NodeId) -> MacAddress {
        let address = node_address(destination.get());
        let now = Duration::from_nanos(self.timer.now().as_nanos());
        match self.neighbours.resolve(address, now) {
            Resolution::Known(mac) => mac,
            Resolution::Unknown { ask } => {
                if ask {
                    let request = Arp {
                        operation: ArpOperation::REQUEST,
                        sender_mac: self.mac,
                        sender_ip: node_address(self.node.get()),
                        target_mac: MacAddress::default(),
                        target_ip: address,
                    };
                    self.send_arp(MacAddress::BROADCAST, &request);
                }
                node_mac(destination.get())
            }
        }
    }

    /// The shared area.
    pub(crate) fn shared(&self) -> &RawMemory {
        &self.shared
    }

    /// The UART (console and doorbells).
    pub(crate) fn uart(&mut self) -> &mut Ns16550<MachineTimer> {
        &mut self.uart
    }

    /// The receive ring and the memory it is in, to take packets from.
    pub(crate) fn receive_ring(&mut self) -> (&mut PacketConsumer, &RawMemory) {
        (&mut self.receive_ring, &self.shared)
    }

    /// Maps region `region` of `port`'s pool as the port's window for the core, after checking
    /// the header the host wrote into it (the layout names the rings whose sleeping flags the
    /// board raises).
    ///
    /// # Errors
    /// [`PortError::NO_REGION`] if the region is out of range or PCI enumeration found no window
    /// for it, [`PortError::BAD_REGION`] if its header is not a valid layout for the window.
    pub(crate) fn attach(&mut self, port: usize, region: u32) -> Result<(), PortError> {
        let window = self
            .windows
            .get(port)
            .and_then(|regions| regions.get(usize::try_from(region).ok()?))
            .copied()
            .flatten()
            .ok_or(PortError::NO_REGION)?;
        let base = core::ptr::with_exposed_provenance_mut::<u8>(window.address as usize);
        let base = NonNull::new(base).ok_or(PortError::NO_REGION)?;
        // SAFETY: PCI enumeration placed this port's shared-memory BAR at `window.address`
        // (page-aligned, so 8-aligned) with `window.length` bytes, RAM-backed by the host's
        // memfd for the whole run; the process owning the port writes it concurrently, which
        // `RawMemory` is built for.
        let memory = unsafe { RawMemory::new(base, window.length as usize) };
        let mut header = RegionHeader::new_zeroed();
        memory
            .read(0, header.as_mut_bytes())
            .map_err(|_| PortError::BAD_REGION)?;
        let layout = RegionLayout::from_header(&header, window.length as usize)
            .map_err(|_| PortError::BAD_REGION)?;
        let slot = self.ports.get_mut(port).ok_or(PortError::NO_SUCH_PORT)?;
        *slot = Some(AttachedPort { memory, layout });
        Ok(())
    }

    /// Unmaps `port` (after the core closed it, or refused to open it).
    pub(crate) fn detach(&mut self, port: usize) {
        if let Some(slot) = self.ports.get_mut(port) {
            *slot = None;
        }
    }

    /// Raises or lowers the sleeping flag of every ring the core consumes: the open ports' send
    /// and receive rings and the wire's receive ring.
    pub(crate) fn set_sleeping(&self, sleeping: bool) {
        for attached in self.ports.iter().flatten() {
            let send = Consumer::<SendToken>::new(attached.layout.send_ring, 0);
            let receive = Consumer::<ReceiveToken>::new(attached.layout.receive_ring, 0);
            let _ = send.set_sleeping(&attached.memory, sleeping);
            let _ = receive.set_sleeping(&attached.memory, sleeping);
        }
        let _ = self.receive_ring.set_sleeping(&self.shared, sleeping);
    }

    /// Rings the switch if packets went out since the last call and it sleeps.
    pub(crate) fn doorbell_switch_if_asked(&mut self) {
        if !self.transmitted_since_doorbell {
            return;
        }
        self.transmitted_since_doorbell = false;
        if self
            .transmit_ring
            .consumer_wants_doorbell(&self.shared)
            .unwrap_or(true)
        {
            self.uart.write_byte(DOORBELL_WIRE);
        }
    }
}

impl BoardHal {
    /// Moves `length` bytes between the bounce buffer and the memory of `port`'s owner at
    /// `address` through the host: one request in the mailbox, a doorbell, and a bounded wait for
    /// the answer ([`BoardHal::await_memory_answer`]). For a write, the caller has filled the bounce buffer; for a read, the bytes
    /// are in it on success.
    fn host_round_trip(
        &mut self,
        port: usize,
        address: u64,
        direction: MemoryDirection,
        length: usize,
    ) -> Result<(), MemoryFault> {
        let request = self.memory_request.wrapping_add(1);
        let words = [
            (offsets::MEMORY_PORT, port as u32),
            (offsets::MEMORY_DIRECTION, direction.0),
            (offsets::MEMORY_LENGTH, length as u32),
            (offsets::MEMORY_ADDRESS, address as u32),
            (offsets::MEMORY_ADDRESS + 4, (address >> 32) as u32),
            // Release: the words above and the bounce buffer are visible before the request.
            (offsets::MEMORY_REQUEST, request),
        ];
        for (offset, value) in words {
            let _ = self.shared.store_release(offset, value);
        }
        self.memory_request = request;
        self.uart.write_byte(DOORBELL_MEMORY);
        if !self.await_memory_answer() {
            return Err(self.memory_timed_out());
        }
        let status = self
            .shared
            .load_acquire(offsets::MEMORY_STATUS)
            .unwrap_or(0);
        if MemoryStatus(status) == MemoryStatus::DONE {
            self.memory_accesses = self.memory_accesses.wrapping_add(1);
            Ok(())
        } else {
            self.memory_faults = self.memory_faults.wrapping_add(1);
            Err(MemoryFault::Refused)
        }
    }

    /// Counts an access the host did not answer in time, and says so on the console.
    fn memory_timed_out(&mut self) -> MemoryFault {
        self.memory_faults = self.memory_faults.wrapping_add(1);
        self.memory_timeouts = self.memory_timeouts.wrapping_add(1);
        self.uart
            .write_str("a process-memory access was not answered in time: reported as a fault\r\n");
        MemoryFault::Refused
    }

    /// Waits until the host has answered the last access posted — spinning for [`MEMORY_SPIN`],
    /// then asleep in `wfi` with the sleeping flag up, ringing the host again every
    /// [`MEMORY_DOORBELL_AGAIN`]; `false` after [`MEMORY_TIMEOUT`]. Called before the bounce buffer is touched too: an
    /// access that timed out may still be in the host's hands, and the buffer has one user at a
    /// time.
    fn await_memory_answer(&mut self) -> bool {
        let start = self.timer.ticks();
        let mut rung = start;
        loop {
            if self.memory_answered() {
                return true;
            }
            let now = self.timer.ticks();
            if now.wrapping_sub(start) >= MachineTimer::ticks_in(MEMORY_TIMEOUT) {
                // One more look: the host may have answered while this vCPU was not running
                // (the clock runs on meanwhile).
                return self.memory_answered();
            }
            if now.wrapping_sub(rung) >= MachineTimer::ticks_in(MEMORY_DOORBELL_AGAIN) {
                self.uart.write_byte(DOORBELL_MEMORY);
                rung = now;
            }
            if now.wrapping_sub(start) < MachineTimer::ticks_in(MEMORY_SPIN) {
                core::hint::spin_loop();
                continue;
            }
            // Sleep until the host answers (it wakes a core whose sleeping flag is up) or it is
            // time to ring again. Flag up, then one more look: an answer stored before the flag
            // went up is seen here, one after comes with a byte.
            let _ = self.shared.store_release(offsets::GUEST_SLEEPING, 1);
            self.shared.fence();
            if !self.memory_answered() {
                let deadline = rung
                    .saturating_add(MachineTimer::ticks_in(MEMORY_DOORBELL_AGAIN))
                    .min(start.saturating_add(MachineTimer::ticks_in(MEMORY_TIMEOUT)));
                self.timer.wake_at(deadline);
                crate::entry::wait_for_interrupt();
                // Any byte is a doorbell that says nothing more; the main loop looks at
                // everything after the access anyway. Bounded: the FIFO is 16 bytes.
                for _ in 0..64 {
                    if self.uart.read_byte().is_none() {
                        break;
                    }
                }
                crate::plic::acknowledge_all();
            }
            let _ = self.shared.store_release(offsets::GUEST_SLEEPING, 0);
        }
    }

    /// Whether the host has answered the last access posted.
    fn memory_answered(&self) -> bool {
        // Acquire: the status and the bounce buffer the host wrote are read after.
        self.shared.load_acquire(offsets::MEMORY_DONE) == Ok(self.memory_request)
    }
}

impl Hal for BoardHal {
    type Memory = RawMemory;

    fn port_memory(&self, port: usize) -> Option<&RawMemory> {
        self.ports
            .get(port)?
            .as_ref()
            .map(|attached| &attached.memory)
    }

    fn transmit(&mut self, destination: NodeId, packet: &[u8]) -> Result<(), TransmitError> {
        if destination.get() >= self.node_count {
            return Err(TransmitError::NoRoute);
        }
        if self.net.is_some() && destination == self.node {
            // To itself: held for the next take of datagrams, one packet at a time (the core
            // sends again what finds the slot taken).
            if self.loopback_len != 0 {
                self.transmit_full = self.transmit_full.wrapping_add(1);
                return Err(TransmitError::WouldBlock);
            }
            let Some(slot) = self.loopback.get_mut(..packet.len()) else {
                return Err(TransmitError::NoRoute);
            };
            slot.copy_from_slice(packet);
            self.loopback_len = packet.len();
            self.packets_transmitted = self.packets_transmitted.wrapping_add(1);
            return Ok(());
        }
        if self.net.is_some() {
            let destination_mac = self.neighbour_mac(destination);
            let endpoint = |node: NodeId| Endpoint {
                address: node_address(node.get()),
                port: FABRIC_UDP_PORT,
            };
            self.identification = self.identification.wrapping_add(1);
            let Ok(len) = build_udp(
                &mut self.frame,
                self.mac,
                destination_mac,
                endpoint(self.node),
                endpoint(destination),
                self.identification,
                packet,
            ) else {
                // Longer than a frame holds: the core never sends one.
                return Err(TransmitError::NoRoute);
            };
            let frame = self.frame.get(..len).unwrap_or(&[]);
            let Some(net) = self.net.as_mut() else {
                return Err(TransmitError::NoRoute);
            };
            return match net.transmit(frame) {
                Ok(()) => {
                    self.packets_transmitted = self.packets_transmitted.wrapping_add(1);
                    Ok(())
                }
                Err(virtio_net::TransmitError::Full) => {
                    self.transmit_full = self.transmit_full.wrapping_add(1);
                    Err(TransmitError::WouldBlock)
                }
                Err(virtio_net::TransmitError::TooLong) => Err(TransmitError::NoRoute),
            };
        }
        match self.transmit_ring.push(&self.shared, destination, packet) {
            Ok(()) => {
                self.packets_transmitted = self.packets_transmitted.wrapping_add(1);
                self.transmitted_since_doorbell = true;
                Ok(())
            }
            Err(RingError::Full) => {
                self.transmit_full = self.transmit_full.wrapping_add(1);
                // Make sure the switch is awake to drain it.
                self.transmitted_since_doorbell = true;
                Err(TransmitError::WouldBlock)
            }
            // The switch broke the ring's indexes (or the packet is longer than a slot, which
            // the core never sends): nothing can be sent; SEND retries, the give-up timer ends it.
            Err(_) => {
                self.transmit_full = self.transmit_full.wrapping_add(1);
                Err(TransmitError::WouldBlock)
            }
        }
    }

    fn notify_host(&mut self, port: usize) {
        if port < PORTS_PER_NIC {
            self.uart.write_byte(DOORBELL_PORT_EVENT | port as u8);
        }
    }

    /// Reads through the host, [`MEMORY_BOUNCE_LEN`] bytes per round trip.
    fn read_process_memory(
        &mut self,
        port: usize,
        address: u64,
        out: &mut [u8],
    ) -> Result<(), MemoryFault> {
        let mut at = address;
        for chunk in out.chunks_mut(MEMORY_BOUNCE_LEN) {
            if !self.await_memory_answer() {
                return Err(self.memory_timed_out());
            }
            self.host_round_trip(port, at, MemoryDirection::READ, chunk.len())?;
            self.shared
                .read(MEMORY_BOUNCE_OFFSET, chunk)
                .map_err(|_| MemoryFault::Refused)?;
            at = at.wrapping_add(chunk.len() as u64);
        }
        Ok(())
    }

    /// Writes through the host, [`MEMORY_BOUNCE_LEN`] bytes per round trip.
    fn write_process_memory(
        &mut self,
        port: usize,
        address: u64,
        data: &[u8],
    ) -> Result<(), MemoryFault> {
        let mut at = address;
        for chunk in data.chunks(MEMORY_BOUNCE_LEN) {
            if !self.await_memory_answer() {
                return Err(self.memory_timed_out());
            }
            self.shared
                .write(MEMORY_BOUNCE_OFFSET, chunk)
                .map_err(|_| MemoryFault::Refused)?;
            self.host_round_trip(port, at, MemoryDirection::WRITE, chunk.len())?;
            at = at.wrapping_add(chunk.len() as u64);
        }
        Ok(())
    }
}
