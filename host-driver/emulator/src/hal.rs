//! The board of an emulated NIC: the firmware's [`Hal`] over port regions mapped from memfds, the
//! emulated wire, and eventfd doorbells toward the processes.

use std::os::fd::OwnedFd;

use firmware::{Hal, MemoryFault, TransmitError};
use nix::unistd::Pid;
use shared_abi::ids::{NodeId, PORTS_PER_NIC};
use shared_abi::region::RegionLayout;
use shared_abi::ring::raw::RawMemory;

use super::read_ahead::ReadAhead;
use super::wire::Wire;
use super::write_behind::WriteBehind;
use nicbar_control::Mapping;
use nicbar_control::doorbell;

/// A port region the board has mapped for an open port.
#[derive(Debug)]
pub(crate) struct AttachedPort {
    pub(crate) mapping: Mapping,
    pub(crate) layout: RegionLayout,
    /// The process's doorbell: rung when it sleeps on its event ring and an event arrived.
    pub(crate) host_doorbell: OwnedFd,
    /// The owning process, as the kernel named it on the control socket (`SO_PEERCRED`): whose
    /// registered memory the NIC reaches. Set when it first registers memory.
    pub(crate) owner_pid: Option<i32>,
}

/// The emulated board one [`firmware::Nic`] runs on.
#[derive(Debug)]
pub(crate) struct UnitHal {
    pub(crate) ports: [Option<AttachedPort>; PORTS_PER_NIC],
    pub(crate) wire: Wire,
    /// Ports whose process sleeps and has new events, one bit each: their doorbells ring once
    /// per round of the NIC ([`UnitHal::ring_host_doorbells`]), however many events the round
    /// wrote.
    doorbells_due: u32,
    /// The source of the put being sent, read ahead of its segments.
    read_ahead: ReadAhead,
    /// The segments of the put being received, written behind their arrival.
    write_behind: WriteBehind,
}

const _: () = assert!(PORTS_PER_NIC <= 32);

impl UnitHal {
    pub(crate) fn new(wire: Wire) -> Self {
        Self {
            ports: Default::default(),
            wire,
            doorbells_due: 0,
            read_ahead: ReadAhead::default(),
            write_behind: WriteBehind::default(),
        }
    }

    /// Writes the bytes of a put held for the next segments ([`Hal::write_process_memory_part`]):
    /// at the end of every round, so none waits longer.
    pub(crate) fn flush_writes(&mut self) {
        self.write_behind.flush();
    }

    /// Rings the doorbell of every port that [`Hal::notify_host`] named since the last call.
    pub(crate) fn ring_host_doorbells(&mut self) {
        let mut due = std::mem::take(&mut self.doorbells_due);
        while due != 0 {
            let port = due.trailing_zeros() as usize;
            due &= due - 1;
            if let Some(Some(attached)) = self.ports.get(port) {
                doorbell::ring(&attached.host_doorbell);
            }
        }
    }
}

impl Hal for UnitHal {
    type Memory = RawMemory;

    fn port_memory(&self, port: usize) -> Option<&RawMemory> {
        self.ports
            .get(port)?
            .as_ref()
            .map(|attached| attached.mapping.memory())
    }

    fn transmit(&mut self, destination: NodeId, packet: &[u8]) -> Result<(), TransmitError> {
        self.wire.transmit(destination, packet)
    }

    fn local_route(&self, destination: NodeId) -> bool {
        self.wire.is_local(destination)
    }

    fn notify_host(&mut self, port: usize) {
        if port < PORTS_PER_NIC {
            self.doorbells_due |= 1 << port;
        }
    }

    fn read_process_memory(
        &mut self,
        port: usize,
        address: u64,
        out: &mut [u8],
    ) -> Result<(), MemoryFault> {
        let pid = self.owner(port)?;
        // Bytes held for the process go first: a read must find them there.
        self.write_behind.flush();
        process_memory::read(pid, address, out).map_err(|_| MemoryFault::Refused)
    }

    fn read_process_memory_ahead(
        &mut self,
        port: usize,
        operation: u64,
        address: u64,
        out: &mut [u8],
        ahead: usize,
    ) -> Result<(), MemoryFault> {
        let pid = self.owner(port)?;
        self.write_behind.flush();
        self.read_ahead
            .read((pid, port, operation), address, out, ahead)
            .map_err(|_| MemoryFault::Refused)
    }

    fn write_process_memory(
        &mut self,
        port: usize,
        address: u64,
        data: &[u8],
    ) -> Result<(), MemoryFault> {
        let pid = self.owner(port)?;
        // After the bytes held, as they came.
        self.write_behind.flush();
        process_memory::write(pid, address, data).map_err(|_| MemoryFault::Refused)
    }

    fn write_process_memory_part(
        &mut self,
        port: usize,
        operation: u64,
        address: u64,
        data: &[u8],
        last: bool,
    ) -> Result<(), MemoryFault> {
        let pid = self.owner(port)?;
        self.write_behind
            .write((pid, port, operation), address, data, last)
            .map_err(|_| MemoryFault::Refused)
    }
}

impl UnitHal {
    fn owner(&self, port: usize) -> Result<Pid, MemoryFault> {
        self.ports
            .get(port)
            .and_then(Option::as_ref)
            .and_then(|attached| attached.owner_pid)
            .map(Pid::from_raw)
            .ok_or(MemoryFault::Refused)
    }
}

/// Single-copy access to another process's memory (`process_vm_readv`/`process_vm_writev`), shared
/// with the QEMU NICs' hub.
pub(crate) use nicbar_control::process_memory;
