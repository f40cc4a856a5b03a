//! The board of an emulated NIC: the firmware's [`Hal`] over port regions mapped from memfds, the
//! emulated wire, and eventfd doorbells toward the processes.

use std::os::fd::OwnedFd;

use firmware::{Hal, TransmitError};
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

    fn notify_host(&mut self, port: usize) {
        if let Some(Some(attached)) = self.ports.get(port) {
            doorbell::ring(&attached.host_doorbell);
        }
    }
}
