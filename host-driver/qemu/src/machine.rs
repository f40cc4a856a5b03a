//! One QEMU NIC from the host's side: its memories, its QEMU process, its mailbox, its doorbells.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::fcntl::{FallocateFlags, FcntlArg, SealFlag, fallocate, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::memfd::{MFdFlags, memfd_create};
use shared_abi::ids::{Generation, NodeId, PORTS_PER_NIC, PortId};
use shared_abi::qemu::layout::{
    DOORBELL_WAKE, GuestCounters, GuestFailure, GuestState, LAYOUT_VERSION, MAILBOX_MAGIC,
    MEMORY_BOUNCE_LEN, MEMORY_BOUNCE_OFFSET, MemoryDirection, MemoryStatus, PORT_FIRST_SLOT,
    PORT_REGIONS, PORT_WINDOW_LEN, PortError, PortOperation, RAM_LEN, SHARED_AREA_LEN,
    SHARED_AREA_OFFSET, WireKind, offsets,
};
use shared_abi::region::RegionLayout;
use shared_abi::ring::raw::RawMemory;
use shared_abi::ring::{OutOfBounds, SharedMemory, check_range};
use zerocopy::{FromZeros, IntoBytes};

use super::{NodeReport, QemuError, sys};
use nicbar_control::Mapping;
use nicbar_control::doorbell;
use nicbar_control::process_memory::{self, MemoryRequest};

/// How long the firmware may take to answer a port command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long QEMU may take to connect to its UART socket.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines of QEMU's log quoted in an error.
const LOG_TAIL_LINES: usize = 12;

/// The layout of every port region of a QEMU NIC: the emulator's ring sizes, with the DMA arena
/// filling the rest of the port's window (a PCI BAR, so a power of two).
pub fn region_layout() -> RegionLayout {
    let rings = RegionLayout::standard(64, 128, 256, 0);
    let layout = RegionLayout::standard(64, 128, 256, PORT_WINDOW_LEN - rings.arena_offset);
    debug_assert_eq!(layout.region_len, PORT_WINDOW_LEN);
    layout
}

/// A part of another shared memory, addressed from its own offset 0 (the shared area inside
/// guest RAM).
pub(crate) struct Slice<'a> {
    memory: &'a RawMemory,
    offset: usize,
    len: usize,
}

impl SharedMemory for Slice<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn load_acquire(&self, offset: usize) -> Result<u32, OutOfBounds> {
        check_range(self.len, offset, 4)?;
        self.memory.load_acquire(self.offset + offset)
    }

    fn store_release(&self, offset: usize, value: u32) -> Result<(), OutOfBounds> {
        check_range(self.len, offset, 4)?;
        self.memory.store_release(self.offset + offset, value)
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds> {
        check_range(self.len, offset, out.len())?;
        self.memory.read(self.offset + offset, out)
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        check_range(self.len, offset, data.len())?;
        self.memory.write(self.offset + offset, data)
    }
}

/// A sealed memfd of `len` bytes, and its mapping.
fn sealed_memory(name: &str, len: usize) -> io::Result<(OwnedFd, Mapping)> {
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)?;
    nix::unistd::ftruncate(
        &fd,
        i64::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?,
    )?;
    // Neither QEMU nor a process holding the descriptor may resize it under the other users.
    fcntl(
        &fd,
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
        ),
    )?;
    let mapping = Mapping::open(&fd)?;
    Ok((fd, mapping))
}

/// The path QEMU opens to reach one of this process's descriptors.
fn proc_path(fd: &OwnedFd) -> String {
    use std::os::fd::AsRawFd;
    format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd())
}

struct PortMemory {
    fd: OwnedFd,
    mapping: Mapping,
}

/// Where a port is in its pool of regions (`shared_abi::qemu::layout::PORT_REGIONS` of them): every open
/// takes the next region no process has held, and a close retires it for good. QEMU cannot swap
/// the memory behind a BAR of a running guest, and the process that closed a port may keep the
/// region's descriptor and mapping, so a region is never handed to a second owner.
#[derive(Clone, Copy, Debug, Default)]
struct RegionPool {
    /// The next region an open takes (`PORT_REGIONS`: all are used up).
    next: usize,
    /// The region the port is open on, if it is.
    current: Option<usize>,
}

/// The process that owns a port, as far as its registered memory goes: the firmware's accesses
/// to the port's memory reach this process, inside these ranges, and nothing else.
#[derive(Clone, Debug)]
struct MemoryOwner {
    /// The owner, as the control server knows it (`SO_PEERCRED` at connect).
    pid: i32,
    /// The ranges the firmware registered for it: (address, length).
    regions: Vec<(u64, u64)>,
}

