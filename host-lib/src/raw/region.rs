//! A port's mapped region: its layout, its memory (the rings and the arena), and the arena's
//! allocator. Shared by the port and its DMA buffers (a buffer keeps the mapping alive after the
//! port closes).

use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};

use shared_abi::region::RegionLayout;
use shared_abi::ring::raw::RawMemory;

use super::control::Mapping;
use crate::arena::Arena;

/// A port's mapped region and its arena allocator.
#[derive(Debug)]
pub struct Region {
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

    /// The region's memory: rings, headers and arena, as the NIC shares them.
    pub fn memory(&self) -> &RawMemory {
        self.mapping.memory()
    }

    /// Where the rings and the arena lie.
    pub fn layout(&self) -> &RegionLayout {
        &self.layout
    }

    /// Free bytes in the arena (possibly in several pieces).
    pub fn arena_free(&self) -> usize {
        self.arena
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .free_bytes()
    }

    /// Takes `len` bytes of the arena: their arena offset and where they are mapped, or `None` if
    /// no free range is that long.
    pub(crate) fn take(&self, len: usize) -> Option<(usize, NonNull<u8>)> {
        let offset = self
            .arena
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .allocate(len)?;
        let pointer = self
            .layout
            .arena_offset
            .checked_add(offset)
            .and_then(|at| self.mapping.pointer(at, len));
        match pointer {
            Some(pointer) => Some((offset, pointer)),
            None => {
                self.give_back(offset, len);
                None
            }
        }
    }

    /// Returns the `len` bytes at arena `offset` to the allocator.
    pub(crate) fn give_back(&self, offset: usize, len: usize) {
        self.arena
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .free(offset, len);
    }
}
