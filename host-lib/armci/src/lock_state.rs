//! What a rank keeps of its locks: which it holds, and where the mutexes' words are. The
//! [`Armci`](crate::Armci) holds this state; the lock algorithms that use it are in
//! [`crate::lock`].

use std::collections::HashMap;

use nicbar::MemoryRegion;

/// Which lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum LockName {
    /// The lock that serialises accumulates into `rank`'s memory.
    Accumulate(usize),
    /// Mutex `mutex` of `rank`.
    Mutex { mutex: usize, rank: usize },
}

/// The mutexes of [`Armci::create_mutexes`](crate::Armci::create_mutexes): this rank's region
/// and every rank's key and count.
#[derive(Debug)]
pub(crate) struct Mutexes {
    /// This rank's lock words and queue nodes.
    pub(crate) region: MemoryRegion,
    /// Every rank's key of its region.
    pub(crate) keys: Vec<u32>,
    /// How many mutexes each rank created.
    pub(crate) counts: Vec<usize>,
    /// The global number of each rank's first mutex.
    pub(crate) first: Vec<usize>,
}

/// The locks this rank holds and its count of acquisitions.
#[derive(Debug, Default)]
pub(crate) struct LockState {
    /// The locks held, each with the tag of its acquisition.
    pub(crate) held: HashMap<LockName, u64>,
    /// Acquisitions so far.
    pub(crate) sequence: u64,
}
