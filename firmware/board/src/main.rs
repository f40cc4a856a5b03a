//! board: the nicbar NIC firmware as a bootable program for `riscv32imac-unknown-none-elf` and
//! `riscv64imac-unknown-none-elf` on QEMU's `virt` machine (one source: the entry code, the linker
//! script and the devices are the same on both).
//!
//! This is the thin target-specific layer under the portable firmware core ([`firmware::Nic`]):
//! the entry code that sets up the stack and memory before any Rust runs ([`entry`]), the linker
//! script that places the image at the RAM base 0x8000_0000 (`link-riscv-virt.x`, passed by
//! `build.rs`), the machine's devices through `volatile` pointers ([`uart`], [`clint`], [`plic`],
//! [`pci`], [`finisher`], and the virtio-net device, [`virtio_net`]), the core's
//! [`firmware::Hal`] over them ([`hal`]), the mailbox through which the host opens and closes
//! ports ([`mailbox`]), and the main loop below. The memory map
//! and the wire's packet rings, which the host reads too, are shared with it in
//! `shared_abi::qemu`. `cargo xtask image` builds it in release and wraps the ELF's
//! loadable segments into a flashable image; `nicctl qemu` boots that image as NICs.
//!
//! Built for the host, it is an ordinary program that says what it is for, so that workspace-wide
//! host builds and lints pass.
#![cfg_attr(target_os = "none", no_std, no_main)]
#![deny(unsafe_code)]

#[cfg(all(
    target_os = "none",
    not(any(target_arch = "riscv32", target_arch = "riscv64"))
))]
compile_error!(
    "the board crate supports only riscv32imac-unknown-none-elf and riscv64imac-unknown-none-elf \
     (QEMU virt) so far; there is no Cortex-M entry, linker script or UART yet"
);

#[cfg(target_os = "none")]
mod clint;
#[cfg(target_os = "none")]
mod entry;
#[cfg(target_os = "none")]
mod finisher;
#[cfg(target_os = "none")]
mod hal;
#[cfg(target_os = "none")]
mod mailbox;
#[cfg(target_os = "none")]
mod mmio;
#[cfg(target_os = "none")]
mod pci;
#[cfg(target_os = "none")]
mod plic;
#[cfg(target_os = "none")]
mod stack;
#[cfg(target_os = "none")]
mod static_cell;
mod uart;
#[cfg(target_os = "none")]
mod virtio_net;

/// The line the firmware prints when it comes up.
#[cfg_attr(
    not(target_os = "none"),
    allow(dead_code, reason = "only the NIC build prints it")
)]
const BANNER: &str = if cfg!(target_arch = "riscv64") {
    "nicbar NIC firmware, riscv64imac on QEMU virt, ABI version "
} else {
    "nicbar NIC firmware, riscv32imac on QEMU virt, ABI version "
};

#[cfg(target_os = "none")]
use nic_loop::run;

#[cfg(target_os = "none")]
mod nic_loop {
    use core::time::Duration;

    use firmware::{Instant, Nic, OpenError, RegisterError};
    use shared_abi::ids::{PORTS_PER_NIC, PortId};
    use shared_abi::packet::MAX_WIRE_LEN;
    use shared_abi::qemu::layout::{
        DOORBELL_MAILBOX, GuestCounters, GuestFailure, GuestState, PortError, PortOperation,
        WIRE_RING_ENTRIES, WireKind,
    };
    use shared_abi::qemu::wire::WireError;
    use shared_abi::ring::raw::RawMemory;
    use zerocopy::little_endian::U32;

    use crate::clint::MachineTimer;
    use crate::hal::{self, BoardHal, Datagram};
    use crate::mailbox::{self, CommandSlots, PendingCommand};
    use crate::stack::StackGauge;
    use crate::static_cell::StaticCell;
    use crate::uart::Ns16550;
    use crate::{entry, finisher, pci, plic};

    /// Remote nodes the NIC keeps connections to at once: a QEMU fabric is a handful of nodes,
    /// and each connection costs about 2.5 KiB of `.bss`.
    const CONNECTIONS: usize = 16;
    /// How long the core keeps polling after its last work before it sleeps: a process that
    /// posts again within it needs no doorbell.
    const LINGER: Duration = Duration::from_micros(200);
    /// Longest sleep: the core looks at its rings at least this often even if every doorbell
    /// were lost.
    const MAX_SLEEP: Duration = Duration::from_secs(1);

