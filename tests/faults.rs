//! The bridges when the network or an endpoint fails: endpoints in separate network
//! namespaces, a lossy reordering network, the box killed mid-workload, the host killed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bridge_host::RemoteDevice;
use driver::SimGpuDriver;
use dxpu_tests::{GpuBox, Netns, gpu_options, host_options, key_a, key_b, serial};
use link::driver::Impairment;
use testbed::workload::{WorkloadSize, run};

fn local() -> std::net::SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn workload_ok(remote: RemoteDevice) -> RemoteDevice {
    let mut d = SimGpuDriver::open(remote).unwrap();
    run(&mut d, WorkloadSize::scaled(1), &mut |_| {}).unwrap();
    assert!(d.pci().removed().is_none());
    d.into_pci()
}

#[test]
fn endpoints_in_separate_network_namespaces() {
    let _g = serial();
    let ns = match Netns::create("brn", [10, 78, 1]) {
        Ok(ns) => ns,
        Err(e) => {
            eprintln!("skipping: network namespaces unavailable here ({e})");
            return;
        }
    };
    let gpu = GpuBox::start_in(gpu_options(SocketAddr::from((ns.addr_a(), 0))), Some(ns.a.clone()));
    let (b, addr) = (ns.b.clone(), gpu.addr);
    std::thread::spawn(move || {
        netns::enter(&b).unwrap();
        let remote = RemoteDevice::attach(host_options(addr, key_a())).unwrap();
        let remote = workload_ok(remote);
        assert!(remote.stats().link.frames_received > 100);
    })
    .join()
    .unwrap();
    let stats = gpu.stop();
    assert_eq!(stats.exports[0].1.attaches, 1);
}

#[test]
fn lossy_reordering_network_across_namespaces_still_gives_correct_results() {
    let _g = serial();
    let lossy =
        |seed| Impairment { loss: 0.02, jitter: Duration::from_micros(200), seed, ..Impairment::default() };
    // Across two namespaces where the machine allows it, else on loopback.
    let ns = Netns::create("brl", [10, 78, 2])
        .map_err(|e| eprintln!("namespaces unavailable ({e}): on loopback"))
        .ok();
    let (listen, host_ns, gpu_ns) = match &ns {
        Some(ns) => (SocketAddr::from((ns.addr_a(), 0)), Some(ns.b.clone()), Some(ns.a.clone())),
        None => (SocketAddr::from(([127, 0, 0, 1], 0)), None, None),
    };
    let mut g = gpu_options(listen);
    g.impairment = lossy(7);
    let gpu = GpuBox::start_in(g, gpu_ns);
    let addr = gpu.addr;
    let s = std::thread::spawn(move || {
        if let Some(ns) = host_ns {
            netns::enter(&ns).unwrap();
        }
        let mut h = host_options(addr, key_a());
        h.impairment = lossy(8);
        let remote = workload_ok(RemoteDevice::attach(h).unwrap());
        remote.stats()
    })
    .join()
    .unwrap();
    assert!(s.link.retransmits > 0, "2 % loss caused no retransmission: {:?}", s.link);
    assert_eq!(s.completion_timeouts, 0);
}

#[test]
fn box_killed_mid_workload_completes_reads_with_all_ones_and_reports_removal() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let remote = RemoteDevice::attach(host_options(gpu.addr, key_a())).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    d.set_timeout(Duration::from_secs(2));
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        gpu.kill()
    });
    let start = Instant::now();
    // Large enough to be running when the box dies.
    let r = run(&mut d, WorkloadSize::scaled(8), &mut |_| {});
    let took = start.elapsed();
    killer.join().unwrap();
    assert!(r.is_err(), "the workload cannot finish without the box");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let removed = d.pci().removed();
    assert!(removed.is_some(), "device not reported removed");
    // After removal every read returns all-ones at once.
    let t = Instant::now();
    assert_eq!(d.read_reg(simgpu_abi::reg::ID), u64::MAX);
    assert_eq!(driver::PciFunction::config_read(d.pci(), 0), u32::MAX);
    assert!(t.elapsed() < Duration::from_millis(100));
    let s = d.pci().stats();
    assert!(s.completion_timeouts + s.failed_requests > 0, "{s:?}");
}

