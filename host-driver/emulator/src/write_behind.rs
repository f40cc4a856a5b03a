//! A put's segments written behind their arrival: one `process_vm_writev` for many packets.
//!
//! The mirror of [`crate::read_ahead`] at the target: each 4 KiB segment of a put written into
//! the process with a system call of its own costs several times the copy. The board holds the
//! bytes of segments that are not the put's last, while the next ones follow on at the next
//! address, and writes them in one go ([`firmware::Hal::write_process_memory_part`]): when the
//! last segment comes (before its reply can leave), before anything else touches process memory,
//! when [`WRITE_BEHIND`] bytes are held, and at the end of every round of the NIC. Bytes thus
//! reach the process in the order they came, at most a round later; only the put's completion
//! says they are there, and it waits for them. A put that fails leaves the bytes it reached
//! undefined, as an RDMA write does, and tells its target nothing a late byte could contradict.
//! A get's data is never held: its initiator is told of a failure at once, and may use the
//! buffer again from then on.

use nix::unistd::Pid;

use crate::hal::process_memory;

/// The most bytes held.
pub(crate) const WRITE_BEHIND: usize = 256 * 1024;

/// How many puts whose held bytes could not be written are remembered until their last
/// segment: a put that never ends (its initiator gone) must not be remembered for ever.
const FAILURES_KEPT: usize = 64;

/// Whose bytes: the process, its port, and the put's name.
pub(crate) type Owner = (Pid, usize, u64);

/// The bytes held, and whose they are.
#[derive(Debug, Default)]
pub(crate) struct WriteBehind {
    owner: Option<Owner>,
    /// The process's address of `data[0]`.
    address: u64,
    data: Vec<u8>,
    /// Puts a held write of which failed, oldest first: their last segment fails.
    failed: Vec<Owner>,
}

impl WriteBehind {
    /// Writes `data` at `address` of the process for a segment of `owner`'s put, or holds it
    /// if the put goes on (not `last`). For the last segment, every byte of the put is written
    /// on return.
    ///
    /// # Errors
    /// For the last segment: a write of the put's bytes failed (this one's or a held one's).
    pub(crate) fn write(
        &mut self,
        owner: Owner,
        address: u64,
        data: &[u8],
        last: bool,
    ) -> Result<(), nix::Error> {
        let follows = self.owner == Some(owner)
            && self.address.checked_add(self.data.len() as u64) == Some(address);
        if !follows {
            self.flush();
        }
        if self.owner.is_none() {
            self.owner = Some(owner);
            self.address = address;
        }
        self.data.extend_from_slice(data);
        if last || self.data.len() >= WRITE_BEHIND {
            self.flush();
        }
        if !last {
            return Ok(());
        }
        match self.failed.iter().position(|failed| *failed == owner) {
            Some(at) => {
                self.failed.remove(at);
                Err(nix::Error::EFAULT)
            }
            None => Ok(()),
        }
    }

    /// Writes what is held.
    pub(crate) fn flush(&mut self) {
        let Some(owner) = self.owner.take() else {
            return;
        };
        if process_memory::write(owner.0, self.address, &self.data).is_err() {
            if self.failed.len() == FAILURES_KEPT {
                self.failed.remove(0);
            }
            self.failed.push(owner);
        }
        self.data.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Pid {
        Pid::this()
    }

    #[test]
    fn held_segments_are_written_by_the_last_in_order() {
        let mut target = vec![0u8; 3 * 4096];
        let base = target.as_mut_ptr() as u64;
        let mut writer = WriteBehind::default();
        for (n, position) in (0..target.len()).step_by(4096).enumerate() {
            let segment = vec![n as u8 + 1; 4096];
            let last = position + 4096 == target.len();
            writer
                .write((me(), 1, 5), base + position as u64, &segment, last)
                .unwrap();
            if !last {
                assert_eq!(std::hint::black_box(&target)[position], 0, "held");
            }
        }
        let mut expected = vec![1u8; 4096];
        expected.extend([2u8; 4096]);
        expected.extend([3u8; 4096]);
        assert_eq!(std::hint::black_box(&target), &expected);
    }

    #[test]
    fn another_put_writes_what_is_held_first() {
        let mut target = vec![0u8; 8192];
        let base = target.as_mut_ptr() as u64;
        let mut writer = WriteBehind::default();
        writer.write((me(), 1, 5), base, &[7; 4096], false).unwrap();
        // Another put's last segment over the same bytes lands after the held ones, as it
        // came.
        writer.write((me(), 1, 6), base, &[9; 4096], true).unwrap();
        assert_eq!(std::hint::black_box(&target)[..4096], [9; 4096]);
    }

    #[test]
    fn a_held_segment_that_cannot_be_written_fails_its_put_at_the_last() {
        let mut target = vec![0u8; 4096];
        let base = target.as_mut_ptr() as u64;
        let mut writer = WriteBehind::default();
        // Address 0 is never mapped: the held bytes fail when the round ends.
        writer.write((me(), 1, 5), 0, &[1; 4096], false).unwrap();
        writer.flush();
        assert_eq!(
            writer.write((me(), 1, 5), base, &[1; 4096], true),
            Err(nix::Error::EFAULT)
        );
        // The failure was the put's own: the next put is not blamed for it.
        writer.write((me(), 1, 6), base, &[2; 4096], true).unwrap();
        assert_eq!(std::hint::black_box(&target)[..], [2; 4096]);
    }
}
