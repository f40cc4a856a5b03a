//! board: the nicbar NIC firmware as a bootable program for `riscv32imac-unknown-none-elf` on
//! QEMU's `virt` machine.
//!
//! This crate is the thin target-specific layer under the portable firmware core: the entry code
//! that sets up the stack and memory before any Rust runs ([`entry`]), the linker script that places
//! the image at the RAM base 0x8000_0000 (`link-riscv-virt.x`, passed by `build.rs`), the UART for a
//! boot banner ([`uart`]), and a panic handler that halts. `cargo xtask image` builds it in release
//! and wraps the ELF's loadable segments into a flashable image.
//!
//! Built for the host, it is an ordinary program that says what it is for, so that workspace-wide
//! host builds and lints pass.
#![cfg_attr(target_os = "none", no_std, no_main)]
#![deny(unsafe_code)]

#[cfg(all(target_os = "none", not(target_arch = "riscv32")))]
compile_error!(
    "the board crate supports only riscv32imac-unknown-none-elf (QEMU virt) so far; \
     there is no Cortex-M entry, linker script or UART yet"
);

#[cfg(target_os = "none")]
mod entry;
mod uart;

/// The line the firmware prints when it comes up.
#[cfg_attr(
    not(target_os = "none"),
    allow(dead_code, reason = "only the NIC build prints it")
)]
const BANNER: &str = "nicbar NIC firmware, riscv32imac on QEMU virt, ABI version ";

/// The firmware's main program, entered from [`entry`] with a stack, zeroed `.bss` and
/// initialised `.data`. Never returns.
#[cfg(target_os = "none")]
fn run() -> ! {
    let mut console = uart::Ns16550::virt_uart0();
    console.init();
    console.write_str(BANNER);
    console.write_decimal(shared_abi::ABI_VERSION);
    console.write_str("\r\n");

    // The portable firmware core plugs in here: build this board's `firmware::Hal` (host memory
    // and DMA, packet transmit and receive, the timer), construct `firmware::Nic` over it, and
    // drive it from this loop — poll it, and wait for an interrupt when it has nothing to do.
    loop {
        entry::wait_for_interrupt();
    }
}

/// Halts: the firmware aims to have no reachable panic, and a NIC that panicked has nothing safe
/// to do but stop. The panic's message is not read, so no formatting code is linked in.
#[cfg(target_os = "none")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    entry::halt()
}

#[cfg(not(target_os = "none"))]
fn main() {
    println!(
        "board: this is the nicbar NIC firmware; it runs on riscv32imac-unknown-none-elf (QEMU \
         virt), not on this host. Build a flashable image with `cargo xtask image`."
    );
}
