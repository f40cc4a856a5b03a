//! The guest-physical memory map of a nicbar NIC on QEMU `virt`, and the mailbox in it.
//!
//! ```text
//! 0x0010_0000  test finisher      write 0x5555 to power off, (code << 16) | 0x3333 to fail
//! 0x0200_0000  CLINT              mtimecmp (hart 0) at +0x4000, mtime at +0xbff8, 10 MHz
//! 0x0c00_0000  PLIC               the UART's receive interrupt (source 10) wakes the core
//! 0x1000_0000  UART0 (16550)      console text out; doorbell bytes both ways (see below)
//! 0x3000_0000  PCIe ECAM          PORT_REGIONS ivshmem-plain devices per port: slot 0x10 + port,
//!                                 functions 0..PORT_REGIONS
//! 0x4000_0000  PCIe MMIO window   port p's region r: BAR 2 of device 0x10 + p, function r, placed
//!                                 by the firmware at 0x4000_0000 + (p * PORT_REGIONS + r) *
//!                                 PORT_WINDOW_LEN
//! 0x8000_0000  RAM (8 MiB, a memory-backend-file shared with the host)
//!   +0x00_0000   the firmware: image, .bss, stack (the linker script's 2 MiB)
//!   +0x20_0000   the shared area: Mailbox (4 KiB), then the wire's transmit and receive rings,
//!                then the bounce buffer of process-memory accesses
//!   +0x60_0000   the device tree QEMU writes near the end of RAM (unused)
//! ```
//!
//! A port region is not in guest RAM: the host library maps the region's descriptor whole, from
//! offset 0, so each port region is a memfd of its own, which QEMU exposes to the guest as the
//! shared-memory BAR of an `ivshmem-plain` PCI device. The firmware enumerates those devices at
//! boot, places their BARs, and reports where each port's first one is in
//! [`Mailbox::port_windows`].
//!
//! Each port has a pool of [`PORT_REGIONS`] regions, and every open names the one to serve from
//! ([`PortCommand::argument`]). QEMU cannot swap the memory behind a BAR of a running guest, and a
//! process that closed a port may keep its descriptor and mapping; so the host hands each region
//! to one owner only and retires it at close, and the next open of the port takes a region no
//! process has held.
//!
//! # The mailbox
//!
//! The host writes the configuration words before QEMU starts (RAM is a file it created, which
//! QEMU maps without clearing). Ports are opened and closed through one [`PortCommand`] per port:
//! the host writes `operation`, then bumps `request` (release); the firmware, seeing `request`
//! differ from the last it answered, does the operation, writes `result` and `error`, then
//! stores `request` into `done` (release). The host waits for `done` (acquire).
//!
//! # Doorbells over the UART
//!
//! The core polls while it has work and for a short linger after, then raises
//! [`Mailbox::guest_sleeping`] (and the sleeping flags of every ring it consumes), looks once
//! more, and waits for an interrupt (`wfi`). Any byte the host writes to the UART wakes it. The
//! firmware writes text below 0x80 (the console) and these codes:
//! [`DOORBELL_PORT_EVENT`]` | port` (an event for a port whose process sleeps; the host rings that
//! process's eventfd), [`DOORBELL_WIRE`] (packets in the transmit ring while the switch sleeps),
//! [`DOORBELL_MAILBOX`] (a port command was answered), [`DOORBELL_MEMORY`] (a process-memory
//! access waits in [`Mailbox::memory`]).
//!
//! # Process memory
//!
//! Registered memory is ordinary memory of the process that owns a port, which the guest cannot
//! see: the host reaches it for the guest. The firmware writes one [`MemoryAccess`] (port,
//! direction, address, length of at most [`MEMORY_BOUNCE_LEN`] bytes) and, for a write, the bytes
//! into the bounce buffer at [`MEMORY_BOUNCE_OFFSET`]; bumps [`MemoryAccess::request`] (release);
//! sends [`DOORBELL_MEMORY`]; and waits, bounded, for [`MemoryAccess::done`] — spinning a moment,
//! then asleep with [`Mailbox::guest_sleeping`] raised. The host copies between the bounce buffer
//! and the memory of the port's owner (`process_vm_readv` / `process_vm_writev`), writes
//! [`MemoryAccess::status`], stores `request` into `done` (release), and wakes the core with a
//! byte if its sleeping flag is up. The firmware never posts an access while an earlier one is
//! unanswered, so the bounce buffer has one user at a time.

