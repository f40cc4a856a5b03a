//! `nicctl image info` and `nicctl flash`, run as the real binary on real files.
//!
//! Every image is built here with the `shared_abi::image` builder, so nothing depends on a
//! checked-in binary or an earlier build step.

use std::path::{Path, PathBuf};
use std::process::Command;

use nicbar_image::flash::FlashDevice;
use shared_abi::ABI_VERSION;
use shared_abi::image::{HEADER_LEN, ImageHeader, ImageTarget, crc32};
use zerocopy::little_endian::U32;

const RISCV: &str = "riscv32imac-unknown-none-elf";
const PAYLOAD_LEN: usize = 10_000;
const LOAD_ADDRESS: u64 = 0x8000_0000;

/// What a run of `nicctl` left behind.
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn nicctl(args: &[&str]) -> Outcome {
    let output = Command::new(env!("CARGO_BIN_EXE_nicctl"))
        .args(args)
        .output()
        .expect("nicctl runs");
    Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

/// Bytes that look like nothing in particular, the same on every run.
fn payload(len: usize, seed: u32) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect()
}

/// An image whose header `edit` changed after building; the header CRC is recomputed, so the
/// image is refused only for what `edit` did.
fn image_with(target: ImageTarget, edit: impl FnOnce(&mut ImageHeader)) -> Vec<u8> {
    let payload = payload(PAYLOAD_LEN, 7);
    let mut header = ImageHeader::new(target, LOAD_ADDRESS, LOAD_ADDRESS + 0x40, &payload)
        .expect("a valid header");
    edit(&mut header);
    header.seal();
    let mut bytes = header.to_bytes().to_vec();
    bytes.extend_from_slice(&payload);
    bytes
}

fn good_image() -> Vec<u8> {
    image_with(ImageTarget::RISCV32IMAC, |_| {})
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("temporary file written");
    path
}

/// An emulated flash device of `len` bytes holding a recognisable pattern, as "previous
/// contents" to compare against.
fn device(dir: &Path, len: usize) -> (PathBuf, Vec<u8>) {
    let contents = payload(len, 99);
    (write(dir, "flash.bin", &contents), contents)
}

#[test]
fn a_good_image_flashes_and_reads_back_identical() {
    let dir = tempfile::tempdir().unwrap();
    let image = good_image();
    let image_path = write(dir.path(), "good.img", &image);
    let (device_path, before) = device(dir.path(), 64 * 1024);

    let info = nicctl(&["image", "info", path_str(&image_path)]);
    assert_eq!(info.code, Some(0), "{}", info.stderr);
    assert!(
        info.stdout
            .contains("target    riscv32imac-unknown-none-elf")
    );
    assert!(info.stdout.contains("load      0x80000000"));
    assert!(info.stdout.contains("entry     0x80000040"));
    assert!(info.stdout.contains(&format!(
        "payload   {PAYLOAD_LEN} bytes, CRC-32 {:#010x}",
        crc32(&image[HEADER_LEN..])
    )));

    let json = nicctl(&["image", "info", "--json", path_str(&image_path)]);
    assert_eq!(json.code, Some(0), "{}", json.stderr);
    assert!(json.stdout.starts_with('{') && json.stdout.trim_end().ends_with('}'));
    assert!(json.stdout.contains("\"valid\":true"));
    assert!(
        json.stdout
            .contains(&format!("\"abi_version\":{ABI_VERSION}"))
    );
    assert!(
        json.stdout
            .contains("\"target\":\"riscv32imac-unknown-none-elf\"")
    );
    assert!(json.stdout.contains("\"load_address\":\"0x80000000\""));

    let flash = nicctl(&[
        "flash",
        "--image",
        path_str(&image_path),
        "--device",
        path_str(&device_path),
    ]);
    assert_eq!(flash.code, Some(0), "{}", flash.stderr);
    assert!(flash.stdout.contains(&format!(
        "flashed {} bytes to {} at offset 0 and read them back identical: image CRC-32 {:#010x}",
        image.len(),
        device_path.display(),
        crc32(&image)
    )));
    // Not a terminal: plain progress lines, ending at 100%.
    let total = image.len();
    assert!(
        flash
            .stdout
            .contains(&format!("written {total}/{total} bytes (100%)"))
    );
    assert!(
        flash
            .stdout
            .contains(&format!("verified {total}/{total} bytes (100%)"))
    );

    let after = std::fs::read(&device_path).unwrap();
    assert_eq!(after.len(), before.len(), "the device keeps its size");
    assert_eq!(
        &after[..image.len()],
        &image[..],
        "the slot holds the image"
    );
    assert_eq!(
        &after[image.len()..],
        &before[image.len()..],
        "bytes after the slot are left alone"
    );
    let on_device = FlashDevice::open(&device_path)
        .unwrap()
        .read_image()
        .unwrap();
    assert_eq!(on_device.bytes(), &image[..]);
}

