//! The measured selection map (CollGM's Figures 7, 9 and 11, measured on the machine that runs
//! them): for each collective, communicator size and message size, the algorithm that was
//! fastest there. `cargo xtask tune` measures every algorithm and writes the map; the choice of
//! an algorithm ([`super::select`]; the C API's algorithm 0) takes the map's entry, and the
//! defaults ([`super::Bcast::default_for`] and its kin) where the map has no entry or there is
//! no map.
//!
//! # Where the file is
//!
//! 1. the path the caller names (the component's MCA parameter `coll_nicbar_map`), if any;
//! 2. else `$NICBAR_COLL_MAP`, if set (`off` or an empty value: no map);
//! 3. else `$XDG_CONFIG_HOME/nicbar/coll-map` (when `XDG_CONFIG_HOME` is an absolute path);
//! 4. else `$HOME/.config/nicbar/coll-map`.
//!
//! No file at the default place: no map. A file that cannot be read or is malformed: no map, and
//! the load reports why (naming the line). Every rank of a communicator must choose the same
//! algorithm, so every process of a job must see the same map.
//!
//! # The format
//!
//! ```text
//! # comments and blank lines are ignored
//! nicbar-coll-map 1
//! # collective  processes  bytes        algorithm
//! bcast         2          0-max        linear
//! bcast         3-8        0-4095       binomial
//! bcast         3-8        4096-max     pipeline
//! scatter       2-16       0-max        flat
//! alltoall      4          0-32767      bruck
//! ```
//!
//! The first line that is not a comment names the format and its version. Each entry names a
//! collective (`bcast`, `scatter`, `gather`, `alltoall`, `allreduce`), the communicator sizes
//! (`N` or `N-M`, from 2), the message sizes in bytes (`N-M` or `N-max`: the broadcast's and the
//! allreduce's message, the scatter's, gather's and all-to-all's block per rank) and the
//! algorithm (bcast: `linear`, `binomial`, `binary`, `split-binary`, `pipeline`; scatter and
//! gather: `flat`, `binomial`; alltoall: `linear`, `pairwise`, `bruck`; allreduce:
//! `recursive-doubling`, `rabenseifner`, `ring`). A collective's entries may not overlap.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::algorithm::{Allreduce, Alltoall, Bcast, Choice, Collective, Tree};

/// The environment variable that names the map file.
pub const MAP_ENV: &str = "NICBAR_COLL_MAP";
/// The format line's first word.
pub const FORMAT: &str = "nicbar-coll-map";
/// The format's version this library reads.
pub const VERSION: u32 = 1;

/// The collective a map's entry names by `word`.
fn collective_named(word: &str) -> Option<Collective> {
    Some(match word {
        "bcast" => Collective::Bcast,
        "scatter" => Collective::Scatter,
        "gather" => Collective::Gather,
        "alltoall" => Collective::Alltoall,
        "allreduce" => Collective::Allreduce,
        _ => return None,
    })
}

/// The algorithm names `collective` has in a map.
fn algorithm_names(collective: Collective) -> &'static [&'static str] {
    match collective {
        Collective::Bcast => &[
            "linear",
            "binomial",
            "binary",
            "split-binary",
            "pipeline",
            "nic",
        ],
        Collective::Scatter | Collective::Gather => &["flat", "binomial"],
        Collective::Alltoall => &["linear", "pairwise", "bruck"],
        Collective::Allreduce => &["recursive-doubling", "rabenseifner", "ring"],
    }
}

