//! Registered memory: ordinary memory of this process that the port's NIC reaches single-copy
//! (the emulated NIC with `process_vm_readv`/`process_vm_writev`), for puts, gets and atomics.
//!
//! [`RawPort::register_memory`] registers any range the process owns (`gm_register_memory`: a
//! `malloc`ed buffer, a stack array, a `Vec`) and is `unsafe`, since the NIC then writes it behind
//! the compiler's back. [`SharedBytes`] is memory safe code can register: bytes that are only
//! ever read and written with atomic operations, so a write by the NIC is never a data race with
//! the process.
//!
//! On Linux the daemon must be allowed to ptrace the process: the same user, and under Yama a
//! `kernel.yama.ptrace_scope` of 0 (or the process names the daemon with `prctl(PR_SET_PTRACER)`);
//! the registration fails with the daemon's explanation otherwise.
#![allow(
    unsafe_code,
    reason = "registering memory hands the NIC a range this process must keep valid"
)]

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering, fence};

use nicbar_control::Request;

use super::region::Region;
use super::{RawPort, control};
use crate::error::Error;
use shared_abi::ring::raw::{BYTEWISE_COPY, copy_bytewise};

impl RawPort {
    /// Registers `length` bytes at `address` of this process with the port
    /// (`gm_register_memory`); returns the region's key, which remote pointers to it carry
    /// ([`shared_abi::rdma::RemotePointer`]). The region lives until
    /// [`RawPort::deregister_memory`] or the port closes.
    ///
    /// # Safety
    /// The range must stay mapped memory of this process while it is registered, and the
    /// process must not hold references to it while the NIC may write it (a get of this port
    /// into it, or peers' puts and atomics once remote access is allowed): the NIC writes it at
    /// any time, as another thread would.
    ///
    /// # Errors
    /// [`Error::Refused`] with the daemon's reason (the table is full, the kernel refused the
    /// daemon access to this process's memory, a bad range), or a control protocol error.
    pub unsafe fn register_memory(&self, address: *const u8, length: usize) -> Result<u32, Error> {
        control::memory(
            &self.control,
            &Request::RegisterMemory {
                address: address as u64,
                length: length as u64,
            },
        )
    }

    /// Deregisters the region of exactly `length` bytes at `address` (`gm_deregister_memory`);
    /// operations that reach it afterwards are refused with `BAD_KEY`.
    ///
    /// # Errors
    /// [`Error::Refused`] if no such region is registered.
    pub fn deregister_memory(&self, address: *const u8, length: usize) -> Result<(), Error> {
        control::memory(
            &self.control,
            &Request::DeregisterMemory {
                address: address as u64,
                length: length as u64,
            },
        )
        .map(|_| ())
    }

    /// Lets peers put, get and apply atomics to this port's registered memory
    /// (`gm_allow_remote_memory_access`); until then the NIC refuses them
    /// (`REMOTE_ACCESS_DENIED`).
    ///
    /// # Errors
    /// A control protocol error.
    pub fn allow_remote_memory_access(&self) -> Result<(), Error> {
        control::memory(&self.control, &Request::AllowRemoteAccess).map(|_| ())
    }

    /// `len` zero bytes in the port's DMA arena, for [`RawPort::register_shared`]: memory the
    /// emulated NIC maps too, so it copies to and from them with no system call (a put's source,
    /// a landing region). `None` if they would take more than half the arena's free bytes (the
    /// rest is kept for DMA buffers) or the daemon cannot be told where the region is mapped.
    pub fn arena_bytes(&self, len: usize) -> Option<SharedBytes> {
        if len > self.region.arena_free() / 2 {
            return None;
        }
        if self.region_mapped.load(Ordering::Relaxed) == UNTOLD {
            let address = self.region.memory().base().as_ptr() as u64;
            let told = control::memory(&self.control, &Request::RegionMapped { address });
            // A daemon that does not take the request still reaches arena memory, the slow way:
            // heap memory then serves as well.
            let state = if told.is_ok() { TOLD } else { REFUSED };
            self.region_mapped.store(state, Ordering::Relaxed);
        }
        if self.region_mapped.load(Ordering::Relaxed) != TOLD {
            return None;
        }
        SharedBytes::in_arena(&self.region, len)
    }

    /// Registers `bytes` (see [`SharedBytes`]); returns the region's key.
    ///
    /// # Errors
    /// As [`RawPort::register_memory`].
    pub fn register_shared(&self, bytes: &SharedBytes) -> Result<u32, Error> {
        // SAFETY: `SharedBytes` is only ever accessed with atomic operations (so the NIC's writes
        // are not data races), and the caller keeps it alive while it is registered: the port
        // layer holds a clone of its `Arc` until it deregisters it or closes.
        unsafe { self.register_memory(bytes.as_ptr(), bytes.len()) }
    }
}

