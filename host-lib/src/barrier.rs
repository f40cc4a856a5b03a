//! Barriers: the NIC-based barrier at GM's level and at a group's, and the host-based baseline
//! that runs the very same schedule over ordinary messages.
//!
//! # Three levels
//!
//! - **GM's calls** (paper §5.2), which the C API wraps one to one:
//!   [`Port::provide_barrier_buffer`] hands the NIC the receive token one barrier's end needs, and
//!   [`Port::barrier_send`] writes a compiled schedule into the arena and posts the barrier send
//!   token. The end comes out of [`Port::receive`] as [`Event::BarrierCompleted`] or
//!   [`Event::BarrierFailed`]. One barrier runs at a time per port; the NIC refuses a second
//!   one with `BARRIER_BUSY`.
//! - **Groups**: a [`Group`] lists its members (ports of NICs) by rank; [`Port::barrier`] finds
//!   this port's rank in it, compiles the group's algorithm for that rank, and waits for the end.
//!   [`Port::barrier_start`] / [`Port::barrier_test`] / [`Port::barrier_wait`] are the fuzzy
//!   barrier (Gupta, paper §1): start, compute, then test or wait. Events that arrive meanwhile
//!   are kept, in order, for the next [`Port::receive`].
//! - **The host-based baseline**: [`Port::host_barrier`] runs the schedule the NIC would run on
//!   the host instead, over small messages between the ports, so that NIC-based against
//!   host-based is the comparison of the paper's §6 with everything else equal.
//!
//! # The host-based barrier's messages
//!
//! A message says "round `r` of the sender's barrier"; the receiver counts them per (sender,
//! round), with room for the next barrier's as the NIC's unexpected-barrier record has (a peer is
//! at most one barrier ahead of any member it shares a barrier with). They travel as data messages
//! of size class [`HOST_BARRIER_SIZE`] and priority [`HOST_BARRIER_PRIORITY`], which are
//! **reserved** on ports that run host-based barriers: the port keeps receive buffers of that class
//! provided from its first host-based barrier on, and re-provides each as soon as its message is
//! counted (in any call that takes events: [`Port::receive`] too). Do not provide buffers of that
//! class and priority yourself, and do not send such messages to those ports: a message of yours
//! that lands in one of the barrier's buffers is handed to you as an ordinary
//! [`Event::Received`], but one of the barrier's messages landing in your buffer stalls a barrier
//! until its timeout.
//!
//! A send refused because the target port is not open (yet) or had no buffer is sent again every
//! [`HOST_RETRY_INTERVAL`] until the barrier's deadline, as the NIC does for barrier packets
//! (paper §3.2).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nicbar_schedule::{self, Algorithm, Member, ScheduleError};
use shared_abi::event::Status;
use shared_abi::ids::{NodeId, PortId};
use shared_abi::max_length_for_size;
use shared_abi::schedule::{Step, StepOp};
use shared_abi::token::{Priority, SendKind};
use zerocopy::IntoBytes;

use crate::dma::DmaBuffer;
use crate::error::Error;
use crate::event::Event;
use crate::port::Port;

/// Size class of the host-based barrier's messages (8-byte messages), reserved with
/// [`HOST_BARRIER_PRIORITY`] on ports that run host-based barriers (see the module docs).
pub const HOST_BARRIER_SIZE: u8 = 4;
/// Priority of the host-based barrier's messages.
pub const HOST_BARRIER_PRIORITY: Priority = Priority::HIGH;
/// How often the host-based barrier sends again a message its target refused (the NIC's retry
/// interval for barrier packets).
pub const HOST_RETRY_INTERVAL: Duration = Duration::from_micros(500);
/// The host-based barrier's timeout when the options give none (the NIC's default).
pub const DEFAULT_HOST_TIMEOUT: Duration = Duration::from_secs(30);

/// The first bytes of a host-based barrier message.
const HOST_MAGIC: [u8; 4] = *b"NBhb";
/// A host-based barrier message: the magic, the round, three reserved bytes.
const HOST_MESSAGE_LENGTH: usize = 8;
/// The tag of the host-based barrier's receive buffers (for `nicctl status` readers; the port
/// tells its buffers by their arena offsets).
const HOST_TAG: u32 = u32::from_le_bytes(HOST_MAGIC);
/// Most receive buffers the host-based barrier keeps provided.
const MAX_HOST_BUFFERS: usize = 32;
/// How long past its own timeout a NIC-based barrier may go unreported before
/// [`Port::barrier_wait`] gives up on the NIC ([`BarrierError::NoReport`]).
const REPORT_GRACE: Duration = Duration::from_secs(2);
/// High bits of the contexts of barriers started by [`Port::barrier_start`].
const GROUP_CONTEXT: u64 = 0x4e42_6261_0000_0000;
/// How many times a barrier refused as busy (its barrier buffer not yet taken by the NIC: it
/// waits in the receive ring behind buffers the NIC has no room for) is posted again before the
/// refusal is reported.
const MAX_REPOSTS: u32 = 200;
/// The first wait before a barrier refused as busy is posted again; it doubles with each refusal
/// up to 64 times this.
const REPOST_BACKOFF: Duration = Duration::from_micros(20);

// ---------------------------------------------------------------------------------------------
// Groups and options.

/// How a group's barrier runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarrierOptions {
    /// The algorithm the schedule is compiled from (default: [`nicbar_schedule::default_for`] the group's
    /// size).
    pub algorithm: Algorithm,
    /// Fail the barrier if it has not completed after this long; `None` for the NIC's default
    /// (30 s unless the daemon is configured otherwise; [`DEFAULT_HOST_TIMEOUT`] for
    /// [`Port::host_barrier`]).
    pub timeout: Option<Duration>,
}

