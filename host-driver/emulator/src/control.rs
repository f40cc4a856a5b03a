//! The emulator's side of the control server (`nicbar_control::server`): opening a port creates its
//! region and doorbells and has the NIC thread open it (the driver's only job, as in GM); closing
//! and status requests go to the NIC threads too, each answer awaited with a bound.

use std::os::fd::OwnedFd;
use std::sync::mpsc;
use std::time::Duration;

use shared_abi::ids::{Generation, PortId};
use shared_abi::region::RegionLayout;

use super::RegionShape;
use super::hal::AttachedPort;
use super::unit::{CloseHow, Command, UnitHandle};
use nicbar_control::Mapping;
use nicbar_control::doorbell;
use nicbar_control::process_memory::MemoryRequest;
use nicbar_control::server::{CloseReply, PortBackend, PortOwners};
use nicbar_control::{ControlError, NodeName, OpenedPort, Reply, Request, UnitStatus};

/// How long the control thread waits for a NIC thread to answer.
const UNIT_REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// The emulator's NIC threads, as the control server sees them.
pub(crate) struct EmulatedUnits {
    pub(crate) units: Vec<UnitHandle>,
    pub(crate) region: RegionShape,
    /// The fabric's nodes as this daemon names them.
    pub(crate) nodes: Vec<NodeName>,
    pub(crate) fault_seed: Option<u64>,
}

impl EmulatedUnits {
    /// Tells the unit's NIC to close the port, `how`.
    fn send_close(&self, unit: u8, port: u8, how: CloseHow) {
        if let Some(handle) = self.units.get(usize::from(unit)) {
            handle.send(Command::Close {
                port: PortId(port),
                how,
            });
        }
    }
}

impl PortBackend for EmulatedUnits {
    const LOG_NAME: &'static str = "nicctl emulate";

    fn unit_count(&self) -> usize {
        self.units.len()
    }

    fn open_port(&self, unit: u8, port: u8) -> Result<(OpenedPort, Vec<OwnedFd>), ControlError> {
        // In range: the server checked it against `unit_count`.
        let handle = &self.units[usize::from(unit)];
        let port_id = PortId(port);
        let failed = |reason: String| ControlError::OpenFailed { unit, port, reason };
        let shape = self.region;
        let layout = RegionLayout::standard(
            shape.send_entries,
            shape.receive_entries,
            shape.event_entries,
            shape.arena_len,
        );
        let header = layout.header(handle.node, port_id, unit, Generation::new(0));
        let (mapping, region_fd) = Mapping::create(
            &format!("nicbar-unit{unit}-port{port}"),
            layout.region_len,
            &header,
        )
        .map_err(|error| failed(format!("cannot create the region: {error}")))?;
        let host_doorbell = doorbell::new()
            .map_err(|error| failed(format!("cannot create the doorbell: {error}")))?;
        let nic_host_doorbell = host_doorbell
            .try_clone()
            .map_err(|error| failed(format!("cannot duplicate the doorbell: {error}")))?;
        let nic_doorbell = handle
            .wake
            .try_clone()
            .map_err(|error| failed(format!("cannot duplicate the NIC doorbell: {error}")))?;
        let (reply, answer) = mpsc::channel();
        let attached = AttachedPort {
            mapping,
            layout,
            host_doorbell: nic_host_doorbell,
            owner_pid: None,
            mapped_at: None,
        };
        if !handle.send(Command::Open {
            port: port_id,
            attached,
            reply,
        }) {
            return Err(ControlError::Internal(format!(
                "NIC unit {unit} has stopped"
            )));
        }
        let generation = answer
            .recv_timeout(UNIT_REPLY_TIMEOUT)
            .map_err(|_| ControlError::Internal(format!("NIC unit {unit} did not answer")))?
            .map_err(|error| failed(error.to_string()))?;
        let opened = OpenedPort {
            unit,
            port,
            node: handle.node.get(),
            generation: generation.get(),
            region_len: layout.region_len as u64,
        };
        Ok((opened, vec![region_fd, host_doorbell, nic_doorbell]))
    }

    fn close_port(&self, unit: u8, port: u8) -> Result<(), ControlError> {
        let (reply, answer) = mpsc::channel();
        // The reply sender moves into the command, so a unit that has stopped answers at once,
        // by dropping it.
        self.send_close(unit, port, CloseHow::Now(reply));
        answer
            .recv_timeout(UNIT_REPLY_TIMEOUT)
            .map_err(|_| ControlError::Internal(format!("NIC unit {unit} did not answer")))
    }

    /// The process asked: the NIC finishes what it posted first (the close's answer waits for
    /// that, bounded by the NIC's give-up and receiver-not-ready times).
    fn close_port_later(&self, unit: u8, port: u8, done: CloseReply) {
        // A unit that has stopped drops the command, and `done` answers with an error.
        self.send_close(unit, port, CloseHow::Orderly(done));
    }

    fn abandon_port(&self, unit: u8, port: u8) {
        self.send_close(unit, port, CloseHow::Abandoned);
    }

    fn unit_status(&self, owners: &[PortOwners]) -> Vec<UnitStatus> {
        let mut units = Vec::new();
        for handle in &self.units {
            let (reply, answer) = mpsc::channel();
            if !handle.send(Command::Status { reply }) {
                continue;
            }
            let Ok(mut status) = answer.recv_timeout(UNIT_REPLY_TIMEOUT) else {
                continue;
            };
            for port in status.ports.iter_mut() {
                port.owner_pid = owners
                    .get(usize::from(handle.unit))
                    .and_then(|ports| ports.get(usize::from(port.port)))
                    .copied()
                    .flatten()
                    .map(|owner| owner.pid);
            }
            units.push(status);
        }
        units
    }

    fn memory(
        &self,
        unit: u8,
        port: u8,
        pid: u32,
        request: &Request,
    ) -> Result<Reply, ControlError> {
        let handle = self
            .units
            .get(usize::from(unit))
            .ok_or_else(|| ControlError::Internal(format!("no NIC unit {unit}")))?;
        let request = MemoryRequest::from_request(request)?;
        let (reply, answer) = mpsc::channel();
        if !handle.send(Command::Memory {
            port: PortId(port),
            pid,
            request,
            reply,
        }) {
            return Err(ControlError::Internal(format!(
                "NIC unit {unit} has stopped"
            )));
        }
        let key = answer
            .recv_timeout(UNIT_REPLY_TIMEOUT)
            .map_err(|_| ControlError::Internal(format!("NIC unit {unit} did not answer")))?
            .map_err(ControlError::MemoryRefused)?;
        Ok(request.reply(key))
    }

    fn node_names(&self) -> Vec<NodeName> {
        self.nodes.clone()
    }

    fn fault_seed(&self) -> Option<u64> {
        self.fault_seed
    }

    /// Silences the stop doorbell and stops the NIC threads.
    fn shut_down(&mut self, stop: &OwnedFd) {
        doorbell::drain(stop);
        for unit in self.units.iter_mut() {
            unit.stop();
        }
    }
}
