//! The control thread of a QEMU fabric: the control protocol's server
//! (`nicbar_control::server`) over the same kind
//! of socket, so `nicbar::Port::open_at` and `nicctl status` work unchanged.
//!
//! Opening and closing go through the NIC's mailbox ([`super::machine::Machine::open_port`]),
//! which waits for the firmware's answer with a bound.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::machine::{Machine, region_layout};
use nicbar_control::process_memory::MemoryRequest;
use nicbar_control::server::{PortBackend, PortOwners};
use nicbar_control::{
    ControlError, NicReport, NodeName, OpenedPort, PortReport, Reply, Request, UnitStatus,
    WireCounters,
};

/// A QEMU fabric's NICs, as the control server sees them.
pub(crate) struct QemuMachines {
    pub(crate) machines: Vec<Arc<Machine>>,
}

impl PortBackend for QemuMachines {
    const LOG_NAME: &'static str = "nicctl qemu";

    fn unit_count(&self) -> usize {
        self.machines.len()
    }

    fn open_port(&self, unit: u8, port: u8) -> Result<(OpenedPort, Vec<OwnedFd>), ControlError> {
        // In range: the server checked it against `unit_count`.
        let machine = &self.machines[usize::from(unit)];
        let (generation, fds) = machine
            .open_port(unit, port)
            .map_err(|reason| ControlError::OpenFailed { unit, port, reason })?;
        let opened = OpenedPort {
            unit,
            port,
            node: machine.node,
            generation: generation.get(),
            region_len: region_layout().region_len as u64,
        };
        Ok((opened, fds))
    }

    fn close_port(&self, unit: u8, port: u8) -> Result<(), ControlError> {
        match self.machines.get(usize::from(unit)) {
            Some(machine) => machine.close_port(port).map_err(|reason| {
                ControlError::Internal(format!("unit {unit} port {port}: {reason}"))
            }),
            None => Ok(()),
        }
    }

    fn abandon_port(&self, unit: u8, port: u8) {
        if let Some(machine) = self.machines.get(usize::from(unit))
            && let Err(reason) = machine.close_port(port)
        {
            eprintln!("nicctl qemu: closing port {port} of unit {unit}: {reason}");
        }
    }

    /// The fabric's state in the emulator's report shape: ports with owners and generations,
    /// the firmware's counters, and the wire as the NIC counts it. Per-port internals and
    /// per-connection counters stay inside the guest and read as zero / empty.
    fn unit_status(&self, owners: &[PortOwners]) -> Vec<UnitStatus> {
        self.machines
            .iter()
            .enumerate()
            .map(|(unit, machine)| {
                let report = machine.report();
                let counters = report.counters;
                let ports = owners[unit]
                    .iter()
                    .enumerate()
                    .filter_map(|(port, owner)| {
                        owner.map(|owner| PortReport {
                            port: port as u8,
                            generation: owner.generation,
                            owner_pid: Some(owner.pid),
                            held_sends: 0,
                            receive_buffers: 0,
                            barrier_running: false,
                            barrier: None,
                            closing: false,
                            pending_events: 0,
                            faulted: None,
                        })
                    })
                    .collect();
                UnitStatus {
                    unit: unit as u8,
                    // Each QEMU NIC is a core of its own, outside the daemon's threads.
                    thread: 0,
                    idle: String::new(),
                    thread_cpu_ns: 0,
                    node: machine.node,
                    address: None,
                    ports,
                    connections: Vec::new(),
                    counters: NicReport {
                        malformed_packets: u64::from(counters.malformed_packets.get()),
                        no_connection: 0,
                        tokens_rejected: u64::from(counters.tokens_rejected.get()),
                        barriers_completed: u64::from(counters.barriers_completed.get()),
                        barriers_failed: u64::from(counters.barriers_failed.get()),
                        messages_delivered: u64::from(counters.messages_delivered.get()),
                        unauthenticated: u64::from(counters.unauthenticated.get()),
                    },
                    wire: WireCounters {
                        transmitted: u64::from(counters.packets_transmitted.get()),
                        received: u64::from(counters.packets_received.get()),
                        undeliverable: u64::from(counters.transmit_full.get()),
                        ..WireCounters::default()
                    },
                }
            })
            .collect()
    }

    /// The fabric's NICs, all of this host: `<host name>:<unit>`, as units of one daemon.
    fn node_names(&self) -> Vec<NodeName> {
        let host = nicbar_control::naming::host_name();
        let mut nodes: Vec<NodeName> = self
            .machines
            .iter()
            .enumerate()
            .map(|(unit, machine)| {
                nicbar_control::naming::unit_node(&host, unit as u8, machine.node)
            })
            .collect();
        nodes.sort_by_key(|node| node.node);
        nodes
    }

    fn fault_seed(&self) -> Option<u64> {
        None
    }

    /// Forwarded to the firmware as a port command: it keeps the regions and their keys, and
    /// reaches them through the hub, one guest-to-host round trip per access.
    fn memory(
        &self,
        unit: u8,
        port: u8,
        pid: u32,
        request: &Request,
    ) -> Result<Reply, ControlError> {
        let machine = self
            .machines
            .get(usize::from(unit))
            .ok_or_else(|| ControlError::Internal(format!("no NIC unit {unit}")))?;
        let command = MemoryRequest::from_request(request)?;
        let result = machine
            .memory_command(port, pid, command)
            .map_err(ControlError::MemoryRefused)?;
        Ok(command.reply(result))
    }

    /// The stop doorbell is left ringing for the hub, and the NICs run on: the fabric powers them
    /// off.
    fn shut_down(&mut self, _stop: &OwnedFd) {}
}