impl BarrierOptions {
    /// The defaults for a group of `members`: [`nicbar_schedule::default_for`], and the NIC's timeout.
    pub const fn for_members(members: usize) -> Self {
        Self {
            algorithm: nicbar_schedule::default_for(members),
            timeout: None,
        }
    }

    /// These options with `algorithm`.
    #[must_use]
    pub const fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// These options with a `timeout`.
    #[must_use]
    pub const fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// The token's `timeout_us`: 0 for the NIC's default, else at least 1 µs.
fn timeout_us(timeout: Option<Duration>) -> u32 {
    timeout.map_or(0, |timeout| {
        u32::try_from(timeout.as_micros())
            .unwrap_or(u32::MAX)
            .max(1)
    })
}

/// The members of a barrier, by rank: ports of NICs, each at most once. Every member builds the
/// same group (the same members in the same order) and the same options; each finds its own rank
/// from its port. Cloning is cheap (the member list is shared).
#[derive(Clone, Debug)]
pub struct Group {
    members: Arc<[Member]>,
    options: BarrierOptions,
}

impl Group {
    /// The group of `members`, rank `i` being the `i`-th, with [`BarrierOptions::for_members`].
    ///
    /// # Errors
    /// [`GroupError`]: no members, a port out of range, or a member named twice.
    pub fn new(members: impl IntoIterator<Item = Member>) -> Result<Self, GroupError> {
        let members: Arc<[Member]> = members.into_iter().collect();
        if members.is_empty() {
            return Err(GroupError::Empty);
        }
        let mut seen = HashMap::with_capacity(members.len());
        for (rank, member) in members.iter().enumerate() {
            if member.port.index().is_none() {
                return Err(GroupError::PortOutOfRange {
                    rank,
                    port: member.port,
                });
            }
            if let Some(first) = seen.insert(*member, rank) {
                return Err(GroupError::DuplicateMember {
                    first,
                    second: rank,
                    member: *member,
                });
            }
        }
        let options = BarrierOptions::for_members(members.len());
        Ok(Self { members, options })
    }

    /// The group of the ports `(node, port)`, by rank.
    ///
    /// # Errors
    /// As [`Group::new`].
    pub fn from_endpoints(
        endpoints: impl IntoIterator<Item = (NodeId, PortId)>,
    ) -> Result<Self, GroupError> {
        Self::new(
            endpoints
                .into_iter()
                .map(|(node, port)| Member::new(node, port)),
        )
    }

    /// The group of this group's members at `ranks`, in that order (rank `i` of the new group is
    /// rank `ranks[i]` of this one), with this group's timeout and the default algorithm for its
    /// size.
    ///
    /// # Errors
    /// [`GroupError::RankOutOfRange`], or as [`Group::new`] (a rank given twice is a duplicate).
    pub fn subgroup(&self, ranks: &[usize]) -> Result<Self, GroupError> {
        let members = ranks
            .iter()
            .map(|&rank| {
                self.members
                    .get(rank)
                    .copied()
                    .ok_or(GroupError::RankOutOfRange {
                        rank,
                        members: self.members.len(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut group = Self::new(members)?;
        group.options.timeout = self.options.timeout;
        Ok(group)
    }

    /// The members, by rank.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// How many members the group has (never zero).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always `false`: a group has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The member at `rank`.
    pub fn member(&self, rank: usize) -> Option<Member> {
        self.members.get(rank).copied()
    }

    /// The rank of `member`, if it is one.
    pub fn rank_of(&self, member: Member) -> Option<usize> {
        self.members.iter().position(|m| *m == member)
    }

    /// The options [`Port::barrier`] and [`Port::barrier_start`] use.
    pub fn options(&self) -> &BarrierOptions {
        &self.options
    }

    /// This group with `options`.
    #[must_use]
    pub fn with_options(mut self, options: BarrierOptions) -> Self {
        self.options = options;
        self
    }

    /// This group with `algorithm`.
    #[must_use]
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.options.algorithm = algorithm;
        self
    }

    /// This group with a `timeout`.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.options.timeout = Some(timeout);
        self
    }
}

/// Why a [`Group`] could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupError {
    /// No members.
    Empty,
    /// A member's port is not a port of a NIC.
    PortOutOfRange {
        /// The member's rank.
        rank: usize,
        /// Its port.
        port: PortId,
    },
    /// A member named twice: one port takes part in a barrier once.
    DuplicateMember {
        /// The first rank naming it.
        first: usize,
        /// The second.
        second: usize,
        /// The member.
        member: Member,
    },
    /// A rank given to [`Group::subgroup`] is not a rank of the group.
    RankOutOfRange {
        /// The rank.
        rank: usize,
        /// The group's size.
        members: usize,
    },
}

impl std::fmt::Display for GroupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => f.write_str("a barrier group needs at least one member"),
            Self::PortOutOfRange { rank, port } => write!(
                f,
                "rank {rank} names {port}, but a NIC has ports 0..{}",
                shared_abi::ids::PORTS_PER_NIC
            ),
            Self::DuplicateMember {
                first,
                second,
                member,
            } => write!(f, "ranks {first} and {second} are both {member}"),
            Self::RankOutOfRange { rank, members } => {
                write!(f, "rank {rank} is not in a group of {members} members")
            }
        }
    }
}

impl std::error::Error for GroupError {}

// ---------------------------------------------------------------------------------------------
// Errors.

/// Why a barrier ended without completing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureReason {
    /// The member's port closed (its process exited or died).
    PeerPortClosed,
    /// The member's NIC stopped answering.
    NodeUnreachable,
    /// The barrier's timeout expired while it waited for the member.
    TimedOut,
    /// Another status the NIC reported.
    Other(Status),
}

