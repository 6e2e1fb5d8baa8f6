//! Arbitrary bytes as a TLP's JSON form (`dxpu tlp encode`'s input): whatever is read and
//! encodes is a TLP the parser takes, and that TLP's JSON form encodes back to the same
//! bytes; what is refused is refused with a message. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tlp::json::TlpJson;
use tlp::{ParseConfig, TlpRepr};

fuzz_target!(|data: &[u8]| {
    let Ok(j) = serde_json::from_slice::<TlpJson>(data) else { return };
    let bytes = match j.encode() {
        Ok(b) => b,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let cfg = ParseConfig { max_payload: 4096, check_ecrc: true };
    let repr = TlpRepr::parse_bytes(&bytes, &cfg).expect("what encodes must parse");
    let again = TlpJson::from_repr(&repr).encode().expect("a parsed TLP's JSON must encode");
    assert_eq!(again, bytes);
});
