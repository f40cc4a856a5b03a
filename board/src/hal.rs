//! The firmware's [`Hal`] on this board: port regions are the PCI windows the host's memfds
//! appear in, the wire is the packet rings in the shared area, and the host's doorbells are bytes
//! on the UART.
#![allow(
    unsafe_code,
    reason = "wrapping the port windows and the shared area as raw memory"
)]

use core::ptr::NonNull;

use board::layout::{
    DOORBELL_PORT_EVENT, DOORBELL_WIRE, PortError, SHARED_AREA_BASE, SHARED_AREA_LEN, WIRE_RECEIVE,
    WIRE_TRANSMIT,
};
use board::wire::{PacketConsumer, PacketProducer};
use firmware::{Hal, TransmitError};
use shared_abi::ids::{NodeId, PORTS_PER_NIC};
use shared_abi::region::{RegionHeader, RegionLayout};
use shared_abi::ring::raw::RawMemory;
use shared_abi::ring::{Consumer, RingError, SharedMemory};
use shared_abi::token::{ReceiveToken, SendToken};
use zerocopy::{FromZeros, IntoBytes};

use crate::clint::MachineTimer;
use crate::pci::PortWindows;
use crate::uart::Ns16550;

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

/// The board the firmware core runs on.
pub(crate) struct BoardHal {
    node_count: u16,
    windows: PortWindows,
    ports: [Option<AttachedPort>; PORTS_PER_NIC],
    shared: RawMemory,
    transmit_ring: PacketProducer,
    receive_ring: PacketConsumer,
    uart: Ns16550<MachineTimer>,
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
    pub(crate) fn new(node_count: u16, windows: PortWindows, uart: Ns16550<MachineTimer>) -> Self {
        Self {
            node_count,
            windows,
            ports: Default::default(),
            shared: shared_area(),
            transmit_ring: PacketProducer::new(WIRE_TRANSMIT),
            receive_ring: PacketConsumer::new(WIRE_RECEIVE),
            uart,
            transmitted_since_doorbell: false,
            packets_transmitted: 0,
            transmit_full: 0,
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
}
