//! The NIC's MAC: QEMU's `virtio-net` on the `virt` machine's virtio-mmio bus (the virtio 1.x
//! MMIO transport, split virtqueues), with fixed storage and no panic path.
//!
//! The `virt` machine has eight virtio-mmio slots of 4 KiB from 0x1000_1000; QEMU puts a
//! `-device virtio-net-device` in one of them. [`VirtioNet::probe`] finds it, negotiates
//! `VIRTIO_F_VERSION_1` and `VIRTIO_NET_F_MAC` only (no offloads: every frame is whole and
//! checksummed by [`shared_abi::qemu::net`]), and sets up a receive and a transmit queue of
//! [`QUEUE`] descriptors each, every descriptor with its own buffer in `.bss` (the device sees
//! guest-physical addresses, which on this board are the firmware's: no IOMMU). The receive
//! queue's buffers are all handed to the device at start and handed back after each frame is
//! copied out; the transmit queue takes one frame per descriptor.
//!
//! The device is the other side of the rings: its used index and each used element's id and
//! length are checked before they are believed (an id beyond the queue or a length beyond the
//! buffer drops the frame). Publishing follows the virtio specification's order (§2.7.13): the
//! descriptor and the ring entry, a fence, the index, a fence, the notification.
//!
//! When the host asks for the wire over virtio-net, the board's `Hal` sends every packet through
//! [`VirtioNet::transmit`] and the main loop takes them with [`VirtioNet::receive`]
//! ([`crate::hal`]); otherwise, at boot, [`link_check`] asks QEMU's user-mode network's gateway
//! for its MAC with ARP and prints the answer, which proves the device against a network stack
//! that is not ours.
#![allow(
    unsafe_code,
    reason = "the device's registers and the DMA memory it writes concurrently"
)]

use core::cell::UnsafeCell;
use core::ptr::{addr_of, addr_of_mut};
use core::sync::atomic::{Ordering, fence};

use shared_abi::qemu::net::{
    Arp, ArpOperation, Frame, Ipv4Address, MAX_FRAME_LEN, MacAddress, build_arp, parse_frame,
};

use crate::clint::MachineTimer;
use crate::mmio::register;
use crate::uart::Ns16550;

/// The first virtio-mmio slot of QEMU's `virt` machine.
const MMIO_BASE: usize = 0x1000_1000;
/// Bytes between slots.
const MMIO_STRIDE: usize = 0x1000;
/// Slots on the `virt` machine.
const MMIO_SLOTS: usize = 8;

// Registers of the virtio-mmio transport, version 2 (virtio 1.x §4.2.2).
const MAGIC_VALUE: usize = 0x000;
const VERSION: usize = 0x004;
const DEVICE_ID: usize = 0x008;
const DEVICE_FEATURES: usize = 0x010;
const DEVICE_FEATURES_SEL: usize = 0x014;
const DRIVER_FEATURES: usize = 0x020;
const DRIVER_FEATURES_SEL: usize = 0x024;
const QUEUE_SEL: usize = 0x030;
const QUEUE_NUM_MAX: usize = 0x034;
const QUEUE_NUM: usize = 0x038;
const QUEUE_READY: usize = 0x044;
const QUEUE_NOTIFY: usize = 0x050;
const INTERRUPT_STATUS: usize = 0x060;
const INTERRUPT_ACK: usize = 0x064;
const STATUS: usize = 0x070;
const QUEUE_DESC_LOW: usize = 0x080;
const QUEUE_DESC_HIGH: usize = 0x084;
const QUEUE_DRIVER_LOW: usize = 0x090;
const QUEUE_DRIVER_HIGH: usize = 0x094;
const QUEUE_DEVICE_LOW: usize = 0x0a0;
const QUEUE_DEVICE_HIGH: usize = 0x0a4;
const CONFIG: usize = 0x100;

/// "virt", little-endian.
const MAGIC: u32 = 0x7472_6976;
/// The device id of a network card.
const DEVICE_NETWORK: u32 = 1;

const STATUS_ACKNOWLEDGE: u32 = 1;
const STATUS_DRIVER: u32 = 2;
const STATUS_DRIVER_OK: u32 = 4;
const STATUS_FEATURES_OK: u32 = 8;