use core::mem::offset_of;

use crate::ids::PORTS_PER_NIC;
use crate::packet::MAX_WIRE_LEN;
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::wire::PacketRingLayout;

/// Guest-physical address of the RAM.
pub const RAM_BASE: u32 = 0x8000_0000;
/// Bytes of RAM the machine gets (`-m`), all of it shared with the host.
pub const RAM_LEN: usize = 8 << 20;
/// Offset in RAM of the shared area (after the firmware's 2 MiB).
pub const SHARED_AREA_OFFSET: usize = 2 << 20;
/// Length of the shared area. QEMU puts the device tree at the 2 MiB boundary below the end of
/// RAM; the shared area ends well before.
pub const SHARED_AREA_LEN: usize = 2 << 20;
/// Guest-physical address of the shared area.
pub const SHARED_AREA_BASE: u32 = RAM_BASE + SHARED_AREA_OFFSET as u32;

/// Length of one port's region window (a power of two: a PCI BAR's size is one).
pub const PORT_WINDOW_LEN: usize = 1 << 20;
/// Guest-physical base of the PCIe memory window, where the firmware places the port windows.
pub const PCI_MMIO_BASE: u32 = 0x4000_0000;
/// Guest-physical base of the PCIe configuration space (ECAM).
pub const PCI_ECAM_BASE: u32 = 0x3000_0000;
/// The PCI slot of port 0's device on bus 0; port `p` is at slot `PORT_FIRST_SLOT + p`.
pub const PORT_FIRST_SLOT: u8 = 0x10;
/// PCI vendor id of QEMU's ivshmem devices (Red Hat).
pub const IVSHMEM_VENDOR: u16 = 0x1af4;
/// PCI device id of ivshmem.
pub const IVSHMEM_DEVICE: u16 = 0x1110;

/// Regions in each port's pool: PCI functions `0..PORT_REGIONS` of the port's slot (a slot has 8).
pub const PORT_REGIONS: usize = 8;

/// Where the firmware places port `port`'s first region (the one [`Mailbox::port_windows`]
/// reports), or `None` for a port out of range.
pub const fn port_window_address(port: usize) -> Option<u32> {
    region_window_address(port, 0)
}

/// Where the firmware places region `region` of port `port`'s pool, or `None` for a port or
/// region out of range.
pub const fn region_window_address(port: usize, region: usize) -> Option<u32> {
    if port >= PORTS_PER_NIC || region >= PORT_REGIONS {
        return None;
    }
    Some(PCI_MMIO_BASE + ((port * PORT_REGIONS + region) * PORT_WINDOW_LEN) as u32)
}

/// `b"NBQM"` as a little-endian `u32`: a mailbox the host has configured.
pub const MAILBOX_MAGIC: u32 = u32::from_le_bytes(*b"NBQM");
/// Version of this layout (the mailbox, the wire rings, the doorbell codes). Bumped on any change.
pub const LAYOUT_VERSION: u32 = 3;

/// Doorbell byte for "an event for port `p`": `DOORBELL_PORT_EVENT | p`.
pub const DOORBELL_PORT_EVENT: u8 = 0x80;
/// Doorbell byte for "packets wait in the transmit ring".
pub const DOORBELL_WIRE: u8 = 0xf0;
/// Doorbell byte for "a port command was answered".
pub const DOORBELL_MAILBOX: u8 = 0xf1;
/// Doorbell byte for "a process-memory access waits in [`Mailbox::memory`]".
pub const DOORBELL_MEMORY: u8 = 0xf2;
/// The byte the host writes to wake the core (any byte wakes it; this one says nothing else).
pub const DOORBELL_WAKE: u8 = 0x01;

