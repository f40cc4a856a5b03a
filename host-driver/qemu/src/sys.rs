//! The one place of the QEMU backend with `unsafe` code: asking the kernel to kill a QEMU child
//! when the process that started it dies, however it dies.
#![allow(
    unsafe_code,
    reason = "`Command::pre_exec` is unsafe: the closure runs between fork and exec"
)]

use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::signal::Signal;

/// Makes the child `command` starts receive SIGKILL when the thread that started it exits (the
/// kernel's parent-death signal), so no QEMU outlives a crashed or killed supervisor.
pub(super) fn kill_with_parent(command: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec; it makes one system call
    // (prctl), which is async-signal-safe, allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
}
