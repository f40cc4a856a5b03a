//! The board of an emulated NIC: the firmware's [`Hal`] over port regions mapped from memfds, the
//! emulated wire, and eventfd doorbells toward the processes.

use std::os::fd::OwnedFd;

use firmware::{Hal, MemoryFault, TransmitError};
use nix::unistd::Pid;
use shared_abi::ids::{NodeId, PORTS_PER_NIC};
use shared_abi::region::RegionLayout;
use shared_abi::ring::raw::RawMemory;

use super::wire::Wire;
use nicbar_control::Mapping;
use nicbar_control::doorbell;

/// A port region the board has mapped for an open port.
#[derive(Debug)]
pub(crate) struct AttachedPort {
    pub(crate) mapping: Mapping,
    pub(crate) layout: RegionLayout,
    /// The process's doorbell: rung when it sleeps on its event ring and an event arrived.
    pub(crate) host_doorbell: OwnedFd,
    /// The owning process, as the kernel named it on the control socket (`SO_PEERCRED`): whose
    /// registered memory the NIC reaches. Set when it first registers memory.
    pub(crate) owner_pid: Option<i32>,
}

/// The emulated board one [`firmware::Nic`] runs on.
#[derive(Debug)]
pub(crate) struct UnitHal {
    pub(crate) ports: [Option<AttachedPort>; PORTS_PER_NIC],
    pub(crate) wire: Wire,
}

impl UnitHal {
    pub(crate) fn new(wire: Wire) -> Self {
        Self {
            ports: Default::default(),
            wire,
        }
    }
}

impl Hal for UnitHal {
    type Memory = RawMemory;

    fn port_memory(&self, port: usize) -> Option<&RawMemory> {
        self.ports
            .get(port)?
            .as_ref()
            .map(|attached| attached.mapping.memory())
    }

    fn transmit(&mut self, destination: NodeId, packet: &[u8]) -> Result<(), TransmitError> {
        self.wire.transmit(destination, packet)
    }

    fn local_route(&self, destination: NodeId) -> bool {
        self.wire.is_local(destination)
    }

    fn notify_host(&mut self, port: usize) {
        if let Some(Some(attached)) = self.ports.get(port) {
            doorbell::ring(&attached.host_doorbell);
        }
    }

    fn read_process_memory(
        &mut self,
        port: usize,
        address: u64,
        out: &mut [u8],
    ) -> Result<(), MemoryFault> {
        let pid = self.owner(port)?;
        process_memory::read(pid, address, out).map_err(|_| MemoryFault::Refused)
    }

    fn write_process_memory(
        &mut self,
        port: usize,
        address: u64,
        data: &[u8],
    ) -> Result<(), MemoryFault> {
        let pid = self.owner(port)?;
        process_memory::write(pid, address, data).map_err(|_| MemoryFault::Refused)
    }
}

impl UnitHal {
    fn owner(&self, port: usize) -> Result<Pid, MemoryFault> {
        self.ports
            .get(port)
            .and_then(Option::as_ref)
            .and_then(|attached| attached.owner_pid)
            .map(Pid::from_raw)
            .ok_or(MemoryFault::Refused)
    }
}

/// Single-copy access to another process's memory (cross-memory attach, as Open MPI's
/// shared-memory transport uses it): `process_vm_readv` / `process_vm_writev`. The kernel allows
/// it to a process that may ptrace the target: the same user, and — under Yama — a
/// `kernel.yama.ptrace_scope` of 0, or a target that named the daemon with
/// `prctl(PR_SET_PTRACER)`.
pub(crate) mod process_memory {
    use std::io::{IoSlice, IoSliceMut};

    use nix::sys::uio::{RemoteIoVec, process_vm_readv, process_vm_writev};
    use nix::unistd::Pid;

    /// Reads `out.len()` bytes at `address` of process `pid`.
    ///
    /// # Errors
    /// The kernel's refusal, or a short read (part of the range is not mapped).
    pub(crate) fn read(pid: Pid, address: u64, out: &mut [u8]) -> Result<(), nix::Error> {
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
    pub(crate) fn write(pid: Pid, address: u64, data: &[u8]) -> Result<(), nix::Error> {
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

    /// Why the kernel refused, in words a user can act on.
    pub(crate) fn explain(error: nix::Error, pid: Pid) -> String {
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
}
