//! What the process-level tests share: child processes of this very test binary, talking in
//! lines, and small helpers. Each test file has its own `child()` role table.
#![allow(dead_code, reason = "each test file uses part of the harness")]

pub(crate) mod netns;
pub(crate) mod one_sided;
pub(crate) mod qemu_fabric;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

/// The environment variable naming a child process's role.
pub(crate) const ROLE: &str = "NICBAR_TEST_ROLE";
/// How long any one stage of a test may take before it fails.
pub(crate) const STAGE: Duration = Duration::from_secs(60);

/// The `nicctl` binary of this build, beside the test binaries (`target/<profile>/nicctl`).
///
/// `cargo test --workspace` (and so `cargo xtask test`) builds it with everything else; a
/// narrower run that finds none builds it here first. After changing `host-driver`, run the
/// tests through the workspace (or `cargo build -p host-driver`) so the binary is current.
pub(crate) fn nicctl() -> PathBuf {
    static NICCTL: OnceLock<PathBuf> = OnceLock::new();
    NICCTL
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("the test binary's path");
            // target/<profile>/deps/<test binary>
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("the test binary lives in target/<profile>/deps");
            let nicctl = profile_dir.join("nicctl");
            if !nicctl.exists() {
                let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
                    Some("debug") | None => "dev",
                    Some(other) => other,
                };
                let status = Command::new(env!("CARGO"))
                    .args(["build", "--quiet", "-p", "host-driver", "--bin", "nicctl"])
                    .args(["--profile", profile])
                    .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
                    .status()
                    .expect("running cargo build for nicctl");
                assert!(status.success(), "building nicctl failed");
            }
            nicctl
        })
        .clone()
}

/// The fabric key file of the daemons whose maps live in `dir`: made on first use (mode 0600),
/// shared by every daemon of the test's fabric.
pub(crate) fn fabric_key(dir: &Path) -> PathBuf {
    let path = dir.join("fabric.key");
    if !path.exists() {
        nicbar_emulator::key::write_new_key(&path).unwrap();
    }
    path
}

/// The test's seed: `NICBAR_TEST_SEED` if set, else `default`; printed so a failure replays.
pub(crate) fn seed(default: u64) -> u64 {
    let seed = std::env::var("NICBAR_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    eprintln!("seed {seed} (replay with NICBAR_TEST_SEED={seed})");
    seed
}

/// A fresh temporary directory named after the test file.
pub(crate) fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().unwrap()
}

/// In a child: the value the parent gave as `NICBAR_TEST_<name>`.
pub(crate) fn var(name: &str) -> String {
    std::env::var(format!("NICBAR_TEST_{name}")).unwrap_or_else(|_| panic!("{name} not given"))
}

/// In a child: one line to the parent.
pub(crate) fn say(line: &str) {
    println!("child: {line}");
    std::io::stdout().flush().unwrap();
}

/// In a child: one line from the parent.
pub(crate) fn hear() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    line.trim().to_owned()
}

/// Stops a daemon with SIGTERM and expects it to exit cleanly.
pub(crate) fn terminate(daemon: &mut ChildProcess) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    daemon.wait_success(STAGE);
}

/// A child process running this test binary's `child` test in one role, talking in lines on stdin
/// and stdout.
pub(crate) struct ChildProcess {
    /// Its name in messages.
    pub name: String,
    /// The process.
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl ChildProcess {
    pub(crate) fn spawn(name: &str, role: &str, env: &[(&str, String)]) -> Self {
        Self::start(name, Self::command(role, env))
    }

    /// The command that runs this test binary as a child in `role`.
    pub(crate) fn command(role: &str, env: &[(&str, String)]) -> Command {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                "child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (key, value) in env {
            command.env(format!("NICBAR_TEST_{key}"), value);
        }
        command
    }

    pub(crate) fn start(name: &str, mut command: Command) -> Self {
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            name: name.to_owned(),
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a line starting with `prefix` (after `child: ` for test children) and returns
    /// the rest of it. A `failed` or panic line from the child fails at once.
    pub(crate) fn expect(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    // libtest prints `test child ... ` before the child's first line.
                    let body = line
                        .find("child: ")
                        .map_or(line.as_str(), |at| &line[at + 7..]);
                    if let Some(rest) = body.strip_prefix(prefix) {
                        return rest.trim().to_owned();
                    }
                    assert!(
                        !body.starts_with("failed") && !body.contains("panicked"),
                        "{}: {body}; its output:\n{}",
                        self.name,
                        self.seen.join("\n")
                    );
                }
                Err(error) => panic!(
                    "{}: no `{prefix}` line within {timeout:?} ({error:?}); its output:\n{}",
                    self.name,
                    self.seen.join("\n")
                ),
            }
        }
    }

    pub(crate) fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    pub(crate) fn wait_success(&mut self, timeout: Duration) {
        let status = self.wait(timeout);
        assert!(
            status.success(),
            "{} ended with {status}; its output:\n{}",
            self.name,
            self.seen.join("\n")
        );
    }

    pub(crate) fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            // Collect output meanwhile, for the failure message.
            match self.lines.recv_timeout(Duration::from_millis(20)) {
                Ok(line) => self.seen.push(line),
                Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {}
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}; its output:\n{}",
                self.name,
                self.seen.join("\n")
            );
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