    /// How long a packet waits for its acknowledgement before it is sent again. Longer than the
    /// core's default (made for the emulated NIC): on this board every segment of a put, get or
    /// atomic costs the target (and the initiator) a guest-to-host round trip of a few hundred
    /// microseconds on a busy host, and a window of them must not time out while it is served,
    /// or each resend costs those round trips again.
    const RETRANSMIT_TIMEOUT: Duration = Duration::from_millis(20);

    type BoardNic = Nic<BoardHal, CONNECTIONS>;

    static NIC: StaticCell<BoardNic> = StaticCell::new();
    static PACKET: StaticCell<[u8; MAX_WIRE_LEN]> = StaticCell::new();

    /// The firmware's main program, entered from [`entry`] with a stack, zeroed `.bss` and
    /// initialised `.data`. Never returns.
    pub(crate) fn run() -> ! {
        boot().run()
    }

    /// Brings the board up and builds the NIC. Not inlined: building the NIC takes tens of KiB
    /// of stack for a moment (`firmware::Nic::new` assembles part of its tables there before
    /// they are moved into `.bss`), and that frame must be gone before the main loop's frames
    /// stack up.
    #[inline(never)]
    fn boot() -> Loop {
        let timer = MachineTimer::virt();
        let mut uart = Ns16550::virt_uart0(timer);
        uart.init();
        uart.write_str(crate::BANNER);
        uart.write_decimal(shared_abi::ABI_VERSION);
        uart.write_str("\r\n");

        let shared = hal::shared_area();
        let configuration = match mailbox::read_configuration(&shared) {
            Ok(configuration) => configuration,
            Err(failure) => {
                mailbox::set_state(&shared, GuestState::FAILED, failure);
                uart.write_str("refusing to run: ");
                uart.write_str(failure.describe());
                uart.write_str("\r\n");
                finisher::fail(finisher::EXIT_BAD_CONFIGURATION)
            }
        };
        let windows = pci::place_port_windows();
        mailbox::publish_windows(&shared, &windows);
        let mut gauge = StackGauge::new();
        mailbox::publish_stack(&shared, gauge.size(), gauge.high_water());

        plic::enable(plic::UART0_SOURCE);
        entry::enable_wakeups();

        uart.write_str("node ");
        uart.write_decimal(u32::from(configuration.node.get()));
        uart.write_str(" of ");
        uart.write_decimal(u32::from(configuration.node_count));
        uart.write_str(", port windows");
        for regions in windows.iter() {
            uart.write_str(" ");
            match regions[0] {
                Some(window) => uart.write_hex(window.address),
                None => uart.write_str("-"),
            }
            // How many of the port's regions were found (each open takes a fresh one).
            uart.write_str("/");
            uart.write_decimal(regions.iter().flatten().count() as u32);
        }
        uart.write_str("\r\n");

        let mut net = crate::virtio_net::VirtioNet::probe();
        if let Some(net) = &net {
            uart.write_str("virtio-net: MAC ");
            uart.write_mac(net.mac().0);
            uart.write_str("\r\n");
        }
        let wire_net = if configuration.wire == WireKind::VIRTIO_NET {
            let Some(net) = net else {
                mailbox::set_state(&shared, GuestState::FAILED, GuestFailure::BAD_WIRE);
                uart.write_str("refusing to run: ");
                uart.write_str(GuestFailure::BAD_WIRE.describe());
                uart.write_str("\r\n");
                finisher::fail(finisher::EXIT_BAD_CONFIGURATION)
            };
            plic::enable(net.interrupt());
            uart.write_str("wire: UDP/IPv4 through virtio-net\r\n");
            Some(net)
        } else {
            if let Some(net) = &mut net {
                let mut frame = [0; shared_abi::qemu::net::MAX_FRAME_LEN];
                crate::virtio_net::link_check(net, &mut frame, &mut uart, &timer);
            }
            None
        };

        // The board has no random source of its own: its session nonces are drawn from the boot
        // stamp the host wrote (milliseconds of wall-clock time), the node and the machine
        // timer's count at this moment. They differ from boot to boot, which is what keeps an
        // earlier boot's traffic out; the nonces are tags of the fabric key over them, so no
        // one without the key can foresee them.
        let mut boot_entropy = [0u8; 16];
        let sources = configuration
            .boot_stamp_ms
            .to_le_bytes()
            .into_iter()
            .chain(timer.ticks().to_le_bytes())
            .chain(configuration.node.get().to_le_bytes());
        for (slot, byte) in boot_entropy.iter_mut().zip(sources) {
            *slot = byte;
        }
        let hal = BoardHal::new(
            configuration.node,
            configuration.node_count,
            wire_net,
            windows,
            uart,
            timer,
        );
        let Some(nic) = NIC.init_with(|| {
            Nic::new(
                hal,
                configuration.node,
                firmware::Config {
                    fabric_key: configuration.fabric_key,
                    retransmit_timeout: RETRANSMIT_TIMEOUT,
                    ..firmware::Config::default()
                },
                configuration.boot_stamp_ms,
                boot_entropy,
            )
        }) else {
            finisher::fail(finisher::EXIT_PANIC)
        };
        let Some(packet) = PACKET.init_with(|| [0; MAX_WIRE_LEN]) else {
            finisher::fail(finisher::EXIT_PANIC)
        };
        Loop {
            nic,
            packet,
            timer,
            gauge,
            commands: CommandSlots::new(&shared),
            counters: GuestCounters::default(),
        }
    }

