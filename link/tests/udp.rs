//! The link's invariants over real UDP: on loopback, and across two network namespaces
//! joined by veth, clean and with the impairment layer at 5 % loss, reordering and
//! duplication. The same applications as the simulation check delivery and ordering.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{ClientApp, ServerApp, config, key, plan};
use link::driver::{
    AnyUdp, Clock, Datagrams, DriverKind, Impaired, Impairment, PollMode, ServerRunner, SessionRunner,
};
use link::{Endpoint, Rng, Session};
use netns::Netns;

struct Outcome {
    capp: ClientApp,
    sapp: ServerApp,
    retransmits: u64,
}

/// Runs the workload: a server endpoint in its own thread (optionally in network namespace
/// `server_ns`), the client here (optionally in `client_ns`).
// Each argument is one axis of the test matrix (driver, mode, where, impairment, size).
#[allow(clippy::too_many_arguments)]
fn run(
    driver: DriverKind,
    mode: PollMode,
    server_bind: &str,
    client_bind: &str,
    server_ns: Option<&str>,
    client_ns: Option<&str>,
    imp: Impairment,
    n: usize,
) -> Outcome {
    let stop = Arc::new(AtomicBool::new(false));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel::<SocketAddr>();
    let server_bind: SocketAddr = server_bind.parse().unwrap();
    let ns = server_ns.map(str::to_owned);
    let stop2 = stop.clone();
    let server = std::thread::spawn(move || {
        if let Some(ns) = ns {
            netns::enter(&ns).unwrap();
        }
        let sock = Impaired::new(
            AnyUdp::bind(server_bind, driver, &mut |m| eprintln!("server {m}")).unwrap(),
            Impairment { seed: imp.seed ^ 1, ..imp },
        );
        addr_tx.send(sock.local_addr().unwrap()).unwrap();
        let ep = Endpoint::new(config(key()), 0x5e, Rng::from_u64(2), 4);
        let mut r = ServerRunner::new(sock, ep, Clock::new(), mode);
        let mut sapp = ServerApp::new(16);
        while !stop2.load(Ordering::Relaxed) {
            let active = r.poll().unwrap();
            for (_, _, s) in r.endpoint.sessions() {
                sapp.pump(s);
            }
            if !active {
                r.wait().unwrap();
            }
        }
        sapp
    });
    let server_addr = addr_rx.recv().unwrap();
    if let Some(ns) = client_ns {
        netns::enter(ns).unwrap();
    }
    let sock = Impaired::new(
        AnyUdp::bind(client_bind.parse().unwrap(), driver, &mut |m| eprintln!("client {m}")).unwrap(),
        imp,
    );
    assert_eq!(sock.name(), if driver == DriverKind::Portable { "portable" } else { "io_uring" });
    let clock = Clock::new();
    let session = Session::client(config(key()), clock.now(), 0xc1, Rng::from_u64(3));
    let mut r = SessionRunner::new(sock, server_addr, session, clock, mode);
    let mut capp = ClientApp::new(plan(n, 3, imp.seed));
    let ok = r
        .run_until(Duration::from_secs(60), |s| {
            capp.pump(s, 64);
            capp.done() || s.is_down()
        })
        .unwrap();
    assert!(ok && !r.session.is_down(), "workload did not finish: {:?}", r.session.stats());
    // Let the last ACKs reach the server, then stop it.
    r.run_until(Duration::from_millis(50), |s| s.is_idle()).unwrap();
    let retransmits = r.session.stats().retransmits;
    stop.store(true, Ordering::Relaxed);
    let sapp = server.join().unwrap();
    Outcome { capp, sapp, retransmits }
}

fn check(o: &Outcome, n: usize) {
    assert!(o.sapp.violations.is_empty(), "{:?}", o.sapp.violations);
    assert_eq!(o.capp.duplicates, 0);
    assert!(o.capp.outstanding.is_empty());
    let writes = o.capp.plan.iter().filter(|w| **w).count() as u32;
    assert_eq!(o.sapp.writes_seen, writes);
    assert_eq!(o.sapp.reads_seen as usize, n - writes as usize);
}

/// The workload over UDP loopback, checked.
fn loopback(driver: DriverKind, mode: PollMode, imp: Impairment, n: usize) -> Outcome {
    let o = run(driver, mode, "127.0.0.1:0", "127.0.0.1:0", None, None, imp, n);
    check(&o, n);
    o
}

fn lossy(seed: u64) -> Impairment {
    Impairment {
        loss: 0.05,
        duplicate: 0.05,
        jitter: Duration::from_micros(200),
        seed,
        ..Impairment::default()
    }
}

fn uring_available() -> bool {
    match link::driver::UringUdp::probe() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("skipping io_uring: unavailable here ({e})");
            false
        }
    }
}

#[test]
fn loopback_clean_portable() {
    loopback(DriverKind::Portable, PollMode::Blocking, Impairment::default(), 3000);
}

#[test]
fn loopback_lossy_reordering_duplicating_portable() {
    let o = loopback(DriverKind::Portable, PollMode::Blocking, lossy(21), 2000);
    assert!(o.retransmits > 0, "5 % loss should have caused replays");
}

#[test]
fn loopback_clean_io_uring() {
    if uring_available() {
        loopback(DriverKind::IoUring, PollMode::Blocking, Impairment::default(), 3000);
    }
}

#[test]
fn loopback_lossy_reordering_duplicating_io_uring() {
    if uring_available() {
        let o = loopback(DriverKind::IoUring, PollMode::Blocking, lossy(23), 2000);
        assert!(o.retransmits > 0, "5 % loss should have caused replays");
    }
}

