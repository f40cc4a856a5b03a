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

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use nicbar_control::Request;

use super::{RawPort, control};
use crate::error::Error;

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
/// byte and word operations. Cloning shares the bytes.
#[derive(Clone, Debug)]
pub struct SharedBytes {
    bytes: Arc<[AtomicU8]>,
}

impl SharedBytes {
    /// `len` zero bytes (at least one). The first byte's address is 8-byte aligned on the
    /// usual allocators (it follows the `Arc`'s two counters); [`SharedBytes::as_ptr`] says where
    /// it is, and a NIC atomic on a word that is not aligned is refused (`MISALIGNED`).
    pub fn zeroed(len: usize) -> Self {
        let bytes: Vec<AtomicU8> = (0..len.max(1)).map(|_| AtomicU8::new(0)).collect();
        Self {
            bytes: bytes.into(),
        }
    }

    /// The first byte's address in this process.
    pub fn as_ptr(&self) -> *const u8 {
        self.bytes.as_ptr().cast()
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Copies bytes from `offset` into `out`.
    ///
    /// # Panics
    /// If the range is outside the memory.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        let cells = &self.bytes[offset..offset + out.len()];
        for (byte, cell) in out.iter_mut().zip(cells) {
            *byte = cell.load(Ordering::Acquire);
        }
    }

    /// Copies `data` to `offset`.
    ///
    /// # Panics
    /// If the range is outside the memory.
    pub fn write(&self, offset: usize, data: &[u8]) {
        for (cell, byte) in self.bytes[offset..offset + data.len()].iter().zip(data) {
            cell.store(*byte, Ordering::Release);
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
}
