//! The ns16550-compatible UART of QEMU's `virt` machine, at 0x1000_0000, polled.
//!
//! It carries the console (text the firmware writes) and the doorbells between the host and the
//! core (bytes both ways, see `shared_abi::qemu::layout`): the receive interrupt is enabled so that a byte
//! from the host ends a `wfi`. Transmission waits for room through an `embedded-hal`
//! [`DelayNs`] with a bound: a host that stops reading the serial line must not wedge the NIC.
#![allow(unsafe_code, reason = "creating the pointer to the UART's registers")]
#![cfg_attr(
    not(target_os = "none"),
    allow(dead_code, reason = "the host build only tests this module")
)]

use core::ptr::NonNull;

use embedded_hal::delay::DelayNs;
use volatile::{VolatilePtr, map_field};

/// Physical address of the `virt` machine's UART0.
pub(crate) const VIRT_UART0_BASE: usize = 0x1000_0000;

/// Line status register: a received byte waits in the receive buffer.
const LSR_DATA_READY: u8 = 1 << 0;
/// Line status register: the transmit holding register is empty.
const LSR_THR_EMPTY: u8 = 1 << 5;
/// Line control register: 8 data bits, no parity, one stop bit, divisor latch closed.
const LCR_8N1: u8 = 0b0000_0011;
/// FIFO control register: enable the FIFOs and clear both; interrupt at one received byte.
const FCR_ENABLE_AND_CLEAR: u8 = 0b0000_0111;
/// Interrupt enable register: received data available.
const IER_RECEIVED_DATA: u8 = 1 << 0;
/// How long one byte may wait for the transmitter, in microseconds, before it is dropped.
const TRANSMIT_PATIENCE_US: u32 = 20_000;
/// Step of the wait for the transmitter, in microseconds.
const TRANSMIT_POLL_US: u32 = 1;

/// The 16550 register block with the divisor latch closed; one byte per register.
#[repr(C)]
pub(crate) struct Registers {
    /// Write: transmit holding register. Read: receive buffer.
    data: u8,
    /// Interrupt enable.
    interrupt_enable: u8,
    /// Write: FIFO control. Read: interrupt identification.
    fifo_control: u8,
    /// Line control.
    line_control: u8,
    /// Modem control.
    modem_control: u8,
    /// Line status.
    line_status: u8,
    /// Modem status.
    modem_status: u8,
    /// Scratch.
    scratch: u8,
}
const _: () = assert!(core::mem::size_of::<Registers>() == 8);

/// A 16550 UART, written and read by polling; `D` waits for the transmitter.
pub(crate) struct Ns16550<D> {
    registers: VolatilePtr<'static, Registers>,
    delay: D,
    /// Bytes dropped because the transmitter stayed full.
    dropped: u32,
}

impl<D: DelayNs> Ns16550<D> {
    /// The `virt` machine's UART0.
    #[cfg(target_os = "none")]
    pub(crate) fn virt_uart0(delay: D) -> Self {
        let address = core::ptr::with_exposed_provenance_mut::<Registers>(VIRT_UART0_BASE);
        // SAFETY: the virt machine maps a 16550 register block at this non-null address for the
        // whole run, and this firmware makes one `Ns16550` of it: no other code touches it.
        unsafe { Self::new(NonNull::new_unchecked(address), delay) }
    }

    /// A UART whose registers are at `registers`.
    ///
    /// # Safety
    /// `registers` points at a 16550 register block (or memory standing in for one) valid for
    /// volatile reads and writes for the rest of the program, and nothing else accesses it while
    /// this value lives.
    pub(crate) unsafe fn new(registers: NonNull<Registers>, delay: D) -> Self {
        // SAFETY: forwarded from this function's contract.
        let registers = unsafe { VolatilePtr::new(registers) };
        Self {
            registers,
            delay,
            dropped: 0,
        }
    }

    /// Sets 8N1 framing, enables and clears the FIFOs, and enables the receive interrupt only.
    /// The baud divisor is left alone: QEMU ignores it, and a real board's firmware would set it
    /// here.
    pub(crate) fn init(&mut self) {
        let registers = self.registers;
        map_field!(registers.line_control).write(LCR_8N1);
        map_field!(registers.fifo_control).write(FCR_ENABLE_AND_CLEAR);
        map_field!(registers.interrupt_enable).write(IER_RECEIVED_DATA);
    }

    /// Sends one byte, waiting a bounded time for the transmitter to have room. Returns whether
    /// it was sent; a dropped byte is counted ([`Ns16550::dropped`]).
    pub(crate) fn write_byte(&mut self, byte: u8) -> bool {
        let registers = self.registers;
        let mut waited = 0;
        while map_field!(registers.line_status).read() & LSR_THR_EMPTY == 0 {
            if waited >= TRANSMIT_PATIENCE_US {
                self.dropped = self.dropped.wrapping_add(1);
                return false;
            }
            self.delay.delay_us(TRANSMIT_POLL_US);
            waited += TRANSMIT_POLL_US;
        }
        map_field!(registers.data).write(byte);
        true
    }

