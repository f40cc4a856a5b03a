//! The subcommands of `nicctl`, one module each: clap arguments and a `run` function.
//!
//! `src/bin/nicctl.rs` only parses the command line and dispatches here, so a new subcommand is
//! one module in this directory plus one variant and one match arm there.

use shared_abi::image::ImageTarget;

pub mod emulate;
pub mod flash;
pub mod image;
pub mod keygen;
pub mod qemu;
pub mod status;

/// What a subcommand returns. `nicctl` prints an error as `nicctl: error: <message>` and exits
/// with status 1.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// Parses a Rust target triple for a `--target` argument.
///
/// # Errors
/// A message listing the known triples, if `triple` is none of them.
pub fn parse_target(triple: &str) -> Result<ImageTarget, String> {
    ImageTarget::from_triple(triple).ok_or_else(|| {
        let known: Vec<&str> = ImageTarget::KNOWN.iter().map(|(_, name)| *name).collect();
        format!("no NIC target {triple:?}; known: {}", known.join(", "))
    })
}

/// The group id of `--allow-group`'s argument: a group name, or a number.
///
/// # Errors
/// No group has that name.
pub fn resolve_group(group: &str) -> Result<u32, String> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(found)) => Ok(found.gid.as_raw()),
        Ok(None) => Err(format!("no group named {group:?}")),
        Err(error) => Err(format!("cannot look up group {group:?}: {error}")),
    }
}
