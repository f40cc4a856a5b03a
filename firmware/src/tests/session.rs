//! Sessions bound to both NICs' incarnations: traffic recorded before a restart or a give-up is
//! never taken again, and genuine traffic right after runs.

use core::time::Duration;

use shared_abi::event::{EventKind, Status};
use shared_abi::packet::PacketKind;

use super::*;

/// Runs `test` on a thread with room for the NICs a restart builds (a NIC core is large, and an
/// unoptimised build assembles it on the stack).
fn on_large_stack(test: fn()) {
    std::thread::Builder::new()
        .stack_size(32 << 20)
        .spawn(test)
        .unwrap()
        .join()
        .unwrap();
}

fn keyed() -> Config {
    Config {
        fabric_key: Some(crate::auth::FabricKey::new([7; 32])),
        ..Config::default()
    }
}

/// Node 0 port 3 sends `count` messages (numbered from `first`) to node 1 port 2, which has
/// buffers for them; runs the wire and returns what was carried.
fn send_messages(net: &mut Net, first: u8, count: u8) -> Vec<WirePacket> {
    provide_buffers(net, (1, 2), u32::from(count));
    for n in first..first + count {
        send_message(net, (0, 3), (1, 2), n, 64);
    }
    net.doorbell(0);
    net.run_for(Duration::from_millis(50))
}

fn received(net: &mut Net, node: u16, port: u8) -> usize {
    of_kind(&net[node].events(port), EventKind::RECEIVED).len()
}

fn barrier_completions(net: &mut Net, node: u16, port: u8) -> usize {
    of_kind(&net[node].events(port), EventKind::BARRIER_COMPLETED).len()
}

#[test]
fn a_keyed_connection_opens_with_a_three_packet_handshake_and_then_carries_messages() {
    on_large_stack(
        a_keyed_connection_opens_with_a_three_packet_handshake_and_then_carries_messages_body,
    );
}

fn a_keyed_connection_opens_with_a_three_packet_handshake_and_then_carries_messages_body() {
    let mut net = Net::with_config(2, keyed());
    net.open(0, 3);
    net.open(1, 2);
    let carried = send_messages(&mut net, 0, 3);
    let hellos = carried
        .iter()
        .filter(|p| p.kind() == PacketKind::HELLO)
        .count();
    assert_eq!(hellos, 3, "offer, answer, confirmation");
    assert_eq!(received(&mut net, 1, 2), 3);
    let sent = of_kind(&net[0].events(3), EventKind::SENT);
    assert!(sent.iter().all(|e| e.status == Status::SUCCESS));
    assert_eq!(sent.len(), 3);
}

#[test]
fn a_capture_replayed_to_a_restarted_receiver_delivers_nothing_and_genuine_traffic_follows() {
    on_large_stack(a_capture_replayed_to_a_restarted_receiver_delivers_nothing_and_genuine_traffic_follows_body);
}

fn a_capture_replayed_to_a_restarted_receiver_delivers_nothing_and_genuine_traffic_follows_body() {
    let mut net = Net::with_config(2, keyed());
    net.open(0, 3);
    net.open(1, 2);
    let capture = send_messages(&mut net, 0, 4);
    assert_eq!(received(&mut net, 1, 2), 4);

    net.restart(1, 1);
    net.open(1, 2);
    provide_buffers(&mut net, (1, 2), 8);
    let rejected_before = net[1].nic.counters().unauthenticated;
    for packet in &capture {
        net.deliver(packet);
    }
    net.run_for(Duration::from_millis(20));
    assert_eq!(
        received(&mut net, 1, 2),
        0,
        "nothing of the capture is delivered"
    );
    assert!(net[1].nic.counters().unauthenticated > rejected_before);

    // Genuine traffic: the sender finds the receiver's new session and its messages arrive.
    send_messages(&mut net, 10, 3);
    assert_eq!(received(&mut net, 1, 2), 3);
}

#[test]
fn a_capture_of_a_restarted_sender_replayed_after_an_idle_gap_delivers_nothing() {
    on_large_stack(
        a_capture_of_a_restarted_sender_replayed_after_an_idle_gap_delivers_nothing_body,
    );
}