/// Slots in each wire ring.
pub const WIRE_RING_ENTRIES: u32 = 64;
/// Offset in the shared area of the firmware's transmit ring (firmware produces, switch
/// consumes).
pub const WIRE_TRANSMIT_OFFSET: usize = 4096;
/// Offset in the shared area of the firmware's receive ring (switch produces, firmware consumes).
pub const WIRE_RECEIVE_OFFSET: usize =
    align_page(WIRE_TRANSMIT_OFFSET + PacketRingLayout::bytes(WIRE_RING_ENTRIES));

/// The transmit ring's layout in the shared area.
pub const WIRE_TRANSMIT: PacketRingLayout = PacketRingLayout {
    offset: WIRE_TRANSMIT_OFFSET,
    entries: WIRE_RING_ENTRIES,
};
/// The receive ring's layout in the shared area.
pub const WIRE_RECEIVE: PacketRingLayout = PacketRingLayout {
    offset: WIRE_RECEIVE_OFFSET,
    entries: WIRE_RING_ENTRIES,
};
/// Offset in the shared area of the bounce buffer of process-memory accesses.
pub const MEMORY_BOUNCE_OFFSET: usize =
    align_page(WIRE_RECEIVE_OFFSET + PacketRingLayout::bytes(WIRE_RING_ENTRIES));
/// Bytes one process-memory access moves at most: one packet's payload.
pub const MEMORY_BOUNCE_LEN: usize = crate::MTU_PAYLOAD;
const _: () = assert!(MEMORY_BOUNCE_OFFSET + MEMORY_BOUNCE_LEN <= SHARED_AREA_LEN);
const _: () = assert!(SHARED_AREA_OFFSET + SHARED_AREA_LEN <= RAM_LEN - (2 << 20));
const _: () = assert!(MAX_WIRE_LEN <= u16::MAX as usize);

/// What the firmware says it is doing ([`Mailbox::guest_state`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct GuestState(pub u32);

impl GuestState {
    /// Not started yet (the host's initial zero).
    pub const BOOTING: Self = Self(0);
    /// Serving: ports may be opened.
    pub const RUNNING: Self = Self(1);
    /// Refused to run; [`Mailbox::guest_failure`] says why.
    pub const FAILED: Self = Self(2);
    /// Powered off at the host's request.
    pub const STOPPED: Self = Self(3);
}

/// Why the firmware refused to run ([`Mailbox::guest_failure`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct GuestFailure(pub u32);

impl GuestFailure {
    /// No failure.
    pub const NONE: Self = Self(0);
    /// The mailbox magic is not [`MAILBOX_MAGIC`]: the host did not configure this RAM.
    pub const BAD_MAGIC: Self = Self(1);
    /// The mailbox speaks another [`LAYOUT_VERSION`].
    pub const BAD_VERSION: Self = Self(2);
    /// The node id or node count is out of range.
    pub const BAD_NODE: Self = Self(3);
    /// The port window length is not [`PORT_WINDOW_LEN`].
    pub const BAD_WINDOW: Self = Self(4);
    /// The host asked for the wire over virtio-net ([`WireKind::VIRTIO_NET`]), or another wire
    /// the firmware does not know, and there is no such device or wire.
    pub const BAD_WIRE: Self = Self(5);

    /// What the code means.
    pub const fn describe(self) -> &'static str {
        match self.0 {
            0 => "no failure",
            1 => "the mailbox was not configured (bad magic)",
            2 => "the mailbox layout version differs from the firmware's",
            3 => "the node id is not below the node count, or the count is 0",
            4 => "the port window length differs from the firmware's",
            5 => "the wire asked for is unknown, or needs a virtio-net device the machine lacks",
            _ => "an unknown failure code",
        }
    }
}

/// Which wire the firmware's packets take ([`Mailbox::wire`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct WireKind(pub u32);

