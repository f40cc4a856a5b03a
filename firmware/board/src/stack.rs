//! The stack's high-water mark, measured: the entry code paints the whole stack with
//! [`STACK_PAINT`] before any Rust runs; a word that no longer holds the paint was written by some
//! frame. The deepest such word, counted from the top, is the most stack ever used (a frame that
//! reserved space it never wrote is not seen, so this is a measurement of the runs that happened,
//! not a bound).
#![allow(
    unsafe_code,
    reason = "reading the painted stack below the live frames"
)]

use crate::entry::STACK_PAINT;

unsafe extern "C" {
    /// Lowest address of the usable stack (above the guard), from the linker script.
    static _sstack: u32;
    /// One past the highest address of the stack, from the linker script.
    static _stack_top: u32;
}

/// Measures the stack.
pub(crate) struct StackGauge {
    bottom: usize,
    top: usize,
    /// The lowest address found written so far.
    lowest_written: usize,
}

impl StackGauge {
    /// A gauge over the linker script's stack.
    pub(crate) fn new() -> Self {
        let bottom = (&raw const _sstack).addr();
        let top = (&raw const _stack_top).addr();
        Self {
            bottom,
            top,
            lowest_written: top,
        }
    }

    /// Bytes of stack the linker script gives.
    pub(crate) fn size(&self) -> u32 {
        (self.top - self.bottom) as u32
    }

    /// Most bytes used so far, then starts measuring afresh from the caller's frame down: the
    /// stack below the current stack pointer (dead: the RISC-V ABI has no red zone) is painted
    /// again. Call it once boot is over, so that the main loop's own mark is measured apart from
    /// boot's.
    #[inline(never)]
    pub(crate) fn restart(&mut self) -> u32 {
        let so_far = self.high_water();
        let stack_pointer: usize;
        // SAFETY: reads the stack pointer into a register; touches no memory.
        unsafe {
            core::arch::asm!("mv {0}, sp", out(reg) stack_pointer, options(nomem, nostack, preserves_flags));
        }
        let mut address = self.bottom;
        while address < stack_pointer & !3 && address < self.top {
            let pointer = core::ptr::with_exposed_provenance_mut::<u32>(address);
            // SAFETY: `address` is 4-aligned, inside the stack region, and below this function's
            // stack pointer: no frame lives there (the loop keeps its state in registers), and no
            // interrupt handler can push one (none is ever taken).
            unsafe { pointer.write_volatile(STACK_PAINT) };
            address += 4;
        }
        // Not `clamp`, which asserts its bounds (a panic path) where these are known ordered.
        self.lowest_written = stack_pointer.max(self.bottom).min(self.top);
        so_far
    }

    /// Most bytes used since boot (or since [`StackGauge::restart`]). Scans only below the deepest word found so far, so a call
    /// costs little once the mark has settled. Call it from a shallow frame (the main loop): the
    /// scan reads words below its own frame only.
    pub(crate) fn high_water(&mut self) -> u32 {
        let mut address = self.bottom;
        while address < self.lowest_written {
            let pointer = core::ptr::with_exposed_provenance::<u32>(address);
            // SAFETY: `address` is 4-aligned and inside the stack region the linker script
            // reserved (`bottom <= address < lowest_written <= top`), which is RAM outside every
            // Rust object except stack frames; one hart runs and nothing traps, so no frame is
            // written while this volatile read of a whole word happens.
            if unsafe { pointer.read_volatile() } != STACK_PAINT {
                self.lowest_written = address;
                break;
            }
            address += 4;
        }
        (self.top - self.lowest_written) as u32
    }
}
