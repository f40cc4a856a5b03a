//! `nicctl status`: show what a running daemon (emulated or QEMU NICs) is doing, as tables or
//! JSON.

use std::fmt::Write as _;
use std::path::PathBuf;

use nicbar_control::{ConnectionReport, PortReport, StatusReport, UnitStatus};
use serde_json::{Value, json};

use super::CliResult;

/// Arguments of `nicctl status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The daemon's control socket [default: as for `nicctl emulate`].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Runs `nicctl status`.
///
/// # Errors
/// No daemon answers on the socket, or it sent something unexpected.
pub fn run_status(args: StatusArgs) -> CliResult {
    let socket = args.socket.unwrap_or_else(nicbar_control::socket_path);
    let report = nicbar_control::query_status(&socket)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status_json(&report))?);
    } else {
        print!("{}", format_status(&report));
    }
    Ok(())
}

/// The report as tables: units, open ports, connections.
pub fn format_status(report: &StatusReport) -> String {
    let mut out = String::new();
    let _ = write!(out, "daemon pid {}", report.daemon_pid);
    match report.fault_seed {
        Some(seed) => {
            let _ = writeln!(out, ", fault injector on (seed {seed})");
        }
        None => out.push('\n'),
    }
    let mut units = vec![row(&[
        "UNIT", "NODE", "ADDRESS", "PORTS", "TX", "RX", "LOST", "DUPED", "DELAYED", "UNDELIV",
    ])];
    for unit in &report.units {
        units.push(vec![
            unit.unit.to_string(),
            unit.node.to_string(),
            unit.address.clone().unwrap_or_else(|| "-".to_owned()),
            unit.ports.len().to_string(),
            unit.wire.transmitted.to_string(),
            unit.wire.received.to_string(),
            unit.wire.lost.to_string(),
            unit.wire.duplicated.to_string(),
            unit.wire.delayed.to_string(),
            unit.wire.undeliverable.to_string(),
        ]);
    }
    out.push_str(&table(&units));
    out.push_str(&threads_table(&report.units));
    let mut ports = vec![row(&[
        "UNIT",
        "PORT",
        "GEN",
        "OWNER",
        "SENDS",
        "RECV-BUFS",
        "EVENTS",
        "STATE",
    ])];
    for unit in &report.units {
        for port in &unit.ports {
            ports.push(vec![
                unit.unit.to_string(),
                port.port.to_string(),
                port.generation.to_string(),
                port.owner_pid
                    .map_or_else(|| "-".to_owned(), |p| p.to_string()),
                port.held_sends.to_string(),
                port.receive_buffers.to_string(),
                port.pending_events.to_string(),
                match (port.faulted, port.barrier) {
                    (Some(status), _) => format!("faulted (status {status})"),
                    (None, Some(barrier)) => format!(
                        "{}barrier step {}/{}, {} node {} port {} (round {})",
                        if port.closing { "closing, " } else { "" },
                        barrier.step + 1,
                        barrier.steps,
                        if barrier.sending {
                            "sending to"
                        } else {
                            "waiting for"
                        },
                        barrier.waiting_node,
                        barrier.waiting_port,
                        barrier.round
                    ),
                    (None, None) if port.barrier_running => "barrier".to_owned(),
                    (None, None) if port.closing => "closing".to_owned(),
                    (None, None) => "ok".to_owned(),
                },
            ]);
        }
    }
    out.push_str("\nopen ports\n");
    if ports.len() == 1 {
        out.push_str("(none)\n");
    } else {
        out.push_str(&table(&ports));
    }
    let mut connections = vec![row(&[
        "UNIT", "PEER", "SENT", "RESENT", "RECEIVED", "ACKS-TX", "ACKS-RX", "NACKS-TX", "NACKS-RX",
        "REJ-TX", "REJ-RX", "DROPS", "GIVE-UPS",
    ])];
    for unit in &report.units {
        for c in &unit.connections {
            connections.push(
                [
                    u64::from(unit.unit),
                    u64::from(c.peer),
                    c.sent,
                    c.resent,
                    c.received,
                    c.acks_sent,
                    c.acks_received,
                    c.nacks_sent,
                    c.nacks_received,
                    c.rejects_sent,
                    c.rejects_received,
                    c.drops,
                    c.give_ups,
                ]
                .iter()
                .map(u64::to_string)
                .collect(),
            );
        }
    }
    out.push_str("\nconnections\n");
    if connections.len() == 1 {
        out.push_str("(none)\n");
    } else {
        out.push_str(&table(&connections));
    }
    out
}

/// The NIC threads: which units each runs, its idle policy and the CPU time it used. Empty for
/// a backend without such threads (QEMU NICs).
fn threads_table(units: &[UnitStatus]) -> String {
    let mut threads: std::collections::BTreeMap<u16, (Vec<String>, &str, u64)> =
        std::collections::BTreeMap::new();
    for unit in units.iter().filter(|unit| !unit.idle.is_empty()) {
        let entry = threads
            .entry(unit.thread)
            .or_insert_with(|| (Vec::new(), unit.idle.as_str(), 0));
        entry.0.push(unit.unit.to_string());
        // Each unit reports its thread's clock when asked; the latest is the largest.
        entry.2 = entry.2.max(unit.thread_cpu_ns);
    }
    if threads.is_empty() {
        return String::new();
    }
    let mut rows = vec![row(&["THREAD", "UNITS", "IDLE", "CPU-MS"])];
    for (thread, (units, idle, cpu_ns)) in threads {
        rows.push(vec![
            thread.to_string(),
            units.join(","),
            idle.to_owned(),
            format!("{:.1}", cpu_ns as f64 / 1e6),
        ]);
    }
    format!("\nNIC threads\n{}", table(&rows))
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|cell| (*cell).to_owned()).collect()
}

fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for cells in rows {
        let line: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The report as JSON: an object per struct, field for field, `null` for what is absent.
pub fn status_json(report: &StatusReport) -> Value {
    json!({
        "daemon_pid": report.daemon_pid,
        "fault_seed": report.fault_seed,
        "units": report.units.iter().map(unit_json).collect::<Vec<_>>(),
    })
}

fn unit_json(unit: &UnitStatus) -> Value {
    let c = &unit.counters;
    let w = &unit.wire;
    json!({
        "unit": unit.unit,
        "thread": unit.thread,
        "idle": unit.idle,
        "thread_cpu_ns": unit.thread_cpu_ns,
        "node": unit.node,
        "address": unit.address,
        "ports": unit.ports.iter().map(port_json).collect::<Vec<_>>(),
        "connections": unit.connections.iter().map(connection_json).collect::<Vec<_>>(),
        "counters": {
            "malformed_packets": c.malformed_packets,
            "no_connection": c.no_connection,
            "tokens_rejected": c.tokens_rejected,
            "barriers_completed": c.barriers_completed,
            "barriers_failed": c.barriers_failed,
            "messages_delivered": c.messages_delivered,
            "unauthenticated": c.unauthenticated,
        },
        "wire": {
            "transmitted": w.transmitted,
            "received": w.received,
            "lost": w.lost,
            "duplicated": w.duplicated,
            "delayed": w.delayed,
            "undeliverable": w.undeliverable,
            "strangers": w.strangers,
            "spoofed": w.spoofed,
        },
    })
}

fn port_json(port: &PortReport) -> Value {
    json!({
        "port": port.port,
        "generation": port.generation,
        "owner_pid": port.owner_pid,
        "held_sends": port.held_sends,
        "receive_buffers": port.receive_buffers,
        "barrier_running": port.barrier_running,
        "barrier": port.barrier.map(|b| json!({
            "step": b.step,
            "steps": b.steps,
            "waiting_node": b.waiting_node,
            "waiting_port": b.waiting_port,
            "round": b.round,
            "sending": b.sending,
        })),
        "closing": port.closing,
        "pending_events": port.pending_events,
        "faulted": port.faulted,
    })
}

fn connection_json(c: &ConnectionReport) -> Value {
    json!({
        "peer": c.peer,
        "sent": c.sent,
        "resent": c.resent,
        "received": c.received,
        "acks_sent": c.acks_sent,
        "acks_received": c.acks_received,
        "nacks_sent": c.nacks_sent,
        "nacks_received": c.nacks_received,
        "rejects_sent": c.rejects_sent,
        "rejects_received": c.rejects_received,
        "drops": c.drops,
        "give_ups": c.give_ups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nicbar_control::BarrierReport;

    #[test]
    fn the_status_table_lists_ports_and_connections() {
        let report = StatusReport {
            daemon_pid: 77,
            fault_seed: Some(5),
            units: vec![UnitStatus {
                unit: 0,
                thread: 1,
                idle: "adaptive (sleeping)".to_owned(),
                thread_cpu_ns: 2_500_000,
                node: 3,
                address: None,
                ports: vec![PortReport {
                    port: 2,
                    generation: 1,
                    owner_pid: Some(4242),
                    held_sends: 0,
                    receive_buffers: 16,
                    barrier_running: true,
                    barrier: Some(BarrierReport {
                        step: 2,
                        steps: 4,
                        waiting_node: 1,
                        waiting_port: 3,
                        round: 2,
                        sending: false,
                    }),
                    closing: false,
                    pending_events: 0,
                    faulted: None,
                }],
                connections: vec![ConnectionReport {
                    peer: 9,
                    sent: 10,
                    resent: 2,
                    received: 0,
                    acks_sent: 0,
                    acks_received: 0,
                    nacks_sent: 0,
                    nacks_received: 0,
                    rejects_sent: 0,
                    rejects_received: 0,
                    drops: 0,
                    give_ups: 0,
                }],
                counters: Default::default(),
                wire: Default::default(),
            }],
        };
        let text = format_status(&report);
        assert!(text.starts_with("daemon pid 77, fault injector on (seed 5)\n"));
        assert!(
            text.contains(
                "\n0     2     1    4242   0      16         0       \
                 barrier step 3/4, waiting for node 1 port 3 (round 2)\n"
            ),
            "{text}"
        );
        assert!(text.contains("\n0     9     10    2       0"), "{text}");
        assert!(
            text.contains("NIC threads\nTHREAD  UNITS  IDLE                 CPU-MS\n1       0      adaptive (sleeping)  2.5\n"),
            "{text}"
        );
    }

    #[test]
    fn the_json_report_names_every_field() {
        let report = StatusReport {
            daemon_pid: 1,
            fault_seed: None,
            units: vec![UnitStatus {
                unit: 0,
                thread: 0,
                idle: "poll".to_owned(),
                thread_cpu_ns: 7,
                node: 10,
                address: Some("127.0.0.1:9".to_owned()),
                ports: vec![],
                connections: vec![],
                counters: Default::default(),
                wire: Default::default(),
            }],
        };
        let json = status_json(&report);
        assert_eq!(json["fault_seed"], Value::Null);
        assert_eq!(json["units"][0]["node"], 10);
        assert_eq!(json["units"][0]["address"], "127.0.0.1:9");
        assert_eq!(json["units"][0]["wire"]["strangers"], 0);
        assert_eq!(json["units"][0]["idle"], "poll");
        assert_eq!(json["units"][0]["thread_cpu_ns"], 7);
    }
}
