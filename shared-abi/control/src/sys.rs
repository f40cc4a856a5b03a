//! The operating-system boundary of the emulator: mapping a port region and adopting file
//! descriptors received over the control socket. The one module of this crate with `unsafe` code.
//!
//! A port region is a sealed memfd: the daemon creates it, writes the header, seals its size (so
//! the process that maps it can never shrink it under the NIC and turn the NIC's accesses into
//! `SIGBUS`), maps it, and passes the descriptor to the process, which maps it too. Neither side
//! ever forms a Rust reference into the mapping: all access goes through [`RawMemory`], which
//! copies bytes with volatile accesses and touches ring indexes as atomics.
#![allow(
    unsafe_code,
    reason = "this module is the mapping and descriptor-passing boundary of the emulator"
)]

use std::io;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, UnixAddr, recvmsg};
use shared_abi::region::RegionHeader;
use shared_abi::ring::SharedMemory;
use shared_abi::ring::raw::RawMemory;
use zerocopy::IntoBytes;

/// Most descriptors one control message carries (a port needs three: region, host doorbell, NIC
/// doorbell). Extra ones are closed.
pub const MAX_PASSED_FDS: usize = 8;

/// A shared mapping of a whole port region, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    memory: RawMemory,
}

impl Mapping {
    /// Creates a port region of `len` bytes as a sealed memfd named `name`, writes `header` at
    /// its start, and maps it. Returns the mapping and the descriptor to pass to the process.
    ///
    /// # Errors
    /// The failing system call's error (no memory, descriptor limit), or `InvalidInput` if the
    /// header does not fit.
    pub fn create(name: &str, len: usize, header: &RegionHeader) -> io::Result<(Self, OwnedFd)> {
        if len < header.as_bytes().len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a region of {len} bytes cannot hold its header"),
            ));
        }
        let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)?;
        let file_len = i64::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        nix::unistd::ftruncate(&fd, file_len)?;
        // The process must not resize the region under the NIC: shrinking it would make the
        // daemon's accesses fault. Sealing also forbids adding or removing seals later.
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
            ),
        )?;
        let mapping = Self::map_len(&fd, len)?;
        mapping
            .memory
            .write(0, header.as_bytes())
            .map_err(|_| io::ErrorKind::InvalidInput)?;
        Ok((mapping, fd))
    }

    /// Maps the whole region behind `fd` (a descriptor received from the daemon). The region
    /// must be sealed against shrinking, so the mapping stays valid whatever another holder of
    /// the descriptor does.
    ///
    /// # Errors
    /// The failing system call's error, or `InvalidData` if the descriptor is not a sealed,
    /// non-empty region.
    pub fn open(fd: &OwnedFd) -> io::Result<Self> {
        let seals = fcntl(fd, FcntlArg::F_GET_SEALS)?;
        let seals = SealFlag::from_bits_truncate(seals);
        if !seals.contains(SealFlag::F_SEAL_SHRINK) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the port region is not sealed against shrinking",
            ));
        }
        let len = nix::sys::stat::fstat(fd)?.st_size;
        let len = usize::try_from(len).map_err(|_| io::ErrorKind::InvalidData)?;
        Self::map_len(fd, len)
    }

    fn map_len(fd: &OwnedFd, len: usize) -> io::Result<Self> {
        let length = NonZeroUsize::new(len).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "the port region is empty")
        })?;
        // SAFETY: a new shared mapping at an address the kernel picks (`None`) cannot overlap
        // memory Rust already uses; `fd` is open for reading and writing and, being sealed
        // against shrinking (or created by us at this length), backs all `len` bytes.
        let base = unsafe {
            mmap(
                None,
                length,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )
        }?;
        // SAFETY: `base` is page-aligned (so 8-aligned) and valid for reads and writes of `len`
        // bytes; the mapping lives until `Drop` unmaps it, and `RawMemory` is dropped with it.
        // The other side writes the region concurrently, which `RawMemory` is built for.
        let memory = unsafe { RawMemory::new(base.cast(), len) };
        Ok(Self { memory })
    }

    /// The region, for bounds-checked copies and atomic index accesses.
    pub fn memory(&self) -> &RawMemory {
        &self.memory
    }

    /// Length of the region in bytes.
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    /// Whether the region is empty (never, for a mapped region).
    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }

    /// The address of byte `offset` of the region, if `offset + len` lies inside it. The pointer
    /// may be dereferenced only under the caller's own ownership rules (see `host-lib`'s DMA
    /// buffers): the other side may write any byte of the region.
    pub fn pointer(&self, offset: usize, len: usize) -> Option<NonNull<u8>> {
        shared_abi::ring::check_range(self.len(), offset, len).ok()?;
        // SAFETY: `offset <= len` of the mapping (checked above), so the result stays inside
        // (or one past the end of) the same mapped allocation.
        Some(unsafe { self.memory.base().add(offset) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `map_len` with exactly this base and length, and is
        // unmapped only here. Nothing borrows it: `Mapping` hands out no references, and pointers
        // from `pointer` must not outlive it (users hold the `Mapping` alive while they use them).
        let result = unsafe { munmap(self.memory.base().cast(), self.memory.len()) };
        debug_assert!(result.is_ok(), "munmap of a port region failed: {result:?}");
    }
}

/// Receives bytes from a Unix stream socket into `buffer`, adopting any descriptors that came with
/// them (close-on-exec). Returns the byte count (0 at end of stream) and the descriptors.
///
/// # Errors
/// The `recvmsg` error; `InvalidData` if the sender passed more than [`MAX_PASSED_FDS`]
/// descriptors (the ones that arrived are closed).
pub fn receive_with_fds(socket: RawFd, buffer: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut control = nix::cmsg_space!([RawFd; MAX_PASSED_FDS]);
    let mut iov = [io::IoSliceMut::new(buffer)];
    let message = recvmsg::<UnixAddr>(
        socket,
        &mut iov,
        Some(&mut control),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let bytes = message.bytes;
    let mut fds = Vec::new();
    let truncated = message.flags.contains(MsgFlags::MSG_CTRUNC);
    if let Ok(cmsgs) = message.cmsgs() {
        for cmsg in cmsgs {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                for fd in raw {
                    // SAFETY: the kernel just installed `fd` in this process for us (SCM_RIGHTS);
                    // nothing else owns it, so adopting it closes it exactly once.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
    }
    if truncated {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the control message carried more descriptors than a port needs",
        ));
    }
    Ok((bytes, fds))
}
