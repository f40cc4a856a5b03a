#![allow(
    unsafe_code,
    reason = "tests wrap heap memory as a mapped region, as the real code wraps a mapping"
)]

extern crate std;

use std::collections::VecDeque;
use std::vec::Vec;

use proptest::prelude::*;

use super::cursor::{HEAD_OFFSET, TAIL_OFFSET};
use super::raw::RawMemory;
use super::*;
use crate::token::SendToken;

/// Heap memory for tests, 8-aligned, wrapped as the real code wraps a mapping.
pub(crate) struct TestRegion {
    _storage: Vec<u64>,
    pub(crate) memory: RawMemory,
}

impl TestRegion {
    pub(crate) fn new(len: usize) -> Self {
        let mut storage = std::vec![0u64; len.div_ceil(8)];
        let base = core::ptr::NonNull::new(storage.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `storage` is 8-aligned, `len` bytes long at least, and lives as long as
        // `memory` because both are fields of `Self` and the box's heap block never moves.
        let memory = unsafe { RawMemory::new(base, len) };
        Self {
            _storage: storage,
            memory,
        }
    }
}

fn token(n: u64) -> SendToken {
    SendToken {
        context: n.into(),
        ..SendToken::default()
    }
}

#[test]
fn push_pop_wraps_and_reports_full() {
    let layout = RingLayout {
        offset: 64,
        entries: 4,
    };
    let region = TestRegion::new(64 + RingLayout::bytes::<SendToken>(4));
    layout.validate::<SendToken>(region.memory.len()).unwrap();
    let mut producer = Producer::<SendToken>::new(layout, 0);
    let mut consumer = Consumer::<SendToken>::new(layout, 0);
    for round in 0..10u64 {
        for i in 0..4 {
            producer
                .push(&region.memory, &token(round * 4 + i))
                .unwrap();
        }
        assert_eq!(
            producer.push(&region.memory, &token(99)),
            Err(RingError::Full)
        );
        for i in 0..4 {
            let entry = consumer.pop(&region.memory).unwrap().unwrap();
            assert_eq!(entry.context.get(), round * 4 + i);
        }
        assert_eq!(consumer.pop(&region.memory).unwrap(), None);
    }
}

#[test]
fn what_the_consumer_sleeps_for_reaches_the_producer() {
    let layout = RingLayout {
        offset: 64,
        entries: 4,
    };
    let region = TestRegion::new(64 + RingLayout::bytes::<SendToken>(4));
    let producer = Producer::<SendToken>::new(layout, 0);
    let consumer = Consumer::<SendToken>::new(layout, 0);
    for wake in [Wake::ANY, Wake::UNLESS_SENT, Wake(7), Wake::NONE] {
        consumer.set_wake(&region.memory, wake).unwrap();
        assert_eq!(producer.consumer_wake(&region.memory), Ok(wake));
        assert_eq!(
            producer.consumer_wants_doorbell(&region.memory),
            Ok(wake != Wake::NONE)
        );
    }
    // Sends' ends alone ring only a consumer that did not ask to be spared them; a value this
    // side does not know rings as `ANY` does.
    assert!(Wake::ANY.rings_for(true) && Wake(7).rings_for(true));
    assert!(!Wake::UNLESS_SENT.rings_for(true) && Wake::UNLESS_SENT.rings_for(false));
    assert!(!Wake::NONE.rings_for(false));
}

#[test]
fn indexes_wrap_past_u32_max() {
    let layout = RingLayout {
        offset: 0,
        entries: 8,
    };
    let region = TestRegion::new(RingLayout::bytes::<SendToken>(8));
    let start = u32::MAX - 3;
    region.memory.store_release(HEAD_OFFSET, start).unwrap();
    region.memory.store_release(TAIL_OFFSET, start).unwrap();
    let mut producer = Producer::<SendToken>::new(layout, start);
    let mut consumer = Consumer::<SendToken>::new(layout, start);
    for i in 0..20 {
        producer.push(&region.memory, &token(i)).unwrap();
        assert_eq!(
            consumer.pop(&region.memory).unwrap().unwrap().context.get(),
            i
        );
    }
}

#[test]
fn a_forged_tail_is_corrupt_not_a_wild_read() {
    let layout = RingLayout {
        offset: 0,
        entries: 8,
    };
    let region = TestRegion::new(RingLayout::bytes::<SendToken>(8));
    let mut consumer = Consumer::<SendToken>::new(layout, 0);
    region.memory.store_release(TAIL_OFFSET, 9).unwrap();
    assert_eq!(
        consumer.pop(&region.memory),
        Err(RingError::Corrupt { head: 0, tail: 9 })
    );
    region.memory.store_release(TAIL_OFFSET, u32::MAX).unwrap();
    assert!(matches!(
        consumer.pop(&region.memory),
        Err(RingError::Corrupt { .. })
    ));
    // Resynchronising skips the garbage; the ring works again afterwards.
    region.memory.store_release(TAIL_OFFSET, 5).unwrap();
    assert_eq!(consumer.resynchronise(&region.memory).unwrap(), 5);
    let mut producer = Producer::<SendToken>::new(layout, 5);
    producer.push(&region.memory, &token(7)).unwrap();
    assert_eq!(
        consumer.pop(&region.memory).unwrap().unwrap().context.get(),
        7
    );
}

#[test]
fn a_forged_head_is_corrupt_for_the_producer() {
    let layout = RingLayout {
        offset: 0,
        entries: 8,
    };
    let region = TestRegion::new(RingLayout::bytes::<SendToken>(8));
    let mut producer = Producer::<SendToken>::new(layout, 0);
    region.memory.store_release(HEAD_OFFSET, 3).unwrap();
    assert!(matches!(
        producer.push(&region.memory, &token(1)),
        Err(RingError::Corrupt { .. })
    ));
}

#[test]
fn layouts_that_do_not_fit_are_refused() {
    assert_eq!(
        RingLayout {
            offset: 0,
            entries: 3
        }
        .validate::<SendToken>(1 << 20),
        Err(RingError::BadLayout)
    );
    assert_eq!(
        RingLayout {
            offset: 0,
            entries: 0
        }
        .validate::<SendToken>(1 << 20),
        Err(RingError::BadLayout)
    );
    assert_eq!(
        RingLayout {
            offset: 8,
            entries: 4
        }
        .validate::<SendToken>(1 << 20),
        Err(RingError::BadLayout)
    );
    assert_eq!(
        RingLayout {
            offset: 0,
            entries: 4
        }
        .validate::<SendToken>(100),
        Err(RingError::BadLayout)
    );
    assert_eq!(
        RingLayout {
            offset: usize::MAX - 63,
            entries: 4
        }
        .validate::<SendToken>(usize::MAX),
        Err(RingError::BadLayout)
    );
}

#[test]
fn out_of_bounds_accesses_are_errors() {
    let region = TestRegion::new(64);
    assert!(region.memory.load_acquire(62).is_err());
    assert!(region.memory.load_acquire(2).is_err());
    assert!(region.memory.read(60, &mut [0; 8]).is_err());
    assert!(region.memory.write(usize::MAX, &[1]).is_err());
    region.memory.write(60, &[1, 2, 3, 4]).unwrap();
    let mut out = [0; 4];
    region.memory.read(60, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4]);
}

