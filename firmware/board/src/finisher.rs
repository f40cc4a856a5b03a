//! The `virt` machine's test finisher (SiFive test device): the firmware's way to stop the
//! machine, which makes QEMU exit with a status the host reads.
#![allow(unsafe_code, reason = "naming the finisher register")]

use crate::mmio;

/// Physical address of the finisher.
const FINISHER_BASE: usize = 0x0010_0000;
/// Written alone: power off, QEMU exits with status 0.
const PASS: u32 = 0x5555;
/// Written with the exit status in the upper half: QEMU exits with that status.
const FAIL: u32 = 0x3333;

/// QEMU's exit status when the firmware refused its configuration.
pub(crate) const EXIT_BAD_CONFIGURATION: u16 = 98;
/// QEMU's exit status when the firmware panicked.
pub(crate) const EXIT_PANIC: u16 = 99;
// A trap exits with 100 + mcause (the entry code's trap handler writes it).

/// Powers the machine off.
pub(crate) fn power_off() -> ! {
    write(PASS)
}

/// Stops the machine; QEMU exits with `status`.
pub(crate) fn fail(status: u16) -> ! {
    write((u32::from(status) << 16) | FAIL)
}

fn write(value: u32) -> ! {
    // SAFETY: the finisher's one register is at this address on the virt machine.
    let register = unsafe { mmio::register(FINISHER_BASE) };
    register.write(value);
    // QEMU stops at the write; a machine without the finisher stops here instead.
    crate::entry::halt()
}
