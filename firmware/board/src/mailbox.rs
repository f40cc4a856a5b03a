//! The firmware's side of the mailbox (`shared_abi::qemu::layout::Mailbox`): the configuration the host
//! wrote before boot, the port commands, and what the firmware publishes about itself.

use shared_abi::ids::{NodeId, PORTS_PER_NIC};
use shared_abi::qemu::layout::{
    GuestCounters, GuestFailure, GuestState, LAYOUT_VERSION, MAILBOX_MAGIC, PORT_WINDOW_LEN,
    PortError, PortOperation, WireKind, offsets,
};
use shared_abi::ring::SharedMemory;
use shared_abi::ring::raw::RawMemory;
use zerocopy::IntoBytes;

use crate::pci::PortWindows;

/// What the host configured.
#[derive(Clone, Copy)]
pub(crate) struct Configuration {
    /// This NIC's node id.
    pub(crate) node: NodeId,
    /// Nodes on the fabric.
    pub(crate) node_count: u16,
    /// The host's millisecond stamp of this boot.
    pub(crate) boot_stamp_ms: u32,
    /// The fabric key, if the host gave one.
    pub(crate) fabric_key: Option<firmware::auth::FabricKey>,
    /// The wire the packets take.
    pub(crate) wire: WireKind,
}

fn load(shared: &RawMemory, offset: usize) -> u32 {
    // An offset outside the shared area is a bug in `shared_abi::qemu::layout`, whose tests check them all;
    // it reads as zero rather than stopping the NIC.
    shared.load_acquire(offset).unwrap_or(0)
}

fn store(shared: &RawMemory, offset: usize, value: u32) {
    let _ = shared.store_release(offset, value);
}

/// Reads and checks the configuration.
///
/// # Errors
/// The [`GuestFailure`] that names the first check that failed.
pub(crate) fn read_configuration(shared: &RawMemory) -> Result<Configuration, GuestFailure> {
    if load(shared, offsets::MAGIC) != MAILBOX_MAGIC {
        return Err(GuestFailure::BAD_MAGIC);
    }
    if load(shared, offsets::LAYOUT_VERSION) != LAYOUT_VERSION {
        return Err(GuestFailure::BAD_VERSION);
    }
    let node = load(shared, offsets::NODE_ID);
    let node_count = load(shared, offsets::NODE_COUNT);
    if node_count == 0 || node >= node_count || node_count > u32::from(u16::MAX) {
        return Err(GuestFailure::BAD_NODE);
    }
    if load(shared, offsets::PORT_WINDOW_LEN) as usize != PORT_WINDOW_LEN {
        return Err(GuestFailure::BAD_WINDOW);
    }
    let fabric_key = (load(shared, offsets::FABRIC_KEY_PRESENT) != 0).then(|| {
        let mut key = [0u8; 32];
        for (word, bytes) in key.chunks_exact_mut(4).enumerate() {
            bytes.copy_from_slice(&load(shared, offsets::FABRIC_KEY + 4 * word).to_le_bytes());
        }
        firmware::auth::FabricKey::new(key)
    });
    let wire = WireKind(load(shared, offsets::WIRE));
    if wire != WireKind::RINGS && wire != WireKind::VIRTIO_NET {
        return Err(GuestFailure::BAD_WIRE);
    }
    Ok(Configuration {
        wire,
        node: NodeId::new(node as u16),
        node_count: node_count as u16,
        boot_stamp_ms: load(shared, offsets::BOOT_STAMP_MS),
        fabric_key,
    })
}

/// Publishes the firmware's state (and why it failed, if it did).
pub(crate) fn set_state(shared: &RawMemory, state: GuestState, failure: GuestFailure) {
    store(shared, offsets::GUEST_FAILURE, failure.0);
    store(shared, offsets::GUEST_STATE, state.0);
}

/// Publishes where each port's first region window is.
pub(crate) fn publish_windows(shared: &RawMemory, windows: &PortWindows) {
    for (port, regions) in windows.iter().enumerate() {
        let (address, length) = regions[0].map_or((0, 0), |w| (w.address, w.length));
        store(shared, offsets::port_window(port), address);
        store(shared, offsets::port_window(port) + 4, length);
    }
}

