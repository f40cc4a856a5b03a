//! The ARMCI part of `cargo xtask capi install`: `libarmci.so` and `libarmci.a` (package
//! `nicbar-armci`), its header `armci.h`, its launcher `nicbar-armci-run` and an `armci.pc`,
//! installed beside libnicbar's: `DIR/lib`, `DIR/include/armci.h`, `DIR/lib/pkgconfig`,
//! `DIR/bin`. A program then builds with `cc prog.c $(pkg-config --cflags --libs armci)`.

use std::path::Path;

use super::{copy, pkg_config_file};
use crate::Result;

/// The ARMCI package.
const PACKAGE: &str = "nicbar-armci";
/// Its launcher.
const LAUNCHER: &str = "nicbar-armci-run";
/// Its header, relative to the workspace root.
const HEADER: &str = "host-lib/armci/include/armci.h";
/// Its pkg-config template, relative to the workspace root.
const PC_TEMPLATE: &str = "host-lib/armci/armci.pc.in";

/// Adds the ARMCI library and its launcher to the install's `cargo build` (whose target
/// selection, `--lib` and `--bin`, applies to every package named).
pub(super) fn add_to_build(build: &mut std::process::Command) {
    build.args(["-p", PACKAGE, "--bin", LAUNCHER]);
}

/// Installs what [`add_to_build`] built into `built` under `prefix`.
pub(super) fn install(root: &Path, built: &Path, prefix: &Path) -> Result<()> {
    let lib = prefix.join("lib");
    let include = prefix.join("include");
    let pkgconfig = lib.join("pkgconfig");
    let bin = prefix.join("bin");
    for dir in [&lib, &include, &pkgconfig, &bin] {
        std::fs::create_dir_all(dir)
            .map_err(|error| format!("creating {}: {error}", dir.display()))?;
    }
    for (from, to) in [
        (built.join("libarmci.so"), lib.join("libarmci.so")),
        (built.join("libarmci.a"), lib.join("libarmci.a")),
        (built.join(LAUNCHER), bin.join(LAUNCHER)),
        (root.join(HEADER), include.join("armci.h")),
    ] {
        copy(&from, &to)?;
    }
    let template = std::fs::read_to_string(root.join(PC_TEMPLATE))
        .map_err(|error| format!("reading {PC_TEMPLATE}: {error}"))?;
    let pc = pkgconfig.join("armci.pc");
    std::fs::write(&pc, pkg_config_file(&template, prefix)?)
        .map_err(|error| format!("writing {}: {error}", pc.display()))?;
    println!("installed {}", pc.display());
    println!(
        "compile ARMCI programs with: cc prog.c $(PKG_CONFIG_PATH={} pkg-config --cflags --libs armci)",
        pkgconfig.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use crate::{target_dir, workspace_root};

    #[test]
    fn the_armci_pkg_config_file_names_the_prefix_and_the_library() {
        let template = std::fs::read_to_string(workspace_root().join(PC_TEMPLATE)).unwrap();
        let pc = pkg_config_file(&template, Path::new("/opt/nicbar")).unwrap();
        assert!(pc.contains("prefix=/opt/nicbar"), "{pc}");
        assert!(pc.contains("-larmci"), "{pc}");
        assert!(!pc.contains('@'), "{pc}");
    }

    /// Installs a debug build into a scratch prefix (cargo reuses what is built), then
    /// compiles and links an ARMCI program through pkg-config alone, and runs it: with no
    /// launcher around it, ARMCI_Init fails and the program ends through ARMCI_Error — which
    /// only the installed library found through its run-time path can print.
    #[test]
    fn a_c_program_links_against_the_installed_libarmci_through_pkg_config() {
        if Command::new("pkg-config")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("pkg-config is not installed: this test checks nothing here");
            return;
        }
        let root = workspace_root();
        let prefix = target_dir()
            .join("xtask-tests")
            .join(format!("armci-install-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&prefix);
        super::super::install(&root, &prefix, "dev").unwrap();
        for file in [
            "lib/libarmci.so",
            "lib/libarmci.a",
            "lib/libnicbar.so",
            "include/armci.h",
            "include/nicbar/gm.h",
            "lib/pkgconfig/armci.pc",
            "lib/pkgconfig/nicbar.pc",
            "bin/nicbar-armci-run",
        ] {
            assert!(prefix.join(file).exists(), "{file} is not installed");
        }
        let flags = Command::new("pkg-config")
            .args(["--cflags", "--libs", "armci"])
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
            .output()
            .unwrap();
        assert!(flags.status.success(), "pkg-config: {flags:?}");
        let flags = String::from_utf8(flags.stdout).unwrap();
        let program = prefix.join("armci_api");
        let compiled = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
            .args(["-std=c11", "-Wall", "-Werror"])
            .arg(root.join("host-lib/armci/c/armci_api.c"))
            .arg("-o")
            .arg(&program)
            .args(flags.split_whitespace())
            .status()
            .unwrap();
        assert!(compiled.success(), "the program does not build: {flags}");
        let ran = Command::new(&program)
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("NICBAR_ARMCI_RANK")
            .env_remove("OMPI_COMM_WORLD_RANK")
            .env_remove("PMI_RANK")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&ran.stdout);
        assert!(!ran.status.success(), "{said}");
        assert!(
            said.contains("ARMCI could not start: no rank and size"),
            "{said}"
        );
        let _ = std::fs::remove_dir_all(&prefix);
    }
}
