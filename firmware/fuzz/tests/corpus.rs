//! Replays every checked-in corpus input through its target's body, as an ordinary test: what
//! the fuzzer once found (and every input that reached new code) stays checked on a stable
//! toolchain. `cargo test --no-default-features` in this directory runs it (`cargo xtask test`
//! does).

use std::path::Path;

/// Stack of the thread that replays the corpora: an unoptimised build assembles each NIC core
/// (its connection tables and port state, most of a megabyte) on the stack, and a target holds
/// two and builds more when a NIC restarts — more than a test thread's 2 MiB. libFuzzer runs the
/// targets optimised, on the main thread's 8 MiB.
const REPLAY_STACK: usize = 64 << 20;

#[test]
fn every_corpus_input_runs_clean() {
    std::thread::Builder::new()
        .name("corpus-replay".to_owned())
        .stack_size(REPLAY_STACK)
        .spawn(replay_every_corpus)
        .expect("a thread to replay the corpora on")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

fn replay_every_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (name, body) in nicbar_fuzz::TARGETS {
        let dir = root.join(name);
        let mut inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("no corpus for target {name} at {}: {e}", dir.display()))
            .map(|entry| entry.expect("a readable directory entry").path())
            .collect();
        inputs.sort();
        assert!(!inputs.is_empty(), "the corpus of {name} is empty");
        for input in &inputs {
            let bytes = std::fs::read(input).expect("a readable corpus file");
            let outcome = std::panic::catch_unwind(|| body(&bytes));
            assert!(
                outcome.is_ok(),
                "target {name} failed on {}",
                input.display()
            );
        }
        println!("{name}: {} inputs replayed", inputs.len());
    }
}

#[test]
fn every_target_has_its_binary() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .expect("the manifest");
    for (name, _) in nicbar_fuzz::TARGETS {
        assert!(
            manifest.contains(&format!("path = \"fuzz_targets/{name}.rs\"")),
            "target {name} has no [[bin]] in Cargo.toml"
        );
    }
}
