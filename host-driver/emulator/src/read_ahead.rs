//! A put's source read ahead of its segments: one `process_vm_readv` for many packets.
//!
//! A put of a megabyte leaves in 4 KiB segments. Reading each from the process with a system call
//! of its own costs several times the copy: at every call the kernel looks the process up,
//! checks the access and pins the pages. The board reads up to [`READ_AHEAD`] bytes at once
//! instead and serves the same operation's next segments from that copy. The core names the
//! operation and how far it will read ([`firmware::Hal::read_process_memory_ahead`]), and an
//! operation's source may not change while it runs, so a segment served from the copy holds what
//! a read of its own would have found.

use nix::unistd::Pid;

use crate::hal::process_memory;

/// The most bytes read at once.
pub(crate) const READ_AHEAD: usize = 256 * 1024;

/// The bytes last read ahead, and whose they are.
#[derive(Debug, Default)]
pub(crate) struct ReadAhead {
    /// The process, port and operation the bytes were read for; `None` when they serve nothing.
    owner: Option<(Pid, usize, u64)>,
    /// The process's address of `data[0]`.
    address: u64,
    data: Vec<u8>,
}

impl ReadAhead {
    /// Fills `out` with the bytes at `address` of process `pid` for `operation` of `port`,
    /// which will read on up to `address + ahead`: from the bytes read ahead when they hold
    /// them, else by reading up to [`READ_AHEAD`] bytes (falling back to `out` alone if the
    /// longer read fails).
    ///
    /// # Errors
    /// The kernel's refusal of the read of `out`.
    pub(crate) fn read(
        &mut self,
        (pid, port, operation): (Pid, usize, u64),
        address: u64,
        out: &mut [u8],
        ahead: usize,
    ) -> Result<(), nix::Error> {
        let owner = Some((pid, port, operation));
        if self.owner == owner
            && let Some(held) = address
                .checked_sub(self.address)
                .and_then(|from| usize::try_from(from).ok())
                .and_then(|from| self.data.get(from..from.checked_add(out.len())?))
        {
            out.copy_from_slice(held);
            if ahead <= out.len() {
                // The operation's last segment: nothing more will be asked of these bytes.
                self.owner = None;
            }
            return Ok(());
        }
        self.owner = None;
        // At least the segment, at most READ_AHEAD (`clamp` would panic on a segment longer
        // than that).
        let want = ahead.min(READ_AHEAD).max(out.len());
        if want == out.len() {
            return process_memory::read(pid, address, out);
        }
        self.data.resize(want, 0);
        if process_memory::read(pid, address, &mut self.data).is_err() {
            // Part of the rest may be unreachable: let the segments that reach it fail on
            // their own.
            return process_memory::read(pid, address, out);
        }
        out.copy_from_slice(&self.data[..out.len()]);
        self.owner = owner;
        self.address = address;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads this process's own memory, as the board reads a port owner's.
    fn me() -> Pid {
        Pid::this()
    }

    #[test]
    fn segments_come_from_one_read_and_hold_what_the_memory_held() {
        let source: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
        let base = source.as_ptr() as u64;
        let mut reader = ReadAhead::default();
        let mut got = Vec::new();
        for position in (0..source.len()).step_by(4096) {
            let mut out = vec![0u8; (source.len() - position).min(4096)];
            reader
                .read(
                    (me(), 1, 7),
                    base + position as u64,
                    &mut out,
                    source.len() - position,
                )
                .unwrap();
            got.extend_from_slice(&out);
        }
        assert_eq!(got, source);
        assert_eq!(reader.owner, None, "the last segment lets the bytes go");
    }

    #[test]
    fn another_operation_reads_afresh() {
        let mut source = vec![1u8; 8192];
        let base = source.as_ptr() as u64;
        let mut reader = ReadAhead::default();
        let mut out = [0u8; 4096];
        reader.read((me(), 1, 7), base, &mut out, 8192).unwrap();
        // The process changes its buffer after operation 7 and puts it again as operation 8.
        source.fill(2);
        std::hint::black_box(&source);
        reader.read((me(), 1, 8), base, &mut out, 8192).unwrap();
        assert_eq!(out, [2u8; 4096]);
    }

    #[test]
    fn an_unreachable_rest_does_not_fail_a_reachable_segment() {
        let source = vec![3u8; 4096];
        let mut reader = ReadAhead::default();
        let mut out = [0u8; 4096];
        // The operation claims to read far beyond the buffer (into what may be unmapped).
        reader
            .read((me(), 1, 9), source.as_ptr() as u64, &mut out, usize::MAX)
            .unwrap();
        assert_eq!(out, [3u8; 4096]);
    }
}
