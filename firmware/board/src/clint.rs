//! The machine timer of the `virt` machine's CLINT: the firmware's clock, its wake-up alarm, and
//! the board's [`DelayNs`] provider.
//!
//! `mtime` counts at 10 MHz from reset. `mtimecmp` of hart 0 raises the machine timer interrupt
//! while `mtime >= mtimecmp`; with `mie.MTIE` set (and `mstatus.MIE` clear, so nothing traps) that
//! ends a `wfi`, which is all the firmware uses it for.
#![allow(unsafe_code, reason = "naming the CLINT registers")]

use core::time::Duration;

use embedded_hal::delay::DelayNs;
use firmware::Instant;
use volatile::VolatilePtr;

use crate::mmio;

const CLINT_BASE: usize = 0x0200_0000;
const MTIMECMP_HART0: usize = CLINT_BASE + 0x4000;
const MTIME: usize = CLINT_BASE + 0xbff8;
/// Timer ticks per second on the virt machine.
pub(crate) const TICKS_PER_SECOND: u64 = 10_000_000;
const NANOS_PER_TICK: u64 = 1_000_000_000 / TICKS_PER_SECOND;

/// Hart 0's machine timer.
#[derive(Clone, Copy)]
pub(crate) struct MachineTimer {
    time_low: VolatilePtr<'static, u32>,
    time_high: VolatilePtr<'static, u32>,
    compare_low: VolatilePtr<'static, u32>,
    compare_high: VolatilePtr<'static, u32>,
}

impl MachineTimer {
    /// The virt machine's timer for hart 0.
    pub(crate) fn virt() -> Self {
        // SAFETY: the CLINT maps mtime and hart 0's mtimecmp as pairs of 32-bit words at these
        // addresses for the whole run.
        unsafe {
            Self {
                time_low: mmio::register(MTIME),
                time_high: mmio::register(MTIME + 4),
                compare_low: mmio::register(MTIMECMP_HART0),
                compare_high: mmio::register(MTIMECMP_HART0 + 4),
            }
        }
    }

    /// Ticks since reset. Reads the high word around the low one, so a carry between the two
    /// reads is never seen half-done.
    pub(crate) fn ticks(&self) -> u64 {
        loop {
            let high = self.time_high.read();
            let low = self.time_low.read();
            if self.time_high.read() == high {
                return (u64::from(high) << 32) | u64::from(low);
            }
        }
    }

    /// Now, as the firmware counts time.
    pub(crate) fn now(&self) -> Instant {
        Instant::from_nanos(self.ticks().saturating_mul(NANOS_PER_TICK))
    }

    /// The tick count of `instant`, rounded up.
    pub(crate) fn ticks_at(instant: Instant) -> u64 {
        instant.as_nanos().div_ceil(NANOS_PER_TICK)
    }

    /// Ticks in `duration`, rounded up.
    pub(crate) const fn ticks_in(duration: Duration) -> u64 {
        (duration.as_nanos() as u64).div_ceil(NANOS_PER_TICK)
    }

    /// Raises the timer interrupt from tick `ticks` on (at once if that has passed).
    pub(crate) fn wake_at(&mut self, ticks: u64) {
        // The usual RV32 sequence: park the high word at the maximum so that no intermediate
        // value fires early, write the low word, then the real high word.
        self.compare_high.write(u32::MAX);
        self.compare_low.write(ticks as u32);
        self.compare_high.write((ticks >> 32) as u32);
    }
}

impl DelayNs for MachineTimer {
    fn delay_ns(&mut self, ns: u32) {
        let end = self
            .ticks()
            .saturating_add(u64::from(ns).div_ceil(NANOS_PER_TICK));
        while self.ticks() < end {
            core::hint::spin_loop();
        }
    }
}
