//! Fences and the barrier: the thesis's AllFence with K outstanding acknowledgement requests
//! beside the one-at-a-time baseline (ch. 3), and the fused fence-and-barrier with per-pair
//! operation counters beside AllFence + barrier (ch. 4).
//!
//! An acknowledgement request is a NIC fetch-and-add of 0 on the target's fence word. The NIC
//! applies one port's operations toward a node in the order they were posted, so when the request
//! comes back every put posted before it to that rank is in that rank's memory — the answer
//! ARMCI's server thread gave after finishing a client's puts, given here by the target's NIC
//! with no help from the target's process.

use std::time::Instant;

use nicbar::AtomicOp;

use crate::config::{BarrierMode, FenceMode};
use crate::core::{Armci, control};
use crate::error::ArmciError;

impl Armci {
    /// ARMCI_Fence: returns once every put this rank issued to `rank` is in `rank`'s memory.
    ///
    /// # Errors
    /// A put that failed (to any rank, since the last report), or the request failing.
    pub fn fence(&mut self, rank: usize) -> Result<(), ArmciError> {
        self.check_rank(rank)?;
        match self.config.fence {
            FenceMode::Completions => self.wait_for_puts(Some(rank))?,
            FenceMode::Sequential | FenceMode::Outstanding(_) => {
                if self.dirty[rank] {
                    self.acknowledge(&[rank])?;
                }
            }
        }
        self.dirty[rank] = false;
        self.report_failure()
    }

    /// ARMCI_AllFence: returns once every put this rank issued is in its target's memory, by
    /// the configured [`FenceMode`].
    ///
    /// # Errors
    /// As [`Armci::fence`].
    pub fn all_fence(&mut self) -> Result<(), ArmciError> {
        // The thesis's list of servers this client started work on.
        let mut servers: Vec<usize> = (0..self.size()).filter(|&r| self.dirty[r]).collect();
        match self.config.fence {
            FenceMode::Completions => self.wait_for_puts(None)?,
            FenceMode::Sequential => {
                for &server in &servers {
                    self.acknowledge(&[server])?;
                }
            }
            FenceMode::Outstanding(k) => {
                // Fisher-Yates with this rank's generator: every client asks its servers in its
                // own order, so they do not all ask the same server first (thesis §3.1.2).
                for i in (1..servers.len()).rev() {
                    let j = (self.next_random() % (i as u64 + 1)) as usize;
                    servers.swap(i, j);
                }
                for batch in servers.chunks(k) {
                    self.acknowledge(batch)?;
                }
            }
        }
        self.dirty.iter_mut().for_each(|d| *d = false);
        self.report_failure()
    }

    /// Sends an acknowledgement request to each of `servers` at once and waits for them all.
    fn acknowledge(&mut self, servers: &[usize]) -> Result<(), ArmciError> {
        let mut requests = Vec::with_capacity(servers.len());
        for &server in servers {
            let word = self.control_word(server, control::FENCE_WORD);
            requests.push((
                server,
                self.post_atomic(AtomicOp::FETCH_ADD, server, word, 0, 0, None)?,
            ));
        }
        for (server, context) in requests {
            self.wait_success(context, server, "fence")?;
        }
        Ok(())
    }

    /// Waits until the NIC has reported every put to `rank` (to every rank if `None`) done.
    fn wait_for_puts(&mut self, rank: Option<usize>) -> Result<(), ArmciError> {
        loop {
            let left = match rank {
                Some(rank) => self.puts_in_flight[rank],
                None => self.puts_in_flight.iter().sum(),
            };
            if left == 0 {
                return Ok(());
            }
            self.progress(None)?;
        }
    }

    /// Returns the failure of an operation nobody waited for, if one happened.
    pub(crate) fn report_failure(&mut self) -> Result<(), ArmciError> {
        self.poll()?;
        match self.failure.take() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    /// ARMCI_Barrier: returns once every rank has called it and every put any rank issued before
    /// it is in its target's memory, by the configured [`BarrierMode`]. Collective.
    ///
    /// # Errors
    /// A put that failed, a peer gone, the NIC's barrier failing.
    pub fn barrier(&mut self) -> Result<(), ArmciError> {
        match self.config.barrier {
            BarrierMode::FenceThenBarrier => {
                self.all_fence()?;
                self.port.barrier(&self.group)?;
            }
            BarrierMode::Fused => self.fused_barrier()?,
        }
        self.report_failure()
    }

    /// Thesis §4.3 with the counters where a NIC keeps them: `puts_issued` is the client's
    /// `op_init[]`, and a target's `OP_DONE` word is its `op_done`. The NIC has no counter of
    /// the puts it applied, so each client adds its count to the target's word with one
    /// fetch-and-add posted behind its puts: applied in order after them, it counts them only
    /// once they are in memory — what the thesis's server did after each put, at one atomic per
    /// target per barrier instead of one per put.
    fn fused_barrier(&mut self) -> Result<(), ArmciError> {
        for rank in 0..self.size() {
            let unreported = self.puts_issued[rank] - self.puts_reported[rank];
            if unreported > 0 {
                let word = self.control_word(rank, control::OP_DONE);
                self.post_atomic(
                    AtomicOp::FETCH_ADD,
                    rank,
                    word,
                    unreported,
                    0,
                    Some("barrier count"),
                )?;
                self.puts_reported[rank] = self.puts_issued[rank];
            }
        }
        // The first pairwise exchange: how many puts every client issued to each target.
        let issued = self.puts_issued.clone();
        let totals = self.sum_by_pairwise_exchange(&issued)?;
        let expected = totals[self.rank];
        // Wait for this rank's own counter. Read by the NIC (a fetch-and-add of 0 to this very
        // port), so the read is whole and ordered with the peers' additions.
        let me = self.rank;
        let word = self.control_word(me, control::OP_DONE);
        let deadline = Instant::now() + self.config.collective_timeout;
        loop {
            let done = self.atomic(AtomicOp::FETCH_ADD, me, word, 0, 0)?;
            if done >= expected {
                break;
            }
            if Instant::now() >= deadline {
                return Err(ArmciError::Timeout {
                    what: "the barrier's put count",
                    rank: me,
                });
            }
            self.report_failure()?;
        }
        // The second: the NIC's barrier (pairwise exchange for a power of two).
        self.port.barrier(&self.group)?;
        self.dirty.iter_mut().for_each(|d| *d = false);
        Ok(())
    }
}