impl WireKind {
    /// The packet rings in the shared area, through the host's switch ([`super::wire`]).
    pub const RINGS: Self = Self(0);
    /// UDP/IPv4 datagrams through the machine's virtio-net device, on an Ethernet segment of
    /// the fabric's NICs ([`super::net`]: node `n` is [`super::net::node_address`] and
    /// [`super::net::node_mac`], port [`super::net::FABRIC_UDP_PORT`]).
    pub const VIRTIO_NET: Self = Self(1);
}

/// A port operation ([`PortCommand::operation`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PortOperation(pub u32);

impl PortOperation {
    /// Open the port: its window holds a fresh region header.
    pub const OPEN: Self = Self(1);
    /// Close the port.
    pub const CLOSE: Self = Self(2);
    /// Register [`PortCommand::length`] bytes of the owner's memory at
    /// [`PortCommand::address`], with [`PortCommand::argument`] as the key's nonce; the result
    /// is the region's key.
    pub const REGISTER_MEMORY: Self = Self(3);
    /// Deregister the region of exactly [`PortCommand::length`] bytes at
    /// [`PortCommand::address`].
    pub const DEREGISTER_MEMORY: Self = Self(4);
    /// Let other ports reach the port's registered memory.
    pub const ALLOW_REMOTE_ACCESS: Self = Self(5);
}

/// Why the firmware did not open a port ([`PortCommand::error`]): the firmware's `OpenError`
/// as a number.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PortError(pub u32);

impl PortError {
    /// Done.
    pub const NONE: Self = Self(0);
    /// The port id is out of range.
    pub const NO_SUCH_PORT: Self = Self(1);
    /// The port is open already.
    pub const ALREADY_OPEN: Self = Self(2);
    /// No device window was found for the port at boot.
    pub const NO_REGION: Self = Self(3);
    /// The region header did not check out.
    pub const BAD_REGION: Self = Self(4);
    /// The region header names another node or port.
    pub const WRONG_IDENTITY: Self = Self(5);
    /// The operation is not one the firmware knows.
    pub const BAD_OPERATION: Self = Self(6);
    /// CLOSE (or a memory operation) of a port that was not open.
    pub const NOT_OPEN: Self = Self(7);
    /// REGISTER_MEMORY: the port's table of regions is full.
    pub const TABLE_FULL: Self = Self(8);
    /// REGISTER_MEMORY: the range is empty, longer than 4 GiB, or wraps around.
    pub const BAD_RANGE: Self = Self(9);
    /// DEREGISTER_MEMORY: no region of the port has exactly this address and length.
    pub const NOT_REGISTERED: Self = Self(10);

    /// What the code means.
    pub const fn describe(self) -> &'static str {
        match self.0 {
            0 => "no error",
            1 => "no such port",
            2 => "the port is open already",
            3 => "the NIC found no device window for the port at boot",
            4 => "the NIC refused the region header",
            5 => "the region header names another node or port",
            6 => "the NIC does not know the operation",
            7 => "the port was not open",
            8 => "the port's table of registered regions is full (deregister one first)",
            9 => "the range is not registrable (empty, over 4 GiB, or wrapping)",
            10 => "no region of exactly this address and length is registered on the port",
            _ => "an unknown error code",
        }
    }
}

/// One port's command words. 64 bytes.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct PortCommand {
    /// Host: bumped (release) after `operation` is written, to post a command.
    pub request: U32,
    /// Host: a [`PortOperation`].
    pub operation: U32,
    /// Firmware: the `request` last answered, stored (release) after `result` and `error`.
    pub done: U32,
    /// Firmware: the port's new generation after an OPEN.
    pub result: U32,
    /// Firmware: a [`PortError`].
    pub error: U32,
    /// Host: for OPEN, the region of the port's pool to serve the port from,
    /// `0..PORT_REGIONS`; for REGISTER_MEMORY, the nonce of the region's key. Written before
    /// `request`, as are the words below.
    pub argument: U32,
    /// Host: for the memory operations, the process address (low word, then high word).
    pub address: [U32; 2],
    /// Host: for the memory operations, the length in bytes (low word, then high word).
    pub length: [U32; 2],
    /// Reserved, zero.
    pub reserved: [u8; 24],
}
const _: () = assert!(core::mem::size_of::<PortCommand>() == 64);

