//! The values of a port's reductions (a reduction is a barrier whose packets carry values that
//! its steps combine; see [`crate::barrier`]): each value the port sent, kept until its packets
//! are through (it is rebuilt into every retransmission), and each value that arrived, kept until
//! the step that combines it takes it. They live in the port's slot, as a broadcast's bytes do:
//! the port's packets outlive its barrier.

use shared_abi::ids::{BarrierId, Generation, NodeId, PortId};
use shared_abi::reduce::REDUCE_MAX;

use super::SlotSet;

/// Values a port slot keeps at once: a reduction of a group of `n` sends and receives about
/// `log2 n + 2` of each, and a port runs a few at once.
pub(crate) const REDUCE_VALUES: usize = 32;

/// Which value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ValueKey {
    /// The value incarnation `generation` of the port sent in `round` of `barrier`.
    Sent {
        generation: Generation,
        barrier: BarrierId,
        round: u8,
    },
    /// The value that `(node, port)` sent the port in `round` of `barrier`.
    Arrived {
        node: NodeId,
        port: PortId,
        barrier: BarrierId,
        round: u8,
    },
}

/// One value.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReduceValue {
    key: ValueKey,
    len: u8,
    bytes: [u8; REDUCE_MAX],
}

impl ReduceValue {
    /// The value's bytes.
    pub(crate) fn data(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

/// The values of a port's reductions.
///
/// A lookup runs on every step of a reduction, so it looks only at the places in use (`used`):
/// a port keeps a few values at a time, its sent ones going when their barrier ends
/// ([`crate::barrier`]), not the whole table's worth of them.
#[derive(Debug)]
pub(crate) struct ReduceValues {
    /// The places of `kept` that hold a value.
    used: SlotSet<REDUCE_VALUES>,
    kept: [Option<ReduceValue>; REDUCE_VALUES],
}

impl Default for ReduceValues {
    fn default() -> Self {
        Self {
            used: SlotSet::EMPTY,
            kept: [None; REDUCE_VALUES],
        }
    }
}

impl ReduceValues {
    /// The values kept, with their places.
    fn in_use(&self) -> impl Iterator<Item = (usize, &ReduceValue)> + '_ {
        self.used
            .iter()
            .filter_map(|place| Some((place, self.kept.get(place)?.as_ref()?)))
    }

    /// The place of the value under `key`.
    fn place_of(&self, key: ValueKey) -> Option<usize> {
        self.in_use()
            .find(|(_, value)| value.key == key)
            .map(|(place, _)| place)
    }

    /// The value under `key`.
    pub(crate) fn get(&self, key: ValueKey) -> Option<&ReduceValue> {
        self.in_use()
            .find(|(_, value)| value.key == key)
            .map(|(_, value)| value)
    }

    /// The keys of the values kept.
    pub(crate) fn keys(&self) -> impl Iterator<Item = ValueKey> + '_ {
        self.in_use().map(|(_, value)| value.key)
    }

    /// Takes the value under `key` out.
    pub(crate) fn take(&mut self, key: ValueKey) -> Option<ReduceValue> {
        let place = self.place_of(key)?;
        self.used.remove(place);
        self.kept.get_mut(place)?.take()
    }

    /// Keeps `data` (at most [`REDUCE_MAX`] bytes of it) under `key`: in the place that holds
    /// `key` already, else a free one. Returns whether it found a place (if not, the caller
    /// makes room with [`ReduceValues::forget`] and asks again).
    pub(crate) fn keep(&mut self, key: ValueKey, data: &[u8]) -> bool {
        let Some(place) = self.place_of(key).or_else(|| self.used.first_free()) else {
            return false;
        };
        let Some(slot) = self.kept.get_mut(place) else {
            return false;
        };
        let len = data.len().min(REDUCE_MAX);
        let mut value = ReduceValue {
            key,
            len: len as u8,
            bytes: [0; REDUCE_MAX],
        };
        if let (Some(to), Some(from)) = (value.bytes.get_mut(..len), data.get(..len)) {
            to.copy_from_slice(from);
        }
        *slot = Some(value);
        self.used.insert(place);
        true
    }

    /// Forgets the values `forget` names.
    pub(crate) fn forget(&mut self, forget: impl Fn(&ValueKey) -> bool) {
        for place in self.used.iter() {
            if let Some(kept) = self.kept.get_mut(place)
                && kept.is_some_and(|value| forget(&value.key))
            {
                *kept = None;
                self.used.remove(place);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(barrier: u32) -> ValueKey {
        ValueKey::Sent {
            generation: Generation::new(1),
            barrier: BarrierId::new(0, 0, barrier),
            round: 0,
        }
    }

    #[test]
    fn room_is_a_free_place_or_the_key_kept_already_and_full_needs_a_forget() {
        let mut values = ReduceValues::default();
        for barrier in 0..REDUCE_VALUES as u32 {
            assert!(values.keep(sent(barrier), &[barrier as u8]));
        }
        assert!(!values.keep(sent(1000), &[1]), "every place is taken");
        assert!(values.keep(sent(3), &[9]), "its own place");
        assert_eq!(values.get(sent(3)).map(ReduceValue::data), Some(&[9u8][..]));
        values.forget(|key| *key == sent(5));
        assert!(values.keep(sent(1000), &[7]));
        assert_eq!(
            values.get(sent(1000)).map(ReduceValue::data),
            Some(&[7u8][..])
        );
        assert!(values.get(sent(5)).is_none());
    }
}