impl FailureReason {
    fn from_status(status: Status) -> Self {
        match status {
            Status::TARGET_PORT_CLOSED => Self::PeerPortClosed,
            Status::TARGET_NODE_UNREACHABLE => Self::NodeUnreachable,
            Status::BARRIER_TIMED_OUT => Self::TimedOut,
            other => Self::Other(other),
        }
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PeerPortClosed => f.write_str("its port closed"),
            Self::NodeUnreachable => f.write_str("its node is unreachable"),
            Self::TimedOut => f.write_str("the barrier timed out"),
            Self::Other(status) => write!(f, "the NIC reported status {}", status.0),
        }
    }
}

/// A group barrier did not complete.
#[derive(Debug)]
pub enum BarrierError {
    /// This port is not a member of the group.
    NotAMember {
        /// This port.
        member: Member,
    },
    /// The group's algorithm does not compile for it (a parameter out of range for its size,
    /// too many rounds or steps).
    Schedule(ScheduleError),
    /// A barrier is already running on this port: one at a time, as in the NIC.
    Busy,
    /// The port failed (the daemon is gone, no tokens, the arena is full, ...).
    Port(Error),
    /// The NIC refused the barrier token.
    Refused {
        /// Why (`BARRIER_BUSY` after repeated attempts, `BAD_SCHEDULE`, `BAD_BUFFER`).
        status: Status,
    },
    /// The barrier ended without completing, while it waited for `waiting_for`.
    Failed {
        /// The member it waited for.
        waiting_for: Member,
        /// That member's rank in the group, if it is one.
        rank: Option<usize>,
        /// Why it gave up.
        reason: FailureReason,
    },
    /// The NIC did not report the barrier's end within its timeout and a grace period after
    /// it. The barrier may still be running in the NIC: the port refuses new barriers until its
    /// end event comes.
    NoReport {
        /// How long the wait lasted.
        waited: Duration,
    },
    /// [`Port::barrier_wait`] or [`Port::barrier_test`] was given a barrier this port is not
    /// running (it was started on another port).
    NotRunning,
}

impl std::fmt::Display for BarrierError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotAMember { member } => {
                write!(f, "{member} is not a member of the barrier group")
            }
            Self::Schedule(error) => write!(f, "the barrier schedule does not compile: {error}"),
            Self::Busy => f.write_str("a barrier is already running on this port"),
            Self::Port(error) => write!(f, "{error}"),
            Self::Refused { status } => {
                write!(f, "the NIC refused the barrier (status {})", status.0)
            }
            Self::Failed {
                waiting_for,
                rank,
                reason,
            } => match rank {
                Some(rank) => write!(
                    f,
                    "the barrier failed waiting for rank {rank} ({waiting_for}): {reason}"
                ),
                None => write!(f, "the barrier failed waiting for {waiting_for}: {reason}"),
            },
            Self::NoReport { waited } => write!(
                f,
                "the NIC did not report the barrier's end within {waited:?}"
            ),
            Self::NotRunning => f.write_str("that barrier is not running on this port"),
        }
    }
}

impl std::error::Error for BarrierError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Port(error) => Some(error),
            Self::Schedule(error) => Some(error),
            _ => None,
        }
    }
}

impl From<Error> for BarrierError {
    fn from(error: Error) -> Self {
        Self::Port(error)
    }
}

// ---------------------------------------------------------------------------------------------
// The port's barrier state.

/// A barrier started by [`Port::barrier_start`]: pass it to [`Port::barrier_test`] and
/// [`Port::barrier_wait`] of the same port.
#[derive(Debug)]
#[must_use = "a started barrier ends with Port::barrier_wait"]
pub struct PendingBarrier {
    /// The token's context; `None` for a group of one, complete at once.
    context: Option<u64>,
    /// When the NIC should have reported the end at the latest.
    report_by: Option<Instant>,
    started: Instant,
}

/// The schedule compiled last: the same group and algorithm compile to it again.
#[derive(Debug)]
struct CachedSchedule {
    members: Arc<[Member]>,
    algorithm: Algorithm,
    rank: usize,
    steps: Arc<[Step]>,
}

/// The group barrier running in the NIC.
#[derive(Debug)]
struct Running {
    context: u64,
    steps: Arc<[Step]>,
    members: Arc<[Member]>,
    timeout: Option<Duration>,
    reposts: u32,
    /// Refused as busy: post it again then.
    repost_at: Option<Instant>,
}

/// What the port keeps for barriers (a field of [`Port`]).
#[derive(Debug, Default)]
pub(crate) struct BarrierState {
    /// Barrier send tokens the NIC holds (posted, not yet ended or refused).
    in_flight: u32,
    /// Barrier buffers provided and not yet used by a barrier's end.
    buffers: u32,
    /// A schedule buffer back from the NIC, for the next barrier.
    spare_schedule: Option<DmaBuffer>,
    cache: Option<CachedSchedule>,
    running: Option<Running>,
    /// The end of the group barrier with this context, kept for [`Port::barrier_wait`].
    outcome: Option<(u64, Result<(), BarrierError>)>,
    next_serial: u32,
    host: HostState,
}

impl BarrierState {
    pub(crate) fn token_posted(&mut self) {
        self.in_flight += 1;
    }

    pub(crate) fn buffer_provided(&mut self) {
        self.buffers += 1;
    }

    /// A barrier ended (completed or failed): its token is back, its barrier buffer used.
    /// `schedule` is its schedule buffer if the token was this port's.
    pub(crate) fn ended(&mut self, schedule: Option<DmaBuffer>) {
        self.buffers = self.buffers.saturating_sub(1);
        if let Some(schedule) = schedule {
            self.in_flight = self.in_flight.saturating_sub(1);
            self.recycle(schedule);
        }
    }

