//! Fabric key files: the secret every daemon of a UDP fabric shares, from a file only its owner
//! can read.
//!
//! A key file holds 64 hexadecimal digits (32 bytes) and an optional newline, and must be owned
//! by the user who reads it with no permission for anyone else (mode 0600 or 0400), as ssh
//! demands of a private key. `nicctl keygen FILE` makes one; whatever forms a fabric for a job
//! (a launcher, the MPI component) may make one per job the same way and hand it to each daemon.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
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

/// Reads the key in `path`, refusing a file others may read or another user owns.
///
/// # Errors
/// The file cannot be read, is open to others, belongs to another user, or does not hold 64
/// hexadecimal digits.
pub fn read_key(path: &Path) -> Result<FabricKey, KeyFileError> {
    let refuse = |problem: String| KeyFileError {
        path: path.display().to_string(),
        problem,
    };
    let metadata = std::fs::metadata(path).map_err(|error| refuse(error.to_string()))?;
    let uid = nix::unistd::geteuid().as_raw();
    if metadata.uid() != uid {
        return Err(refuse(format!(
            "it belongs to uid {}, not to this user (uid {uid})",
            metadata.uid()
        )));
    }
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(refuse(format!(
            "its mode {mode:04o} lets others read it: run `chmod 600 {}`",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|error| refuse(error.to_string()))?;
    parse_key(text.trim_end_matches('\n')).ok_or_else(|| {
        refuse("it does not hold 64 hexadecimal digits (make one with `nicctl keygen`)".into())
    })
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

/// The key written as 64 hexadecimal digits.
fn parse_key(text: &str) -> Option<FabricKey> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut key = [0u8; 32];
    for (index, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * index..2 * index + 2)?, 16).ok()?;
    }
    Some(FabricKey::new(key))
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
}
