//! Single-copy access to another process's memory (cross-memory attach, as Open MPI's
//! shared-memory transport uses it): `process_vm_readv` / `process_vm_writev`, for the NIC
//! backends that reach a port owner's registered memory on its behalf. The kernel allows it to a
//! process that may ptrace the target: the same user, and — under Yama — a
//! `kernel.yama.ptrace_scope` of 0, or a target that named the daemon with
//! `prctl(PR_SET_PTRACER)`.

use std::io::{IoSlice, IoSliceMut};

use nix::sys::uio::{RemoteIoVec, process_vm_readv, process_vm_writev};
use nix::unistd::Pid;

use crate::message::{ControlError, Reply, Request};

/// A port owner's memory request, as every NIC backend hands it to its NIC (answered with the
/// region's key, or 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryRequest {
    /// `gm_register_memory` of `length` bytes at `address`, with a random nonce for the key.
    Register {
        /// The first byte, in the owner's address space.
        address: u64,
        /// Bytes.
        length: u64,
        /// Random bits of the region's key.
        nonce: u32,
    },
    /// `gm_deregister_memory` of the region of exactly `length` bytes at `address`.
    Deregister {
        /// The region's first byte.
        address: u64,
        /// Its length.
        length: u64,
    },
    /// `gm_allow_remote_memory_access`: peers may reach the port's registered memory.
    AllowRemoteAccess,
    /// The owner mapped the port's region at `address` ([`Request::RegionMapped`]).
    RegionMapped {
        /// The region's first byte, in the owner's address space.
        address: u64,
    },
}

impl MemoryRequest {
    /// The memory request `request` makes (a registration draws its nonce here).
    ///
    /// # Errors
    /// [`ControlError::BadRequest`] for a request that is not about memory;
    /// [`ControlError::Internal`] if no randomness could be read for a key.
    pub fn from_request(request: &Request) -> Result<Self, ControlError> {
        Ok(match *request {
            Request::RegisterMemory { address, length } => {
                let nonce = crate::server::random_key()
                    .map(|key| u32::from_le_bytes([key[0], key[1], key[2], key[3]]))
                    .map_err(|error| {
                        ControlError::Internal(format!("no randomness for a region key: {error}"))
                    })?;
                Self::Register {
                    address,
                    length,
                    nonce,
                }
            }
            Request::DeregisterMemory { address, length } => Self::Deregister { address, length },
            Request::AllowRemoteAccess => Self::AllowRemoteAccess,
            Request::RegionMapped { address } => Self::RegionMapped { address },
            _ => return Err(ControlError::BadRequest("not a memory request".to_owned())),
        })
    }

    /// The reply to this request once the NIC answered `key` (the region's key; 0 for the
    /// requests that make none).
    pub fn reply(self, key: u32) -> Reply {
        match self {
            Self::Register { .. } => Reply::Registered { key },
            Self::Deregister { .. } | Self::AllowRemoteAccess | Self::RegionMapped { .. } => {
                Reply::MemoryDone
            }
        }
    }
}

/// Reads `out.len()` bytes at `address` of process `pid`.
///
/// # Errors
/// The kernel's refusal, or a short read (part of the range is not mapped).
pub fn read(pid: Pid, address: u64, out: &mut [u8]) -> Result<(), nix::Error> {
    let len = out.len();
    if len == 0 {
        return Ok(());
    }
    let remote = [RemoteIoVec {
        base: usize::try_from(address).map_err(|_| nix::Error::EFAULT)?,
        len,
    }];
    let done = process_vm_readv(pid, &mut [IoSliceMut::new(out)], &remote)?;
    if done == len {
        Ok(())
    } else {
        Err(nix::Error::EFAULT)
    }
}

/// Writes `data` at `address` of process `pid`.
///
/// # Errors
/// The kernel's refusal, or a short write.
pub fn write(pid: Pid, address: u64, data: &[u8]) -> Result<(), nix::Error> {
    let len = data.len();
    if len == 0 {
        return Ok(());
    }
    let remote = [RemoteIoVec {
        base: usize::try_from(address).map_err(|_| nix::Error::EFAULT)?,
        len,
    }];
    let done = process_vm_writev(pid, &[IoSlice::new(data)], &remote)?;
    if done == len {
        Ok(())
    } else {
        Err(nix::Error::EFAULT)
    }
}

/// Checks that the kernel lets this process reach `length` bytes at `address` of process `pid`
/// (their first and last byte), so a registration's refusal is named when it is made rather than
/// as a failed operation later.
///
/// # Errors
/// Why not, in words a user can act on ([`explain`]).
pub fn check_reachable(pid: Pid, address: u64, length: u64) -> Result<(), String> {
    let mut byte = [0u8; 1];
    let last = address.saturating_add(length.saturating_sub(1));
    for at in [address, last] {
        read(pid, at, &mut byte).map_err(|error| explain(error, pid))?;
    }
    Ok(())
}

/// Why the kernel refused, in words a user can act on.
pub fn explain(error: nix::Error, pid: Pid) -> String {
    match error {
        nix::Error::EPERM => {
            let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "absent".to_owned());
            format!(
                "the kernel refused the NIC daemon access to process {pid}'s memory \
                 (process_vm_readv: EPERM); it needs the daemon to run as the same user and, \
                 under Yama, kernel.yama.ptrace_scope = 0 (it is {scope}) or the process to \
                 name the daemon with prctl(PR_SET_PTRACER)"
            )
        }
        nix::Error::ESRCH => format!("process {pid} is gone"),
        nix::Error::EFAULT => {
            format!("the range is not wholly mapped in process {pid}")
        }
        other => format!("process_vm_readv of process {pid} failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_this_process_and_refuses_unmapped_ranges() {
        let pid = nix::unistd::getpid();
        let source = vec![7u8; 100];
        let mut out = vec![0u8; 100];
        read(pid, source.as_ptr() as u64, &mut out).unwrap();
        assert_eq!(out, source);
        let target = vec![0u8; 10];
        write(pid, target.as_ptr() as u64 + 2, &[1, 2, 3]).unwrap();
        assert_eq!(
            std::hint::black_box(&target)[..6],
            [0, 0, 1, 2, 3, 0],
            "the write landed where asked"
        );
        // Page 0 is never mapped.
        assert_eq!(read(pid, 16, &mut out), Err(nix::Error::EFAULT));
        assert!(
            check_reachable(pid, 16, 8)
                .unwrap_err()
                .contains("not wholly mapped")
        );
        assert!(check_reachable(pid, source.as_ptr() as u64, 100).is_ok());
    }
}