    /// A barrier token was refused: its barrier buffer stays provided.
    pub(crate) fn refused(&mut self, schedule: Option<DmaBuffer>) {
        if let Some(schedule) = schedule {
            self.in_flight = self.in_flight.saturating_sub(1);
            self.recycle(schedule);
        }
    }

    fn recycle(&mut self, schedule: DmaBuffer) {
        if self
            .spare_schedule
            .as_ref()
            .is_none_or(|spare| spare.len() < schedule.len())
        {
            self.spare_schedule = Some(schedule);
        }
    }

    /// The schedule of `rank` in `group` under `algorithm`, compiled or from the cache.
    fn schedule(
        &mut self,
        group: &Group,
        algorithm: Algorithm,
        rank: usize,
    ) -> Result<Arc<[Step]>, ScheduleError> {
        if let Some(cache) = &self.cache
            && Arc::ptr_eq(&cache.members, &group.members)
            && cache.algorithm == algorithm
            && cache.rank == rank
        {
            return Ok(cache.steps.clone());
        }
        let mut steps =
            vec![Step::default(); nicbar_schedule::steps_needed(algorithm, group.len())?];
        let count = nicbar_schedule::compile(algorithm, &group.members, rank, &mut steps)?;
        steps.truncate(count);
        let steps: Arc<[Step]> = steps.into();
        self.cache = Some(CachedSchedule {
            members: group.members.clone(),
            algorithm,
            rank,
            steps: steps.clone(),
        });
        Ok(steps)
    }
}

// ---------------------------------------------------------------------------------------------
// The NIC-based barrier.

impl Port {
    /// Provides the NIC with the receive token that one barrier's end uses (GM's
    /// `gm_provide_barrier_buffer`, paper §5.2). Counts against the receive tokens; the end event
    /// of the barrier returns it. The NIC holds a few at once (four); more wait in the receive
    /// ring, ahead of later receive buffers.
    ///
    /// # Errors
    /// [`Error::NoReceiveTokens`].
    pub fn provide_barrier_buffer(&mut self) -> Result<(), Error> {
        self.post_barrier_buffer_token()
    }

    /// Starts a barrier that runs `steps` in the NIC (GM's `gm_barrier_send_with_callback`,
    /// paper §5.2): writes the schedule into a buffer of the arena, which the port holds until the
    /// barrier ends, and posts the barrier send token. The end comes out of [`Port::receive`] as
    /// [`Event::BarrierCompleted`] or [`Event::BarrierFailed`] with `context`; a refusal as
    /// [`Event::SendRejected`] (`BARRIER_BUSY` if a barrier runs or no barrier buffer was
    /// provided, `BAD_SCHEDULE` for an empty, too long or malformed schedule). The NIC fails the
    /// barrier after `timeout` (`None`: its default).
    ///
    /// # Errors
    /// [`Error::ArenaFull`], [`Error::NoSendTokens`].
    pub fn barrier_send(
        &mut self,
        steps: &[Step],
        context: u64,
        timeout: Option<Duration>,
    ) -> Result<(), Error> {
        let bytes = steps.as_bytes();
        let mut schedule = match self.barrier.spare_schedule.take() {
            Some(spare) if spare.len() >= bytes.len() => spare,
            spare => {
                self.barrier.spare_schedule = spare;
                self.dma_alloc(bytes.len())?
            }
        };
        schedule[..bytes.len()].copy_from_slice(bytes);
        let length = u32::try_from(steps.len()).unwrap_or(u32::MAX);
        self.post_barrier_token(schedule, length, context, timeout_us(timeout))
            .map_err(|refused| {
                self.barrier.recycle(refused.buffer);
                refused.error
            })
    }

    /// Runs a barrier of `group` in the NIC with the group's options and waits for its end.
    ///
    /// # Errors
    /// [`BarrierError`]: this port is not a member, the schedule does not compile, a barrier is
    /// running, or the barrier failed (naming the member it waited for and why).
    pub fn barrier(&mut self, group: &Group) -> Result<(), BarrierError> {
        let pending = self.barrier_start(group)?;
        self.barrier_wait(pending)
    }

    /// As [`Port::barrier`], with `options` instead of the group's.
    ///
    /// # Errors
    /// As [`Port::barrier`].
    pub fn barrier_with(
        &mut self,
        group: &Group,
        options: &BarrierOptions,
    ) -> Result<(), BarrierError> {
        let pending = self.barrier_start_with(group, options)?;
        self.barrier_wait(pending)
    }

    /// Starts a barrier of `group` in the NIC and returns at once (the fuzzy barrier): compute,
    /// then [`Port::barrier_test`] or [`Port::barrier_wait`]. A group of one member completes
    /// at once without the NIC. Provides the barrier buffer if none is.
    ///
    /// # Errors
    /// [`BarrierError::NotAMember`], [`BarrierError::Schedule`], [`BarrierError::Busy`],
    /// [`BarrierError::Port`].
    pub fn barrier_start(&mut self, group: &Group) -> Result<PendingBarrier, BarrierError> {
        let options = group.options;
        self.barrier_start_with(group, &options)
    }

    /// As [`Port::barrier_start`], with `options` instead of the group's.
    ///
    /// # Errors
    /// As [`Port::barrier_start`].
    pub fn barrier_start_with(
        &mut self,
        group: &Group,
        options: &BarrierOptions,
    ) -> Result<PendingBarrier, BarrierError> {
        let started = Instant::now();
        let rank = self.rank_in(group)?;
        if group.len() == 1 {
            return Ok(PendingBarrier {
                context: None,
                report_by: None,
                started,
            });
        }
        if self.barrier.in_flight > 0 || self.barrier.running.is_some() {
            return Err(BarrierError::Busy);
        }
        let steps = self
            .barrier
            .schedule(group, options.algorithm, rank)
            .map_err(BarrierError::Schedule)?;
        self.barrier.outcome = None;
        if self.barrier.buffers == 0 {
            self.provide_barrier_buffer()?;
        }
        self.barrier.next_serial = self.barrier.next_serial.wrapping_add(1);
        let context = GROUP_CONTEXT | u64::from(self.barrier.next_serial);
        self.barrier_send(&steps, context, options.timeout)?;
        self.barrier.running = Some(Running {
            context,
            steps,
            members: group.members.clone(),
            timeout: options.timeout,
            reposts: 0,
            repost_at: None,
        });
        Ok(PendingBarrier {
            context: Some(context),
            report_by: options
                .timeout
                .map(|timeout| started + timeout + REPORT_GRACE),
            started,
        })
    }

