//! The daemon's NIC threads: each runs the units given to it over one epoll loop, as one NIC
//! processor runs all of a card's ports, and a daemon runs as many as the host can spare cores.
//!
//! A packet between two units of one thread is taken in the same pass of the loop that sent it;
//! one for a unit of another thread goes through that unit's lock-free inbox and costs a system
//! call only if that thread sleeps ([`ThreadWake`]). Each pass drains the wake-up eventfds that
//! were ready (rung for commands from the control thread and by processes as the NIC doorbell),
//! serves commands, and runs every unit — packets from its inbox and UDP socket, then a poll of
//! its firmware core — until none has anything left to do.
//!
//! Then the idle policy ([`IdlePolicy`]) decides. A polling thread looks again at once (it looks
//! at its descriptors, and yields its core, every [`POLL_DESCRIPTORS_EVERY`] idle passes, and its
//! processes never need the doorbell). A sleeping thread first stays awake for the linger time
//! after its last work, yielding its core between looks; then it raises the sleeping flag of
//! every open port's send and receive ring and its own, polls once more (a token or a packet
//! published before the other side saw the flag would otherwise wait), and sleeps in
//! `epoll_wait` until a descriptor is ready or the earliest firmware deadline or held-back packet
//! of its units is due.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};

use super::idle::{HostLoad, IdlePolicy};
use super::unit::{SharedThread, UnitHandle, UnitLoop, UnitSetup};
use super::wire::ThreadWake;
use nicbar_control::doorbell;

/// Stack of a NIC thread: each firmware core is built on it before it moves to the heap.
const THREAD_STACK: usize = 8 << 20;

/// Rounds of (packets in, poll, loopback) the units run before the loop looks at its commands
/// and descriptors again.
const MAX_ROUNDS: usize = 256;

/// Idle passes of a polling thread between two looks at its descriptors (commands ring them, and
/// processes that asked for the doorbell while the thread slept).
pub(crate) const POLL_DESCRIPTORS_EVERY: u32 = 64;

/// Epoll data of a unit's descriptors: `unit << 1 | WAKE` and `unit << 1 | UDP`, the unit
/// numbered within its thread; the thread's own wake-up is [`THREAD_WAKE`].
pub(crate) const WAKE: u64 = 0;
/// See [`WAKE`].
pub(crate) const UDP: u64 = 1;
const THREAD_WAKE: u64 = u64::MAX;
/// Epoll data of the thread's timer.
const THREAD_TIMER: u64 = u64::MAX - 1;

/// How the daemon's NICs are spread over threads.
#[derive(Clone, Debug)]
pub(crate) struct ThreadPlan {
    /// How many NIC threads; unit `u` runs on thread `u % threads`.
    pub(crate) threads: usize,
    /// CPUs to pin the threads to, thread `t` on `cpus[t % cpus.len()]`; empty: not pinned.
    pub(crate) cpus: Vec<usize>,
    /// What a thread does when idle.
    pub(crate) idle: IdlePolicy,
    /// How long a sleeping thread stays awake after its last work.
    pub(crate) linger: Duration,
    /// The threads' niceness, if set ([`crate::EmulatorConfig::nice`]).
    pub(crate) nice: Option<i32>,
    /// The cores the daemon may run on (the adaptive policy's budget).
    pub(crate) cores: usize,
}

impl ThreadPlan {
    /// The thread that runs unit `unit`.
    pub(crate) fn thread_of(&self, unit: usize) -> usize {
        unit % self.threads.max(1)
    }
}

