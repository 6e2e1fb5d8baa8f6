//! UDP GSO and GRO through both drivers on loopback: runs of equal-sized frames leave as one
//! GSO unit and arrive as one coalesced read, split back into exactly the frames sent; a
//! frame missing from the middle of a unit is replayed like any lost frame; a forged frame
//! inside a coalesced read is rejected alone, its neighbours delivered; with the offloads
//! off (or refused) every frame goes and comes on its own, and the link works the same.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{ClientApp, ServerApp, config, key, plan};
use link::driver::{
    AnyUdp, Clock, Datagrams, DriverKind, Offload, OffloadState, PollMode, ServerRunner, SessionRunner,
};
use link::{CreditGrant, Endpoint, Rng, Session};

fn drivers() -> Vec<DriverKind> {
    let mut d = vec![DriverKind::Portable];
    match link::driver::UringUdp::probe() {
        Ok(()) => d.push(DriverKind::IoUring),
        Err(e) => eprintln!("skipping io_uring: unavailable here ({e})"),
    }
    d
}

fn bind(driver: DriverKind, offload: Offload) -> AnyUdp {
    AnyUdp::bind_with("127.0.0.1:0".parse().unwrap(), driver, offload, &mut |m| eprintln!("{m}")).unwrap()
}

/// Sends `frames` borrowed from `tx` to `rx` and returns what `rx` received, frame by frame.
fn exchange(tx: &mut AnyUdp, rx: &mut AnyUdp, frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let to = rx.local_addr().unwrap();
    let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
    tx.send_borrowed(to, &refs).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < frames.len() && Instant::now() < deadline {
        rx.recv(&mut |_, d| got.push(d.to_vec())).unwrap();
    }
    got
}

/// Frames of these sizes, each filled with its index.
fn frames(sizes: &[usize]) -> Vec<Vec<u8>> {
    sizes.iter().enumerate().map(|(i, &n)| vec![i as u8; n]).collect()
}

#[test]
fn a_gso_unit_arrives_as_one_coalesced_read_split_into_the_frames_sent() {
    // Segment boundaries: runs of equal size, a shorter frame ending a run, a longer one
    // starting the next, a unit at the 64-segment limit and one at the 64 KiB limit.
    let mut sizes = vec![1200; 5];
    sizes.extend([300, 1400, 1400, 1400, 64]);
    sizes.extend(vec![100; 70]);
    sizes.extend(vec![9000; 8]);
    let sent = frames(&sizes);
    for &a in &drivers() {
        for &b in &drivers() {
            let (mut tx, mut rx) = (bind(a, Offload::AUTO), bind(b, Offload::AUTO));
            let (t0, r0) = (tx.offload(), rx.offload());
            if !t0.gso || !r0.gro {
                eprintln!(
                    "skipped {a:?} → {b:?}: offload refused here ({} / {})",
                    t0.describe(),
                    r0.describe()
                );
                continue;
            }
            let got = exchange(&mut tx, &mut rx, &sent);
            assert_eq!(got.len(), sent.len(), "{a:?} → {b:?}: every frame, once");
            assert!(got == sent, "{a:?} → {b:?}: the frames in order, byte for byte");
            let (t, r) = (tx.offload(), rx.offload());
            // 5×1200+300, 3×1400+64, 64×100, 6×100, 7×9000, 1×9000 (plain).
            assert_eq!(t.gso_sends - t0.gso_sends, 5, "{a:?} → {b:?}: the GSO units");
            assert!(r.gro_reads - r0.gro_reads >= 5, "{a:?} → {b:?}: the coalesced reads {r:?}");
        }
    }
}

#[test]
fn with_the_offloads_off_or_on_one_side_only_every_frame_still_arrives_alone() {
    let sent = frames(&[1000, 1000, 1000, 1000, 500, 1000, 1000]);
    for &a in &drivers() {
        for (tx_off, rx_off) in
            [(Offload::OFF, Offload::OFF), (Offload::AUTO, Offload::OFF), (Offload::OFF, Offload::AUTO)]
        {
            let (mut tx, mut rx) = (bind(a, tx_off), bind(a, rx_off));
            let got = exchange(&mut tx, &mut rx, &sent);
            assert!(got == sent, "{a:?} {tx_off:?} → {rx_off:?}: the frames in order");
            let (t, r) = (tx.offload(), rx.offload());
            if tx_off == Offload::OFF {
                assert!(!t.gso && t.gso_sends == 0, "{t:?}");
                assert_eq!(t.gso_off.as_deref(), Some("not asked for"));
            }
            // Without GRO the kernel cuts a GSO unit into datagrams before the socket.
            if rx_off == Offload::OFF {
                assert!(!r.gro && r.gro_reads == 0, "{r:?}");
            }
        }
    }
}