    /// Whether the barrier has ended (completed or failed; [`Port::barrier_wait`] then returns at
    /// once with how). Takes the events waiting, keeping those that are not the barrier's for
    /// [`Port::receive`]. Never blocks.
    ///
    /// # Errors
    /// [`BarrierError::Port`] if the event ring is broken; [`BarrierError::NotRunning`].
    pub fn barrier_test(&mut self, pending: &PendingBarrier) -> Result<bool, BarrierError> {
        let Some(context) = pending.context else {
            return Ok(true);
        };
        loop {
            if self.barrier.has_ended(context) {
                return Ok(true);
            }
            if !self.barrier.is_running(context) {
                return Err(BarrierError::NotRunning);
            }
            self.repost_if_due()?;
            match self.next_from_ring()? {
                Some(event) => self.keep_unless_absorbed(event),
                None => return Ok(false),
            }
        }
    }

    /// Waits for the barrier's end, keeping the events that are not the barrier's for
    /// [`Port::receive`] (in order).
    ///
    /// # Errors
    /// [`BarrierError::Failed`] names the member the NIC waited for and why;
    /// [`BarrierError::Refused`], [`BarrierError::NoReport`], [`BarrierError::Port`],
    /// [`BarrierError::NotRunning`].
    pub fn barrier_wait(&mut self, pending: PendingBarrier) -> Result<(), BarrierError> {
        let Some(context) = pending.context else {
            return Ok(());
        };
        loop {
            if let Some(outcome) = self.barrier.take_outcome(context) {
                return outcome;
            }
            if !self.barrier.is_running(context) {
                return Err(BarrierError::NotRunning);
            }
            let repost_at = self.repost_if_due()?;
            let until = match (pending.report_by, repost_at) {
                (Some(report_by), Some(at)) => Some(report_by.min(at)),
                (report_by, at) => report_by.or(at),
            };
            match self.wait_from_ring(until)? {
                Some(event) => self.keep_unless_absorbed(event),
                None if pending
                    .report_by
                    .is_some_and(|report_by| Instant::now() >= report_by) =>
                {
                    return Err(BarrierError::NoReport {
                        waited: pending.started.elapsed(),
                    });
                }
                None => {}
            }
        }
    }

    fn rank_in(&self, group: &Group) -> Result<usize, BarrierError> {
        let member = Member::new(self.node_id(), self.port_id());
        group
            .rank_of(member)
            .ok_or(BarrierError::NotAMember { member })
    }

    /// Passes `event` through the barrier code; what it does not take waits for
    /// [`Port::receive`].
    fn keep_unless_absorbed(&mut self, event: Event) {
        if let Some(event) = absorb(self, event) {
            self.deferred.push_back(event);
        }
    }

    /// Posts the running group barrier again if it was refused as busy and its wait is over;
    /// returns when it is due otherwise. A failure to post ends the barrier with it.
    fn repost_if_due(&mut self) -> Result<Option<Instant>, BarrierError> {
        let Some(running) = self.barrier.running.as_mut() else {
            return Ok(None);
        };
        let Some(at) = running.repost_at else {
            return Ok(None);
        };
        if Instant::now() < at {
            return Ok(Some(at));
        }
        running.repost_at = None;
        let (steps, context, timeout) = (running.steps.clone(), running.context, running.timeout);
        let posted = if self.barrier.buffers == 0 {
            self.provide_barrier_buffer()
        } else {
            Ok(())
        }
        .and_then(|()| self.barrier_send(&steps, context, timeout));
        if let Err(error) = posted {
            self.barrier.finish(Err(BarrierError::Port(error)));
        }
        Ok(None)
    }
}

impl BarrierState {
    fn is_running(&self, context: u64) -> bool {
        self.running.as_ref().is_some_and(|r| r.context == context)
    }

    fn has_ended(&self, context: u64) -> bool {
        self.outcome.as_ref().is_some_and(|(c, _)| *c == context)
    }

    fn take_outcome(&mut self, context: u64) -> Option<Result<(), BarrierError>> {
        if self.has_ended(context) {
            self.outcome.take().map(|(_, outcome)| outcome)
        } else {
            None
        }
    }

    /// The running group barrier ended with `outcome`.
    fn finish(&mut self, outcome: Result<(), BarrierError>) {
        if let Some(running) = self.running.take() {
            self.outcome = Some((running.context, outcome));
        }
    }
}

