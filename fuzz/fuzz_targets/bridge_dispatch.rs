//! The bridges' receive dispatcher: any sequence of TLPs from the peer (records of `len u8 ‖
//! bytes`) is routed without a panic; what goes to the bridge at once is a completion or a
//! posted request, what is kept comes back as the TLP that arrived (the same parse of the
//! same bytes), in arrival order but for a short request ahead of long reads kept before it
//! (and never ahead of anything else), and every TLP that parses is handed over exactly once.
#![no_main]

use bridge::attach::Control;
use bridge::{Dispatcher, Kept};
use libfuzzer_sys::fuzz_target;
use tlp::{FcClass, ParseConfig, TlpRepr};

fuzz_target!(|data: &[u8]| {
    let mut tlps = Vec::new();
    let mut rest = data;
    while let Some((&n, tail)) = rest.split_first() {
        let n = (n as usize).min(tail.len());
        tlps.push(&tail[..n]);
        rest = &tail[n..];
    }
    let mut d = Dispatcher::<usize>::new();
    let mut seen = Vec::new();
    for (i, b) in tlps.iter().enumerate() {
        assert!(d.route(i, b, &mut |l, t| {
            assert!(t.fc_class() != FcClass::NonPosted, "a non-posted request handled in place");
            seen.push(l);
        }));
    }
    let mut kept = Vec::new();
    d.drain(|l, k| {
        let want = TlpRepr::parse_bytes(tlps[l], &ParseConfig::default()).ok();
        match k {
            Kept::Request(t) => assert_eq!(Some(t), want, "a kept request is not what arrived"),
            Kept::Control(c) => assert_eq!(want.map(|t| Control::from_repr(&t)), Some(Ok(c))),
            Kept::BadControl(_) => assert!(want.is_some()),
        }
        kept.push(l);
    });
    // A later item drained before an earlier one: only a short request passing a long read.
    let long = |l: usize| {
        matches!(TlpRepr::parse_bytes(tlps[l], &ParseConfig::default()).map(|t| t.body),
            Ok(tlp::Body::MemRead { length_dw, .. }) if length_dw as usize * 4 > 1024)
    };
    let request = |l: usize| {
        TlpRepr::parse_bytes(tlps[l], &ParseConfig::default())
            .is_ok_and(|t| t.fc_class() == FcClass::NonPosted)
    };
    for (i, &a) in kept.iter().enumerate() {
        for &b in &kept[i + 1..] {
            assert!(a < b || (long(b) && request(a) && !long(a)), "{a} kept ahead of {b}");
        }
    }
    seen.extend(kept);
    seen.sort_unstable();
    let parsed: Vec<usize> = (0..tlps.len())
        .filter(|&i| {
            TlpRepr::parse_bytes(tlps[i], &ParseConfig::default())
                .is_ok_and(|t| t.fc_class() != FcClass::NonPosted || t.data().is_none_or(|x| x.len() <= 32))
        })
        .collect();
    assert_eq!(seen, parsed, "a TLP lost or handed over twice");
});
