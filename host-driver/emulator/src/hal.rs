//! The board of an emulated NIC: the firmware's [`Hal`] over port regions mapped from memfds, the
//! emulated wire, and eventfd doorbells toward the processes.

use std::os::fd::OwnedFd;

use firmware::{Gather, GatherError, GatherFrom, Hal, MemoryFault, TransmitError};
use nix::unistd::Pid;
use shared_abi::ids::{NodeId, PORTS_PER_NIC};
use shared_abi::region::RegionLayout;
use shared_abi::ring::SharedMemory;
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
    /// Where the owner says it mapped the region (`Request::RegionMapped`): its registered
    /// memory in the arena is copied through this board's own mapping, with no system call.
    pub(crate) mapped_at: Option<u64>,
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

    fn gathers_toward(&self, destination: NodeId) -> bool {
        self.wire.is_local(destination)
    }

    fn transmit_gathered(
        &mut self,
        destination: NodeId,
        head: &[u8],
        source: Gather,
    ) -> Result<(), GatherError> {
        // The sender's bytes go straight into the buffer the receiving NIC takes, through this
        // board's mapping of the sender's region: one copy, where a packet built in the
        // firmware's buffer costs one more (into it, then into the inbox).
        let total = head.len() + source.len;
        let mut packet = self.wire.local_buffer(destination, total);
        // Every byte is written below: a spare buffer long enough is not zeroed again.
        if packet.len() < total {
            packet.resize(total, 0);
        } else {
            packet.truncate(total);
        }
        let (front, data) = packet.split_at_mut(head.len());
        front.copy_from_slice(head);
        match source.from {
            GatherFrom::Process {
                operation,
                address,
                ahead,
            } => self.read_process_memory_ahead(source.port, operation, address, data, ahead),
            GatherFrom::Region { offset } => self.read_arena(source.port, offset, data),
        }
        .map_err(GatherError::Memory)?;
        self.wire
            .transmit_local(destination, packet)
            .map_err(GatherError::Transmit)
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
        // Bytes held for the process go first: a read must find them there.
        self.write_behind.flush();
        if let Some(offset) = self.in_arena(port, address, out.len()) {
            return self.read_arena(port, offset, out);
        }
        let pid = self.owner(port)?;
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
        self.write_behind.flush();
        if let Some(offset) = self.in_arena(port, address, out.len()) {
            // A copy costs what reading ahead would: nothing to save for the next segments.
            return self.read_arena(port, offset, out);
        }
        let pid = self.owner(port)?;
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
        // After the bytes held, as they came.
        self.write_behind.flush();
        if let Some(offset) = self.in_arena(port, address, data.len()) {
            return self.write_arena(port, offset, data);
        }
        let pid = self.owner(port)?;
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
        if let Some(offset) = self.in_arena(port, address, data.len()) {
            // Written at once: holding it would save no system call. Bytes held before go first
            // (segments of this put held before the process said where its region is mapped
            // must be in place before its completion leaves).
            self.write_behind.flush();
            return self.write_arena(port, offset, data);
        }
        let pid = self.owner(port)?;
        self.write_behind
            .write((pid, port, operation), address, data, last)
            .map_err(|_| MemoryFault::Refused)
    }
}

impl UnitHal {
    /// Where `len` bytes at `address` of `port`'s process lie in the port's region, if wholly
    /// in its arena as the process says it mapped it: their offset in the region.
    fn in_arena(&self, port: usize, address: u64, len: usize) -> Option<usize> {
        let attached = self.ports.get(port)?.as_ref()?;
        arena_offset(&attached.layout, attached.mapped_at?, address, len)
    }

    /// Copies `out.len()` bytes at `offset` of `port`'s region through this board's mapping.
    fn read_arena(&self, port: usize, offset: usize, out: &mut [u8]) -> Result<(), MemoryFault> {
        self.port_memory(port)
            .ok_or(MemoryFault::Refused)?
            .read(offset, out)
            .map_err(|_| MemoryFault::Refused)
    }

    /// Copies `data` to `offset` of `port`'s region through this board's mapping.
    fn write_arena(&self, port: usize, offset: usize, data: &[u8]) -> Result<(), MemoryFault> {
        self.port_memory(port)
            .ok_or(MemoryFault::Refused)?
            .write(offset, data)
            .map_err(|_| MemoryFault::Refused)
    }

    fn owner(&self, port: usize) -> Result<Pid, MemoryFault> {
        self.ports
            .get(port)
            .and_then(Option::as_ref)
            .and_then(|attached| attached.owner_pid)
            .map(Pid::from_raw)
            .ok_or(MemoryFault::Refused)
    }
}

/// The region offset of `len` bytes at `address` of a process that mapped a region laid out as
/// `layout` at `mapped_at`, if they lie wholly in its arena (never in its header or rings).
fn arena_offset(layout: &RegionLayout, mapped_at: u64, address: u64, len: usize) -> Option<usize> {
    let offset = usize::try_from(address.checked_sub(mapped_at)?).ok()?;
    let end = offset.checked_add(len)?;
    (offset >= layout.arena_offset && end <= layout.region_len).then_some(offset)
}

/// Single-copy access to another process's memory (`process_vm_readv`/`process_vm_writev`), shared
/// with the QEMU NICs' hub.
pub(crate) use nicbar_control::process_memory;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ranges_wholly_in_the_arena_are_copied_through_the_mapping() {
        let layout = RegionLayout::standard(64, 64, 128, 1 << 20);
        let base = 0x7f00_0000_0000;
        let arena = base + layout.arena_offset as u64;
        let end = base + layout.region_len as u64;
        let at = |address: u64, len: usize| arena_offset(&layout, base, address, len);
        assert_eq!(at(arena, 4096), Some(layout.arena_offset));
        assert_eq!(at(end - 8, 8), Some(layout.region_len - 8));
        assert_eq!(at(end - 8, 9), None, "past the region's end");
        assert_eq!(at(arena - 1, 2), None, "the rings before the arena");
        assert_eq!(at(base, 8), None, "the header");
        assert_eq!(at(base - 4096, 8), None, "below the mapping");
        assert_eq!(at(u64::MAX, 2), None);
        assert_eq!(at(arena, usize::MAX), None);
    }
}
