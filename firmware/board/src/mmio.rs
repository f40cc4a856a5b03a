//! Device registers at the fixed physical addresses of QEMU's `virt` machine.
//!
//! The one place the board turns an address into a [`VolatilePtr`]; the drivers ([`crate::clint`],
//! [`crate::plic`], [`crate::pci`], [`crate::finisher`]) are safe code over what it returns.
#![allow(
    unsafe_code,
    reason = "turning the machine's register addresses into pointers"
)]

use core::ptr::NonNull;

use volatile::VolatilePtr;

/// A 32-bit device register at `address`.
///
/// # Safety
/// `address` is a non-null, 4-aligned register (or RAM-backed word) of the machine, valid for
/// volatile 32-bit reads and writes for the rest of the program. Device registers are not Rust
/// memory: several pointers to one register are fine, each access being a single volatile access.
pub(crate) unsafe fn register(address: usize) -> VolatilePtr<'static, u32> {
    let pointer = core::ptr::with_exposed_provenance_mut::<u32>(address);
    // SAFETY: the caller vouches that the address is a valid, aligned, non-null register.
    unsafe { VolatilePtr::new(NonNull::new_unchecked(pointer)) }
}
