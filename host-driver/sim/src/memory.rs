//! Host memory for simulated ports: heap blocks wrapped as [`RawMemory`], exactly as the
//! emulator wraps a mapped region, so the simulator runs the real ring code.
#![allow(
    unsafe_code,
    reason = "wraps an owned heap block as a raw shared region"
)]

use std::ptr::NonNull;

use shared_abi::ring::raw::RawMemory;

/// An owned, 8-aligned, zeroed block of simulated host memory.
pub struct HeapRegion {
    // Field order matters: `memory` points into `_storage` and must not outlive it; both drop
    // together and `RawMemory` has no drop glue.
    memory: RawMemory,
    _storage: Vec<u64>,
}

impl HeapRegion {
    /// A zeroed region of `len` bytes.
    pub fn new(len: usize) -> Self {
        let mut storage = vec![0u64; len.div_ceil(8)];
        let base = NonNull::new(storage.as_mut_ptr().cast::<u8>()).unwrap_or(NonNull::dangling());
        // SAFETY: `storage` is a live heap allocation of at least `len` bytes, 8-aligned (it holds
        // `u64`s), and it is moved into `Self` next to `memory`: the heap block never moves and is
        // freed only when `Self` drops, after which `memory` is gone too.
        let memory = unsafe { RawMemory::new(base, len) };
        Self {
            memory,
            _storage: storage,
        }
    }

    /// The region as shared memory.
    pub fn memory(&self) -> &RawMemory {
        &self.memory
    }
}
