//! Progress: every event of the port taken and sorted (received messages, completed sends, puts
//! and operations), and the hellos due again.

use std::time::{Duration, Instant};

use shared_abi::event::Status;
use shared_abi::token::Priority;

use super::FastPath;
use super::context::{context_peer, context_tag, tag};
use super::layout::SIZE_CLASS;
use crate::error::Error;
use crate::event::Event;

/// How soon a hello refused for a closed port is sent again.
const HELLO_RETRY: Duration = Duration::from_millis(10);

impl FastPath {
    /// Takes every waiting event of the port, and sends again the hellos that are due.
    pub(crate) fn progress(&mut self) -> Result<(), Error> {
        while let Some(event) = self.port.receive()? {
            self.handle(event)?;
        }
        let now = Instant::now();
        for index in 0..self.peers.len() {
            if self.peers[index].hello_retry.is_some_and(|at| at <= now) {
                self.peers[index].hello_retry = None;
                self.send_hello(index)?;
            }
        }
        Ok(())
    }

    pub(super) fn handle(&mut self, event: Event) -> Result<(), Error> {
        match event {
            Event::Received {
                buffer,
                length,
                sender_node,
                sender_port,
                status,
                ..
            } => {
                let bytes = buffer[..length.min(buffer.len())].to_vec();
                self.port
                    .provide_receive_buffer(buffer, SIZE_CLASS, Priority::LOW, 0)
                    .map_err(|e| e.error)?;
                if status == Status::SUCCESS {
                    self.take_message(sender_node, sender_port, &bytes)?;
                } else {
                    self.stats.rejected += 1;
                }
            }
            Event::Sent {
                buffer,
                context,
                status,
                ..
            } => {
                self.spare.push(buffer);
                self.sent(context, status);
            }
            Event::SendRejected {
                buffer,
                context,
                status,
                ..
            } => {
                if let Some(buffer) = buffer {
                    self.spare.push(buffer);
                }
                self.sent(context, status);
            }
            Event::OperationDone {
                context,
                status,
                value,
                ..
            } => {
                let index = context_peer(context);
                match context_tag(context) {
                    tag::CREDIT_PUT => {
                        if let Some(peer) = self.peers.get_mut(index) {
                            peer.credit_in_flight = false;
                        }
                        self.operation_failed(index, status, "a credit put");
                        self.return_credit(index);
                    }
                    tag::FAST_PUT => {
                        self.staging_free.push((context & 0xffff_ffff) as usize);
                        self.operation_failed(index, status, "a fast-path put");
                    }
                    tag::WAITED => {
                        self.results.insert(context, (status, value));
                    }
                    _ => {}
                }
            }
            Event::ReceiveRejected {
                buffer: Some(buffer),
                ..
            } => {
                // Keep the buffer as a spare send buffer; the port stays usable.
                self.spare.push(buffer);
            }
            _ => {}
        }
        Ok(())
    }

    pub(super) fn operation_failed(&mut self, index: usize, status: Status, what: &str) {
        if status != Status::SUCCESS
            && let Some(peer) = self.peers.get_mut(index)
            && peer.failed.is_none()
        {
            peer.failed = Some(format!(
                "{what} to {}:{} failed: {status:?}",
                peer.node.get(),
                peer.port.0
            ));
        }
    }

    pub(super) fn sent(&mut self, context: u64, status: Status) {
        let index = context_peer(context);
        match context_tag(context) {
            tag::HELLO if status == Status::SUCCESS => {
                if let Some(peer) = self.peers.get_mut(index) {
                    peer.hello_delivered = true;
                }
            }
            tag::HELLO if status == Status::TARGET_PORT_CLOSED => {
                // The peer has not opened its port yet: say it again.
                self.stats.hellos_refused += 1;
                if let Some(peer) = self.peers.get_mut(index) {
                    peer.hello_retry = Some(Instant::now() + HELLO_RETRY);
                }
            }
            tag::HELLO | tag::DATA | tag::CONTROL => {
                self.operation_failed(index, status, "a message");
            }
            _ => {}
        }
    }
}
