//! Installing what a task needs from Debian's packages, saying what it runs.
//!
//! Tasks install only on Debian 12 (bookworm), the system the project's machines run; elsewhere
//! they say what to install by hand. Installing needs root, or sudo without a password.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Result;
use crate::command::{run, show};

/// An apt suite to install from, with the source entry added when none names it.
pub(crate) struct Suite {
    /// The suite's name (`-t` of `apt-get install`).
    pub(crate) name: &'static str,
    /// Where the entry is written when missing.
    pub(crate) source_file: &'static str,
    /// The entry (deb822 format).
    pub(crate) entry: &'static str,
}

/// Debian 12's backports.
pub(crate) const BOOKWORM_BACKPORTS: Suite = Suite {
    name: "bookworm-backports",
    source_file: "/etc/apt/sources.list.d/bookworm-backports.sources",
    entry: "Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
",
};

/// Installs `packages` (`what` names them for messages), from `suite` if given: checks that this
/// is Debian 12, adds the suite's source if missing, runs `apt-get update` and
/// `apt-get install -y --no-install-recommends`.
///
/// # Errors
/// Not Debian 12, no way to become root, or apt failed; the message says what to do by hand.
pub(crate) fn install(packages: &[&str], suite: Option<Suite>, what: &str) -> Result<()> {
    let by_hand = format!(
        "apt-get install{} {}",
        suite
            .as_ref()
            .map_or_else(String::new, |suite| format!(" -t {}", suite.name)),
        packages.join(" ")
    );
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let codename = os_release
        .lines()
        .find_map(|line| line.strip_prefix("VERSION_CODENAME="))
        .map(|value| value.trim_matches('"').to_owned())
        .unwrap_or_default();
    if codename != "bookworm" {
        return Err(format!(
            "{what} is not installed, and this machine is not Debian 12 \
             (VERSION_CODENAME={codename:?}), the only system this task installs it on: install \
             it ({by_hand}) and run it again"
        )
        .into());
    }
    let privileged = privilege_prefix(what, &by_hand)?;
    if let Some(suite) = suite.as_ref() {
        if suite_configured(suite.name) {
            println!("apt source: {} is configured", suite.name);
        } else {
            println!("apt source: adding {}:\n{}", suite.source_file, suite.entry);
            write_as_root(&privileged, Path::new(suite.source_file), suite.entry)?;
        }
    }
    run(&mut as_root(&privileged, "apt-get", &["update"]))?;
    let mut arguments = vec!["install", "-y", "--no-install-recommends"];
    if let Some(suite) = suite.as_ref() {
        arguments.extend(["-t", suite.name]);
    }
    arguments.extend(packages);
    run(as_root(&privileged, "apt-get", &arguments).env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Empty when this process is root, `["sudo", "-n"]` when sudo can be used without a password.
fn privilege_prefix(what: &str, by_hand: &str) -> Result<Vec<&'static str>> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .unwrap_or("");
    if uid == "0" {
        return Ok(Vec::new());
    }
    let sudo = Command::new("sudo").args(["-n", "true"]).output();
    if sudo.is_ok_and(|output| output.status.success()) {
        return Ok(vec!["sudo", "-n"]);
    }
    Err(format!(
        "installing {what} needs root (this is uid {uid}, and sudo -n does not work): run as \
         root, or install it yourself ({by_hand})"
    )
    .into())
}

fn as_root(prefix: &[&str], program: &str, args: &[&str]) -> Command {
    let mut command = match prefix.split_first() {
        Some((first, rest)) => {
            let mut command = Command::new(first);
            command.args(rest).arg(program);
            command
        }
        None => Command::new(program),
    };
    command.args(args);
    command
}

fn write_as_root(prefix: &[&str], path: &Path, contents: &str) -> Result<()> {
    if prefix.is_empty() {
        return std::fs::write(path, contents)
            .map_err(|error| format!("writing {}: {error}", path.display()).into());
    }
    let mut command = as_root(prefix, "tee", &[&path.to_string_lossy()]);
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|error| format!("running {}: {error}", show(&command)))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(contents.as_bytes())?;
    }
    let status = child.wait()?;
    if !status.success() {
        return Err(format!("writing {} failed: {status}", path.display()).into());
    }
    Ok(())
}

/// Whether an apt source line or entry names `suite`.
fn suite_configured(suite: &str) -> bool {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        files.extend(entries.flatten().map(|entry| entry.path()).filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "list" || ext == "sources")
        }));
    }
    files.iter().any(|file| {
        std::fs::read_to_string(file).is_ok_and(|text| {
            text.lines()
                .filter(|line| !line.trim_start().starts_with('#'))
                .any(|line| line.contains(suite))
        })
    })
}
