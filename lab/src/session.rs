//! The link's sessions measured alone, over loopback or in memory: a one-TLP request and
//! its completion through two sessions, posted writes streamed through one, the sessions'
//! own CPU per round trip and per frame, and what a frame's tag, CRC and encryption cost.
//! `dxpu bench link` compares them with the floors ([`crate::floor`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use link::driver::{AnyUdp, Clock, Datagrams, DriverKind, ServerRunner, SessionRunner};
use link::{Config, Endpoint, PresharedKey, Rng, Session, Transmit};
use tlp::{Address, Bdf, Body, Completion, CplStatus, ParseConfig, Request, Tag, TlpRepr};

use crate::floor::{LOCAL, Rtt, mode_of, summarize};

/// The sessions' configuration: a fixed key and the MTU given.
fn bench_config(mtu: usize) -> Config {
    let psk = PresharedKey::new(b"dxpu bench key, not a secret at all").unwrap_or_else(|| unreachable!());
    let mut c = Config::new(psk);
    c.mtu = mtu;
    c
}

fn tlp_bytes(r: &TlpRepr<'_>) -> Vec<u8> {
    let mut b = vec![0u8; r.buffer_len()];
    let _ = r.emit(&mut b);
    b
}

fn read_request(tag: u16) -> Vec<u8> {
    tlp_bytes(&TlpRepr::new(Body::MemRead {
        req: Request { requester: Bdf::new(0, 0, 0), tag: Tag::from_bits(tag), first_be: 0xf, last_be: 0 },
        address: Address::Bits32(0xf000_0000),
        ph: 0,
        length_dw: 1,
        locked: false,
    }))
}

fn completion_for(read: &[u8]) -> Option<Vec<u8>> {
    let r = TlpRepr::parse_bytes(read, &ParseConfig::default()).ok()?;
    let (requester, tag) = r.requester_tag();
    Some(tlp_bytes(&TlpRepr {
        body: Body::Completion {
            cpl: Completion {
                completer: Bdf::new(1, 0, 0),
                status: CplStatus::Success,
                bcm: false,
                byte_count: 4,
                requester,
                tag,
                lower_address: 0,
            },
            locked: false,
            data: Some(&[0xde, 0xad, 0xbe, 0xef]),
        },
        ..r
    }))
}

/// A posted write of `size` bytes, encoded.
pub fn write_tlp(size: usize) -> Vec<u8> {
    let data = vec![0xa5u8; size];
    tlp_bytes(&TlpRepr::new(Body::MemWrite {
        req: Request { requester: Bdf::new(0, 0, 0), tag: Tag::default(), first_be: 0xf, last_be: 0xf },
        address: Address::Bits32(0x1000_0000),
        ph: 0,
        data: &data,
    }))
}

/// A server endpoint in its own thread: answers reads with completions, counts writes.
struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    writes: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<std::io::Result<()>>,
}

