//! The values of a port's reductions (a reduction is a barrier whose packets carry values that
//! its steps combine; see [`crate::barrier`]): each value the port sent, kept until its packets
//! are through (it is rebuilt into every retransmission), and each value that arrived, kept until
//! the step that combines it takes it. They live in the port's slot, as a broadcast's bytes do:
//! the port's packets outlive its barrier.

use shared_abi::ids::{BarrierId, Generation, NodeId, PortId};
use shared_abi::reduce::REDUCE_MAX;

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
#[derive(Debug)]
pub(crate) struct ReduceValues {
    kept: [Option<ReduceValue>; REDUCE_VALUES],
}

impl Default for ReduceValues {
    fn default() -> Self {
        Self {
            kept: [None; REDUCE_VALUES],
        }
    }
}

impl ReduceValues {
    /// The value under `key`.
    pub(crate) fn get(&self, key: ValueKey) -> Option<&ReduceValue> {
        self.kept.iter().flatten().find(|value| value.key == key)
    }

    /// The keys of the values kept.
    pub(crate) fn keys(&self) -> impl Iterator<Item = ValueKey> + '_ {
        self.kept.iter().flatten().map(|value| value.key)
    }

    /// Takes the value under `key` out.
    pub(crate) fn take(&mut self, key: ValueKey) -> Option<ReduceValue> {
        let place = self
            .kept
            .iter()
            .position(|kept| kept.is_some_and(|value| value.key == key))?;
        self.kept.get_mut(place)?.take()
    }

    /// Whether `key` would find a place without evicting anything: it is kept already, or a
    /// place is free.
    pub(crate) fn has_room_for(&self, key: ValueKey) -> bool {
        self.kept
            .iter()
            .any(|kept| kept.is_none_or(|value| value.key == key))
    }

    /// Keeps `data` (at most [`REDUCE_MAX`] bytes of it) under `key`: in the place that holds
    /// `key` already, else a free one ([`ReduceValues::has_room_for`]; the caller makes room
    /// with [`ReduceValues::forget`]). Returns whether it found a place.
    pub(crate) fn keep(&mut self, key: ValueKey, data: &[u8]) -> bool {
        let place = self
            .kept
            .iter()
            .position(|kept| kept.is_some_and(|value| value.key == key))
            .or_else(|| self.kept.iter().position(Option::is_none));
        let Some(slot) = place.and_then(|place| self.kept.get_mut(place)) else {
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
        true
    }

    /// Forgets the values `forget` names.
    pub(crate) fn forget(&mut self, forget: impl Fn(&ValueKey) -> bool) {
        for kept in self.kept.iter_mut() {
            if kept.is_some_and(|value| forget(&value.key)) {
                *kept = None;
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
        assert!(values.has_room_for(sent(0)));
        for barrier in 0..REDUCE_VALUES as u32 {
            assert!(values.keep(sent(barrier), &[barrier as u8]));
        }
        assert!(!values.has_room_for(sent(1000)), "every place is taken");
        assert!(values.has_room_for(sent(3)), "its own place");
        assert!(!values.keep(sent(1000), &[1]), "no place is free");
        values.forget(|key| *key == sent(5));
        assert!(values.has_room_for(sent(1000)));
        assert!(values.keep(sent(1000), &[7]));
        assert_eq!(
            values.get(sent(1000)).map(ReduceValue::data),
            Some(&[7u8][..])
        );
        assert!(values.get(sent(5)).is_none());
    }
}