/// A driver that tampers with the first `left` batches of four or more equal-sized DATA
/// frames handed to it (after the handshake): drops the third, or forges the second (a tag
/// made without the key under a correct CRC), and hands the rest on as one batch — so the
/// inner driver sends them as one GSO unit and the peer reads them as one coalesced read.
struct Tamper<D> {
    inner: D,
    forge: bool,
    left: u32,
    tampered: u32,
}

impl<D: Datagrams> Datagrams for Tamper<D> {
    fn send_with(
        &mut self,
        to: SocketAddr,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> std::io::Result<usize> {
        self.inner.send_with(to, max, fill)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn send_borrowed(&mut self, to: SocketAddr, frames: &[&[u8]]) -> std::io::Result<()> {
        let equal = frames.len() >= 4 && frames[..4].iter().all(|f| f.len() == frames[0].len());
        if self.left == 0 || !equal || frames[0].len() < 1000 {
            return self.inner.send_borrowed(to, frames);
        }
        self.left -= 1;
        self.tampered += 1;
        if self.forge {
            let mut forged = frames[1].to_vec();
            let n = forged.len();
            forged[n - 20..n - 4].copy_from_slice(&[0x11; 16]);
            let crc = crc32c::crc32c(&forged[..n - 4]);
            forged[n - 4..].copy_from_slice(&crc.to_be_bytes());
            let mut batch: Vec<&[u8]> = frames.to_vec();
            batch[1] = &forged;
            self.inner.send_borrowed(to, &batch)
        } else {
            let batch: Vec<&[u8]> =
                frames.iter().enumerate().filter(|(i, _)| *i != 2).map(|(_, f)| *f).collect();
            self.inner.send_borrowed(to, &batch)
        }
    }
    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> std::io::Result<usize> {
        self.inner.recv(f)
    }
    fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.inner.wait(timeout)
    }
    fn spin(&mut self) {
        self.inner.spin()
    }
    fn connect(&mut self, peer: SocketAddr) -> std::io::Result<()> {
        self.inner.connect(peer)
    }
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn offload(&self) -> OffloadState {
        self.inner.offload()
    }
}

struct Outcome {
    client: link::Stats,
    server: link::Stats,
    client_offload: OffloadState,
    server_offload: OffloadState,
    tampered: u32,
}

/// The posted-write and read workload with 1 KiB writes (a frame each, equal sizes: GSO
/// units) from a tampering client to a server endpoint, both on `driver`.
fn workload(driver: DriverKind, forge: bool, n: usize) -> Outcome {
    let mut cfg = config(key());
    cfg.window = 128;
    cfg.credits = CreditGrant::default();
    cfg.max_queued = 256;
    // Replays answer NAKs here, not timers: a frame replayed is one the receiver missed.
    cfg.replay_timeout = Duration::from_millis(400);
    cfg.tail_loss_probe = false;
    cfg.max_replay_timeout = Duration::from_secs(1);
    cfg.idle_timeout = Duration::from_secs(5);
    let stop = Arc::new(AtomicBool::new(false));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop2, scfg) = (stop.clone(), cfg.clone());
    let server = std::thread::spawn(move || {
        let sock = bind(driver, Offload::AUTO);
        addr_tx.send(sock.local_addr().unwrap()).unwrap();
        let ep = Endpoint::new(scfg, 0x5e, Rng::from_u64(2), 4);
        let mut r =
            ServerRunner::new(sock, ep, Clock::new(), PollMode::Busy { spin: Duration::from_millis(5) });
        let mut sapp = ServerApp::new(256);
        let mut stats = link::Stats::default();
        while !stop2.load(Ordering::Relaxed) {
            r.poll().unwrap();
            for (_, _, s) in r.endpoint.sessions() {
                sapp.pump(s);
                stats = *s.stats();
            }
        }
        assert!(
            sapp.violations.is_empty(),
            "{} violations, first {:?}",
            sapp.violations.len(),
            sapp.violations.first()
        );
        (stats, r.sock.offload())
    });
    let server_addr = addr_rx.recv().unwrap();
    let sock = Tamper { inner: bind(driver, Offload::AUTO), forge, left: 3, tampered: 0 };
    let clock = Clock::new();
    let session = Session::client(cfg, clock.now(), 0xc1, Rng::from_u64(3));
    let mut r = SessionRunner::new(
        sock,
        server_addr,
        session,
        clock,
        PollMode::Busy { spin: Duration::from_millis(5) },
    );
    let mut capp = ClientApp::new(plan(n, 50, 7));
    let ok = r
        .run_until(Duration::from_secs(30), |s| {
            capp.pump(s, 1024);
            capp.done() || s.is_down()
        })
        .unwrap();
    assert!(ok && !r.session.is_down(), "workload did not finish: {:?}", r.session.stats());
    assert_eq!(capp.duplicates, 0);
    assert!(capp.outstanding.is_empty());
    r.run_until(Duration::from_millis(50), |s| s.is_idle()).unwrap();
    stop.store(true, Ordering::Relaxed);
    let (server_stats, server_offload) = server.join().unwrap();
    Outcome {
        client: *r.session.stats(),
        server: server_stats,
        client_offload: r.sock.offload(),
        server_offload,
        tampered: r.sock.tampered,
    }
}

