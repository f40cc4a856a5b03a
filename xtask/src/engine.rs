//! The one-host daemon's NIC threads, idle policy and niceness, as the tasks that start one take
//! them and `nicctl emulate` is given them.

use clap::Args as ClapArgs;

/// `--threads`, `--idle` and `--nice` of a task that starts a daemon.
#[derive(ClapArgs)]
pub(crate) struct Engine {
    /// NIC threads of the daemon (`nicctl emulate --threads`); `auto`: its default.
    #[arg(long, default_value = "auto")]
    pub(crate) threads: String,
    /// Idle policy of the daemon's NIC threads (`nicctl emulate --idle`).
    #[arg(long, default_value = "adaptive", value_parser = ["poll", "sleep", "adaptive"])]
    pub(crate) idle: String,
    /// Niceness of the daemon's NIC threads (`nicctl emulate --nice`), -20 to 19; default: the
    /// daemon's.
    #[arg(long, allow_hyphen_values = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub(crate) nice: Option<i32>,
}

impl Engine {
    /// The daemon's arguments for the NIC threads and idle policy asked for.
    pub(crate) fn daemon_args(&self) -> Vec<String> {
        let mut args = vec!["--idle".to_owned(), self.idle.clone()];
        if self.threads != "auto" {
            args.extend(["--threads".to_owned(), self.threads.clone()]);
        }
        if let Some(nice) = self.nice {
            args.extend(["--nice".to_owned(), nice.to_string()]);
        }
        args
    }

    /// The settings, as a benchmark's table names them.
    pub(crate) fn describe(&self) -> String {
        let nice = self
            .nice
            .map_or_else(|| "the daemon's".to_owned(), |nice| nice.to_string());
        format!(
            "NIC threads {}, idle policy {}, niceness {nice}",
            self.threads, self.idle
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Harness {
        #[command(flatten)]
        engine: Engine,
    }

    fn parse(line: &[&str]) -> Result<Engine, clap::Error> {
        Harness::try_parse_from(std::iter::once("task").chain(line.iter().copied()))
            .map(|harness| harness.engine)
    }

    #[test]
    fn the_daemon_gets_what_was_asked_and_only_that() {
        assert_eq!(parse(&[]).unwrap().daemon_args(), ["--idle", "adaptive"]);
        let engine = parse(&["--threads", "2", "--idle", "sleep", "--nice", "-5"]).unwrap();
        assert_eq!(
            engine.daemon_args(),
            ["--idle", "sleep", "--threads", "2", "--nice", "-5"]
        );
        assert_eq!(
            engine.describe(),
            "NIC threads 2, idle policy sleep, niceness -5"
        );
        assert!(parse(&["--nice", "20"]).is_err());
        assert!(parse(&["--idle", "spin"]).is_err());
    }
}
