//! Builds the C part of libnicbar (`src/c/containers.c`: gm_printf, gm_eprintf and GM's
//! containers) against the checked-in header, into the same library.

fn main() {
    println!("cargo:rerun-if-changed=src/c/containers.c");
    println!("cargo:rerun-if-changed=../include/nicbar/gm.h");
    cc::Build::new()
        .file("src/c/containers.c")
        .include("../include")
        .flag_if_supported("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("nicbar_c");
    // The C functions are not Rust exports, so rustc's own list of the cdylib's exports leaves
    // them out: this list adds them, and keeps them in the link.
    let map = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default())
        .join("src/c/exports.map");
    println!("cargo:rerun-if-changed=src/c/exports.map");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,--whole-archive");
    println!("cargo:rustc-cdylib-link-arg=-lnicbar_c");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-whole-archive");
}