/// Takes the events the barrier code owns out of the stream: the running group barrier's end (or
/// refusal) and the host-based barrier's messages and sends. Returns the others.
pub(crate) fn absorb(port: &mut Port, event: Event) -> Option<Event> {
    match event {
        Event::BarrierCompleted { context } if port.barrier.is_running(context) => {
            port.barrier.finish(Ok(()));
            provide_ahead(port);
            None
        }
        Event::BarrierFailed {
            context,
            status,
            waiting_for: (node, peer_port),
        } if port.barrier.is_running(context) => {
            let waiting_for = Member::new(node, peer_port);
            let rank = port
                .barrier
                .running
                .as_ref()
                .and_then(|r| r.members.iter().position(|m| *m == waiting_for));
            port.barrier.finish(Err(BarrierError::Failed {
                waiting_for,
                rank,
                reason: FailureReason::from_status(status),
            }));
            provide_ahead(port);
            None
        }
        Event::SendRejected {
            context,
            status,
            kind,
            ..
        } if kind == SendKind::BARRIER.0 && port.barrier.is_running(context) => {
            let in_flight = port.barrier.in_flight;
            match port.barrier.running.as_mut() {
                // Busy with no barrier of ours in the NIC: the barrier buffer has not reached the
                // NIC (it waits in the receive ring behind buffers the NIC has no room for yet).
                // Post it again a little later.
                Some(running)
                    if status == Status::BARRIER_BUSY
                        && in_flight == 0
                        && running.reposts < MAX_REPOSTS =>
                {
                    let backoff = REPOST_BACKOFF * (1 << running.reposts.min(6));
                    running.reposts += 1;
                    running.repost_at = Some(Instant::now() + backoff);
                }
                _ => port.barrier.finish(Err(BarrierError::Refused { status })),
            }
            None
        }
        Event::Received { ref buffer, .. }
            if port.barrier.host.buffers.contains(&buffer.arena_offset()) =>
        {
            host_received(port, event)
        }
        Event::Sent { ref buffer, .. }
            if port
                .barrier
                .host
                .sending
                .contains_key(&buffer.arena_offset()) =>
        {
            host_sent(port, event);
            None
        }
        Event::ReceiveRejected {
            buffer: Some(buffer),
            ..
        } if port.barrier.host.buffers.contains(&buffer.arena_offset()) => {
            // Never for a buffer of the reserved class; forget it, the next barrier provides
            // another.
            port.barrier.host.buffers.remove(&buffer.arena_offset());
            None
        }
        other => Some(other),
    }
}

/// Provides the next barrier's buffer as soon as one ends, so it is in the NIC before the next
/// barrier token. Best effort: [`Port::barrier_start`] provides it if this could not.
fn provide_ahead(port: &mut Port) {
    if port.barrier.buffers == 0 {
        let _ = port.provide_barrier_buffer();
    }
}

// ---------------------------------------------------------------------------------------------
// The host-based barrier.

/// A host-based barrier message whose send failed, to send again.
#[derive(Clone, Copy, Debug)]
struct Resend {
    peer: Member,
    round: u8,
    at: Instant,
    until: Instant,
}

/// The host-based barrier's record, buffers and sends.
#[derive(Debug, Default)]
struct HostState {
    /// Messages arrived and not yet consumed, per (sender, round): the host's unexpected-barrier
    /// record (at most two: this barrier's and the next one's).
    record: HashMap<(Member, u8), u32>,
    /// Arena offsets of the receive buffers provided for the messages.
    buffers: HashSet<u64>,
    /// Buffers back from the NIC that could not be provided again yet (no receive token).
    unprovided: Vec<DmaBuffer>,
    /// Send buffers not in use.
    spare: Vec<DmaBuffer>,
    /// Messages the NIC holds: buffer offset → (target, round).
    sending: HashMap<u64, (Member, u8)>,
    resends: Vec<Resend>,
    /// The last failure of a send to each member since a message from it or a send to it got
    /// through.
    failures: HashMap<Member, Status>,
    /// Until when failed sends are sent again: the deadline of the latest host-based barrier.
    deadline: Option<Instant>,
}

impl Port {
    /// Runs `group`'s barrier on the host: the very schedule the NIC would run
    /// ([`nicbar_schedule::compile`] of `options.algorithm` for this port's rank), each step done by
    /// the host over ordinary messages of the reserved class (see the module docs). The baseline
    /// of the paper's §6. Events that arrive meanwhile are kept, in order, for [`Port::receive`].
    ///
    /// # Errors
    /// As [`Port::barrier`]: [`BarrierError::Failed`] after `options.timeout` (default
    /// [`DEFAULT_HOST_TIMEOUT`]) naming the member it waited for, at once if that member's node
    /// became unreachable; [`BarrierError::Port`] if no receive buffer could be provided.
    pub fn host_barrier(
        &mut self,
        group: &Group,
        options: &BarrierOptions,
    ) -> Result<(), BarrierError> {
        let rank = self.rank_in(group)?;
        if group.len() == 1 {
            return Ok(());
        }
        let steps = self
            .barrier
            .schedule(group, options.algorithm, rank)
            .map_err(BarrierError::Schedule)?;
        let deadline = Instant::now() + options.timeout.unwrap_or(DEFAULT_HOST_TIMEOUT);
        self.barrier.host.deadline = Some(deadline);
        let receives = steps
            .iter()
            .filter(|s| matches!(s.op, StepOp::RECV | StepOp::EXCHANGE))
            .count();
        self.provide_host_buffers((2 * receives + 2).min(MAX_HOST_BUFFERS))?;
        for step in steps.iter() {
            let peer = Member::new(step.node, step.port);
            if matches!(step.op, StepOp::SEND | StepOp::EXCHANGE) {
                self.host_send(peer, step.round, deadline)?;
            }
            if matches!(step.op, StepOp::RECV | StepOp::EXCHANGE) {
                self.host_receive(group, peer, step.round, deadline)?;
            }
        }
        Ok(())
    }

