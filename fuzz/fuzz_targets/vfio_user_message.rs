//! vfio-user messages from a client: any bytes as a header and payload are parsed into a
//! request or refused as malformed — never a panic — and the capabilities JSON of VERSION
//! either parses or is refused.
#![no_main]

use bridge_host::vfio_user::proto::{self, Header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < proto::HEADER_LEN {
        let _ = proto::Caps::from_json(data);
        return;
    }
    let mut h = [0u8; proto::HEADER_LEN];
    h.copy_from_slice(&data[..proto::HEADER_LEN]);
    let header = Header::parse(&h);
    assert_eq!(Header::parse(&header.emit()), header);
    let payload = &data[proto::HEADER_LEN..];
    // Both the server's limit and a tiny one, so the count checks see both sides.
    let _ = proto::parse_request(header.command, payload, 1 << 20);
    let _ = proto::parse_request(header.command % 20, payload, 16);
});
