//! Parses and emits a fixed set of TLPs in a loop: a steady workload for profilers
//! (`valgrind --tool=callgrind`, `perf`). Prints nothing of interest.
#![allow(clippy::unwrap_used)]
use std::hint::black_box;
use tlp::{ParseConfig, TlpRepr};

fn main() {
    let mrd: [u8; 12] = [0x00, 0, 0, 1, 1, 0, 0x12, 0x0f, 0xfe, 0xe0, 0, 0];
    let n: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let cfg = ParseConfig::default();
    let mut out = [0u8; 64];
    let mut ok = 0u64;
    for _ in 0..n {
        let r = TlpRepr::parse_bytes(black_box(&mrd), &cfg);
        black_box(&r);
        if let Ok(r) = r {
            ok += r.emit(&mut out).is_ok() as u64;
            black_box(&mut out);
        }
    }
    println!("{ok}");
}
