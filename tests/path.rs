//! The path between the endpoints: datagrams leave with Don't Fragment set, a host proposes
//! no larger frames than the route to its box carries whole, and nothing is ever sent in IP
//! fragments (where one fragment lost loses the whole datagram).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;

use bridge_host::RemoteDevice;
use driver::SimGpuDriver;
use dxpu_tests::{GpuBox, Netns, gpu_options, host_options, key_a, serial};
use testbed::workload::{WorkloadSize, run};

/// Every log line of this process, kept for the tests to read ("what the session uses").
struct Logged(std::sync::Mutex<Vec<String>>);

impl log::Log for Logged {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata())
            && let Ok(mut v) = self.0.lock()
        {
            v.push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

static LOGGED: Logged = Logged(std::sync::Mutex::new(Vec::new()));

/// The lines logged so far that contain `what` (the logger installed on first use).
fn logged(what: &str) -> Vec<String> {
    if log::set_logger(&LOGGED).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    LOGGED.0.lock().map(|v| v.iter().filter(|l| l.contains(what)).cloned().collect()).unwrap_or_default()
}

/// The kernel's own count of IP fragments made and reassembly requests taken in namespace
/// `ns` (`/proc/net/snmp`, its `Ip:` lines): `(FragCreates, ReasmReqds)`.
fn fragment_counters(ns: &str) -> (u64, u64) {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output()
        .unwrap();
    assert!(out.status.success(), "ip netns exec {ns}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let ip: Vec<&str> = text.lines().filter(|l| l.starts_with("Ip: ")).collect();
    assert_eq!(ip.len(), 2, "{text}");
    let (names, values): (Vec<&str>, Vec<&str>) =
        (ip[0].split_whitespace().collect(), ip[1].split_whitespace().collect());
    let get = |name: &str| {
        let i = names.iter().position(|n| *n == name).unwrap_or_else(|| panic!("no {name} in {}", ip[0]));
        values[i].parse::<u64>().unwrap()
    };
    (get("FragCreates"), get("ReasmReqds"))
}

/// `tcpdump` on an interface of a namespace, writing a pcap; None (and why, printed) where
/// tcpdump is missing.
struct Capture {
    child: std::process::Child,
    file: std::path::PathBuf,
}

impl Capture {
    fn start(ns: &str, dev: &str) -> Option<Capture> {
        let file = std::env::temp_dir().join(format!("dxpu-pmtu-{}.pcap", std::process::id()));
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", ns, "tcpdump", "-i", dev, "-U", "-n", "-w"])
            .arg(&file)
            .arg("ip")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        match child {
            Ok(child) if which("tcpdump") => {
                // tcpdump writes the file's header once it listens.
                let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
                while std::fs::metadata(&file).map_or(0, |m| m.len()) < 24 && std::time::Instant::now() < end
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Some(Capture { child, file })
            }
            _ => {
                eprintln!(
                    "no capture: tcpdump not found (.ci/run installs it); the kernel's counters still count"
                );
                None
            }
        }
    }

    /// Stops it: the IP packets captured, and how many of them were fragments (More
    /// Fragments set, or a fragment offset).
    fn finish(mut self) -> (usize, usize) {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let _ = std::process::Command::new("kill").arg("-INT").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
        let bytes = std::fs::read(&self.file).unwrap_or_default();
        let _ = std::fs::remove_file(&self.file);
        let (mut packets, mut fragments) = (0, 0);
        // pcap: a 24-byte header, then records of 16 bytes and the captured bytes (Ethernet here).
        let mut at = 24;
        while at + 16 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
            let frame = &bytes[at + 16..(at + 16 + len).min(bytes.len())];
            if frame.len() >= 14 + 20 && frame[12..14] == [0x08, 0x00] {
                packets += 1;
                let flags_offset = u16::from_be_bytes([frame[14 + 6], frame[14 + 7]]);
                if flags_offset & 0x3fff != 0 {
                    fragments += 1;
                }
            }
            at += 16 + len;
        }
        (packets, fragments)
    }
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Two namespaces joined by a veth of the usual 1500 bytes, both endpoints configured with
/// `mtu = 9000`: the host's session proposes 1472-byte frames (the route's MTU less the IP
/// and UDP headers) and the box agrees, a workload with bulk copies both ways verifies, no
/// datagram is refused as too large, and neither namespace's kernel made or reassembled a
/// single IP fragment.
#[test]
fn an_mtu_over_the_route_falls_back_to_what_it_carries_whole_and_nothing_is_fragmented() {
    let _g = serial();
    let ns = match Netns::create("pmtu", [10, 78, 9]) {
        Ok(ns) => ns,
        Err(e) => {
            eprintln!("skipping: network namespaces unavailable here ({e})");
            return;
        }
    };
    logged("");
    let mut g = gpu_options(SocketAddr::from((ns.addr_a(), 0)));
    g.link.mtu = 9000;
    let gpu = GpuBox::start_in(g, Some(ns.a.clone()));
    let (a0, b0) = (fragment_counters(&ns.a), fragment_counters(&ns.b));
    // A capture on the box's end of the veth: every IP packet of the workload, fragments
    // among them if there were any.
    let capture = Capture::start(&ns.a, "vpmtua");
    let (b, addr) = (ns.b.clone(), gpu.addr);
    let (mtu, payload, stats) = std::thread::spawn(move || {
        netns::enter(&b).unwrap();
        let mut h = host_options(addr, key_a());
        h.link.mtu = 9000;
        let remote = RemoteDevice::attach(h).unwrap();
        let (mtu, payload) = remote.payload_sizes();
        let mut d = SimGpuDriver::open(remote).unwrap();
        run(&mut d, WorkloadSize::scaled(2), &mut |_| {}).unwrap();
        let remote = d.into_pci();
        assert!(remote.removed().is_none(), "{:?}", remote.removed());
        (mtu, payload, remote.stats())
    })
    .join()
    .unwrap();
    assert_eq!(mtu, 1472, "the session's frames: the veth's 1500 less 28");
    // Said once at the attach, on the host; and by the box when the host connected.
    let said = logged("[link] mtu = 9000 is more than the route carries whole");
    assert!(said.len() == 1 && said[0].contains("frames are at most 1472 bytes"), "{said:?}");
    let said = logged("frames of at most 1472 bytes, sent with Don't Fragment");
    assert!(said.iter().any(|l| l.contains("host host-a connected")), "{said:?}");
    assert!(payload <= 1024, "a TLP's payload fits a 1472-byte frame: {payload}");
    assert_eq!(stats.datagrams_too_large, 0, "{stats:?}");
    assert!(stats.link.frames_received > 1000, "{stats:?}");
    let (a1, b1) = (fragment_counters(&ns.a), fragment_counters(&ns.b));
    if let Some(c) = capture {
        let (packets, fragments) = c.finish();
        assert!(packets > 100, "the capture saw the workload: {packets} packets");
        assert_eq!(fragments, 0, "IP fragments in the capture, of {packets} packets");
    }
    assert_eq!((a1.0 - a0.0, a1.1 - a0.1), (0, 0), "the box's namespace fragmented or reassembled");
    assert_eq!((b1.0 - b0.0, b1.1 - b0.1), (0, 0), "the host's namespace fragmented or reassembled");
    let stats = gpu.stop();
    assert_eq!(stats.datagrams_too_large, 0, "{stats:?}");
}

/// The route's MTU falls under a live session (both ends of the veth go from 9000 to 1500
/// bytes, as an interface reconfigured or an ICMP "fragmentation needed" would have it):
/// the session's 8972-byte frames are refused by the kernel (Don't Fragment), so the host
/// removes the device saying why instead of retrying for ever; the next attach fits its
/// frames to the route (1472) and the workload verifies; no fragment is made throughout.
#[test]
fn a_route_whose_mtu_falls_under_a_session_ends_it_saying_why_and_the_next_attach_fits() {
    let _g = serial();
    let ns = match Netns::create("pmtd", [10, 78, 10]) {
        Ok(ns) => ns,
        Err(e) => {
            eprintln!("skipping: network namespaces unavailable here ({e})");
            return;
        }
    };
    let (na, nb) = (ns.a.clone(), ns.b.clone());
    let set_mtu = move |mtu: &str| {
        for (n, dev) in [(&na, "vpmtda"), (&nb, "vpmtdb")] {
            let st =
                std::process::Command::new("ip").args(["-n", n, "link", "set", dev, "mtu", mtu]).status();
            assert!(st.unwrap().success(), "ip link set {dev} mtu {mtu}");
        }
    };
    set_mtu("9000");
    let mut g = gpu_options(SocketAddr::from((ns.addr_a(), 0)));
    g.link.mtu = 8972;
    let gpu = GpuBox::start_in(g, Some(ns.a.clone()));
    let (a0, b0) = (fragment_counters(&ns.a), fragment_counters(&ns.b));
    let (b, addr) = (ns.b.clone(), gpu.addr);
    // The host's side on a thread of its namespace throughout: the route it looks up when a
    // datagram is refused is the namespace's.
    let host = std::thread::spawn(move || {
        netns::enter(&b).unwrap();
        let opts = move || {
            let mut h = host_options(addr, key_a());
            h.link.mtu = 8972;
            h
        };
        let mut d = SimGpuDriver::open(RemoteDevice::attach(opts()).unwrap()).unwrap();
        assert_eq!(d.pci().payload_sizes().0, 8972, "jumbo frames while the route has them");
        run(&mut d, WorkloadSize::scaled(1), &mut |_| {}).unwrap();
        set_mtu("1500");
        let _ = run(&mut d, WorkloadSize::scaled(1), &mut |_| {});
        let why = d.pci().removed().expect("the device is removed once its frames no longer fit the route");
        drop(d);
        let mut d = SimGpuDriver::open(RemoteDevice::attach(opts()).unwrap()).unwrap();
        let sizes = d.pci().payload_sizes();
        run(&mut d, WorkloadSize::scaled(1), &mut |_| {}).unwrap();
        (why, sizes)
    });
    let (why, sizes) = host.join().unwrap();
    assert!(why.contains("MTU fell to 1500") && why.contains("8972"), "{why}");
    assert_eq!(sizes.0, 1472, "the next attach fits the route");
    let (a1, b1) = (fragment_counters(&ns.a), fragment_counters(&ns.b));
    assert_eq!((a1.0 - a0.0, b1.0 - b0.0), (0, 0), "fragments were made");
    drop(gpu);
}