/// The algorithm of `collective` a map's entry names by `word`.
fn choice_named(collective: Collective, word: &str) -> Option<Choice> {
    Some(match (collective, word) {
        (Collective::Bcast, "linear") => Choice::Bcast(Bcast::Linear),
        (Collective::Bcast, "binomial") => Choice::Bcast(Bcast::Binomial),
        (Collective::Bcast, "binary") => Choice::Bcast(Bcast::Binary),
        (Collective::Bcast, "split-binary") => Choice::Bcast(Bcast::SplitBinary),
        (Collective::Bcast, "pipeline") => Choice::Bcast(Bcast::Pipeline),
        (Collective::Bcast, "nic") => Choice::Bcast(Bcast::Nic),
        (Collective::Scatter | Collective::Gather, "flat") => Choice::Tree(Tree::Flat),
        (Collective::Scatter | Collective::Gather, "binomial") => Choice::Tree(Tree::Binomial),
        (Collective::Alltoall, "linear") => Choice::Alltoall(Alltoall::Linear),
        (Collective::Alltoall, "pairwise") => Choice::Alltoall(Alltoall::Pairwise),
        (Collective::Alltoall, "bruck") => Choice::Alltoall(Alltoall::Bruck),
        (Collective::Allreduce, "recursive-doubling") => {
            Choice::Allreduce(Allreduce::RecursiveDoubling)
        }
        (Collective::Allreduce, "rabenseifner") => Choice::Allreduce(Allreduce::Rabenseifner),
        (Collective::Allreduce, "ring") => Choice::Allreduce(Allreduce::Ring),
        _ => return None,
    })
}

/// One entry: communicator sizes `processes`, message sizes `bytes` (both inclusive), the
/// algorithm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The collective it chooses for.
    pub collective: Collective,
    /// The communicator sizes it covers, inclusive.
    pub processes: (usize, usize),
    /// The message sizes in bytes it covers, inclusive.
    pub bytes: (usize, usize),
    /// The algorithm it chooses.
    pub choice: Choice,
}

/// A map file's content.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CollMap {
    /// The entries, in the file's order (no two of a collective overlap).
    pub entries: Vec<Entry>,
}

/// Why a map file was not taken.
#[derive(Debug)]
pub enum MapError {
    /// The file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A line is not what the format allows.
    Line {
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// No `nicbar-coll-map 1` line before the first entry (or at all).
    NoFormatLine,
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            Self::Line { line, reason } => write!(f, "line {line}: {reason}"),
            Self::NoFormatLine => write!(f, "no `{FORMAT} {VERSION}` line before the entries"),
        }
    }
}

impl std::error::Error for MapError {}

/// `N` or `N-M` (`max` allowed as M when `open`), inclusive.
fn range(word: &str, open: bool) -> Result<(usize, usize), String> {
    let number = |w: &str| {
        if open && w == "max" {
            return Ok(usize::MAX);
        }
        w.parse::<usize>()
            .map_err(|_| format!("{w:?} is not a whole number"))
    };
    let (from, to) = match word.split_once('-') {
        Some((from, to)) => (number(from)?, number(to)?),
        None => {
            let n = number(word)?;
            (n, n)
        }
    };
    if from == usize::MAX || to < from {
        return Err(format!("{word:?} is not a range from low to high"));
    }
    Ok((from, to))
}