#[test]
fn host_killed_frees_the_device_for_another_host() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let remote = RemoteDevice::attach(host_options(gpu.addr, key_a())).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    // Leave work behind: dirty VRAM, commands in flight — a copy out large enough (64 MiB)
    // that the device is still sending it when the host is gone (a 1 MiB one sometimes
    // finished first, and nothing was left in flight to count).
    d.memcpy_to_device(0, &[0x77; 1 << 16]).unwrap();
    d.submit(driver::Command { opcode: simgpu_abi::op::COPY_V2H, args: [0, 0x1_0000_0000, 64 << 20, 0, 0] })
        .unwrap();
    d.into_pci().abandon();
    // host-b waits for the box to notice (idle timeout) and then gets a clean device.
    let deadline = Instant::now() + Duration::from_secs(5);
    let second = loop {
        match RemoteDevice::attach(host_options(gpu.addr, key_b())) {
            Ok(r) => break r,
            Err(e) if Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("device never freed: {e}"),
        }
    };
    let mut d = SimGpuDriver::open(second).unwrap();
    // The reset cleared VRAM: nothing of host-a's data is left.
    let mut b = vec![0u8; 4096];
    d.memcpy_from_device(0, &mut b).unwrap();
    assert!(b.iter().all(|x| *x == 0), "VRAM not cleared by the reset");
    let remote = workload_ok(d.into_pci());
    drop(remote);
    let stats = gpu.stop();
    let e = &stats.exports[0].1;
    assert!(e.resets >= 2, "{e:?}");
    assert_eq!(e.attaches, 2);
    assert!(e.dma_dropped > 0, "the reads in flight at the reset were not counted: {e:?}");
}

/// A box that dies while the driver waits for a fence: the wait ends as soon as the host
/// endpoint knows the device is gone (the link's ride-through time: 1 s here; a completion
/// timeout waits for a silent link, docs/reliability.md), with that reason — not after the driver's own 5 s
/// fence timeout with "fence not reached", "device error 18446744073709551615" or "no MSI-X
/// capability" (what the previous driver said).
#[test]
fn a_box_that_dies_during_a_fence_wait_ends_it_with_the_removal_at_once() {
    use driver::{DriverError, WaitMode};
    let _g = serial();
    for mode in [WaitMode::Poll, WaitMode::Interrupt] {
        let gpu = GpuBox::start(gpu_options(local()));
        let remote = RemoteDevice::attach(host_options(gpu.addr, key_a())).unwrap();
        let mut d = SimGpuDriver::open(remote).unwrap();
        d.set_timeout(Duration::from_secs(5));
        let killed_at = std::sync::Arc::new(std::sync::Mutex::new(None));
        let k = killed_at.clone();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            *k.lock().unwrap() = Some(Instant::now());
            gpu.kill()
        });
        // Fence after fence until one cannot be reached.
        let start = Instant::now();
        let err = loop {
            if let Err(e) = d.launch(simgpu_abi::op::NOP, [0; 5], mode) {
                break e;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "the box never died");
        };
        let ended = Instant::now();
        killer.join().unwrap();
        let killed = killed_at.lock().unwrap().unwrap();
        assert!(matches!(err, DriverError::Removed(_)), "{mode:?}: {err}");
        assert!(ended - killed < Duration::from_millis(2000), "{mode:?}: told after {:?}", ended - killed);
        eprintln!("{mode:?}: {err} ({:?} after the box died)", ended - killed);
        // And a driver opening the dead device says the same, not "not a simgpu".
        let e = SimGpuDriver::open(d.into_pci()).err().unwrap();
        assert!(matches!(e, DriverError::Removed(_)), "{e}");
    }
}

