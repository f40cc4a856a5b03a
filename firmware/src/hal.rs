//! The one narrow trait through which the NIC core sees the world.
//!
//! A board (the embedded target), the emulator daemon and the deterministic simulator each
//! implement [`Hal`]; a fault injector or tracer can wrap any of them. The core never reads a
//! clock: time is an argument of [`crate::Nic::poll`] and [`crate::Nic::on_packet`].

use shared_abi::ids::NodeId;
use shared_abi::ring::SharedMemory;

/// The wire could not take a packet now.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TransmitError {
    /// The transmit queue is full; SEND tries again on a later poll.
    WouldBlock,
    /// The destination is not on this fabric (no route). The packet is dropped, and the
    /// connection's give-up timer reports the node unreachable.
    NoRoute,
}

/// The NIC could not reach a process's memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MemoryFault {
    /// This board cannot reach ordinary process memory (only port regions).
    Unsupported,
    /// The host refused the access, or part of the range is not mapped in the process.
    Refused,
}

/// The bytes of a packet that a board reads itself as it builds the packet
/// ([`Hal::transmit_gathered`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Gather {
    /// The local port whose memory holds them.
    pub port: usize,
    /// How many.
    pub len: usize,
    /// Where they are.
    pub from: GatherFrom,
}

/// Where the bytes of a [`Gather`] are.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum GatherFrom {
    /// Registered memory of the port's process (a put's), as
    /// [`Hal::read_process_memory_ahead`] reads it.
    Process {
        /// The put, as [`Hal::read_process_memory_ahead`] names it.
        operation: u64,
        /// Their virtual address in the process.
        address: u64,
        /// How far the put goes on reading, in order, from `address` (at least `len`).
        ahead: usize,
    },
    /// The port's own region (a long message's, in its arena), from this offset.
    Region {
        /// Their offset in the region.
        offset: usize,
    },
}

/// A packet [`Hal::transmit_gathered`] did not send.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum GatherError {
    /// The wire did not take it.
    Transmit(TransmitError),
    /// The bytes could not be read; nothing went out.
    Memory(MemoryFault),
}

/// The NIC's view of its host and its wire.
pub trait Hal {
    /// The memory of one open port's region, shared with the process that owns the port.
    type Memory: SharedMemory;

    /// The region of local port `port` (an index `< PORTS_PER_NIC`), or `None` while the board
    /// has none mapped. The core calls this only for ports it has been told are open.
    fn port_memory(&self, port: usize) -> Option<&Self::Memory>;

    /// Puts one packet on the wire toward `destination`. The bytes are copied before return.
    ///
    /// # Errors
    /// [`TransmitError`] when the packet was not taken.
    fn transmit(&mut self, destination: NodeId, packet: &[u8]) -> Result<(), TransmitError>;

    /// Whether packets toward `destination` never leave the board's own memory (a NIC sending to
    /// itself, or the emulator's units of one daemon, all of which hold the fabric key): they
    /// are sent without the authentication code, and the board hands those it receives so to
    /// [`crate::Nic::on_local_packet`], never to [`crate::Nic::on_packet`]. By default no route
    /// is: every packet is coded.
    fn local_route(&self, destination: NodeId) -> bool {
        let _ = destination;
        false
    }

    /// Whether this board builds the packets of puts and long messages toward `destination`
    /// itself, reading their bytes straight from the sender's memory into the packet it hands
    /// over ([`Hal::transmit_gathered`]), so that a segment may carry
    /// [`shared_abi::rdma::LOCAL_RDMA_SEGMENT`] or [`shared_abi::packet::LOCAL_DATA_SEGMENT`]
    /// bytes: only ever on a [`Hal::local_route`], whose receiving NIC checks the packet with
    /// [`crate::Nic::on_local_packet`]. By default no route is.
    fn gathers_toward(&self, destination: NodeId) -> bool {
        let _ = destination;
        false
    }

    /// Puts one packet on a route [`Hal::gathers_toward`] names: `head` (the header, whose
    /// length counts the gathered bytes too, and the RDMA or segment header), then `source`'s
    /// bytes, read now. Called again for a retransmission, which reads them again.
    ///
    /// # Errors
    /// [`GatherError`] when the packet did not go out; by default every call fails so.
    fn transmit_gathered(
        &mut self,
        destination: NodeId,
        head: &[u8],
        source: Gather,
    ) -> Result<(), GatherError> {
        let _ = (destination, head, source);
        Err(GatherError::Transmit(TransmitError::NoRoute))
    }

    /// Rings the host's doorbell for `port`: its process sleeps and a new event is in its event
    /// ring. Called only when the process asked for a doorbell.
    fn notify_host(&mut self, port: usize);

    /// Copies `out.len()` bytes of the memory of the process that owns local port `port`, from
    /// its virtual address `address` (registered memory, single-copy: on Linux,
    /// `process_vm_readv`). The core calls it only for ranges inside a region the port
    /// registered. By default a board reaches no process memory.
    ///
    /// # Errors
    /// [`MemoryFault`]; nothing was read then (or part of it, which the core never uses).
    fn read_process_memory(
        &mut self,
        port: usize,
        address: u64,
        out: &mut [u8],
    ) -> Result<(), MemoryFault> {
        let _ = (port, address, out);
        Err(MemoryFault::Unsupported)
    }

    /// [`Hal::read_process_memory`] of one segment of a one-sided operation that goes on reading,
    /// in order, up to `address + ahead` (`ahead >= out.len()`). `operation` names it: the
    /// core gives no other operation the same name while this one lives. A board whose every
    /// read costs a system call may read further at once and serve the operation's next
    /// segments from what it read; the operation's source must not change while it runs (as
    /// an RDMA write's may not), so they are what a read of their own would have found. By
    /// default, the plain read.
    ///
    /// # Errors
    /// As [`Hal::read_process_memory`].
    fn read_process_memory_ahead(
        &mut self,
        port: usize,
        operation: u64,
        address: u64,
        out: &mut [u8],
        ahead: usize,
    ) -> Result<(), MemoryFault> {
        let _ = (operation, ahead);
        self.read_process_memory(port, address, out)
    }

    /// Copies `data` into the memory of the process that owns local port `port`, at its virtual
    /// address `address` (on Linux, `process_vm_writev`). The core calls it only for ranges
    /// inside a region the port registered.
    ///
    /// # Errors
    /// [`MemoryFault`]; the write may have been partial then.
    fn write_process_memory(
        &mut self,
        port: usize,
        address: u64,
        data: &[u8],
    ) -> Result<(), MemoryFault> {
        let _ = (port, address, data);
        Err(MemoryFault::Unsupported)
    }

    /// [`Hal::write_process_memory`] of one segment of a put, `last` when the put ends with
    /// it. `operation` names the put: no other put in flight has the same name. A board whose
    /// every write costs a system call may hold the bytes of a segment that is not the last
    /// and write them with the segments that follow in one go: in the order they came, before
    /// any other operation's bytes, and before the board's round that brought them ends. By
    /// the time the call for the last segment returns, every byte of the put is written, and
    /// its result says whether all of them were (a held segment's write that failed fails it).
    /// By default, the plain write.
    ///
    /// # Errors
    /// As [`Hal::write_process_memory`]; for the last segment, also a held segment's failure.
    fn write_process_memory_part(
        &mut self,
        port: usize,
        operation: u64,
        address: u64,
        data: &[u8],
        last: bool,
    ) -> Result<(), MemoryFault> {
        let _ = (operation, last);
        self.write_process_memory(port, address, data)
    }
}
