//! The collective calls: the all-to-all exchange behind start, malloc and the mutexes; the sum
//! by pairwise exchange behind the fused barrier; ARMCI_Malloc and ARMCI_Free.

use nicbar::SharedBytes;

use crate::core::{Allocation, Armci, message, read_u32, read_u64};
use crate::error::ArmciError;

impl Armci {
    /// Sends `entry` to every other rank and returns every rank's entry, by rank (this rank's
    /// own at its place). Collective: every rank calls it in the same order.
    pub(crate) fn exchange(&mut self, entry: &[u8]) -> Result<Vec<Vec<u8>>, ArmciError> {
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        let size = self.size();
        // Each rank starts with its successor, so no rank is everyone's first.
        for step in 1..size {
            let to = (self.rank + step) % size;
            self.send_message(to, message::EXCHANGE, sequence, 0, entry)?;
        }
        let mut entries = Vec::with_capacity(size);
        for from in 0..size {
            if from == self.rank {
                entries.push(entry.to_vec());
            } else {
                entries.push(self.take_message(
                    message::EXCHANGE,
                    sequence,
                    0,
                    from,
                    "an exchange",
                )?);
            }
        }
        Ok(entries)
    }

    /// Sums `values` (one per rank) over every rank by recursive doubling — the pairwise
    /// exchange, log2 N rounds; a job whose size is not a power of two first folds its extra
    /// ranks into the others and hands them the result at the end. Collective.
    pub(crate) fn sum_by_pairwise_exchange(
        &mut self,
        values: &[u64],
    ) -> Result<Vec<u64>, ArmciError> {
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        let size = self.size();
        let power = if size.is_power_of_two() {
            size
        } else {
            size.next_power_of_two() / 2
        };
        let extra = size - power;
        let mut sum = values.to_vec();
        let encode = |v: &[u64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let decode = |bytes: &[u8]| -> Result<Vec<u64>, ArmciError> {
            (0..size)
                .map(|i| read_u64(bytes, i * 8))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| ArmciError::Protocol("a short sum".to_owned()))
        };
        const FOLD: u8 = 0xfe;
        const UNFOLD: u8 = 0xff;
        if self.rank >= power {
            let partner = self.rank - power;
            self.send_message(partner, message::REDUCE, sequence, FOLD, &encode(&sum))?;
            let total =
                self.take_message(message::REDUCE, sequence, UNFOLD, partner, "a barrier")?;
            return decode(&total);
        }
        if self.rank < extra {
            let theirs = self.take_message(
                message::REDUCE,
                sequence,
                FOLD,
                self.rank + power,
                "a barrier",
            )?;
            add(&mut sum, &decode(&theirs)?);
        }
        let mut distance = 1;
        let mut round = 0u8;
        while distance < power {
            let partner = self.rank ^ distance;
            self.send_message(partner, message::REDUCE, sequence, round, &encode(&sum))?;
            let theirs =
                self.take_message(message::REDUCE, sequence, round, partner, "a barrier")?;
            add(&mut sum, &decode(&theirs)?);
            distance <<= 1;
            round += 1;
        }
        if self.rank < extra {
            self.send_message(
                self.rank + power,
                message::REDUCE,
                sequence,
                UNFOLD,
                &encode(&sum),
            )?;
        }
        Ok(sum)
    }

    /// ARMCI_Malloc: allocates `bytes` of registered memory on this rank (each rank may ask for
    /// a different length, 0 for none) and returns every rank's base address, by rank (0 where
    /// a rank asked for none). Collective.
    ///
    /// # Errors
    /// [`ArmciError::Port`] if the port's table of regions is full (16 regions per port, 2 of them
    /// this library's own and one its mutexes'); a peer's failure.
    pub fn malloc(&mut self, bytes: usize) -> Result<Vec<u64>, ArmciError> {
        // Whole words, so an int's word for a read-modify-write lies inside.
        let len = bytes.div_ceil(8) * 8;
        let local = if len == 0 {
            None
        } else {
            Some(self.port.register_memory(len)?)
        };
        let (base, key) = local
            .as_ref()
            .map_or((0, 0), |r| (r.bytes().as_ptr() as u64, r.key()));
        let mut entry = Vec::with_capacity(20);
        entry.extend_from_slice(&base.to_le_bytes());
        entry.extend_from_slice(&(len as u64).to_le_bytes());
        entry.extend_from_slice(&key.to_le_bytes());
        let entries = self.exchange(&entry)?;
        let mut allocation = Allocation {
            local,
            bases: Vec::with_capacity(entries.len()),
            lens: Vec::with_capacity(entries.len()),
            keys: Vec::with_capacity(entries.len()),
        };
        for entry in &entries {
            match (read_u64(entry, 0), read_u64(entry, 8), read_u32(entry, 16)) {
                (Some(base), Some(len), Some(key)) => {
                    allocation.bases.push(base);
                    allocation.lens.push(len);
                    allocation.keys.push(key);
                }
                _ => return Err(ArmciError::Protocol("a short malloc entry".to_owned())),
            }
        }
        let bases = allocation.bases.clone();
        self.allocations.push(allocation);
        Ok(bases)
    }

    /// This rank's memory of the allocation whose base address here is `base`.
    pub fn local_memory(&self, base: u64) -> Option<&SharedBytes> {
        self.allocations
            .iter()
            .find(|a| a.bases[self.rank] == base && base != 0)
            .and_then(|a| a.local.as_ref())
            .map(|r| r.bytes())
    }

    /// ARMCI_Free: frees the allocation whose base address on this rank is `base` (0 if this
    /// rank asked for no bytes: every rank then names the allocation by the first one it did not
    /// free whose local base is 0). Every put to it completes first. Collective.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] if no allocation has that base; a peer's failure.
    pub fn free(&mut self, base: u64) -> Result<(), ArmciError> {
        let index = self
            .allocations
            .iter()
            .position(|a| a.bases[self.rank] == base)
            .ok_or_else(|| {
                ArmciError::Invalid(format!(
                    "{base:#x} is not an ARMCI_Malloc base of this rank"
                ))
            })?;
        // Every put to it lands before any rank gives its memory back.
        self.barrier()?;
        let allocation = self.allocations.remove(index);
        if let Some(region) = &allocation.local {
            self.port.deregister_memory(region)?;
        }
        Ok(())
    }
}

fn add(sum: &mut [u64], other: &[u64]) {
    for (s, o) in sum.iter_mut().zip(other) {
        *s = s.wrapping_add(*o);
    }
}
