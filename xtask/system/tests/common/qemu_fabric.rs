//! The QEMU NICs' tests share how they start: whether QEMU runs here, the firmware image, and
//! a fabric of QEMU NICs.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use nicbar_image::image::ImageFile;
use nicbar_qemu::{QemuConfig, QemuFabric};
use shared_abi::image::ImageTarget;

/// The QEMU the NICs run in.
pub(crate) const QEMU: &str = "qemu-system-riscv32";

/// Whether QEMU runs here; says why the test is skipped if not.
pub(crate) fn qemu_or_skip(test: &str) -> bool {
    let runs = Command::new(QEMU)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !runs {
        eprintln!(
            "{test}: skipped: {QEMU} is not installed (cargo xtask qemu installs it from \
             bookworm-backports)"
        );
    }
    runs
}

/// The firmware image, built once per test run by `cargo xtask image` (as CI builds it).
pub(crate) fn image_path() -> &'static PathBuf {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let output = Command::new(env!("CARGO"))
            .args(["run", "--quiet", "--package", "xtask", "--", "image"])
            .current_dir(&root)
            .output()
            .expect("running cargo xtask image");
        assert!(
            output.status.success(),
            "cargo xtask image failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| root.join("target"), |dir| root.join(dir));
        target.join("nicbar-riscv32imac-unknown-none-elf.img")
    })
}

/// A fabric of `nodes` QEMU NICs, its control socket in `dir`.
pub(crate) fn fabric(dir: &tempfile::TempDir, nodes: u16) -> QemuFabric {
    let image = ImageFile::read_for_target(image_path(), ImageTarget::RISCV32IMAC)
        .expect("the image built by cargo xtask image verifies");
    let mut config = QemuConfig::new(dir.path().join("control.sock"), image, nodes);
    config.echo_console = false;
    QemuFabric::spawn(config).expect("the QEMU NICs boot")
}