fn a_capture_of_a_restarted_sender_replayed_after_an_idle_gap_delivers_nothing_body() {
    let mut net = Net::with_config(2, keyed());
    net.open(0, 3);
    net.open(1, 2);
    let capture = send_messages(&mut net, 0, 4);
    assert_eq!(received(&mut net, 1, 2), 4);

    // The sender restarts and talks to the receiver again.
    net.restart(0, 1);
    net.open(0, 3);
    send_messages(&mut net, 20, 2);
    assert_eq!(received(&mut net, 1, 2), 2);

    // Idle past the give-up time, then the old capture comes back.
    let give_up = net[1].nic.config().give_up_after;
    net.run_for(give_up + Duration::from_millis(500));
    provide_buffers(&mut net, (1, 2), 8);
    for packet in &capture {
        net.deliver(packet);
    }
    net.run_for(Duration::from_millis(20));
    assert_eq!(
        received(&mut net, 1, 2),
        0,
        "nothing of the capture is delivered"
    );

    // Genuine traffic right after runs.
    send_messages(&mut net, 30, 3);
    assert_eq!(received(&mut net, 1, 2), 3);
}

#[test]
fn a_capture_replayed_into_a_live_session_disturbs_nothing() {
    on_large_stack(a_capture_replayed_into_a_live_session_disturbs_nothing_body);
}

fn a_capture_replayed_into_a_live_session_disturbs_nothing_body() {
    let mut net = Net::with_config(2, keyed());
    net.open(0, 3);
    net.open(1, 2);
    let capture = send_messages(&mut net, 0, 4);
    assert_eq!(received(&mut net, 1, 2), 4);
    let give_up = net[1].nic.config().give_up_after;
    net.run_for(give_up + Duration::from_millis(500));
    provide_buffers(&mut net, (1, 2), 8);
    for packet in &capture {
        net.deliver(packet);
    }
    net.run_for(Duration::from_millis(20));
    assert_eq!(
        received(&mut net, 1, 2),
        0,
        "duplicates of a session are not delivered"
    );
    send_messages(&mut net, 40, 3);
    assert_eq!(received(&mut net, 1, 2), 3);
}

#[test]
fn barrier_packets_of_an_earlier_incarnation_complete_no_barrier() {
    on_large_stack(barrier_packets_of_an_earlier_incarnation_complete_no_barrier_body);
}

fn barrier_packets_of_an_earlier_incarnation_complete_no_barrier_body() {
    let mut net = Net::with_config(2, keyed());
    net.open(0, 1);
    net.open(1, 1);
    net[0].start_barrier(1, &[exchange(1, 1, 0)], 0xa, 0);
    net[1].start_barrier(1, &[exchange(0, 1, 0)], 0xb, 0);
    let capture = net.run_for(Duration::from_millis(20));
    assert_eq!(barrier_completions(&mut net, 0, 1), 1);
    assert_eq!(barrier_completions(&mut net, 1, 1), 1);

    // Node 1 restarts and starts the same barrier while node 0 has no process on the port.
    net.close(0, 1);
    net.run_for(Duration::from_millis(20));
    net.restart(1, 1);
    net.open(1, 1);
    net[1].start_barrier(1, &[exchange(0, 1, 0)], 0xc, 0);
    for packet in &capture {
        net.deliver(packet);
    }
    net.run_for(Duration::from_millis(50));
    assert_eq!(
        barrier_completions(&mut net, 1, 1),
        0,
        "no barrier completes from an earlier incarnation's packets"
    );
}

#[test]
fn an_unanswered_offer_is_paced_and_the_peer_is_given_up_on() {
    on_large_stack(an_unanswered_offer_is_paced_and_the_peer_is_given_up_on_body);
}

fn an_unanswered_offer_is_paced_and_the_peer_is_given_up_on_body() {
    let mut net = Net::with_config(2, keyed());
    net.open(0, 3);
    net[1].silent = true;
    send_message(&mut net, (0, 3), (1, 2), 0, 64);
    net.doorbell(0);
    let give_up = net[0].nic.config().give_up_after;
    let carried = net.run_for(give_up + Duration::from_millis(100));
    let offers = carried
        .iter()
        .filter(|p| p.kind() == PacketKind::HELLO)
        .count();
    // 2 ms doubling to 64 ms: about 36 offers in 2 s, not one per retransmission interval.
    assert!(offers < 60, "{offers} offers in the give-up time");
    let sent = of_kind(&net[0].events(3), EventKind::SENT);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status, Status::TARGET_NODE_UNREACHABLE);
}
