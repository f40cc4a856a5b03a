//! The fabric map: which UDP address each node id of the fabric listens on (GM's mapper output,
//! written by hand or by a script).
//!
//! A text file, one node per line:
//!
//! ```text
//! # nicbar fabric map
//! node 0 127.0.0.1:7400
//! node 1 127.0.0.2:7400 alpha   # a comment may follow an entry
//! ```
//!
//! `node <id> <ip>:<port> [<name>]`: the id is a decimal `u16`, the address an IPv4 or IPv6 socket
//! address (`[::1]:7400`) whose port is 1 to 65535, the optional name the node's host name on the fabric (what GM's
//! `gm_host_name_to_node_id` looks up; up to 127 printable ASCII characters, no spaces; without
//! one the node is called by its address: `nicbar_control::naming`). `#` starts a comment; blank
//! lines are ignored. Node ids, addresses and names are unique. Every daemon of a fabric reads
//! the same map; each binds the addresses of the nodes it runs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use shared_abi::ids::NodeId;

/// Node ids and their UDP addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FabricMap {
    nodes: BTreeMap<u16, SocketAddr>,
    names: BTreeMap<u16, String>,
}

/// Why a fabric map was refused.
#[derive(Debug)]
pub enum FabricError {
    /// The file could not be read.
    Read {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A line is not `node <id> <address>`.
    Syntax {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A node id appears twice.
    DuplicateNode {
        /// 1-based line number of the second entry.
        line: usize,
        /// The node id.
        node: u16,
    },
    /// An address appears twice.
    DuplicateAddress {
        /// 1-based line number of the second entry.
        line: usize,
        /// The address.
        address: SocketAddr,
    },
    /// A name appears twice.
    DuplicateName {
        /// 1-based line number of the second entry.
        line: usize,
        /// The name.
        name: String,
    },
}

impl std::fmt::Display for FabricError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Read { path, source } => write!(f, "cannot read fabric map {path}: {source}"),
            Self::Syntax { line, reason } => write!(f, "fabric map line {line}: {reason}"),
            Self::DuplicateNode { line, node } => {
                write!(f, "fabric map line {line}: node {node} is listed twice")
            }
            Self::DuplicateAddress { line, address } => {
                write!(
                    f,
                    "fabric map line {line}: address {address} is listed twice"
                )
            }
            Self::DuplicateName { line, name } => {
                write!(f, "fabric map line {line}: name `{name}` is listed twice")
            }
        }
    }
}

impl std::error::Error for FabricError {}

