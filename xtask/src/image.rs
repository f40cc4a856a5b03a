//! `cargo xtask image`: build the `board` firmware for a target in release, flatten the ELF's
//! loadable segments into one memory image, put a [`shared_abi::image`] header in front, and
//! write it; or check an image that exists.

use std::path::{Path, PathBuf};

use nicbar_image::image::header_summary;
use object::elf::{EM_ARM, EM_RISCV, PT_LOAD};
use object::read::elf::{ElfFile, ElfFile32, ElfFile64, FileHeader, ProgramHeader};
use object::{Endianness, Object, ObjectSection};
use shared_abi::image::{self, HEADER_LEN, ImageHeader, ImageTarget};

use crate::{Result, command, target_dir, workspace_root};

/// The largest span of memory an image may cover. A linker script mistake (a section left at
/// address 0 beside RAM at 0x8000_0000) would otherwise make a 2 GiB file of zeros.
const MAX_PAYLOAD: u64 = 16 << 20;

/// The firmware's primary embedded target: what `cargo xtask image` builds by default, `cargo xtask
/// test` builds the firmware for, and `cargo xtask qemu` boots.
pub(crate) const FIRMWARE_TARGET: &str = "riscv32imac-unknown-none-elf";
/// The firmware's 64-bit target (the RISC-V cores of DPUs): built by `cargo xtask test` and
/// booted by `cargo xtask qemu` beside the primary one.
pub(crate) const FIRMWARE_TARGET_64: &str = "riscv64imac-unknown-none-elf";

/// The targets the board crate builds for (QEMU virt, 32- and 64-bit).
pub(crate) const BUILDABLE: [ImageTarget; 2] = [ImageTarget::RISCV32IMAC, ImageTarget::RISCV64IMAC];

/// Arguments of `cargo xtask image`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Target to build for: riscv32imac-unknown-none-elf or riscv64imac-unknown-none-elf.
    #[arg(
        long,
        value_name = "TRIPLE",
        default_value = FIRMWARE_TARGET,
        value_parser = parse_target,
    )]
    target: ImageTarget,

    /// Where to write the image [default: target/nicbar-<TRIPLE>.img].
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,

    /// Verify an existing image instead of building one: header, ABI version, target, length,
    /// CRCs.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["target", "out"])]
    check: Option<PathBuf>,
}

fn parse_target(triple: &str) -> Result<ImageTarget, String> {
    ImageTarget::from_triple(triple).ok_or_else(|| {
        let known: Vec<&str> = ImageTarget::KNOWN.iter().map(|(_, name)| *name).collect();
        format!("no image target {triple:?}; known: {}", known.join(", "))
    })
}

/// Runs `cargo xtask image`.
pub(crate) fn run(args: Args) -> Result<()> {
    match args.check {
        Some(path) => check(&path),
        None => build(args.target, args.out),
    }
}

fn check(path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let (header, _) =
        image::parse(&bytes).map_err(|error| format!("{}: {error}", path.display()))?;
    println!("{}", header_summary(path, &header));
    println!("ok: header, ABI version, target, length and both CRCs check out");
    Ok(())
}

fn build(target: ImageTarget, out: Option<PathBuf>) -> Result<()> {
    let triple = target.triple().unwrap_or("?");
    if !BUILDABLE.contains(&target) {
        return Err(format!(
            "cannot build a {triple} image yet: the board crate has only the riscv32imac and \
             riscv64imac entry, linker script and UART (QEMU virt); the image format and `--check` \
             do accept {triple} images"
        )
        .into());
    }
    command::ensure_rust_target(triple)?;
    // From the workspace root, so that a relative CARGO_TARGET_DIR means what `target_dir`
    // takes it to mean.
    command::run(command::cargo().current_dir(workspace_root()).args([
        "build",
        "--package",
        "board",
        "--release",
        "--target",
        triple,
    ]))?;

    let elf_path = target_dir().join(triple).join("release").join("board");
    let elf =
        std::fs::read(&elf_path).map_err(|error| format!("{}: {error}", elf_path.display()))?;
    let flat = flatten(&elf, target).map_err(|error| format!("{}: {error}", elf_path.display()))?;
    let header = ImageHeader::new(target, flat.load_address, flat.entry_point, &flat.payload)
        .map_err(|error| format!("{}: {error}", elf_path.display()))?;

    let out = out.unwrap_or_else(|| target_dir().join(format!("nicbar-{triple}.img")));
    let mut bytes = Vec::with_capacity(HEADER_LEN + flat.payload.len());
    bytes.extend_from_slice(&header.to_bytes());
    bytes.extend_from_slice(&flat.payload);
    // Whatever was written must read back as a valid image; this catches a bug here, not in the
    // firmware.
    image::parse(&bytes).map_err(|error| format!("built image does not verify: {error}"))?;
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|error| format!("{}: {error}", parent.display()))?;
    }
    std::fs::write(&out, &bytes).map_err(|error| format!("{}: {error}", out.display()))?;

    println!("{}", header_summary(&out, &header));
    println!(
        "sections  .text {} B, .rodata {} B, .data {} B, .bss {} B (stack {} B, not in the image)",
        flat.sections.text,
        flat.sections.rodata,
        flat.sections.data,
        flat.sections.bss,
        flat.sections.stack
    );
    Ok(())
}

