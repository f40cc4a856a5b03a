//! Flow control: the sender reads the credit byte the receiver puts; the receiver puts its
//! consumed count when half a ring is unreported.

use shared_abi::rdma::RemotePointer;

use super::FastPath;
use super::context::{context, tag};

impl FastPath {
    /// Takes the credit byte the peer last put.
    pub(super) fn refresh_credit(&mut self, index: usize) {
        let peer = &mut self.peers[index];
        let Some(remote) = peer.remote else { return };
        let mut byte = [0u8];
        self.receiving.bytes().read(peer.credit, &mut byte);
        let behind = u64::from((peer.fast_sent as u8).wrapping_sub(byte[0]));
        if behind <= u64::from(remote.slots) {
            let credited = peer.fast_sent - behind;
            peer.fast_credited = peer.fast_credited.max(credited);
        }
    }

    /// Puts the consumed count to the peer when half a ring is unreported.
    pub(super) fn return_credit(&mut self, index: usize) {
        let Some(peer) = self.peers.get_mut(index) else {
            return;
        };
        let Some(remote) = peer.remote else { return };
        let threshold = u64::from(peer.slots / 2).max(1);
        if peer.slots == 0 || peer.credit_in_flight || peer.consumed - peer.reported < threshold {
            return;
        }
        let at = peer.credit + 8;
        self.receiving.bytes().write(at, &[peer.consumed as u8]);
        let target = RemotePointer {
            key: remote.ring_key,
            offset: remote.credit_offset,
        }
        .to_u64();
        let (node, port, region) = (peer.node, peer.port, self.receiving.clone());
        let ctx = context(tag::CREDIT_PUT, index, peer.consumed);
        // Without a send token now, the credit goes with the next call that finds one.
        if self
            .port
            .put(&region, at, target, 1, node, port, ctx)
            .is_ok()
        {
            let peer = &mut self.peers[index];
            peer.credit_in_flight = true;
            peer.reported = peer.consumed;
            self.stats.credit_puts += 1;
        }
    }
}