    /// The next received byte, if one waits.
    pub(crate) fn read_byte(&mut self) -> Option<u8> {
        let registers = self.registers;
        if map_field!(registers.line_status).read() & LSR_DATA_READY == 0 {
            return None;
        }
        Some(map_field!(registers.data).read())
    }

    /// Bytes dropped so far because the transmitter stayed full.
    pub(crate) fn dropped(&self) -> u32 {
        self.dropped
    }

    /// Sends `text`.
    pub(crate) fn write_str(&mut self, text: &str) {
        for &byte in text.as_bytes() {
            self.write_byte(byte);
        }
    }

    /// Sends `value` in decimal, without the formatting machinery of `core::fmt`.
    pub(crate) fn write_decimal(&mut self, value: u32) {
        let mut digits = [0u8; 10];
        let mut remaining = value;
        let mut count = 0;
        for digit in digits.iter_mut() {
            *digit = b'0' + (remaining % 10) as u8;
            count += 1;
            remaining /= 10;
            if remaining == 0 {
                break;
            }
        }
        for &digit in digits.iter().take(count).rev() {
            self.write_byte(digit);
        }
    }

    /// Sends a MAC address as six colon-separated pairs of hexadecimal digits.
    pub(crate) fn write_mac(&mut self, mac: [u8; 6]) {
        for (index, byte) in mac.into_iter().enumerate() {
            if index > 0 {
                self.write_byte(b':');
            }
            for nibble in [byte >> 4, byte & 0xf] {
                self.write_byte(if nibble < 10 {
                    b'0' + nibble
                } else {
                    b'a' + nibble - 10
                });
            }
        }
    }

    /// Sends `value` as `0x` and eight hexadecimal digits.
    pub(crate) fn write_hex(&mut self, value: u32) {
        self.write_str("0x");
        for shift in (0..8).rev() {
            let nibble = ((value >> (shift * 4)) & 0xf) as u8;
            let digit = if nibble < 10 {
                b'0' + nibble
            } else {
                b'a' + nibble - 10
            };
            self.write_byte(digit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A delay that only counts the microseconds asked for.
    #[derive(Default)]
    struct CountingDelay {
        waited_ns: u64,
    }

    impl DelayNs for CountingDelay {
        fn delay_ns(&mut self, ns: u32) {
            self.waited_ns += u64::from(ns);
        }
    }

    /// A register block in ordinary memory with the given line status.
    fn fake_registers(line_status: u8) -> &'static mut Registers {
        Box::leak(Box::new(Registers {
            data: 0,
            interrupt_enable: 0xff,
            fifo_control: 0,
            line_control: 0,
            modem_control: 0,
            line_status,
            modem_status: 0,
            scratch: 0,
        }))
    }

    #[test]
    fn init_sets_framing_and_enables_only_the_receive_interrupt() {
        let registers = fake_registers(LSR_THR_EMPTY);
        // SAFETY: the leaked block lives for the rest of the test and only this UART touches it.
        let mut uart = unsafe { Ns16550::new(NonNull::from(registers), CountingDelay::default()) };
        uart.init();
        uart.write_decimal(4_294_967_295);
        let block = uart.registers.read_only();
        assert_eq!(map_field!(block.line_control).read(), LCR_8N1);
        assert_eq!(map_field!(block.interrupt_enable).read(), IER_RECEIVED_DATA);
        assert_eq!(map_field!(block.fifo_control).read(), FCR_ENABLE_AND_CLEAR);
        assert_eq!(map_field!(block.data).read(), b'5');
        uart.write_hex(0xdead_beef);
        assert_eq!(map_field!(block.data).read(), b'f');
        assert_eq!(uart.delay.waited_ns, 0);
    }

    #[test]
    fn a_full_transmitter_drops_the_byte_after_a_bounded_wait() {
        let registers = fake_registers(0);
        // SAFETY: as above.
        let mut uart = unsafe { Ns16550::new(NonNull::from(registers), CountingDelay::default()) };
        assert!(!uart.write_byte(b'x'));
        assert_eq!(uart.dropped(), 1);
        assert_eq!(uart.delay.waited_ns, u64::from(TRANSMIT_PATIENCE_US) * 1000);
        let block = uart.registers.read_only();
        assert_eq!(map_field!(block.data).read(), 0, "nothing was written");
    }

    #[test]
    fn received_bytes_are_read_only_when_ready() {
        let registers = fake_registers(0);
        registers.data = 0x42;
        let registers = NonNull::from(registers);
        // SAFETY: as above.
        let mut uart = unsafe { Ns16550::new(registers, CountingDelay::default()) };
        assert_eq!(uart.read_byte(), None);
        // SAFETY: the test owns the block; the UART does not access it during this write.
        unsafe { (*registers.as_ptr()).line_status = LSR_DATA_READY };
        assert_eq!(uart.read_byte(), Some(0x42));
    }
}