#[test]
fn a_frame_missing_from_the_middle_of_a_gso_unit_is_replayed() {
    for &d in &drivers() {
        let o = workload(d, false, 3000);
        if !o.client_offload.gso || !o.server_offload.gro {
            eprintln!("skipped {d:?}: offload refused here");
            continue;
        }
        assert_eq!(o.tampered, 3, "{d:?}: three units lost a frame");
        assert_eq!(o.client.retransmits, 3, "{d:?}: each missing frame replayed, once {:?}", o.client);
        assert_eq!(o.client.naks_received, 3, "{d:?}: on the receiver's NAK {:?}", o.client);
        assert!(
            o.client_offload.gso_sends > 0 && o.server_offload.gro_reads > 0,
            "{d:?}: {o:?}",
            o = o.server_offload
        );
        assert_eq!(o.server.dropped_bad_mac, 0);
    }
}

#[test]
fn a_forged_frame_inside_a_coalesced_read_is_rejected_alone() {
    for &d in &drivers() {
        let o = workload(d, true, 3000);
        if !o.client_offload.gso || !o.server_offload.gro {
            eprintln!("skipped {d:?}: offload refused here");
            continue;
        }
        assert_eq!(o.tampered, 3);
        assert_eq!(
            o.server.dropped_bad_mac, 3,
            "{d:?}: the three forged frames, and only they {:?}",
            o.server
        );
        assert!(o.server_offload.gro_reads > 0, "{d:?}");
        // Their neighbours in the same reads were delivered: only the forged frames needed
        // replaying, each on the receiver's NAK.
        assert_eq!(o.client.retransmits, 3, "{d:?}: {:?}", o.client);
        assert_eq!(o.client.naks_received, 3, "{d:?}: {:?}", o.client);
    }
}

#[test]
fn zero_copy_sends_deliver_the_frames_and_end_the_borrow_only_once_the_kernel_is_done() {
    if !drivers().contains(&DriverKind::IoUring) {
        return;
    }
    let zc = Offload { zero_copy_send: true, ..Offload::AUTO };
    // Seven 9000-byte frames, each in its own buffer, span 21 pages: more than a zero-copy
    // send may pin (MAX_SKB_FRAGS), so the unit must be cut (it failed with EMSGSIZE).
    let mut sizes = vec![4000, 4000, 4000, 1200, 64];
    sizes.extend([9000; 7]);
    let sent = frames(&sizes);
    for rx_offload in [Offload::AUTO, Offload::OFF] {
        let (mut tx, mut rx) = (bind(DriverKind::IoUring, zc), bind(DriverKind::Portable, rx_offload));
        assert!(tx.offload().zero_copy_send, "{:?}", tx.offload());
        let got = exchange(&mut tx, &mut rx, &sent);
        assert!(got == sent, "the frames in order, byte for byte");
        // The borrow ended: the frames may change now without changing what was sent.
        let again = exchange(&mut tx, &mut rx, &frames(&[100, 100]));
        assert_eq!(again, frames(&[100, 100]));
    }
}