/// Half of all datagrams lost each way: the replay back-off (up to 200 ms per attempt) often
/// holds a completion past the 500 ms completion timeout these tests use — which removed the
/// device before completion timeouts were extended while the link recovers lost frames.
#[test]
fn a_link_that_loses_half_its_datagrams_still_gets_every_completion() {
    let _g = serial();
    let lossy = |seed| Impairment { loss: 0.5, seed, ..Impairment::default() };
    let mut g = gpu_options(local());
    g.impairment = lossy(21);
    let gpu = GpuBox::start(g);
    let mut h = host_options(gpu.addr, key_a());
    h.impairment = lossy(22);
    h.attach_timeout = Duration::from_secs(10);
    let remote = RemoteDevice::attach(h).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    let data: Vec<u8> = (0..64 << 10).map(|i: u32| (i * 7) as u8).collect();
    d.memcpy_to_device(0x2000, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    d.memcpy_from_device(0x2000, &mut back).unwrap();
    assert!(back == data, "the copy came back different");
    for _ in 0..20 {
        d.launch(simgpu_abi::op::NOP, [0; 5], driver::WaitMode::Poll).unwrap();
    }
    assert!(d.pci().removed().is_none(), "{:?}", d.pci().removed());
    let s = d.pci().stats();
    eprintln!("{s:?}");
    assert_eq!(s.completion_timeouts, 0, "{s:?}");
    assert!(s.link.retransmits > 0, "{s:?}");
}

/// Half of all datagrams lost each way and the rest reordered (jitter), with the driver's
/// stall timeout at 1 s: 8 MiB copies each way take longer than that here, and arrive byte
/// for byte — the waits follow the link (frames still arriving), not the clock. With a
/// fixed fence timeout (9b5fbd6) the first copy failed "fence 1 not reached within 1s".
#[test]
fn half_the_datagrams_lost_and_reordered_and_the_waits_go_on_while_frames_flow() {
    let _g = serial();
    let lossy =
        |seed| Impairment { loss: 0.5, jitter: Duration::from_micros(200), seed, ..Impairment::default() };
    let mut g = gpu_options(local());
    g.impairment = lossy(31);
    g.link.ride_through = Duration::from_secs(3);
    let gpu = GpuBox::start(g);
    let mut h = host_options(gpu.addr, key_a());
    h.impairment = lossy(32);
    h.link.ride_through = Duration::from_secs(3);
    h.attach_timeout = Duration::from_secs(10);
    let remote = RemoteDevice::attach(h).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    d.set_timeout(Duration::from_secs(1));
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let start = Instant::now();
    d.memcpy_to_device(0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    d.memcpy_from_device(0, &mut back).unwrap();
    let took = start.elapsed();
    assert!(back == data, "the copy came back different");
    eprintln!("8 MiB each way at 50 % loss: {took:?}");
    run(&mut d, WorkloadSize::scaled(1), &mut |_| {}).unwrap();
    assert!(d.pci().removed().is_none(), "{:?}", d.pci().removed());
    let s = d.pci().stats();
    assert!(s.link.retransmits > 0 && s.link.replay_timeouts > 0, "{:?}", s.link);
}

/// The link between the namespaces goes down for 3 s in the middle of workloads (the veth
/// set down and up again: every datagram lost either way, as in a link flap or a switch
/// reboot): the sessions ride it through — said silent, then heard again — the device is
/// never removed, and every workload before, across and after the outage verifies.
#[test]
fn a_link_down_for_three_seconds_is_ridden_through_and_every_workload_verifies() {
    let _g = serial();
    let ns = match Netns::create("brf", [10, 78, 6]) {
        Ok(ns) => ns,
        Err(e) => {
            eprintln!("skipping: network namespaces unavailable here ({e})");
            return;
        }
    };
    let ride = |mut c: link::Config| {
        c.idle_timeout = Duration::from_millis(500);
        c.ride_through = Duration::from_secs(10);
        c
    };
    let mut g = gpu_options(SocketAddr::from((ns.addr_a(), 0)));
    g.link = ride(g.link);
    let gpu = GpuBox::start_in(g, Some(ns.a.clone()));
    let (b, addr) = (ns.b.clone(), gpu.addr);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (stop2, runs2) = (stop.clone(), runs.clone());
    let host = std::thread::spawn(move || {
        netns::enter(&b).unwrap();
        let mut h = host_options(addr, key_a());
        h.link = ride(h.link);
        let mut d = SimGpuDriver::open(RemoteDevice::attach(h).unwrap()).unwrap();
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            if let Err(e) = run(&mut d, WorkloadSize::scaled(1), &mut |_| {}) {
                return Err(format!("run {}: {e}", runs2.load(std::sync::atomic::Ordering::Relaxed)));
            }
            runs2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(d.into_pci())
    });
    let wait_runs = |n: u32| {
        let end = Instant::now() + Duration::from_secs(60);
        while runs.load(std::sync::atomic::Ordering::Relaxed) < n && !host.is_finished() {
            assert!(Instant::now() < end, "no workload finished in 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_runs(1);
    let before = runs.load(std::sync::atomic::Ordering::Relaxed);
    // The host's end of the veth (`Netns::create` names it v<tag>b).
    let set = |state: &str| {
        let st = std::process::Command::new("ip")
            .args(["-n", &ns.b, "link", "set", "vbrfb", state])
            .status()
            .unwrap();
        assert!(st.success(), "ip link set {state}");
    };
    set("down");
    std::thread::sleep(Duration::from_secs(3));
    set("up");
    wait_runs(before + 2);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let remote = host.join().unwrap().unwrap_or_else(|e| panic!("a workload failed across the outage: {e}"));
    assert!(remote.removed().is_none(), "{:?}", remote.removed());
    let s = remote.stats();
    assert!(s.link_silences >= 1, "the host never saw the link silent: {s:?}");
    assert_eq!(s.completion_timeouts, 0, "{s:?}");
    let stats = gpu.stop();
    assert_eq!(stats.exports[0].1.attaches, 1, "the host attached again: {stats:?}");
    assert!(stats.sessions_silent >= 1, "the box never saw the link silent: {stats:?}");
}
