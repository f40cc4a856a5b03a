//! The `virt` machine's PLIC, as far as the firmware needs it: one source (the UART's) routed to
//! hart 0's machine-mode context, so that a byte from the host ends a `wfi`.
#![allow(unsafe_code, reason = "naming the PLIC registers")]

use crate::mmio;

const PLIC_BASE: usize = 0x0c00_0000;
/// Hart 0's machine-mode context on the virt machine (contexts go M, S per hart).
const CONTEXT: usize = 0;
const PRIORITY: usize = PLIC_BASE;
const ENABLE: usize = PLIC_BASE + 0x2000 + 0x80 * CONTEXT;
const THRESHOLD: usize = PLIC_BASE + 0x20_0000 + 0x1000 * CONTEXT;
const CLAIM: usize = THRESHOLD + 4;

/// The UART0 interrupt source on the virt machine.
pub(crate) const UART0_SOURCE: u32 = 10;

/// Routes `source` to hart 0 in machine mode at priority 1, above a threshold of 0.
pub(crate) fn enable(source: u32) {
    let word = (source / 32) as usize;
    // SAFETY: the PLIC's priority, enable and threshold words of context 0 are at these
    // addresses on the virt machine; `source` is below 32 * 32, inside the enable block.
    let (priority, enable, threshold) = unsafe {
        (
            mmio::register(PRIORITY + 4 * source as usize),
            mmio::register(ENABLE + 4 * word),
            mmio::register(THRESHOLD),
        )
    };
    priority.write(1);
    enable.update(|bits| bits | (1 << (source % 32)));
    threshold.write(0);
}

/// Claims and completes every pending interrupt (after the device's own condition was cleared),
/// so the next one is delivered. Returns how many there were.
pub(crate) fn acknowledge_all() -> u32 {
    // SAFETY: context 0's claim/complete word is at this address on the virt machine.
    let claim = unsafe { mmio::register(CLAIM) };
    let mut count = 0;
    // The PLIC has 96 sources on virt: a bounded loop, in case a source keeps re-asserting.
    for _ in 0..96 {
        let source = claim.read();
        if source == 0 {
            break;
        }
        claim.write(source);
        count += 1;
    }
    count
}