#[test]
fn a_64_bit_image_is_named_by_info_and_flashes_only_onto_a_64_bit_device() {
    let dir = tempfile::tempdir().unwrap();
    let image = image_with(ImageTarget::RISCV64IMAC, |_| {});
    let image_path = write(dir.path(), "rv64.img", &image);
    let (device_path, before) = device(dir.path(), 64 * 1024);

    let info = nicctl(&["image", "info", path_str(&image_path)]);
    assert_eq!(info.code, Some(0), "{}", info.stderr);
    assert!(
        info.stdout
            .contains("target    riscv64imac-unknown-none-elf"),
        "{}",
        info.stdout
    );
    let json = nicctl(&["image", "info", "--json", path_str(&image_path)]);
    assert!(
        json.stdout
            .contains("\"target\":\"riscv64imac-unknown-none-elf\""),
        "{}",
        json.stdout
    );

    // The device's target defaults to riscv32imac: a 64-bit image is refused, the device kept.
    let refused = nicctl(&[
        "flash",
        "--image",
        path_str(&image_path),
        "--device",
        path_str(&device_path),
    ]);
    assert_ne!(refused.code, Some(0));
    assert!(
        refused.stderr.contains("riscv64imac-unknown-none-elf"),
        "{}",
        refused.stderr
    );
    assert_eq!(std::fs::read(&device_path).unwrap(), before);

    let flash = nicctl(&[
        "flash",
        "--image",
        path_str(&image_path),
        "--device",
        path_str(&device_path),
        "--target",
        "riscv64imac-unknown-none-elf",
    ]);
    assert_eq!(flash.code, Some(0), "{}", flash.stderr);
    let flashed = std::fs::read(&device_path).unwrap();
    assert_eq!(&flashed[..image.len()], &image[..]);
}

