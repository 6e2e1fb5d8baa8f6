//! Parses and emits a fixed TLP (an MRd32) in a loop: a steady workload for profilers
//! (`valgrind --tool=callgrind`, `perf record`). `parse_loop [parse|emit|both] [N]` runs
//! N iterations (default 1 000 000) of the chosen half, or of both. Prints how many
//! succeeded.
#![allow(clippy::unwrap_used)]
use std::hint::black_box;
use tlp::{ParseConfig, TlpPacket, TlpRepr};

fn main() {
    let mrd: [u8; 12] = [0x00, 0, 0, 1, 1, 0, 0x12, 0x0f, 0xfe, 0xe0, 0, 0];
    let mode = std::env::args().nth(1).unwrap_or_else(|| "both".to_owned());
    let n: u64 = std::env::args().nth(2).and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let (parse, emit) = match mode.as_str() {
        "parse" => (true, false),
        "emit" => (false, true),
        "both" => (true, true),
        other => {
            eprintln!("parse_loop: unknown mode {other:?} (parse, emit or both)");
            std::process::exit(2);
        }
    };
    let cfg = ParseConfig::default();
    let repr = TlpRepr::parse_bytes(&mrd, &cfg).unwrap();
    let mut out = [0u8; 64];
    let mut ok = 0u64;
    for _ in 0..n {
        if parse {
            // As the criterion benchmark does: check the packet, then parse it.
            let r = TlpPacket::new_checked(black_box(&mrd[..])).and_then(|p| TlpRepr::parse(&p, &cfg));
            ok += r.is_ok() as u64;
            black_box(&r);
        }
        if emit {
            let r = black_box(&repr).emit(&mut out);
            ok += r.is_ok() as u64;
            black_box(&r);
            black_box(&mut out);
        }
    }
    println!("{ok}");
}