/// Starts the NIC threads, each with the units `plan` gives it; `wakes` are the threads'
/// wake-ups (the inboxes in `setups` already point at them). Returns a handle per unit, in unit
/// order.
///
/// # Errors
/// Creating an epoll instance or a thread failed.
pub(crate) fn spawn(
    setups: Vec<UnitSetup>,
    wakes: Vec<Arc<ThreadWake>>,
    plan: &ThreadPlan,
) -> io::Result<Vec<UnitHandle>> {
    let open_ports = Arc::new(AtomicUsize::new(0));
    let mut per_thread: Vec<Vec<UnitSetup>> = wakes.iter().map(|_| Vec::new()).collect();
    for (index, setup) in setups.into_iter().enumerate() {
        if let Some(list) = per_thread.get_mut(plan.thread_of(index)) {
            list.push(setup);
        }
    }
    let mut handles: Vec<Option<UnitHandle>> = Vec::new();
    for (thread, (setups, wake)) in per_thread.into_iter().zip(wakes).enumerate() {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(
            wake.doorbell(),
            EpollEvent::new(EpollFlags::EPOLLIN, THREAD_WAKE),
        )?;
        let timer = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        epoll.add(&timer, EpollEvent::new(EpollFlags::EPOLLIN, THREAD_TIMER))?;
        let mut parts = Vec::new();
        for (slot, setup) in setups.into_iter().enumerate() {
            let key = (slot as u64) << 1;
            epoll.add(
                &*setup.wake,
                EpollEvent::new(EpollFlags::EPOLLIN, key | WAKE),
            )?;
            if let Some(udp) = setup.udp.as_ref() {
                epoll.add(udp, EpollEvent::new(EpollFlags::EPOLLIN, key | UDP))?;
            }
            let (handle, part) = setup.split(thread as u16, open_ports.clone());
            let unit = usize::from(handle.unit);
            if handles.len() <= unit {
                handles.resize_with(unit + 1, || None);
            }
            handles[unit] = Some(handle);
            parts.push(part);
        }
        let shared = Arc::new(SharedThread::new(parts.len()));
        for handle in handles.iter_mut().flatten() {
            if handle.thread_index() == thread as u16 {
                handle.attach(shared.clone());
            }
        }
        let cpu = (!plan.cpus.is_empty()).then(|| plan.cpus[thread % plan.cpus.len()]);
        let nice = plan.nice;
        let context = ThreadContext {
            epoll,
            timer,
            wake,
            idle: plan.idle,
            linger: plan.linger,
            threads: plan.threads,
            cores: plan.cores,
            open_ports: open_ports.clone(),
            load: HostLoad::new(plan.cores),
        };
        let joined = std::thread::Builder::new()
            .name(format!("nic-thread-{thread}"))
            .stack_size(THREAD_STACK)
            .spawn(move || {
                if let Some(cpu) = cpu {
                    pin_to(cpu);
                }
                if let Some(nice) = nice {
                    set_nice(nice, thread);
                }
                let units = parts.into_iter().map(|part| part.build()).collect();
                NicThread { units, context }.run();
            })?;
        shared.set_thread(joined);
    }
    Ok(handles.into_iter().flatten().collect())
}

/// Pins the calling thread to `cpu`; a refusal (a CPU outside the process's set) leaves it
/// unpinned and says so.
fn pin_to(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    let pinned = set
        .set(cpu)
        .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
    if let Err(error) = pinned {
        eprintln!("nicctl emulate: cannot pin a NIC thread to CPU {cpu}: {error}");
    }
}

/// Sets the calling thread's niceness (on Linux a thread has its own); a refusal leaves it at
/// the daemon's and says so, once (from the first thread).
fn set_nice(nice: i32, thread: usize) {
    let tid = rustix::thread::gettid();
    if let Err(error) = rustix::process::setpriority_process(Some(tid), nice)
        && thread == 0
    {
        eprintln!(
            "nicctl emulate: cannot set the NIC threads' niceness to {nice}: {error} (lowering it \
             needs CAP_SYS_NICE); they run at the daemon's"
        );
    }
}

