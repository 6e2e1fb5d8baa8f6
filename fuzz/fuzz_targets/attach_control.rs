//! The attach protocol's control messages: any bytes, as a TLP from the peer, either parse
//! into a control message that re-encodes to the same message, or are refused — never a
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use bridge::attach::Control;
use tlp::Bdf;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = Control::from_tlp(data) {
        let again = Control::from_tlp(&c.to_tlp(Bdf::new(0, 0, 0)));
        assert_eq!(again.as_ref(), Ok(&c), "control message does not round-trip");
    }
});
