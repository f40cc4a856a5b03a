//! What a NIC thread does when it has nothing to do: poll, sleep, or choose by the cores free.

use std::fmt;
use std::str::FromStr;

/// A NIC thread's idle policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdlePolicy {
    /// Never sleep: look at the rings, the inboxes and the UDP socket again at once, as firmware
    /// polls its MAC and a DPDK driver its queues. Processes never need to ring the NIC's
    /// doorbell. Costs the thread's core all the time: right when it has a core of its own.
    Poll,
    /// Sleep in `epoll_wait` as soon as there is nothing to do (after the linger time, while
    /// processes sleep too), and let processes ring the doorbell: right when the NIC shares its
    /// cores with the processes.
    Sleep,
    /// Poll while the host has a core to spare for every NIC thread beside one for each process
    /// with a port open on this daemon, sleep otherwise — the rule the Open MPI component uses
    /// to choose whether ranks spin. Decided again as ports open and close.
    #[default]
    Adaptive,
}

impl IdlePolicy {
    /// Whether a NIC thread polls now, with `open_ports` ports open on the daemon, `threads` NIC
    /// threads and `cores` cores the daemon may run on.
    pub fn polls(self, open_ports: usize, threads: usize, cores: usize) -> bool {
        match self {
            Self::Poll => true,
            Self::Sleep => false,
            Self::Adaptive => open_ports.saturating_add(threads) <= cores,
        }
    }
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
/// core left once each NIC's process has one, at least one, at most one per NIC.
pub fn default_threads(units: usize, cores: usize) -> usize {
    cores.saturating_sub(units).clamp(1, units.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_polls_only_with_a_core_per_process_and_per_thread() {
        assert!(IdlePolicy::Adaptive.polls(1, 1, 2));
        assert!(!IdlePolicy::Adaptive.polls(2, 1, 2));
        assert!(IdlePolicy::Adaptive.polls(14, 2, 16));
        assert!(!IdlePolicy::Adaptive.polls(16, 1, 16));
        assert!(IdlePolicy::Poll.polls(64, 4, 2));
        assert!(!IdlePolicy::Sleep.polls(0, 1, 64));
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
        assert_eq!(default_threads(16, 16), 1);
        assert_eq!(default_threads(16, 20), 4);
        assert_eq!(default_threads(2, 64), 2);
        assert_eq!(default_threads(1, 1), 1);
    }
}
