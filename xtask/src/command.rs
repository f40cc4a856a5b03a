//! Running the tools a task drives (cargo, rustup), saying what runs before it does.

use std::ffi::OsString;
use std::process::Command;

use crate::Result;

/// The cargo that runs this task (`CARGO`), or `cargo` from the path.
pub(crate) fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo")))
}

/// Prints `command`, runs it with this process's terminal, and fails unless it succeeds.
pub(crate) fn run(command: &mut Command) -> Result<()> {
    let shown = show(command);
    println!("running: {shown}");
    let status = command
        .status()
        .map_err(|error| format!("could not start `{shown}`: {error}"))?;
    if !status.success() {
        return Err(format!("`{shown}` failed: {status}").into());
    }
    Ok(())
}

/// Makes sure rustup has the standard library for `triple` (machines run with
/// `RUSTUP_AUTO_INSTALL=0`, so nothing else adds it): adds it unless it is installed.
pub(crate) fn ensure_rust_target(triple: &str) -> Result<()> {
    let listed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    match listed {
        Ok(output) if output.status.success() => {
            let installed = String::from_utf8_lossy(&output.stdout);
            if installed.lines().any(|line| line.trim() == triple) {
                println!("rust target {triple}: already installed");
                return Ok(());
            }
            run(Command::new("rustup").args(["target", "add", triple]))
        }
        Ok(output) => Err(format!(
            "`rustup target list --installed` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into()),
        Err(error) => {
            // A toolchain without rustup may still have the target; the build will say if not.
            println!("rust target {triple}: not checked, rustup could not be run ({error})");
            Ok(())
        }
    }
}

/// `command` as a shell line, for messages.
pub(crate) fn show(command: &Command) -> String {
    let mut shown = command.get_program().to_string_lossy().into_owned();
    for argument in command.get_args() {
        shown.push(' ');
        shown.push_str(&argument.to_string_lossy());
    }
    shown
}

/// CPU time the threads of process `pid` have used, in nanoseconds (their scheduler statistics),
/// counting only threads whose name starts with `prefix` (all with ""); 0 where none can be read.
pub(crate) fn threads_cpu_ns(pid: u32, prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.starts_with(prefix))
        })
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Processes held stopped (`SIGSTOP`) until this is dropped (`SIGCONT`): a benchmark's
/// reference rows run with nicbar's daemons stopped, so that a daemon that polls holds no core
/// Open MPI's own would have had without nicbar.
pub(crate) struct Stopped(Vec<u32>);

impl Stopped {
    pub(crate) fn new(pids: impl IntoIterator<Item = u32>) -> Result<Self> {
        let stopped = Self(pids.into_iter().collect());
        // On failure, the drop continues whichever were stopped.
        signal("-STOP", &stopped.0)?;
        Ok(stopped)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Err(error) = signal("-CONT", &self.0) {
            eprintln!("warning: {error}");
        }
    }
}

/// Sends `signal` (as `kill` spells it) to every one of `pids`.
fn signal(signal: &str, pids: &[u32]) -> Result<()> {
    if pids.is_empty() {
        return Ok(());
    }
    let status = Command::new("kill")
        .arg(signal)
        .args(pids.iter().map(u32::to_string))
        .status()
        .map_err(|error| format!("could not run kill: {error}"))?;
    if !status.success() {
        return Err(format!("kill {signal} {pids:?} failed: {status}").into());
    }
    Ok(())
}