fn spawn_server(driver: DriverKind, busy: bool, mtu: usize) -> std::io::Result<Server> {
    let sock = AnyUdp::bind(SocketAddr::from(LOCAL), driver, &mut |_| {})?;
    let addr = sock.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let (stop2, writes2) = (stop.clone(), writes.clone());
    // Completions are built once per tag: the round trip measures the transport, not the
    // benchmark's own TLP encoding.
    let completions: Vec<Vec<u8>> =
        (0..1024).map(|t| completion_for(&read_request(t)).unwrap_or_default()).collect();
    let thread = std::thread::spawn(move || -> std::io::Result<()> {
        let ep = Endpoint::new(bench_config(mtu), 0x5e, Rng::from_u64(1), 4);
        let mut r = ServerRunner::new(sock, ep, Clock::new(), mode_of(busy));
        while !stop2.load(Ordering::Relaxed) {
            // Posted writes are counted where they lie in the receive buffer (no copy, no
            // queue), the way the bridges take device writes; reads wait for recv_tlp.
            let mut in_place = |_: u32, t: &[u8]| {
                let posted = t.first().is_some_and(|b| b & 0xdf == 0x40);
                if posted {
                    writes2.fetch_add(1, Ordering::Relaxed);
                }
                posted
            };
            let mut active = r.poll_with(Some(&mut in_place))?;
            let mut answered = false;
            for (_, _, s) in r.endpoint.sessions() {
                while let Some(t) = s.recv_tlp() {
                    if t.first() == Some(&0x00) && t.len() >= 8 {
                        // MRd: tag T9/T8 in byte 1, Tag[7:0] in byte 6.
                        let tag =
                            ((t[1] as usize >> 7) & 1) << 9 | ((t[1] as usize >> 3) & 1) << 8 | t[6] as usize;
                        let _ = s.send_tlp(&completions[tag]);
                        answered = true;
                    } else {
                        writes2.fetch_add(1, Ordering::Relaxed);
                    }
                    s.recycle(t);
                }
            }
            if answered {
                active |= r.transmit()? > 0;
            }
            if !active {
                r.wait()?;
            }
        }
        Ok(())
    });
    Ok(Server { addr, stop, writes, thread })
}

impl Server {
    fn finish(self) -> std::io::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| std::io::Error::other("the bench's server thread panicked"))?
    }
}

fn connect(
    driver: DriverKind,
    busy: bool,
    server: SocketAddr,
    mtu: usize,
) -> std::io::Result<SessionRunner<AnyUdp>> {
    let sock = AnyUdp::bind(SocketAddr::from(LOCAL), driver, &mut |_| {})?;
    let clock = Clock::new();
    let session = Session::client(bench_config(mtu), clock.now(), 0xc1, Rng::from_u64(2));
    let mut r = SessionRunner::new(sock, server, session, clock, mode_of(busy));
    if !r.run_until(Duration::from_secs(5), |s| s.is_up())? {
        return Err(std::io::Error::other("session did not come up"));
    }
    Ok(r)
}

/// A one-TLP request and its completion (MRd → CplD) through two sessions of `mtu`, `n`
/// times after a tenth as many more to warm up, each run to completion by this thread.
pub fn session_rtt(driver: DriverKind, busy: bool, n: usize, mtu: usize) -> std::io::Result<Rtt> {
    let server = spawn_server(driver, busy, mtu)?;
    let mut r = connect(driver, busy, server.addr, mtu)?;
    let total = n + n / 10;
    let reads: Vec<Vec<u8>> = (0..1024).map(read_request).collect();
    let mut rtts = Vec::with_capacity(n);
    for i in 0..total {
        let t0 = Instant::now();
        r.session.send_tlp(&reads[i % 1024]).map_err(|e| std::io::Error::other(e.to_string()))?;
        r.transmit()?;
        let mut got = None;
        while got.is_none() {
            let active = r.poll()?;
            got = r.session.recv_tlp();
            if got.is_none() && !active {
                r.wait()?;
            }
            if r.session.is_down() {
                return Err(std::io::Error::other("session went down"));
            }
        }
        if i >= total - n {
            rtts.push(t0.elapsed());
        }
        if let Some(b) = got {
            r.session.recycle(b);
        }
    }
    r.session.close(r.clock.now());
    let _ = r.poll();
    server.finish()?;
    Ok(summarize(rtts))
}

/// What [`session_stream`] took.
pub struct Stream {
    /// From the first write queued to the last counted by the receiver.
    pub seconds: f64,
    /// DATA frames the sender sent.
    pub datagrams: u64,
}

