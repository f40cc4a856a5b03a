//! [`SharedMemory`] over a raw mapping: the one place in this crate with `unsafe` code.
//!
//! The memory may be written by the other side at any moment, so this module never creates a
//! Rust reference (`&`/`&mut`) to it: indexes are accessed as atomics through raw pointers, and
//! bulk bytes are copied as byte-wise atomic accesses ([`copy_bytewise`]) where the target has
//! them, else with volatile accesses; the compiler may neither elide nor merge either. Ordering
//! between the two comes from the index atomics, never from the copies.
#![allow(
    unsafe_code,
    reason = "this module is the raw-memory boundary of the ABI crate"
)]

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use super::{OutOfBounds, SharedMemory, check_range};

/// A region of raw memory shared with the other side, such as a mapped port region.
#[derive(Debug)]
pub struct RawMemory {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: `RawMemory` is a pointer and a length; every access through it is atomic or a volatile
// copy whose races the ring protocol tolerates by design (the other side is untrusted anyway), so
// sharing it across threads adds no hazard that sharing with the other process does not.
unsafe impl Send for RawMemory {}
// SAFETY: as for `Send`: no method hands out references, and all accesses are atomics or volatile.
unsafe impl Sync for RawMemory {}

impl RawMemory {
    /// Wraps `len` bytes at `base`.
    ///
    /// # Safety
    /// `base..base + len` must be valid for reads and writes, 8-aligned at `base`, and stay
    /// mapped for the life of the `RawMemory` (the caller keeps the mapping alive). Other
    /// parties may write it concurrently.
    pub const unsafe fn new(base: NonNull<u8>, len: usize) -> Self {
        Self { base, len }
    }

    /// The base address (for translating host pointers into region offsets).
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    fn word(&self, offset: usize) -> Result<&AtomicU32, OutOfBounds> {
        check_range(self.len, offset, 4)?;
        if offset % 4 != 0 {
            return Err(OutOfBounds { offset, len: 4 });
        }
        // SAFETY: the range is inside the region (checked above), the region is 8-aligned at its
        // base and the offset is 4-aligned, so the pointer is a valid, aligned `u32` location for
        // the life of `self`. A shared reference to an `AtomicU32` is sound even though the other
        // side writes the word: all accesses to it are atomic.
        Ok(unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU32>() })
    }
}

impl SharedMemory for RawMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn load_acquire(&self, offset: usize) -> Result<u32, OutOfBounds> {
        Ok(self.word(offset)?.load(Ordering::Acquire))
    }

    fn store_release(&self, offset: usize, value: u32) -> Result<(), OutOfBounds> {
        self.word(offset)?.store(value, Ordering::Release);
        Ok(())
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds> {
        check_range(self.len, offset, out.len())?;
        // SAFETY: `offset..offset + out.len()` is inside the region (checked above), which is
        // valid for reads; `out` is the caller's and cannot overlap the mapping it has no
        // reference into.
        unsafe {
            let source = self.base.as_ptr().add(offset);
            if BYTEWISE_COPY {
                copy_bytewise(source, out.as_mut_ptr(), out.len());
            } else {
                copy_from_volatile(source, out);
            }
        }
        Ok(())
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        check_range(self.len, offset, data.len())?;
        // SAFETY: as in `read`: inside the region, which is valid for writes.
        unsafe {
            let target = self.base.as_ptr().add(offset);
            if BYTEWISE_COPY {
                copy_bytewise(data.as_ptr(), target, data.len());
            } else {
                copy_to_volatile(data, target);
            }
        }
        Ok(())
    }
}

/// Whether this target has [`copy_bytewise`]; without it the copies go in volatile chunks.
pub const BYTEWISE_COPY: bool = cfg!(all(target_arch = "x86_64", not(miri)));

