//! The QEMU NICs' tests share how they start: whether QEMU runs here, the firmware image, and
//! a fabric of QEMU NICs; and how they pass a message and check it.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use nicbar::{Event, Port, Priority, Status};
use nicbar_image::image::ImageFile;
use nicbar_qemu::{QemuConfig, QemuFabric};
use shared_abi::image::ImageTarget;

/// Size class of the test messages: buffers of 256 bytes.
pub(crate) const SIZE: u8 = 8;
/// How long one step may take.
pub(crate) const STEP: Duration = Duration::from_secs(20);

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

/// Provides `count` receive buffers of the [`SIZE`] class to `port`.
pub(crate) fn provide(port: &mut Port, count: u32) {
    for tag in 0..count {
        let buffer = port.dma_alloc(256).unwrap();
        port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
            .map_err(|refused| refused.error)
            .unwrap();
    }
}

/// Sends `payload` from `from` to `to` and checks that it arrives whole, and that the send
/// completes.
pub(crate) fn send_and_check(from: &mut Port, to: &mut Port, payload: &[u8]) {
    let mut buffer = from.dma_alloc(256).unwrap();
    buffer[..payload.len()].copy_from_slice(payload);
    from.send(
        buffer,
        payload.len(),
        SIZE,
        Priority::LOW,
        to.node_id(),
        to.port_id(),
        7,
    )
    .map_err(|refused| refused.error)
    .unwrap();
    match to.receive_timeout(STEP).unwrap() {
        Some(Event::Received {
            buffer,
            length,
            sender_node,
            status,
            ..
        }) => {
            assert_eq!(status, Status::SUCCESS);
            assert_eq!(sender_node, from.node_id());
            assert_eq!(&buffer[..length], payload);
        }
        other => panic!("expected the message within {STEP:?}, got {other:?}"),
    }
    match from.receive_timeout(STEP).unwrap() {
        Some(Event::Sent {
            status, context, ..
        }) => assert_eq!((status, context), (Status::SUCCESS, 7)),
        other => panic!("expected SENT within {STEP:?}, got {other:?}"),
    }
}