/// Two threads, one ring: every entry arrives once, in order. Run under Miri too, where it checks
/// the acquire/release pairing for data races.
#[test]
fn concurrent_producer_and_consumer() {
    let layout = RingLayout {
        offset: 0,
        entries: 4,
    };
    let region = std::sync::Arc::new(TestRegion::new(RingLayout::bytes::<SendToken>(4)));
    let count: u64 = if cfg!(miri) { 40 } else { 20_000 };
    let producer_region = region.clone();
    let producer = std::thread::spawn(move || {
        let mut producer = Producer::<SendToken>::new(layout, 0);
        let mut next = 0;
        while next < count {
            match producer.push(&producer_region.memory, &token(next)) {
                Ok(()) => next += 1,
                Err(RingError::Full) => std::thread::yield_now(),
                Err(other) => panic!("producer: {other}"),
            }
        }
    });
    let mut consumer = Consumer::<SendToken>::new(layout, 0);
    let mut expected = 0;
    while expected < count {
        match consumer.pop(&region.memory).unwrap() {
            Some(entry) => {
                assert_eq!(entry.context.get(), expected);
                expected += 1;
            }
            None => std::thread::yield_now(),
        }
    }
    producer.join().unwrap();
}

#[test]
fn cursors_hand_out_slots_a_stride_apart() {
    let shape = RingShape {
        offset: 64,
        entries: 4,
        stride: 48,
    };
    let region = TestRegion::new(64 + RingShape::bytes(4, 48));
    shape.validate(region.memory.len()).unwrap();
    let mut producer = ProducerCursor::new(shape, 0);
    let mut consumer = ConsumerCursor::new(shape, 0);
    for index in 0..4 {
        let slot = producer.reserve(&region.memory).unwrap();
        assert_eq!(slot, 64 + 128 + index * 48);
        // Reserving again without publishing hands out the same slot.
        assert_eq!(producer.reserve(&region.memory), Ok(slot));
        producer.publish(&region.memory).unwrap();
    }
    assert_eq!(producer.reserve(&region.memory), Err(RingError::Full));
    assert_eq!(consumer.available(&region.memory), Ok(4));
    for index in 0..4 {
        assert_eq!(
            consumer.peek(&region.memory),
            Ok(Some(64 + 128 + index * 48))
        );
        consumer.release(&region.memory).unwrap();
    }
    assert_eq!(consumer.peek(&region.memory), Ok(None));
    assert_eq!((producer.tail(), consumer.head()), (4, 4));
    assert_eq!(producer.reserve(&region.memory), Ok(64 + 128));
}