/// Receives what arrives at `rx` within `wait`.
fn received_within(rx: &mut AnyUdp, wait: Duration, want: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + wait;
    while got.len() < want && Instant::now() < deadline {
        rx.recv(&mut |_, d| got.push(d.to_vec())).unwrap();
    }
    got
}

/// Datagrams leave with Don't Fragment set. Where the kernel refuses a GSO send — here
/// because its segments (3000 bytes) are larger than the path's MTU (a veth pair's 1500) —
/// the driver turns GSO off and says why; sent alone, each of those frames is refused too
/// (EMSGSIZE), counted as too large and dropped, as the network would drop it, never sent in
/// IP fragments; the driver goes on, and frames that fit the path arrive. (The portable
/// driver sends the refused unit again at once, one by one; the io_uring driver learns of the
/// refusal from the completion, after the unit is gone, and leaves its frames to the link's
/// replay.)
#[test]
fn a_datagram_over_the_path_is_refused_and_counted_never_fragmented_and_the_driver_goes_on() {
    let ns = match netns::Netns::create("gso", [10, 79, 3]) {
        Ok(ns) => ns,
        Err(e) => {
            eprintln!("skipping: network namespaces unavailable here ({e})");
            return;
        }
    };
    for &d in &drivers() {
        let (a, b, addr_a, addr_b) = (ns.a.clone(), ns.b.clone(), ns.addr_a(), ns.addr_b());
        std::thread::spawn(move || {
            // Each socket is made in its namespace and stays there.
            netns::enter(&b).unwrap();
            let mut rx =
                AnyUdp::bind_with(SocketAddr::from((addr_b, 0)), d, Offload::AUTO, &mut |_| {}).unwrap();
            netns::enter(&a).unwrap();
            let mut tx =
                AnyUdp::bind_with(SocketAddr::from((addr_a, 0)), d, Offload::AUTO, &mut |_| {}).unwrap();
            assert!(tx.offload().dont_fragment, "{d:?}: {:?}", tx.offload());
            let to = rx.local_addr().unwrap();
            let path = link::driver::path_mtu(to).unwrap();
            assert_eq!((path.mtu, path.datagram), (1500, 1472), "{d:?}: a veth's route");
            let fragments = || {
                // This thread's namespace's counters: /proc/net is the main thread's.
                let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap();
                let ip: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Ip: ")).collect();
                let names: Vec<&str> = ip[0].split_whitespace().collect();
                let i = names.iter().position(|n| *n == "FragCreates").unwrap();
                ip[1].split_whitespace().nth(i).unwrap().parse::<u64>().unwrap()
            };
            let before = fragments();
            let big = frames(&[3000, 3000, 3000, 3000]);
            let refs: Vec<&[u8]> = big.iter().map(|f| f.as_slice()).collect();
            tx.send_borrowed(to, &refs).unwrap();
            assert!(received_within(&mut rx, Duration::from_millis(300), 1).is_empty(), "{d:?}");
            if tx.offload().gso_off.is_some() {
                assert!(tx.offload().gso_off.as_deref().is_some_and(|w| w.contains("refused")), "{d:?}");
            }
            // Alone now (GSO off, or never on): each refused as too large, none sent.
            let counted = tx.offload().too_large;
            tx.send_borrowed(to, &refs).unwrap();
            tx.flush().unwrap();
            assert!(received_within(&mut rx, Duration::from_millis(300), 1).is_empty(), "{d:?}");
            let st = tx.offload();
            // io_uring counts at the completion: give it a receive pass to reap.
            let end = std::time::Instant::now() + Duration::from_secs(2);
            let mut st = st;
            while st.too_large < counted + 4 && std::time::Instant::now() < end {
                let _ = tx.recv(&mut |_, _| {});
                st = tx.offload();
            }
            assert_eq!(st.too_large, counted + 4, "{d:?}: every oversized frame counted: {st:?}");
            assert_eq!(fragments(), before, "{d:?}: the kernel made IP fragments");
            // Frames that fit still go.
            let small = frames(&[1400, 1400, 1400]);
            let refs: Vec<&[u8]> = small.iter().map(|f| f.as_slice()).collect();
            tx.send_borrowed(to, &refs).unwrap();
            let got = received_within(&mut rx, Duration::from_secs(5), small.len());
            assert!(got == small, "{d:?}: frames within the path arrive");
        })
        .join()
        .unwrap();
    }
}
