//! The first instructions after reset, and the few instructions Rust cannot express.
//!
//! `_start` is what the image header's entry point names and what the linker script places first
//! at 0x8000_0000. Before any Rust code may run it parks every hart but hart 0, points the trap
//! vector at the trap handler, sets the global pointer and the stack pointer, paints the stack
//! with [`STACK_PAINT`] (so the high-water mark can be measured, [`crate::stack`]), locks the
//! guard below the stack (PMP entry 0, so an overflow traps), zeroes `.bss` and copies `.data`
//! from its load address. Then it calls [`board_main`].
//!
//! Nothing is meant to trap: interrupts are enabled only in `mie` (to end a `wfi`), never in
//! `mstatus`. A trap is a bug, so the handler records `mcause`, `mepc` and `mtval` in the
//! mailbox and stops the machine through the test finisher with exit status `100 + mcause`, which
//! the host reports.
#![allow(unsafe_code, reason = "the entry assembly, `wfi` and the CSR writes")]

use shared_abi::qemu::layout::{SHARED_AREA_BASE, offsets};

/// The word the stack is painted with at boot.
pub(crate) const STACK_PAINT: u32 = 0x5354_4b21;

core::arch::global_asm!(
    r#"
    .section .text.entry, "ax"
    .global _start
_start:
    /* gp must be set without linker relaxation, or `la gp` would be relaxed against itself. */
    .option push
    .option norelax
    la gp, __global_pointer$
    .option pop

    csrr t0, mhartid
    bnez t0, 9f

    la t0, _trap
    csrw mtvec, t0

    la sp, _stack_top

    /* Paint the stack, a word at a time: the linker script aligns both ends to 16. */
    la t0, _sstack
    li t2, {paint}
0:  bgeu t0, sp, 6f
    sw t2, 0(t0)
    addi t0, t0, 4
    j 0b

    /* Lock the 256-byte guard below the stack against reads, writes and execution, machine mode
       included: PMP entry 0, NAPOT (address bits ...011111 for 2^8 bytes), L set, RWX clear. */
6:  la t0, _sstack_guard
    srli t0, t0, 2
    ori t0, t0, 0x1f
    csrw pmpaddr0, t0
    li t0, 0x98
    csrw pmpcfg0, t0

    /* Zero .bss, a word at a time: the linker script aligns both ends to 4. */
1:  la t0, _sbss
    la t1, _ebss
5:  bgeu t0, t1, 2f
    sw zero, 0(t0)
    addi t0, t0, 4
    j 5b

    /* Copy .data from where it was loaded to where it runs, unless those are the same. */
2:  la t0, _sidata
    la t1, _sdata
    la t2, _edata
    beq t0, t1, 4f
3:  bgeu t1, t2, 4f
    lw t3, 0(t0)
    sw t3, 0(t1)
    addi t0, t0, 4
    addi t1, t1, 4
    j 3b

4:  call board_main

    /* Harts other than 0, and a return that cannot happen, stop here. */
9:  wfi
    j 9b

    /* mtvec needs 4-byte alignment. Record the trap in the mailbox, then stop the machine with
       exit status 100 + mcause through the test finisher. */
    .balign 4
_trap:
    li t0, {mailbox}
    csrr t1, mcause
    sw t1, {trap_cause}(t0)
    csrr t2, mepc
    sw t2, {trap_pc}(t0)
    csrr t2, mtval
    sw t2, {trap_value}(t0)
    andi t1, t1, 0x3f
    addi t1, t1, 100
    slli t1, t1, 16
    li t2, 0x3333
    or t1, t1, t2
    li t0, 0x100000
    sw t1, 0(t0)
8:  wfi
    j 8b
"#,
    paint = const STACK_PAINT,
    mailbox = const SHARED_AREA_BASE,
    trap_cause = const offsets::TRAP_CAUSE,
    trap_pc = const offsets::TRAP_PC,
    trap_value = const offsets::TRAP_VALUE,
);

/// Called by `_start` once memory is set up; never returns.
// SAFETY: `board_main` is the one symbol of this name, called only by `_start` above with the C
// calling convention, a valid stack, zeroed `.bss` and initialised `.data`.
#[unsafe(no_mangle)]
extern "C" fn board_main() -> ! {
    crate::run()
}

/// `mie` bit of the machine timer interrupt.
const MIE_TIMER: usize = 1 << 7;
/// `mie` bit of the machine external interrupt (the PLIC).
const MIE_EXTERNAL: usize = 1 << 11;

/// Lets the machine timer and external interrupts end a `wfi`. `mstatus.MIE` stays clear, so
/// they never trap.
pub(crate) fn enable_wakeups() {
    // SAFETY: setting bits of `mie` only changes which pending interrupts end a `wfi`; with
    // `mstatus.MIE` clear (as at reset, and never set) no interrupt is taken.
    unsafe {
        core::arch::asm!(
            "csrs mie, {bits}",
            bits = in(reg) MIE_TIMER | MIE_EXTERNAL,
            options(nomem, nostack, preserves_flags)
        );
    }
}

/// Waits for an interrupt (or returns at once: `wfi` may be a no-op). For the idle loop.
pub(crate) fn wait_for_interrupt() {
    // SAFETY: `wfi` touches no memory and no registers Rust knows about; it only stalls the hart.
    unsafe { core::arch::asm!("wfi", options(nomem, nostack, preserves_flags)) }
}

/// Stops this hart for good.
pub(crate) fn halt() -> ! {
    loop {
        wait_for_interrupt();
    }
}
