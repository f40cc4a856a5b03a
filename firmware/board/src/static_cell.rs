//! A place in `.bss` for the firmware's large state (the NIC is over 100 KiB, more than the
//! whole stack), initialised once at run time.
#![allow(
    unsafe_code,
    reason = "handing out the one mutable reference to a static"
)]

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, Ordering};

/// A static that is written once and then lent out mutably, once.
pub(crate) struct StaticCell<T> {
    taken: AtomicBool,
    value: UnsafeCell<MaybeUninit<T>>,
}

// SAFETY: the value is reachable only through the one `&'static mut` that `init_with` hands out
// (the flag makes a second call fail), so sharing the cell shares no access to the value. `T` need
// not be `Send`: one hart runs Rust (the entry code parks the others), so the value never
// changes hands.
unsafe impl<T> Sync for StaticCell<T> {}

impl<T> StaticCell<T> {
    /// An empty cell.
    pub(crate) const fn new() -> Self {
        Self {
            taken: AtomicBool::new(false),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// Builds the value with `make` directly in the cell (the optimiser writes it in place rather
    /// than on the stack: `make` is inlined into the write) and lends it out. `None` if the cell
    /// was taken before.
    #[inline(always)]
    #[allow(
        clippy::mut_from_ref,
        reason = "the one mutable reference the cell ever lends: the flag refuses a second"
    )]
    pub(crate) fn init_with(&'static self, make: impl FnOnce() -> T) -> Option<&'static mut T> {
        if self.taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        // SAFETY: the flag was clear, so no reference to the value exists, and none will be made
        // but this one: the cell is `'static`, so the reference is valid for as long as it says.
        Some(unsafe { (*self.value.get()).write(make()) })
    }
}
