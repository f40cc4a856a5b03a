//! How fast the NIC copies a packet's payload between its packet buffers and a port's region:
//! [`RawMemory`]'s bulk copies (volatile words between single bytes), beside a volatile copy a
//! byte at a time (how they were written before) and `copy_from_slice` (memcpy), on the same
//! 4 KiB payloads of a 1 MiB region.
//!
//! `cargo run --release -p shared-abi --example ring_copy [ROUNDS]`
#![allow(unsafe_code, reason = "a raw mapping stands in for a port region")]

use std::hint::black_box;
use std::ptr::NonNull;
use std::time::Instant;

use shared_abi::ring::SharedMemory;
use shared_abi::ring::raw::RawMemory;

const REGION: usize = 1 << 20;
const PAYLOAD: usize = 4096;
/// Copies per timing: every payload-sized slot of the region once, at an offset a packet
/// header puts the payload at.
const COPIES: usize = REGION / PAYLOAD - 1;
const OFFSET: usize = 40;

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(Ok(5), |arg| arg.parse())
        .unwrap_or_else(|_| {
            eprintln!("usage: ring_copy [ROUNDS]");
            std::process::exit(2);
        });
    let mut storage = vec![0u64; REGION / 8];
    let base = NonNull::new(storage.as_mut_ptr().cast::<u8>()).expect("a heap pointer");
    // SAFETY: `storage` is 8-aligned, REGION bytes long, and outlives `memory`.
    let memory = unsafe { RawMemory::new(base, REGION) };
    let mut packet = vec![0x5au8; PAYLOAD];
    let mut plain = vec![0u8; REGION];
    // Each copy runs over the region once untimed, so that every one is timed from the same
    // state of the caches.
    let time = |copy: &mut dyn FnMut(usize)| {
        for slot in 0..COPIES {
            copy(slot * PAYLOAD + OFFSET);
        }
        let start = Instant::now();
        for slot in 0..COPIES {
            copy(slot * PAYLOAD + OFFSET);
        }
        start.elapsed().as_secs_f64() * 1e6 / COPIES as f64
    };
    let mut rows: [(&str, Vec<f64>); 5] = [
        ("words, into the region", Vec::new()),
        ("words, out of the region", Vec::new()),
        ("bytes, into the region", Vec::new()),
        ("bytes, out of the region", Vec::new()),
        ("memcpy", Vec::new()),
    ];
    for _ in 0..rounds {
        rows[0]
            .1
            .push(time(&mut |at| memory.write(at, &packet).expect("in range")));
        rows[1].1.push(time(&mut |at| {
            memory.read(at, &mut packet).expect("in range");
            black_box(&packet);
        }));
        rows[2].1.push(time(&mut |at| {
            for (i, &byte) in packet.iter().enumerate() {
                // SAFETY: `at + i` lies inside the region.
                unsafe { base.as_ptr().add(at + i).write_volatile(byte) };
            }
        }));
        rows[3].1.push(time(&mut |at| {
            for (i, byte) in packet.iter_mut().enumerate() {
                // SAFETY: as above.
                *byte = unsafe { base.as_ptr().add(at + i).read_volatile() };
            }
            black_box(&packet);
        }));
        rows[4].1.push(time(&mut |at| {
            plain[at..at + PAYLOAD].copy_from_slice(&packet);
            black_box(&plain);
        }));
    }
    println!("µs per {PAYLOAD}-byte copy, median of {rounds} rounds of {COPIES}:");
    for (name, mut samples) in rows {
        samples.sort_by(f64::total_cmp);
        let median = samples[samples.len() / 2];
        let rate = PAYLOAD as f64 / median / 1e3;
        println!("  {name:26} {median:6.3} µs  {rate:5.1} GB/s");
    }
}