/// What a thread needs beside its units.
struct ThreadContext {
    epoll: Epoll,
    /// Wakes a sleeping thread at its next deadline to the nanosecond (an epoll timeout counts
    /// whole milliseconds, which a retransmission or a held-back packet cannot wait).
    timer: TimerFd,
    wake: Arc<ThreadWake>,
    idle: IdlePolicy,
    linger: Duration,
    threads: usize,
    cores: usize,
    /// Ports open on the whole daemon (every thread's units): the adaptive policy's load.
    open_ports: Arc<AtomicUsize>,
    /// The host's load, for the adaptive policy.
    load: HostLoad,
}

/// One NIC thread: its units and the loop that runs them.
struct NicThread {
    units: Vec<UnitLoop>,
    context: ThreadContext,
}

impl NicThread {
    fn run(mut self) {
        let mut events = vec![EpollEvent::empty(); 2 * self.units.len() + 1];
        let mut last_busy = std::time::Instant::now();
        // Units whose wake-up eventfd or UDP socket was ready in the last wait: every unit at
        // first. Only these are drained; a polling thread asks every unit for commands.
        let mut woken = vec![true; self.units.len()];
        let mut idle_passes = 0u32;
        loop {
            let polling = self.polls();
            for (unit, woken) in self.units.iter_mut().zip(woken.iter_mut()) {
                unit.polling = polling;
                let rung = std::mem::take(woken);
                if rung {
                    unit.dormant = false;
                    doorbell::drain(&*unit.wake);
                }
                if (rung || polling) && !unit.stopped && !unit.serve_commands() {
                    unit.stop();
                }
            }
            if self.units.iter().all(|unit| unit.stopped) {
                return;
            }
            if self.work() {
                last_busy = std::time::Instant::now();
                idle_passes = 0;
            } else {
                idle_passes = idle_passes.wrapping_add(1);
            }
            if polling {
                if idle_passes > 0 {
                    if idle_passes % POLL_DESCRIPTORS_EVERY == 0 {
                        self.look_at_descriptors(&mut events, EpollTimeout::ZERO, &mut woken);
                        // A process that yields its core while it waits (Open MPI's progress,
                        // coll/nicbar's polls) gets it back from this thread within these
                        // passes, not at the scheduler's next tick: on a host whose cores it
                        // shares, a thread that never yielded held MPI_Barrier to 4 ms. With a
                        // core to itself, the call returns at once.
                        std::thread::yield_now();
                        // A unit with nothing open, queued or due costs a polling thread
                        // nothing until a command or a packet comes for it.
                        for unit in self.units.iter_mut().filter(|unit| unit.runs()) {
                            unit.dormant = unit.idle() && unit.nic_is_idle();
                        }
                    }
                    std::hint::spin_loop();
                }
                continue;
            }
            let mut timeout: Option<Duration> = None;
            for unit in self.units.iter_mut().filter(|unit| unit.runs()) {
                match unit.sleep_timeout() {
                    Some(t) => timeout = Some(timeout.map_or(t, |timeout| timeout.min(t))),
                    // Nothing due, ever, and nothing to serve: skip it until something
                    // arrives for it.
                    None if unit.idle() => unit.dormant = true,
                    None => {}
                }
            }
            if timeout == Some(Duration::ZERO) {
                continue;
            }
            if last_busy.elapsed() < self.context.linger {
                // Recently busy: stay awake a little without the sleeping flags, so a process
                // that takes an event and posts again soon needs no doorbell (io_uring's SQPOLL
                // idle time). This holds for processes that spin on their event rings too: on a
                // host with no core to spare, a NIC thread that slept at once was woken by the
                // doorbell of nearly every post, and each wake-up cost more than the linger's
                // yielding spin takes from the spinners (docs/benchmarks.md, "The linger").
                self.look_at_descriptors(&mut events, EpollTimeout::ZERO, &mut woken);
                std::thread::yield_now();
                continue;
            }
            self.sleep(&mut events, timeout, &mut woken);
        }
    }

