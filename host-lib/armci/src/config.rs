//! How the synchronisation operations run: each of Saify's optimisations beside the baseline it
//! replaced, chosen per job (every rank must choose alike).
//!
//! The environment names them for programs that cannot pass a [`Config`] (C programs, `mpirun`):
//! `NICBAR_ARMCI_FENCE` (`sequential`, `outstanding:K`, `completions`), `NICBAR_ARMCI_BARRIER`
//! (`fence`, `fused`), `NICBAR_ARMCI_LOCK` (`ticket`, `mcs`) and `NICBAR_ARMCI_SEED` (a number).

use std::fmt;
use std::time::Duration;

/// How [`crate::Armci::all_fence`] waits for the puts issued since the last fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceMode {
    /// The baseline (thesis §3.1.1): one acknowledgement request to one server at a time, in the
    /// order of the server list, each waited for before the next is sent.
    Sequential,
    /// Thesis §3.1.2: acknowledgement requests to `k` servers at once, waited for together, then
    /// the next `k`; the servers in an order shuffled by each process, so that the clients do not
    /// all ask the same server first.
    Outstanding(usize),
    /// No request at all: wait for the NIC's own remote-completion report of every put (the NIC
    /// acknowledges a put once its bytes are in the target's memory, which GM did not).
    Completions,
}

/// How [`crate::Armci::barrier`] makes every put of every process complete before any process
/// leaves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierMode {
    /// The baseline (thesis §4.1): [`crate::Armci::all_fence`], then the NIC's barrier.
    FenceThenBarrier,
    /// Thesis §4.2-4.3: per-pair operation counters. Each process sums, by a pairwise exchange,
    /// how many puts every process issued to each target; each target waits until its counter of
    /// applied puts reaches its sum; then the NIC's pairwise-exchange barrier. 2·log2 N messages,
    /// none of them a round trip to a server.
    Fused,
}

/// How ARMCI's mutexes (and the lock behind [`crate::Armci::acc`]) are built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// The baseline (thesis §5.1.2-5.1.3): a ticket from a fetch-and-add on the lock owner's
    /// counter, then polling the owner's now-serving counter until it shows the ticket. Every
    /// waiter's poll is a round trip to the owner's NIC.
    Ticket,
    /// Thesis §5.2.2: the MCS software queue lock. A swap on the owner's tail word enqueues; a
    /// waiter links itself behind its predecessor and waits on a flag in its own memory, which
    /// the predecessor clears at release (compare-and-swap when it seems to be last).
    Mcs,
}

/// The choices of one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// How [`crate::Armci::all_fence`] runs.
    pub fence: FenceMode,
    /// How [`crate::Armci::barrier`] runs.
    pub barrier: BarrierMode,
    /// How the mutexes run.
    pub lock: LockMode,
    /// The seed of the fence's server order (each rank adds its rank).
    pub seed: u64,
    /// How long a collective call (malloc, free, barrier) waits for a peer before it fails.
    pub collective_timeout: Duration,
}

impl Default for Config {
    /// The optimisations: K = 8 outstanding requests, the fused barrier, the MCS lock.
    fn default() -> Self {
        Self {
            fence: FenceMode::Outstanding(8),
            barrier: BarrierMode::Fused,
            lock: LockMode::Mcs,
            seed: 4,
            collective_timeout: Duration::from_secs(60),
        }
    }
}

/// A value of one of the environment variables that does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The variable.
    pub variable: &'static str,
    /// Its value.
    pub value: String,
    /// The values it takes.
    pub expected: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?} is not one of {}",
            self.variable, self.value, self.expected
        )
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// The default configuration with what the environment sets instead.
    ///
    /// # Errors
    /// A variable whose value does not parse.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The default configuration with what `lookup` gives for each variable instead.
    ///
    /// # Errors
    /// A value that does not parse.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        if let Some(value) = lookup("NICBAR_ARMCI_FENCE") {
            config.fence = parse_fence(&value).ok_or(ConfigError {
                variable: "NICBAR_ARMCI_FENCE",
                value,
                expected: "sequential, outstanding:K (K >= 1), completions",
            })?;
        }
        if let Some(value) = lookup("NICBAR_ARMCI_BARRIER") {
            config.barrier = match value.as_str() {
                "fence" => BarrierMode::FenceThenBarrier,
                "fused" => BarrierMode::Fused,
                _ => {
                    return Err(ConfigError {
                        variable: "NICBAR_ARMCI_BARRIER",
                        value,
                        expected: "fence, fused",
                    });
                }
            };
        }
        if let Some(value) = lookup("NICBAR_ARMCI_LOCK") {
            config.lock = match value.as_str() {
                "ticket" => LockMode::Ticket,
                "mcs" => LockMode::Mcs,
                _ => {
                    return Err(ConfigError {
                        variable: "NICBAR_ARMCI_LOCK",
                        value,
                        expected: "ticket, mcs",
                    });
                }
            };
        }
        if let Some(value) = lookup("NICBAR_ARMCI_SEED") {
            config.seed = value.parse().map_err(|_| ConfigError {
                variable: "NICBAR_ARMCI_SEED",
                value,
                expected: "a number",
            })?;
        }
        Ok(config)
    }

    /// The environment variables that select this configuration, for a launcher to pass on.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let fence = match self.fence {
            FenceMode::Sequential => "sequential".to_owned(),
            FenceMode::Outstanding(k) => format!("outstanding:{k}"),
            FenceMode::Completions => "completions".to_owned(),
        };
        let barrier = match self.barrier {
            BarrierMode::FenceThenBarrier => "fence",
            BarrierMode::Fused => "fused",
        };
        let lock = match self.lock {
            LockMode::Ticket => "ticket",
            LockMode::Mcs => "mcs",
        };
        vec![
            ("NICBAR_ARMCI_FENCE", fence),
            ("NICBAR_ARMCI_BARRIER", barrier.to_owned()),
            ("NICBAR_ARMCI_LOCK", lock.to_owned()),
            ("NICBAR_ARMCI_SEED", self.seed.to_string()),
        ]
    }
}

fn parse_fence(value: &str) -> Option<FenceMode> {
    match value {
        "sequential" => Some(FenceMode::Sequential),
        "completions" => Some(FenceMode::Completions),
        _ => {
            let k: usize = value.strip_prefix("outstanding:")?.parse().ok()?;
            (k >= 1).then_some(FenceMode::Outstanding(k))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_round_trips_and_bad_values_are_named() {
        let config = Config {
            fence: FenceMode::Outstanding(3),
            barrier: BarrierMode::FenceThenBarrier,
            lock: LockMode::Ticket,
            seed: 99,
            ..Config::default()
        };
        let env = config.to_env();
        let back = Config::from_lookup(|name| {
            env.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, v)| v.clone())
        })
        .unwrap();
        assert_eq!(back, config);
        let bad = Config::from_lookup(|name| {
            (name == "NICBAR_ARMCI_FENCE").then(|| "outstanding:0".to_owned())
        })
        .unwrap_err();
        assert_eq!(bad.variable, "NICBAR_ARMCI_FENCE");
        assert!(bad.to_string().contains("outstanding:0"));
        assert_eq!(Config::from_lookup(|_| None).unwrap(), Config::default());
    }
}
