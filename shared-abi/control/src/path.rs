//! Where the control socket is, and binding it on the server side.
//!
//! [`socket_path`] gives the control socket's path: `$NICBAR_SOCKET` if set, else
//! `$XDG_RUNTIME_DIR/nicbar/control.sock` if `XDG_RUNTIME_DIR` is set, else
//! `/tmp/nicbar-<uid>/control.sock`. Every backend listens there by default and the library
//! connects there.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// The environment variable that names the control socket.
pub const SOCKET_ENV: &str = "NICBAR_SOCKET";

/// The control socket's default path: `$XDG_RUNTIME_DIR/nicbar/control.sock` if
/// `XDG_RUNTIME_DIR` is set (and absolute), else `/tmp/nicbar-<uid>/control.sock`.
pub fn default_socket_path() -> PathBuf {
    resolve_socket_path(
        None,
        std::env::var_os("XDG_RUNTIME_DIR"),
        nix::unistd::getuid().as_raw(),
    )
}

/// The control socket's path: `$NICBAR_SOCKET` if set and not empty, else
/// [`default_socket_path`].
pub fn socket_path() -> PathBuf {
    resolve_socket_path(
        std::env::var_os(SOCKET_ENV),
        std::env::var_os("XDG_RUNTIME_DIR"),
        nix::unistd::getuid().as_raw(),
    )
}

/// The rules of [`socket_path`], given the environment's values.
fn resolve_socket_path(
    nicbar_socket: Option<OsString>,
    runtime_dir: Option<OsString>,
    uid: u32,
) -> PathBuf {
    if let Some(path) = nicbar_socket.filter(|path| !path.is_empty()) {
        return PathBuf::from(path);
    }
    match runtime_dir.map(PathBuf::from) {
        Some(runtime) if runtime.is_absolute() => runtime.join("nicbar").join("control.sock"),
        _ => PathBuf::from(format!("/tmp/nicbar-{uid}")).join("control.sock"),
    }
}

/// Why a backend could not listen on its control socket.
#[derive(Debug)]
pub enum ListenError {
    /// Another daemon answers on the socket.
    AlreadyRunning {
        /// The socket.
        socket: PathBuf,
    },
    /// The socket's directory is not private to this user: another user could replace the
    /// socket, or put a daemon of theirs behind its name.
    UnsafeDirectory {
        /// The directory.
        directory: PathBuf,
        /// What is wrong with it, and what to do.
        problem: String,
    },
    /// The control socket could not be set up.
    Socket {
        /// The socket.
        socket: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl std::fmt::Display for ListenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AlreadyRunning { socket } => write!(
                f,
                "a daemon already answers on {} (stop it, or pick another --socket)",
                socket.display()
            ),
            Self::UnsafeDirectory { directory, problem } => write!(
                f,
                "refusing to use the socket directory {}: {problem}",
                directory.display()
            ),
            Self::Socket { socket, source } => {
                write!(f, "cannot listen on {}: {source}", socket.display())
            }
        }
    }
}

impl std::error::Error for ListenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Socket { source, .. } => Some(source),
            Self::AlreadyRunning { .. } | Self::UnsafeDirectory { .. } => None,
        }
    }
}

/// Binds the control socket at `path`, private to this user: creates its directory (mode 0700)
/// if missing, refuses a directory another user owns or may write into (where they could replace
/// the socket, or make the directory first and put a daemon of theirs behind the name), and
/// replaces a stale socket file no daemon answers on. The socket gets mode 0600.
///
/// # Errors
/// The directory is not private ([`ListenError::UnsafeDirectory`], saying what to fix), another
/// daemon answers there, the path is something other than a socket, or the socket could not be
/// bound.
pub fn listen(path: &Path) -> Result<UnixListener, ListenError> {
    let socket_error = |source| ListenError::Socket {
        socket: path.to_owned(),
        source,
    };
    let directory = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => parent.to_owned(),
        None => PathBuf::from("."),
    };
    if !directory.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&directory)
            .map_err(socket_error)?;
    }
    check_private_directory(&directory, nix::unistd::geteuid().as_raw())?;
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        if !metadata.file_type().is_socket() {
            return Err(socket_error(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket",
            )));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(ListenError::AlreadyRunning {
                socket: path.to_owned(),
            });
        }
        std::fs::remove_file(path).map_err(socket_error)?;
    }
    let listener = UnixListener::bind(path).map_err(socket_error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(socket_error)?;
    Ok(listener)
}

