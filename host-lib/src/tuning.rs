//! Measured tuning: the n-way dissemination `n` this machine's measurements predict best for each
//! group size (the self-tuning of Hoefler, Mehlan, Mietke, Rehm, *Fast Barrier Synchronization for
//! InfiniBand*), read from a small text file.
//!
//! `cargo xtask bench rttp --write` measures the 1:P ping-pong, fits Hoefler et al.'s LoP model to
//! it, and writes the file; [`tuned_dissemination_n`] reads it once per process, and
//! [`default_algorithm`] is the schedule compilers' default with it applied (dissemination, the
//! default where the group size is not a power of two, takes the tuned `n`).
//!
//! # Where the file is
//!
//! 1. `$NICBAR_TUNING`, if set: the file's path (`off` or an empty value: no tuning);
//! 2. else `$XDG_CONFIG_HOME/nicbar/tuning` (when `XDG_CONFIG_HOME` is an absolute path);
//! 3. else `$HOME/.config/nicbar/tuning`.
//!
//! No file, an unreadable one, or a malformed one: no tuning, and every caller keeps its default.
//! Every member of a group must choose the same algorithm, so every process of a job must see the
//! same file (one home directory, or `NICBAR_TUNING` set by the launcher for all ranks).
//!
//! # The format
//!
//! ```text
//! # comments and blank lines are ignored
//! nicbar-tuning 1
//! dissemination 2 3 1
//! dissemination 4 16 3
//! ```
//!
//! The first line that is not a comment names the format and its version. Each `dissemination
//! FROM TO N` line says that groups of `FROM..=TO` members use `n = N`; ranges may not overlap.
//! A group size no line covers has no tuned `n`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nicbar_schedule::{Algorithm, MAX_SCHEDULE_STEPS, steps_needed};

/// The environment variable that names the tuning file.
pub const TUNING_ENV: &str = "NICBAR_TUNING";
/// The format line's first word.
pub const FORMAT: &str = "nicbar-tuning";
/// The format's version this library reads and writes.
pub const VERSION: u32 = 1;

/// A group-size range and the dissemination `n` measured best for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DisseminationRange {
    /// The smallest group size of the range.
    pub from: usize,
    /// The largest group size of the range (inclusive).
    pub to: usize,
    /// The `n` for these sizes.
    pub n: u32,
}

/// A tuning file's content.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    /// The dissemination ranges, ascending and disjoint.
    pub dissemination: Vec<DisseminationRange>,
}

/// Why a tuning file was not taken.
#[derive(Debug)]
pub enum TuningError {
    /// The file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not what the format allows.
    Line {
        /// The line number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// No `nicbar-tuning 1` line before the first entry (or at all).
    NoFormatLine,
}

impl fmt::Display for TuningError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            Self::Line { line, reason } => write!(f, "line {line}: {reason}"),
            Self::NoFormatLine => write!(f, "no `{FORMAT} {VERSION}` line before the entries"),
        }
    }
}

impl std::error::Error for TuningError {}

