//! Tests that run in a network namespace of their own (`unshare -rn`, which works for root and,
//! with user namespaces, for anyone), where raw sockets are allowed and nothing leaves the
//! machine; and the raw-socket forger they attack the fabric with.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::Command;

use nix::sys::socket::{MsgFlags, SockaddrIn, sendto};

/// Set in the copy of a test that runs inside the namespace.
const INSIDE: &str = "NICBAR_TEST_IN_NAMESPACE";

/// Runs `inside` in a new network namespace with loopback up: this test binary runs itself
/// there as the test `test` (named `label` in what it says). Skips, saying why, where no
/// namespace can be made; fails if the copy inside fails or runs nothing.
pub(crate) fn in_namespace(label: &str, test: &str, inside: fn()) {
    if std::env::var_os(INSIDE).is_some() {
        inside();
        return;
    }
    let usable = ["unshare", "ip"]
        .iter()
        .all(|tool| Command::new(tool).arg("-V").output().is_ok());
    if !usable {
        eprintln!("{label}: skipped: `unshare` and `ip` are needed for a network namespace");
        return;
    }
    let output = Command::new("unshare")
        .args(["-rn", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(INSIDE, "1")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() && said.contains("unshare: ") {
        eprintln!("{label}: skipped: no network namespace could be made here:\n{said}");
        return;
    }
    eprintln!("{said}");
    assert!(output.status.success(), "inside the namespace:\n{said}");
    assert!(
        said.contains("1 passed"),
        "the test did not run inside:\n{said}"
    );
}

/// A UDP port free on `ip` just now.
pub(crate) fn free_port(ip: Ipv4Addr) -> u16 {
    std::net::UdpSocket::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends `packet` (and `trailer`) as a UDP datagram from `from` to `to` through a raw socket: the
/// source address is whatever the attacker writes.
pub(crate) fn forge(
    raw: &std::os::fd::OwnedFd,
    from: SocketAddrV4,
    to: SocketAddrV4,
    datagram: &[u8],
) {
    let udp_len = 8 + datagram.len();
    let total = 20 + udp_len;
    let mut bytes = Vec::with_capacity(total);
    bytes.extend_from_slice(&[
        0x45,
        0,
        (total >> 8) as u8,
        total as u8,
        0,
        0,
        0,
        0,
        64,
        17,
        0,
        0,
    ]);
    bytes.extend_from_slice(&from.ip().octets());
    bytes.extend_from_slice(&to.ip().octets());
    bytes.extend_from_slice(&from.port().to_be_bytes());
    bytes.extend_from_slice(&to.port().to_be_bytes());
    bytes.extend_from_slice(&(udp_len as u16).to_be_bytes());
    bytes.extend_from_slice(&[0, 0]); // no UDP checksum (allowed over IPv4)
    bytes.extend_from_slice(datagram);
    sendto(
        std::os::fd::AsRawFd::as_raw_fd(raw),
        &bytes,
        &SockaddrIn::from(to),
        MsgFlags::empty(),
    )
    .unwrap();
}
