//! Finding the port windows: one `ivshmem-plain` PCI device per port, whose shared-memory BAR
//! (BAR 2) is the memory the host hands a process as its port region.
//!
//! There is no firmware before this one to assign BARs, so the board does it for its own devices:
//! for region `r` of port `p` it looks at bus 0, slot [`PORT_FIRST_SLOT`]` + p`, function `r`
//! through the ECAM window, checks the vendor and device ids, sizes BAR 2 (write all ones, read
//! the mask back), and places it at [`region_window_address`]`(p, r)` in the PCIe memory window,
//! which the virt machine maps one to one. A function without the device, or with a BAR of another
//! size, leaves that region without a window: opening the port on it then fails with `NO_REGION`,
//! and nothing else is touched.
#![allow(unsafe_code, reason = "naming configuration-space registers")]

use shared_abi::ids::PORTS_PER_NIC;
use shared_abi::qemu::layout::{
    IVSHMEM_DEVICE, IVSHMEM_VENDOR, PCI_ECAM_BASE, PORT_FIRST_SLOT, PORT_REGIONS, PORT_WINDOW_LEN,
    region_window_address,
};
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

/// Every port's pool of region windows, by port and region.
pub(crate) type PortWindows = [[Option<Window>; PORT_REGIONS]; PORTS_PER_NIC];

/// Finds and places the windows of every port's regions.
pub(crate) fn place_port_windows() -> PortWindows {
    let mut windows = [[None; PORT_REGIONS]; PORTS_PER_NIC];
    for (port, regions) in windows.iter_mut().enumerate() {
        for (region, window) in regions.iter_mut().enumerate() {
            *window = place(port, region);
        }
    }
    windows
}

fn config(slot: u8, function: u8, offset: usize) -> VolatilePtr<'static, u32> {
    let address = PCI_ECAM_BASE as usize
        + ((slot as usize & 0x1f) << 15)
        + ((function as usize & 0x7) << 12)
        + offset;
    // SAFETY: the virt machine's ECAM covers bus 0 at this base; every function's 4 KiB of
    // configuration space answers 32-bit accesses (all ones where no device is). Slot and
    // function are masked to their 5 and 3 bits, so the address stays within bus 0.
    unsafe { mmio::register(address) }
}

fn place(port: usize, region: usize) -> Option<Window> {
    let address = region_window_address(port, region)?;
    let slot = PORT_FIRST_SLOT.checked_add(port as u8)?;
    let function = region as u8;
    let expected_id = (u32::from(IVSHMEM_DEVICE) << 16) | u32::from(IVSHMEM_VENDOR);
    if config(slot, function, ID).read() != expected_id {
        return None;
    }
    let command = config(slot, function, COMMAND);
    command.update(|bits| bits & !COMMAND_MEMORY);
    let (low, high) = (
        config(slot, function, BAR2_LOW),
        config(slot, function, BAR2_HIGH),
    );
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