#[test]
fn an_index_that_cannot_be_stored_moves_nothing() {
    let shape = RingShape {
        offset: 0,
        entries: 4,
        stride: 8,
    };
    // Room for the tail word only: the head and the sleeping flag lie outside.
    let region = TestRegion::new(8);
    let mut producer = ProducerCursor::new(shape, 0);
    let mut consumer = ConsumerCursor::new(shape, 0);
    assert!(producer.reserve(&region.memory).is_err());
    assert!(consumer.release(&region.memory).is_err());
    assert_eq!(consumer.head(), 0);
    assert!(consumer.resynchronise(&region.memory).is_err());
    assert_eq!(consumer.head(), 0);
    assert!(consumer.set_sleeping(&region.memory, true).is_err());
    producer.publish(&region.memory).unwrap();
    assert_eq!(producer.tail(), 1);
    let mut nowhere = ProducerCursor::new(
        RingShape {
            offset: 64,
            ..shape
        },
        0,
    );
    assert!(nowhere.publish(&region.memory).is_err());
    assert_eq!(nowhere.tail(), 0);
}

#[test]
fn shapes_whose_size_overflows_are_refused() {
    let shape = RingShape {
        offset: 0,
        entries: 1 << 31,
        stride: usize::MAX / 2,
    };
    assert_eq!(shape.validate(usize::MAX), Err(RingError::BadLayout));
}