impl MemoryOwner {
    /// Whether `length` bytes at `address` lie inside one registered range.
    fn covers(&self, address: u64, length: u64) -> bool {
        let Some(end) = address.checked_add(length) else {
            return false;
        };
        self.regions
            .iter()
            .any(|&(start, len)| address >= start && end <= start.saturating_add(len))
    }
}

/// The process a guest's access of `length` bytes at `address` for `port` reaches: the owner of
/// that port (never another's), and only inside a range the port registered.
///
/// # Errors
/// The [`MemoryStatus`] of the refusal.
fn access_owner(
    owners: &[Option<MemoryOwner>],
    port: usize,
    direction: MemoryDirection,
    address: u64,
    length: usize,
) -> Result<i32, MemoryStatus> {
    if length > MEMORY_BOUNCE_LEN
        || !matches!(direction, MemoryDirection::READ | MemoryDirection::WRITE)
    {
        return Err(MemoryStatus::BAD_REQUEST);
    }
    let owner = owners
        .get(port)
        .ok_or(MemoryStatus::BAD_REQUEST)?
        .as_ref()
        .ok_or(MemoryStatus::NO_OWNER)?;
    if !owner.covers(address, length as u64) {
        return Err(MemoryStatus::OUTSIDE_REGIONS);
    }
    Ok(owner.pid)
}

/// What a NIC starts from.
pub(crate) struct MachineSetup<'a> {
    pub(crate) node: u16,
    pub(crate) node_count: u16,
    pub(crate) qemu: &'a Path,
    pub(crate) kernel: &'a Path,
    pub(crate) run_dir: &'a Path,
    pub(crate) boot_stamp: u32,
    /// The key the fabric's packets are authenticated under.
    pub(crate) fabric_key: &'a [u8; 32],
    /// Give the NIC a virtio-net device, on this network.
    pub(crate) virtio_net: Option<Network>,
}

/// The network of a NIC's virtio-net device.
#[derive(Clone, Debug)]
pub(crate) enum Network {
    /// QEMU's user-mode network.
    User,
    /// The fabric's Ethernet segment: QEMU's multicast socket network on the loopback interface,
    /// on this UDP port.
    Segment(u16),
    /// The fabric's wire on this tap interface, which someone else created and bridged.
    Tap(String),
}

/// The multicast group of the fabric's Ethernet segments.
pub(crate) const SEGMENT_GROUP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(230, 0, 0, 1);

/// One QEMU NIC.
pub(crate) struct Machine {
    pub(crate) node: u16,
    ram: Mapping,
    /// Kept open for the life of QEMU, which opened it by its `/proc` path.
    _ram_fd: OwnedFd,
    /// Every port's regions, by port and region.
    ports: Vec<Vec<PortMemory>>,
    /// Which region each port opens on next, and which it is open on.
    pools: Mutex<[RegionPool; PORTS_PER_NIC]>,
    /// The host's end of the UART, for writing wake-up bytes (the hub reads a clone).
    uart: UnixStream,
    /// The eventfd processes ring when the NIC sleeps; the hub turns it into a UART byte.
    pub(crate) nic_doorbell: Arc<OwnedFd>,
    /// Each open port's process doorbell, rung when the firmware sends that port's code.
    host_doorbells: Mutex<[Option<Arc<OwnedFd>>; PORTS_PER_NIC]>,
    /// The request number last posted per port command slot (the host's own copy).
    requests: Mutex<[u32; PORTS_PER_NIC]>,
    /// Whose memory each port's accesses reach: set by the port's owner's first memory request,
    /// cleared when the port closes.
    owners: Mutex<[Option<MemoryOwner>; PORTS_PER_NIC]>,
    child: Mutex<Child>,
    exit: Mutex<Option<ExitStatus>>,
    pid: u32,
    log: PathBuf,
}