impl FabricMap {
    /// An empty map (every node is in-process).
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads and parses the map in `path`.
    ///
    /// # Errors
    /// [`FabricError`] with the line at fault.
    pub fn read(path: &Path) -> Result<Self, FabricError> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let refuse = |source| FabricError::Read {
            path: path.display().to_string(),
            source,
        };
        let not_a_file = || {
            refuse(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            ))
        };
        // Look before opening (opening a FIFO to read waits for a writer, forever), open without
        // blocking, and look again at what was opened.
        if !std::fs::metadata(path).map_err(refuse)?.is_file() {
            return Err(not_a_file());
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
            .open(path)
            .map_err(refuse)?;
        if !file.metadata().map_err(refuse)?.is_file() {
            return Err(not_a_file());
        }
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(refuse)?;
        Self::parse(&text)
    }

    /// Parses a map.
    ///
    /// # Errors
    /// [`FabricError`] with the line at fault.
    pub fn parse(text: &str) -> Result<Self, FabricError> {
        let mut map = Self::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let syntax = |reason: String| FabricError::Syntax { line, reason };
            let mut words = content.split_whitespace();
            match words.next() {
                Some("node") => {}
                Some(other) => return Err(syntax(format!("expected `node`, found `{other}`"))),
                None => continue,
            }
            let (Some(id), Some(address), name, None) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return Err(syntax(
                    "expected `node <id> <ip>:<port> [<name>]`".to_owned(),
                ));
            };
            let node: u16 = id
                .parse()
                .map_err(|_| syntax(format!("`{id}` is not a node id (0..=65535)")))?;
            let address: SocketAddr = address
                .parse()
                .map_err(|_| syntax(format!("`{address}` is not an <ip>:<port> address")))?;
            if address.port() == 0 {
                // Port 0 would bind whatever port the kernel picks, which no peer can know.
                return Err(syntax(format!(
                    "`{address}`: the port must be 1 to 65535, not 0"
                )));
            }
            if map.nodes.contains_key(&node) {
                return Err(FabricError::DuplicateNode { line, node });
            }
            if map.nodes.values().any(|known| *known == address) {
                return Err(FabricError::DuplicateAddress { line, address });
            }
            if let Some(name) = name {
                if !nicbar_control::naming::valid_name(name) {
                    return Err(syntax(format!(
                        "`{name}` is not a host name (1 to {} printable ASCII characters)",
                        nicbar_control::naming::MAX_NAME_LEN
                    )));
                }
                if map.names.values().any(|known| known == name) {
                    return Err(FabricError::DuplicateName {
                        line,
                        name: name.to_owned(),
                    });
                }
                map.names.insert(node, name.to_owned());
            }
            map.nodes.insert(node, address);
        }
        Ok(map)
    }

    /// Adds or replaces `node`'s address.
    pub fn insert(&mut self, node: NodeId, address: SocketAddr) {
        self.nodes.insert(node.get(), address);
    }

    /// The address of `node`, if the map names it.
    pub fn address(&self, node: NodeId) -> Option<SocketAddr> {
        self.nodes.get(&node.get()).copied()
    }

    /// The name the map gives `node`, if it gives one.
    pub fn name(&self, node: NodeId) -> Option<&str> {
        self.names.get(&node.get()).map(String::as_str)
    }

    /// The node listening on `address`, if any.
    pub fn node_at(&self, address: SocketAddr) -> Option<NodeId> {
        self.nodes
            .iter()
            .find(|(_, known)| **known == address)
            .map(|(node, _)| NodeId::new(*node))
    }

    /// Every entry, by node id.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, SocketAddr)> + '_ {
        self.nodes
            .iter()
            .map(|(node, address)| (NodeId::new(*node), *address))
    }

    /// The map as text in the format [`FabricMap::parse`] reads.
    pub fn to_text(&self) -> String {
        let mut text = String::from("# nicbar fabric map: node <id> <ip>:<port> [<name>]\n");
        for (node, address) in self.iter() {
            match self.name(node) {
                Some(name) => text.push_str(&format!("node {} {address} {name}\n", node.get())),
                None => text.push_str(&format!("node {} {address}\n", node.get())),
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_comments_and_blank_lines() {
        let map = FabricMap::parse(
            "# two nodes\n\nnode 0 127.0.0.1:7400\n  node 7 [::1]:9 beta # trailing comment\n",
        )
        .unwrap();
        assert_eq!(map.name(NodeId::new(0)), None);
        assert_eq!(map.name(NodeId::new(7)), Some("beta"));
        assert_eq!(
            map.address(NodeId::new(0)),
            Some("127.0.0.1:7400".parse().unwrap())
        );
        assert_eq!(
            map.address(NodeId::new(7)),
            Some("[::1]:9".parse().unwrap())
        );
        assert_eq!(map.address(NodeId::new(1)), None);
        assert_eq!(
            map.node_at("127.0.0.1:7400".parse().unwrap()),
            Some(NodeId::new(0))
        );
        assert_eq!(FabricMap::parse(&map.to_text()).unwrap(), map);
    }

    #[test]
    fn refuses_bad_lines_with_their_number() {
        let error = FabricMap::parse("node 0 127.0.0.1:1\nhost 1 127.0.0.1:2\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "fabric map line 2: expected `node`, found `host`"
        );
        assert!(matches!(
            FabricMap::parse("node 70000 127.0.0.1:1"),
            Err(FabricError::Syntax { line: 1, .. })
        ));
        assert_eq!(
            FabricMap::parse("node 1 127.0.0.1:0")
                .unwrap_err()
                .to_string(),
            "fabric map line 1: `127.0.0.1:0`: the port must be 1 to 65535, not 0"
        );
        assert!(matches!(
            FabricMap::parse("node 1 127.0.0.1:65536"),
            Err(FabricError::Syntax { line: 1, .. })
        ));
        assert!(matches!(
            FabricMap::parse("node 1 localhost:1"),
            Err(FabricError::Syntax { line: 1, .. })
        ));
        assert!(matches!(
            FabricMap::parse("node 1 127.0.0.1:1 name extra"),
            Err(FabricError::Syntax { line: 1, .. })
        ));
        let long = "n".repeat(nicbar_control::naming::MAX_NAME_LEN + 1);
        assert!(matches!(
            FabricMap::parse(&format!("node 1 127.0.0.1:1 {long}")),
            Err(FabricError::Syntax { line: 1, .. })
        ));
        assert!(matches!(
            FabricMap::parse("node 1 127.0.0.1:1 na\u{e9}me"),
            Err(FabricError::Syntax { line: 1, .. })
        ));
        assert_eq!(
            FabricMap::parse("node 1 127.0.0.1:1 a\nnode 2 127.0.0.1:2 a")
                .unwrap_err()
                .to_string(),
            "fabric map line 2: name `a` is listed twice"
        );
        assert!(matches!(
            FabricMap::parse("node 1 127.0.0.1:1\nnode 1 127.0.0.1:2"),
            Err(FabricError::DuplicateNode { line: 2, node: 1 })
        ));
        assert!(matches!(
            FabricMap::parse("node 1 127.0.0.1:1\n\nnode 2 127.0.0.1:1"),
            Err(FabricError::DuplicateAddress { line: 3, .. })
        ));
    }
}