    struct Loop {
        nic: &'static mut BoardNic,
        packet: &'static mut [u8; MAX_WIRE_LEN],
        timer: MachineTimer,
        gauge: StackGauge,
        commands: CommandSlots,
        counters: GuestCounters,
    }

    impl Loop {
        fn shared(&self) -> &RawMemory {
            self.nic.hal().shared()
        }

        fn run(mut self) -> ! {
            let boot = self.gauge.restart();
            mailbox::publish_boot_stack(self.shared(), boot);
            // RUNNING only now, after the boot stack mark: the host reads both once it sees it.
            mailbox::set_state(self.shared(), GuestState::RUNNING, GuestFailure::NONE);
            let linger = MachineTimer::ticks_in(LINGER);
            let mut last_work = self.timer.ticks();
            loop {
                let now = self.timer.now();
                let mut busy = self.serve_commands(now);
                busy |= self.take_packets(now);
                busy |= self.nic.poll(now);
                self.nic.hal_mut().doorbell_switch_if_asked();
                if busy {
                    last_work = self.timer.ticks();
                    continue;
                }
                if self.timer.ticks().wrapping_sub(last_work) < linger {
                    continue;
                }
                self.sleep();
            }
        }

        /// Publishes the counters and the stack mark, raises every sleeping flag, looks once
        /// more, and waits for a byte on the UART or the next deadline.
        fn sleep(&mut self) {
            if mailbox::power_off_requested(self.shared()) {
                self.publish();
                mailbox::set_state(self.shared(), GuestState::STOPPED, GuestFailure::NONE);
                finisher::power_off();
            }
            self.publish();
            mailbox::set_sleeping(self.shared(), true);
            self.nic.hal().set_sleeping(true);
            // Everything published before the flags went up is seen here; everything after rings
            // the UART.
            let now = self.timer.now();
            let mut late = self.nic.hal_mut().datagram_waiting();
            let (ring, memory) = self.nic.hal_mut().receive_ring();
            late |= ring.available(memory).map_or(true, |count| count > 0);
            late |= self.commands.any_pending(self.shared());
            late |= mailbox::power_off_requested(self.shared());
            late |= self.nic.poll(now);
            self.nic.hal_mut().doorbell_switch_if_asked();
            if !late {
                let deadline = firmware::time::earliest(
                    self.nic.poll_at(),
                    Some(now.saturating_add(MAX_SLEEP)),
                )
                .unwrap_or(Instant::ZERO);
                self.timer.wake_at(MachineTimer::ticks_at(deadline));
                entry::wait_for_interrupt();
                self.counters.wakeups = U32::new(self.counters.wakeups.get().wrapping_add(1));
                let uart = self.nic.hal_mut().uart();
                // Any byte is a doorbell; they say nothing more. Bounded: the FIFO is 16 bytes
                // and the host writes a byte per doorbell.
                for _ in 0..64 {
                    if uart.read_byte().is_none() {
                        break;
                    }
                }
                plic::acknowledge_all();
            }
            self.nic.hal().set_sleeping(false);
            mailbox::set_sleeping(self.shared(), false);
        }

