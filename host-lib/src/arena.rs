//! The DMA arena's allocator: first fit over the arena's offsets, with free ranges merged on
//! release. Plain bookkeeping: the bytes are the mapping's ([`crate::raw::region`]).

use std::collections::BTreeMap;

/// Allocations are rounded up to this many bytes, and start on a multiple of it (a cache line).
pub const DMA_ALIGN: usize = 64;

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