/// Copies `len` bytes from `source` to `target` as byte-wise relaxed atomic loads and stores
/// (C++'s P1478 "byte-wise atomic memcpy"): each byte read or written once, so a copy racing
/// with the other side yields some interleaving of whole bytes and is never a data race.
///
/// On x86-64 that is `rep movsb`, which is exactly such a sequence of byte accesses and copies
/// as fast as `memcpy`, where 16-byte volatile chunks are not: with it the emulated NIC, which
/// copies every byte of a put twice, took a 1 MiB allreduce at 8 processes to 0.76 of the time
/// (docs/long-allreduce.md), and the ranks of a long allreduce copy every byte they send and
/// receive once. Rust has no
/// byte-wise atomic copy of its own yet, and `memcpy` through a raw pointer would be a data race
/// in its memory model, so the instruction is written out.
///
/// # Safety
/// `source..source + len` must be valid for reads and `target..target + len` for writes (either
/// may be written concurrently by others, as atomics may), and the two must not overlap.
#[cfg(all(target_arch = "x86_64", not(miri)))]
pub unsafe fn copy_bytewise(source: *const u8, target: *mut u8, len: usize) {
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

/// Never called: [`BYTEWISE_COPY`] is false on this target.
///
/// # Safety
/// As on x86-64.
#[cfg(not(all(target_arch = "x86_64", not(miri))))]
pub unsafe fn copy_bytewise(_source: *const u8, _target: *mut u8, _len: usize) {
    unreachable!("no byte-wise atomic copy on this target")
}

/// The unit of the bulk copies' volatile accesses where there is no [`copy_bytewise`]: 16 bytes
/// where every processor of the architecture has them, a word elsewhere (16 bytes at a time ran
/// at twice the speed of words on x86-64).
#[cfg(target_arch = "x86_64")]
type Chunk = core::arch::x86_64::__m128i;
#[cfg(not(target_arch = "x86_64"))]
type Chunk = u64;

/// Bytes per volatile access of the bulk copies.
const CHUNK: usize = core::mem::size_of::<Chunk>();

/// Copies `out.len()` bytes from `source` into `out` with volatile reads: single bytes up to
/// the first [`CHUNK`]-aligned address of `source`, aligned chunks after, single bytes at the
/// end.
///
/// # Safety
/// `source..source + out.len()` must be valid for reads.
unsafe fn copy_from_volatile(source: *const u8, out: &mut [u8]) {
    let head = source.align_offset(CHUNK).min(out.len());
    let (first, rest) = out.split_at_mut(head);
    for (at, byte) in first.iter_mut().enumerate() {
        // SAFETY: `at < head <= out.len()`, inside the range.
        *byte = unsafe { source.add(at).read_volatile() };
    }
    // SAFETY: `head` bytes in, still inside the range, and aligned (or the range's end).
    let source = unsafe { source.add(head) };
    let whole = rest.len() / CHUNK;
    let into = rest.as_mut_ptr().cast::<Chunk>();
    for index in 0..whole {
        // SAFETY: chunk `index` from the aligned `source` lies inside the range, and chunk
        // `index` of `rest` inside it (unaligned, so written as such).
        unsafe {
            let chunk = source.cast::<Chunk>().add(index).read_volatile();
            into.add(index).write_unaligned(chunk);
        }
    }
    for (at, byte) in rest.iter_mut().enumerate().skip(whole * CHUNK) {
        // SAFETY: `at < rest.len()`, inside the range.
        *byte = unsafe { source.add(at).read_volatile() };
    }
}

/// Copies `data` to `target` with volatile writes, as [`copy_from_volatile`] reads.
///
/// # Safety
/// `target..target + data.len()` must be valid for writes.
unsafe fn copy_to_volatile(data: &[u8], target: *mut u8) {
    let head = target.align_offset(CHUNK).min(data.len());
    let (first, rest) = data.split_at(head);
    for (at, &byte) in first.iter().enumerate() {
        // SAFETY: `at < head <= data.len()`, inside the range.
        unsafe { target.add(at).write_volatile(byte) };
    }
    // SAFETY: `head` bytes in, still inside the range, and aligned (or the range's end).
    let target = unsafe { target.add(head) };
    let whole = rest.len() / CHUNK;
    let from = rest.as_ptr().cast::<Chunk>();
    for index in 0..whole {
        // SAFETY: chunk `index` of `rest` lies inside it (unaligned, so read as such), and
        // chunk `index` from the aligned `target` inside the range.
        unsafe {
            let chunk = from.add(index).read_unaligned();
            target.cast::<Chunk>().add(index).write_volatile(chunk);
        }
    }
    for (at, &byte) in rest.iter().enumerate().skip(whole * CHUNK) {
        // SAFETY: `at < rest.len()`, inside the range.
        unsafe { target.add(at).write_volatile(byte) };
    }
}