/// Which way a process-memory access goes ([`MemoryAccess::direction`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MemoryDirection(pub u32);

impl MemoryDirection {
    /// From the process's memory into the bounce buffer (`process_vm_readv`).
    pub const READ: Self = Self(1);
    /// From the bounce buffer into the process's memory (`process_vm_writev`).
    pub const WRITE: Self = Self(2);
}

/// How the host answered a process-memory access ([`MemoryAccess::status`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MemoryStatus(pub u32);

impl MemoryStatus {
    /// Copied.
    pub const DONE: Self = Self(1);
    /// Refused: the host knows no owner of the port (not open, or nothing registered).
    pub const NO_OWNER: Self = Self(2);
    /// Refused: the range is not inside a region the port registered.
    pub const OUTSIDE_REGIONS: Self = Self(3);
    /// Refused by the kernel, or part of the range is not mapped in the process.
    pub const FAULT: Self = Self(4);
    /// Refused: the port, direction or length is out of range.
    pub const BAD_REQUEST: Self = Self(5);
}

/// The firmware's one process-memory access at a time. 32 bytes.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct MemoryAccess {
    /// Firmware: bumped (release) after the words below and, for a write, the bounce buffer.
    pub request: U32,
    /// Firmware: the local port whose owner's memory is reached.
    pub port: U32,
    /// Firmware: a [`MemoryDirection`].
    pub direction: U32,
    /// Firmware: bytes to move, at most [`MEMORY_BOUNCE_LEN`].
    pub length: U32,
    /// Firmware: the process address (low word, then high word).
    pub address: [U32; 2],
    /// Host: the `request` last answered, stored (release) after `status` and, for a read, the
    /// bounce buffer.
    pub done: U32,
    /// Host: a [`MemoryStatus`].
    pub status: U32,
}
const _: () = assert!(core::mem::size_of::<MemoryAccess>() == 32);

/// Where the firmware placed a port's window. 8 bytes.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct PortWindow {
    /// Guest-physical address, 0 if the port has no device.
    pub address: U32,
    /// Length in bytes.
    pub length: U32,
}

/// What the firmware counts and publishes before it sleeps. 64 bytes.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct GuestCounters {
    /// Times the core woke from `wfi`.
    pub wakeups: U32,
    /// Packets taken from the receive ring.
    pub packets_received: U32,
    /// Packets put into the transmit ring.
    pub packets_transmitted: U32,
    /// Transmissions refused because the transmit ring was full.
    pub transmit_full: U32,
    /// Receive-ring slots refused (impossible length) or ring resynchronisations.
    pub receive_errors: U32,
    /// The firmware's barriers completed (low 32 bits).
    pub barriers_completed: U32,
    /// The firmware's barriers failed (low 32 bits).
    pub barriers_failed: U32,
    /// Messages delivered into host buffers (low 32 bits).
    pub messages_delivered: U32,
    /// Packets that failed to parse (low 32 bits).
    pub malformed_packets: U32,
    /// Tokens refused (low 32 bits).
    pub tokens_rejected: U32,
    /// Bytes (console text or doorbells) dropped because the UART's transmitter stayed full.
    pub uart_dropped: U32,
    /// Packets dropped for a wrong or missing authentication code (low 32 bits).
    pub unauthenticated: U32,
    /// Process-memory accesses the host answered (each a guest-to-host round trip).
    pub memory_accesses: U32,
    /// Process-memory accesses that failed: refused by the host, or unanswered in time.
    pub memory_faults: U32,
    /// Of those, the ones the host did not answer in time.
    pub memory_timeouts: U32,
    /// Reserved, zero.
    pub reserved: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<GuestCounters>() == 64);

