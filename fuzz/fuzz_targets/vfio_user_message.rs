//! vfio-user messages from a client, the way the server takes them: any bytes, arriving in
//! pieces of any size, go through the server's framer (`proto::Framer`, what its non-blocking
//! client channel runs) with a small and the real size limit; every message that comes out
//! is parsed into a request or refused as malformed — never a panic — and the framer never
//! holds more than one largest message and a piece. The capabilities JSON of VERSION either
//! parses or is refused.
#![no_main]

use bridge_host::vfio_user::proto::{self, Framed, Framer, Header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&shape, stream)) = data.split_first() else { return };
    if stream.len() < proto::HEADER_LEN {
        let _ = proto::Caps::from_json(stream);
    }
    // Pieces of 1..=64 bytes, as a client may trickle them, or whole.
    let piece = if shape == 0 { stream.len().max(1) } else { (shape as usize % 64) + 1 };
    for max in [64u32, bridge_host::vfio_user::MAX_MESSAGE] {
        let mut f = Framer::new(max);
        'feed: for chunk in stream.chunks(piece) {
            f.push(chunk);
            assert!(f.held() <= max as usize + piece + proto::HEADER_LEN);
            while let Some(m) = f.next() {
                match m {
                    Framed::Message(header, payload) => {
                        assert_eq!(Header::parse(&header.emit()), header);
                        assert_eq!(payload.len() + proto::HEADER_LEN, header.size as usize);
                        let _ = proto::parse_request(header.command, &payload, max);
                        let _ = proto::parse_request(header.command % 20, &payload, 16);
                    }
                    Framed::TooLarge(h) => assert!(h.size > max),
                    Framed::Broken(h) => {
                        // The server closes the connection here.
                        assert!((h.size as usize) < proto::HEADER_LEN);
                        break 'feed;
                    }
                }
            }
        }
    }
});
