//! Bulk copies to and from memory the NIC writes behind the process's back, as byte-wise
//! atomic accesses (C++'s P1478 "byte-wise atomic memcpy"): each byte read or written once,
//! relaxed, so a copy racing with the NIC — or with another thread copying the same bytes —
//! yields some interleaving of whole bytes and is never a data race.
//!
//! On x86-64 that is `rep movsb`, which is exactly such a sequence of byte accesses and copies
//! as fast as `memcpy` (where the 64-bit atomic words [`super::memory::SharedBytes`] falls back
//! to elsewhere copy at about two thirds of its speed: the ranks of a long allreduce copy every
//! byte they send and receive once). Rust has no byte-wise atomic copy of its own yet, and
//! `memcpy` through a raw pointer would be a data race in its memory model, so the instruction
//! is written out.
#![allow(
    unsafe_code,
    reason = "the copy is one instruction the compiler cannot express safely"
)]

/// Whether this target has the byte-wise atomic copy; without it [`super::memory::SharedBytes`]
/// copies a 64-bit atomic word at a time.
pub(crate) const AVAILABLE: bool = cfg!(all(target_arch = "x86_64", not(miri)));

/// Copies `len` bytes from `source` to `target` as byte-wise relaxed atomic loads and stores.
///
/// # Safety
/// `source..source + len` must be valid for reads and `target..target + len` for writes (either
/// may be written concurrently by others, as atomics may), and the two must not overlap.
#[cfg(all(target_arch = "x86_64", not(miri)))]
pub(crate) unsafe fn copy(source: *const u8, target: *mut u8, len: usize) {
    // SAFETY: the caller's ranges; `rep movsb` reads and writes exactly them, a byte at a time
    // as far as any observer can tell, forward (Rust guarantees the direction flag clear in
    // inline assembly), and touches no stack or flags.
    unsafe {
        core::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rsi") source => _,
            inout("rdi") target => _,
            options(nostack, preserves_flags)
        );
    }
}

/// Never called: [`AVAILABLE`] is false on this target.
///
/// # Safety
/// As on x86-64.
#[cfg(not(all(target_arch = "x86_64", not(miri))))]
pub(crate) unsafe fn copy(_source: *const u8, _target: *mut u8, _len: usize) {
    unreachable!("no byte-wise atomic copy on this target")
}