/// The mailbox at the start of the shared area. 1024 bytes; every word is a little-endian `u32`
/// at a 4-aligned offset, read and written as an atomic.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct Mailbox {
    /// Host, before boot: [`MAILBOX_MAGIC`].
    pub magic: U32,
    /// Host, before boot: [`LAYOUT_VERSION`].
    pub layout_version: U32,
    /// Host, before boot: this NIC's node id.
    pub node_id: U32,
    /// Host, before boot: nodes on the fabric (ids `0..node_count`).
    pub node_count: U32,
    /// Host, before boot: a millisecond clock that keeps counting across restarts (the
    /// firmware's connection epochs start from it).
    pub boot_stamp_ms: U32,
    /// Host, before boot: [`PORT_WINDOW_LEN`], the size of every port memory it provides.
    pub port_window_len: U32,
    /// Host, before boot: non-zero if [`Mailbox::fabric_key`] holds the fabric key (packets are
    /// then authenticated, `firmware::auth`).
    pub fabric_key_present: U32,
    /// Host, before boot: the fabric key, as eight little-endian words.
    pub fabric_key: [U32; 8],
    /// Host, before boot: the [`WireKind`] (zero, the packet rings, when an older host wrote
    /// the reserved word that was here).
    pub wire: U32,
    /// Host, any time: non-zero asks the firmware to power the machine off.
    pub power_off: U32,
    /// Reserved, zero.
    pub reserved1: [u8; 60],
    /// Firmware: a [`GuestState`].
    pub guest_state: U32,
    /// Firmware: a [`GuestFailure`] when the state is FAILED.
    pub guest_failure: U32,
    /// Firmware: non-zero while the core waits for an interrupt and wants a UART byte on new work.
    pub guest_sleeping: U32,
    /// Firmware: bytes of stack the linker script gives the core.
    pub stack_size: U32,
    /// Firmware: most bytes of stack the main loop used (the stack is painted at boot and again
    /// below the main loop's frame when it starts).
    pub stack_high_water: U32,
    /// Firmware: most bytes of stack used while booting (building the NIC), before the main loop.
    pub stack_boot_high_water: U32,
    /// Firmware, on a trap (which stops the machine): `mcause`.
    pub trap_cause: U32,
    /// Firmware, on a trap: `mepc`, the address of the instruction that trapped.
    pub trap_pc: U32,
    /// Firmware, on a trap: `mtval`.
    pub trap_value: U32,
    /// Reserved, zero.
    pub reserved2: [u8; 28],
    /// Firmware: its counters.
    pub counters: GuestCounters,
    /// Firmware: where it placed each port's window.
    pub port_windows: [PortWindow; PORTS_PER_NIC],
    /// Reserved, zero.
    pub reserved3: [u8; 64],
    /// One command slot per port.
    pub commands: [PortCommand; PORTS_PER_NIC],
    /// The firmware's process-memory access.
    pub memory: MemoryAccess,
    /// Reserved, zero.
    pub reserved4: [u8; 96],
}
const _: () = assert!(core::mem::size_of::<Mailbox>() == 1024);
const _: () = assert!(core::mem::size_of::<Mailbox>() <= WIRE_TRANSMIT_OFFSET);

/// Offsets of the mailbox's words within the shared area.
pub mod offsets {
    use super::*;

