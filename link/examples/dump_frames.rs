//! Writes the frames of an in-memory handshake and a short exchange to a folder, one file per
//! frame: seeds for the fuzz targets (`cargo run -p dxpu-link --example dump_frames DIR`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use link::{Config, Endpoint, PresharedKey, Rng, Session, Time};

fn main() {
    let dir = std::env::args().nth(1).expect("usage: dump_frames DIR");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = Config::new(PresharedKey::new(b"fuzzing key, sixteen+ bytes").unwrap());
    let now = Time::from_nanos(1);
    let mut client = Session::client(cfg.clone(), now, 1, Rng::from_u64(1));
    let mut server: Endpoint<u8> = Endpoint::new(cfg, 2, Rng::from_u64(2), 2);
    let mut buf = vec![0u8; 2048];
    let mut n_frames = 0;
    let mut save = |b: &[u8]| {
        std::fs::write(format!("{dir}/frame{n_frames:03}"), b).unwrap();
        n_frames += 1;
    };
    let mwr = [0x40, 0, 0, 1, 1, 0, 0, 0x0f, 0xf0, 0, 0, 0, 1, 2, 3, 4];
    for round in 0..6 {
        if client.is_up() && round % 2 == 0 {
            client.send_tlp(&mwr).unwrap();
        }
        while let Some(n) = client.poll_transmit(now, &mut buf) {
            save(&buf[..n]);
            server.handle_datagram(now, 0, &buf[..n]);
        }
        let mut out = Vec::new();
        while let Some((_, n)) = server.poll_transmit(&mut buf) {
            out.push(buf[..n].to_vec());
        }
        for (_, _, s) in server.sessions() {
            while let Some(t) = s.recv_tlp() {
                s.recycle(t);
            }
            while let Some(n) = s.poll_transmit(now, &mut buf) {
                out.push(buf[..n].to_vec());
            }
        }
        for f in out {
            save(&f);
            client.handle_datagram(now, &f);
        }
    }
    println!("{n_frames} frames written to {dir}");
}