impl Tuning {
    /// Parses a tuning file's text.
    ///
    /// # Errors
    /// [`TuningError::NoFormatLine`] or [`TuningError::Line`] naming the first bad line.
    pub fn parse(text: &str) -> Result<Self, TuningError> {
        let mut tuning = Self::default();
        let mut formatted = false;
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let bad = |reason: String| TuningError::Line { line, reason };
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let words: Vec<&str> = content.split_whitespace().collect();
            if !formatted {
                match words.as_slice() {
                    [FORMAT, version] if *version == VERSION.to_string() => {
                        formatted = true;
                        continue;
                    }
                    [FORMAT, version] => {
                        return Err(bad(format!(
                            "format version {version:?}; this library reads {VERSION}"
                        )));
                    }
                    _ => return Err(TuningError::NoFormatLine),
                }
            }
            match words.as_slice() {
                ["dissemination", from, to, n] => {
                    let number = |word: &str, what: &str| {
                        word.parse::<usize>()
                            .map_err(|_| bad(format!("{what} {word:?} is not a whole number")))
                    };
                    let (from, to, n) =
                        (number(from, "size")?, number(to, "size")?, number(n, "n")?);
                    if from < 2 || to < from {
                        return Err(bad(format!(
                            "sizes {from}..={to}: a range of group sizes of at least 2"
                        )));
                    }
                    if n == 0 || n >= from {
                        return Err(bad(format!(
                            "n = {n} for groups from {from}: n must be 1..={}",
                            from - 1
                        )));
                    }
                    if let Some(other) = tuning
                        .dissemination
                        .iter()
                        .find(|r| from <= r.to && r.from <= to)
                    {
                        return Err(bad(format!(
                            "sizes {from}..={to} overlap {}..={}",
                            other.from, other.to
                        )));
                    }
                    tuning.dissemination.push(DisseminationRange {
                        from,
                        to,
                        n: u32::try_from(n).map_err(|_| bad(format!("n = {n} is too large")))?,
                    });
                }
                [word, ..] => return Err(bad(format!("unknown entry {word:?}"))),
                [] => {}
            }
        }
        if !formatted {
            return Err(TuningError::NoFormatLine);
        }
        tuning.dissemination.sort_by_key(|r| r.from);
        Ok(tuning)
    }

    /// Reads and parses the file at `path`.
    ///
    /// # Errors
    /// As [`Tuning::parse`], or [`TuningError::Read`].
    pub fn load(path: &Path) -> Result<Self, TuningError> {
        let text = std::fs::read_to_string(path).map_err(|source| TuningError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text)
    }

    /// The file's text: the format line, `comment` (each line prefixed with `# `), then one line
    /// per range.
    pub fn to_text(&self, comment: &str) -> String {
        let mut text = String::new();
        for line in comment.lines() {
            text.push_str("# ");
            text.push_str(line);
            text.push('\n');
        }
        text.push_str(&format!("{FORMAT} {VERSION}\n"));
        for range in &self.dissemination {
            text.push_str(&format!(
                "dissemination {} {} {}\n",
                range.from, range.to, range.n
            ));
        }
        text
    }

    /// Builds the ranges from one `n` per group size (`choices[i] = (size, n)`, sizes
    /// ascending): consecutive sizes with the same `n` share a range.
    pub fn from_choices(choices: &[(usize, u32)]) -> Self {
        let mut dissemination: Vec<DisseminationRange> = Vec::new();
        for &(size, n) in choices {
            match dissemination.last_mut() {
                Some(last) if last.n == n && last.to + 1 == size => last.to = size,
                _ => dissemination.push(DisseminationRange {
                    from: size,
                    to: size,
                    n,
                }),
            }
        }
        Self { dissemination }
    }

    /// The default algorithm for a group of `group_len` members with this tuning: the
    /// schedule compilers' default ([`nicbar_schedule::default_for`]), whose dissemination takes
    /// the tuned `n` where the tuning has one. Pairwise exchange, the default at powers of two,
    /// stays.
    pub fn default_algorithm(&self, group_len: usize) -> Algorithm {
        match nicbar_schedule::default_for(group_len) {
            Algorithm::Dissemination { n } => Algorithm::Dissemination {
                n: self
                    .dissemination_n(group_len)
                    .map_or(n, |tuned| tuned as usize),
            },
            other => other,
        }
    }

    /// The tuned `n` for a group of `group_len` members: `None` if no range covers the size, or
    /// if the `n` could not run there (it must be below the size, and the schedule must fit the
    /// NIC's [`MAX_SCHEDULE_STEPS`]).
    pub fn dissemination_n(&self, group_len: usize) -> Option<u32> {
        let range = self
            .dissemination
            .iter()
            .find(|r| (r.from..=r.to).contains(&group_len))?;
        let n = usize::try_from(range.n).ok()?;
        if n == 0 || n >= group_len {
            return None;
        }
        let steps = steps_needed(Algorithm::Dissemination { n }, group_len).ok()?;
        (steps <= MAX_SCHEDULE_STEPS).then_some(range.n)
    }
}