/// `VIRTIO_NET_F_MAC`, in the low feature word.
const FEATURE_MAC: u32 = 1 << 5;
/// `VIRTIO_F_VERSION_1`, bit 32: in the high feature word.
const FEATURE_VERSION_1_HIGH: u32 = 1;

const RECEIVE_QUEUE: u32 = 0;
const TRANSMIT_QUEUE: u32 = 1;

/// The device writes into the buffer.
const DESCRIPTOR_WRITE: u16 = 2;

/// Descriptors per queue: a power of two.
pub(crate) const QUEUE: usize = 8;
const _: () = assert!(QUEUE.is_power_of_two());
/// `struct virtio_net_hdr` of virtio 1.x (with `num_buffers`), in front of every frame.
const NET_HEADER_LEN: usize = 12;
/// Bytes of each buffer: the header and the longest frame.
const BUFFER_LEN: usize = NET_HEADER_LEN + MAX_FRAME_LEN;

#[derive(Clone, Copy)]
#[repr(C)]
struct Descriptor {
    address: u64,
    length: u32,
    flags: u16,
    next: u16,
}

#[repr(C)]
struct AvailableRing {
    flags: u16,
    index: u16,
    ring: [u16; QUEUE],
    used_event: u16,
}

#[derive(Clone, Copy)]
#[repr(C)]
struct UsedElement {
    id: u32,
    length: u32,
}

#[repr(C)]
struct UsedRing {
    flags: u16,
    index: u16,
    ring: [UsedElement; QUEUE],
    available_event: u16,
}

/// One queue's rings and buffers.
#[repr(C, align(16))]
struct Queue {
    descriptors: [Descriptor; QUEUE],
    available: AvailableRing,
    used: UsedRing,
    buffers: [[u8; BUFFER_LEN]; QUEUE],
}

/// Both queues, in memory the device reads and writes.
#[repr(C)]
struct DmaArea {
    receive: Queue,
    transmit: Queue,
}

struct Dma(UnsafeCell<DmaArea>);

// SAFETY: one hart runs Rust, and only the one `VirtioNet` (made once, by `probe`) touches the
// area, through raw pointers with volatile accesses where the device may write concurrently.
unsafe impl Sync for Dma {}

const EMPTY_QUEUE: Queue = Queue {
    descriptors: [Descriptor {
        address: 0,
        length: 0,
        flags: 0,
        next: 0,
    }; QUEUE],
    available: AvailableRing {
        flags: 0,
        index: 0,
        ring: [0; QUEUE],
        used_event: 0,
    },
    used: UsedRing {
        flags: 0,
        index: 0,
        ring: [UsedElement { id: 0, length: 0 }; QUEUE],
        available_event: 0,
    },
    buffers: [[0; BUFFER_LEN]; QUEUE],
};

static DMA: Dma = Dma(UnsafeCell::new(DmaArea {
    receive: EMPTY_QUEUE,
    transmit: EMPTY_QUEUE,
}));

/// Why a frame was not sent.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum TransmitError {
    /// Every transmit descriptor is with the device.
    Full,
    /// Longer than [`MAX_FRAME_LEN`].
    TooLong,
}

/// The virtio-net device, brought up.
pub(crate) struct VirtioNet {
    base: usize,
    /// The device's interrupt source on the PLIC.
    interrupt: u32,
    mac: MacAddress,
    /// Receive: the next used element to take, and the available index published.
    receive_used: u16,
    receive_available: u16,
    /// Transmit: the next used element to reclaim, and the available index published.
    transmit_used: u16,
    transmit_available: u16,
}

fn read(base: usize, offset: usize) -> u32 {
    // SAFETY: `base` is a virtio-mmio slot of the virt machine (4 KiB of registers), `offset` one
    // of its 4-aligned registers.
    unsafe { register(base + offset) }.read()
}

fn write(base: usize, offset: usize, value: u32) {
    // SAFETY: as in `read`.
    unsafe { register(base + offset) }.write(value);
}

fn queue(receive: bool) -> *mut Queue {
    let area = DMA.0.get();
    if receive {
        // SAFETY: `area` points to the static; no reference is made.
        unsafe { addr_of_mut!((*area).receive) }
    } else {
        // SAFETY: as above.
        unsafe { addr_of_mut!((*area).transmit) }
    }
}