        fn publish(&mut self) {
            let hal_dropped = self.nic.hal_mut().uart().dropped();
            let nic_counters = self.nic.counters();
            let hal = self.nic.hal();
            let counters = &mut self.counters;
            counters.packets_transmitted = U32::new(hal.packets_transmitted);
            counters.transmit_full = U32::new(hal.transmit_full);
            counters.barriers_completed = U32::new(nic_counters.barriers_completed as u32);
            counters.barriers_failed = U32::new(nic_counters.barriers_failed as u32);
            counters.messages_delivered = U32::new(nic_counters.messages_delivered as u32);
            counters.malformed_packets = U32::new(nic_counters.malformed_packets as u32);
            counters.unauthenticated = U32::new(nic_counters.unauthenticated as u32);
            counters.memory_accesses = U32::new(hal.memory_accesses);
            counters.memory_faults = U32::new(hal.memory_faults);
            counters.memory_timeouts = U32::new(hal.memory_timeouts);
            counters.tokens_rejected = U32::new(nic_counters.tokens_rejected as u32);
            let uart_dropped = hal_dropped;
            counters.uart_dropped = U32::new(uart_dropped);
            let high_water = self.gauge.high_water();
            let shared = self.nic.hal().shared();
            mailbox::publish_counters(shared, &self.counters);
            mailbox::publish_stack(shared, self.gauge.size(), high_water);
        }

        /// Takes every packet in the receive ring (at most a ring's worth, so commands and
        /// transmission get their turn). Returns whether there was any.
        fn take_packets(&mut self, now: Instant) -> bool {
            if self.nic.hal().wire_is_virtio_net() {
                return self.take_datagrams(now);
            }
            let mut busy = false;
            for _ in 0..WIRE_RING_ENTRIES {
                let (ring, memory) = self.nic.hal_mut().receive_ring();
                match ring.pop(memory, self.packet) {
                    Ok(Some(taken)) => {
                        busy = true;
                        self.counters.packets_received =
                            U32::new(self.counters.packets_received.get().wrapping_add(1));
                        if let Some(bytes) = self.packet.get(..taken.length) {
                            self.nic.on_packet(bytes, now);
                        }
                    }
                    Ok(None) => break,
                    Err(WireError::BadLength { .. }) => {
                        busy = true;
                        self.count_receive_error();
                    }
                    Err(WireError::Ring(_)) => {
                        // The switch broke the ring's indexes: drop what it claims to have
                        // published and go on (the reliability protocol resends what mattered).
                        let _ = ring.resynchronise(memory);
                        self.count_receive_error();
                        break;
                    }
                }
            }
            busy
        }

        /// Takes the packets waiting on the virtio-net device (at most a queue's worth). Returns
        /// whether there was any frame.
        fn take_datagrams(&mut self, now: Instant) -> bool {
            let mut busy = false;
            for _ in 0..crate::virtio_net::QUEUE {
                match self.nic.hal_mut().take_datagram(self.packet) {
                    Datagram::None => break,
                    Datagram::NotForUs | Datagram::Arp => busy = true,
                    Datagram::Dropped => {
                        busy = true;
                        self.count_receive_error();
                    }
                    Datagram::Packet(length) => {
                        busy = true;
                        self.counters.packets_received =
                            U32::new(self.counters.packets_received.get().wrapping_add(1));
                        if let Some(bytes) = self.packet.get(..length) {
                            self.nic.on_packet(bytes, now);
                        }
                    }
                }
            }
            busy
        }

        fn count_receive_error(&mut self) {
            self.counters.receive_errors =
                U32::new(self.counters.receive_errors.get().wrapping_add(1));
        }

