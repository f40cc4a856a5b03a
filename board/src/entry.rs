//! The first instructions after reset, and the few instructions Rust cannot express.
//!
//! `_start` is what the image header's entry point names and what the linker script places first
//! at 0x8000_0000. Before any Rust code may run it parks every hart but hart 0, points the trap
//! vector at a halt loop (there is no trap handling yet; a stray trap must not run off into
//! random memory), sets the global pointer and the stack pointer, zeroes `.bss` and copies `.data`
//! from its load address. Then it calls [`board_main`].
#![allow(unsafe_code, reason = "the entry assembly and the `wfi` instruction")]

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

    la t0, _halt_trap
    csrw mtvec, t0

    la sp, _stack_top

    /* Zero .bss, a word at a time: the linker script aligns both ends to 4. */
    la t0, _sbss
    la t1, _ebss
1:  bgeu t0, t1, 2f
    sw zero, 0(t0)
    addi t0, t0, 4
    j 1b

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

    /* mtvec needs 4-byte alignment. A trap stops the hart where a debugger can see mepc. */
    .balign 4
_halt_trap:
    wfi
    j _halt_trap
"#
);

/// Called by `_start` once memory is set up; never returns.
// SAFETY: `board_main` is the one symbol of this name, called only by `_start` above with the C
// calling convention, a valid stack, zeroed `.bss` and initialised `.data`.
#[unsafe(no_mangle)]
extern "C" fn board_main() -> ! {
    crate::run()
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