/// The slot of a free-running ring index.
fn slot(index: u16) -> usize {
    usize::from(index) & (QUEUE - 1)
}

impl VirtioNet {
    /// Finds the first virtio-net device (transport version 2) and brings it up; `None` if QEMU
    /// has none, or it refused what the firmware needs.
    pub(crate) fn probe() -> Option<Self> {
        (0..MMIO_SLOTS)
            .find(|&slot| {
                let base = MMIO_BASE + slot * MMIO_STRIDE;
                read(base, MAGIC_VALUE) == MAGIC
                    && read(base, VERSION) == 2
                    && read(base, DEVICE_ID) == DEVICE_NETWORK
            })
            // The virt machine wires slot s to PLIC source 1 + s.
            .and_then(|slot| Self::start(MMIO_BASE + slot * MMIO_STRIDE, 1 + slot as u32))
    }

    fn start(base: usize, interrupt: u32) -> Option<Self> {
        write(base, STATUS, 0);
        write(base, STATUS, STATUS_ACKNOWLEDGE);
        write(base, STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        write(base, DEVICE_FEATURES_SEL, 1);
        let high = read(base, DEVICE_FEATURES);
        write(base, DEVICE_FEATURES_SEL, 0);
        let low = read(base, DEVICE_FEATURES);
        if high & FEATURE_VERSION_1_HIGH == 0 || low & FEATURE_MAC == 0 {
            return None;
        }
        write(base, DRIVER_FEATURES_SEL, 0);
        write(base, DRIVER_FEATURES, FEATURE_MAC);
        write(base, DRIVER_FEATURES_SEL, 1);
        write(base, DRIVER_FEATURES, FEATURE_VERSION_1_HIGH);
        let negotiated = STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK;
        write(base, STATUS, negotiated);
        if read(base, STATUS) & STATUS_FEATURES_OK == 0 {
            return None;
        }
        for (index, receive) in [(RECEIVE_QUEUE, true), (TRANSMIT_QUEUE, false)] {
            write(base, QUEUE_SEL, index);
            if (read(base, QUEUE_NUM_MAX) as usize) < QUEUE {
                return None;
            }
            write(base, QUEUE_NUM, QUEUE as u32);
            let queue = queue(receive);
            // SAFETY: `queue` points into the static; only addresses are taken.
            let (descriptors, available, used) = unsafe {
                (
                    addr_of!((*queue).descriptors) as usize as u64,
                    addr_of!((*queue).available) as usize as u64,
                    addr_of!((*queue).used) as usize as u64,
                )
            };
            for (low, high, address) in [
                (QUEUE_DESC_LOW, QUEUE_DESC_HIGH, descriptors),
                (QUEUE_DRIVER_LOW, QUEUE_DRIVER_HIGH, available),
                (QUEUE_DEVICE_LOW, QUEUE_DEVICE_HIGH, used),
            ] {
                write(base, low, address as u32);
                write(base, high, (address >> 32) as u32);
            }
            write(base, QUEUE_READY, 1);
        }
        let config_low = read(base, CONFIG).to_le_bytes();
        let config_high = read(base, CONFIG + 4).to_le_bytes();
        let mac = MacAddress([
            config_low[0],
            config_low[1],
            config_low[2],
            config_low[3],
            config_high[0],
            config_high[1],
        ]);
        let mut net = Self {
            base,
            interrupt,
            mac,
            receive_used: 0,
            receive_available: 0,
            transmit_used: 0,
            transmit_available: 0,
        };
        // Every receive buffer to the device.
        for id in 0..QUEUE as u16 {
            net.give_receive_buffer(id);
        }
        write(base, STATUS, negotiated | STATUS_DRIVER_OK);
        write(base, QUEUE_NOTIFY, RECEIVE_QUEUE);
        Some(net)
    }

    /// The device's MAC address.
    pub(crate) fn mac(&self) -> MacAddress {
        self.mac
    }

    /// Hands receive buffer `id` (below [`QUEUE`]) to the device; the caller notifies.
    fn give_receive_buffer(&mut self, id: u16) {
        let queue = queue(true);
        let id = slot(id);
        // SAFETY: `id < QUEUE`; the descriptor, the ring entry and the buffer are not the
        // device's until the index below publishes them.
        unsafe {
            let buffer = addr_of!((*queue).buffers)
                .cast::<[u8; BUFFER_LEN]>()
                .add(id);
            addr_of_mut!((*queue).descriptors)
                .cast::<Descriptor>()
                .add(id)
                .write_volatile(Descriptor {
                    address: buffer as usize as u64,
                    length: BUFFER_LEN as u32,
                    flags: DESCRIPTOR_WRITE,
                    next: 0,
                });
            addr_of_mut!((*queue).available.ring)
                .cast::<u16>()
                .add(slot(self.receive_available))
                .write_volatile(id as u16);
            // The descriptor and the entry are visible before the index that publishes them.
            fence(Ordering::SeqCst);
            self.receive_available = self.receive_available.wrapping_add(1);
            addr_of_mut!((*queue).available.index).write_volatile(self.receive_available);
        }
        // The index is visible before the device is told to look.
        fence(Ordering::SeqCst);
    }

    /// Sends `frame` (without the virtio header, which is added).
    ///
    /// # Errors
    /// [`TransmitError::Full`] while every transmit descriptor is with the device,
    /// [`TransmitError::TooLong`] above [`MAX_FRAME_LEN`].
    pub(crate) fn transmit(&mut self, frame: &[u8]) -> Result<(), TransmitError> {
        if frame.len() > MAX_FRAME_LEN {
            return Err(TransmitError::TooLong);
        }
        let queue = queue(false);
        // Reclaim what the device has sent: any used index within a queue's reach of ours.
        // SAFETY: a volatile read of the device-written index.
        let used = unsafe { addr_of!((*queue).used.index).read_volatile() };
        fence(Ordering::SeqCst);
        let outstanding = self.transmit_available.wrapping_sub(used);
        if usize::from(outstanding) <= QUEUE {
            self.transmit_used = used;
        }
        if usize::from(self.transmit_available.wrapping_sub(self.transmit_used)) >= QUEUE {
            return Err(TransmitError::Full);
        }
        let id = slot(self.transmit_available);
        // SAFETY: `id < QUEUE`; this descriptor and buffer are not the device's (it has given
        // back every descriptor up to `transmit_used`, and at most QUEUE - 1 are outstanding);
        // `frame` fits the buffer after the header.
        unsafe {
            let buffer = addr_of_mut!((*queue).buffers)
                .cast::<[u8; BUFFER_LEN]>()
                .add(id)
                .cast::<u8>();
            core::ptr::write_bytes(buffer, 0, NET_HEADER_LEN);
            core::ptr::copy_nonoverlapping(frame.as_ptr(), buffer.add(NET_HEADER_LEN), frame.len());
            addr_of_mut!((*queue).descriptors)
                .cast::<Descriptor>()
                .add(id)
                .write_volatile(Descriptor {
                    address: buffer as usize as u64,
                    length: (NET_HEADER_LEN + frame.len()) as u32,
                    flags: 0,
                    next: 0,
                });
            addr_of_mut!((*queue).available.ring)
                .cast::<u16>()
                .add(id)
                .write_volatile(id as u16);
            fence(Ordering::SeqCst);
            self.transmit_available = self.transmit_available.wrapping_add(1);
            addr_of_mut!((*queue).available.index).write_volatile(self.transmit_available);
        }
        fence(Ordering::SeqCst);
        write(self.base, QUEUE_NOTIFY, TRANSMIT_QUEUE);
        Ok(())
    }

    /// Copies the next received frame (without the virtio header) into `out` and returns its
    /// length (cut to `out`'s), or `None` if none waits. A used element the device filled with an
    /// id beyond the queue is skipped; its buffer is lost to the queue, never misread.
    pub(crate) fn receive(&mut self, out: &mut [u8]) -> Option<usize> {
        let queue = queue(true);
        // SAFETY: a volatile read of the device-written index.
        let used = unsafe { addr_of!((*queue).used.index).read_volatile() };
        // The element is read after the index that published it.
        fence(Ordering::SeqCst);
        if used == self.receive_used {
            return None;
        }
        let position = slot(self.receive_used);
        self.receive_used = self.receive_used.wrapping_add(1);
        // SAFETY: `position < QUEUE`; the device published this element (the index passed it).
        let element = unsafe {
            addr_of!((*queue).used.ring)
                .cast::<UsedElement>()
                .add(position)
                .read_volatile()
        };
        let id = element.id as usize;
        if id >= QUEUE {
            return None;
        }
        let length = (element.length as usize)
            .min(BUFFER_LEN)
            .saturating_sub(NET_HEADER_LEN)
            .min(out.len());
        // SAFETY: `id < QUEUE`; the device gave this buffer back (it is in the used ring) and
        // writes it no more until it is handed out again below; `length` fits both.
        unsafe {
            let buffer = addr_of!((*queue).buffers)
                .cast::<[u8; BUFFER_LEN]>()
                .add(id)
                .cast::<u8>();
            core::ptr::copy_nonoverlapping(buffer.add(NET_HEADER_LEN), out.as_mut_ptr(), length);
        }
        self.give_receive_buffer(id as u16);
        write(self.base, QUEUE_NOTIFY, RECEIVE_QUEUE);
        Some(length)
    }

    /// The device's interrupt source on the PLIC (to let it end a `wfi`).
    pub(crate) fn interrupt(&self) -> u32 {
        self.interrupt
    }

    /// Whether a received frame waits.
    pub(crate) fn has_received(&self) -> bool {
        let queue = queue(true);
        // SAFETY: a volatile read of the device-written index.
        let used = unsafe { addr_of!((*queue).used.index).read_volatile() };
        used != self.receive_used
    }

    /// Acknowledges the device's interrupts (the firmware polls; they only end a `wfi`).
    pub(crate) fn acknowledge_interrupts(&mut self) {
        let pending = read(self.base, INTERRUPT_STATUS);
        if pending != 0 {
            write(self.base, INTERRUPT_ACK, pending);
        }
    }
}

/// This NIC's address on QEMU's user-mode network (its built-in DHCP server's first lease).
const USER_NETWORK_ADDRESS: Ipv4Address = Ipv4Address([10, 0, 2, 15]);
/// The user-mode network's gateway, which answers ARP.
const USER_NETWORK_GATEWAY: Ipv4Address = Ipv4Address([10, 0, 2, 2]);

/// Asks the user-mode network's gateway for its MAC address with ARP and prints the answer (or
/// that none came within 100 ms): transmission and reception through the device, end to end.
pub(crate) fn link_check(
    net: &mut VirtioNet,
    frame: &mut [u8; MAX_FRAME_LEN],
    uart: &mut Ns16550<MachineTimer>,
    timer: &MachineTimer,
) {
    let request = Arp {
        operation: ArpOperation::REQUEST,
        sender_mac: net.mac(),
        sender_ip: USER_NETWORK_ADDRESS,
        target_mac: MacAddress::default(),
        target_ip: USER_NETWORK_GATEWAY,
    };
    let sent = build_arp(frame, MacAddress::BROADCAST, &request)
        .ok()
        .and_then(|len| frame.get(..len))
        .map(|bytes| net.transmit(bytes));
    if sent != Some(Ok(())) {
        uart.write_str("virtio-net: the ARP request could not be sent\r\n");
        return;
    }
    let start = timer.ticks();
    while timer.ticks().wrapping_sub(start)
        < MachineTimer::ticks_in(core::time::Duration::from_millis(100))
    {
        net.acknowledge_interrupts();
        let Some(len) = net.receive(frame) else {
            continue;
        };
        if let Ok(Frame::Arp(reply)) = parse_frame(frame.get(..len).unwrap_or(&[])) {
            if reply.operation == ArpOperation::REPLY && reply.sender_ip == USER_NETWORK_GATEWAY {
                uart.write_str("virtio-net: gateway 10.0.2.2 is at ");
                uart.write_mac(reply.sender_mac.0);
                uart.write_str("\r\n");
                return;
            }
        }
    }
    uart.write_str("virtio-net: no ARP reply from the gateway within 100 ms\r\n");
}
