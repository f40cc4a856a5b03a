//! The one-host daemon's NIC threads, idle policy, niceness and CPUs, as the tasks that start one
//! take them and `nicctl emulate` is given them.

use std::process::Command;

use clap::Args as ClapArgs;

use crate::Result;

/// `--threads`, `--idle`, `--nice` and `--nic-cpus` of a task that starts a daemon.
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
    /// CPUs of the daemon's NIC threads (`nicctl emulate --cpus`), a list such as `1` or
    /// `2-3`; the processes the daemon serves then run on the others: a NIC with cores of its
    /// own, as a SmartNIC brings. Default: not pinned, processes anywhere.
    #[arg(long, value_name = "LIST")]
    pub(crate) nic_cpus: Option<String>,
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
        if let Some(cpus) = &self.nic_cpus {
            args.extend(["--cpus".to_owned(), cpus.clone()]);
        }
        args
    }

    /// The CPUs the daemon's processes run on: with `--nic-cpus`, those this task may run on
    /// but the NIC's (None without it).
    ///
    /// # Errors
    /// A list that does not parse, names a CPU this task may not use, or leaves none.
    pub(crate) fn process_cpus(&self) -> Result<Option<String>> {
        let Some(nic) = &self.nic_cpus else {
            return Ok(None);
        };
        let nic = parse_cpus(nic).map_err(|error| format!("--nic-cpus: {error}"))?;
        let allowed = allowed_cpus()?;
        if let Some(cpu) = nic.iter().find(|cpu| !allowed.contains(cpu)) {
            return Err(format!("--nic-cpus: CPU {cpu} is not one this task may use").into());
        }
        let rest: Vec<usize> = allowed
            .into_iter()
            .filter(|cpu| !nic.contains(cpu))
            .collect();
        if rest.is_empty() {
            return Err("--nic-cpus leaves no CPU for the processes".into());
        }
        Ok(Some(format_cpus(&rest)))
    }

    /// `command` run on the processes' CPUs ([`Engine::process_cpus`]) by `taskset`, or as it
    /// is without `--nic-cpus`: its program, arguments, environment and directory (set its
    /// standard streams on what this returns).
    ///
    /// # Errors
    /// As [`Engine::process_cpus`].
    pub(crate) fn confine(&self, command: Command) -> Result<Command> {
        let Some(cpus) = self.process_cpus()? else {
            return Ok(command);
        };
        let mut confined = Command::new("taskset");
        confined
            .args(["--cpu-list", &cpus])
            .arg(command.get_program())
            .args(command.get_args());
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => confined.env(key, value),
                None => confined.env_remove(key),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            confined.current_dir(dir);
        }
        Ok(confined)
    }

    /// The settings, as a benchmark's table names them.
    pub(crate) fn describe(&self) -> String {
        let nice = self
            .nice
            .map_or_else(|| "the daemon's".to_owned(), |nice| nice.to_string());
        let cpus = self.nic_cpus.as_ref().map_or_else(
            || "not pinned".to_owned(),
            |cpus| format!("on CPUs {cpus} (the processes on the others)"),
        );
        format!(
            "NIC threads {}, idle policy {}, niceness {nice}, {cpus}",
            self.threads, self.idle
        )
    }
}

/// The CPUs this task may run on, as the kernel lists them in `/proc/self/status`.
fn allowed_cpus() -> Result<Vec<usize>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let allowed = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .ok_or("/proc/self/status names no allowed CPUs")?;
    parse_cpus(allowed.trim())
}

/// The CPUs of a list such as `0-3,8` (the kernel's and `taskset`'s form), ascending, each once.
fn parse_cpus(list: &str) -> Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim) {
        let range = match part.split_once('-') {
            Some((first, last)) => first.trim().parse::<usize>()?..=last.trim().parse()?,
            None => {
                let cpu = part.parse::<usize>()?;
                cpu..=cpu
            }
        };
        if range.is_empty() || *range.end() >= 1 << 16 {
            return Err(format!("{part:?} is not a range of CPUs").into());
        }
        cpus.extend(range);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// `cpus` (ascending) as a list, runs of consecutive CPUs as ranges.
fn format_cpus(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut at = 0;
    while at < cpus.len() {
        let mut end = at;
        while end + 1 < cpus.len() && cpus[end + 1] == cpus[end] + 1 {
            end += 1;
        }
        parts.push(if end == at {
            cpus[at].to_string()
        } else {
            format!("{}-{}", cpus[at], cpus[end])
        });
        at = end + 1;
    }
    parts.join(",")
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
            "NIC threads 2, idle policy sleep, niceness -5, not pinned"
        );
        let pinned = parse(&["--nic-cpus", "1"]).unwrap();
        assert_eq!(pinned.daemon_args(), ["--idle", "adaptive", "--cpus", "1"]);
        assert!(
            pinned
                .describe()
                .ends_with("on CPUs 1 (the processes on the others)")
        );
        assert!(parse(&["--nice", "20"]).is_err());
        assert!(parse(&["--idle", "spin"]).is_err());
    }

    #[test]
    fn cpu_lists_read_and_write_as_the_kernel_and_taskset_do() {
        assert_eq!(parse_cpus("0-3,8").unwrap(), [0, 1, 2, 3, 8]);
        assert_eq!(parse_cpus("5, 1,1").unwrap(), [1, 5]);
        for bad in ["", "a", "3-1", "1-", "70000"] {
            assert!(parse_cpus(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_cpus(&[0, 1, 2, 3, 8]), "0-3,8");
        assert_eq!(format_cpus(&[1, 3, 4]), "1,3-4");
        assert_eq!(format_cpus(&[]), "");
    }

    #[test]
    fn the_processes_get_every_cpu_but_the_nics() {
        assert_eq!(parse(&[]).unwrap().process_cpus().unwrap(), None);
        let allowed = allowed_cpus().unwrap();
        let nic = allowed[0].to_string();
        let engine = parse(&["--nic-cpus", &nic]).unwrap();
        if allowed.len() == 1 {
            assert!(engine.process_cpus().is_err(), "no CPU would be left");
        } else {
            assert_eq!(
                engine.process_cpus().unwrap(),
                Some(format_cpus(&allowed[1..]))
            );
            let confined = engine.confine(Command::new("true")).unwrap();
            assert_eq!(confined.get_program(), "taskset");
        }
        let unknown = parse(&["--nic-cpus", "65535"]).unwrap();
        assert!(unknown.process_cpus().is_err());
    }
}