#[test]
fn bad_images_are_refused_by_info_and_flash_and_the_device_is_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let good = good_image();
    let payload_crc = crc32(&good[HEADER_LEN..]);

    let mut payload_flipped = good.clone();
    payload_flipped[HEADER_LEN + 1234] ^= 0x10;
    let flipped_crc = crc32(&payload_flipped[HEADER_LEN..]);

    let mut header_flipped = good.clone();
    header_flipped[24] ^= 0x01; // the load address

    let truncated = good[..HEADER_LEN + 1200].to_vec();

    let mut trailing = good.clone();
    trailing.extend_from_slice(b"junk");

    let thumb = image_with(ImageTarget::THUMBV7EM, |_| {});
    let other_abi = image_with(ImageTarget::RISCV32IMAC, |header| {
        header.abi_version = U32::new(ABI_VERSION + 1);
    });
    let unknown_target = image_with(ImageTarget::RISCV32IMAC, |header| {
        header.target = ImageTarget::new(0x42);
    });

    let cases: Vec<(&str, Vec<u8>, String)> = vec![
        (
            "payload-flipped.img",
            payload_flipped,
            format!(
                "image payload corrupt: header says CRC-32 {payload_crc:#010x}, payload gives \
                 {flipped_crc:#010x}"
            ),
        ),
        (
            "header-flipped.img",
            header_flipped,
            "image header corrupt: header CRC-32 is".into(),
        ),
        (
            "truncated.img",
            truncated,
            format!("image truncated: header says {PAYLOAD_LEN} payload bytes, file has 1200"),
        ),
        (
            "trailing.img",
            trailing,
            format!(
                "trailing bytes after image: header says {PAYLOAD_LEN} payload bytes, file has {}",
                PAYLOAD_LEN + 4
            ),
        ),
        (
            "thumb.img",
            thumb,
            "image is for thumbv7em-none-eabihf, this device is riscv32imac-unknown-none-elf"
                .into(),
        ),
        (
            "other-abi.img",
            other_abi,
            format!(
                "image is built for ABI version {}, this side speaks ABI version {ABI_VERSION}",
                ABI_VERSION + 1
            ),
        ),
        (
            "unknown-target.img",
            unknown_target,
            "image is for unknown target 0x42".into(),
        ),
        (
            "not-an-image.img",
            b"#!/bin/sh\necho this is not firmware\n".repeat(4),
            "not a nicbar image: magic is \"#!/bin/s\", expected \"NICBARFW\"".into(),
        ),
    ];

    let (device_path, before) = device(dir.path(), 64 * 1024);
    for (name, bytes, message) in &cases {
        let image_path = write(dir.path(), name, bytes);
        let expected = format!("{}: {message}", image_path.display());

        let info = nicctl(&["image", "info", "--target", RISCV, path_str(&image_path)]);
        assert_eq!(info.code, Some(1), "{name}: image info accepted it");
        assert!(
            info.stderr.contains(&expected),
            "{name}: image info said {:?}, expected {expected:?}",
            info.stderr
        );
        let json = nicctl(&[
            "image",
            "info",
            "--json",
            "--target",
            RISCV,
            path_str(&image_path),
        ]);
        assert_eq!(json.code, Some(1), "{name}: image info --json accepted it");
        assert!(json.stdout.contains("\"valid\":false"), "{name}");

        let flash = nicctl(&[
            "flash",
            "--image",
            path_str(&image_path),
            "--device",
            path_str(&device_path),
        ]);
        assert_eq!(flash.code, Some(1), "{name}: flash accepted it");
        assert!(
            flash.stderr.contains(&expected),
            "{name}: flash said {:?}, expected {expected:?}",
            flash.stderr
        );
        assert!(flash.stderr.contains("was not touched"), "{name}");
        assert!(
            std::fs::read(&device_path).unwrap() == before,
            "{name}: the device changed"
        );
    }

    // Without --target, `image info` accepts an image for any known target, and only that.
    let thumb_path = dir.path().join("thumb.img");
    assert_eq!(
        nicctl(&["image", "info", path_str(&thumb_path)]).code,
        Some(0)
    );
    let unknown_path = dir.path().join("unknown-target.img");
    assert_eq!(
        nicctl(&["image", "info", path_str(&unknown_path)]).code,
        Some(1)
    );
}

#[test]
fn a_device_smaller_than_the_image_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let image = good_image();
    let image_path = write(dir.path(), "good.img", &image);
    let (device_path, before) = device(dir.path(), 4096);

    let flash = nicctl(&[
        "flash",
        "--image",
        path_str(&image_path),
        "--device",
        path_str(&device_path),
    ]);
    assert_eq!(flash.code, Some(1));
    assert!(flash.stderr.contains(&format!(
        "flash device {} is 4096 bytes, the image needs {}; nothing was written",
        device_path.display(),
        image.len()
    )));
    assert_eq!(std::fs::read(&device_path).unwrap(), before);
}

