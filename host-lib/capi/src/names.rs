//! Host names, node ids and unique ids, as the fabric names its nodes: what
//! gm_host_name_to_node_id, gm_node_id_to_host_name, gm_get_host_name and gm_unique_id answer.
//!
//! The names are the daemon's (it reads the fabric map; `nicbar_control::naming` has the rule)
//! and fixed for its life, so a port asks once, on the first lookup, and keeps the answer until
//! it closes (`PortState::fabric_names`): the strings gm_node_id_to_host_name returns live as
//! long as the port. This module is the table alone; the port holds it.

use std::ffi::{CString, c_uint};

use nicbar_rs::raw::FabricNode;

/// One node: its id, name (with its NUL, for C) and unique id.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NamedNode {
    pub(crate) node: u16,
    pub(crate) name: CString,
    pub(crate) unique_id: [u8; 6],
}

/// The fabric's nodes, by node id.
#[derive(Debug, Default)]
pub(crate) struct FabricNames {
    nodes: Vec<NamedNode>,
}

impl FabricNames {
    /// The table of `nodes` as the daemon gave them; a name with a NUL in it (which the daemon
    /// never gives) is left out rather than cut.
    pub(crate) fn new(nodes: Vec<FabricNode>) -> Self {
        let mut nodes: Vec<NamedNode> = nodes
            .into_iter()
            .filter_map(|node| {
                Some(NamedNode {
                    node: node.node.get(),
                    name: CString::new(node.name).ok()?,
                    unique_id: node.unique_id,
                })
            })
            .collect();
        nodes.sort_by_key(|node| node.node);
        Self { nodes }
    }

    /// The node called `name` (compared byte for byte, as GM does).
    pub(crate) fn by_name(&self, name: &[u8]) -> Option<&NamedNode> {
        self.nodes.iter().find(|node| node.name.as_bytes() == name)
    }

    /// The node with id `node`.
    pub(crate) fn by_node(&self, node: c_uint) -> Option<&NamedNode> {
        let node = u16::try_from(node).ok()?;
        self.nodes
            .binary_search_by_key(&node, |known| known.node)
            .ok()
            .map(|index| &self.nodes[index])
    }

    /// The node with unique id `unique_id`.
    pub(crate) fn by_unique_id(&self, unique_id: [u8; 6]) -> Option<&NamedNode> {
        self.nodes.iter().find(|node| node.unique_id == unique_id)
    }

    /// The largest node id in use.
    pub(crate) fn max_node(&self) -> Option<u16> {
        self.nodes.last().map(|node| node.node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_abi::ids::NodeId;

    fn node(node: u16, name: &str, last: u8) -> FabricNode {
        FabricNode {
            node: NodeId::new(node),
            name: name.to_owned(),
            unique_id: [2, 0, 0, 0, 0, last],
        }
    }

    #[test]
    fn looks_up_each_way_and_finds_nothing_for_strangers() {
        let names = FabricNames::new(vec![node(9, "gamma", 9), node(1, "alpha", 1)]);
        assert_eq!(names.by_name(b"alpha").map(|n| n.node), Some(1));
        assert_eq!(names.by_name(b"alph"), None);
        assert_eq!(names.by_name(b"ALPHA"), None);
        assert_eq!(
            names.by_node(9).map(|n| n.name.as_bytes()),
            Some(&b"gamma"[..])
        );
        assert!(names.by_node(2).is_none());
        assert!(names.by_node(65536 + 9).is_none());
        assert_eq!(
            names.by_unique_id([2, 0, 0, 0, 0, 1]).map(|n| n.node),
            Some(1)
        );
        assert!(names.by_unique_id([2, 0, 0, 0, 0, 2]).is_none());
        assert_eq!(names.max_node(), Some(9));
        assert_eq!(FabricNames::default().max_node(), None);
    }
}