    /// Keeps `want` receive buffers of the reserved class provided.
    fn provide_host_buffers(&mut self, want: usize) -> Result<(), BarrierError> {
        let length = max_length_for_size(HOST_BARRIER_SIZE) as usize;
        while self.barrier.host.buffers.len() < want {
            let buffer = match self.barrier.host.unprovided.pop() {
                Some(buffer) => buffer,
                None => self.dma_alloc(length)?,
            };
            let offset = buffer.arena_offset();
            match self.provide_receive_buffer(
                buffer,
                HOST_BARRIER_SIZE,
                HOST_BARRIER_PRIORITY,
                HOST_TAG,
            ) {
                Ok(()) => {
                    self.barrier.host.buffers.insert(offset);
                }
                Err(refused) => {
                    self.barrier.host.unprovided.push(refused.buffer);
                    if self.barrier.host.buffers.is_empty() {
                        return Err(BarrierError::Port(refused.error));
                    }
                    break;
                }
            }
        }
        Ok(())
    }

    /// Sends `peer` the message of `round`, waiting for a send token if none is free.
    fn host_send(
        &mut self,
        peer: Member,
        round: u8,
        deadline: Instant,
    ) -> Result<(), BarrierError> {
        while self.send_tokens() == 0 {
            // Every send token is out: their SENT events are on the way.
            match self.wait_from_ring(Some(deadline))? {
                Some(event) => self.keep_unless_absorbed(event),
                None => {
                    return Err(BarrierError::Port(Error::NoSendTokens));
                }
            }
        }
        let mut buffer = match self.barrier.host.spare.pop() {
            Some(buffer) => buffer,
            None => self.dma_alloc(HOST_MESSAGE_LENGTH)?,
        };
        buffer[..4].copy_from_slice(&HOST_MAGIC);
        buffer[4..HOST_MESSAGE_LENGTH].copy_from_slice(&[round, 0, 0, 0]);
        let offset = buffer.arena_offset();
        match self.send(
            buffer,
            HOST_MESSAGE_LENGTH,
            HOST_BARRIER_SIZE,
            HOST_BARRIER_PRIORITY,
            peer.node,
            peer.port,
            u64::from(HOST_TAG),
        ) {
            Ok(()) => {
                self.barrier.host.sending.insert(offset, (peer, round));
                Ok(())
            }
            Err(refused) => {
                self.barrier.host.spare.push(refused.buffer);
                Err(BarrierError::Port(refused.error))
            }
        }
    }

    /// Waits until the message of `round` from `peer` has arrived, and consumes it.
    fn host_receive(
        &mut self,
        group: &Group,
        peer: Member,
        round: u8,
        deadline: Instant,
    ) -> Result<(), BarrierError> {
        loop {
            if let Some(count) = self.barrier.host.record.get_mut(&(peer, round))
                && *count > 0
            {
                *count -= 1;
                return Ok(());
            }
            let failure = self.barrier.host.failures.get(&peer).copied();
            let now = Instant::now();
            if failure == Some(Status::TARGET_NODE_UNREACHABLE) || now >= deadline {
                let reason = match failure {
                    Some(Status::TARGET_PORT_CLOSED) => FailureReason::PeerPortClosed,
                    Some(Status::TARGET_NODE_UNREACHABLE) => FailureReason::NodeUnreachable,
                    _ => FailureReason::TimedOut,
                };
                return Err(BarrierError::Failed {
                    waiting_for: peer,
                    rank: group.rank_of(peer),
                    reason,
                });
            }
            let next_resend = self.resend_due(now)?;
            let until = next_resend.map_or(deadline, |at| at.min(deadline));
            if let Some(event) = self.wait_from_ring(Some(until))? {
                self.keep_unless_absorbed(event);
            }
        }
    }

    /// Sends again the failed messages that are due, drops those past their deadline, and
    /// returns when the next one is due.
    fn resend_due(&mut self, now: Instant) -> Result<Option<Instant>, BarrierError> {
        let host = &mut self.barrier.host;
        host.resends.retain(|resend| resend.until > now);
        if host.resends.iter().all(|resend| resend.at > now) {
            return Ok(host.resends.iter().map(|resend| resend.at).min());
        }
        let (due, later): (Vec<_>, Vec<_>) = host.resends.drain(..).partition(|r| r.at <= now);
        host.resends = later;
        for resend in due {
            self.host_send(resend.peer, resend.round, resend.until)?;
        }
        Ok(self
            .barrier
            .host
            .resends
            .iter()
            .map(|resend| resend.at)
            .min())
    }
}

/// A message arrived in one of the host-based barrier's buffers: count it and provide the buffer
/// again. A message that is not the barrier's is the caller's.
fn host_received(port: &mut Port, event: Event) -> Option<Event> {
    let Event::Received {
        ref buffer,
        length,
        sender_node,
        sender_port,
        status,
        ..
    } = event
    else {
        return Some(event);
    };
    let offset = buffer.arena_offset();
    let round = buffer.get(4).copied().unwrap_or(u8::MAX);
    let ours = status == Status::SUCCESS
        && length == HOST_MESSAGE_LENGTH
        && buffer.get(..4) == Some(&HOST_MAGIC[..])
        && round < shared_abi::schedule::MAX_ROUNDS;
    let host = &mut port.barrier.host;
    host.buffers.remove(&offset);
    if !ours && status == Status::SUCCESS {
        // Someone else's message of the reserved class: it is the caller's, buffer and all.
        return Some(event);
    }
    if ours {
        let sender = Member::new(sender_node, sender_port);
        *host.record.entry((sender, round)).or_insert(0) += 1;
        host.failures.remove(&sender);
    }
    let Event::Received { buffer, .. } = event else {
        return None;
    };
    match port.provide_receive_buffer(buffer, HOST_BARRIER_SIZE, HOST_BARRIER_PRIORITY, HOST_TAG) {
        Ok(()) => {
            port.barrier.host.buffers.insert(offset);
        }
        Err(refused) => port.barrier.host.unprovided.push(refused.buffer),
    }
    None
}

