//! Arbitrary datagrams through the frame parser: a frame that checks must expose its header,
//! credit block, body and TLP records without panicking, and rebuild to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use link::wire::{Frame, FrameRepr, TlpRecords};

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = Frame::new_checked(data) else { return };
    let h = frame.header();
    let fc = frame.fc();
    let body = frame.body();
    for rec in TlpRecords::new(body) {
        if let Ok(tlp) = rec {
            let _ = tlp::TlpRepr::parse_bytes(tlp, &tlp::ParseConfig::default());
        }
    }
    let tag = frame.tag();
    let mut out = vec![0u8; data.len()];
    let n = FrameRepr { header: h, fc, body }.emit(&mut out, |_| tag)
        .expect("a checked frame fits its own size");
    // Unknown flag bits are not kept; everything else is.
    if u16::from_be_bytes([data[28], data[29]]) & !3 == 0 {
        assert_eq!(&out[..n], data);
    }
});
