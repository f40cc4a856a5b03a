//! Fuzz target: [`nicbar_fuzz::image`] (the corpus replay test runs the same function).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nicbar_fuzz::image(data));