impl CollMap {
    /// Parses a map file's text.
    ///
    /// # Errors
    /// [`MapError::NoFormatLine`] or [`MapError::Line`] naming the first bad line.
    pub fn parse(text: &str) -> Result<Self, MapError> {
        let mut map = Self::default();
        let mut formatted = false;
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let bad = |reason: String| MapError::Line { line, reason };
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
                    _ => return Err(MapError::NoFormatLine),
                }
            }
            let [name, processes, bytes, algorithm] = words.as_slice() else {
                return Err(bad(format!(
                    "{} words; an entry is `COLLECTIVE PROCESSES BYTES ALGORITHM`",
                    words.len()
                )));
            };
            let collective = collective_named(name).ok_or_else(|| {
                bad(format!(
                    "unknown collective {name:?} (bcast, scatter, gather, alltoall)"
                ))
            })?;
            let processes = range(processes, false).map_err(|e| bad(format!("processes: {e}")))?;
            if processes.0 < 2 {
                return Err(bad(format!(
                    "processes from {}: a communicator of the map has at least 2",
                    processes.0
                )));
            }
            let bytes = range(bytes, true).map_err(|e| bad(format!("bytes: {e}")))?;
            let choice = choice_named(collective, algorithm).ok_or_else(|| {
                bad(format!(
                    "{name} has no algorithm {algorithm:?} ({})",
                    algorithm_names(collective).join(", ")
                ))
            })?;
            if let Some(other) = map.entries.iter().find(|e| {
                e.collective == collective
                    && processes.0 <= e.processes.1
                    && e.processes.0 <= processes.1
                    && bytes.0 <= e.bytes.1
                    && e.bytes.0 <= bytes.1
            }) {
                return Err(bad(format!(
                    "overlaps the earlier entry for processes {}-{} and bytes {}-{}",
                    other.processes.0,
                    other.processes.1,
                    other.bytes.0,
                    if other.bytes.1 == usize::MAX {
                        "max".to_owned()
                    } else {
                        other.bytes.1.to_string()
                    }
                )));
            }
            map.entries.push(Entry {
                collective,
                processes,
                bytes,
                choice,
            });
        }
        if !formatted {
            return Err(MapError::NoFormatLine);
        }
        Ok(map)
    }

    /// Reads and parses the file at `path`.
    ///
    /// # Errors
    /// As [`CollMap::parse`], or [`MapError::Read`].
    pub fn load(path: &Path) -> Result<Self, MapError> {
        let text = std::fs::read_to_string(path).map_err(|source| MapError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text)
    }

    /// The map's algorithm for `collective` on `processes` ranks and `bytes`, if an entry
    /// covers them.
    pub fn choose(&self, collective: Collective, processes: usize, bytes: usize) -> Option<Choice> {
        self.entries
            .iter()
            .find(|e| {
                e.collective == collective
                    && (e.processes.0..=e.processes.1).contains(&processes)
                    && (e.bytes.0..=e.bytes.1).contains(&bytes)
            })
            .map(|e| e.choice)
    }
}

/// The map file at the default place (see the module docs): `None` when `$NICBAR_COLL_MAP` is
/// `off` or empty, or no home directory is known.
pub fn default_path() -> Option<PathBuf> {
    path_from(|name| std::env::var_os(name))
}

fn path_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    crate::tuning::config_file_path(MAP_ENV, "coll-map", var)
}

/// The map a process uses, and what it was loaded from (for the component's verbose output).
#[derive(Debug)]
pub struct Loaded {
    /// The map, if one was read.
    pub map: Option<CollMap>,
    /// A sentence saying what was loaded, or why not.
    pub description: String,
}

/// What [`load`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadOutcome {
    /// A map was read.
    Loaded,
    /// No map (none at the default place, or switched off): the defaults serve.
    None,
    /// The file was unreadable or malformed: the defaults serve.
    Refused,
}

static PROCESS_MAP: Mutex<Option<Arc<Loaded>>> = Mutex::new(None);

/// Loads the process's map from `path`, or from the default place when `path` is `None`, and
/// uses it from now on; returns the outcome and a sentence saying what was loaded or why not.
pub fn load(path: Option<&Path>) -> (LoadOutcome, String) {
    let (outcome, loaded) = read(path);
    let description = loaded.description.clone();
    if let Ok(mut map) = PROCESS_MAP.lock() {
        *map = Some(Arc::new(loaded));
    }
    (outcome, description)
}

fn read(path: Option<&Path>) -> (LoadOutcome, Loaded) {
    if path.is_some_and(|p| p == Path::new("off")) {
        return (
            LoadOutcome::None,
            Loaded {
                map: None,
                description: "no selection map (switched off): the defaults serve".into(),
            },
        );
    }
    let named = path.is_some();
    let Some(path) = path.map(Path::to_path_buf).or_else(default_path) else {
        return (
            LoadOutcome::None,
            Loaded {
                map: None,
                description: format!("no selection map ({MAP_ENV} is off): the defaults serve"),
            },
        );
    };
    if !named && !path.exists() {
        return (
            LoadOutcome::None,
            Loaded {
                map: None,
                description: format!("no selection map at {}: the defaults serve", path.display()),
            },
        );
    }
    match CollMap::load(&path) {
        Ok(map) => {
            let description = format!(
                "selection map {} ({} entries; the defaults where none applies)",
                path.display(),
                map.entries.len()
            );
            (
                LoadOutcome::Loaded,
                Loaded {
                    map: Some(map),
                    description,
                },
            )
        }
        Err(MapError::Read { source, .. }) => (
            LoadOutcome::Refused,
            Loaded {
                map: None,
                description: format!(
                    "selection map {} not read ({source}): the defaults serve",
                    path.display()
                ),
            },
        ),
        Err(error) => (
            LoadOutcome::Refused,
            Loaded {
                map: None,
                description: format!(
                    "selection map {} refused, {error}: the defaults serve",
                    path.display()
                ),
            },
        ),
    }
}

