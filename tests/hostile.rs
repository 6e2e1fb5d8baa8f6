//! The bridges under attack from the network (all traffic on 127.0.0.0/8): forged handshake
//! frames from the attached host's own address and port, and an INIT flood from fresh ports
//! while hosts attach. Neither may take a session or a device away.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bridge_gpu::{DeviceSpec, ExportSpec};
use bridge_host::RemoteDevice;
use driver::SimGpuDriver;
use dxpu_tests::{GpuBox, free_udp_port, gpu_options, host_options, key_a, key_b, send_spoofed, serial};
use hw::simgpu::SimGpuParams;
use link::{Rng, Session, Time};
use testbed::workload::{WorkloadSize, run};

fn v4(a: SocketAddr) -> SocketAddrV4 {
    match a {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(_) => panic!("IPv4 expected"),
    }
}

/// The INITs an attacker can make without the key: an empty body (what used to end the
/// session), and whole INITs of new sessions with no cookie and with a forged one.
fn forged_inits(epoch: u32) -> Vec<Vec<u8>> {
    let h = link::wire::Header { epoch, ..link::wire::Header::new(link::wire::FrameType::Init) };
    let mut empty = vec![0u8; 64];
    let n = link::wire::FrameRepr { header: h, fc: None, body: &[] }.emit(&mut empty, |_| [0; 16]).unwrap();
    empty.truncate(n);
    let mut out = vec![empty];
    let mut c = Session::client(link::Config::new(key_a()), Time::ZERO, epoch, Rng::from_u64(epoch.into()));
    let mut buf = vec![0u8; 2048];
    let n = c.poll_transmit(Time::ZERO, &mut buf).unwrap();
    out.push(buf[..n].to_vec());
    let mut cookie = buf[..n].to_vec();
    // The cookie is the last field of INIT's body, just before the trailer.
    let len = cookie.len();
    cookie[len - 20 - link::COOKIE_LEN..len - 20].fill(0x5a);
    let crc = link::wire::crc32c(&cookie[..len - 4]);
    cookie[len - 4..].copy_from_slice(&crc.to_be_bytes());
    out.push(cookie);
    out
}

#[test]
fn spoofed_inits_from_the_hosts_address_and_port_leave_its_session_and_device_alone() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options("127.0.0.1:0".parse().unwrap()));
    let host_addr: SocketAddr = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
    // Can this machine forge a source address at all?
    if let Err(e) = send_spoofed(v4(host_addr), v4(gpu.addr), b"probe") {
        eprintln!("skipping: no raw IPv4 socket here ({e}); the simulated pair covers the logic");
        return;
    }
    let mut o = host_options(gpu.addr, key_a());
    o.bind = Some(host_addr);
    let remote = RemoteDevice::attach(o).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let (stop2, sent2, to) = (stop.clone(), sent.clone(), v4(gpu.addr));
    // Another epoch (a "restart") and the same-looking fresh ones, every 200 µs.
    let attacker = std::thread::spawn(move || {
        let mut epoch = 1u32;
        while !stop2.load(Ordering::Relaxed) {
            for f in forged_inits(epoch) {
                send_spoofed(v4(host_addr), to, &f).unwrap();
                sent2.fetch_add(1, Ordering::Relaxed);
            }
            epoch = epoch.wrapping_add(1);
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    let mut d = SimGpuDriver::open(remote).unwrap();
    let r = run(&mut d, WorkloadSize::scaled(1), &mut |_| {});
    stop.store(true, Ordering::Relaxed);
    attacker.join().unwrap();
    r.unwrap();
    assert!(d.pci().removed().is_none(), "removed: {:?}", d.pci().removed());
    assert!(sent.load(Ordering::Relaxed) > 30, "the attacker sent {}", sent.load(Ordering::Relaxed));
    drop(d);
    let stats = gpu.stop();
    let e = &stats.exports[0].1;
    assert_eq!((e.attaches, stats.sessions_up), (1, 1), "{stats:?}");
    // One reset: at the end, when the host left; none while it worked.
    assert!(e.resets <= 1, "{stats:?}");
}

#[test]
fn an_init_flood_from_fresh_ports_does_not_keep_three_hosts_out() {
    let _g = serial();
    let mut g = gpu_options("127.0.0.1:0".parse().unwrap());
    g.exports = (0..3)
        .map(|i| ExportSpec {
            name: format!("gpu{i}"),
            device: DeviceSpec::Sim(SimGpuParams::default()),
            allow: vec!["host-a".into(), "host-b".into()],
        })
        .collect();
    let gpu = GpuBox::start(g);
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let (stop2, sent2, to) = (stop.clone(), sent.clone(), gpu.addr);
    // 5 000 INITs a second, each from a socket of its own (a fresh source port), with a key
    // ID the box holds: the most an attacker without the key can ask of it.
    let flood = std::thread::spawn(move || {
        let inits = forged_inits(7);
        let start = Instant::now();
        let mut n = 0u64;
        while !stop2.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(30) {
            let due = (start.elapsed().as_secs_f64() * 5000.0) as u64;
            while n < due {
                let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                let _ = s.send_to(&inits[1 + (n % 2) as usize], to);
                n += 1;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        sent2.store(n, Ordering::Relaxed);
    });
    std::thread::sleep(Duration::from_millis(200));
    let hosts: Vec<_> = [key_a(), key_b(), key_a()]
        .into_iter()
        .enumerate()
        .map(|(i, key)| {
            let addr = gpu.addr;
            std::thread::spawn(move || {
                let mut o = host_options(addr, key);
                o.device = format!("gpu{i}");
                let t = Instant::now();
                let remote = RemoteDevice::attach(o).unwrap();
                let attach = t.elapsed();
                let mut d = SimGpuDriver::open(remote).unwrap();
                run(&mut d, WorkloadSize::scaled(1), &mut |_| {}).unwrap();
                assert!(d.pci().removed().is_none());
                attach
            })
        })
        .collect();
    let attach_times: Vec<Duration> = hosts.into_iter().map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    let n = sent.load(Ordering::Relaxed);
    eprintln!("attach times {attach_times:?} under a flood of {n} INITs");
    assert!(n >= 1000, "the flood sent only {n}");
    for t in attach_times {
        assert!(t < Duration::from_secs(1), "an attach took {t:?}");
    }
    let stats = gpu.stop();
    assert_eq!(stats.sessions_up, 3, "{stats:?}");
}
