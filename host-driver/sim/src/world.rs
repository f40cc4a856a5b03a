//! The simulated world: NICs running the real firmware core, hosts on their ports, and a wire
//! with a seeded fault plan, advanced by an event heap in virtual time.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use firmware::{Config, Hal, Instant, Nic};
use shared_abi::ids::{NodeId, PortId};
use shared_abi::ring::raw::RawMemory;
use zerocopy::IntoBytes;

use super::adversary::Adversary;
use super::hal::SimHal;
use super::host::{HostRings, layout};
use super::memory::HeapRegion;
use super::rng::Rng;

/// Connections per simulated NIC: enough for every peer of a 64-node all-to-all, and for the
/// peers of a few consecutive barriers of different algorithms at 1024 nodes.
pub const SIM_CONNECTIONS: usize = 160;

/// The longest a doorbell takes to reach a simulated NIC, by default.
pub const DOORBELL_DELAY: Duration = Duration::from_micros(3);

/// The NIC type the simulator runs.
pub type SimNic = Nic<SimHal, SIM_CONNECTIONS>;

/// What goes wrong on the wire.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WireFaults {
    /// Probability a packet is lost.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability a packet is delayed by up to `reorder_window` extra, overtaking others.
    pub reorder: f64,
    /// The most extra delay a reordered packet gets.
    pub reorder_window: Duration,
}

impl WireFaults {
    /// A perfect wire.
    pub const NONE: Self = Self {
        loss: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        reorder_window: Duration::ZERO,
    };
}

/// Something scheduled in virtual time.
#[derive(Debug)]
pub enum Happening {
    /// A packet reaches `node`.
    Arrive {
        /// Receiving node.
        node: usize,
        /// The packet.
        bytes: Vec<u8>,
    },
    /// `node`'s NIC polls (its timer fired, or a doorbell rang).
    Poll {
        /// The node.
        node: usize,
    },
    /// The host program on `(node, port)` takes a step.
    Host {
        /// The node.
        node: usize,
        /// The port.
        port: usize,
    },
    /// A workload-defined action (port close/reopen, node stop, ...).
    Action {
        /// Workload-defined code.
        code: u64,
    },
}

