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
