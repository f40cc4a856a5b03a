//! A table of records named by a slot and a serial number, so that a stale or forged name finds
//! nothing: the names the C API puts into token contexts and tags.

/// Records named by `(slot, serial)`.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    entries: Vec<Option<(u32, T)>>,
    free: Vec<u32>,
    serial: u32,
    serial_mask: u32,
}

impl<T> Slab<T> {
    /// A table whose serial numbers have `serial_bits` bits (1 to 32).
    pub(crate) fn new(serial_bits: u32) -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            serial: 0,
            serial_mask: u32::MAX >> (32 - serial_bits.clamp(1, 32)),
        }
    }

    /// Stores `value`; returns its slot and serial.
    pub(crate) fn insert(&mut self, value: T) -> (u32, u32) {
        self.serial = self.serial.wrapping_add(1) & self.serial_mask;
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.entries.push(None);
                (self.entries.len() - 1) as u32
            }
        };
        self.entries[slot as usize] = Some((self.serial, value));
        (slot, self.serial)
    }

    /// The record at `slot` if its serial is `serial`.
    pub(crate) fn get(&self, slot: u32, serial: u32) -> Option<&T> {
        match self.entries.get(slot as usize)? {
            Some((stored, value)) if *stored == serial => Some(value),
            _ => None,
        }
    }

    /// The record at `slot` if its serial is `serial`, to change.
    pub(crate) fn get_mut(&mut self, slot: u32, serial: u32) -> Option<&mut T> {
        match self.entries.get_mut(slot as usize)? {
            Some((stored, value)) if *stored == serial => Some(value),
            _ => None,
        }
    }

    /// Takes the record at `slot` if its serial is `serial`.
    pub(crate) fn remove(&mut self, slot: u32, serial: u32) -> Option<T> {
        let entry = self.entries.get_mut(slot as usize)?;
        if entry.as_ref()?.0 != serial {
            return None;
        }
        let (_, value) = entry.take()?;
        self.free.push(slot);
        Some(value)
    }

    /// The records the table holds.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().flatten().map(|(_, value)| value)
    }

    /// How many records the table holds.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }
}

/// The token context that names record `slot` with `serial`.
pub(crate) fn name(slot: u32, serial: u32) -> u64 {
    u64::from(serial) << 32 | u64::from(slot)
}

/// The record a token context names.
pub(crate) fn unname(context: u64) -> (u32, u32) {
    (
        (context & u64::from(u32::MAX)) as u32,
        (context >> 32) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_found_by_its_name_only_until_it_is_removed() {
        let mut slab = Slab::new(16);
        let (a, a_serial) = slab.insert("a");
        let (b, b_serial) = slab.insert("b");
        assert_ne!(a, b);
        assert_eq!(slab.len(), 2);
        assert_eq!(slab.get(a, a_serial), Some(&"a"));
        assert_eq!(
            slab.get(a, a_serial.wrapping_add(1)),
            None,
            "a forged serial"
        );
        assert_eq!(slab.get(99, a_serial), None, "a slot never used");
        assert_eq!(slab.remove(a, a_serial), Some("a"));
        assert_eq!(slab.remove(a, a_serial), None, "removed twice");
        // The slot is reused under a new serial: the old name finds nothing.
        let (again, again_serial) = slab.insert("c");
        assert_eq!(again, a);
        assert_ne!(again_serial, a_serial);
        assert_eq!(slab.get(a, a_serial), None);
        *slab.get_mut(b, b_serial).unwrap() = "B";
        assert_eq!(slab.get(b, b_serial), Some(&"B"));
        assert_eq!(slab.len(), 2);
    }

    #[test]
    fn serials_wrap_within_their_bits() {
        let mut slab = Slab::new(2);
        let serials: Vec<u32> = (0..6)
            .map(|_| {
                let (slot, serial) = slab.insert(());
                slab.remove(slot, serial);
                serial
            })
            .collect();
        assert_eq!(serials, [1, 2, 3, 0, 1, 2]);
    }
}