/// Publishes the stack's high-water mark while booting.
pub(crate) fn publish_boot_stack(shared: &RawMemory, high_water: u32) {
    store(shared, offsets::STACK_BOOT_HIGH_WATER, high_water);
}

/// Publishes the stack's size and the main loop's high-water mark.
pub(crate) fn publish_stack(shared: &RawMemory, size: u32, high_water: u32) {
    store(shared, offsets::STACK_SIZE, size);
    store(shared, offsets::STACK_HIGH_WATER, high_water);
}

/// Publishes the counters (statistics: torn reads by the host are harmless).
pub(crate) fn publish_counters(shared: &RawMemory, counters: &GuestCounters) {
    let _ = shared.write(offsets::COUNTERS, counters.as_bytes());
}

/// Raises or lowers the "core sleeps, send a byte" flag.
pub(crate) fn set_sleeping(shared: &RawMemory, sleeping: bool) {
    store(shared, offsets::GUEST_SLEEPING, u32::from(sleeping));
    shared.fence();
}

/// Whether the host asked for the machine to be powered off.
pub(crate) fn power_off_requested(shared: &RawMemory) -> bool {
    load(shared, offsets::POWER_OFF) != 0
}

/// A port command the host posted.
#[derive(Clone, Copy)]
pub(crate) struct PendingCommand {
    /// Its request number, to answer.
    pub(crate) request: u32,
    /// What to do.
    pub(crate) operation: PortOperation,
    /// OPEN: the region; REGISTER_MEMORY: the key's nonce.
    pub(crate) argument: u32,
    /// The memory operations' process address.
    pub(crate) address: u64,
    /// The memory operations' length.
    pub(crate) length: u64,
}

/// The port command slots, with the request each last answered.
pub(crate) struct CommandSlots {
    answered: [u32; PORTS_PER_NIC],
}

impl CommandSlots {
    /// Slots taking up where the mailbox stands (nothing the host posted before is lost: it is
    /// answered when `request` differs from `done`).
    pub(crate) fn new(shared: &RawMemory) -> Self {
        let mut answered = [0; PORTS_PER_NIC];
        for (port, answered) in answered.iter_mut().enumerate() {
            *answered = load(shared, offsets::command(port) + offsets::DONE);
        }
        Self { answered }
    }

    /// The command waiting for `port`, if any.
    pub(crate) fn pending(&self, shared: &RawMemory, port: usize) -> Option<PendingCommand> {
        let base = offsets::command(port);
        // Acquire: the operation and argument words, written before the request was bumped,
        // are read after.
        let request = load(shared, base + offsets::REQUEST);
        if Some(&request) == self.answered.get(port) {
            return None;
        }
        let double = |offset: usize| {
            u64::from(load(shared, base + offset))
                | u64::from(load(shared, base + offset + 4)) << 32
        };
        Some(PendingCommand {
            request,
            operation: PortOperation(load(shared, base + offsets::OPERATION)),
            argument: load(shared, base + offsets::ARGUMENT),
            address: double(offsets::ADDRESS),
            length: double(offsets::LENGTH),
        })
    }

    /// Whether any port has a command waiting.
    pub(crate) fn any_pending(&self, shared: &RawMemory) -> bool {
        (0..PORTS_PER_NIC).any(|port| self.pending(shared, port).is_some())
    }

    /// Answers `request` of `port`.
    pub(crate) fn answer(
        &mut self,
        shared: &RawMemory,
        port: usize,
        request: u32,
        result: u32,
        error: PortError,
    ) {
        let base = offsets::command(port);
        store(shared, base + offsets::RESULT, result);
        store(shared, base + offsets::ERROR, error.0);
        // Release: result and error are visible before the host sees `done` move.
        store(shared, base + offsets::DONE, request);
        if let Some(answered) = self.answered.get_mut(port) {
            *answered = request;
        }
    }
}
