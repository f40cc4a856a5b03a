//! DMA buffers: allocations from a port's arena, named to the NIC by their arena offset. The one
//! module of this crate with `unsafe` code: the views of a buffer's bytes.
//!
//! The arena is memory the NIC shares, so a view into it is sound only while the NIC cannot write
//! those bytes. The NIC writes arena bytes only into a buffer named by a receive token the process
//! provided, and only until it reports that buffer's RECEIVED event (or refuses the token). So a
//! [`DmaBuffer`] is moved into the port when it is provided (or sent: the NIC reads a send buffer
//! until its SENT event, and retransmissions read it again) and handed back in the event that ends
//! the NIC's use of it. While the process holds a `DmaBuffer`, the NIC does not touch its bytes,
//! and the process may view them as ordinary `&[u8]`/`&mut [u8]`.
#![allow(
    unsafe_code,
    reason = "this module is the one place that turns arena memory into byte slices"
)]

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use nicbar_control::Mapping;
use shared_abi::region::RegionLayout;
use shared_abi::ring::raw::RawMemory;

/// Allocations are rounded up to this many bytes, and start on a multiple of it (a cache line).
pub const DMA_ALIGN: usize = 64;

/// A port's mapped region and its arena allocator, shared by the port and its buffers (a buffer
/// keeps the mapping alive after the port closes).
#[derive(Debug)]
pub(crate) struct Region {
    mapping: Mapping,
    layout: RegionLayout,
    arena: Mutex<Arena>,
}

impl Region {
    pub(crate) fn new(mapping: Mapping, layout: RegionLayout) -> Self {
        let arena = Arena::new(layout.arena_len);
        Self {
            mapping,
            layout,
            arena: Mutex::new(arena),
        }
    }

    pub(crate) fn memory(&self) -> &RawMemory {
        self.mapping.memory()
    }

    pub(crate) fn arena_free(&self) -> usize {
        self.arena
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .free_bytes()
    }
}

/// Allocates `len` bytes from `region`'s arena, or `None` if no free range is large enough.
pub(crate) fn allocate(region: &Arc<Region>, len: usize) -> Option<DmaBuffer> {
    let offset = region
        .arena
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .allocate(len)?;
    let region_offset = region.layout.arena_offset.checked_add(offset)?;
    let Some(pointer) = region.mapping.pointer(region_offset, len) else {
        region
            .arena
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .free(offset, len);
        return None;
    };
    Some(DmaBuffer {
        region: region.clone(),
        offset,
        len,
        pointer,
    })
}

/// A buffer in a port's DMA arena (GM's `gm_dma_malloc`). Dereferences to its bytes; freed when
/// dropped. Hand it to [`crate::Port::send`] or [`crate::Port::provide_receive_buffer`] and it
/// comes back in the event that ends the NIC's use of it.
#[derive(Debug)]
pub struct DmaBuffer {
    region: Arc<Region>,
    /// Offset within the arena: the buffer's name in tokens and events.
    offset: usize,
    len: usize,
    /// `region`'s mapping at `arena_offset + offset`, valid for `len` bytes.
    pointer: NonNull<u8>,
}

// SAFETY: a `DmaBuffer` owns its bytes exclusively (the module invariant above) and keeps the
// mapping alive through its `Arc<Region>`, which is `Send + Sync`; moving it to another thread
// moves that ownership, like a `Box<[u8]>`.
unsafe impl Send for DmaBuffer {}
// SAFETY: shared access gives only `&[u8]`, and no one writes the bytes while the buffer exists.
unsafe impl Sync for DmaBuffer {}

impl DmaBuffer {
    /// The buffer's offset in the arena: its name in tokens and events.
    pub fn arena_offset(&self) -> u64 {
        self.offset as u64
    }

    /// Whether the buffer belongs to the arena of `region`.
    pub(crate) fn belongs_to(&self, region: &Arc<Region>) -> bool {
        Arc::ptr_eq(&self.region, region)
    }
}

impl std::ops::Deref for DmaBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `pointer` is valid for `len` bytes of the mapping, which `self.region` keeps
        // mapped. The NIC does not write these bytes while the process holds the buffer (module
        // invariant), and the allocator gives no other `DmaBuffer` an overlapping range, so no
        // one writes them for the life of this shared borrow of `self`.
        unsafe { std::slice::from_raw_parts(self.pointer.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for DmaBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and the exclusive borrow of `self` makes this the only view of
        // the bytes in this process.
        unsafe { std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.len) }
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        self.region
            .arena
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .free(self.offset, self.len);
    }
}

/// A first-fit allocator over the arena's offsets, with free ranges merged on release.
#[derive(Debug)]
pub(crate) struct Arena {
    /// Free ranges: offset → length, disjoint and never adjacent.
    free: BTreeMap<usize, usize>,
}

impl Arena {
    pub(crate) fn new(len: usize) -> Self {
        let mut free = BTreeMap::new();
        let usable = len - len % DMA_ALIGN;
        if usable > 0 {
            free.insert(0, usable);
        }
        Self { free }
    }

    fn rounded(len: usize) -> Option<usize> {
        len.max(1).checked_next_multiple_of(DMA_ALIGN)
    }

    pub(crate) fn allocate(&mut self, len: usize) -> Option<usize> {
        let size = Self::rounded(len)?;
        let (&offset, &free) = self.free.iter().find(|(_, free)| **free >= size)?;
        self.free.remove(&offset);
        if free > size {
            self.free.insert(offset + size, free - size);
        }
        Some(offset)
    }

    pub(crate) fn free(&mut self, offset: usize, len: usize) {
        let Some(mut size) = Self::rounded(len) else {
            return;
        };
        let mut start = offset;
        if let Some(next) = self.free.remove(&(offset + size)) {
            size += next;
        }
        if let Some((&before, &before_len)) = self.free.range(..offset).next_back()
            && before + before_len == offset
        {
            self.free.remove(&before);
            start = before;
            size += before_len;
        }
        self.free.insert(start, size);
    }

    pub(crate) fn free_bytes(&self) -> usize {
        self.free.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_disjoint_and_merge_back() {
        let mut arena = Arena::new(4096);
        let a = arena.allocate(1).unwrap();
        let b = arena.allocate(100).unwrap();
        let c = arena.allocate(64).unwrap();
        assert_eq!((a, b, c), (0, 64, 192));
        assert_eq!(arena.free_bytes(), 4096 - 256);
        arena.free(b, 100);
        // First fit reuses the hole.
        assert_eq!(arena.allocate(65), Some(64));
        arena.free(64, 65);
        arena.free(a, 1);
        arena.free(c, 64);
        assert_eq!(arena.free_bytes(), 4096);
        assert_eq!(arena.free.len(), 1, "free ranges merge: {:?}", arena.free);
        assert_eq!(arena.allocate(4096), Some(0));
        assert_eq!(arena.allocate(1), None);
    }

    #[test]
    fn impossible_sizes_fail_cleanly() {
        let mut arena = Arena::new(1000);
        assert_eq!(arena.free_bytes(), 960);
        assert_eq!(arena.allocate(961), None);
        assert_eq!(arena.allocate(usize::MAX), None);
        assert_eq!(Arena::new(10).allocate(1), None);
    }
}
