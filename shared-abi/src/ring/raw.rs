//! [`SharedMemory`] over a raw mapping: the one place in this crate with `unsafe` code.
//!
//! The memory may be written by the other side at any moment, so this module never creates a
//! Rust reference (`&`/`&mut`) to it: indexes are accessed as atomics through raw pointers, and
//! bulk bytes are copied with volatile accesses, which the compiler may neither elide nor merge.
//! Ordering between the two comes from the index atomics, never from `volatile`.
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
        for (i, byte) in out.iter_mut().enumerate() {
            // SAFETY: `offset + i < offset + out.len() <= self.len` (checked above), so the
            // pointer is inside the region, which is valid for reads.
            *byte = unsafe { self.base.as_ptr().add(offset + i).read_volatile() };
        }
        Ok(())
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        check_range(self.len, offset, data.len())?;
        for (i, byte) in data.iter().enumerate() {
            // SAFETY: as in `read`: inside the region, which is valid for writes.
            unsafe { self.base.as_ptr().add(offset + i).write_volatile(*byte) };
        }
        Ok(())
    }
}
