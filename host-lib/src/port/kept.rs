//! The schedules a port has the NIC keep between barriers ([`ScheduleSource`]).
//!
//! A barrier whose steps are the very ones a slot was given (the same compiled `Arc`: a
//! persistent collective's, or a schedule from the port's cache of compiled ones) names the slot
//! instead of posting its steps again: the host writes no steps and the NIC reads none. The first
//! barrier of a schedule posts it and has the NIC keep it, in a slot nobody's schedule holds any
//! more if there is one, else in the one used longest ago.
//!
//! Each keep gets a tag of its own, and the NIC runs a slot's steps only for a start that names
//! the tag they were kept under: whatever the host believes of a slot that a refused token never
//! filled, or that a reopened port lost, the worst a start can meet is a `BAD_SCHEDULE` refusal,
//! after which the barrier is posted again with its steps ([`KeptSchedules::forget`]).

use std::sync::{Arc, Weak};

use shared_abi::schedule::Step;
use shared_abi::token::{KEPT_SCHEDULES, ScheduleSource};

/// Where a barrier token's steps come from, and the tag of the slot's keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Keeping {
    pub(crate) source: ScheduleSource,
    pub(crate) tag: u64,
}

impl Keeping {
    /// Posted with the token and not kept (GM's raw barrier call).
    pub(crate) const POSTED: Self = Self {
        source: ScheduleSource::POSTED,
        tag: 0,
    };

    /// Whether the token carries the steps in the arena.
    pub(crate) fn posts_steps(self) -> bool {
        self.source.runs_kept().is_none()
    }

    fn slot(self) -> Option<usize> {
        self.source.keeps_in().or(self.source.runs_kept())
    }
}

#[derive(Debug, Default)]
struct Slot {
    /// The schedule given to the slot last; `None` before the first.
    owner: Option<Weak<[Step]>>,
    /// The tag its steps were kept under; 0 when the NIC may not hold them.
    tag: u64,
    /// When a barrier last used it (a count of choices).
    used: u64,
}

impl Slot {
    fn holds(&self, steps: &Arc<[Step]>) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|owner| std::ptr::addr_eq(owner.as_ptr(), Arc::as_ptr(steps)))
    }

    /// How much the slot is worth keeping: none for a schedule nobody holds any more.
    fn worth(&self) -> u64 {
        match &self.owner {
            Some(owner) if owner.strong_count() > 0 => self.used,
            _ => 0,
        }
    }
}

/// The port's kept schedules, by slot (a field of the port's barrier state).
#[derive(Debug, Default)]
pub(crate) struct KeptSchedules {
    slots: [Slot; KEPT_SCHEDULES],
    last_tag: u64,
    choices: u64,
}

impl KeptSchedules {
    /// How the next barrier that runs `steps` gets them: from the slot that keeps them, or posted
    /// and kept.
    pub(crate) fn choose(&mut self, steps: &Arc<[Step]>) -> Keeping {
        self.choices += 1;
        let at = match self.slots.iter().position(|slot| slot.holds(steps)) {
            Some(at) => at,
            None => {
                let at = (0..KEPT_SCHEDULES)
                    .min_by_key(|&at| self.slots[at].worth())
                    .unwrap_or(0);
                self.slots[at].owner = Some(Arc::downgrade(steps));
                self.slots[at].tag = 0;
                at
            }
        };
        let slot = &mut self.slots[at];
        slot.used = self.choices;
        let number = at as u8;
        if slot.tag != 0 {
            return Keeping {
                source: ScheduleSource::kept(number),
                tag: slot.tag,
            };
        }
        self.last_tag += 1;
        slot.tag = self.last_tag;
        Keeping {
            source: ScheduleSource::keep(number),
            tag: slot.tag,
        }
    }

    /// A token that got its steps as `keeping` says was refused, or never posted: the NIC may
    /// not hold the slot's steps, so the next barrier that runs them posts them again.
    pub(crate) fn forget(&mut self, keeping: Keeping) {
        if let Some(slot) = keeping.slot().and_then(|at| self.slots.get_mut(at))
            && slot.tag == keeping.tag
        {
            slot.tag = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_abi::ids::{NodeId, PortId};
    use shared_abi::schedule::StepOp;

    fn schedule(peer: u16) -> Arc<[Step]> {
        Arc::from([Step::new(StepOp::EXCHANGE, NodeId::new(peer), PortId(1), 0)])
    }

    #[test]
    fn a_schedule_is_posted_and_kept_once_then_named() {
        let mut kept = KeptSchedules::default();
        let steps = schedule(1);
        let first = kept.choose(&steps);
        assert!(first.posts_steps());
        assert_eq!(first.source.keeps_in(), Some(0));
        for _ in 0..3 {
            let next = kept.choose(&steps);
            assert!(!next.posts_steps());
            assert_eq!((next.source.runs_kept(), next.tag), (Some(0), first.tag));
        }
        // Equal steps compiled apart are another schedule: another slot.
        let twin = kept.choose(&schedule(1));
        assert_eq!(twin.source.keeps_in(), Some(1));
    }

    #[test]
    fn a_forgotten_keep_is_posted_again_under_a_new_tag() {
        let mut kept = KeptSchedules::default();
        let steps = schedule(1);
        let first = kept.choose(&steps);
        kept.forget(first);
        let again = kept.choose(&steps);
        assert_eq!(again.source.keeps_in(), Some(0));
        assert_ne!(again.tag, first.tag);
        // A refusal of the older keep, seen late, leaves the newer one alone.
        kept.forget(first);
        assert_eq!(kept.choose(&steps).source.runs_kept(), Some(0));
    }

    #[test]
    fn a_new_schedule_takes_a_dropped_one_s_slot_first_then_the_least_recently_used() {
        let mut kept = KeptSchedules::default();
        let held: Vec<Arc<[Step]>> = (0..KEPT_SCHEDULES as u16).map(schedule).collect();
        for steps in &held {
            kept.choose(steps);
        }
        let dropped = schedule(9);
        let slot_of = |k: Keeping| k.source.keeps_in().or(k.source.runs_kept());
        // Every slot is taken: the one used longest ago (slot 0) goes.
        assert_eq!(slot_of(kept.choose(&dropped)), Some(0));
        drop(dropped);
        kept.choose(&held[1]);
        // Slot 0's schedule is gone: a new one takes its place before any held one's.
        assert_eq!(slot_of(kept.choose(&schedule(10))), Some(0));
        assert_eq!(kept.choose(&held[1]).source.runs_kept(), Some(1));
    }
}
