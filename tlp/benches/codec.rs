//! Criterion benchmarks for TLP parse and emit: representative 3 DW and 4 DW headers and a
//! 256-byte MWr. Run with `cargo bench -p dxpu-tlp --bench codec`.
//!
//! Results stay where they were produced (`black_box(&result)`): returning a 100-byte
//! `Result` by value into `black_box` makes the harness copy it with 16-byte loads right
//! after the callee's narrow stores, a store-forwarding stall that costs more than the
//! parse itself and that no real caller (which matches on the result and reads fields)
//! pays.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tlp::{ParseConfig, TlpPacket, TlpRepr};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn cases() -> Vec<(&'static str, Vec<u8>)> {
    let mut mwr = hex("60000040 0100_07_ff 00000010 00000100");
    mwr.extend((0..=255u8).collect::<Vec<_>>());
    vec![
        ("MRd32 (3DW)", hex("00000001 0100_12_0f fee00000")),
        ("MRd64 (4DW)", hex("20000010 0100_12_ff 00000001 fee00000")),
        ("CplD 1DW (3DW)", hex("4a000001 0100_0004 0000_12_00 cafebabe")),
        ("MWr64 256B", mwr),
    ]
}

fn bench(c: &mut Criterion) {
    let cfg = ParseConfig::default();
    let mut parse = c.benchmark_group("parse");
    for (name, bytes) in cases() {
        parse.throughput(Throughput::Elements(1));
        parse.bench_function(name, |b| {
            b.iter(|| {
                let p = TlpPacket::new_checked(black_box(&bytes[..]));
                let r = p.and_then(|p| TlpRepr::parse(&p, &cfg));
                black_box(&r);
            })
        });
    }
    parse.finish();
    let mut emit = c.benchmark_group("emit");
    for (name, bytes) in cases() {
        let repr = TlpRepr::parse_bytes(&bytes, &cfg).unwrap();
        let mut out = vec![0u8; repr.buffer_len()];
        emit.throughput(Throughput::Elements(1));
        emit.bench_function(name, |b| {
            b.iter(|| {
                let n = black_box(&repr).emit(&mut out);
                black_box(&n);
                black_box(&mut out);
            })
        });
    }
    emit.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
