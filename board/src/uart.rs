//! The ns16550-compatible UART of QEMU's `virt` machine, at 0x1000_0000: transmit only, polled.
#![allow(unsafe_code, reason = "creating the pointer to the UART's registers")]
#![cfg_attr(
    not(target_os = "none"),
    allow(dead_code, reason = "the host build only tests this module")
)]

use core::ptr::NonNull;

use volatile::{VolatilePtr, map_field};

/// Physical address of the `virt` machine's UART0.
pub(crate) const VIRT_UART0_BASE: usize = 0x1000_0000;

/// Line status register: the transmit holding register is empty.
const LSR_THR_EMPTY: u8 = 1 << 5;
/// Line control register: 8 data bits, no parity, one stop bit, divisor latch closed.
const LCR_8N1: u8 = 0b0000_0011;
/// FIFO control register: enable the FIFOs and clear both.
const FCR_ENABLE_AND_CLEAR: u8 = 0b0000_0111;

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

/// A 16550 UART, written by polling.
pub(crate) struct Ns16550 {
    registers: VolatilePtr<'static, Registers>,
}

impl Ns16550 {
    /// The `virt` machine's UART0.
    #[cfg(target_os = "none")]
    pub(crate) fn virt_uart0() -> Self {
        let address = core::ptr::with_exposed_provenance_mut::<Registers>(VIRT_UART0_BASE);
        // SAFETY: the virt machine maps a 16550 register block at this non-null address for the
        // whole run, and this firmware makes one `Ns16550` of it: no other code touches it.
        unsafe { Self::new(NonNull::new_unchecked(address)) }
    }

    /// A UART whose registers are at `registers`.
    ///
    /// # Safety
    /// `registers` points at a 16550 register block (or memory standing in for one) valid for
    /// volatile reads and writes for the rest of the program, and nothing else accesses it while
    /// this value lives.
    pub(crate) unsafe fn new(registers: NonNull<Registers>) -> Self {
        // SAFETY: forwarded from this function's contract.
        let registers = unsafe { VolatilePtr::new(registers) };
        Self { registers }
    }

    /// Sets 8N1 framing, enables and clears the FIFOs, and masks the UART's interrupts. The baud
    /// divisor is left alone: QEMU ignores it, and a real board's firmware would set it here.
    pub(crate) fn init(&mut self) {
        let registers = self.registers;
        map_field!(registers.interrupt_enable).write(0);
        map_field!(registers.line_control).write(LCR_8N1);
        map_field!(registers.fifo_control).write(FCR_ENABLE_AND_CLEAR);
    }

    /// Sends one byte, waiting until the transmitter has room.
    pub(crate) fn write_byte(&mut self, byte: u8) {
        let registers = self.registers;
        while map_field!(registers.line_status).read() & LSR_THR_EMPTY == 0 {
            core::hint::spin_loop();
        }
        map_field!(registers.data).write(byte);
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
        loop {
            digits[count] = b'0' + (remaining % 10) as u8;
            count += 1;
            remaining /= 10;
            if remaining == 0 || count == digits.len() {
                break;
            }
        }
        for &digit in digits[..count].iter().rev() {
            self.write_byte(digit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A register block in ordinary memory with the transmitter always empty; records the last
    /// byte written to the data register.
    fn fake_registers() -> Box<Registers> {
        Box::new(Registers {
            data: 0,
            interrupt_enable: 0xff,
            fifo_control: 0,
            line_control: 0,
            modem_control: 0,
            line_status: LSR_THR_EMPTY,
            modem_status: 0,
            scratch: 0,
        })
    }

    #[test]
    fn init_sets_framing_and_masks_interrupts() {
        let registers = Box::leak(fake_registers());
        // SAFETY: the leaked box lives for the rest of the test and only this UART touches it.
        let mut uart = unsafe { Ns16550::new(NonNull::from(&mut *registers)) };
        uart.init();
        uart.write_decimal(4_294_967_295);
        let block = uart.registers.read_only();
        assert_eq!(map_field!(block.line_control).read(), LCR_8N1);
        assert_eq!(map_field!(block.interrupt_enable).read(), 0);
        assert_eq!(map_field!(block.fifo_control).read(), FCR_ENABLE_AND_CLEAR);
        assert_eq!(map_field!(block.data).read(), b'5');
    }
}