/// `n` posted writes of `size` bytes streamed through a session of `mtu` (the receiver takes
/// them where they lie, as the bridges take device writes), both sides busy-polling.
pub fn session_stream(driver: DriverKind, n: usize, size: usize, mtu: usize) -> std::io::Result<Stream> {
    let server = spawn_server(driver, true, mtu)?;
    let mut r = connect(driver, true, server.addr, mtu)?;
    let w = write_tlp(size);
    let frames_before = r.session.stats().data_frames_sent;
    let t0 = Instant::now();
    let mut queued = 0;
    while server.writes.load(Ordering::Relaxed) < n as u64 {
        while queued < n && r.session.send_tlp(&w).is_ok() {
            queued += 1;
        }
        r.poll()?;
        if t0.elapsed() > Duration::from_secs(60) || r.session.is_down() {
            return Err(std::io::Error::other("streaming did not finish"));
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let datagrams = r.session.stats().data_frames_sent - frames_before;
    r.session.close(r.clock.now());
    let _ = r.poll();
    server.finish()?;
    Ok(Stream { seconds, datagrams })
}

/// A client session and a server endpoint joined in memory, handshake done.
fn joined_in_memory(encrypt: bool, mtu: usize) -> Option<(Session, Endpoint<u32>, link::Time)> {
    let mut cfg = bench_config(mtu);
    cfg.encrypt_frames = encrypt;
    let mut t = link::Time::from_nanos(1);
    let mut c = Session::client(cfg.clone(), t, 1, Rng::from_u64(1));
    let mut ep: Endpoint<u32> = Endpoint::new(cfg, 2, Rng::from_u64(2), 4);
    let mut buf = vec![0u8; 65536];
    for _ in 0..10 {
        while let Some(n) = c.poll_transmit(t, &mut buf) {
            ep.handle_datagram(t, 7, &buf[..n]);
        }
        while let Some((_, n)) = ep.poll_transmit(&mut buf) {
            c.handle_datagram(t, &buf[..n]);
        }
        for (_, _, s) in ep.sessions() {
            while let Some(n) = s.poll_transmit(t, &mut buf) {
                c.handle_datagram(t, &buf[..n]);
            }
        }
        t = link::Time::from_nanos(t.as_nanos() + 1000);
    }
    c.is_up().then_some((c, ep, t))
}

/// The sessions' CPU time without sockets: nanoseconds per MRd → CplD round trip (both
/// sides), and per streamed frame of 256-byte writes for the sender (queueing the TLPs, then
/// sealing, tagging and checksumming the frame where its TLPs lie) and for the receiver
/// (checking it and taking its TLPs). Sessions of `mtu`; `None` where they did not come up or
/// stopped sending.
pub fn session_cpu(size: usize, encrypt: bool, mtu: usize) -> Option<(f64, f64, f64)> {
    let (mut c, mut ep, mut t) = joined_in_memory(encrypt, mtu)?;
    let mut buf = vec![0u8; 65536];
    let read = read_request(1);
    let cpl = completion_for(&read)?;
    let n = 100_000;
    let t0 = Instant::now();
    for _ in 0..n {
        t = link::Time::from_nanos(t.as_nanos() + 100);
        c.send_tlp(&read).ok()?;
        while let Some(len) = c.poll_transmit(t, &mut buf) {
            ep.handle_datagram(t, 7, &buf[..len]);
        }
        for (_, _, s) in ep.sessions() {
            while let Some(r) = s.recv_tlp() {
                s.recycle(r);
                s.send_tlp(&cpl).ok()?;
            }
            while let Some(len) = s.poll_transmit(t, &mut buf) {
                c.handle_datagram(t, &buf[..len]);
            }
        }
        let got = c.recv_tlp()?;
        c.recycle(got);
    }
    let rtt = t0.elapsed().as_nanos() as f64 / n as f64;
    let w = write_tlp(size);
    // DATA frames are sealed where their TLPs were written and read there by the receiver,
    // as the runners send them (no copy); a control frame would go into `control`.
    let mut control = vec![0u8; 65536];
    // An encrypting session writes each DATA frame's ciphertext into `control` (the
    // plaintext stays for replay): those are kept here, a copy each, as a socket would take them.
    let mut sealed = Vec::with_capacity(256);
    let mut written: Vec<Vec<u8>> = Vec::with_capacity(256);
    let (mut tx, mut rx, mut sent) = (Duration::ZERO, Duration::ZERO, 0u64);
    while sent < 100_000 {
        t = link::Time::from_nanos(t.as_nanos() + 100);
        let t0 = Instant::now();
        while c.send_tlp(&w).is_ok() {}
        sealed.clear();
        written.clear();
        while sealed.len() + written.len() < 256 {
            match c.poll_transmit_in_place(t, &mut control) {
                Some(Transmit::Sealed(f)) => sealed.push(f),
                Some(Transmit::Written(n)) if encrypt && control[3] == 5 => {
                    written.push(control[..n].to_vec())
                }
                Some(Transmit::Written(_)) => {}
                None => break,
            }
        }
        let t1 = Instant::now();
        let frames = sealed.iter().map(|f| c.sealed(f)).chain(written.iter().map(|w| &w[..]));
        for frame in frames {
            ep.handle_datagram_with(
                t,
                7,
                frame,
                Some(&mut |_, tlp: &[u8]| !std::hint::black_box(tlp).is_empty()),
            );
        }
        rx += t1.elapsed();
        tx += t1 - t0;
        // Acknowledgements and credits back to the sender (not timed).
        for (_, _, s) in ep.sessions() {
            while let Some(len) = s.poll_transmit(t, &mut buf) {
                c.handle_datagram(t, &buf[..len]);
            }
        }
        if sealed.is_empty() && written.is_empty() {
            return None;
        }
        sent += (sealed.len() + written.len()) as u64;
    }
    Some((rtt, tx.as_nanos() as f64 / sent as f64, rx.as_nanos() as f64 / sent as f64))
}

/// Nanoseconds per frame tag over `len` bytes.
pub fn mac_cost(len: usize) -> f64 {
    let (k, _) =
        PresharedKey::new(b"0123456789abcdef").map(|p| p.frame_keys(b"t")).unwrap_or_else(|| unreachable!());
    let frame = vec![0x11u8; len];
    let n = 200_000.min(300_000_000 / len.max(1));
    let t0 = Instant::now();
    let mut acc = 0u8;
    for _ in 0..n {
        acc ^= std::hint::black_box(k.tag(std::hint::black_box(&frame)))[0];
    }
    std::hint::black_box(acc);
    t0.elapsed().as_nanos() as f64 / n as f64
}

/// Nanoseconds to compute a frame's CRC32C trailer over `len` bytes, as each side does for
/// every frame it sends and receives, beside (not instead of) the MAC.
pub fn crc_cost(len: usize) -> f64 {
    let frame = vec![0x11u8; len];
    let n = 200_000.min(300_000_000 / len.max(1));
    let t0 = Instant::now();
    let mut acc = 0u32;
    for _ in 0..n {
        acc ^= link::wire::crc32c(std::hint::black_box(&frame));
    }
    std::hint::black_box(acc);
    t0.elapsed().as_nanos() as f64 / n as f64
}

/// Nanoseconds to encrypt a frame's body and tag it (AES-128-GCM, the header and FC
/// block as associated data), as an encrypting session does for each DATA frame it sends.
pub fn aead_cost(len: usize) -> f64 {
    let (k, _) =
        PresharedKey::new(b"0123456789abcdef").map(|p| p.frame_keys(b"t")).unwrap_or_else(|| unreachable!());
    let mut frame = vec![0x11u8; len];
    let body_at = link::wire::BODY_AT.min(len);
    let n = 200_000.min(300_000_000 / len.max(1));
    let t0 = Instant::now();
    let mut acc = 0u8;
    for _ in 0..n {
        acc ^= std::hint::black_box(k.seal(std::hint::black_box(&mut frame), body_at))[0];
    }
    std::hint::black_box(acc);
    t0.elapsed().as_nanos() as f64 / n as f64
}