/// The process's map: the one [`load`] set, else the default place's, read once.
pub fn current() -> Arc<Loaded> {
    let Ok(mut map) = PROCESS_MAP.lock() else {
        return Arc::new(Loaded {
            map: None,
            description: "no selection map".into(),
        });
    };
    map.get_or_insert_with(|| Arc::new(read(None).1)).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module docs' example.
    const EXAMPLE: &str = "\
# comments and blank lines are ignored
nicbar-coll-map 1
# collective  processes  bytes        algorithm
bcast         2          0-max        linear
bcast         3-8        0-4095       binomial
bcast         3-8        4096-max     pipeline
scatter       2-16       0-max        flat

alltoall      4          0-32767      bruck   # small blocks
";

    #[test]
    fn the_documented_example_reads() {
        let map = CollMap::parse(EXAMPLE).unwrap();
        assert_eq!(map.entries.len(), 5);
        let bcast = |p, b| map.choose(Collective::Bcast, p, b);
        assert_eq!(bcast(2, 1 << 30), Some(Choice::Bcast(Bcast::Linear)));
        assert_eq!(bcast(3, 0), Some(Choice::Bcast(Bcast::Binomial)));
        assert_eq!(bcast(8, 4095), Some(Choice::Bcast(Bcast::Binomial)));
        assert_eq!(bcast(8, 4096), Some(Choice::Bcast(Bcast::Pipeline)));
        assert_eq!(bcast(8, usize::MAX), Some(Choice::Bcast(Bcast::Pipeline)));
        assert_eq!(bcast(9, 8), None);
        assert_eq!(
            map.choose(Collective::Scatter, 16, 8),
            Some(Choice::Tree(Tree::Flat))
        );
        // Scatter's entry is not gather's.
        assert_eq!(map.choose(Collective::Gather, 16, 8), None);
        assert_eq!(
            map.choose(Collective::Alltoall, 4, 32767),
            Some(Choice::Alltoall(Alltoall::Bruck))
        );
        assert_eq!(map.choose(Collective::Alltoall, 4, 32768), None);
        assert_eq!(map.choose(Collective::Alltoall, 5, 8), None);
    }

    /// What `cargo xtask tune` writes (its own test writes the same text).
    const WRITTEN: &str = "\
# measured by cargo xtask tune
nicbar-coll-map 1
bcast 2-3 0-65535 linear
bcast 2-3 65536-max binomial
bcast 4-4 0-max binomial
gather 4-4 0-max flat
alltoall 8-8 0-511 linear
alltoall 8-8 512-max pairwise
";

    #[test]
    fn what_the_tuner_writes_reads() {
        let map = CollMap::parse(WRITTEN).unwrap();
        assert_eq!(
            map.choose(Collective::Bcast, 3, 65535),
            Some(Choice::Bcast(Bcast::Linear))
        );
        assert_eq!(
            map.choose(Collective::Bcast, 3, 65536),
            Some(Choice::Bcast(Bcast::Binomial))
        );
        assert_eq!(map.choose(Collective::Bcast, 5, 8), None);
        assert_eq!(
            map.choose(Collective::Alltoall, 8, 512),
            Some(Choice::Alltoall(Alltoall::Pairwise))
        );
    }

    #[test]
    fn malformed_files_are_refused_with_the_line() {
        for (text, line) in [
            // Too few words.
            ("nicbar-coll-map 1\nbcast 2 0-max\n", 2),
            // Too many.
            ("nicbar-coll-map 1\nbcast 2 0-max linear binomial\n", 2),
            // An unknown collective.
            ("nicbar-coll-map 1\nreduce 2 0-max linear\n", 2),
            // An algorithm of another collective.
            ("nicbar-coll-map 1\nscatter 2 0-max pipeline\n", 2),
            ("nicbar-coll-map 1\nbcast 2 0-max bruck\n", 2),
            // Processes: not a number, below 2, backwards, open.
            ("nicbar-coll-map 1\nbcast x 0-max linear\n", 2),
            ("nicbar-coll-map 1\nbcast 1 0-max linear\n", 2),
            ("nicbar-coll-map 1\nbcast 8-4 0-max linear\n", 2),
            ("nicbar-coll-map 1\nbcast 2-max 0-max linear\n", 2),
            // Bytes: backwards, not a number, too large, max as the start.
            ("nicbar-coll-map 1\nbcast 2 9-8 linear\n", 2),
            ("nicbar-coll-map 1\nbcast 2 8-1k linear\n", 2),
            (
                "nicbar-coll-map 1\nbcast 2 0-99999999999999999999999 linear\n",
                2,
            ),
            ("nicbar-coll-map 1\nbcast 2 max-max linear\n", 2),
            // Overlapping entries of one collective.
            (
                "nicbar-coll-map 1\nbcast 2-4 0-100 linear\nbcast 4-8 100-200 binomial\n",
                3,
            ),
            // A wrong version.
            ("nicbar-coll-map 2\nbcast 2 0-max linear\n", 1),
        ] {
            match CollMap::parse(text) {
                Err(MapError::Line { line: got, reason }) => {
                    assert_eq!(got, line, "{text:?}: {reason}");
                }
                other => panic!("{text:?} gave {other:?}"),
            }
        }
        // The same ranges for two collectives do not overlap.
        assert!(
            CollMap::parse("nicbar-coll-map 1\nscatter 2 0-max flat\ngather 2 0-max flat\n")
                .is_ok()
        );
        assert!(matches!(
            CollMap::parse("bcast 2 0-max linear\n"),
            Err(MapError::NoFormatLine)
        ));
        assert!(matches!(
            CollMap::parse("# nothing\n"),
            Err(MapError::NoFormatLine)
        ));
    }

    #[test]
    fn the_error_names_the_line() {
        let error = CollMap::parse("nicbar-coll-map 1\n\nbcast 2 0-max fastest\n").unwrap_err();
        let text = error.to_string();
        assert!(text.starts_with("line 3:"), "{text}");
        assert!(text.contains("fastest"), "{text}");
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
            Some(PathBuf::from("/home/u/.config/nicbar/coll-map"))
        );
        const XDG: &[(&str, &str)] = &[("HOME", "/home/u"), ("XDG_CONFIG_HOME", "/cfg")];
        assert_eq!(
            path_from(env(XDG)),
            Some(PathBuf::from("/cfg/nicbar/coll-map"))
        );
        const NAMED: &[(&str, &str)] = &[("HOME", "/home/u"), (MAP_ENV, "/etc/coll-map")];
        assert_eq!(path_from(env(NAMED)), Some(PathBuf::from("/etc/coll-map")));
        const OFF: &[(&str, &str)] = &[("HOME", "/home/u"), (MAP_ENV, "off")];
        assert_eq!(path_from(env(OFF)), None);
        assert_eq!(path_from(env(&[])), None);
    }

    #[test]
    fn off_is_no_map() {
        let (outcome, loaded) = read(Some(Path::new("off")));
        assert_eq!(outcome, LoadOutcome::None);
        assert!(loaded.map.is_none());
    }

    #[test]
    fn a_named_file_that_is_missing_is_refused() {
        let (outcome, loaded) = read(Some(Path::new("/nonexistent/nicbar/coll-map")));
        assert_eq!(outcome, LoadOutcome::Refused);
        assert!(loaded.map.is_none());
        assert!(
            loaded.description.contains("not read"),
            "{:?}",
            loaded.description
        );
    }
}