/// Lets the members of group `gid` reach the socket at `path` too: the socket becomes mode 0660
/// of that group, and its directory (which must be this user's) gains group search permission.
///
/// # Errors
/// The group could not be given to the socket or its directory (the user must be a member).
pub fn share_with_group(path: &Path, gid: u32) -> io::Result<()> {
    let group = Some(nix::unistd::Gid::from_raw(gid));
    if let Some(directory) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        nix::unistd::chown(directory, None, group)?;
        let mode = std::fs::symlink_metadata(directory)?.permissions().mode() & 0o7777;
        std::fs::set_permissions(directory, std::fs::Permissions::from_mode(mode | 0o010))?;
    }
    nix::unistd::chown(path, None, group)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
}

/// Refuses a socket directory another user controls: it must be a real directory (not a link),
/// owned by `uid` and writable by no one else — or owned by root with the sticky bit (as `/tmp`),
/// where no user can remove or replace another's socket.
fn check_private_directory(directory: &Path, uid: u32) -> Result<(), ListenError> {
    let unsafe_directory = |problem: String| ListenError::UnsafeDirectory {
        directory: directory.to_owned(),
        problem,
    };
    let metadata = std::fs::symlink_metadata(directory).map_err(|error| ListenError::Socket {
        socket: directory.to_owned(),
        source: error,
    })?;
    if metadata.file_type().is_symlink() {
        return Err(unsafe_directory(
            "it is a symbolic link; point --socket (or NICBAR_SOCKET) at a real directory"
                .to_owned(),
        ));
    }
    if !metadata.is_dir() {
        return Err(unsafe_directory("it is not a directory".to_owned()));
    }
    let mode = metadata.permissions().mode() & 0o7777;
    const STICKY: u32 = 0o1000;
    if metadata.uid() == 0 && mode & STICKY != 0 {
        return Ok(());
    }
    if metadata.uid() != uid {
        return Err(unsafe_directory(format!(
            "it belongs to uid {}, not to this user (uid {uid}); another user may have made it \
             to capture the socket: remove it, or choose another directory with --socket",
            metadata.uid()
        )));
    }
    if mode & 0o022 != 0 {
        return Err(unsafe_directory(format!(
            "its mode {mode:04o} lets other users write into it: run `chmod go-w {}`, or choose \
             another directory with --socket",
            directory.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn the_socket_path_follows_the_documented_rules() {
        let os = |s: &str| Some(OsString::from(s));
        assert_eq!(
            resolve_socket_path(None, None, 1000),
            PathBuf::from("/tmp/nicbar-1000/control.sock")
        );
        assert_eq!(
            resolve_socket_path(None, os("/run/user/1000"), 1000),
            PathBuf::from("/run/user/1000/nicbar/control.sock")
        );
        assert_eq!(
            resolve_socket_path(None, os("relative"), 7),
            PathBuf::from("/tmp/nicbar-7/control.sock")
        );
        assert_eq!(
            resolve_socket_path(os("/elsewhere/x.sock"), os("/run/user/1000"), 1000),
            PathBuf::from("/elsewhere/x.sock")
        );
        assert_eq!(
            resolve_socket_path(os(""), os("/run/user/1000"), 1000),
            PathBuf::from("/run/user/1000/nicbar/control.sock")
        );
    }

    fn private_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "nicbar-listen-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        dir
    }

    #[test]
    fn a_directory_open_to_others_or_not_ours_is_refused_naming_the_fix() {
        let dir = private_dir();
        let open = dir.join("open");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&open)
            .unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o775)).unwrap();
        let error = listen(&open.join("control.sock")).unwrap_err();
        assert!(
            matches!(error, ListenError::UnsafeDirectory { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("mode 0775"), "{error}");
        assert!(error.to_string().contains("chmod go-w"), "{error}");
        // Readable by others is no danger: nobody else can put anything there.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        drop(listen(&open.join("control.sock")).unwrap());
        let uid = nix::unistd::geteuid().as_raw();
        let error = check_private_directory(&dir, uid.wrapping_add(1)).unwrap_err();
        assert!(error.to_string().contains("not to this user"), "{error}");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&open, &link).unwrap();
        let error = listen(&link.join("control.sock")).unwrap_err();
        assert!(error.to_string().contains("symbolic link"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_directory_is_made_private_and_the_socket_is_the_owners_alone() {
        let dir = private_dir();
        let socket = dir.join("made").join("control.sock");
        let listener = listen(&socket).unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(socket.parent().unwrap()), 0o700);
        assert_eq!(mode(&socket), 0o600);
        drop(listener);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