/// Memory the NIC may write at any time, read and written by the process only through atomic
/// operations. Cloning shares the bytes.
///
/// The bytes live in 64-bit atomic words. Where the target has a byte-wise atomic copy
/// (x86-64: [`copy_bytewise`]) ranges are copied with it, as fast as `memcpy`; elsewhere a
/// word at a time, about two thirds of that, with only the words at the ends of a range written
/// that it covers in part merged by a compare-and-swap, so a byte the range does not cover is
/// never written back stale over one the NIC wrote meanwhile.
#[derive(Clone, Debug)]
pub struct SharedBytes {
    words: Arc<Words>,
    len: usize,
}

/// Whether the daemon was told where a port's region is mapped ([`RawPort::arena_bytes`]).
pub(crate) type RegionMapped = AtomicU8;
/// Not yet asked.
pub(crate) const UNTOLD: u8 = 0;
const TOLD: u8 = 1;
const REFUSED: u8 = 2;

/// Bytes per word of [`SharedBytes`].
const WORD: usize = 8;

/// Where the words of [`SharedBytes`] live.
#[derive(Debug)]
enum Words {
    Heap(Box<[AtomicU64]>),
    /// A range of a port's arena, given back when dropped.
    Arena {
        region: Arc<Region>,
        offset: usize,
        len: usize,
        /// `region`'s mapping at the range, valid for `len / WORD` words.
        pointer: NonNull<AtomicU64>,
    },
}

// SAFETY: the arena words are reached only as atomics (as the heap words are), through a
// pointer into a mapping their `Arc<Region>` keeps alive; the NIC writes them as another thread
// would.
unsafe impl Send for Words {}
// SAFETY: as for `Send`: shared access hands out `&AtomicU64` only.
unsafe impl Sync for Words {}

impl Words {
    fn as_slice(&self) -> &[AtomicU64] {
        match self {
            Self::Heap(words) => words,
            // SAFETY: `pointer` is 8-aligned and valid for `len / WORD` words of the mapping,
            // which `region` keeps mapped; the arena lends the range to no one else, and every
            // access to it in this process is atomic.
            Self::Arena { pointer, len, .. } => unsafe {
                std::slice::from_raw_parts(pointer.as_ptr(), len / WORD)
            },
        }
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        if let Self::Arena {
            region,
            offset,
            len,
            ..
        } = self
        {
            region.give_back(*offset, *len);
        }
    }
}

impl SharedBytes {
    /// `len` zero bytes (at least one). The first byte's address is 8-byte aligned
    /// ([`SharedBytes::as_ptr`] says where it is): a NIC atomic on a word that is not aligned
    /// is refused (`MISALIGNED`).
    pub fn zeroed(len: usize) -> Self {
        let len = len.max(1);
        let words: Box<[AtomicU64]> = (0..len.div_ceil(WORD)).map(|_| AtomicU64::new(0)).collect();
        Self {
            words: Arc::new(Words::Heap(words)),
            len,
        }
    }

    /// `len` zero bytes (at least one) of `region`'s arena, or `None` if it has no room.
    fn in_arena(region: &Arc<Region>, len: usize) -> Option<Self> {
        let len = len.max(1);
        let taken = len.div_ceil(WORD) * WORD;
        let (offset, pointer) = region.take(taken)?;
        if pointer.as_ptr().align_offset(WORD) != 0 {
            region.give_back(offset, taken);
            return None;
        }
        let words = Words::Arena {
            region: region.clone(),
            offset,
            len: taken,
            pointer: pointer.cast(),
        };
        for word in words.as_slice() {
            word.store(0, Ordering::Relaxed);
        }
        Some(Self {
            words: Arc::new(words),
            len,
        })
    }

