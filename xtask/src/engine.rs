//! The one-host daemon's NIC threads and idle policy, as the tasks that start one take them and
//! `nicctl emulate` is given them.

use clap::Args as ClapArgs;

/// `--threads` and `--idle` of a task that starts a daemon.
#[derive(ClapArgs)]
pub(crate) struct Engine {
    /// NIC threads of the daemon (`nicctl emulate --threads`); `auto`: its default.
    #[arg(long, default_value = "auto")]
    pub(crate) threads: String,
    /// Idle policy of the daemon's NIC threads (`nicctl emulate --idle`).
    #[arg(long, default_value = "adaptive", value_parser = ["poll", "sleep", "adaptive"])]
    pub(crate) idle: String,
}

impl Engine {
    /// The daemon's arguments for the NIC threads and idle policy asked for.
    pub(crate) fn daemon_args(&self) -> Vec<String> {
        let mut args = vec!["--idle".to_owned(), self.idle.clone()];
        if self.threads != "auto" {
            args.extend(["--threads".to_owned(), self.threads.clone()]);
        }
        args
    }
}
