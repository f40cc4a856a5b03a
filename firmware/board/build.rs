//! Hands the linker script to the linker when building for the NIC (a bare-metal target); a host
//! build links normally.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let target_arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if target_os != "none" {
        return;
    }
    let script = match target_arch.as_str() {
        "riscv32" | "riscv64" => "link-riscv-virt.x",
        // src/main.rs refuses other bare-metal targets with a compile error that says why.
        _ => return,
    };
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let script = manifest_dir.join(script);
    println!("cargo::rerun-if-changed={}", script.display());
    println!("cargo::rustc-link-arg-bins=-T{}", script.display());
}
