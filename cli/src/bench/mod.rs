//! `dxpu bench link`: the transport's figures, measured side by side in one run so that
//! their ratios mean something on a shared, noisy machine.
//!
//! (a) the floor: a bare UDP ping-pong with plain sockets, busy-polling and blocking, the
//!     client's socket connected to the server's as a session client's is (and, for
//!     reference, not connected);
//! (b) a one-TLP request/response (MRd → CplD) through two sessions, for each driver and
//!     mode, run to completion by the requesting thread;
//! (c) streaming 256-byte posted writes through a session (the receiver takes them in
//!     place), against the same datagrams through bare sockets;
//! (d) the cost of the per-frame MAC, and of encrypting a frame's body (`link.encrypt_frames`);
//! (e) the sessions' own CPU time, in memory (no sockets): per round trip, and per streamed
//!     frame on each side, frames tagged and frames encrypted.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use link::driver::{AnyUdp, Clock, Datagrams, DriverKind, ServerRunner, SessionRunner};
use link::{Config, Endpoint, PresharedKey, Rng, Session, Transmit};
use tlp::{Address, Bdf, Body, Completion, CplStatus, ParseConfig, Request, Tag, TlpRepr};

/// Options of `dxpu bench link`.
#[derive(Args, Debug)]
pub(crate) struct LinkBench {
    /// Round trips measured per case (after 10 % warm-up).
    #[arg(long, default_value_t = 20000)]
    iterations: usize,
    /// Posted writes streamed per streaming case.
    #[arg(long, default_value_t = 200_000)]
    stream: usize,
    /// The sessions' MTU (the link's default is 1472; 9000 for jumbo frames).
    #[arg(long, default_value_t = 1472, value_parser = clap::value_parser!(u32).range(512..=65507))]
    mtu: u32,
    /// Print one JSON object on standard output (the table goes to standard error).
    #[arg(long)]
    json: bool,
}

/// `bench link`'s columns: the case, then its three figures.
const LINK_COLUMNS: [usize; 4] = [44, 10, 10, 12];

/// The sessions' MTU for this run (`--mtu`).
static MTU: AtomicU64 = AtomicU64::new(1472);

