//! `nicctl keygen`: make a fabric key file.

use std::path::PathBuf;

use super::CliResult;

/// Arguments of `nicctl keygen`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where to write the key (must not exist).
    pub file: PathBuf,
}

/// Runs `nicctl keygen`.
///
/// # Errors
/// The file exists or cannot be written.
pub fn run(args: Args) -> CliResult {
    nicbar_emulator::key::write_new_key(&args.file)
        .map_err(|error| format!("cannot write {}: {error}", args.file.display()))?;
    println!(
        "nicctl keygen: wrote a new fabric key to {} (mode 0600): copy it to every daemon of \
         the fabric, privately",
        args.file.display()
    );
    Ok(())
}
