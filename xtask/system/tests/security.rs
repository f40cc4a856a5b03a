//! The control socket is private to its user: a daemon refuses a socket directory another user
//! controls, a process refuses a daemon of another user (an impostor behind a squatted name),
//! and a daemon refuses processes of another user.
//!
//! Running a process as another user needs root (as CI runs); without it those two tests say
//! that they were skipped and why.

mod common;

use std::os::unix::fs::{PermissionsExt, chown};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{ChildProcess, STAGE, nicctl, temp_dir, terminate};
use nicbar::{Error, Port};

/// The user another user's processes run as here.
const OTHER_UID: u32 = 65534;
const OTHER_GID: u32 = 65534;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `nicctl` where any user may run it (the build's own may sit in a private home): a hard link
/// where the file system allows one, else a copy. A link is never open for writing, so a test
/// forking meanwhile cannot make running it fail with "text file busy".
fn public_nicctl(dir: &Path) -> PathBuf {
    let public = dir.join("nicctl");
    if std::fs::hard_link(nicctl(), &public).is_err() {
        std::fs::copy(nicctl(), &public).unwrap();
        std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    public
}

fn emulate(program: &Path, socket: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .args(["emulate", "--units", "1", "--socket"])
        .arg(socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    command
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn a_daemon_refuses_a_socket_directory_others_control() {
    let dir = temp_dir("nicbar-security");
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let output = emulate(&nicctl(), &open.join("control.sock"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let said = text(&output);
    assert!(
        said.contains("refusing to use the socket directory")
            && said.contains("lets other users write into it")
            && said.contains("chmod go-w"),
        "{said}"
    );
    assert!(!open.join("control.sock").exists());

    if !is_root() {
        eprintln!("squatted directory: skipped: making a directory of another user needs root");
        return;
    }
    // Another user made the default-style directory first, private to them.
    let squatted = dir.path().join("squatted");
    std::fs::create_dir(&squatted).unwrap();
    std::fs::set_permissions(&squatted, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown(&squatted, Some(OTHER_UID), Some(OTHER_GID)).unwrap();
    let output = emulate(&nicctl(), &squatted.join("control.sock"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let said = text(&output);
    assert!(
        said.contains(&format!("it belongs to uid {OTHER_UID}, not to this user")),
        "{said}"
    );
}

#[test]
fn a_process_refuses_a_daemon_of_another_user() {
    if !is_root() {
        eprintln!("impostor daemon: skipped: running a daemon as another user needs root");
        return;
    }
    let dir = temp_dir("nicbar-security");
    let program = public_nicctl(dir.path());
    // The impostor's own private directory: it may listen there, and root may reach it.
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown(&theirs, Some(OTHER_UID), Some(OTHER_GID)).unwrap();
    let socket = theirs.join("control.sock");
    let mut command = emulate(&program, &socket);
    command.uid(OTHER_UID).gid(OTHER_GID);
    let mut impostor = ChildProcess::start("impostor", command);
    impostor.expect("nicctl emulate: listening on", STAGE);

    match Port::open_at(&socket, 0, 1) {
        Err(Error::UntrustedDaemon { uid, pid, .. }) => {
            assert_eq!(uid, OTHER_UID);
            assert_eq!(pid, impostor.pid());
        }
        other => panic!("opened a port on another user's daemon: {other:?}"),
    }
    let status = Command::new(nicctl())
        .args(["status", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(1), "{}", text(&status));
    assert!(
        text(&status).contains(&format!("runs as uid {OTHER_UID}, neither this user")),
        "{}",
        text(&status)
    );
    terminate(&mut impostor);
}

#[test]
fn a_daemon_refuses_processes_of_another_user() {
    if !is_root() {
        eprintln!("foreign client: skipped: running a client as another user needs root");
        return;
    }
    let dir = temp_dir("nicbar-security");
    let program = public_nicctl(dir.path());
    let ours = dir.path().join("ours");
    std::fs::create_dir(&ours).unwrap();
    // Others may pass through (not list or write): the socket's own mode is opened below, so
    // that only the daemon's own check stands between the other user and the NIC.
    std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o711)).unwrap();
    let socket = ours.join("control.sock");
    let mut daemon = ChildProcess::start("daemon", emulate(&program, &socket));
    daemon.expect("nicctl emulate: listening on", STAGE);
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();

    let refused = Command::new(&program)
        .args(["status", "--socket"])
        .arg(&socket)
        .uid(OTHER_UID)
        .gid(OTHER_GID)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(
        text(&refused).contains(&format!(
            "permission denied: this daemon serves uid 0 (and the group it was started with), \
             not uid {OTHER_UID}"
        )),
        "{}",
        text(&refused)
    );
    // The daemon's own user is still served.
    let port = Port::open_at(&socket, 0, 1).unwrap();
    drop(port);
    let served = Command::new(&program)
        .args(["status", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(served.status.success(), "{}", text(&served));
    terminate(&mut daemon);
}
