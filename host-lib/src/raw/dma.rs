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

use std::ptr::NonNull;
use std::sync::Arc;

use super::region::Region;
use crate::error::Error;

pub use crate::arena::DMA_ALIGN;

/// Allocates `len` bytes from `region`'s arena, or `None` if no free range is large enough.
pub(crate) fn allocate(region: &Arc<Region>, len: usize) -> Option<DmaBuffer> {
    let (offset, pointer) = region.take(len)?;
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
    pub fn belongs_to(&self, region: &Arc<Region>) -> bool {
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
        self.region.give_back(self.offset, self.len);
    }
}

/// A send or a provide was refused; the buffer is the caller's again.
#[derive(Debug)]
pub struct BufferError {
    /// Why.
    pub error: Error,
    /// The buffer handed in.
    pub buffer: DmaBuffer,
}

impl std::fmt::Display for BufferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for BufferError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
