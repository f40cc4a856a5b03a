//! Finding the port windows: one `ivshmem-plain` PCI device per port, whose shared-memory BAR
//! (BAR 2) is the memory the host hands a process as its port region.
//!
//! There is no firmware before this one to assign BARs, so the board does it for its own devices:
//! for port `p` it looks at bus 0, slot [`PORT_FIRST_SLOT`]` + p` through the ECAM window, checks
//! the vendor and device ids, sizes BAR 2 (write all ones, read the mask back), and places it at
//! [`port_window_address`]`(p)` in the PCIe memory window, which the virt machine maps one to one.
//! A slot without the device, or with a BAR of another size, leaves the port without a window:
//! opening it then fails with `NO_REGION`, and nothing else is touched.
#![allow(unsafe_code, reason = "naming configuration-space registers")]

use board::layout::{
    IVSHMEM_DEVICE, IVSHMEM_VENDOR, PCI_ECAM_BASE, PORT_FIRST_SLOT, PORT_WINDOW_LEN,
    port_window_address,
};
use shared_abi::ids::PORTS_PER_NIC;
use volatile::VolatilePtr;

use crate::mmio;

const ID: usize = 0x00;
const COMMAND: usize = 0x04;
const BAR2_LOW: usize = 0x18;
const BAR2_HIGH: usize = 0x1c;
/// Command register: respond to memory-space accesses.
const COMMAND_MEMORY: u32 = 1 << 1;
/// BAR bits 2:1 = 0b10: a 64-bit memory BAR.
const BAR_TYPE_64: u32 = 0b100;
const BAR_TYPE_MASK: u32 = 0b111;

/// Where a port's memory appears to the core.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Window {
    /// Guest-physical address.
    pub(crate) address: u32,
    /// Length in bytes.
    pub(crate) length: u32,
}

/// Finds and places the port windows.
pub(crate) fn place_port_windows() -> [Option<Window>; PORTS_PER_NIC] {
    let mut windows = [None; PORTS_PER_NIC];
    for (port, window) in windows.iter_mut().enumerate() {
        *window = place(port);
    }
    windows
}

fn config(slot: u8, offset: usize) -> VolatilePtr<'static, u32> {
    let address = PCI_ECAM_BASE as usize + ((slot as usize) << 15) + offset;
    // SAFETY: the virt machine's ECAM covers bus 0 at this base; every function's 4 KiB of
    // configuration space answers 32-bit accesses (all ones where no device is).
    unsafe { mmio::register(address) }
}

fn place(port: usize) -> Option<Window> {
    let address = port_window_address(port)?;
    let slot = PORT_FIRST_SLOT.checked_add(port as u8)?;
    let expected_id = (u32::from(IVSHMEM_DEVICE) << 16) | u32::from(IVSHMEM_VENDOR);
    if config(slot, ID).read() != expected_id {
        return None;
    }
    let command = config(slot, COMMAND);
    command.update(|bits| bits & !COMMAND_MEMORY);
    let (low, high) = (config(slot, BAR2_LOW), config(slot, BAR2_HIGH));
    low.write(u32::MAX);
    high.write(u32::MAX);
    let mask_low = low.read();
    let mask_high = high.read();
    if mask_low & BAR_TYPE_MASK != BAR_TYPE_64 || mask_high != u32::MAX {
        return None;
    }
    let length = (!(mask_low & !0xf)).wrapping_add(1);
    if length as usize != PORT_WINDOW_LEN {
        return None;
    }
    low.write(address);
    high.write(0);
    command.update(|bits| bits | COMMAND_MEMORY);
    Some(Window { address, length })
}
