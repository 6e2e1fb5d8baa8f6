//! The frame receive path fed coalesced (UDP GRO) reads: frames the client really sent,
//! concatenated as the kernel coalesces them, perhaps with bytes changed, cut back into
//! frames by `link::driver::gro_segments` at a segment size that is right or that the
//! fuzzer chose, each piece handed to the server as one datagram — and raw input as a
//! coalesced read. Nothing may panic, and the bounds on memory and credits must hold
//! throughout, whatever the pieces look like.
#![no_main]

use libfuzzer_sys::fuzz_target;
use link::driver::gro_segments;
use link::{Config, CreditGrant, Endpoint, PresharedKey, Rng, Session, Time};
use std::time::Duration;

fn config() -> Config {
    let mut c = Config::new(PresharedKey::new(b"fuzzing key, sixteen+ bytes").expect("key"));
    c.window = 16;
    c.max_queued = 16;
    c.credits = CreditGrant { posted: (8, 512), non_posted: (4, 256), completion: (4, 256) };
    c
}

/// A posted write of 256 bytes (a frame each, all of one size).
fn mwr(n: u8) -> Vec<u8> {
    let mut t = vec![0x60, 0, 0, 64, 1, 0, 0, 0xff, 0, 0, 0, 1, 0, 0, 0, 0];
    t.extend(std::iter::repeat_n(n, 256));
    t
}

fuzz_target!(|data: &[u8]| {
    let mut now = Time::from_nanos(1);
    let mut client = Session::client(config(), now, 1, Rng::from_u64(1));
    let mut server: Endpoint<u8> = Endpoint::new(config(), 2, Rng::from_u64(2), 2);
    let mut buf = vec![0u8; 2048];
    // Handshake.
    for _ in 0..4 {
        while let Some(n) = client.poll_transmit(now, &mut buf) {
            server.handle_datagram(now, 0, &buf[..n]);
        }
        let mut out = Vec::new();
        while let Some((_, n)) = server.poll_transmit(&mut buf) {
            out.push(buf[..n].to_vec());
        }
        for f in out {
            client.handle_datagram(now, &f);
        }
    }
    let mut batch: Vec<Vec<u8>> = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let op = &data[pos..(pos + 3).min(data.len())];
        pos += op.len();
        let (a, b, c) = (op[0], *op.get(1).unwrap_or(&0), *op.get(2).unwrap_or(&0));
        match a % 6 {
            // The client sends a write; its frames join the batch the kernel will coalesce.
            0 | 1 => {
                let _ = client.send_tlp(&mwr(b));
                while let Some(n) = client.poll_transmit(now, &mut buf) {
                    batch.push(buf[..n].to_vec());
                }
            }
            // The batch arrives as one read, split at the first frame's size or at one the
            // fuzzer chose, perhaps with a byte changed.
            2 | 3 => {
                let mut read: Vec<u8> = batch.drain(..).flatten().collect();
                if read.is_empty() {
                    continue;
                }
                if a & 0x10 != 0 {
                    let i = (b as usize * 7 + c as usize) % read.len();
                    read[i] ^= c | 1;
                }
                let segment = if a & 0x20 != 0 { Some(b as usize * 8 + c as usize) } else { None };
                let segment = segment.or_else(|| Some(read.len().min(client.mtu())));
                for frame in gro_segments(&read, segment) {
                    server.handle_datagram(now, 0, frame);
                }
            }
            // Raw input as a coalesced read.
            4 => {
                let len = (b as usize * 4).min(data.len() - pos);
                let raw = &data[pos..pos + len];
                pos += len;
                for frame in gro_segments(raw, Some(c as usize + 1)) {
                    server.handle_datagram(now, 0, frame);
                }
            }
            // Time passes; the server answers and drains.
            _ => {
                now = now + Duration::from_micros(u64::from(b) * 31);
                server.handle_timeout(now);
                let mut out = Vec::new();
                for (_, _, s) in server.sessions() {
                    while let Some(t) = s.recv_tlp() {
                        s.recycle(t);
                    }
                    while let Some(n) = s.poll_transmit(now, &mut buf) {
                        out.push(buf[..n].to_vec());
                    }
                }
                for f in out {
                    client.handle_datagram(now, &f);
                }
                client.handle_timeout(now);
            }
        }
        for (_, _, s) in server.sessions() {
            let m = s.memory();
            assert!(m.unacked_frames <= 16 && m.out_of_order_frames <= 16 && m.delivered_tlps <= 16);
            assert!(s.credits_available().iter().all(|c| *c >= 0));
        }
        while client.poll_event().is_some() {}
    }
});
