//! A QEMU NIC's neighbour table: which MAC address answers for each IPv4 address of the fabric,
//! learned by ARP (RFC 826), in fixed storage, reading no clock and doing no I/O.
//!
//! QEMU NICs name their MACs after their nodes ([`super::net::node_mac`]), so among themselves
//! they need no ARP; a daemon NIC's address is one of its host's, whose MAC the host's kernel
//! chose. On a fabric that mixes the two (the QEMU NICs on taps of a bridge that carries the
//! daemons' addresses), the board asks for a peer's MAC with ARP, answers the kernel's requests
//! for its own address, and keeps what it learned here.
//!
//! The caller asks [`Neighbours::resolve`] before each datagram it sends: a known MAC is the
//! answer; for an unknown one it says whether to broadcast a request now (at most once per
//! [`REQUEST_INTERVAL`] per address), and the caller sends the datagram to its fallback (the
//! node-named MAC, right for a QEMU peer; a daemon peer misses it, and the reliability protocol
//! sends it again once the reply is in). Every ARP packet that arrives goes to
//! [`Neighbours::on_arp`], which merges the sender (RFC 826's algorithm: an address already in
//! the table is updated; one that asked this NIC is added) and says whether a reply is owed.
//!
//! A full table replaces its entries in turn, an address still being asked for first. ARP is
//! not authenticated: whoever can put frames on the segment can misdirect a node's datagrams,
//! which costs them their delivery (each packet is authenticated under the fabric key) but never
//! lets a forgery in.

use core::time::Duration;

use super::net::{Arp, ArpOperation, Ipv4Address, MacAddress};

/// The shortest time between two requests for one address.
pub const REQUEST_INTERVAL: Duration = Duration::from_millis(10);

/// What the table knows of an address.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// A free entry.
    Free,
    /// Asked for; no reply yet. When the last request went out.
    Asked(Duration),
    /// Answered.
    Known(MacAddress),
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    address: Ipv4Address,
    state: State,
}

/// What [`Neighbours::resolve`] says of an address.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Resolution {
    /// Its MAC address.
    Known(MacAddress),
    /// Not known yet: `ask` says whether to broadcast a request for it now.
    Unknown {
        /// Send a request now (none went out for it within [`REQUEST_INTERVAL`]).
        ask: bool,
    },
}

/// What [`Neighbours::on_arp`] did with an ARP packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ArpOutcome {
    /// The sender's MAC address was taken into the table.
    pub learned: bool,
    /// A reply to send to the requester: it asked for this NIC's address.
    pub reply: Option<Arp>,
}

/// The MAC addresses of up to `N` neighbours.
#[derive(Clone, Debug)]
pub struct Neighbours<const N: usize> {
    entries: [Entry; N],
    /// The entry a full table replaces next.
    next_replaced: usize,
}

impl<const N: usize> Default for Neighbours<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether `mac` may be a neighbour's: not zero, not a group (broadcast or multicast) address.
fn is_unicast(mac: MacAddress) -> bool {
    mac != MacAddress::default() && mac.0[0] & 1 == 0
}

impl<const N: usize> Neighbours<N> {
    /// An empty table.
    pub const fn new() -> Self {
        Self {
            entries: [Entry {
                address: Ipv4Address([0; 4]),
                state: State::Free,
            }; N],
            next_replaced: 0,
        }
    }

    fn find(&mut self, address: Ipv4Address) -> Option<&mut Entry> {
        self.entries
            .iter_mut()
            .find(|entry| entry.state != State::Free && entry.address == address)
    }

    /// An entry for `address` (not in the table): a free one, else one still being asked for,
    /// else the next in turn.
    fn make_room(&mut self, address: Ipv4Address, state: State) {
        let index = self
            .entries
            .iter()
            .position(|entry| entry.state == State::Free)
            .or_else(|| {
                self.entries
                    .iter()
                    .position(|entry| matches!(entry.state, State::Asked(_)))
            })
            .unwrap_or_else(|| {
                let index = self.next_replaced % N.max(1);
                self.next_replaced = (index + 1) % N.max(1);
                index
            });
        if let Some(entry) = self.entries.get_mut(index) {
            *entry = Entry { address, state };
        }
    }