    /// The first byte's address in this process.
    pub fn as_ptr(&self) -> *const u8 {
        self.words.as_slice().as_ptr().cast()
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies bytes from `offset` into `out`. Acquire: what was written before the bytes were
    /// released (a peer's data before its completion) is seen after.
    ///
    /// # Panics
    /// If the range is outside the memory.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len());
        if BYTEWISE_COPY {
            // SAFETY: the range lies in the words (checked above), which this `SharedBytes`
            // keeps alive and which are only ever accessed atomically; `out` is this caller's.
            unsafe { copy_bytewise(self.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        } else {
            self.read_words(offset, out);
        }
        fence(Ordering::Acquire);
    }

    /// Copies `data` to `offset`. Release: what this thread wrote before is seen by whoever
    /// reads these bytes and acquires.
    ///
    /// # Panics
    /// If the range is outside the memory.
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        fence(Ordering::Release);
        if BYTEWISE_COPY {
            let target = self.as_ptr().cast_mut();
            // SAFETY: as in `read`; the words are atomics, so writing them through a pointer
            // from a shared reference is allowed, and bytes outside the range are not touched.
            unsafe { copy_bytewise(data.as_ptr(), target.add(offset), data.len()) };
        } else {
            self.write_words(offset, data);
        }
    }

    /// [`SharedBytes::read`] a 64-bit word at a time, where there is no byte-wise atomic copy.
    fn read_words(&self, offset: usize, out: &mut [u8]) {
        // The bytes before the first whole word, the whole words, the bytes after them.
        let head = ((WORD - offset % WORD) % WORD).min(out.len());
        let (first, rest) = out.split_at_mut(head);
        let mut words = self.words.as_slice()[offset / WORD..].iter();
        if !first.is_empty()
            && let Some(word) = words.next()
        {
            let from = offset % WORD;
            first.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes()[from..from + head]);
        }
        let mut whole = rest.chunks_exact_mut(WORD);
        for (chunk, word) in (&mut whole).zip(&mut words) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        let last = whole.into_remainder();
        if !last.is_empty()
            && let Some(word) = words.next()
        {
            last.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes()[..last.len()]);
        }
    }

    /// [`SharedBytes::write`] a 64-bit word at a time, where there is no byte-wise atomic copy:
    /// the words the range covers in part are merged.
    fn write_words(&self, offset: usize, data: &[u8]) {
        let head = ((WORD - offset % WORD) % WORD).min(data.len());
        let (first, rest) = data.split_at(head);
        let mut words = self.words.as_slice()[offset / WORD..].iter();
        if !first.is_empty()
            && let Some(word) = words.next()
        {
            merge(word, offset % WORD, first);
        }
        let mut whole = rest.chunks_exact(WORD);
        for (chunk, word) in (&mut whole).zip(&mut words) {
            let mut bytes = [0u8; WORD];
            bytes.copy_from_slice(chunk);
            word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        }
        let last = whole.remainder();
        if !last.is_empty()
            && let Some(word) = words.next()
        {
            merge(word, 0, last);
        }
    }

    /// The bytes from `offset` on, `len` of them, as a vector.
    ///
    /// # Panics
    /// If the range is outside the memory.
    pub fn to_vec(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.read(offset, &mut out);
        out
    }

    /// The little-endian 64-bit word at `offset`.
    ///
    /// # Panics
    /// If the range is outside the memory.
    pub fn load_u64(&self, offset: usize) -> u64 {
        let mut word = [0u8; 8];
        self.read(offset, &mut word);
        u64::from_le_bytes(word)
    }

    /// Panics, as slice indexing would, unless `[offset, offset + len)` lies within the bytes.
    fn check(&self, offset: usize, len: usize) {
        let end = offset.checked_add(len);
        assert!(
            end.is_some_and(|end| end <= self.len),
            "range {offset}..{end:?} outside {} shared bytes",
            self.len
        );
    }
}

/// Writes `part` into `word` from its byte `from` on, leaving its other bytes as they are now.
fn merge(word: &AtomicU64, from: usize, part: &[u8]) {
    let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        let mut bytes = old.to_le_bytes();
        bytes[from..from + part.len()].copy_from_slice(part);
        Some(u64::from_le_bytes(bytes))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_written_anywhere_read_back_and_leave_their_neighbours_alone() {
        // Through the copy this target uses, and through the word-at-a-time one of targets
        // without a byte-wise atomic copy.
        type Copies = (
            fn(&SharedBytes, usize, &mut [u8]),
            fn(&SharedBytes, usize, &[u8]),
        );
        let paths: [(&str, Copies); 2] = [
            ("this target's", (SharedBytes::read, SharedBytes::write)),
            (
                "words'",
                (SharedBytes::read_words, SharedBytes::write_words),
            ),
        ];
        for (path, (read, write)) in paths {
            let shared = SharedBytes::zeroed(40);
            assert_eq!(shared.as_ptr() as usize % WORD, 0);
            write(&shared, 0, &[0xAA; 40]);
            // A range starting and ending inside words.
            let data: Vec<u8> = (1..=21).collect();
            write(&shared, 3, &data);
            let mut all = vec![0; 40];
            read(&shared, 0, &mut all);
            assert_eq!(all[..3], [0xAA; 3], "{path}");
            assert_eq!(all[3..24], data[..], "{path}");
            assert_eq!(all[24..], [0xAA; 16], "{path}");
            for offset in 0..40 {
                for len in 0..=40 - offset {
                    let mut back = vec![0; len];
                    read(&shared, offset, &mut back);
                    assert_eq!(back, all[offset..offset + len], "{path}");
                }
            }
            assert_eq!(
                shared.load_u64(8),
                u64::from_le_bytes(all[8..16].try_into().unwrap())
            );
        }
    }

    #[test]
    #[should_panic(expected = "outside 10 shared bytes")]
    fn a_range_past_the_end_panics_as_slice_indexing_would() {
        SharedBytes::zeroed(10).write(4, &[0; 7]);
    }
}
