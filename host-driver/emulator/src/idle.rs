//! What a NIC thread does when it has nothing to do: poll, sleep, or choose by the cores free.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// A NIC thread's idle policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdlePolicy {
    /// Never sleep: look at the rings, the inboxes and the UDP socket again at once, as firmware
    /// polls its MAC and a DPDK driver its queues. Processes never need to ring the NIC's
    /// doorbell. Costs the thread's core all the time: right when it has a core of its own.
    Poll,
    /// Sleep in `epoll_wait` once there has been nothing to do for the linger time, and let
    /// processes ring the doorbell: right when the NIC shares its cores with the processes.
    Sleep,
    /// Poll while a port is open and the host has a core to spare for every NIC thread beside
    /// one for each process with a port open on this daemon — the rule by which the Open MPI
    /// component's waiting ranks give their cores away — and no task of the host waits for a core
    /// ([`HostLoad`]: other daemons, spinning processes); sleep otherwise (a daemon nobody uses
    /// costs nothing). Decided again as ports open and close and as the host's load changes.
    #[default]
    Adaptive,
}

impl IdlePolicy {
    /// Whether a NIC thread polls now, with `open_ports` ports open on the daemon, `threads` NIC
    /// threads and `cores` cores the daemon may run on, if the host has no task waiting for a
    /// core (`host_idle_core`).
    pub fn polls(
        self,
        open_ports: usize,
        threads: usize,
        cores: usize,
        host_idle_core: impl FnOnce() -> bool,
    ) -> bool {
        match self {
            Self::Poll => true,
            Self::Sleep => false,
            Self::Adaptive => {
                open_ports > 0 && open_ports.saturating_add(threads) <= cores && host_idle_core()
            }
        }
    }
}

/// How long a look at the host's load stays good while it found a core to spare.
const LOAD_FRESH: Duration = Duration::from_millis(1);
/// How long a thread that found the host's cores all taken keeps sleeping before it looks again
/// (so that threads of several daemons do not all start polling together, again and again).
const LOAD_BACKOFF: Duration = Duration::from_millis(20);

/// The host's load as an adaptive NIC thread sees it: whether every runnable task of the host
/// has a core (the kernel's count of running tasks, `/proc/loadavg`, at most the cores). A
/// polling thread counts itself; other daemons' polling threads and spinning processes count
/// too, so that NICs of several daemons on one host do not starve each other.
#[derive(Debug)]
pub(crate) struct HostLoad {
    cores: usize,
    looked: Option<(Instant, bool)>,
}

impl HostLoad {
    /// The load of a host of `cores` cores, not looked at yet.
    pub(crate) fn new(cores: usize) -> Self {
        Self {
            cores,
            looked: None,
        }
    }

    /// Whether every runnable task has a core, as last seen (looked at again when stale).
    pub(crate) fn spare_core(&mut self, now: Instant) -> bool {
        if let Some((at, spare)) = self.looked {
            let fresh = if spare { LOAD_FRESH } else { LOAD_BACKOFF };
            if now.saturating_duration_since(at) < fresh {
                return spare;
            }
        }
        // A host whose count cannot be read is taken as having a core to spare: the port rule
        // still applies.
        let spare = running_tasks().is_none_or(|running| running <= self.cores);
        self.looked = Some((now, spare));
        spare
    }
}

/// The number of tasks runnable now, from `/proc/loadavg` (`0.01 0.02 0.03 RUNNING/TOTAL PID`).
fn running_tasks() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace()
        .nth(3)?
        .split_once('/')?
        .0
        .parse()
        .ok()
}

impl fmt::Display for IdlePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Poll => "poll",
            Self::Sleep => "sleep",
            Self::Adaptive => "adaptive",
        })
    }
}

impl FromStr for IdlePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "poll" => Ok(Self::Poll),
            "sleep" => Ok(Self::Sleep),
            "adaptive" => Ok(Self::Adaptive),
            other => Err(format!(
                "idle policy `{other}` is none of poll, sleep, adaptive"
            )),
        }
    }
}

/// How many NIC threads a daemon of `units` NICs runs by default on `cores` cores: one per
/// core left once each NIC's process has one, and at least one per eight cores, at most one per
/// NIC.
///
/// The floor is for a daemon with as many NICs as the host has cores: its processes then sleep
/// while they wait (coll/nicbar's rule, and `adaptive`'s), so the NIC threads run on the cores
/// the waiting processes left, and one thread serving every NIC is the bottleneck. On a 16-core
/// host with 16 NICs, `MPI_Barrier` through coll/nicbar took 41.2 µs at 8 processes and 128.9 µs
/// at 16 with one thread, 21.4 and 68.9 µs with two; four were faster at 8 and slower at 16, and
/// slower still where the processes spin (docs/benchmarks.md).
pub fn default_threads(units: usize, cores: usize) -> usize {
    cores
        .saturating_sub(units)
        .max(cores / 8)
        .clamp(1, units.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_polls_only_with_a_core_per_process_and_per_thread() {
        let idle = || true;
        assert!(IdlePolicy::Adaptive.polls(1, 1, 2, idle));
        assert!(!IdlePolicy::Adaptive.polls(2, 1, 2, idle));
        assert!(IdlePolicy::Adaptive.polls(14, 2, 16, idle));
        assert!(!IdlePolicy::Adaptive.polls(16, 1, 16, idle));
        assert!(!IdlePolicy::Adaptive.polls(1, 1, 16, || false));
        assert!(
            !IdlePolicy::Adaptive.polls(0, 1, 16, idle),
            "nothing open: sleep"
        );
        assert!(IdlePolicy::Poll.polls(64, 4, 2, || false));
        assert!(!IdlePolicy::Sleep.polls(0, 1, 64, idle));
    }

    #[test]
    fn the_host_load_is_read_and_kept_for_a_while() {
        assert!(running_tasks().is_some_and(|running| running >= 1));
        let mut load = HostLoad::new(usize::MAX);
        let now = Instant::now();
        assert!(load.spare_core(now));
        let mut busy = HostLoad::new(0);
        assert!(!busy.spare_core(now));
        // Within the back-off the answer stands, whatever the host does meanwhile.
        busy.cores = usize::MAX;
        assert!(!busy.spare_core(now + LOAD_BACKOFF / 2));
        assert!(busy.spare_core(now + LOAD_BACKOFF));
    }

    #[test]
    fn policies_parse_and_print_the_same_words() {
        for policy in [IdlePolicy::Poll, IdlePolicy::Sleep, IdlePolicy::Adaptive] {
            assert_eq!(policy.to_string().parse::<IdlePolicy>(), Ok(policy));
        }
        let error = "spin".parse::<IdlePolicy>().unwrap_err();
        assert!(error.contains("spin") && error.contains("poll"), "{error}");
    }

    #[test]
    fn default_threads_leave_a_core_to_each_process() {
        assert_eq!(default_threads(4, 2), 1);
        assert_eq!(default_threads(16, 8), 1);
        assert_eq!(
            default_threads(16, 16),
            2,
            "a thread per eight cores at least"
        );
        assert_eq!(default_threads(16, 20), 4);
        assert_eq!(default_threads(64, 64), 8);
        assert_eq!(default_threads(3, 16), 3, "at most one per NIC");
        assert_eq!(default_threads(2, 64), 2);
        assert_eq!(default_threads(1, 1), 1);
    }
}
