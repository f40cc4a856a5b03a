//! How the fabric names its nodes, one rule for every backend (what [`crate::Request::Nodes`]
//! answers and GM's `gm_host_name_to_node_id`, `gm_node_id_to_host_name` and `gm_unique_id`
//! read):
//!
//! - a node on the fabric map is called what the map calls it (`node 3 10.0.0.4:7400 hostname`),
//!   else its UDP address (`10.0.0.4:7400`), so every daemon of the fabric, reading the same map,
//!   gives it the same name;
//! - a unit of one daemon without a UDP address is `<this host's name>:<unit>`.
//!
//! A node's unique id (GM's 6-byte board id) is a 48-bit hash of what identifies it — its UDP
//! address, or this host's name and its node id — so daemons agree on it too.

use std::net::SocketAddr;

use crate::message::NodeName;

/// The longest host name, in bytes: one less than GM's `GM_MAX_HOST_NAME_LEN`, so a name and its
/// NUL fit the smallest buffer GM gives for one (`gm_get_host_name`'s `char[128]`).
pub const MAX_NAME_LEN: usize = 127;

/// Whether `name` may name a node: 1 to [`MAX_NAME_LEN`] bytes of printable ASCII without
/// spaces.
pub fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len()) && name.bytes().all(|byte| byte.is_ascii_graphic())
}

/// This host's name, as the kernel has it (`localhost` if it cannot be read).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| valid_name(name))
        .unwrap_or_else(|| "localhost".to_owned())
}

/// A node of the fabric map at `address`, called `name` if the map names it.
pub fn fabric_node(node: u16, address: SocketAddr, name: Option<&str>) -> NodeName {
    NodeName {
        node,
        name: name.map_or_else(|| address.to_string(), str::to_owned),
        unique_id: unique_id(&format!("udp {address}")),
    }
}

/// Unit `unit` of a daemon on host `host`, node `node`, reachable only through that daemon.
pub fn unit_node(host: &str, unit: u8, node: u16) -> NodeName {
    NodeName {
        node,
        name: format!("{host}:{unit}"),
        unique_id: unique_id(&format!("unit {host} {node}")),
    }
}

/// A 48-bit id from `identity` (FNV-1a, folded), with the locally administered bit set and the
/// group bit clear in its first byte, as an Ethernet address made up locally is.
fn unique_id(identity: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in identity.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let folded = (hash ^ (hash >> 48)) & 0xffff_ffff_ffff;
    (folded & !(0x01 << 40)) | (0x02 << 40)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_follow_the_rules() {
        let address: SocketAddr = "10.0.0.4:7400".parse().unwrap();
        let named = fabric_node(3, address, Some("alpha"));
        let unnamed = fabric_node(3, address, None);
        assert_eq!(named.name, "alpha");
        assert_eq!(unnamed.name, "10.0.0.4:7400");
        // The id depends on the address alone, so every daemon agrees on it.
        assert_eq!(named.unique_id, unnamed.unique_id);
        assert_ne!(
            named.unique_id,
            fabric_node(3, "10.0.0.4:7401".parse().unwrap(), None).unique_id
        );
        let unit = unit_node("box", 2, 7);
        assert_eq!(unit.name, "box:2");
        for id in [named.unique_id, unit.unique_id] {
            assert_eq!(id >> 48, 0, "{id:#x} is wider than 48 bits");
            assert_eq!((id >> 40) & 0x03, 0x02, "{id:#x}: not a local unicast id");
        }
        assert!(valid_name(&host_name()));
    }

    #[test]
    fn refuses_empty_long_and_spaced_names() {
        assert!(valid_name("node-1.example"));
        assert!(!valid_name(""));
        assert!(!valid_name("a b"));
        assert!(!valid_name("tab\there"));
        assert!(!valid_name("é"));
        assert!(valid_name(&"x".repeat(MAX_NAME_LEN)));
        assert!(!valid_name(&"x".repeat(MAX_NAME_LEN + 1)));
    }
}
