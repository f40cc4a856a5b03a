//! `nicctl emulate` refuses configuration it cannot run with, as the real binary on real files:
//! at once (a key file that is a FIFO never holds it up), with a message that names the value
//! and the range, exit status 1 (2 for a value out of a flag's range), and nothing created or
//! printed first.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a refusal may take before the test calls it a hang.
const REFUSAL_LIMIT: Duration = Duration::from_secs(20);

/// What a run of `nicctl emulate` left behind.
#[derive(Debug)]
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `nicctl emulate --socket <dir>/control.sock ARGS`, killing it (and failing) if it has
/// not exited within [`REFUSAL_LIMIT`].
fn emulate(dir: &Path, args: &[&str]) -> Outcome {
    let socket = dir.join("control.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_nicctl"))
        .arg("emulate")
        .arg("--socket")
        .arg(&socket)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nicctl runs");
    let deadline = Instant::now() + REFUSAL_LIMIT;
    while child.try_wait().expect("waiting for nicctl").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("reaping nicctl");
            panic!(
                "nicctl emulate {args:?} still ran after {REFUSAL_LIMIT:?}:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().expect("reaping nicctl");
    assert!(
        !socket.exists(),
        "a refused daemon leaves no control socket behind"
    );
    Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Asserts that `outcome` is a refusal with exit status `code` whose message says `words`,
/// with nothing on standard output.
fn assert_refused(outcome: &Outcome, code: i32, words: &str) {
    assert_eq!(outcome.code, Some(code), "{outcome:#?}");
    assert!(
        outcome.stderr.contains(words),
        "expected `{words}`: {outcome:#?}"
    );
    assert!(
        outcome.stdout.is_empty(),
        "printed before refusing: {outcome:#?}"
    );
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

/// A file of `text`, mode 0600.
fn private_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

#[test]
fn a_fabric_key_that_is_a_fifo_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fabric.key");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // Nothing ever writes into it: a daemon that opened it to read would wait forever.
    let outcome = emulate(dir.path(), &["--fabric-key", path_str(&fifo)]);
    assert_refused(&outcome, 1, "it is a FIFO, not a regular file");
}

#[test]
fn a_fabric_map_that_is_a_fifo_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fabric.map");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let outcome = emulate(dir.path(), &["--fabric", path_str(&fifo), "--node", "0"]);
    assert_refused(&outcome, 1, "not a regular file");
}

#[test]
fn an_all_zero_fabric_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = private_file(dir.path(), "zero.key", &format!("{}\n", "0".repeat(64)));
    let outcome = emulate(dir.path(), &["--fabric-key", path_str(&key)]);
    assert_refused(&outcome, 1, "all-zero key");
}

#[test]
fn a_fabric_map_port_0_is_refused_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let map = private_file(
        dir.path(),
        "fabric.map",
        "node 0 127.0.0.1:7400\nnode 1 127.0.0.1:0\n",
    );
    let outcome = emulate(dir.path(), &["--fabric", path_str(&map), "--node", "0"]);
    assert_refused(
        &outcome,
        1,
        "fabric map line 2: `127.0.0.1:0`: the port must be 1 to 65535, not 0",
    );
}

#[test]
fn timing_flags_out_of_their_ranges_are_refused_naming_the_range() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, value, range) in [
        ("--retransmit-us", "0", "10..=1000000"),
        ("--retransmit-us", "2000000", "10..=1000000"),
        ("--give-up-ms", "0", "10..=3600000"),
        ("--delay-us", "18446744073709551615", "0..=10000000"),
        ("--reorder-window-us", "10000001", "0..=10000000"),
        ("--linger-us", "1000001", "0..=1000000"),
    ] {
        let outcome = emulate(dir.path(), &[flag, value]);
        assert_refused(&outcome, 2, flag);
        assert!(
            outcome.stderr.contains(range),
            "{flag} {value}: {outcome:#?}"
        );
    }
    // Each within its range, but a give-up time no longer than the retransmission timeout.
    let outcome = emulate(
        dir.path(),
        &["--retransmit-us", "20000", "--give-up-ms", "20"],
    );
    assert_refused(
        &outcome,
        1,
        "must be longer than the retransmission timeout",
    );
}

#[test]
fn counts_are_refused_before_any_unit_is_made_or_printed() {
    let dir = tempfile::tempdir().unwrap();
    let outcome = emulate(dir.path(), &["--units", "300"]);
    assert_refused(&outcome, 2, "--units");
    assert!(outcome.stderr.contains("1..=256"), "{outcome:#?}");
    let outcome = emulate(dir.path(), &["--units", "0"]);
    assert_refused(&outcome, 2, "--units");
    let outcome = emulate(dir.path(), &["--node", "3,4,3"]);
    assert_refused(&outcome, 1, "node 3 is given to two units");
    let outcome = emulate(dir.path(), &["--units", "2", "--threads", "3"]);
    assert_refused(&outcome, 1, "3 NIC threads for 2 units");
    let outcome = emulate(dir.path(), &["--units", "3", "--first-node", "65534"]);
    assert_refused(&outcome, 1, "exceeds node id 65535");
}
