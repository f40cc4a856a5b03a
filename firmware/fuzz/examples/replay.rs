//! Runs one input file through a target's body: `cargo run --example replay -- TARGET FILE`
//! (with `NICBAR_FUZZ_TRACE=1`, `nic_sequence` prints its actions).

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(name), Some(file)) = (args.next(), args.next()) else {
        eprintln!("usage: replay TARGET FILE");
        std::process::exit(2);
    };
    let Some((_, body)) = nicbar_fuzz::TARGETS.iter().find(|(n, _)| *n == name) else {
        eprintln!("no target {name}");
        std::process::exit(2);
    };
    let bytes = std::fs::read(&file).expect("a readable input");
    body(&bytes);
    println!("{name}: {file} ran clean");
}