/// The tuning file this process uses, by the rules of the module docs; `None` if tuning is off
/// or no home directory is known.
pub fn tuning_path() -> Option<PathBuf> {
    path_from(|name| std::env::var_os(name))
}

fn path_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    config_file_path(TUNING_ENV, "tuning", var)
}

/// Where nicbar's configuration file `file` is: the path in the environment variable `env_var`
/// if it is set (empty or `off`: no file), else `$XDG_CONFIG_HOME/nicbar/FILE` (an absolute
/// `XDG_CONFIG_HOME` only), else `$HOME/.config/nicbar/FILE`. `var` reads the environment (a test
/// passes its own). The tuning file and the collectives' selection map are found this way.
pub fn config_file_path(
    env_var: &str,
    file: &str,
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    if let Some(value) = var(env_var) {
        if value.is_empty() || value == "off" {
            return None;
        }
        return Some(PathBuf::from(value));
    }
    if let Some(config) = var("XDG_CONFIG_HOME").map(PathBuf::from)
        && config.is_absolute()
    {
        return Some(config.join("nicbar").join(file));
    }
    let home = PathBuf::from(var("HOME")?);
    home.is_absolute()
        .then(|| home.join(".config").join("nicbar").join(file))
}

/// The tuning file's content, read once per process; `None` without a usable file.
fn process_tuning() -> Option<&'static Tuning> {
    static TUNING: OnceLock<Option<Tuning>> = OnceLock::new();
    TUNING
        .get_or_init(|| Tuning::load(&tuning_path()?).ok())
        .as_ref()
}

/// The dissemination `n` measured best on this machine for a group of `group_len` members, from
/// the tuning file (read once per process, see the module docs); `None` without a usable file or
/// a range covering the size.
pub fn tuned_dissemination_n(group_len: usize) -> Option<u32> {
    process_tuning()?.dissemination_n(group_len)
}

