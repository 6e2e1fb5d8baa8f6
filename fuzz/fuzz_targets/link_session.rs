//! The session state machine driven by arbitrary input: the fuzzer's bytes become a script
//! of datagrams (raw, or mutations of frames the peer really sent), time steps and
//! application commands, fed to a client and a server that share the real key. The first byte
//! chooses whether the frames are encrypted and how often keys are updated, so the stateless
//! handshake (COOKIE, CHALLENGE, REFUSE from the endpoint), decryption and the key phase are
//! all under the fuzzer. Nothing may panic, and the bounds on memory and credits must hold
//! throughout.
#![no_main]

use libfuzzer_sys::fuzz_target;
use link::{Config, CreditGrant, Endpoint, PresharedKey, Rng, Session, Time};
use std::time::Duration;

fn config(shape: u8) -> Config {
    let mut c = Config::new(PresharedKey::new(b"fuzzing key, sixteen+ bytes").expect("key"));
    c.encrypt_frames = shape & 1 != 0;
    c.key_update_frames = 16 + u64::from(shape >> 1);
    c.window = 8;
    c.max_queued = 8;
    c.credits = CreditGrant { posted: (4, 256), non_posted: (4, 256), completion: (4, 256) };
    c
}

const MWR: [u8; 16] = [0x40, 0, 0, 1, 1, 0, 0, 0x0f, 0xf0, 0, 0, 0, 1, 2, 3, 4];

fuzz_target!(|input: &[u8]| {
    let Some((&shape, data)) = input.split_first() else { return };
    let mut now = Time::from_nanos(1);
    let mut client = Session::client(config(shape), now, 1, Rng::from_u64(1));
    // The server asks for encryption by the other bit: either side asking is enough.
    let mut server: Endpoint<u8> = Endpoint::new(config(shape >> 1 & 1), 2, Rng::from_u64(2), 2);
    let mut buf = vec![0u8; 2048];
    let mut last_to_client: Vec<u8> = Vec::new();
    let mut last_to_server: Vec<u8> = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let op = &data[pos..(pos + 3).min(data.len())];
        pos += op.len();
        let (a, b) = (op[0], *op.get(1).unwrap_or(&0));
        match a % 8 {
            // Honest exchange.
            0 | 1 => {
                while let Some(n) = client.poll_transmit(now, &mut buf) {
                    last_to_server = buf[..n].to_vec();
                    server.handle_datagram(now, 0, &buf[..n]);
                }
                let mut out = Vec::new();
                while let Some((_, n)) = server.poll_transmit(&mut buf) {
                    out.push(buf[..n].to_vec());
                }
                for (_, _, s) in server.sessions() {
                    while let Some(n) = s.poll_transmit(now, &mut buf) {
                        out.push(buf[..n].to_vec());
                    }
                }
                for f in out {
                    client.handle_datagram(now, &f);
                    last_to_client = f;
                }
            }
            // A real frame with a byte changed, to either side.
            2 => {
                let mut f = last_to_client.clone();
                if !f.is_empty() {
                    let i = b as usize % f.len();
                    f[i] ^= op.get(2).copied().unwrap_or(1) | 1;
                    client.handle_datagram(now, &f);
                }
            }
            3 => {
                let mut f = last_to_server.clone();
                if !f.is_empty() {
                    let i = b as usize % f.len();
                    f[i] ^= op.get(2).copied().unwrap_or(1) | 1;
                    server.handle_datagram(now, 0, &f);
                }
            }
            // Raw bytes from the input.
            4 => {
                let len = (b as usize).min(data.len() - pos);
                let raw = &data[pos..pos + len];
                pos += len;
                client.handle_datagram(now, raw);
                server.handle_datagram(now, b, raw);
            }
            // Time passes.
            5 => {
                now = now + Duration::from_micros(u64::from(b) * 37);
                client.handle_timeout(now);
                server.handle_timeout(now);
            }
            // The application sends and reads.
            6 => {
                let _ = client.send_tlp(&MWR);
                for (_, _, s) in server.sessions() {
                    if let Some(t) = s.recv_tlp() {
                        s.recycle(t);
                    }
                }
            }
            _ => {
                let bytes = &data[..data.len().min(b as usize)];
                // Whatever parses as a TLP is also queued from its parsed form (emitted
                // straight into the frame's buffer).
                match tlp::TlpRepr::parse_bytes(bytes, &tlp::ParseConfig::default()) {
                    Ok(t) if b & 1 == 1 => {
                        let _ = client.send_repr(&t);
                    }
                    _ => {
                        let _ = client.send_tlp(bytes);
                    }
                }
                if b == 0xff {
                    client.close(now);
                }
            }
        }
        for s in std::iter::once(&mut client) {
            let m = s.memory();
            assert!(m.unacked_frames <= 8 && m.out_of_order_frames <= 8 && m.queued_tlps <= 24);
            assert!(s.credits_available().iter().all(|c| *c >= 0));
        }
        for (_, _, s) in server.sessions() {
            let m = s.memory();
            assert!(m.unacked_frames <= 8 && m.out_of_order_frames <= 8 && m.delivered_tlps <= 12);
            assert!(s.credits_available().iter().all(|c| *c >= 0));
        }
        while client.poll_event().is_some() {}
    }
});
