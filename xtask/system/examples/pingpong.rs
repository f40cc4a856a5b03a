//! Ping-pong and streaming between two ports of an emulated NIC pair, started in this process.
//!
//! `cargo run --release -p host-lib --example pingpong [round-trips] [stream-messages]`
//!
//! Prints the round-trip time of a 64-byte message between two processes' worth of ports (two
//! threads here, each owning one port on its own unit) with the waiting side sleeping on its
//! doorbell, then spinning; and the rate of a one-way stream, with the doorbells it cost.

use std::time::{Duration, Instant};

use nicbar::{DmaBuffer, Event, NodeId, Port, PortId, Priority, Status, WaitMode};
use nicbar_emulator::{Emulator, EmulatorConfig};

const SIZE: u8 = 7; // 120-byte messages at most
const LENGTH: usize = 64;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let round_trips: usize = args.next().map_or(Ok(20_000), |a| a.parse())?;
    let stream: usize = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let dir = std::env::temp_dir().join(format!("nicbar-pingpong-{}", std::process::id()));
    let emulator = Emulator::spawn(EmulatorConfig::in_process(dir.join("control.sock"), 2))?;
    for (name, mode) in [
        ("sleep", WaitMode::Sleep),
        ("spin", WaitMode::Spin),
        (
            "spin 50us, then sleep",
            WaitMode::SpinThenSleep(Duration::from_micros(50)),
        ),
    ] {
        let (mean, p50, p99) = ping_pong(emulator.socket(), mode, round_trips)?;
        println!(
            "round trip, {name:<22} {round_trips} x {LENGTH} B: mean {mean:?}, p50 {p50:?}, p99 {p99:?}"
        );
    }
    let (rate, doorbells, sleeps) = stream_rate(emulator.socket(), stream)?;
    println!(
        "stream of {stream} x {LENGTH} B: {rate:.0} messages/s; sender rang the NIC {doorbells} \
         times ({:.3} per message), receiver slept {sleeps} times",
        doorbells as f64 / stream as f64
    );
    drop(emulator);
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}

fn ports(socket: &std::path::Path) -> Result<(Port, Port), nicbar::Error> {
    Ok((Port::open_at(socket, 0, 1)?, Port::open_at(socket, 1, 1)?))
}

fn provide(port: &mut Port, count: usize) -> Result<(), Box<dyn std::error::Error>> {
    for tag in 0..count {
        let buffer = port.dma_alloc(128)?;
        port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag as u32)
            .map_err(|e| e.error)?;
    }
    Ok(())
}

/// Waits for a RECEIVED event, re-providing its buffer; SENT events return `spare` buffers.
fn await_receive(
    port: &mut Port,
    spare: &mut Vec<DmaBuffer>,
) -> Result<(), Box<dyn std::error::Error>> {
    loop {
        match port.blocking_receive()? {
            Event::Received { buffer, .. } => {
                port.provide_receive_buffer(buffer, SIZE, Priority::LOW, 0)
                    .map_err(|e| e.error)?;
                return Ok(());
            }
            Event::Sent { buffer, status, .. } if status == Status::SUCCESS => spare.push(buffer),
            other => return Err(format!("unexpected {other:?}").into()),
        }
    }
}

fn send(
    port: &mut Port,
    spare: &mut Vec<DmaBuffer>,
    to: NodeId,
) -> Result<(), Box<dyn std::error::Error>> {
    let buffer = match spare.pop() {
        Some(buffer) => buffer,
        None => port.dma_alloc(128)?,
    };
    port.send(buffer, LENGTH, SIZE, Priority::LOW, to, PortId(1), 0)
        .map_err(|e| e.error)?;
    Ok(())
}

fn ping_pong(
    socket: &std::path::Path,
    mode: WaitMode,
    round_trips: usize,
) -> Result<(Duration, Duration, Duration), Box<dyn std::error::Error>> {
    let (mut a, mut b) = ports(socket)?;
    a.set_wait_mode(mode);
    b.set_wait_mode(mode);
    provide(&mut a, 8)?;
    provide(&mut b, 8)?;
    let warm_up = round_trips / 10;
    let echo = std::thread::spawn(move || -> Result<(), String> {
        let mut spare = Vec::new();
        for _ in 0..warm_up + round_trips {
            await_receive(&mut b, &mut spare).map_err(|e| e.to_string())?;
            send(&mut b, &mut spare, NodeId::new(0)).map_err(|e| e.to_string())?;
        }
        // Collect the last SENT before the port closes.
        while b.send_tokens() < 64 {
            b.blocking_receive().map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    let mut spare = Vec::new();
    let mut times = Vec::with_capacity(round_trips);
    for i in 0..warm_up + round_trips {
        let start = Instant::now();
        send(&mut a, &mut spare, NodeId::new(1))?;
        await_receive(&mut a, &mut spare)?;
        if i >= warm_up {
            times.push(start.elapsed());
        }
    }
    echo.join().map_err(|_| "the echo thread panicked")??;
    times.sort();
    let mean = times.iter().sum::<Duration>() / times.len() as u32;
    Ok((mean, times[times.len() / 2], times[times.len() * 99 / 100]))
}

fn stream_rate(
    socket: &std::path::Path,
    count: usize,
) -> Result<(f64, u64, u64), Box<dyn std::error::Error>> {
    let (mut a, mut b) = ports(socket)?;
    provide(&mut b, 128)?;
    let receiver = std::thread::spawn(move || -> Result<u64, String> {
        let mut spare = Vec::new();
        for _ in 0..count {
            await_receive(&mut b, &mut spare).map_err(|e| e.to_string())?;
        }
        Ok(b.counters().sleeps)
    });
    let start = Instant::now();
    let mut spare: Vec<DmaBuffer> = Vec::new();
    let (mut sent, mut done) = (0, 0);
    while done < count {
        while sent < count && a.send_tokens() > 0 {
            send(&mut a, &mut spare, NodeId::new(1))?;
            sent += 1;
        }
        match a.blocking_receive()? {
            Event::Sent { buffer, status, .. } if status == Status::SUCCESS => {
                spare.push(buffer);
                done += 1;
            }
            other => return Err(format!("unexpected {other:?}").into()),
        }
    }
    let sleeps = receiver.join().map_err(|_| "the receiver panicked")??;
    let rate = count as f64 / start.elapsed().as_secs_f64();
    Ok((rate, a.counters().doorbells, sleeps))
}