    /// Whether the thread polls now, by its idle policy and the daemon's open ports.
    fn polls(&mut self) -> bool {
        let context = &mut self.context;
        context.idle.polls(
            context.open_ports.load(Ordering::Relaxed),
            context.threads,
            context.cores,
            || context.load.spare_core(std::time::Instant::now()),
        )
    }

    /// Raises every sleeping flag, looks once more for work published before the flags were
    /// seen, and if there is none waits in `epoll_wait` for at most `timeout`.
    fn sleep(&mut self, events: &mut [EpollEvent], timeout: Option<Duration>, woken: &mut [bool]) {
        for unit in &self.units {
            unit.set_sleeping(true);
        }
        self.context.wake.going_to_sleep();
        // The flags are up: a token published from now on rings the doorbell, a packet from
        // another thread rings this thread. One published before is seen here.
        let late_work = self.units.iter_mut().any(UnitLoop::has_late_work);
        if !late_work {
            let armed = timeout.is_some_and(|timeout| {
                let expiration = Expiration::OneShot(TimeSpec::from_duration(timeout));
                self.context
                    .timer
                    .set(expiration, TimerSetTimeFlags::empty())
                    .is_ok()
            });
            // A timer that could not be armed leaves the deadline to epoll's own timeout.
            let timeout = if armed {
                EpollTimeout::NONE
            } else {
                epoll_timeout(timeout)
            };
            self.look_at_descriptors(events, timeout, woken);
        }
        self.context.wake.awake();
        for unit in &self.units {
            unit.set_sleeping(false);
        }
    }

    /// Waits up to `timeout` for the thread's descriptors and marks the units they belong to.
    fn look_at_descriptors(
        &self,
        events: &mut [EpollEvent],
        timeout: EpollTimeout,
        woken: &mut [bool],
    ) {
        let ready = self.context.epoll.wait(events, timeout).unwrap_or(0);
        for event in &events[..ready] {
            if event.data() == THREAD_WAKE {
                doorbell::drain(self.context.wake.doorbell());
                continue;
            }
            if event.data() == THREAD_TIMER {
                // Expired: read its count to quiet it. A timer left armed by an earlier sleep
                // that ended sooner only costs a pass of the loop when it fires.
                let _ = nix::unistd::read(&self.context.timer, &mut [0u8; 8]);
                continue;
            }
            if let Some(flag) = usize::try_from(event.data() >> 1)
                .ok()
                .and_then(|index| woken.get_mut(index))
            {
                *flag = true;
            }
        }
    }

    /// Runs every unit until none has anything to do (bounded, to serve commands): a packet one
    /// unit sends another of this thread is taken in the next pass. Dormant units are skipped
    /// unless a packet came for them. Returns whether there was anything to do.
    fn work(&mut self) -> bool {
        let mut any = false;
        for _ in 0..MAX_ROUNDS {
            let mut busy = false;
            for unit in self.units.iter_mut().filter(|unit| !unit.stopped) {
                if unit.dormant {
                    if unit.inbox.is_empty() {
                        continue;
                    }
                    unit.dormant = false;
                }
                busy |= unit.work();
            }
            if !busy {
                return any;
            }
            any = true;
        }
        any
    }
}

/// An epoll timeout of at least `timeout`, rounded up to whole milliseconds.
fn epoll_timeout(timeout: Option<Duration>) -> EpollTimeout {
    let Some(timeout) = timeout else {
        return EpollTimeout::NONE;
    };
    let millis = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    EpollTimeout::try_from(millis).unwrap_or(EpollTimeout::MAX)
}

/// A fresh wake-up for each of `threads` NIC threads.
///
/// # Errors
/// An eventfd could not be created.
pub(crate) fn thread_wakes(threads: usize) -> io::Result<Vec<Arc<ThreadWake>>> {
    (0..threads.max(1))
        .map(|_| doorbell::new().map(|fd: OwnedFd| Arc::new(ThreadWake::new(fd))))
        .collect()
}