    /// The MAC address of `address`, or whether to ask for it now (`now`: any clock that only
    /// goes forward).
    pub fn resolve(&mut self, address: Ipv4Address, now: Duration) -> Resolution {
        match self.find(address) {
            Some(Entry {
                state: State::Known(mac),
                ..
            }) => Resolution::Known(*mac),
            Some(entry) => {
                let due = match entry.state {
                    // In nanoseconds: `Duration`'s own subtraction links a panic path.
                    State::Asked(since) => {
                        now.as_nanos().saturating_sub(since.as_nanos())
                            >= REQUEST_INTERVAL.as_nanos()
                    }
                    _ => true,
                };
                if due {
                    entry.state = State::Asked(now);
                }
                Resolution::Unknown { ask: due }
            }
            None => {
                self.make_room(address, State::Asked(now));
                Resolution::Unknown { ask: true }
            }
        }
    }

    /// Takes in an ARP packet that came to this NIC (`own`: its IPv4 and MAC addresses) and
    /// says what was learned and whether a reply is owed (RFC 826's merge: a sender already in
    /// the table is updated; a sender that asked for this NIC, or answered it, is added). A
    /// sender with a group or zero MAC, or claiming this NIC's own address, is ignored.
    pub fn on_arp(&mut self, arp: &Arp, own: (Ipv4Address, MacAddress)) -> ArpOutcome {
        let (own_address, own_mac) = own;
        let ignored = ArpOutcome {
            learned: false,
            reply: None,
        };
        if !is_unicast(arp.sender_mac) || arp.sender_ip == own_address {
            return ignored;
        }
        let for_us = arp.target_ip == own_address;
        let mut learned = false;
        if let Some(entry) = self.find(arp.sender_ip) {
            entry.state = State::Known(arp.sender_mac);
            learned = true;
        } else if for_us {
            self.make_room(arp.sender_ip, State::Known(arp.sender_mac));
            learned = true;
        }
        let reply = (for_us && arp.operation == ArpOperation::REQUEST).then_some(Arp {
            operation: ArpOperation::REPLY,
            sender_mac: own_mac,
            sender_ip: own_address,
            target_mac: arp.sender_mac,
            target_ip: arp.sender_ip,
        });
        ArpOutcome { learned, reply }
    }

