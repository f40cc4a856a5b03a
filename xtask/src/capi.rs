//! `cargo xtask capi`: the C API's header, and installing the library for C programs.
//!
//! - `cargo xtask capi header` regenerates `host-lib/include/nicbar/gm.h` from the C API's crate
//!   (`host-lib/capi`) with cbindgen (configured by `host-lib/capi/cbindgen.toml`); `--check`
//!   instead fails if
//!   the checked-in header differs from what the Rust code generates (CI runs the same check as
//!   a test of this crate).
//! - `cargo xtask capi install --prefix DIR` builds `libnicbar.so`, `libnicbar.a` and `nicctl`,
//!   and installs them with the header and a `nicbar.pc` (from `host-lib/nicbar.pc.in`) under
//!   `DIR`: `lib/`, `include/nicbar/`, `lib/pkgconfig/`, `bin/`; and ARMCI's `libarmci`, `armci.h`,
//!   `armci.pc` and launcher beside them (`capi/armci.rs`).

mod armci;

use std::path::{Path, PathBuf};

use clap::{Args as ClapArgs, Subcommand};

use crate::command::{cargo, run};
use crate::{Result, target_dir, workspace_root};

/// The header, relative to the workspace root.
const HEADER: &str = "host-lib/include/nicbar/gm.h";
/// The C API's source, relative to the workspace root (its crate root).
const SOURCE: &str = "host-lib/capi/src/lib.rs";
/// cbindgen's configuration, relative to the workspace root.
const CONFIG: &str = "host-lib/capi/cbindgen.toml";
/// The C API's package.
const PACKAGE: &str = "nicbar-capi";
/// The pkg-config template, relative to the workspace root.
const PC_TEMPLATE: &str = "host-lib/nicbar.pc.in";
/// The profile `install` builds with by default: release, but with unwinding (so that the C
/// API's panic boundary works; the workspace's release profile aborts on panic) and thin LTO.
const INSTALL_PROFILE: &str = "capi";
/// Libraries a static link of `libnicbar.a` needs besides it (what rustc reports as
/// `native-static-libs` for the Rust standard library on Linux).
const LIBS_PRIVATE: &str = "-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc";

/// Options of `cargo xtask capi`.
#[derive(ClapArgs)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Regenerate host-lib/include/nicbar/gm.h from the Rust code, or check that it is current.
    Header {
        /// Do not write: fail if the checked-in header differs from the generated one.
        #[arg(long)]
        check: bool,
    },
    /// Build the C libraries (libnicbar, libarmci), nicctl and nicbar-armci-run, and install them
    /// with the headers, nicbar.pc and armci.pc.
    Install {
        /// Where to install: DIR/lib, DIR/include/nicbar, DIR/lib/pkgconfig, DIR/bin.
        #[arg(long)]
        prefix: PathBuf,
        /// The cargo profile to build with ("capi": optimised, unwinding; "dev" to reuse a
        /// debug build).
        #[arg(long, default_value = INSTALL_PROFILE)]
        profile: String,
    },
}

/// Runs `cargo xtask capi`.
pub(crate) fn run_capi(args: Args) -> Result<()> {
    let root = workspace_root();
    match args.command {
        Command::Header { check: false } => {
            let header = generate(&root.join(SOURCE), &root.join(CONFIG))?;
            write_if_changed(&root.join(HEADER), &header)
        }
        Command::Header { check: true } => {
            let header = generate(&root.join(SOURCE), &root.join(CONFIG))?;
            check(&header, &root.join(HEADER))?;
            println!("{HEADER} is up to date");
            Ok(())
        }
        Command::Install { prefix, profile } => install(&root, &prefix, &profile),
    }
}

/// The header cbindgen generates from the crate whose root is `source`, with `config`.
pub(crate) fn generate(source: &Path, config: &Path) -> Result<String> {
    let config = cbindgen::Config::from_file(config)
        .map_err(|error| format!("reading {}: {error}", config.display()))?;
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(source)
        .generate()
        .map_err(|error| format!("generating the header from {}: {error}", source.display()))?;
    let mut bytes = Vec::new();
    bindings.write(&mut bytes);
    Ok(String::from_utf8(bytes)?)
}