    /// [`Mailbox::magic`].
    pub const MAGIC: usize = offset_of!(Mailbox, magic);
    /// [`Mailbox::layout_version`].
    pub const LAYOUT_VERSION: usize = offset_of!(Mailbox, layout_version);
    /// [`Mailbox::node_id`].
    pub const NODE_ID: usize = offset_of!(Mailbox, node_id);
    /// [`Mailbox::node_count`].
    pub const NODE_COUNT: usize = offset_of!(Mailbox, node_count);
    /// [`Mailbox::boot_stamp_ms`].
    pub const BOOT_STAMP_MS: usize = offset_of!(Mailbox, boot_stamp_ms);
    /// [`Mailbox::port_window_len`].
    pub const PORT_WINDOW_LEN: usize = offset_of!(Mailbox, port_window_len);
    /// [`Mailbox::fabric_key_present`].
    pub const FABRIC_KEY_PRESENT: usize = offset_of!(Mailbox, fabric_key_present);
    /// [`Mailbox::fabric_key`].
    pub const FABRIC_KEY: usize = offset_of!(Mailbox, fabric_key);
    /// [`Mailbox::power_off`].
    pub const POWER_OFF: usize = offset_of!(Mailbox, power_off);
    /// [`Mailbox::wire`].
    pub const WIRE: usize = offset_of!(Mailbox, wire);
    /// [`Mailbox::guest_state`].
    pub const GUEST_STATE: usize = offset_of!(Mailbox, guest_state);
    /// [`Mailbox::guest_failure`].
    pub const GUEST_FAILURE: usize = offset_of!(Mailbox, guest_failure);
    /// [`Mailbox::guest_sleeping`].
    pub const GUEST_SLEEPING: usize = offset_of!(Mailbox, guest_sleeping);
    /// [`Mailbox::stack_size`].
    pub const STACK_SIZE: usize = offset_of!(Mailbox, stack_size);
    /// [`Mailbox::stack_high_water`].
    pub const STACK_HIGH_WATER: usize = offset_of!(Mailbox, stack_high_water);
    /// [`Mailbox::stack_boot_high_water`].
    pub const STACK_BOOT_HIGH_WATER: usize = offset_of!(Mailbox, stack_boot_high_water);
    /// [`Mailbox::trap_cause`].
    pub const TRAP_CAUSE: usize = offset_of!(Mailbox, trap_cause);
    /// [`Mailbox::trap_pc`].
    pub const TRAP_PC: usize = offset_of!(Mailbox, trap_pc);
    /// [`Mailbox::trap_value`].
    pub const TRAP_VALUE: usize = offset_of!(Mailbox, trap_value);
    /// [`Mailbox::counters`].
    pub const COUNTERS: usize = offset_of!(Mailbox, counters);

    /// The word of `port_windows[port]`: `address` at the offset, `length` 4 bytes after.
    pub const fn port_window(port: usize) -> usize {
        offset_of!(Mailbox, port_windows) + port * core::mem::size_of::<PortWindow>()
    }

    /// Offset of `commands[port]`.
    pub const fn command(port: usize) -> usize {
        offset_of!(Mailbox, commands) + port * core::mem::size_of::<PortCommand>()
    }
    /// [`PortCommand::request`] within a command.
    pub const REQUEST: usize = offset_of!(PortCommand, request);
    /// [`PortCommand::operation`] within a command.
    pub const OPERATION: usize = offset_of!(PortCommand, operation);
    /// [`PortCommand::done`] within a command.
    pub const DONE: usize = offset_of!(PortCommand, done);
    /// [`PortCommand::result`] within a command.
    pub const RESULT: usize = offset_of!(PortCommand, result);
    /// [`PortCommand::error`] within a command.
    pub const ERROR: usize = offset_of!(PortCommand, error);
    /// [`PortCommand::argument`] within a command.
    pub const ARGUMENT: usize = offset_of!(PortCommand, argument);
    /// [`PortCommand::address`] within a command (low word; the high word follows).
    pub const ADDRESS: usize = offset_of!(PortCommand, address);
    /// [`PortCommand::length`] within a command (low word; the high word follows).
    pub const LENGTH: usize = offset_of!(PortCommand, length);

