//! The tag of one message, this crate against AWS-LC's AES-128-GCM (what the link used for
//! every frame before), for a register read's frames (84 bytes), a small DMA frame and a
//! full 1472-byte frame. Run with `cargo bench -p dxpu-gmac --bench tag`.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;

use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use criterion::{Criterion, criterion_group, criterion_main};
use gmac::Gmac;

fn bench(c: &mut Criterion) {
    let key = [0x42u8; 16];
    let Some(ours) = Gmac::new(&key) else { return };
    let theirs = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &key).unwrap());
    let mut g = c.benchmark_group("tag");
    for len in [84usize, 256, 600, 1472] {
        let m = vec![0x5au8; len];
        g.bench_function(format!("gmac {len} B"), |b| {
            b.iter(|| ours.tag(black_box(&[1; 12]), black_box(&m)))
        });
        g.bench_function(format!("aws-lc {len} B"), |b| {
            b.iter(|| {
                theirs
                    .seal_in_place_separate_tag(
                        Nonce::assume_unique_for_key(*black_box(&[1; 12])),
                        Aad::from(black_box(&m[..])),
                        &mut [],
                    )
                    .unwrap()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
