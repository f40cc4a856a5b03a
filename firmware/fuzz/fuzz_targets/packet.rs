//! Fuzz target: [`nicbar_fuzz::packet`] (the corpus replay test runs the same function).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nicbar_fuzz::packet(data));