/// The default barrier algorithm for a group of `group_len` members: [`Tuning::default_algorithm`]
/// with the tuning file, [`nicbar_schedule::default_for`] without one.
pub fn default_algorithm(group_len: usize) -> Algorithm {
    process_tuning().map_or_else(
        || nicbar_schedule::default_for(group_len),
        |tuning| tuning.default_algorithm(group_len),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "\
# measured by cargo xtask bench rttp
nicbar-tuning 1

dissemination 2 3 1   # small groups
dissemination 4 16 3
dissemination 17 40 2
";

    #[test]
    fn the_documented_example_reads_back() {
        let tuning = Tuning::parse(EXAMPLE).unwrap();
        assert_eq!(tuning.dissemination_n(2), Some(1));
        assert_eq!(tuning.dissemination_n(3), Some(1));
        assert_eq!(tuning.dissemination_n(4), Some(3));
        assert_eq!(tuning.dissemination_n(16), Some(3));
        assert_eq!(tuning.dissemination_n(17), Some(2));
        assert_eq!(tuning.dissemination_n(41), None);
        assert_eq!(tuning.dissemination_n(1), None);
        // What it writes reads back the same.
        let again = Tuning::parse(&tuning.to_text("a comment\nover two lines")).unwrap();
        assert_eq!(again, tuning);
    }

    #[test]
    fn choices_merge_into_ranges() {
        let tuning = Tuning::from_choices(&[(2, 1), (3, 1), (4, 2), (5, 2), (6, 1), (8, 1)]);
        assert_eq!(
            tuning.dissemination,
            [
                DisseminationRange {
                    from: 2,
                    to: 3,
                    n: 1
                },
                DisseminationRange {
                    from: 4,
                    to: 5,
                    n: 2
                },
                DisseminationRange {
                    from: 6,
                    to: 6,
                    n: 1
                },
                DisseminationRange {
                    from: 8,
                    to: 8,
                    n: 1
                },
            ]
        );
        assert_eq!(tuning.dissemination_n(7), None);
    }

    #[test]
    fn malformed_files_are_refused_with_the_line() {
        for (text, line) in [
            ("nicbar-tuning 1\ndissemination 2 3\n", 2),
            ("nicbar-tuning 1\ndissemination 4 3 1\n", 2),
            ("nicbar-tuning 1\ndissemination 3 8 3\n", 2),
            ("nicbar-tuning 1\ndissemination 3 8 0\n", 2),
            ("nicbar-tuning 1\ndissemination 3 8 x\n", 2),
            (
                "nicbar-tuning 1\ndissemination 3 8 1\ndissemination 8 9 2\n",
                3,
            ),
            ("nicbar-tuning 1\nbarrier 3 8 1\n", 2),
            ("nicbar-tuning 2\n", 1),
            (
                "nicbar-tuning 1\ndissemination 2 99999999999999999999999 1\n",
                2,
            ),
        ] {
            match Tuning::parse(text) {
                Err(TuningError::Line { line: got, .. }) => assert_eq!(got, line, "{text:?}"),
                other => panic!("{text:?} gave {other:?}"),
            }
        }
        assert!(matches!(
            Tuning::parse("dissemination 2 3 1\n"),
            Err(TuningError::NoFormatLine)
        ));
        assert!(matches!(
            Tuning::parse("# nothing\n"),
            Err(TuningError::NoFormatLine)
        ));
    }

    #[test]
    fn the_default_takes_the_tuned_n_only_where_it_is_dissemination() {
        let tuning = Tuning::parse(EXAMPLE).unwrap();
        // 6 members: dissemination by default, n = 3 tuned.
        assert_eq!(
            tuning.default_algorithm(6),
            Algorithm::Dissemination { n: 3 }
        );
        // 3 members: n = 1 tuned, as the default.
        assert_eq!(
            tuning.default_algorithm(3),
            Algorithm::Dissemination { n: 1 }
        );
        // 16 members: a power of two, pairwise exchange stays.
        assert_eq!(tuning.default_algorithm(16), Algorithm::PairwiseExchange);
        // 41 members: no range, the plain default.
        assert_eq!(
            tuning.default_algorithm(41),
            nicbar_schedule::default_for(41)
        );
    }

    #[test]
    fn an_n_the_nic_cannot_run_is_not_offered() {
        // 200 members at n = 199: one round of 199 sends and 199 receives, far over the NIC's
        // 128 steps.
        let tuning = Tuning::parse("nicbar-tuning 1\ndissemination 200 200 199\n").unwrap();
        assert_eq!(tuning.dissemination_n(200), None);
    }

    #[test]
    fn the_path_follows_the_documented_order() {
        fn env(
            pairs: &'static [(&'static str, &'static str)],
        ) -> impl Fn(&str) -> Option<std::ffi::OsString> {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        }
        const HOME_ONLY: &[(&str, &str)] = &[("HOME", "/home/u")];
        assert_eq!(
            path_from(env(HOME_ONLY)),
            Some(PathBuf::from("/home/u/.config/nicbar/tuning"))
        );
        const XDG: &[(&str, &str)] = &[("HOME", "/home/u"), ("XDG_CONFIG_HOME", "/cfg")];
        assert_eq!(
            path_from(env(XDG)),
            Some(PathBuf::from("/cfg/nicbar/tuning"))
        );
        const RELATIVE_XDG: &[(&str, &str)] = &[("HOME", "/home/u"), ("XDG_CONFIG_HOME", "cfg")];
        assert_eq!(
            path_from(env(RELATIVE_XDG)),
            Some(PathBuf::from("/home/u/.config/nicbar/tuning"))
        );
        const NAMED: &[(&str, &str)] = &[("HOME", "/home/u"), (TUNING_ENV, "/etc/nicbar-tuning")];
        assert_eq!(
            path_from(env(NAMED)),
            Some(PathBuf::from("/etc/nicbar-tuning"))
        );
        const OFF: &[(&str, &str)] = &[("HOME", "/home/u"), (TUNING_ENV, "off")];
        assert_eq!(path_from(env(OFF)), None);
        assert_eq!(path_from(env(&[])), None);
    }

    #[test]
    fn a_missing_file_is_a_read_error() {
        let error = Tuning::load(Path::new("/nonexistent/nicbar/tuning")).unwrap_err();
        assert!(matches!(error, TuningError::Read { .. }), "{error}");
    }
}
