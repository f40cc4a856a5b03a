//! Fabric key files: the secret every daemon of a UDP fabric shares, from a file only its owner
//! can read.
//!
//! A key file holds 64 hexadecimal digits (32 bytes) and an optional newline, and must be owned
//! by the user who reads it with no permission for anyone else (mode 0600 or 0400), as ssh
//! demands of a private key. `nicctl keygen FILE` makes one; whatever forms a fabric for a job
//! (a launcher, the MPI component) may make one per job the same way and hand it to each daemon.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use firmware::auth::FabricKey;

/// Why a key file was refused.
#[derive(Debug)]
pub struct KeyFileError {
    /// The file.
    pub path: String,
    /// What is wrong, and what to do.
    pub problem: String,
}

impl std::fmt::Display for KeyFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fabric key {}: {}", self.path, self.problem)
    }
}

impl std::error::Error for KeyFileError {}

/// The most bytes a key file may hold: 64 digits, a newline, and some slack for a `\r`.
const MAX_KEY_FILE_LEN: u64 = 128;

/// Reads the key in `path`, refusing a file others may read or another user owns.
///
/// # Errors
/// The file cannot be read, is not a regular file (a FIFO, a device, a directory: refused at
/// once, never waited on), is open to others, belongs to another user, does not hold 64
/// hexadecimal digits, or holds the all-zero key.
pub fn read_key(path: &Path) -> Result<FabricKey, KeyFileError> {
    read_key_bytes(path).map(FabricKey::new)
}

/// The 32 bytes of the key in `path`, checked as [`read_key`] checks them: for a NIC that takes
/// its key as bytes (a QEMU NIC's mailbox).
///
/// # Errors
/// As [`read_key`].
pub fn read_key_bytes(path: &Path) -> Result<[u8; 32], KeyFileError> {
    let refuse = |problem: String| KeyFileError {
        path: path.display().to_string(),
        problem,
    };
    // Look before opening: opening a FIFO for reading waits for a writer, forever.
    let metadata = std::fs::metadata(path).map_err(|error| refuse(error.to_string()))?;
    check_metadata(&metadata, path).map_err(refuse)?;
    // Opened without blocking, and checked again through the open file: the path may have been
    // replaced between the look and the open.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path)
        .map_err(|error| refuse(error.to_string()))?;
    let metadata = file.metadata().map_err(|error| refuse(error.to_string()))?;
    check_metadata(&metadata, path).map_err(refuse)?;
    if metadata.len() > MAX_KEY_FILE_LEN {
        return Err(refuse(format!(
            "it holds {} bytes; a key file holds 64 hexadecimal digits (make one with `nicctl keygen`)",
            metadata.len()
        )));
    }
    let mut text = String::new();
    (&mut file)
        .take(MAX_KEY_FILE_LEN)
        .read_to_string(&mut text)
        .map_err(|error| refuse(error.to_string()))?;
    let bytes = parse_key(text.trim_end_matches('\n')).ok_or_else(|| {
        refuse("it does not hold 64 hexadecimal digits (make one with `nicctl keygen`)".into())
    })?;
    if bytes == [0; 32] {
        return Err(refuse(
            "it holds the all-zero key, which anyone can guess (make one with `nicctl keygen`)"
                .into(),
        ));
    }
    Ok(bytes)
}

/// Refuses what is not a regular file of this user's that only this user may read.
fn check_metadata(metadata: &std::fs::Metadata, path: &Path) -> Result<(), String> {
    if !metadata.file_type().is_file() {
        let what = file_kind(&metadata.file_type());
        return Err(format!(
            "it is {what}, not a regular file (make one with `nicctl keygen`)"
        ));
    }
    let uid = nix::unistd::geteuid().as_raw();
    if metadata.uid() != uid {
        return Err(format!(
            "it belongs to uid {}, not to this user (uid {uid})",
            metadata.uid()
        ));
    }
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "its mode {mode:04o} lets others read it: run `chmod 600 {}`",
            path.display()
        ));
    }
    Ok(())
}

/// What a file that is not a regular file is, in words.
fn file_kind(kind: &std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else {
        "not a file"
    }
}

/// Makes a new random key and writes it to `path` (which must not exist), mode 0600.
///
/// # Errors
/// The file exists or cannot be written, or the kernel's random source cannot be read.
pub fn write_new_key(path: &Path) -> std::io::Result<FabricKey> {
    let bytes = nicbar_control::server::random_key()?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    let text: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    writeln!(file, "{text}")?;
    file.sync_all()?;
    Ok(FabricKey::new(bytes))
}

/// The key's bytes, written as 64 hexadecimal digits.
fn parse_key(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut key = [0u8; 32];
    for (index, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * index..2 * index + 2)?, 16).ok()?;
    }
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_reads_back_and_a_readable_or_malformed_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fabric.key");
        let key = write_new_key(&path).unwrap();
        assert_eq!(read_key(&path).unwrap(), key);
        assert!(
            write_new_key(&path).is_err(),
            "an existing key is never overwritten"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = read_key(&path).unwrap_err().to_string();
        assert!(error.contains("mode 0644 lets others read it"), "{error}");
        let short = dir.path().join("short.key");
        std::fs::write(&short, "abcd\n").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        let error = read_key(&short).unwrap_err().to_string();
        assert!(error.contains("64 hexadecimal digits"), "{error}");
        assert!(parse_key(&"zz".repeat(32)).is_none());
    }

    #[test]
    fn a_fifo_a_directory_and_the_zero_key_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.key");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // No writer ever opens it: reading it would wait forever.
        let error = read_key(&fifo).unwrap_err().to_string();
        assert!(
            error.contains("it is a FIFO, not a regular file"),
            "{error}"
        );
        let error = read_key(dir.path()).unwrap_err().to_string();
        assert!(error.contains("it is a directory"), "{error}");
        let zero = dir.path().join("zero.key");
        std::fs::write(&zero, format!("{}\n", "0".repeat(64))).unwrap();
        std::fs::set_permissions(&zero, std::fs::Permissions::from_mode(0o600)).unwrap();
        let error = read_key(&zero).unwrap_err().to_string();
        assert!(error.contains("all-zero key"), "{error}");
        let long = dir.path().join("long.key");
        std::fs::write(&long, "a".repeat(4096)).unwrap();
        std::fs::set_permissions(&long, std::fs::Permissions::from_mode(0o600)).unwrap();
        let error = read_key(&long).unwrap_err().to_string();
        assert!(error.contains("holds 4096 bytes"), "{error}");
    }
}
