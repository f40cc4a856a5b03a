//! `nicctl flash`: write a firmware image to a NIC's flash device.

use std::io::IsTerminal;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use shared_abi::image::ImageTarget;

use super::{CliResult, parse_target};
use nicbar_image::flash::{FlashDevice, Phase, Progress};
use nicbar_image::image::ImageFile;

/// Arguments of `nicctl flash`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The image file to write.
    #[arg(long, value_name = "FILE")]
    image: PathBuf,

    /// The flash device: an emulated flash file, or a block device such as /dev/mtdblock0.
    #[arg(long, value_name = "DEVICE")]
    device: PathBuf,

    /// The target of the NIC the device belongs to; an image for another is refused.
    #[arg(
        long,
        value_name = "TRIPLE",
        default_value = "riscv32imac-unknown-none-elf",
        value_parser = parse_target,
    )]
    target: ImageTarget,

    /// If DEVICE does not exist, create it as an emulated flash file of --size bytes, erased
    /// (all 0xff). Without this, a missing DEVICE is an error.
    #[arg(long)]
    create: bool,

    /// Size of a device made by --create: bytes, or a number with a K or M suffix (KiB, MiB).
    #[arg(
        long,
        value_name = "BYTES",
        default_value = "1M",
        value_parser = parse_size,
        requires = "create",
    )]
    size: u64,
}

/// Runs `nicctl flash`: verifies the image completely before the device is opened, then writes
/// it at offset 0, fsyncs, reads it back and compares.
///
/// # Errors
/// Why the image was refused (the device untouched), or why writing or verifying failed.
pub fn run(args: Args) -> CliResult {
    let image = ImageFile::read_for_target(&args.image, args.target).map_err(|error| {
        format!(
            "{error}; flash device {} was not touched",
            args.device.display()
        )
    })?;
    let image_len = image.bytes().len() as u64;
    println!(
        "image {}: {} bytes for {}, verified",
        args.image.display(),
        image_len,
        image.header().target
    );

    let mut device = match std::fs::metadata(&args.device) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if !args.create {
                return Err(format!(
                    "flash device {} does not exist; pass --create to create an emulated flash \
                     file there",
                    args.device.display()
                )
                .into());
            }
            if args.size < image_len {
                return Err(format!(
                    "--size {} is smaller than the image ({image_len} bytes); nothing was created",
                    args.size
                )
                .into());
            }
            let device = FlashDevice::create(&args.device, args.size)?;
            println!(
                "created {}: emulated flash file, {} bytes, erased",
                args.device.display(),
                args.size
            );
            device
        }
        _ => FlashDevice::open(&args.device)?,
    };
    println!(
        "device {}: {}, {} bytes",
        device.path().display(),
        device.kind(),
        device.len()
    );

    let mut reporter = Reporter::new(std::io::stdout().is_terminal(), image_len);
    let report = device.write_image(&image, &mut |progress| reporter.report(progress));
    reporter.finish();
    let report = report?;
    println!(
        "flashed {} bytes to {} at offset 0 and read them back identical: image CRC-32 {:#010x}, \
         payload CRC-32 {:#010x}, target {}",
        report.bytes_written,
        device.path().display(),
        report.image_crc32,
        report.payload_crc32,
        report.target
    );
    Ok(())
}

/// Parses a byte count: digits, optionally followed by K/KiB (1024) or M/MiB (1024 * 1024).
fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|character: char| !character.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(split);
    let multiplier: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        _ => return Err(format!("{text:?}: size suffix must be K, KiB, M or MiB")),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|count| count.checked_mul(multiplier))
        .ok_or_else(|| format!("{text:?} is not a byte count"))
}

/// Shows progress as a bar on a terminal, as a few plain lines otherwise (logs, pipes, tests).
enum Reporter {
    Bar { bar: ProgressBar, phase: Phase },
    Lines { last: Option<(Phase, u64)> },
}

impl Reporter {
    fn new(terminal: bool, total: u64) -> Self {
        if !terminal {
            return Self::Lines { last: None };
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stdout());
        let style = ProgressStyle::with_template("{msg:6} [{bar:40}] {bytes}/{total_bytes}")
            .map(|style| style.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message("write");
        Self::Bar {
            bar,
            phase: Phase::Write,
        }
    }

    fn report(&mut self, progress: Progress) {
        match self {
            Self::Bar { bar, phase } => {
                if *phase != progress.phase {
                    // A finished bar leaves the cursor on its line; replace it with a plain one.
                    bar.finish_and_clear();
                    println!("written {} bytes", bar.length().unwrap_or(0));
                    *bar = ProgressBar::with_draw_target(
                        Some(progress.total),
                        ProgressDrawTarget::stdout(),
                    )
                    .with_style(bar.style());
                    bar.set_message("verify");
                    *phase = progress.phase;
                }
                bar.set_position(progress.done);
            }
            Self::Lines { last } => {
                // One line per tenth of the way, and the last one, whatever the image size.
                let tenth = progress.done.saturating_mul(10) / progress.total.max(1);
                if *last == Some((progress.phase, tenth)) && progress.done < progress.total {
                    return;
                }
                *last = Some((progress.phase, tenth));
                let verb = match progress.phase {
                    Phase::Write => "written",
                    Phase::Verify => "verified",
                };
                println!(
                    "{verb} {}/{} bytes ({}%)",
                    progress.done,
                    progress.total,
                    progress.done.saturating_mul(100) / progress.total.max(1)
                );
            }
        }
    }

    fn finish(&self) {
        if let Self::Bar { bar, phase } = self {
            bar.finish_and_clear();
            let verb = match phase {
                Phase::Write => "written",
                Phase::Verify => "verified",
            };
            println!("{verb} {} bytes", bar.position());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
        assert!(parse_size("2G").unwrap_err().contains("suffix"));
        assert!(parse_size("").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("99999999999999999999M").is_err());
    }
}