fn netns_workload(tag: &str, driver: DriverKind, imp: Impairment, n: usize) {
    let ns = match Netns::create(tag, [10, 77, 0]) {
        Ok(ns) => ns,
        Err(e) => {
            eprintln!("skipping: network namespaces unavailable here ({e})");
            return;
        }
    };
    // The client runs in a thread of its own so that this test thread keeps its namespace.
    let (a, b) = (ns.a.clone(), ns.b.clone());
    let (server, client) = (format!("{}:0", ns.addr_a()), format!("{}:0", ns.addr_b()));
    let o = std::thread::spawn(move || {
        run(driver, PollMode::Blocking, &server, &client, Some(&a), Some(&b), imp, n)
    })
    .join()
    .unwrap();
    check(&o, n);
}

#[test]
fn across_network_namespaces_clean() {
    netns_workload("c", DriverKind::Portable, Impairment::default(), 2000);
}

#[test]
fn across_network_namespaces_lossy_portable() {
    netns_workload("l", DriverKind::Portable, lossy(33), 1500);
}

#[test]
fn across_network_namespaces_lossy_io_uring() {
    if uring_available() {
        netns_workload("u", DriverKind::IoUring, lossy(35), 1500);
    }
}

/// Busy-polling on both sides, the run-to-completion path the benchmark uses, with a spin
/// budget (50 µs) far shorter than the gaps 200 µs of jitter leaves: each runner keeps going
/// from spinning to sleeping and back (io_uring: from single-shot receives to the multishot
/// one and back), with datagrams arriving across every switch.
#[test]
fn loopback_busy_poll_both_drivers() {
    let busy = PollMode::Busy { spin: Duration::from_micros(50) };
    loopback(DriverKind::Portable, busy, lossy(41), 1500);
    if uring_available() {
        loopback(DriverKind::IoUring, busy, lossy(43), 1500);
    }
}

/// The impairment acts on arrivals: an impaired endpoint's send leaves in its own call
/// (a plain socket has it at once, whatever the delay), and what it receives is delivered to
/// its caller only once the path would have (held, not lost, meanwhile).
#[test]
fn a_delayed_datagram_is_sent_at_once_and_delivered_once_due() {
    let delay = Duration::from_millis(20);
    let impaired = || {
        Impaired::new(
            AnyUdp::bind("127.0.0.1:0".parse().unwrap(), DriverKind::Portable, &mut |_| {}).unwrap(),
            Impairment { delay, ..Impairment::default() },
        )
    };
    // Sent at once.
    let mut tx = impaired();
    let plain = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    plain.set_read_timeout(Some(delay / 2)).unwrap();
    let sent = std::time::Instant::now();
    tx.send_to(plain.local_addr().unwrap(), b"now").unwrap();
    tx.flush().unwrap();
    let mut buf = [0u8; 16];
    let n = plain.recv(&mut buf).expect("an impaired endpoint's send was held");
    assert_eq!(&buf[..n], b"now");
    assert!(sent.elapsed() < delay, "{:?}", sent.elapsed());
    // Delivered once due.
    let mut rx = impaired();
    let to = rx.local_addr().unwrap();
    let sent = std::time::Instant::now();
    plain.send_to(b"held", to).unwrap();
    let mut got: Vec<Vec<u8>> = Vec::new();
    while got.is_empty() {
        rx.wait(Some(Duration::from_millis(5))).unwrap();
        rx.recv(&mut |_, b| got.push(b.to_vec())).unwrap();
        assert!(sent.elapsed() < Duration::from_secs(2), "never delivered");
    }
    assert!(sent.elapsed() >= delay, "delivered after {:?}, before the delay", sent.elapsed());
    assert_eq!(got, [b"held".to_vec()]);
}

/// What an impaired endpoint sends with a delay set leaves in its own calls: each
/// destination gets every datagram, byte for byte, in the order sent, whatever their sizes,
/// with either driver.
#[test]
fn an_impaired_endpoints_sends_leave_at_once_whole_and_in_order() {
    let mut kinds = vec![DriverKind::Portable];
    if uring_available() {
        kinds.push(DriverKind::IoUring);
    }
    for kind in kinds {
        let delay = Duration::from_millis(5);
        let mut tx = Impaired::new(
            AnyUdp::bind("127.0.0.1:0".parse().unwrap(), kind, &mut |_| {}).unwrap(),
            Impairment { delay, ..Impairment::default() },
        );
        let rx: Vec<std::net::UdpSocket> =
            (0..2).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
        let to: Vec<SocketAddr> = rx.iter().map(|s| s.local_addr().unwrap()).collect();
        // Runs of equal sizes (a GSO unit each), a shorter last one, alternating peers.
        let datagram = |i: usize| {
            let len = [1200, 1200, 1200, 700, 1472, 1472, 64][i % 7];
            (0..len).map(|k| (i * 31 + k) as u8).collect::<Vec<u8>>()
        };
        // Within what each receiving socket buffers (nothing reads them meanwhile).
        let n = 100;
        for i in 0..n {
            tx.send_to(to[(i / 25) % 2], &datagram(i)).unwrap();
        }
        tx.flush().unwrap();
        for (r, s) in rx.iter().enumerate() {
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut buf = [0u8; 2048];
            for i in (0..n).filter(|i| (i / 25) % 2 == r) {
                let got =
                    s.recv(&mut buf).unwrap_or_else(|e| panic!("{kind:?}: datagram {i} to peer {r}: {e}"));
                assert_eq!(&buf[..got], &datagram(i)[..], "{kind:?}: datagram {i} to peer {r}");
            }
        }
    }
}