#[test]
fn a_missing_device_is_created_only_with_create() {
    let dir = tempfile::tempdir().unwrap();
    let image = good_image();
    let image_path = write(dir.path(), "good.img", &image);
    let device_path = dir.path().join("new-flash.bin");
    let flash_to_new = |extra: &[&str]| {
        let mut args = vec![
            "flash",
            "--image",
            path_str(&image_path),
            "--device",
            path_str(&device_path),
        ];
        args.extend_from_slice(extra);
        nicctl(&args)
    };

    let refused = flash_to_new(&[]);
    assert_eq!(refused.code, Some(1));
    assert!(refused.stderr.contains(&format!(
        "flash device {} does not exist; pass --create",
        device_path.display()
    )));
    assert!(!device_path.exists());

    let too_small = flash_to_new(&["--create", "--size", "4K"]);
    assert_eq!(too_small.code, Some(1));
    assert!(too_small.stderr.contains(&format!(
        "--size 4096 is smaller than the image ({} bytes); nothing was created",
        image.len()
    )));
    assert!(!device_path.exists());

    let bad_image_path = write(dir.path(), "truncated.img", &image[..100]);
    let bad = nicctl(&[
        "flash",
        "--image",
        path_str(&bad_image_path),
        "--device",
        path_str(&device_path),
        "--create",
    ]);
    assert_eq!(bad.code, Some(1));
    assert!(!device_path.exists(), "a refused image creates no device");

    let created = flash_to_new(&["--create", "--size", "64K"]);
    assert_eq!(created.code, Some(0), "{}", created.stderr);
    let contents = std::fs::read(&device_path).unwrap();
    assert_eq!(contents.len(), 64 * 1024);
    assert_eq!(&contents[..image.len()], &image[..]);
    assert!(
        contents[image.len()..].iter().all(|&byte| byte == 0xff),
        "the rest of a new device is erased flash"
    );
}

#[test]
fn reflashing_a_smaller_image_leaves_a_slot_that_reads_as_the_new_image() {
    let dir = tempfile::tempdir().unwrap();
    let big = good_image();
    let small_payload = payload(300, 3);
    let small_header = ImageHeader::new(
        ImageTarget::RISCV32IMAC,
        LOAD_ADDRESS,
        LOAD_ADDRESS,
        &small_payload,
    )
    .unwrap();
    let mut small = small_header.to_bytes().to_vec();
    small.extend_from_slice(&small_payload);
    let (device_path, _) = device(dir.path(), 32 * 1024);

    for (name, image) in [("big.img", &big), ("small.img", &small)] {
        let image_path = write(dir.path(), name, image);
        let flash = nicctl(&[
            "flash",
            "--image",
            path_str(&image_path),
            "--device",
            path_str(&device_path),
        ]);
        assert_eq!(flash.code, Some(0), "{name}: {}", flash.stderr);
    }
    let on_device = FlashDevice::open(&device_path)
        .unwrap()
        .read_image()
        .unwrap();
    assert_eq!(on_device.bytes(), &small[..]);
    assert_eq!(on_device.header(), &small_header);
}

#[test]
fn devices_that_are_not_flash_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let image_path = write(dir.path(), "good.img", &good_image());

    let character = nicctl(&[
        "flash",
        "--image",
        path_str(&image_path),
        "--device",
        "/dev/null",
    ]);
    assert_eq!(character.code, Some(1));
    assert!(
        character
            .stderr
            .contains("cannot flash /dev/null: it is a character device")
    );

    let directory = nicctl(&[
        "flash",
        "--image",
        path_str(&image_path),
        "--device",
        path_str(dir.path()),
    ]);
    assert_eq!(directory.code, Some(1));
    assert!(directory.stderr.contains("it is a directory"));
}

#[test]
fn an_erased_device_holds_no_image() {
    let dir = tempfile::tempdir().unwrap();
    let device_path = write(dir.path(), "erased.bin", &[0xff; 4096]);
    let error = FlashDevice::open(&device_path)
        .unwrap()
        .read_image()
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("holds no valid image: not a nicbar image"),
        "{error}"
    );
}

#[test]
fn help_explains_every_subcommand() {
    let top = nicctl(&["--help"]);
    assert_eq!(top.code, Some(0));
    assert!(top.stdout.contains("image") && top.stdout.contains("flash"));

    let flash = nicctl(&["flash", "--help"]);
    assert_eq!(flash.code, Some(0));
    for needle in [
        "--image <FILE>",
        "--device <DEVICE>",
        "--target <TRIPLE>",
        "--create",
        "offset 0",
    ] {
        assert!(
            flash.stdout.contains(needle),
            "flash --help lacks {needle:?}"
        );
    }

    let info = nicctl(&["image", "info", "--help"]);
    assert_eq!(info.code, Some(0));
    assert!(info.stdout.contains("--json") && info.stdout.contains("ABI version"));

    let usage = nicctl(&["flash", "--image", "x.img"]);
    assert_eq!(usage.code, Some(2), "a usage error exits with 2");
}