fn bench_config() -> Config {
    let psk = PresharedKey::new(b"dxpu bench key, not a secret at all").unwrap_or_else(|| unreachable!());
    let mut c = Config::new(psk);
    c.mtu = MTU.load(Ordering::Relaxed) as usize;
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

fn write_tlp(size: usize) -> Vec<u8> {
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

fn spawn_server(driver: DriverKind, busy: bool) -> std::io::Result<Server> {
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
        let ep = Endpoint::new(bench_config(), 0x5e, Rng::from_u64(1), 4);
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
        self.thread.join().map_err(|_| std::io::Error::other("server thread panicked"))?
    }
}

fn connect(driver: DriverKind, busy: bool, server: SocketAddr) -> std::io::Result<SessionRunner<AnyUdp>> {
    let sock = AnyUdp::bind(SocketAddr::from(LOCAL), driver, &mut |_| {})?;
    let clock = Clock::new();
    let session = Session::client(bench_config(), clock.now(), 0xc1, Rng::from_u64(2));
    let mut r = SessionRunner::new(sock, server, session, clock, mode_of(busy));
    if !r.run_until(Duration::from_secs(5), |s| s.is_up())? {
        return Err(std::io::Error::other("session did not come up"));
    }
    Ok(r)
}

/// (b) One-TLP request/response through two sessions.
fn session_rtt(driver: DriverKind, busy: bool, n: usize) -> std::io::Result<Rtt> {
    let server = spawn_server(driver, busy)?;
    let mut r = connect(driver, busy, server.addr)?;
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

struct Stream {
    seconds: f64,
    datagrams: u64,
}

/// (c) Streaming posted writes of `size` bytes through a session.
fn session_stream(driver: DriverKind, n: usize, size: usize) -> std::io::Result<Stream> {
    let server = spawn_server(driver, true)?;
    let mut r = connect(driver, true, server.addr)?;
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
fn joined_in_memory(encrypt: bool) -> Option<(Session, Endpoint<u32>, link::Time)> {
    let mut cfg = bench_config();
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

/// (e) The sessions' CPU time without sockets: nanoseconds per MRd → CplD round trip (both
/// sides), and per streamed frame of 256-byte writes for the sender (queueing the TLPs, then
/// sealing, tagging and checksumming the frame where its TLPs lie) and for the receiver
/// (checking it and taking its TLPs).
fn session_cpu(size: usize, encrypt: bool) -> Option<(f64, f64, f64)> {
    let (mut c, mut ep, mut t) = joined_in_memory(encrypt)?;
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

/// (d) Nanoseconds per frame tag.
fn mac_cost(len: usize) -> f64 {
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

/// (d) Nanoseconds to compute a frame's CRC32C trailer over `len` bytes, as each side does for
/// every frame it sends and receives, beside (not instead of) the MAC.
fn crc_cost(len: usize) -> f64 {
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

/// (d) Nanoseconds to encrypt a frame's body and tag it (AES-128-GCM, the header and FC
/// block as associated data), as an encrypting session does for each DATA frame it sends.
fn aead_cost(len: usize) -> f64 {
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

pub(crate) fn run_link(args: LinkBench) -> std::io::Result<()> {
    let n = args.iterations.max(100);
    MTU.store(args.mtu as u64, Ordering::Relaxed);
    // With --json the table goes to standard error and the object alone to standard output.
    let json = args.json;
    macro_rules! say {
        ($($t:tt)*) => { if json { eprintln!($($t)*) } else { outln!($($t)*) } };
    }
    let mut rtt_rows = Vec::new();
    let mut stream_rows = Vec::new();
    let mut cpu_rows = Vec::new();
    say!("dxpu bench link — {n} round trips per case (after warm-up), UDP loopback, MTU {}", args.mtu);
    let uring = link::driver::UringUdp::probe();
    if let Err(e) = &uring {
        say!("io_uring unavailable ({e}): its rows are skipped");
    }
    say!();
    let row = |cells: &[String]| crate::out::row(&LINK_COLUMNS, cells);
    say!(
        "{}",
        row(&[
            "round trip (64 B / one MRd→CplD)".into(),
            "p50 µs".into(),
            "p99 µs".into(),
            "p50 / floor".into()
        ])
    );
    let say_row = |cells: &[String]| say!("{}", row(cells));
    let floors = floor_rows(&say_row, n, &mut rtt_rows)?;
    session_rows(&say_row, n, uring.is_ok(), &floors, &mut rtt_rows)?;
    say!();
    let size = 256;
    let tlp_len = write_tlp(size).len();
    say!(
        "{}",
        row(&[
            format!("streaming {} × {size} B posted writes", args.stream),
            "MB/s".into(),
            "Mdgram/s".into(),
            "vs bare".into()
        ])
    );
    for driver in [DriverKind::Portable, DriverKind::IoUring] {
        if driver == DriverKind::IoUring && uring.is_err() {
            continue;
        }
        let s = session_stream(driver, args.stream, size)?;
        let per = args.stream as f64 / s.datagrams.max(1) as f64;
        let dgram =
            (link::wire::HEADER_LEN + link::wire::TRAILER_LEN) + (per.round() as usize) * (tlp_len + 2);
        let (bare_s, bare_got) = bare_stream(s.datagrams, dgram)?;
        let mbps = (args.stream * size) as f64 / s.seconds / 1e6;
        let bare_mbps = (bare_got as f64 * per * size as f64) / bare_s / 1e6;
        stream_rows.push(serde_json::json!({"driver": driver_name(driver), "tlp_bytes": size,
            "tlps": args.stream, "tlps_per_datagram": per, "bytes_per_s": mbps * 1e6, "bare_bytes_per_s": bare_mbps * 1e6,
            "datagrams": s.datagrams, "bare_lost": s.datagrams.saturating_sub(bare_got)}));
        let name = format!(
            "session, {} ({:.1} TLPs per datagram)",
            if driver == DriverKind::Portable { "portable" } else { "io_uring" },
            per
        );
        say!(
            "{}",
            row(&[
                name,
                format!("{mbps:.0}"),
                format!("{:.3}", s.datagrams as f64 / s.seconds / 1e6),
                format!("{:.2}", mbps / bare_mbps)
            ])
        );
        say!(
            "{}",
            row(&[
                format!("  bare sockets, same {} × {dgram} B datagrams", s.datagrams),
                format!("{bare_mbps:.0}"),
                format!("{:.3}", bare_got as f64 / bare_s / 1e6),
                if bare_got < s.datagrams {
                    format!("({} lost)", s.datagrams - bare_got)
                } else {
                    "1.00".into()
                }
            ])
        );
    }
    say!();
    let say_line = |line: String| say!("{line}");
    let costs = frame_costs(&say_line);
    cpu_rows.extend(session_cpu_lines(&say_line, size));
    if json {
        let report = serde_json::json!({
            "mtu_bytes": args.mtu,
            "round_trips": rtt_rows,
            "streaming": stream_rows,
            "mac_ns": costs["mac_ns"],
            "aead_ns": costs["aead_ns"],
            "crc_ns": costs["crc_ns"],
            "session_cpu": cpu_rows,
        });
        outln!("{report}");
    }
    Ok(())
}

/// (a) The floor: a bare UDP ping-pong busy-polling and blocking (and, for reference, with
/// the client's socket not connected), a row each; the two floors.
fn floor_rows(
    say: &dyn Fn(&[String]),
    n: usize,
    rows: &mut Vec<serde_json::Value>,
) -> std::io::Result<[(bool, Rtt); 2]> {
    let floors = [(true, bare_pingpong(true, true, n, None)?), (false, bare_pingpong(false, true, n, None)?)];
    for (busy, f) in &floors {
        let mode = if *busy { "busy-poll" } else { "blocking" };
        let poll = if *busy { "busy" } else { "blocking" };
        rows.push(serde_json::json!({"path": "bare", "driver": "plain", "poll": poll,
            "p50_us": us(f.p50), "p99_us": us(f.p99)}));
        say(&[
            format!("bare UDP ping-pong, {mode} (floor)"),
            format!("{:.1}", us(f.p50)),
            format!("{:.1}", us(f.p99)),
            "1.00".into(),
        ]);
        // For reference: what not connecting the client's socket costs.
        let unconnected = bare_pingpong(*busy, false, n, None)?;
        say(&[
            "  the same, client socket not connected".into(),
            format!("{:.1}", us(unconnected.p50)),
            format!("{:.1}", us(unconnected.p99)),
            format!("{:.2}", us(unconnected.p50) / us(f.p50)),
        ]);
    }
    Ok(floors)
}

/// (b) A one-TLP request/response through two sessions, for each driver (io_uring where the
/// kernel has it) and mode, a row each against its floor.
fn session_rows(
    say: &dyn Fn(&[String]),
    n: usize,
    uring: bool,
    floors: &[(bool, Rtt); 2],
    rows: &mut Vec<serde_json::Value>,
) -> std::io::Result<()> {
    for driver in [DriverKind::Portable, DriverKind::IoUring] {
        if driver == DriverKind::IoUring && !uring {
            continue;
        }
        for (busy, floor) in floors {
            let rtt = session_rtt(driver, *busy, n)?;
            rows.push(serde_json::json!({"path": "session", "driver": driver_name(driver),
                "poll": if *busy { "busy" } else { "blocking" }, "p50_us": us(rtt.p50), "p99_us": us(rtt.p99),
                "per_floor": us(rtt.p50) / us(floor.p50)}));
            let name = format!(
                "session, {}, {}",
                if driver == DriverKind::Portable { "portable" } else { "io_uring" },
                if *busy { "busy-poll" } else { "blocking" }
            );
            say(&[
                name,
                format!("{:.1}", us(rtt.p50)),
                format!("{:.1}", us(rtt.p99)),
                format!("{:.2}", us(rtt.p50) / us(floor.p50)),
            ]);
        }
    }
    Ok(())
}

/// (d) The per-frame costs of the CRC, the MAC and encryption, said and returned as JSON.
fn frame_costs(say: &dyn Fn(String)) -> serde_json::Value {
    let (mac64, mac1472, aead64, aead1472) = (mac_cost(64), mac_cost(1472), aead_cost(64), aead_cost(1472));
    let (mac9000, aead9000) = (mac_cost(9000), aead_cost(9000));
    let (crc1472, crc9000) = (crc_cost(1472), crc_cost(9000));
    say(format!(
        "frame CRC32C: {crc1472:.0} ns per 1472-byte frame ({:.2} GB/s), {crc9000:.0} ns per 9000-byte \
         frame ({:.2} GB/s)",
        1472.0 / crc1472,
        9000.0 / crc9000
    ));
    say(format!(
        "frame MAC (AES-128-GMAC): {mac64:.0} ns per 64-byte frame, {mac1472:.0} ns per 1472-byte frame \
         ({:.2} GB/s), {mac9000:.0} ns per 9000-byte frame ({:.2} GB/s)",
        1472.0 / mac1472,
        9000.0 / mac9000
    ));
    say(format!(
        "frame AEAD (AES-128-GCM, body encrypted): {aead64:.0} ns per 64-byte frame, {aead1472:.0} ns per \
         1472-byte frame ({:.2} GB/s), {aead9000:.0} ns per 9000-byte frame ({:.2} GB/s)",
        1472.0 / aead1472,
        9000.0 / aead9000
    ));
    serde_json::json!({
        "mac_ns": {"64": mac64, "1472": mac1472, "9000": mac9000},
        "aead_ns": {"64": aead64, "1472": aead1472, "9000": aead9000},
        "crc_ns": {"1472": crc1472, "9000": crc9000},
    })
}

/// (e) The sessions' own CPU time in memory, frames tagged and frames encrypted, said and
/// returned as JSON rows.
fn session_cpu_lines(say: &dyn Fn(String), size: usize) -> Vec<serde_json::Value> {
    let mut rows = Vec::new();
    for (encrypt, what) in [(false, "tagged"), (true, "encrypted")] {
        let cpu = session_cpu(size, encrypt);
        if let Some((rtt, tx, rx)) = cpu {
            rows.push(serde_json::json!({"frames": what, "round_trip_ns": rtt, "send_frame_ns": tx,
                "receive_frame_ns": rx}));
        }
        match cpu {
            Some((rtt, tx, rx)) => say(format!(
                "session CPU, in memory, frames {what}: {rtt:.0} ns per round trip (both sides); per \
                 streamed frame {tx:.0} ns sending, {rx:.0} ns receiving"
            )),
            None => say(format!("session CPU, in memory, frames {what}: the sessions did not come up")),
        }
    }
    rows
}

fn driver_name(driver: DriverKind) -> &'static str {
    if driver == DriverKind::IoUring { "io_uring" } else { "portable" }
}

mod floor;
mod simgpu;

pub(crate) use floor::{
    Buffers, GsoRun, Rtt, bare_gso_stream, bare_gso_stream_with, bare_pingpong, bare_stream, driver_pingpong,
    mode_of, us,
};
use floor::{LOCAL, summarize};
pub(crate) use simgpu::{SimGpuBench, run_simgpu};