struct Scheduled {
    at: u64,
    order: u64,
    what: Happening,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// One simulated node: its NIC and whether it still runs.
pub struct SimNode {
    /// The NIC, running the real firmware.
    pub nic: Box<SimNic>,
    /// A stopped node does nothing: packets to it vanish, its timers never fire.
    pub stopped: bool,
    /// When its pending poll is scheduled (to avoid flooding the heap with polls).
    next_poll: Option<u64>,
}

/// The world: nodes, a wire, virtual time.
pub struct World {
    /// The nodes, indexed by node id.
    pub nodes: Vec<SimNode>,
    /// The seed everything was drawn from.
    pub seed: u64,
    /// Random choices of the wire and the workload.
    pub rng: Rng,
    /// Wire faults in force.
    pub faults: WireFaults,
    /// One-way wire latency.
    pub latency: Duration,
    heap: BinaryHeap<Reverse<Scheduled>>,
    order: u64,
    now: u64,
    /// Happenings processed so far.
    pub steps: u64,
    /// Packets put on the wire / lost / duplicated.
    pub wire_counts: [u64; 3],
    /// An attacker on the path who records genuine packets and sends them again later
    /// ([`Adversary`]); `None` in a world without one.
    pub adversary: Option<Adversary>,
    /// The longest a doorbell takes to reach the NIC (zero: at once).
    pub doorbell_delay: Duration,
}

/// Stack of the thread that builds a world's NIC cores.
const NIC_BUILD_STACK: usize = 16 << 20;

/// Runs `build` on a thread with [`NIC_BUILD_STACK`]: a NIC core is large (its connection tables
/// and port state), and an unoptimised build assembles it on the stack before it moves to the
/// heap, which the thread running a campaign (a test's, 2 MiB) cannot hold. Never on the
/// caller's stack: even a fallback there would make the caller's frame that large.
fn on_build_stack<T: Send>(build: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("sim-build".to_owned())
            .stack_size(NIC_BUILD_STACK)
            .spawn_scoped(scope, build)
            .expect("a thread to build the simulated NICs on")
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

impl World {
    /// The memory of `port` on `node` (None while the port has no region).
    pub fn port_memory(&self, node: usize, port: usize) -> Option<&RawMemory> {
        self.nodes[node].nic.hal().port_memory(port)
    }

    /// `items` in an order drawn from the world's generator (Fisher and Yates's shuffle).
    pub fn shuffled<T: Clone>(&mut self, items: &[T]) -> Vec<T> {
        let mut order = items.to_vec();
        for i in (1..order.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        order
    }

    /// A world of `nodes` NICs with `config`, all drawn from `seed`.
    pub fn new(
        seed: u64,
        nodes: usize,
        config: Config,
        faults: WireFaults,
        latency: Duration,
    ) -> Self {
        let mut rng = Rng::new(seed);
        let stamps: Vec<(u32, [u8; 16])> = (0..nodes)
            .map(|_| (rng.next_u64() as u32, entropy(&mut rng)))
            .collect();
        let nodes = on_build_stack(|| -> Vec<SimNode> {
            stamps
                .iter()
                .enumerate()
                .map(|(id, &(stamp, entropy))| SimNode {
                    nic: Box::new(Nic::new(
                        SimHal::default(),
                        NodeId::new(id as u16),
                        config,
                        stamp,
                        entropy,
                    )),
                    stopped: false,
                    next_poll: None,
                })
                .collect()
        });
        Self {
            nodes,
            seed,
            rng,
            faults,
            latency,
            heap: BinaryHeap::new(),
            order: 0,
            now: 0,
            steps: 0,
            wire_counts: [0; 3],
            adversary: None,
            doorbell_delay: DOORBELL_DELAY,
        }
    }

    /// Virtual time now.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.now)
    }

    /// Schedules `what` at `at` (not before now).
    pub fn schedule(&mut self, at: Instant, what: Happening) {
        self.order += 1;
        let at = at.as_nanos().max(self.now);
        self.heap.push(Reverse(Scheduled {
            at,
            order: self.order,
            what,
        }));
    }

    /// Schedules `what` `after` from now.
    pub fn schedule_in(&mut self, after: Duration, what: Happening) {
        self.schedule(self.now().saturating_add(after), what);
    }

    /// Takes the next happening, advancing time to it.
    pub fn next_happening(&mut self) -> Option<Happening> {
        // The adversary's bursts come between happenings: its packets arrive as any other.
        while let Some(at) = self.adversary.as_ref().and_then(Adversary::next_burst)
            && self.heap.peek().is_some_and(|Reverse(next)| next.at >= at)
        {
            self.now = self.now.max(at);
            let burst = self
                .adversary
                .as_mut()
                .map(Adversary::take_burst)
                .unwrap_or_default();
            for (node, bytes) in burst {
                self.schedule_in(self.latency, Happening::Arrive { node, bytes });
            }
        }
        let Reverse(next) = self.heap.pop()?;
        self.now = next.at;
        self.steps += 1;
        Some(next.what)
    }

    /// Opens `port` on `node`: a fresh region with the driver's header, then the NIC's open.
    /// Returns the host's rings.
    pub fn open_port(&mut self, node: usize, port: usize) -> HostRings {
        let layout = layout();
        let region = HeapRegion::new(layout.region_len);
        let header = layout.header(
            NodeId::new(node as u16),
            PortId(port as u8),
            0,
            Default::default(),
        );
        let _ = shared_abi::ring::SharedMemory::write(region.memory(), 0, header.as_bytes());
        let now = self.now();
        let sim_node = &mut self.nodes[node];
        sim_node.nic.hal_mut().set_region(port, Some(region));
        if let Err(error) = sim_node.nic.open_port(PortId(port as u8), now) {
            panic!(
                "seed {}: opening node {node} port {port}: {error}",
                self.seed
            );
        }
        HostRings::new()
    }

    /// Restarts `node`'s NIC: a new boot (its own boot stamp and random bytes), with every port
    /// closed and nothing of the old one's state. The node runs again at once.
    pub fn restart_node(&mut self, node: usize) {
        let stamp = self.rng.next_u64() as u32;
        let entropy = entropy(&mut self.rng);
        let config = *self.nodes[node].nic.config();
        let id = NodeId::new(node as u16);
        let nic = on_build_stack(move || {
            Box::new(Nic::new(SimHal::default(), id, config, stamp, entropy))
        });
        let sim_node = &mut self.nodes[node];
        sim_node.nic = nic;
        sim_node.stopped = false;
        sim_node.next_poll = None;
    }

    /// Recorded packets the replay adversary (if any) sent again so far.
    pub fn replayed(&self) -> u64 {
        self.adversary
            .as_ref()
            .map_or(0, |adversary| adversary.replayed)
    }

    /// Closes `port` on `node` (its process died) and frees its region.
    pub fn close_port(&mut self, node: usize, port: usize) {
        let now = self.now();
        let sim_node = &mut self.nodes[node];
        sim_node.nic.close_port(PortId(port as u8), now);
        sim_node.nic.hal_mut().set_region(port, None);
        self.after_nic(node);
    }

    /// Delivers a packet and polls the NIC.
    pub fn arrive(&mut self, node: usize, bytes: &[u8]) {
        let now = self.now();
        let Some(sim_node) = self.nodes.get_mut(node) else {
            return;
        };
        if sim_node.stopped {
            return;
        }
        sim_node.nic.on_packet(bytes, now);
        sim_node.nic.poll(now);
        self.after_nic(node);
    }

    /// Polls `node`'s NIC (a timer or a doorbell).
    pub fn poll(&mut self, node: usize) {
        let now = self.now();
        let Some(sim_node) = self.nodes.get_mut(node) else {
            return;
        };
        if sim_node.next_poll.is_some_and(|at| at <= self.now) {
            sim_node.next_poll = None;
        }
        if sim_node.stopped {
            return;
        }
        sim_node.nic.poll(now);
        self.after_nic(node);
    }

    /// Rings `node`'s doorbell: its NIC polls after a random delay of up to
    /// [`World::doorbell_delay`] (a real NIC notices a doorbell a little later, and the host goes
    /// on meanwhile: it may post more, or close the port, before the NIC has looked).
    pub fn doorbell(&mut self, node: usize) {
        let most = self.doorbell_delay.as_nanos() as u64;
        if most == 0 {
            self.poll(node);
            return;
        }
        let delay = Duration::from_nanos(self.rng.below(most + 1));
        self.schedule_in(delay, Happening::Poll { node });
    }

    /// The process on `port` of `node` closes it in order: the NIC first finishes what the
    /// process posted, then lets go of the region ([`World::is_closing`] says when it has).
    pub fn close_port_orderly(&mut self, node: usize, port: usize) {
        let now = self.now();
        self.nodes[node].nic.begin_close(PortId(port as u8), now);
        self.after_nic(node);
    }

    /// Whether `port` of `node` is still finishing an orderly close.
    pub fn is_closing(&self, node: usize, port: usize) -> bool {
        self.nodes[node].nic.is_closing(PortId(port as u8))
    }

    /// Moves what the NIC transmitted onto the wire (through the fault plan) and schedules its
    /// next timer.
    fn after_nic(&mut self, node: usize) {
        let finished = self.nodes[node].nic.take_finished_closes();
        for port in (0..8).filter(|port| finished & (1 << port) != 0) {
            // The NIC has let go of the region of a port it finished closing.
            self.nodes[node].nic.hal_mut().set_region(port, None);
        }
        let outbox = std::mem::take(&mut self.nodes[node].nic.hal_mut().outbox);
        for (destination, bytes) in outbox {
            self.wire_counts[0] += 1;
            let destination = usize::from(destination.get());
            if let Some(adversary) = self.adversary.as_mut() {
                adversary.observe(destination, &bytes);
            }
            if self.rng.chance(self.faults.loss) {
                self.wire_counts[1] += 1;
                continue;
            }
            let copies = if self.rng.chance(self.faults.duplicate) {
                self.wire_counts[2] += 1;
                2
            } else {
                1
            };
            for _ in 0..copies {
                let mut delay = self.latency;
                if self.rng.chance(self.faults.reorder) {
                    let window = self.faults.reorder_window.as_nanos() as u64;
                    delay += Duration::from_nanos(self.rng.below(window.max(1)));
                }
                self.schedule_in(
                    delay,
                    Happening::Arrive {
                        node: destination,
                        bytes: bytes.clone(),
                    },
                );
            }
        }
        let Some(at) = self.nodes[node].nic.poll_at() else {
            return;
        };
        let at = at.as_nanos().max(self.now);
        let sim_node = &mut self.nodes[node];
        if sim_node.next_poll.is_none_or(|scheduled| at < scheduled) {
            sim_node.next_poll = Some(at);
            self.schedule(Instant::from_nanos(at), Happening::Poll { node });
        }
    }
}

/// A NIC boot's random bytes, from the world's seeded generator.
fn entropy(rng: &mut Rng) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&rng.next_u64().to_le_bytes());
    bytes[8..].copy_from_slice(&rng.next_u64().to_le_bytes());
    bytes
}