/// Two threads, variable-length slots as the packet rings have them (a length word, then that
/// many bytes): every slot arrives whole, in order. Run under Miri too, where it checks that the
/// cursors' orderings cover the slot copies.
#[test]
fn concurrent_cursors_over_variable_length_slots() {
    const STRIDE: usize = 64;
    let shape = RingShape {
        offset: 0,
        entries: 4,
        stride: STRIDE,
    };
    let region = std::sync::Arc::new(TestRegion::new(RingShape::bytes(4, STRIDE)));
    let count: u32 = if cfg!(miri) { 30 } else { 20_000 };
    let producer_region = region.clone();
    let producer = std::thread::spawn(move || {
        let memory = &producer_region.memory;
        let mut producer = ProducerCursor::new(shape, 0);
        let mut next = 0;
        while next < count {
            match producer.reserve(memory) {
                Ok(slot) => {
                    let length = next as usize % (STRIDE - 4);
                    memory.write(slot, &(length as u32).to_le_bytes()).unwrap();
                    memory
                        .write(slot + 4, &std::vec![next as u8; length])
                        .unwrap();
                    producer.publish(memory).unwrap();
                    next += 1;
                }
                Err(RingError::Full) => std::thread::yield_now(),
                Err(other) => panic!("producer: {other}"),
            }
        }
    });
    let memory = &region.memory;
    let mut consumer = ConsumerCursor::new(shape, 0);
    let mut expected = 0;
    let mut bytes = [0u8; STRIDE];
    while expected < count {
        let Some(slot) = consumer.peek(memory).unwrap() else {
            std::thread::yield_now();
            continue;
        };
        let mut length = [0u8; 4];
        memory.read(slot, &mut length).unwrap();
        let length = u32::from_le_bytes(length) as usize;
        assert_eq!(length, expected as usize % (STRIDE - 4));
        memory.read(slot + 4, &mut bytes[..length]).unwrap();
        assert!(bytes[..length].iter().all(|&b| b == expected as u8));
        consumer.release(memory).unwrap();
        expected += 1;
    }
    producer.join().unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    Push(u64),
    Pop,
}

proptest! {
    // Under Miri every case is slow and files are out of reach: a few cases, no persistence.
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 256 },
        failure_persistence: if cfg!(miri) { None } else { ProptestConfig::default().failure_persistence },
        ..ProptestConfig::default()
    })]

    /// Any sequence of pushes and pops behaves as a bounded FIFO queue.
    #[test]
    fn ring_is_a_bounded_fifo(ops in proptest::collection::vec(
        prop_oneof![any::<u64>().prop_map(Op::Push), Just(Op::Pop)], 0..200)
    ) {
        let layout = RingLayout { offset: 0, entries: 8 };
        let region = TestRegion::new(RingLayout::bytes::<SendToken>(8));
        let mut producer = Producer::<SendToken>::new(layout, 0);
        let mut consumer = Consumer::<SendToken>::new(layout, 0);
        let mut model = VecDeque::new();
        for op in ops {
            match op {
                Op::Push(n) => {
                    let result = producer.push(&region.memory, &token(n));
                    if model.len() == 8 {
                        prop_assert_eq!(result, Err(RingError::Full));
                    } else {
                        prop_assert_eq!(result, Ok(()));
                        model.push_back(n);
                    }
                }
                Op::Pop => {
                    let got = consumer.pop(&region.memory).unwrap().map(|t| t.context.get());
                    prop_assert_eq!(got, model.pop_front());
                }
            }
        }
        let rest: Vec<u64> = core::iter::from_fn(|| consumer.pop(&region.memory).unwrap())
            .map(|t| t.context.get())
            .collect();
        prop_assert_eq!(rest, Vec::from(model));
    }
}

#[test]
fn bulk_copies_move_exactly_their_bytes_at_every_alignment() {
    // The copies go a chunk (up to 16 bytes) at a time between single bytes at either end:
    // every offset and length around two chunks' size, each checked against the bytes around
    // it too.
    const LEN: usize = 72;
    let region = TestRegion::new(LEN);
    for offset in 0..18 {
        for len in 0..=LEN - offset {
            let pattern: Vec<u8> = (0..LEN).map(|at| at as u8 ^ 0x5a).collect();
            region.memory.write(0, &pattern).unwrap();
            let data: Vec<u8> = (0..len).map(|at| 0x80 | at as u8).collect();
            region.memory.write(offset, &data).unwrap();
            let mut all = std::vec![0u8; LEN];
            region.memory.read(0, &mut all).unwrap();
            let mut expected = pattern.clone();
            expected[offset..offset + len].copy_from_slice(&data);
            assert_eq!(all, expected, "write of {len} bytes at {offset}");
            let mut back = std::vec![0u8; len];
            region.memory.read(offset, &mut back).unwrap();
            assert_eq!(back, data, "read of {len} bytes at {offset}");
        }
    }
}