impl std::fmt::Debug for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machine")
            .field("node", &self.node)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Machine {
    /// Creates the NIC's memories, writes its mailbox configuration, starts QEMU and accepts its
    /// UART connection. Returns the machine and the UART stream for the hub to read.
    pub(crate) fn start(setup: &MachineSetup<'_>) -> Result<(Self, UnixStream), QemuError> {
        let node = setup.node;
        let failed = |reason: String| QemuError::Start { node, reason };
        let (ram_fd, ram) = sealed_memory(&format!("nicbar-qemu-node{node}-ram"), RAM_LEN)
            .map_err(|error| failed(format!("guest RAM: {error}")))?;
        let mut ports = Vec::new();
        for port in 0..PORTS_PER_NIC {
            let mut regions = Vec::new();
            for region in 0..PORT_REGIONS {
                // Sparse until written: a region costs memory only once its owner uses it.
                let (fd, mapping) = sealed_memory(
                    &format!("nicbar-qemu-node{node}-port{port}-region{region}"),
                    PORT_WINDOW_LEN,
                )
                .map_err(|error| failed(format!("port {port} region {region}: {error}")))?;
                regions.push(PortMemory { fd, mapping });
            }
            ports.push(regions);
        }
        let uart_path = setup.run_dir.join(format!("node{node}.uart"));
        let _ = std::fs::remove_file(&uart_path);
        let listener = UnixListener::bind(&uart_path)
            .map_err(|error| failed(format!("UART socket {}: {error}", uart_path.display())))?;
        let log = setup.run_dir.join(format!("node{node}.qemu.log"));
        let log_file = std::fs::File::create(&log)
            .map_err(|error| failed(format!("{}: {error}", log.display())))?;
        let log_err = log_file
            .try_clone()
            .map_err(|error| failed(format!("{}: {error}", log.display())))?;

        let mut command = Command::new(setup.qemu);
        command
            .arg("-machine")
            .arg("virt,memory-backend=ram")
            .args([
                "-m",
                &format!("{}M", RAM_LEN >> 20),
                "-smp",
                "1",
                "-bios",
                "none",
            ])
            .arg("-kernel")
            .arg(setup.kernel)
            .args(["-display", "none", "-nodefaults", "-no-reboot"])
            .arg("-object")
            .arg(format!(
                "memory-backend-file,id=ram,size={RAM_LEN},mem-path={},share=on",
                proc_path(&ram_fd)
            ))
            .arg("-chardev")
            .arg(format!("socket,id=uart,path={}", uart_path.display()))
            .args(["-serial", "chardev:uart"]);
        if let Some(network) = &setup.virtio_net {
            // The virtio 1.x MMIO transport (QEMU's virt machine offers the legacy one unless
            // told) and a MAC naming the node (`shared_abi::qemu::net::node_mac`).
            let netdev = match network {
                Network::User => "user,id=net0".to_owned(),
                Network::Segment(port) => {
                    format!("socket,id=net0,mcast={SEGMENT_GROUP}:{port},localaddr=127.0.0.1")
                }
                // No scripts: the tap is up and on its bridge already, and this process may
                // not configure interfaces.
                Network::Tap(interface) => {
                    format!("tap,id=net0,ifname={interface},script=no,downscript=no")
                }
            };
            command
                .args(["-global", "virtio-mmio.force-legacy=false"])
                .arg("-netdev")
                .arg(netdev)
                .arg("-device")
                .arg(format!(
                    "virtio-net-device,netdev=net0,mac=52:54:00:00:{:02x}:{:02x}",
                    node >> 8,
                    node & 0xff
                ));
        }
        for (port, regions) in ports.iter().enumerate() {
            for (region, memory) in regions.iter().enumerate() {
                command.arg("-object").arg(format!(
                    "memory-backend-file,id=port{port}r{region},size={PORT_WINDOW_LEN},\
                     mem-path={},share=on",
                    proc_path(&memory.fd)
                ));
                // Region r of port p is function r of slot 0x10 + p; function 0 says the slot
                // has more.
                command.arg("-device").arg(format!(
                    "ivshmem-plain,memdev=port{port}r{region},addr={:#x}.{region}{}",
                    usize::from(PORT_FIRST_SLOT) + port,
                    if region == 0 { ",multifunction=on" } else { "" }
                ));
            }
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(log_err));
        sys::kill_with_parent(&mut command);

        let machine_memory = Slice {
            memory: ram.memory(),
            offset: SHARED_AREA_OFFSET,
            len: SHARED_AREA_LEN,
        };
        let wire = match setup.virtio_net {
            Some(Network::Segment(_) | Network::Tap(_)) => WireKind::VIRTIO_NET,
            _ => WireKind::RINGS,
        };
        configure_mailbox(
            &machine_memory,
            node,
            setup.node_count,
            setup.boot_stamp,
            setup.fabric_key,
            wire,
        );

        let mut child = command
            .spawn()
            .map_err(|error| failed(format!("cannot run {}: {error}", setup.qemu.display())))?;
        let pid = child.id();
        let uart = match accept_within(&listener, &mut child, CONNECT_TIMEOUT) {
            Ok(uart) => uart,
            Err(reason) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_file(&uart_path);
                return Err(failed(format!("{reason}{}", log_tail(&log))));
            }
        };
        let _ = std::fs::remove_file(&uart_path);
        let reader = uart
            .try_clone()
            .map_err(|error| failed(format!("UART stream: {error}")))?;
        let nic_doorbell =
            Arc::new(doorbell::new().map_err(|error| failed(format!("NIC doorbell: {error}")))?);
        Ok((
            Self {
                node,
                ram,
                _ram_fd: ram_fd,
                ports,
                pools: Mutex::new([RegionPool::default(); PORTS_PER_NIC]),
                uart,
                nic_doorbell,
                host_doorbells: Mutex::new(Default::default()),
                requests: Mutex::new([0; PORTS_PER_NIC]),
                owners: Mutex::new(Default::default()),
                child: Mutex::new(child),
                exit: Mutex::new(None),
                pid,
                log,
            },
            reader,
        ))
    }

    /// The shared area: the mailbox and the wire rings.
    pub(crate) fn shared(&self) -> Slice<'_> {
        Slice {
            memory: self.ram.memory(),
            offset: SHARED_AREA_OFFSET,
            len: SHARED_AREA_LEN,
        }
    }

    fn load(&self, offset: usize) -> u32 {
        // Every offset used is one of `shared_abi::qemu::layout::offsets`, inside the shared area.
        self.shared().load_acquire(offset).unwrap_or(0)
    }

    fn store(&self, offset: usize, value: u32) {
        let _ = self.shared().store_release(offset, value);
    }

    /// Writes a byte to the UART: any byte wakes the core.
    pub(crate) fn wake(&self) {
        // One byte on a stream socket: written whole or not at all. A full socket means bytes
        // are already waiting for the core, which is as good.
        let _ = nix::sys::socket::send(
            std::os::fd::AsRawFd::as_raw_fd(&self.uart),
            &[DOORBELL_WAKE],
            nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
        );
    }

    /// Wakes the core if it sleeps. Call after publishing the work it should see: the fence
    /// orders that before the flag's load, pairing with the firmware's, which raises the flag
    /// before it looks at its rings a last time.
    pub(crate) fn wake_if_sleeping(&self) {
        let shared = self.shared();
        shared.fence();
        if self.load(offsets::GUEST_SLEEPING) != 0 {
            self.wake();
        }
    }

    /// Rings the process doorbell of `port`, if the port is open.
    pub(crate) fn ring_host(&self, port: usize) {
        if let Some(Some(fd)) = lock(&self.host_doorbells).get(port) {
            doorbell::ring(&**fd);
        }
    }

    /// QEMU's exit status, if it has exited.
    pub(crate) fn exited(&self) -> Option<ExitStatus> {
        let mut exit = lock(&self.exit);
        if exit.is_none() {
            *exit = lock(&self.child).try_wait().ok().flatten();
        }
        *exit
    }

    /// Says how QEMU ended, with the firmware's trap and the end of its log.
    pub(crate) fn describe_exit(&self, status: ExitStatus) -> String {
        let mut reason = match status.code() {
            Some(0) => "QEMU exited (the firmware powered off)".to_owned(),
            Some(98) => format!(
                "the firmware refused to run: {}",
                GuestFailure(self.load(offsets::GUEST_FAILURE)).describe()
            ),
            Some(99) => "the firmware panicked".to_owned(),
            Some(code @ 100..=163) => {
                format!(
                    "the firmware trapped: mcause {} at pc {:#010x}, mtval {:#x}",
                    code - 100,
                    self.load(offsets::TRAP_PC),
                    self.load(offsets::TRAP_VALUE)
                )
            }
            _ => format!("QEMU exited: {status}"),
        };
        reason.push_str(&log_tail(&self.log));
        reason
    }

    /// Waits until the firmware says it runs.
    ///
    /// # Errors
    /// [`QemuError::Boot`] if it refused, QEMU exited, or `deadline` passed.
    pub(crate) fn await_running(&self, deadline: Instant) -> Result<(), QemuError> {
        let node = self.node;
        loop {
            match GuestState(self.load(offsets::GUEST_STATE)) {
                GuestState::RUNNING => return Ok(()),
                GuestState::FAILED => {
                    return Err(QemuError::Boot {
                        node,
                        reason: format!(
                            "the firmware refused to run: {}",
                            GuestFailure(self.load(offsets::GUEST_FAILURE)).describe()
                        ),
                    });
                }
                _ => {}
            }
            if let Some(status) = self.exited() {
                return Err(QemuError::Boot {
                    node,
                    reason: self.describe_exit(status),
                });
            }
            if Instant::now() >= deadline {
                return Err(QemuError::Boot {
                    node,
                    reason: format!(
                        "the firmware did not report RUNNING in time{}",
                        log_tail(&self.log)
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Posts `operation` for `port` with `argument` and waits for the firmware's answer: the
    /// result word and the error code.
    fn command(
        &self,
        port: usize,
        operation: PortOperation,
        argument: u32,
    ) -> Result<(u32, PortError), String> {
        self.command_with(port, operation, argument, 0, 0)
    }

    /// [`Machine::command`] with the memory operations' address and length words.
    fn command_with(
        &self,
        port: usize,
        operation: PortOperation,
        argument: u32,
        address: u64,
        length: u64,
    ) -> Result<(u32, PortError), String> {
        let mut requests = lock(&self.requests);
        let slot = requests
            .get_mut(port)
            .ok_or_else(|| format!("no port {port}"))?;
        let request = slot.wrapping_add(1);
        let base = offsets::command(port);
        self.store(base + offsets::OPERATION, operation.0);
        self.store(base + offsets::ARGUMENT, argument);
        for (offset, value) in [(offsets::ADDRESS, address), (offsets::LENGTH, length)] {
            self.store(base + offset, value as u32);
            self.store(base + offset + 4, (value >> 32) as u32);
        }
        // Release: the operation and argument are visible before the new request number that
        // announces them.
        self.store(base + offsets::REQUEST, request);
        *slot = request;
        self.wake_if_sleeping();
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        let mut pause = Duration::from_micros(20);
        loop {
            if self.load(base + offsets::DONE) == request {
                let result = self.load(base + offsets::RESULT);
                return Ok((result, PortError(self.load(base + offsets::ERROR))));
            }
            if let Some(status) = self.exited() {
                return Err(self.describe_exit(status));
            }
            if Instant::now() >= deadline {
                return Err(format!("the NIC did not answer within {COMMAND_TIMEOUT:?}"));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// Opens `port` (as unit `unit`) on the next region of its pool that no process has held:
    /// writes a fresh header, has the firmware open the port on that region, and returns its
    /// generation and the three descriptors a process gets: the region, its host doorbell, and
    /// the NIC doorbell. The region is the new owner's alone: no earlier owner of the port ever
    /// had its descriptor.
    ///
    /// # Errors
    /// A message if the port's regions are used up (the NIC must be restarted for fresh ones),
    /// the firmware refuses, or it does not answer.
    pub(crate) fn open_port(
        &self,
        unit: u8,
        port: u8,
    ) -> Result<(Generation, Vec<OwnedFd>), String> {
        let index = usize::from(port);
        let regions = self
            .ports
            .get(index)
            .ok_or_else(|| format!("no port {port}"))?;
        // Held until the open is decided: a concurrent open of the same port takes no region.
        let mut pools = lock(&self.pools);
        let pool = pools
            .get_mut(index)
            .ok_or_else(|| format!("no port {port}"))?;
        let region = pool.next;
        let Some(memory) = regions.get(region) else {
            return Err(format!(
                "port {port} has had {PORT_REGIONS} owners since this NIC started, and each \
                 open takes a region no earlier owner held: restart the NIC for fresh ones"
            ));
        };
        let header = region_layout().header(
            NodeId::new(self.node),
            PortId(port),
            unit,
            Generation::new(0),
        );
        memory
            .mapping
            .memory()
            .write(0, header.as_bytes())
            .map_err(|_| "the port memory cannot hold its header".to_owned())?;
        let host_doorbell = Arc::new(
            doorbell::new().map_err(|error| format!("cannot create the doorbell: {error}"))?,
        );
        let fds = vec![
            memory
                .fd
                .try_clone()
                .map_err(|error| format!("cannot duplicate the region: {error}"))?,
            host_doorbell
                .try_clone()
                .map_err(|error| format!("cannot duplicate the doorbell: {error}"))?,
            self.nic_doorbell
                .try_clone()
                .map_err(|error| format!("cannot duplicate the NIC doorbell: {error}"))?,
        ];
        if let Some(slot) = lock(&self.host_doorbells).get_mut(index) {
            *slot = Some(host_doorbell);
        }
        // In range: `region < PORT_REGIONS`, which is 8.
        match self.command(index, PortOperation::OPEN, region as u32) {
            Ok((generation, PortError::NONE)) => {
                // From here the region is this owner's for good: it is never handed out again.
                pool.next = region + 1;
                pool.current = Some(region);
                Ok((Generation::new(generation), fds))
            }
            Ok((_, error)) => {
                self.forget_doorbell(index);
                Err(format!("the NIC refused: {}", error.describe()))
            }
            Err(reason) => {
                self.forget_doorbell(index);
                Err(reason)
            }
        }
    }

    /// Has the firmware close `port`, and retires the region it was open on: nobody serves it
    /// any more, and its pages are released (an old owner that still writes there only writes to
    /// itself).
    pub(crate) fn close_port(&self, port: u8) -> Result<(), String> {
        let index = usize::from(port);
        let answer = self.command(index, PortOperation::CLOSE, 0);
        self.forget_doorbell(index);
        // The firmware's regions died with the port; nothing reaches the owner any more.
        if let Some(owner) = lock(&self.owners).get_mut(index) {
            *owner = None;
        }
        if answer
            .as_ref()
            .is_ok_and(|(_, error)| *error == PortError::NONE)
        {
            self.retire(index);
        }
        match answer? {
            (_, PortError::NONE) => Ok(()),
            (_, error) => Err(format!("the NIC refused: {}", error.describe())),
        }
    }

    /// Has the firmware register, deregister or allow remote access to memory of `port`'s owner,
    /// process `pid` (the control server's word: the process that opened the port). From the
    /// first such request on, the firmware's accesses for the port reach that process, inside
    /// the ranges registered; a registration is refused at once if the kernel does not let this
    /// process reach the range. Returns the region's key for a registration, 0 otherwise.
    ///
    /// # Errors
    /// Why it was refused, in words for the process.
    pub(crate) fn memory_command(
        &self,
        port: u8,
        pid: u32,
        command: MemoryRequest,
    ) -> Result<u32, String> {
        let index = usize::from(port);
        let pid = i32::try_from(pid)
            .ok()
            .filter(|&pid| pid > 0)
            .ok_or_else(|| format!("the owner of port {port} has no usable process id ({pid})"))?;
        {
            let mut owners = lock(&self.owners);
            let owner = owners
                .get_mut(index)
                .ok_or_else(|| format!("no port {port}"))?;
            if owner.as_ref().is_some_and(|owner| owner.pid != pid) {
                return Err(format!(
                    "port {port}'s memory belongs to another process (the NIC has not seen it \
                     close)"
                ));
            }
            owner.get_or_insert_with(|| MemoryOwner {
                pid,
                regions: Vec::new(),
            });
        }
        let (operation, argument, address, length) = match command {
            MemoryRequest::Register {
                address,
                length,
                nonce,
            } => {
                process_memory::check_reachable(nix::unistd::Pid::from_raw(pid), address, length)?;
                (PortOperation::REGISTER_MEMORY, nonce, address, length)
            }
            MemoryRequest::Deregister { address, length } => {
                (PortOperation::DEREGISTER_MEMORY, 0, address, length)
            }
            MemoryRequest::AllowRemoteAccess => (PortOperation::ALLOW_REMOTE_ACCESS, 0, 0, 0),
            // The hub reaches registered memory through the process's own mappings, wherever
            // they lie: where the region is mapped changes nothing for it.
            MemoryRequest::RegionMapped { .. } => return Ok(0),
        };
        let (result, error) = self.command_with(index, operation, argument, address, length)?;
        if error != PortError::NONE {
            return Err(match error {
                PortError::BAD_RANGE => format!(
                    "{length} bytes at {address:#x} are not a registrable range (empty, over 4 \
                     GiB, or wrapping)"
                ),
                PortError::NOT_REGISTERED => {
                    format!("no region of {length} bytes at {address:#x} is registered on the port")
                }
                other => other.describe().to_owned(),
            });
        }
        let mut owners = lock(&self.owners);
        if let Some(Some(owner)) = owners.get_mut(index) {
            match command {
                MemoryRequest::Register { .. } => owner.regions.push((address, length)),
                MemoryRequest::Deregister { .. } => {
                    if let Some(at) = owner
                        .regions
                        .iter()
                        .position(|&region| region == (address, length))
                    {
                        owner.regions.swap_remove(at);
                    }
                }
                MemoryRequest::AllowRemoteAccess | MemoryRequest::RegionMapped { .. } => {}
            }
        }
        Ok(result)
    }

    /// Serves the firmware's process-memory access if one waits: checks it names a port with an
    /// owner and a range inside what the port registered, copies between the bounce buffer and
    /// the owner's memory, and answers. `scratch` holds a bounce buffer's worth. Returns whether
    /// there was one.
    pub(crate) fn serve_memory_access(&self, scratch: &mut [u8; MEMORY_BOUNCE_LEN]) -> bool {
        let request = self.load(offsets::MEMORY_REQUEST);
        if request == self.load(offsets::MEMORY_DONE) {
            return false;
        }
        // Acquire on `request` above: the words and the bounce buffer written before it are read
        // after.
        let port = self.load(offsets::MEMORY_PORT) as usize;
        let direction = MemoryDirection(self.load(offsets::MEMORY_DIRECTION));
        let length = self.load(offsets::MEMORY_LENGTH) as usize;
        let address = u64::from(self.load(offsets::MEMORY_ADDRESS))
            | u64::from(self.load(offsets::MEMORY_ADDRESS + 4)) << 32;
        let status = self.access_owner_memory(port, direction, address, length, scratch);
        self.store(offsets::MEMORY_STATUS, status.0);
        // Release: the status and the bounce buffer are visible before the answer.
        self.store(offsets::MEMORY_DONE, request);
        // A core that waited long raised its sleeping flag and waits for a byte.
        self.wake_if_sleeping();
        true
    }

    fn access_owner_memory(
        &self,
        port: usize,
        direction: MemoryDirection,
        address: u64,
        length: usize,
        scratch: &mut [u8; MEMORY_BOUNCE_LEN],
    ) -> MemoryStatus {
        let pid = match access_owner(&lock(&self.owners)[..], port, direction, address, length) {
            Ok(pid) => nix::unistd::Pid::from_raw(pid),
            Err(refused) => return refused,
        };
        let bytes = &mut scratch[..length];
        let shared = self.shared();
        let copied = if direction == MemoryDirection::READ {
            process_memory::read(pid, address, bytes).is_ok()
                && shared.write(MEMORY_BOUNCE_OFFSET, bytes).is_ok()
        } else {
            shared.read(MEMORY_BOUNCE_OFFSET, bytes).is_ok()
                && process_memory::write(pid, address, bytes).is_ok()
        };
        if copied {
            MemoryStatus::DONE
        } else {
            MemoryStatus::FAULT
        }
    }

    /// Frees the pages of the region `port` was open on (the firmware has let go of it).
    fn retire(&self, port: usize) {
        let region = lock(&self.pools)
            .get_mut(port)
            .and_then(|pool| pool.current.take());
        if let Some(memory) = region.and_then(|r| self.ports.get(port)?.get(r)) {
            let _ = fallocate(
                &memory.fd,
                FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
                0,
                PORT_WINDOW_LEN as i64,
            );
        }
    }

    fn forget_doorbell(&self, port: usize) {
        if let Some(slot) = lock(&self.host_doorbells).get_mut(port) {
            *slot = None;
        }
    }

    /// Asks the firmware to power off (it looks before it sleeps); kills QEMU at once if the
    /// firmware is not running.
    pub(crate) fn request_power_off(&self) {
        if self.exited().is_some() {
            return;
        }
        if GuestState(self.load(offsets::GUEST_STATE)) != GuestState::RUNNING {
            let _ = lock(&self.child).kill();
            return;
        }
        self.store(offsets::POWER_OFF, 1);
        self.wake_if_sleeping();
    }

    /// Waits up to `timeout` for QEMU to exit, then kills it.
    pub(crate) fn await_exit(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.exited().is_none() {
            if Instant::now() >= deadline {
                let mut child = lock(&self.child);
                let _ = child.kill();
                let status = child.wait().ok();
                drop(child);
                *lock(&self.exit) = status;
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// What the firmware reports through its mailbox.
    pub(crate) fn report(&self) -> NodeReport {
        let mut counters = GuestCounters::new_zeroed();
        let _ = self
            .shared()
            .read(offsets::COUNTERS, counters.as_mut_bytes());
        let mut windows = [(0, 0); PORTS_PER_NIC];
        for (port, window) in windows.iter_mut().enumerate() {
            *window = (
                self.load(offsets::port_window(port)),
                self.load(offsets::port_window(port) + 4),
            );
        }
        let cause = self.load(offsets::TRAP_CAUSE);
        let pc = self.load(offsets::TRAP_PC);
        NodeReport {
            node: self.node,
            pid: self.pid,
            state: GuestState(self.load(offsets::GUEST_STATE)),
            failure: GuestFailure(self.load(offsets::GUEST_FAILURE)),
            stack_size: self.load(offsets::STACK_SIZE),
            stack_high_water: self.load(offsets::STACK_HIGH_WATER),
            stack_boot_high_water: self.load(offsets::STACK_BOOT_HIGH_WATER),
            counters,
            windows,
            trap: (cause != 0 || pc != 0).then(|| (cause, pc, self.load(offsets::TRAP_VALUE))),
            exit: self.exited(),
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let mut child = lock(&self.child);
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Writes the configuration words the firmware reads at boot.
fn configure_mailbox(
    shared: &Slice<'_>,
    node: u16,
    node_count: u16,
    boot_stamp: u32,
    fabric_key: &[u8; 32],
    wire: WireKind,
) {
    for (word, bytes) in fabric_key.chunks_exact(4).enumerate() {
        let value = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let _ = shared.store_release(offsets::FABRIC_KEY + 4 * word, value);
    }
    let words = [
        (offsets::FABRIC_KEY_PRESENT, 1),
        (offsets::LAYOUT_VERSION, LAYOUT_VERSION),
        (offsets::NODE_ID, u32::from(node)),
        (offsets::NODE_COUNT, u32::from(node_count)),
        (offsets::BOOT_STAMP_MS, boot_stamp),
        (offsets::PORT_WINDOW_LEN, PORT_WINDOW_LEN as u32),
        (offsets::WIRE, wire.0),
        // The magic last: a mailbox with it is complete.
        (offsets::MAGIC, MAILBOX_MAGIC),
    ];
    for (offset, value) in words {
        let _ = shared.store_release(offset, value);
    }
}

/// Accepts QEMU's connection to the UART socket, failing if QEMU exits or `timeout` passes.
fn accept_within(
    listener: &UnixListener,
    child: &mut Child,
    timeout: Duration,
) -> Result<UnixStream, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(50u16)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(error) => return Err(format!("waiting for QEMU's UART connection: {error}")),
        }
        if fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN))
        {
            let (stream, _) = listener
                .accept()
                .map_err(|error| format!("accepting QEMU's UART connection: {error}"))?;
            return Ok(stream);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("QEMU exited before connecting its UART ({status})"));
        }
        if Instant::now() >= deadline {
            return Err(format!("QEMU did not connect its UART within {timeout:?}"));
        }
    }
}

/// The last lines of QEMU's log, as a suffix for an error message (empty if there are none).
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    let start = lines.len().saturating_sub(LOG_TAIL_LINES);
    format!(
        "; QEMU's log ({}) ends:\n  {}",
        log.display(),
        lines[start..].join("\n  ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners() -> Vec<Option<MemoryOwner>> {
        let mut owners = vec![None; PORTS_PER_NIC];
        owners[1] = Some(MemoryOwner {
            pid: 100,
            regions: vec![(0x1000, 0x1000), (0x8000, 64)],
        });
        owners[2] = Some(MemoryOwner {
            pid: 200,
            regions: vec![(0x1000, 0x1000)],
        });
        owners
    }

    #[test]
    fn an_access_reaches_its_own_ports_owner_inside_its_regions_only() {
        let owners = owners();
        let read = MemoryDirection::READ;
        assert_eq!(access_owner(&owners, 1, read, 0x1000, 4096), Ok(100));
        assert_eq!(
            access_owner(&owners, 2, MemoryDirection::WRITE, 0x1800, 8),
            Ok(200),
            "the same address through port 2 reaches port 2's owner"
        );
        assert_eq!(access_owner(&owners, 1, read, 0x8000, 64), Ok(100));
        assert_eq!(
            access_owner(&owners, 2, read, 0x8000, 8),
            Err(MemoryStatus::OUTSIDE_REGIONS),
            "port 1's region is not port 2's"
        );
        assert_eq!(
            access_owner(&owners, 1, read, 0x1ff8, 16),
            Err(MemoryStatus::OUTSIDE_REGIONS),
            "past a region's end"
        );
        assert_eq!(
            access_owner(&owners, 1, read, u64::MAX - 4, 8),
            Err(MemoryStatus::OUTSIDE_REGIONS),
            "wrapping around"
        );
        assert_eq!(
            access_owner(&owners, 0, read, 0x1000, 8),
            Err(MemoryStatus::NO_OWNER),
            "a port nobody registered memory on"
        );
        assert_eq!(
            access_owner(&owners, PORTS_PER_NIC, read, 0x1000, 8),
            Err(MemoryStatus::BAD_REQUEST)
        );
        assert_eq!(
            access_owner(&owners, 1, read, 0x1000, MEMORY_BOUNCE_LEN + 1),
            Err(MemoryStatus::BAD_REQUEST),
            "longer than the bounce buffer"
        );
        assert_eq!(
            access_owner(&owners, 1, MemoryDirection(7), 0x1000, 8),
            Err(MemoryStatus::BAD_REQUEST)
        );
    }
}