    /// Addresses whose MAC the table holds.
    pub fn known(&self) -> usize {
        self.entries
            .iter()
            .filter(|entry| matches!(entry.state, State::Known(_)))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qemu::net::node_address;
    use proptest::prelude::*;

    const OWN: (Ipv4Address, MacAddress) = (
        Ipv4Address([10, 77, 0, 0]),
        MacAddress([0x52, 0x54, 0, 0, 0, 0]),
    );
    const BRIDGE: MacAddress = MacAddress([0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x01]);

    fn ms(value: u64) -> Duration {
        Duration::from_millis(value)
    }

    fn arp(operation: ArpOperation, sender: (Ipv4Address, MacAddress), target: Ipv4Address) -> Arp {
        Arp {
            operation,
            sender_mac: sender.1,
            sender_ip: sender.0,
            target_mac: MacAddress::default(),
            target_ip: target,
        }
    }

    #[test]
    fn an_unknown_address_is_asked_for_at_most_once_per_interval_then_known_from_the_reply() {
        let mut table = Neighbours::<4>::new();
        let peer = node_address(1);
        assert_eq!(
            table.resolve(peer, ms(0)),
            Resolution::Unknown { ask: true }
        );
        assert_eq!(
            table.resolve(peer, ms(5)),
            Resolution::Unknown { ask: false }
        );
        assert_eq!(
            table.resolve(peer, ms(10)),
            Resolution::Unknown { ask: true }
        );
        assert_eq!(
            table.resolve(peer, ms(19)),
            Resolution::Unknown { ask: false }
        );
        let reply = Arp {
            target_mac: OWN.1,
            ..arp(ArpOperation::REPLY, (peer, BRIDGE), OWN.0)
        };
        assert_eq!(
            table.on_arp(&reply, OWN),
            ArpOutcome {
                learned: true,
                reply: None
            }
        );
        assert_eq!(table.resolve(peer, ms(20)), Resolution::Known(BRIDGE));
        assert_eq!(table.known(), 1);
    }

    #[test]
    fn a_request_for_us_is_answered_and_its_sender_learned() {
        let mut table = Neighbours::<4>::new();
        let peer = node_address(3);
        let outcome = table.on_arp(&arp(ArpOperation::REQUEST, (peer, BRIDGE), OWN.0), OWN);
        assert!(outcome.learned);
        assert_eq!(
            outcome.reply,
            Some(Arp {
                operation: ArpOperation::REPLY,
                sender_mac: OWN.1,
                sender_ip: OWN.0,
                target_mac: BRIDGE,
                target_ip: peer,
            })
        );
        assert_eq!(table.resolve(peer, ms(0)), Resolution::Known(BRIDGE));
    }

    #[test]
    fn requests_for_others_teach_only_what_the_table_already_holds() {
        let mut table = Neighbours::<4>::new();
        let (known, stranger) = (node_address(1), node_address(2));
        let _ = table.resolve(known, ms(0));
        let elsewhere = node_address(9);
        assert_eq!(
            table.on_arp(
                &arp(ArpOperation::REQUEST, (stranger, BRIDGE), elsewhere),
                OWN
            ),
            ArpOutcome {
                learned: false,
                reply: None
            }
        );
        assert_eq!(table.known(), 0);
        let moved = MacAddress([0x02, 0, 0, 0, 0, 7]);
        assert!(
            table
                .on_arp(&arp(ArpOperation::REQUEST, (known, moved), elsewhere), OWN)
                .learned
        );
        assert_eq!(table.resolve(known, ms(1)), Resolution::Known(moved));
    }

    #[test]
    fn group_and_zero_macs_and_our_own_address_are_ignored() {
        let mut table = Neighbours::<4>::new();
        let peer = node_address(1);
        for mac in [
            MacAddress::BROADCAST,
            MacAddress::default(),
            MacAddress([0x33, 0x33, 0, 0, 0, 1]),
        ] {
            let outcome = table.on_arp(&arp(ArpOperation::REQUEST, (peer, mac), OWN.0), OWN);
            assert_eq!(
                outcome,
                ArpOutcome {
                    learned: false,
                    reply: None
                },
                "{mac:?}"
            );
        }
        let conflict = table.on_arp(&arp(ArpOperation::REQUEST, (OWN.0, BRIDGE), OWN.0), OWN);
        assert_eq!(conflict.reply, None);
        assert_eq!(table.known(), 0);
    }

    #[test]
    fn a_full_table_replaces_a_pending_entry_before_a_known_one() {
        let mut table = Neighbours::<2>::new();
        let (a, b, c) = (node_address(1), node_address(2), node_address(3));
        let _ = table.on_arp(&arp(ArpOperation::REQUEST, (a, BRIDGE), OWN.0), OWN);
        let _ = table.resolve(b, ms(0));
        assert_eq!(table.resolve(c, ms(0)), Resolution::Unknown { ask: true });
        // b was pending and gave way; a stays known.
        assert_eq!(table.resolve(a, ms(1)), Resolution::Known(BRIDGE));
        assert_eq!(table.resolve(b, ms(1)), Resolution::Unknown { ask: true });
    }

    proptest! {
        /// Any sequence of lookups and ARP packets keeps the table within its size, and a MAC
        /// the table gives is one some packet carried for that address.
        #[test]
        fn any_sequence_keeps_the_table_consistent(
            steps in prop::collection::vec((any::<bool>(), 0u16..12, 0u8..4, any::<bool>()), 0..200)
        ) {
            let mut table = Neighbours::<4>::new();
            let mut now = Duration::ZERO;
            for (lookup, node, mac_byte, request) in steps {
                now += ms(3);
                let address = node_address(node);
                if lookup {
                    if let Resolution::Known(mac) = table.resolve(address, now) {
                        prop_assert_eq!(mac.0[5], (node as u8) ^ 0x40);
                    }
                } else {
                    let mac = MacAddress([2, 0, 0, 0, mac_byte, (node as u8) ^ 0x40]);
                    let operation = if request { ArpOperation::REQUEST } else { ArpOperation::REPLY };
                    let _ = table.on_arp(&arp(operation, (address, mac), OWN.0), OWN);
                }
                prop_assert!(table.known() <= 4);
            }
        }
    }
}