    /// [`Mailbox::memory`].
    pub const MEMORY: usize = offset_of!(Mailbox, memory);
    /// [`MemoryAccess::request`].
    pub const MEMORY_REQUEST: usize = MEMORY + offset_of!(MemoryAccess, request);
    /// [`MemoryAccess::port`].
    pub const MEMORY_PORT: usize = MEMORY + offset_of!(MemoryAccess, port);
    /// [`MemoryAccess::direction`].
    pub const MEMORY_DIRECTION: usize = MEMORY + offset_of!(MemoryAccess, direction);
    /// [`MemoryAccess::length`].
    pub const MEMORY_LENGTH: usize = MEMORY + offset_of!(MemoryAccess, length);
    /// [`MemoryAccess::address`] (low word; the high word follows).
    pub const MEMORY_ADDRESS: usize = MEMORY + offset_of!(MemoryAccess, address);
    /// [`MemoryAccess::done`].
    pub const MEMORY_DONE: usize = MEMORY + offset_of!(MemoryAccess, done);
    /// [`MemoryAccess::status`].
    pub const MEMORY_STATUS: usize = MEMORY + offset_of!(MemoryAccess, status);
}

const fn align_page(n: usize) -> usize {
    (n + 4095) & !4095
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use std::vec::Vec;

    #[test]
    fn every_mailbox_word_is_aligned() {
        for offset in [
            offsets::MAGIC,
            offsets::POWER_OFF,
            offsets::GUEST_STATE,
            offsets::STACK_HIGH_WATER,
            offsets::COUNTERS,
            offsets::port_window(PORTS_PER_NIC - 1),
            offsets::command(PORTS_PER_NIC - 1) + offsets::ERROR,
            offsets::command(PORTS_PER_NIC - 1) + offsets::ADDRESS + 4,
            offsets::command(PORTS_PER_NIC - 1) + offsets::LENGTH + 4,
            offsets::MEMORY_REQUEST,
            offsets::MEMORY_ADDRESS + 4,
            offsets::MEMORY_DONE,
            offsets::MEMORY_STATUS,
        ] {
            assert_eq!(offset % 4, 0, "offset {offset}");
        }
        assert!(offsets::command(PORTS_PER_NIC) <= offsets::MEMORY);
        assert!(offsets::MEMORY_STATUS + 4 <= core::mem::size_of::<Mailbox>());
    }

    #[test]
    fn the_bounce_buffer_holds_a_payload_and_overlaps_nothing() {
        const {
            let receive_end = WIRE_RECEIVE_OFFSET + PacketRingLayout::bytes(WIRE_RING_ENTRIES);
            assert!(MEMORY_BOUNCE_OFFSET >= receive_end);
            assert!(MEMORY_BOUNCE_OFFSET % 4096 == 0);
            assert!(MEMORY_BOUNCE_OFFSET + MEMORY_BOUNCE_LEN <= SHARED_AREA_LEN);
            assert!(MEMORY_BOUNCE_LEN == crate::MTU_PAYLOAD);
        };
        // Every doorbell code is distinct from the others and from console text.
        let codes = [DOORBELL_WIRE, DOORBELL_MAILBOX, DOORBELL_MEMORY];
        for code in codes {
            assert!(code >= 0x80);
            assert_ne!(
                code & 0xf8,
                DOORBELL_PORT_EVENT,
                "{code:#x} reads as a port event"
            );
        }
        assert_eq!(
            codes
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            3
        );
    }

    #[test]
    fn port_windows_are_aligned_to_their_size_and_inside_the_pci_window() {
        let mut seen = Vec::new();
        for port in 0..PORTS_PER_NIC {
            assert_eq!(port_window_address(port), region_window_address(port, 0));
            for region in 0..PORT_REGIONS {
                let address = region_window_address(port, region).unwrap();
                assert_eq!(address as usize % PORT_WINDOW_LEN, 0);
                assert!(address >= PCI_MMIO_BASE);
                assert!(address as usize + PORT_WINDOW_LEN <= RAM_BASE as usize);
                seen.push(address);
            }
            assert_eq!(region_window_address(port, PORT_REGIONS), None);
        }
        // No two regions share a window.
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), PORTS_PER_NIC * PORT_REGIONS);
        assert_eq!(port_window_address(PORTS_PER_NIC), None);
        assert!(PORT_WINDOW_LEN.is_power_of_two());
        // A slot has eight functions.
        const { assert!(PORT_REGIONS <= 8) };
    }
}
