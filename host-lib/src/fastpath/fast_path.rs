//! The public [`FastPath`] type: its state, building it over a port, and what it tells.

use std::collections::HashMap;
use std::time::Instant;

use shared_abi::event::Status;
use shared_abi::ids::{NodeId, PortId};
use shared_abi::token::Priority;

use super::config::FastPathConfig;
use super::layout::{
    BUFFER_LEN, MAX_MESSAGE, MAX_SLOTS, SIZE_CLASS, SLOT_OVERHEAD, STAGING_SLOT, align8,
};
use super::lock;
use super::message::PeerId;
use super::peer::Peer;
use super::stats::Stats;
use crate::dma::DmaBuffer;
use crate::error::Error;
use crate::port::Port;
use crate::port::memory::MemoryRegion;

/// The RDMA-write eager fast path over a port: see the module's documentation.
///
/// It owns the port and takes every event from it: a caller's own calls through
/// [`FastPath::port_mut`] should be ones that produce no events (their events would be dropped).
#[derive(Debug)]
pub struct FastPath {
    pub(super) port: Port,
    pub(super) config: FastPathConfig,
    pub(super) peers: Vec<Peer>,
    pub(super) by_address: HashMap<(NodeId, PortId), usize>,
    /// Hellos from peers not connected yet (their bytes, as received).
    pub(super) early: Vec<(NodeId, PortId, Vec<u8>)>,
    pub(super) spare: Vec<DmaBuffer>,
    /// Where the polling of rings and the delivery start next (round robin).
    pub(super) next_poll: usize,
    pub(super) polled: usize,
    /// The receiving region: every peer's credit bytes (16 bytes each), then the rings of the
    /// polling set.
    pub(super) receiving: MemoryRegion,
    /// The staging slots fast-path puts are sent from (one per send token, each as long as the
    /// longest slot), and those free.
    pub(super) staging: MemoryRegion,
    pub(super) staging_free: Vec<usize>,
    /// This process's lock words and shared bytes, and a small region for its gets and puts.
    pub(super) lock_region: MemoryRegion,
    pub(super) scratch: MemoryRegion,
    /// Results of operations waited for: context -> (status, value).
    pub(super) results: HashMap<u64, (Status, u64)>,
    pub(super) serial: u64,
    pub(super) served: lock::Served,
    pub(super) stats: Stats,
}

impl FastPath {
    /// The fast path over `port`: registers the lock region and provides the receive buffers.
    ///
    /// # Errors
    /// [`Error::Protocol`] for a `config` out of bounds; what registering memory or providing
    /// buffers returns.
    pub fn new(mut port: Port, config: FastPathConfig) -> Result<Self, Error> {
        if config.slots > MAX_SLOTS || config.slot_payload > MAX_MESSAGE {
            return Err(Error::Protocol(format!(
                "a fast path of {} slots of {} bytes: at most {MAX_SLOTS} slots of {MAX_MESSAGE}",
                config.slots, config.slot_payload
            )));
        }
        let lock_len = 8 * config.locks + align8(config.shared_bytes);
        let lock_region = port.register_memory(lock_len.max(8))?;
        let slot_size = SLOT_OVERHEAD + align8(config.slot_payload);
        let rings = if config.slots > 0 {
            config.polling_set * config.slots as usize * slot_size
        } else {
            0
        };
        let receiving = port.register_memory(16 * config.max_peers + rings)?;
        let staging_slots = port.endpoint.raw().send_token_total() as usize;
        let staging = port.register_memory(staging_slots * STAGING_SLOT)?;
        let scratch = port.register_memory(64)?;
        port.allow_remote_memory_access()?;
        for _ in 0..config.receive_buffers {
            let buffer = port.dma_alloc(BUFFER_LEN)?;
            port.provide_receive_buffer(buffer, SIZE_CLASS, Priority::LOW, 0)
                .map_err(|e| e.error)?;
        }
        Ok(Self {
            port,
            config,
            peers: Vec::new(),
            by_address: HashMap::new(),
            early: Vec::new(),
            spare: Vec::new(),
            next_poll: 0,
            polled: 0,
            receiving,
            staging,
            staging_free: (0..staging_slots).rev().collect(),
            lock_region,
            scratch,
            results: HashMap::new(),
            serial: 0,
            served: lock::Served::new(config.locks),
            stats: Stats::default(),
        })
    }

    /// The port.
    pub fn port(&self) -> &Port {
        &self.port
    }

    /// The port, for calls of the caller's own (whose events this fast path will take and
    /// drop if they are not its own: keep to calls that produce none).
    pub fn port_mut(&mut self) -> &mut Port {
        &mut self.port
    }

    /// What the fast path did so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// This process's lock words and shared bytes (lock `i` at offset `8 * i`, the shared bytes
    /// after the last lock).
    pub fn lock_region(&self) -> &MemoryRegion {
        &self.lock_region
    }

    /// The peer at `node`/`port`, if connected.
    pub fn peer(&self, node: NodeId, port: PortId) -> Option<PeerId> {
        self.by_address.get(&(node, port)).copied().map(PeerId)
    }

    pub(super) fn check_peer(&self, peer: PeerId) -> Result<usize, Error> {
        if peer.0 < self.peers.len() {
            Ok(peer.0)
        } else {
            Err(Error::Protocol(format!("no peer {}", peer.0)))
        }
    }

    pub(super) fn check_failed(&self, index: usize) -> Result<(), Error> {
        match &self.peers[index].failed {
            Some(why) => Err(Error::Protocol(why.clone())),
            None => Ok(()),
        }
    }

    /// Waits until every message and put this process sent has completed at its target.
    ///
    /// # Errors
    /// As [`FastPath::poll`]; [`Error::Protocol`] if a send failed.
    pub fn flush(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + self.config.setup_timeout;
        loop {
            self.progress()?;
            for index in 0..self.peers.len() {
                self.check_failed(index)?;
            }
            let busy = self.port.send_tokens() < self.port_tokens_total()
                || self.peers.iter().any(|p| p.credit_in_flight);
            if !busy {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Protocol("sends still outstanding".into()));
            }
            std::thread::yield_now();
        }
    }

    pub(super) fn port_tokens_total(&self) -> u32 {
        self.port.endpoint.raw().send_token_total()
    }
}
