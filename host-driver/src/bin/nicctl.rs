//! nicctl: the nicbar driver's command-line tool.
//!
//! Parses the command line and hands each subcommand to its module in `host_driver::cli`. A new
//! subcommand is one variant of [`Command`], one match arm in `main`, and its module.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use host_driver::cli;

/// Inspect nicbar firmware images and put them on a NIC's flash.
#[derive(Parser, Debug)]
#[command(
    name = "nicctl",
    version,
    after_help = "Exit status: 0 on success, 1 if the command failed or refused (the message says \
                  why), 2 for a usage error."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Inspect firmware image files.
    #[command(subcommand)]
    Image(cli::image::Command),

    /// Write a firmware image to a NIC's flash device, then read it back and compare.
    ///
    /// The image is verified completely first (header and payload CRCs, length, ABI version,
    /// target against --target); if it is refused, the device is not opened and keeps its
    /// contents byte for byte. The device holds one image slot at offset 0: the image's bytes
    /// are written there, bytes after it are left alone. The device must be at least as large as
    /// the image, or nothing is written. After writing, the device is fsynced and the image is
    /// read back and compared.
    Flash(cli::flash::Args),

    /// Run emulated NICs as a daemon: real firmware, ports over shared memory, UDP between
    /// daemons. Serves until SIGINT or SIGTERM.
    Emulate(cli::emulate::EmulateArgs),

    /// Show a running emulator's units, open ports (with owner pids) and per-connection
    /// counters.
    Status(cli::status::StatusArgs),

    /// Make a new fabric key file (mode 0600) for `nicctl emulate --fabric-key`: the secret
    /// every daemon of a UDP fabric shares. Refuses to overwrite an existing file.
    Keygen(cli::keygen::Args),

    /// Boot the firmware image as NICs under QEMU (riscv32 virt), one QEMU per NIC, and serve
    /// their ports on a control socket as `nicctl emulate` does. Serves until SIGINT or SIGTERM.
    Qemu(cli::qemu::QemuArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Image(command) => cli::image::run(command),
        Command::Flash(args) => cli::flash::run(args),
        Command::Emulate(args) => cli::emulate::run_emulate(args),
        Command::Status(args) => cli::status::run_status(args),
        Command::Qemu(args) => cli::qemu::run_qemu(args),
        Command::Keygen(args) => cli::keygen::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("nicctl: error: {error}");
            ExitCode::FAILURE
        }
    }
}
