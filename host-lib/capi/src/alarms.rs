//! Alarms and the clock: gm_set_alarm's alarms, kept in the order they are due, and gm_ticks's
//! clock (GM's 0.5 µs ticks, counted from when the port opened).

use std::time::{Duration, Instant};

use crate::types::gm_alarm_callback_t;

/// Clock ticks per microsecond (the LANai clock GM counts in ticked every 0.5 µs).
pub(crate) const TICKS_PER_MICROSECOND: u64 = 2;

/// An alarm that is set.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SetAlarm {
    /// The program's `struct gm_alarm`, by address: the alarm's name.
    pub(crate) address: usize,
    pub(crate) due: Instant,
    /// Order among alarms due at the same instant: the order they were set in.
    seq: u64,
    pub(crate) callback: gm_alarm_callback_t,
    pub(crate) context: usize,
}

/// A port's alarms and clock.
#[derive(Debug)]
pub(crate) struct Alarms {
    set: Vec<SetAlarm>,
    next_seq: u64,
    epoch: Instant,
}

impl Alarms {
    pub(crate) fn new() -> Self {
        Self {
            set: Vec::new(),
            next_seq: 0,
            epoch: Instant::now(),
        }
    }

    /// The port's clock at `now`, in ticks.
    pub(crate) fn ticks(&self, now: Instant) -> u64 {
        let micros = now.saturating_duration_since(self.epoch).as_micros();
        u64::try_from(micros)
            .unwrap_or(u64::MAX)
            .saturating_mul(TICKS_PER_MICROSECOND)
    }

    /// Sets (or sets again) the alarm at `address` to fire `usecs` from `now`; returns its
    /// deadline in ticks.
    pub(crate) fn set(
        &mut self,
        address: usize,
        usecs: u64,
        now: Instant,
        callback: gm_alarm_callback_t,
        context: usize,
    ) -> u64 {
        self.cancel(address);
        let due = now
            .checked_add(Duration::from_micros(usecs))
            .unwrap_or(now + Duration::from_secs(u64::from(u32::MAX)));
        self.next_seq += 1;
        self.set.push(SetAlarm {
            address,
            due,
            seq: self.next_seq,
            callback,
            context,
        });
        self.ticks(due)
    }

    /// Cancels the alarm at `address`; whether it was set.
    pub(crate) fn cancel(&mut self, address: usize) -> bool {
        let before = self.set.len();
        self.set.retain(|alarm| alarm.address != address);
        self.set.len() != before
    }

    /// gm_flush_alarm: makes the alarm at `address` due at `now`; whether it was set.
    pub(crate) fn flush(&mut self, address: usize, now: Instant) -> bool {
        let mut found = false;
        for alarm in self.set.iter_mut().filter(|alarm| alarm.address == address) {
            alarm.due = alarm.due.min(now);
            found = true;
        }
        found
    }

    /// When the next alarm is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.set.iter().map(|alarm| alarm.due).min()
    }

    /// Takes the alarm due first, if one is due at `now`.
    pub(crate) fn take_due(&mut self, now: Instant) -> Option<SetAlarm> {
        let (index, _) = self
            .set
            .iter()
            .enumerate()
            .filter(|(_, alarm)| alarm.due <= now)
            .min_by_key(|(_, alarm)| (alarm.due, alarm.seq))?;
        Some(self.set.remove(index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarms_fire_in_the_order_they_are_due_and_cancelled_ones_never() {
        let mut alarms = Alarms::new();
        let now = Instant::now();
        alarms.set(1, 300, now, None, 10);
        alarms.set(2, 100, now, None, 20);
        alarms.set(3, 200, now, None, 30);
        alarms.set(4, 200, now, None, 40);
        assert!(alarms.cancel(3));
        assert!(!alarms.cancel(3));
        // Set again: only the new deadline counts.
        alarms.set(1, 50, now, None, 11);
        assert_eq!(alarms.next_due(), Some(now + Duration::from_micros(50)));
        assert!(alarms.take_due(now).is_none(), "nothing is due yet");
        let later = now + Duration::from_millis(1);
        let order: Vec<usize> = std::iter::from_fn(|| alarms.take_due(later))
            .map(|alarm| alarm.context)
            .collect();
        assert_eq!(order, [11, 20, 40]);
        assert_eq!(alarms.next_due(), None);
    }

    #[test]
    fn the_clock_counts_half_microseconds() {
        let alarms = Alarms::new();
        let epoch = alarms.epoch;
        assert_eq!(alarms.ticks(epoch + Duration::from_micros(10)), 20);
        assert_eq!(alarms.ticks(epoch), 0);
    }
}