        /// Serves the port commands the host posted. Returns whether there were any.
        fn serve_commands(&mut self, now: Instant) -> bool {
            let mut served = false;
            for port in 0..PORTS_PER_NIC {
                let Some(command) = self.commands.pending(self.shared(), port) else {
                    continue;
                };
                let (result, error) = match command.operation {
                    PortOperation::OPEN => self.open(port, command.argument, now),
                    PortOperation::CLOSE => self.close(port, now),
                    PortOperation::REGISTER_MEMORY
                    | PortOperation::DEREGISTER_MEMORY
                    | PortOperation::ALLOW_REMOTE_ACCESS => self.memory(port, &command),
                    _ => (0, PortError::BAD_OPERATION),
                };
                let shared = self.nic.hal().shared();
                self.commands
                    .answer(shared, port, command.request, result, error);
                served = true;
            }
            if served {
                self.nic.hal_mut().uart().write_byte(DOORBELL_MAILBOX);
            }
            served
        }

        /// Opens `port` on region `region` of its pool (the host names a region no earlier owner
        /// of the port held).
        fn open(&mut self, port: usize, region: u32, now: Instant) -> (u32, PortError) {
            let port_id = PortId(port as u8);
            if self.nic.port_status(port_id).is_some() {
                return (0, PortError::ALREADY_OPEN);
            }
            if let Err(error) = self.nic.hal_mut().attach(port, region) {
                return (0, error);
            }
            match self.nic.open_port(port_id, now) {
                Ok(generation) => (generation.get(), PortError::NONE),
                Err(error) => {
                    self.nic.hal_mut().detach(port);
                    let code = match error {
                        OpenError::NoSuchPort(_) => PortError::NO_SUCH_PORT,
                        OpenError::AlreadyOpen(_) => PortError::ALREADY_OPEN,
                        OpenError::NoRegion(_) => PortError::NO_REGION,
                        OpenError::BadRegion(_) => PortError::BAD_REGION,
                        OpenError::WrongIdentity { .. } => PortError::WRONG_IDENTITY,
                    };
                    (0, code)
                }
            }
        }

        /// Registers or deregisters memory of `port`'s owner, or lets peers reach it, on the
        /// host's behalf (the host has checked that the process is the port's owner).
        fn memory(&mut self, port: usize, command: &PendingCommand) -> (u32, PortError) {
            let port = PortId(port as u8);
            let answer = match command.operation {
                PortOperation::REGISTER_MEMORY => self.nic.register_memory(
                    port,
                    command.address,
                    command.length,
                    command.argument,
                ),
                PortOperation::DEREGISTER_MEMORY => self
                    .nic
                    .deregister_memory(port, command.address, command.length)
                    .map(|()| 0),
                _ => self.nic.allow_remote_memory_access(port).map(|()| 0),
            };
            match answer {
                Ok(result) => (result, PortError::NONE),
                Err(RegisterError::PortClosed(_)) => (0, PortError::NOT_OPEN),
                Err(RegisterError::TableFull) => (0, PortError::TABLE_FULL),
                Err(RegisterError::BadRange { .. }) => (0, PortError::BAD_RANGE),
                Err(RegisterError::NotRegistered { .. }) => (0, PortError::NOT_REGISTERED),
            }
        }

        fn close(&mut self, port: usize, now: Instant) -> (u32, PortError) {
            match self.nic.close_port(PortId(port as u8), now) {
                Some(generation) => {
                    // The core has let go of the window.
                    self.nic.hal_mut().detach(port);
                    (generation.get(), PortError::NONE)
                }
                None => (0, PortError::NOT_OPEN),
            }
        }
    }
}

/// Stops the machine with exit status 99: the firmware aims to have no reachable panic, and a
/// NIC that panicked has nothing safe to do but stop. The panic's message is not read, so no
/// formatting code is linked in.
#[cfg(target_os = "none")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    finisher::fail(finisher::EXIT_PANIC)
}

#[cfg(not(target_os = "none"))]
fn main() {
    println!(
        "board: this is the nicbar NIC firmware; it runs on riscv32imac-unknown-none-elf (QEMU \
         virt), not on this host. Build a flashable image with `cargo xtask image`, and boot it as \
         NICs with `nicctl qemu`."
    );
}