/// A host-based barrier message was sent, or failed: keep the buffer; on failure, send it again
/// until the deadline (the target port may not be open yet, or had no buffer).
fn host_sent(port: &mut Port, event: Event) {
    let Event::Sent { buffer, status, .. } = event else {
        return;
    };
    let host = &mut port.barrier.host;
    let Some((peer, round)) = host.sending.remove(&buffer.arena_offset()) else {
        return;
    };
    host.spare.push(buffer);
    if status == Status::SUCCESS {
        host.failures.remove(&peer);
        return;
    }
    host.failures.insert(peer, status);
    let now = Instant::now();
    if let Some(until) = host.deadline.filter(|until| *until > now) {
        host.resends.push(Resend {
            peer,
            round,
            at: now + HOST_RETRY_INTERVAL,
            until,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(node: u16, port: u8) -> Member {
        Member::new(NodeId::new(node), PortId(port))
    }

    #[test]
    fn groups_refuse_what_cannot_be_a_barrier() {
        assert_eq!(Group::new([]).unwrap_err(), GroupError::Empty);
        assert_eq!(
            Group::new([member(0, 1), member(1, 1), member(0, 1)]).unwrap_err(),
            GroupError::DuplicateMember {
                first: 0,
                second: 2,
                member: member(0, 1)
            }
        );
        assert_eq!(
            Group::new([member(0, 1), member(1, 8)]).unwrap_err(),
            GroupError::PortOutOfRange {
                rank: 1,
                port: PortId(8)
            }
        );
        let world = Group::from_endpoints((0..4).map(|n| (NodeId::new(n), PortId(2)))).unwrap();
        assert_eq!(world.len(), 4);
        assert_eq!(world.rank_of(member(2, 2)), Some(2));
        assert_eq!(world.rank_of(member(2, 3)), None);
        let sub = world.subgroup(&[3, 1]).unwrap();
        assert_eq!(sub.members(), &[member(3, 2), member(1, 2)]);
        assert_eq!(
            world.subgroup(&[1, 4]).unwrap_err(),
            GroupError::RankOutOfRange {
                rank: 4,
                members: 4
            }
        );
        assert!(matches!(
            world.subgroup(&[1, 1]).unwrap_err(),
            GroupError::DuplicateMember { .. }
        ));
        assert_eq!(
            Group::new([member(0, 1), member(1, 1), member(0, 1)])
                .unwrap_err()
                .to_string(),
            "ranks 0 and 2 are both node 0 port 1"
        );
    }

    #[test]
    fn default_options_follow_the_group_size_and_subgroups_keep_the_timeout() {
        let world = Group::from_endpoints((0..6).map(|n| (NodeId::new(n), PortId(1))))
            .unwrap()
            .with_timeout(Duration::from_secs(3));
        assert_eq!(world.options().algorithm, Algorithm::Dissemination { n: 1 });
        let four = world.subgroup(&[0, 1, 2, 3]).unwrap();
        assert_eq!(four.options().algorithm, Algorithm::PairwiseExchange);
        assert_eq!(four.options().timeout, Some(Duration::from_secs(3)));
    }

    #[test]
    fn timeouts_become_microseconds_that_never_mean_the_default_by_accident() {
        assert_eq!(timeout_us(None), 0);
        assert_eq!(timeout_us(Some(Duration::ZERO)), 1);
        assert_eq!(timeout_us(Some(Duration::from_nanos(10))), 1);
        assert_eq!(timeout_us(Some(Duration::from_millis(3))), 3000);
        assert_eq!(timeout_us(Some(Duration::from_secs(1 << 40))), u32::MAX);
    }

    #[test]
    fn the_schedule_cache_answers_only_for_the_same_group_algorithm_and_rank() {
        let mut state = BarrierState::default();
        let group = Group::from_endpoints((0..8).map(|n| (NodeId::new(n), PortId(1)))).unwrap();
        let pe = state
            .schedule(&group, Algorithm::PairwiseExchange, 3)
            .unwrap();
        assert_eq!(pe.len(), 3);
        let again = state
            .schedule(&group, Algorithm::PairwiseExchange, 3)
            .unwrap();
        assert!(Arc::ptr_eq(&pe, &again));
        let gb = state
            .schedule(
                &group,
                Algorithm::GatherBroadcast {
                    dimension: 2,
                    root: 0,
                },
                3,
            )
            .unwrap();
        assert!(!Arc::ptr_eq(&pe, &gb));
        let other_rank = state
            .schedule(&group, Algorithm::PairwiseExchange, 4)
            .unwrap();
        assert_ne!(&*pe, &*other_rank);
        // The same members in another group object compile again, to the same steps.
        let twin = Group::new(group.members().iter().copied()).unwrap();
        let twin_pe = state
            .schedule(&twin, Algorithm::PairwiseExchange, 3)
            .unwrap();
        assert_eq!(&*twin_pe, &*pe);
        assert_eq!(
            state
                .schedule(&group, Algorithm::Dissemination { n: 8 }, 0)
                .unwrap_err(),
            ScheduleError::WaysOutOfRange { n: 8, members: 8 }
        );
    }

    #[test]
    fn failures_name_the_rank_and_the_reason() {
        let error = BarrierError::Failed {
            waiting_for: member(3, 1),
            rank: Some(2),
            reason: FailureReason::from_status(Status::TARGET_PORT_CLOSED),
        };
        assert_eq!(
            error.to_string(),
            "the barrier failed waiting for rank 2 (node 3 port 1): its port closed"
        );
        assert_eq!(
            FailureReason::from_status(Status::BARRIER_TIMED_OUT),
            FailureReason::TimedOut
        );
        assert_eq!(
            FailureReason::from_status(Status::TARGET_NODE_UNREACHABLE),
            FailureReason::NodeUnreachable
        );
        assert_eq!(
            FailureReason::from_status(Status::NO_RESOURCES),
            FailureReason::Other(Status::NO_RESOURCES)
        );
    }
}