/// Fails, naming the first line that differs, unless the file at `header` is `generated`.
pub(crate) fn check(generated: &str, header: &Path) -> Result<()> {
    let current = std::fs::read_to_string(header)
        .map_err(|error| format!("reading {}: {error}", header.display()))?;
    if current == generated {
        return Ok(());
    }
    let line = current
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| current.lines().count().min(generated.lines().count()));
    let shown = |text: &str| text.lines().nth(line).unwrap_or("<end of file>").to_owned();
    Err(format!(
        "{} is out of date with the Rust exports (first difference at line {}: the file has \
         `{}`, the code generates `{}`); run `cargo xtask capi header` and commit the result",
        header.display(),
        line + 1,
        shown(&current),
        shown(generated)
    )
    .into())
}

fn write_if_changed(path: &Path, contents: &str) -> Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|current| current == contents) {
        println!("{} is up to date", path.display());
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, contents)
        .map_err(|error| format!("writing {}: {error}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The pkg-config file for an installation under `prefix`.
pub(crate) fn pkg_config_file(template: &str, prefix: &Path) -> Result<String> {
    let prefix = prefix
        .to_str()
        .ok_or_else(|| format!("the prefix {} is not UTF-8", prefix.display()))?;
    let filled = template
        .replace("@PREFIX@", prefix)
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"))
        .replace("@LIBS_PRIVATE@", LIBS_PRIVATE);
    if let Some(start) = filled.find('@')
        && filled[start + 1..].contains('@')
    {
        return Err(format!("{PC_TEMPLATE} has a placeholder this task does not fill").into());
    }
    Ok(filled)
}

fn install(root: &Path, prefix: &Path, profile: &str) -> Result<()> {
    let header = generate(&root.join(SOURCE), &root.join(CONFIG))?;
    check(&header, &root.join(HEADER))?;
    let prefix = if prefix.is_absolute() {
        prefix.to_owned()
    } else {
        std::env::current_dir()?.join(prefix)
    };
    let mut build = cargo();
    build
        .current_dir(root)
        .args(["build", "--profile", profile]);
    if profile == INSTALL_PROFILE {
        for setting in [
            "profile.capi.inherits=\"release\"",
            "profile.capi.panic=\"unwind\"",
            "profile.capi.lto=\"thin\"",
            "profile.capi.codegen-units=16",
            "profile.capi.opt-level=3",
        ] {
            build.args(["--config", setting]);
        }
    }
    build.args([
        "-p",
        PACKAGE,
        "--lib",
        "-p",
        "host-driver",
        "--bin",
        "nicctl",
    ]);
    armci::add_to_build(&mut build);
    run(&mut build)?;
    let built = target_dir().join(match profile {
        "dev" | "test" => "debug",
        "release" | "bench" => "release",
        other => other,
    });
    let lib = prefix.join("lib");
    let include = prefix.join("include").join("nicbar");
    let pkgconfig = lib.join("pkgconfig");
    let bin = prefix.join("bin");
    for dir in [&lib, &include, &pkgconfig, &bin] {
        std::fs::create_dir_all(dir)
            .map_err(|error| format!("creating {}: {error}", dir.display()))?;
    }
    for (from, to) in [
        (built.join("libnicbar.so"), lib.join("libnicbar.so")),
        (built.join("libnicbar.a"), lib.join("libnicbar.a")),
        (built.join("nicctl"), bin.join("nicctl")),
        (root.join(HEADER), include.join("gm.h")),
    ] {
        copy(&from, &to)?;
    }
    let template = std::fs::read_to_string(root.join(PC_TEMPLATE))
        .map_err(|error| format!("reading {PC_TEMPLATE}: {error}"))?;
    let pc = pkgconfig.join("nicbar.pc");
    std::fs::write(&pc, pkg_config_file(&template, &prefix)?)
        .map_err(|error| format!("writing {}: {error}", pc.display()))?;
    println!("installed {}", pc.display());
    println!(
        "compile with: cc prog.c $(PKG_CONFIG_PATH={} pkg-config --cflags --libs nicbar)",
        pkgconfig.display()
    );
    armci::install(root, &built, &prefix)
}

/// Copies `from` to `to` through a temporary file and a rename, so that a running program
/// mapping the old file keeps it.
fn copy(from: &Path, to: &Path) -> Result<()> {
    let partial = to.with_extension("partial");
    std::fs::copy(from, &partial)
        .map_err(|error| format!("copying {} to {}: {error}", from.display(), to.display()))?;
    std::fs::rename(&partial, to)
        .map_err(|error| format!("moving {} into place: {error}", to.display()))?;
    println!("installed {}", to.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory under the target directory, emptied first.
    fn scratch(name: &str) -> PathBuf {
        let dir = target_dir()
            .join("xtask-tests")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Copies the tree `from` into `into`.
    fn copy_tree(from: &Path, into: &Path) {
        std::fs::create_dir_all(into).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            let to = into.join(path.file_name().unwrap());
            if path.is_dir() {
                copy_tree(&path, &to);
            } else {
                std::fs::copy(&path, &to).unwrap();
            }
        }
    }

    fn copy_source(into: &Path) {
        let source = workspace_root().join(SOURCE);
        copy_tree(source.parent().unwrap(), into);
    }

    #[test]
    fn the_checked_in_header_is_what_the_exports_generate() {
        let root = workspace_root();
        let header = generate(&root.join(SOURCE), &root.join(CONFIG)).unwrap();
        if let Err(error) = check(&header, &root.join(HEADER)) {
            panic!("{error}");
        }
        for name in [
            "gm_open",
            "gm_send_with_callback",
            "gm_provide_receive_buffer_with_tag",
            "gm_unknown",
            "gm_barrier_send_with_callback",
            "nicbar_barrier",
            "union gm_recv_event",
            "#define GM_SEND_TARGET_PORT_CLOSED 17",
        ] {
            assert!(header.contains(name), "the header lacks {name}");
        }
    }

    #[test]
    fn a_changed_export_is_drift() {
        let root = workspace_root();
        let dir = scratch("capi-drift");
        copy_source(&dir);
        let port = dir.join("ffi").join("port.rs");
        let original = std::fs::read_to_string(&port).unwrap();
        // A new export the header does not have.
        std::fs::write(
            &port,
            format!(
                "{original}\n/// A probe.\n#[unsafe(no_mangle)]\npub extern \"C\" fn \
                 gm_drift_probe() -> u32 {{ 0 }}\n"
            ),
        )
        .unwrap();
        let header = generate(&dir.join("lib.rs"), &root.join(CONFIG)).unwrap();
        assert!(header.contains("gm_drift_probe"));
        let error = check(&header, &root.join(HEADER)).unwrap_err().to_string();
        assert!(error.contains("cargo xtask capi header"), "{error}");
        // A changed signature: gm_mtu's return type.
        let changed = original.replace(
            "pub unsafe extern \"C\" fn gm_mtu(port: *mut gm_port) -> c_uint {",
            "pub unsafe extern \"C\" fn gm_mtu(port: *mut gm_port) -> u64 {",
        );
        assert_ne!(
            changed, original,
            "gm_mtu's signature moved: update this test"
        );
        std::fs::write(&port, changed).unwrap();
        let header = generate(&dir.join("lib.rs"), &root.join(CONFIG)).unwrap();
        assert!(check(&header, &root.join(HEADER)).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_pkg_config_file_names_the_prefix_and_fills_every_placeholder() {
        let template = std::fs::read_to_string(workspace_root().join(PC_TEMPLATE)).unwrap();
        let pc = pkg_config_file(&template, Path::new("/opt/nicbar")).unwrap();
        assert!(pc.contains("prefix=/opt/nicbar"), "{pc}");
        assert!(pc.contains("-lnicbar"), "{pc}");
        assert!(!pc.contains('@'), "{pc}");
        assert!(pkg_config_file("prefix=@PREFIX@ @UNKNOWN@", Path::new("/x")).is_err());
    }
}