/// Sizes of the firmware's sections, in bytes.
#[derive(Debug, Default)]
struct SectionSizes {
    text: u64,
    rodata: u64,
    data: u64,
    bss: u64,
    stack: u64,
}

/// An ELF's loadable contents as one memory image.
#[derive(Debug)]
struct FlatImage {
    load_address: u64,
    entry_point: u64,
    payload: Vec<u8>,
    sections: SectionSizes,
}

/// Lays the file contents of the ELF's `PT_LOAD` segments out at their physical (load) addresses,
/// from the lowest to the end of the highest, zero-filling gaps. Segments with no file contents
/// (`.bss`, the stack) are left out: the entry code zeroes them.
fn flatten(elf_bytes: &[u8], target: ImageTarget) -> Result<FlatImage, String> {
    if target == ImageTarget::RISCV64IMAC {
        let elf = ElfFile64::<'_, Endianness>::parse(elf_bytes).map_err(|error| {
            format!("not a 64-bit ELF file ({error}); a {target} image is built from one")
        })?;
        flatten_elf(&elf, elf_bytes, target)
    } else {
        let elf = ElfFile32::<'_, Endianness>::parse(elf_bytes).map_err(|error| {
            format!("not a 32-bit ELF file ({error}); a {target} image is built from one")
        })?;
        flatten_elf(&elf, elf_bytes, target)
    }
}

/// [`flatten`] for one ELF class.
fn flatten_elf<Elf: FileHeader<Endian = Endianness>>(
    elf: &ElfFile<'_, Elf>,
    elf_bytes: &[u8],
    target: ImageTarget,
) -> Result<FlatImage, String> {
    let endian = elf.endian();
    let machine = elf.elf_header().e_machine(endian);
    let expected_machine = if target == ImageTarget::THUMBV7EM {
        EM_ARM
    } else {
        EM_RISCV
    };
    if machine != expected_machine {
        return Err(format!(
            "ELF machine is {machine:?}, a {target} image needs {expected_machine:?}"
        ));
    }

    let mut segments = Vec::new();
    for program_header in elf.elf_program_headers() {
        if program_header.p_type(endian) != PT_LOAD || program_header.p_filesz(endian).into() == 0 {
            continue;
        }
        let address: u64 = program_header.p_paddr(endian).into();
        let data = program_header
            .data(endian, elf_bytes)
            .map_err(|()| format!("segment at {address:#x} lies outside the file"))?;
        segments.push((address, data));
    }
    segments.sort_by_key(|(address, _)| *address);
    let Some(&(load_address, _)) = segments.first() else {
        return Err("no loadable segment with contents".into());
    };
    let end = segments
        .iter()
        .map(|(address, data)| address + data.len() as u64)
        .max()
        .unwrap_or(load_address);
    let span = end - load_address;
    if span > MAX_PAYLOAD {
        return Err(format!(
            "loadable segments span {span} bytes ({load_address:#x}..{end:#x}), more than the \
             {MAX_PAYLOAD}-byte limit of an image; check the linker script"
        ));
    }
    let mut payload = vec![0u8; span as usize];
    let mut filled_to = load_address;
    for (address, data) in &segments {
        if *address < filled_to {
            return Err(format!(
                "segment at {address:#x} overlaps the one before it, which ends at {filled_to:#x}"
            ));
        }
        let offset = (address - load_address) as usize;
        payload[offset..offset + data.len()].copy_from_slice(data);
        filled_to = address + data.len() as u64;
    }

    let section_size = |name: &str| {
        elf.section_by_name(name)
            .map_or(0, |section| section.size())
    };
    Ok(FlatImage {
        load_address,
        entry_point: elf.elf_header().e_entry(endian).into(),
        payload,
        sections: SectionSizes {
            text: section_size(".text"),
            rodata: section_size(".rodata"),
            data: section_size(".data"),
            bss: section_size(".bss"),
            stack: section_size(".stack"),
        },
    })
}
