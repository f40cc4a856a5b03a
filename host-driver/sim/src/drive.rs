//! The campaigns' bounded drive loop: time jumps to the next happening until the workload is
//! done, and a world that goes quiet first, or that runs past a step or virtual-time bound, fails
//! loudly (a hang or a livelock) instead of running for ever.
//!
//! A campaign drives its world as
//!
//! ```text
//! let drive = Drive { max_steps, deadline, unfinished: "messages" };
//! while let Some(happening) = drive.next(done(&programs), &mut world, || stuck(&programs))? {
//!     // handle `happening`
//! }
//! ```

use std::time::Duration;

use super::world::{Happening, World};

/// How long a campaign may run before it counts as livelocked, and what it names as unfinished.
#[derive(Clone, Copy, Debug)]
pub struct Drive {
    /// The most happenings a campaign may process.
    pub max_steps: u64,
    /// The most virtual time a campaign may take.
    pub deadline: Duration,
    /// What the workload does (`"messages"`, `"barriers"`, ...), named when it does not finish.
    pub unfinished: &'static str,
}

impl Drive {
    /// The world's next happening, with time advanced to it; `None` once the workload is `done`.
    ///
    /// `stuck` describes (a few of) the parts still waiting; it is called only on failure.
    ///
    /// # Errors
    /// The world went quiet before the workload was done (a hang), or it ran past
    /// [`Drive::max_steps`] or [`Drive::deadline`] (a livelock); the message says which, when, and
    /// what was still waiting.
    pub fn next(
        &self,
        done: bool,
        world: &mut World,
        stuck: impl FnOnce() -> Vec<String>,
    ) -> Result<Option<Happening>, String> {
        if done {
            return Ok(None);
        }
        let Some(happening) = world.next_happening() else {
            return Err(format!(
                "the world went quiet with {} unfinished (a hang); stuck: {:?}",
                self.unfinished,
                stuck()
            ));
        };
        let elapsed = world.now().saturating_since(firmware::Instant::ZERO);
        if world.steps > self.max_steps || elapsed > self.deadline {
            return Err(format!(
                "no-progress bound hit at {elapsed:?} virtual after {} steps with {} unfinished; \
                 stuck: {:?}",
                world.steps,
                self.unfinished,
                stuck()
            ));
        }
        Ok(Some(happening))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::WireFaults;

    fn drive(max_steps: u64) -> Drive {
        Drive {
            max_steps,
            deadline: Duration::from_secs(1),
            unfinished: "tests",
        }
    }

    fn world() -> World {
        World::new(
            1,
            0,
            firmware::Config::default(),
            WireFaults::NONE,
            Duration::ZERO,
        )
    }

    fn stuck() -> Vec<String> {
        vec!["node 0 port 0".to_owned()]
    }

    #[test]
    fn a_done_workload_stops_and_a_quiet_world_is_a_hang() {
        let mut world = world();
        world.schedule_in(Duration::ZERO, Happening::Action { code: 7 });
        assert!(matches!(drive(10).next(true, &mut world, stuck), Ok(None)));
        assert!(matches!(
            drive(10).next(false, &mut world, stuck),
            Ok(Some(Happening::Action { code: 7 }))
        ));
        let hang = drive(10).next(false, &mut world, stuck).unwrap_err();
        assert!(hang.contains("went quiet with tests unfinished"), "{hang}");
        assert!(hang.contains("node 0 port 0"), "{hang}");
    }

    #[test]
    fn running_past_the_step_or_time_bound_is_a_livelock() {
        let mut world = world();
        for code in 0..3 {
            world.schedule_in(Duration::ZERO, Happening::Action { code });
        }
        let bounded = drive(2);
        assert!(bounded.next(false, &mut world, stuck).unwrap().is_some());
        assert!(bounded.next(false, &mut world, stuck).unwrap().is_some());
        let livelock = bounded.next(false, &mut world, stuck).unwrap_err();
        assert!(
            livelock.contains("after 3 steps with tests unfinished"),
            "{livelock}"
        );

        let mut world = self::world();
        world.schedule_in(Duration::from_secs(2), Happening::Action { code: 0 });
        let late = drive(10).next(false, &mut world, stuck).unwrap_err();
        assert!(
            late.contains("no-progress bound hit at 2s virtual"),
            "{late}"
        );
    }
}
