//! GM's send-error stall: after a send to a connection (a target node and port, at a priority)
//! fails, the port sends nothing more to it until the program calls gm_resume_sending (the held
//! sends go, in order) or gm_drop_sends (they end with GM_SEND_DROPPED). Sends the NIC already
//! held when the failure was reported are not called back: they end on their own.

use std::collections::{HashMap, VecDeque};

use crate::types::*;

/// A target and a priority: the unit GM stalls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Connection {
    pub(crate) node: u32,
    pub(crate) port: u32,
    pub(crate) priority: u32,
}

/// A send held while its connection is stalled: gm_send_with_callback's arguments.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeldSend {
    pub(crate) message: usize,
    pub(crate) size: u32,
    pub(crate) length: gm_size_t,
    pub(crate) callback: gm_send_completion_callback_t,
    pub(crate) context: usize,
}

/// The stalled connections of a port, with the sends each holds.
#[derive(Debug, Default)]
pub(crate) struct Stalls {
    held: HashMap<Connection, VecDeque<HeldSend>>,
}

impl Stalls {
    /// A send to `connection` failed: it stalls (if it is not stalled already).
    pub(crate) fn failed(&mut self, connection: Connection) {
        self.held.entry(connection).or_default();
    }

    /// Holds `send` if `connection` is stalled; gives it back if not.
    pub(crate) fn hold(&mut self, connection: Connection, send: HeldSend) -> Option<HeldSend> {
        match self.held.get_mut(&connection) {
            Some(queue) => {
                queue.push_back(send);
                None
            }
            None => Some(send),
        }
    }

    /// Ends the stall of `connection`: the sends it held, in order (none if it was not stalled).
    pub(crate) fn release(&mut self, connection: Connection) -> VecDeque<HeldSend> {
        self.held.remove(&connection).unwrap_or_default()
    }

    /// Whether `connection` is stalled.
    #[cfg(test)]
    pub(crate) fn is_stalled(&self, connection: Connection) -> bool {
        self.held.contains_key(&connection)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(context: usize) -> HeldSend {
        HeldSend {
            message: 0x1000,
            size: 5,
            length: 10,
            callback: None,
            context,
        }
    }

    #[test]
    fn a_failed_connection_holds_its_sends_in_order_until_released() {
        let mut stalls = Stalls::default();
        let target = Connection {
            node: 1,
            port: 2,
            priority: 0,
        };
        let other = Connection {
            priority: 1,
            ..target
        };
        assert!(
            stalls.hold(target, send(1)).is_some(),
            "not stalled: the send goes"
        );
        stalls.failed(target);
        assert!(stalls.is_stalled(target));
        assert!(stalls.hold(target, send(2)).is_none());
        assert!(stalls.hold(target, send(3)).is_none());
        assert!(
            stalls.hold(other, send(4)).is_some(),
            "the other priority is another connection"
        );
        stalls.failed(target);
        let held: Vec<usize> = stalls.release(target).iter().map(|s| s.context).collect();
        assert_eq!(held, [2, 3]);
        assert!(!stalls.is_stalled(target));
        assert!(stalls.release(target).is_empty());
    }
}
