//! Both endpoints over real UDP on loopback: the simgpu driver's whole suite through the
//! bridges, the demo workload, DMA outside the granted windows, wrong keys and second hosts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bridge_host::{AttachError, RemoteDevice};
use driver::{DriverError, PciFunction, SimGpuDriver, WaitMode};
use dxpu_tests::{GpuBox, gpu_options, host_options, key_a, key_b, serial};
use hw::simgpu_device::{err, op};
use link::PresharedKey;

fn local() -> std::net::SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

#[test]
fn driver_suite_passes_through_the_bridges() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let mut failed = Vec::new();
    for c in testbed::suite::checks() {
        let remote = RemoteDevice::attach(host_options(gpu.addr, key_a())).unwrap();
        let mut d = SimGpuDriver::open(remote).unwrap();
        if let Err(e) = (c.run)(&mut d) {
            failed.push(format!("{}: {e}", c.name));
        }
        let s = d.pci().stats();
        assert!(d.pci().removed().is_none(), "{}: removed: {:?}", c.name, d.pci().removed());
        assert_eq!(s.completion_timeouts, 0);
    }
    assert!(failed.is_empty(), "{failed:#?}");
    let stats = gpu.stop();
    let (_, e) = &stats.exports[0];
    // Each check attached, then detached: the device was reset for the next.
    assert_eq!(e.attaches, testbed::suite::checks::<RemoteDevice>().len() as u64);
    assert_eq!(e.resets, e.attaches);
}

#[test]
fn demo_workload_through_the_bridges_is_verified() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let remote = RemoteDevice::attach(host_options(gpu.addr, key_a())).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    let r = testbed::workload::run(&mut d, testbed::workload::WorkloadSize::scaled(1), &mut |_| {}).unwrap();
    assert!(r.steps.len() > 10);
    let s = d.pci().stats();
    for kind in ["MRd64", "MWr64", "CfgRd0", "CfgWr0"] {
        assert!(s.tlps_sent.get(kind).copied().unwrap_or(0) > 0, "sent no {kind}: {:?}", s.tlps_sent);
    }
    for kind in ["CplD", "Cpl", "MRd64", "MWr64"] {
        assert!(
            s.tlps_received.get(kind).copied().unwrap_or(0) > 0,
            "received no {kind}: {:?}",
            s.tlps_received
        );
    }
    assert!(s.interrupts >= 16, "interrupts: {}", s.interrupts);
    assert_eq!(s.dma_read_refused + s.dma_write_dropped, 0);
}

#[test]
fn dma_outside_every_granted_window_is_refused_and_host_memory_untouched() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let remote = RemoteDevice::attach(host_options(gpu.addr, key_a())).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    // A buffer the host did grant, to see that nothing lands in it.
    let buf = d.pci().dma_alloc(4096).unwrap();
    d.pci().dma_write(&buf, 0, &[0x5a; 4096]);
    d.memcpy_to_device(0, &[0xa5; 4096]).unwrap();
    // Read from an address no window covers: UR, reported as a DMA error by the device.
    let outside = bridge_host::DMA_ARENA_BASE + (1 << 36);
    assert_eq!(
        d.launch(op::COPY_H2V, [outside, 0x1000, 4096, 0, 0], WaitMode::Poll),
        Err(DriverError::Device { code: err::DMA })
    );
    // Write to one: dropped.
    let _ = d.launch(op::COPY_V2H, [0, outside, 4096, 0, 0], WaitMode::Poll);
    // Just below the arena: dropped too.
    let _ = d.launch(op::COPY_V2H, [0, bridge_host::DMA_ARENA_BASE - 64, 64, 0, 0], WaitMode::Poll);
    let s = d.pci().stats();
    assert!(s.dma_read_refused >= 1, "{s:?}");
    assert!(s.dma_write_dropped >= 2, "{s:?}");
    let mut back = vec![0u8; 4096];
    d.pci().dma_read(&buf, 0, &mut back);
    assert!(back.iter().all(|b| *b == 0x5a), "host memory changed");
    // And the device still works.
    d.launch(op::NOP, [0; 5], WaitMode::Interrupt).unwrap();
}

#[test]
fn a_wrong_key_and_a_second_host_are_refused() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let stranger = PresharedKey::new(b"nobody gave the box this key....").unwrap();
    match RemoteDevice::attach(host_options(gpu.addr, stranger)) {
        Err(AttachError::Link { reason, .. }) => assert!(reason.contains("authentication"), "{reason}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a wrong key attached"),
    }
    let first = RemoteDevice::attach(host_options(gpu.addr, key_a())).unwrap();
    let t = std::time::Instant::now();
    match RemoteDevice::attach(host_options(gpu.addr, key_b())) {
        Err(AttachError::Refused { reason, .. }) => assert!(reason.contains("host-a"), "{reason}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a second host attached an owned device"),
    }
    // Refused over a live session: the host closes it at once (it was left to time out).
    assert!(t.elapsed() < std::time::Duration::from_millis(200), "refused after {:?}", t.elapsed());
    let mut other = host_options(gpu.addr, key_b());
    other.device = "gpu7".into();
    match RemoteDevice::attach(other) {
        Err(AttachError::Refused { reason, .. }) => assert!(reason.contains("gpu0"), "{reason}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("attached a device that does not exist"),
    }
    // Once the first host detaches, the second gets the device.
    first.detach();
    let second = RemoteDevice::attach(host_options(gpu.addr, key_b())).unwrap();
    let mut d = SimGpuDriver::open(second).unwrap();
    d.launch(op::NOP, [0; 5], WaitMode::Poll).unwrap();
    drop(d);
    // Both refused attaches and the detach closed their sessions (the last drop's CLOSE may
    // still be on its way when the box stops); before, refused sessions were left to time out.
    let stats = gpu.stop();
    assert!(stats.sessions_closed_by_hosts >= 3, "{stats:?}");
}

#[test]
fn host_initiated_function_level_reset_leaves_a_usable_device() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let remote = RemoteDevice::attach(host_options(gpu.addr, key_a())).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    d.memcpy_to_device(0, &[0x3c; 4096]).unwrap();
    let mut remote = d.into_pci();
    // Find the PCI Express capability and set Initiate Function Level Reset (Device Control
    // bit 15, PCIe 6.0 §7.5.3.4).
    let mut at = (remote.config_read(0x34) & 0xfc) as u16;
    while remote.config_read(at) & 0xff != 0x10 {
        at = ((remote.config_read(at) >> 8) & 0xfc) as u16;
        assert_ne!(at, 0, "no PCI Express capability");
    }
    let ctl = remote.config_read(at + 8);
    remote.config_write(at + 8, ctl | 1 << 15);
    // The reset cleared Memory Space Enable and the device's state; the box put the BARs
    // back, so a driver opening it again finds a clean, working device.
    assert_eq!(remote.config_read(0x04) & 0x6, 0, "Command register not reset");
    let mut d = SimGpuDriver::open(remote).unwrap();
    let mut back = vec![0u8; 4096];
    d.memcpy_from_device(0, &mut back).unwrap();
    assert!(back.iter().all(|b| *b == 0), "VRAM survived the reset");
    d.launch(op::NOP, [0; 5], WaitMode::Interrupt).unwrap();
    assert!(d.pci().removed().is_none());
}

#[test]
fn max_payload_size_is_lowered_to_what_a_link_frame_carries() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let mut h = host_options(gpu.addr, key_a());
    // A 600-byte MTU carries 256-byte payloads, not the 512 the driver asks the device for.
    h.link.mtu = 600;
    let remote = RemoteDevice::attach(h).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 13) as u8).collect();
    d.memcpy_to_device(0x1000, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    d.memcpy_from_device(0x1000, &mut back).unwrap();
    assert_eq!(back, data);
    drop(d);
    let stats = gpu.stop();
    assert_eq!(
        stats.exports[0].1.too_large, 0,
        "device TLPs too large for the link: {:?}",
        stats.exports[0].1
    );
}

/// A long copy to the host goes out in steps the link paces, so a register read made while
/// it runs — the driver's fence wait asks for ERROR at once — is answered behind at most a
/// step and the session's queue, not behind the whole copy: with a completion timeout far
/// shorter than the copy, nothing times out.
#[test]
fn a_register_read_during_a_long_copy_to_the_host_is_answered_in_time() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let mut o = host_options(gpu.addr, key_a());
    o.completion_timeout = std::time::Duration::from_millis(50);
    o.dma_memory = 160 << 20;
    let remote = RemoteDevice::attach(o).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    let n = 64 << 20;
    let data = testbed::suite::pattern(n, 5);
    d.memcpy_to_device(0, &data).unwrap();
    let mut back = vec![0u8; n];
    let t = std::time::Instant::now();
    let r = d.memcpy_from_device(0, &mut back);
    eprintln!("64 MiB to the host in {:?}", t.elapsed());
    assert!(d.pci().removed().is_none(), "removed: {:?}", d.pci().removed());
    assert_eq!(d.pci().stats().completion_timeouts, 0);
    r.unwrap();
    assert!(back == data, "the copy came back different");
}

/// Register reads back to back, each behind a posted write of the register it reads: a
/// read returns as soon as its completion is in (the host leaves its link's events, timers
/// and acknowledgement to the next pump or send, the box sends its answer before its own),
/// yet every read sees the write before it and nothing is lost, replayed or timed out.
/// The host's replay timeout is raised from 2 ms to its 200 ms ceiling: a shared CI machine
/// stalls a thread for 2 ms now and then (CI saw two such replays in 4,000 frames, RTTs of
/// 2–4 ms), and a replay here must mean a frame left unacknowledged, not a late scheduler.
#[test]
fn register_reads_back_to_back_see_the_writes_before_them_and_replay_nothing() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let mut o = host_options(gpu.addr, key_a());
    o.link.replay_timeout = o.link.max_replay_timeout;
    // Nor a tail-loss probe (four least round trips): it is what a late scheduler sets off.
    o.link.tail_loss_probe = false;
    let mut d = SimGpuDriver::open(RemoteDevice::attach(o).unwrap()).unwrap();
    let remote = d.pci();
    let before = remote.stats();
    for i in 1..=2000u64 {
        remote.bar_write(0, simgpu_abi::reg::RING_BASE, &(i * 64).to_le_bytes()).unwrap();
        let mut v = [0u8; 8];
        remote.bar_read(0, simgpu_abi::reg::RING_BASE, &mut v).unwrap();
        assert_eq!(u64::from_le_bytes(v), i * 64, "read {i}");
    }
    let s = remote.stats();
    assert!(remote.removed().is_none(), "{:?}", remote.removed());
    assert_eq!(s.completion_timeouts + s.failed_requests, 0, "{s:?}");
    assert_eq!(s.link.retransmits - before.link.retransmits, 0, "{:?}", s.link);
    assert_eq!(s.link.dropped_bad_mac + s.link.dropped_out_of_window, 0, "{:?}", s.link);
    assert_eq!(
        s.mmio_reads.buckets.iter().sum::<u64>() - before.mmio_reads.buckets.iter().sum::<u64>(),
        2000
    );
}

/// The simgpu computes a long MATMUL in bands and the box serves its links between them (a
/// pass lets a device work about 1 ms): a register read made while the kernel runs is
/// answered long before the kernel ends — it reads the ring head not yet past the kernel.
/// Before, the read waited for the whole kernel. (In this debug build a band takes ≈ 18 ms,
/// longer than the replay timeout; in a release build ≈ 0.8 ms, and `loopback` counts no
/// replays where it counted 15 a run.)
#[test]
fn a_register_read_during_a_long_kernel_is_answered_between_its_bands() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let mut o = host_options(gpu.addr, key_a());
    o.completion_timeout = std::time::Duration::from_secs(5);
    let mut d = SimGpuDriver::open(RemoteDevice::attach(o).unwrap()).unwrap();
    // C(256×256) = A·B, A at 0, B at 256 KiB, C at 512 KiB.
    let dims = 256 | 256 << 16 | 256 << 32;
    let matmul = driver::Command { opcode: op::MATMUL, args: [0, 256 << 10, 512 << 10, dims, 0] };
    let t = std::time::Instant::now();
    d.launch(matmul.opcode, matmul.args, WaitMode::Poll).unwrap();
    let kernel = t.elapsed();
    let head = d.read_reg(simgpu_abi::reg::RING_HEAD);
    d.submit(matmul).unwrap();
    // Well into the kernel: the device has fetched it (one round trip) and computes.
    std::thread::sleep(kernel / 4);
    let t = std::time::Instant::now();
    let during = d.read_reg(simgpu_abi::reg::RING_HEAD);
    let read = t.elapsed();
    d.sync(WaitMode::Poll).unwrap();
    eprintln!("kernel {kernel:?}, a register read during it {read:?}");
    assert_eq!(during, head, "the read was not made during the kernel");
    assert!(read < kernel / 4, "a read during a {kernel:?} kernel took {read:?}");
}

/// The host asks for encrypted frames, the box does not: the session encrypts both ways (the
/// stronger ask wins; a box that did not encrypt would fail every tag the host checks), the
/// host updates its sending key every 64 frames, and the workload is verified.
#[test]
fn an_encrypted_link_updating_its_keys_carries_the_workload() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let mut h = host_options(gpu.addr, key_a());
    h.link.encrypt_frames = true;
    h.link.key_update_frames = 64;
    // An update waits for the peer to confirm the last one: with fewer frames in flight
    // (the session uses the smaller window) they come closer together.
    h.link.window = 128;
    let remote = RemoteDevice::attach(h).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    testbed::workload::run(&mut d, testbed::workload::WorkloadSize::scaled(1), &mut |_| {}).unwrap();
    assert!(d.pci().removed().is_none());
    let s = d.pci().stats().link;
    assert!(s.key_updates > 10, "{s:?}");
    assert_eq!(s.dropped_bad_mac, 0, "{s:?}");
}

/// A caller that keeps entering the device without driving the link — writing host memory
/// every few milliseconds for three idle timeouts — keeps it: the service thread pumps when
/// nobody has for its interval, however often the caller enters (it used to stand aside
/// whenever the caller had entered within the interval, and the box timed the host out).
#[test]
fn a_caller_that_only_writes_host_memory_keeps_its_link() {
    let _g = serial();
    let gpu = GpuBox::start(gpu_options(local()));
    let remote = RemoteDevice::attach(host_options(gpu.addr, key_a())).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    let buf = d.pci().dma_alloc(4096).unwrap();
    let until = std::time::Instant::now() + 3 * dxpu_tests::test_link(key_a()).idle_timeout;
    while std::time::Instant::now() < until {
        d.pci().dma_write(&buf, 0, &[0x5a; 64]);
        std::thread::sleep(std::time::Duration::from_millis(3));
    }
    assert!(d.pci().removed().is_none(), "{:?}", d.pci().removed());
    d.launch(op::NOP, [0; 5], WaitMode::Poll).unwrap();
}

/// What the host endpoint counted on the wire over one run, as a profile's counts: register
/// reads and writes are the memory requests it sent, the device's reads and writes of host
/// memory the ones it served.
fn wire_counts(before: &bridge_host::HostStats, after: &bridge_host::HostStats) -> [u64; 7] {
    let sent = |s: &bridge_host::HostStats, kinds: &[&str]| -> u64 {
        kinds.iter().map(|k| s.tlps_sent.get(k).copied().unwrap_or(0)).sum()
    };
    let (reads, writes) = (["MRd32", "MRd64"], ["MWr32", "MWr64"]);
    [
        sent(after, &reads) - sent(before, &reads),
        sent(after, &writes) - sent(before, &writes),
        after.dma_reads - before.dma_reads,
        after.dma_read_bytes - before.dma_read_bytes,
        after.dma_writes - before.dma_writes,
        after.dma_write_bytes - before.dma_write_bytes,
        after.interrupts - before.interrupts,
    ]
}

#[test]
fn every_workload_is_verified_through_the_bridges_and_its_profile_is_what_the_wire_carried() {
    let _g = serial();
    // A link that carries 4 KiB payloads, so that the device's reads and writes are split
    // through the bridges as on the direct platform (Max_Payload_Size 4096).
    let mut link_cfg = dxpu_tests::test_link(key_a());
    link_cfg.mtu = 9000;
    let mut go = gpu_options(local());
    go.link = link_cfg.clone();
    let gpu = GpuBox::start(go);
    for name in testbed::workload::Workload::NAMES {
        let w = testbed::workload::Workload::named(name, 1).unwrap();
        let mut o = host_options(gpu.addr, key_a());
        o.link = link_cfg.clone();
        let mut d = SimGpuDriver::open(RemoteDevice::attach(o).unwrap()).unwrap();
        assert_eq!(d.pci().payload_sizes().1, 4096);
        // Warmed once, as the direct driver below, so that both run with their buffers.
        w.run(&mut d, &mut |_| {}).unwrap_or_else(|e| panic!("{name} bridged: {e}"));
        let before = d.pci().stats();
        w.run(&mut d, &mut |_| {}).unwrap_or_else(|e| panic!("{name} bridged: {e}"));
        let wire = wire_counts(&before, &d.pci().stats());
        d.into_pci().detach();

        let dev = hw::SimGpu::new(tlp::Bdf::new(1, 0, 0), Default::default());
        let mut direct = SimGpuDriver::open(testbed::direct::DirectAttach::new(dev, 128 << 20)).unwrap();
        w.run(&mut direct, &mut |_| {}).unwrap();
        let c0 = direct.pci().counts();
        w.run(&mut direct, &mut |_| {}).unwrap_or_else(|e| panic!("{name} direct: {e}"));
        let c = direct.pci().counts().since(&c0);
        let counted = [
            c.register_reads,
            c.register_writes,
            c.device_reads,
            c.device_read_bytes,
            c.device_writes,
            c.device_write_bytes,
            c.interrupts,
        ];
        // The device fetches what is queued when it looks: where the host queues the next
        // command while the device still runs (data-loading's double buffering), one fetch
        // may take two commands bridged and two fetches directly — the same bytes in one read
        // fewer (1029 of 1030 reads, one run in three); at most one fewer per doorbell (a
        // register write). Every other count is exact.
        let (mut wire_exact, mut counted_exact) = (wire, counted);
        (wire_exact[2], counted_exact[2]) = (0, 0);
        assert_eq!(
            wire_exact, counted_exact,
            "{name}: [register reads, register writes, -, bytes, device writes, bytes, interrupts]"
        );
        assert!(
            wire[2] <= counted[2] && counted[2] - wire[2] <= c.register_writes,
            "{name}: device reads {} bridged, {} direct",
            wire[2],
            counted[2]
        );
        assert!(c.device_read_bytes > 0 && c.register_writes > 0, "{name}: {c:?}");
    }
}

/// The threads of this process named `name`: their IDs.
fn threads_named(name: &str) -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| std::fs::read_to_string(p.join("comm")).unwrap_or_default().trim() == name)
        .collect()
}

/// CPU seconds the thread at `task` (/proc/self/task/TID) has run.
fn thread_cpu_s(task: &std::path::Path) -> f64 {
    // utime and stime, the 14th and 15th fields, after the name in parentheses.
    let stat = std::fs::read_to_string(task.join("stat")).unwrap_or_default();
    let f: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// A busy-polling box spins its budget after TLPs, not after each keepalive or timer: on an
/// idle link (keepalives every 50 ms each way) it sleeps. It spun 2 ms after every wake
/// (4-5 % of a CPU idle), on a CPU a spinning thread beside it needed.
#[test]
fn an_idle_busy_polling_box_sleeps_between_keepalives() {
    let _g = serial();
    let mut o = gpu_options(local());
    // A budget long beside a wake's own work, so that spinning it after each wake (40-80
    // wakes in 2 s: 0.8-1.6 s of CPU) stands far from the work itself (20-120 ms here,
    // the most on a machine its other tenants loaded: a debug build's passes per wake).
    o.poll = link::driver::PollMode::Busy { spin: std::time::Duration::from_millis(20) };
    let others = threads_named("dxpu-test-gpu");
    let gpu = GpuBox::start(o);
    // This box's thread, not another test's still winding down.
    let task =
        threads_named("dxpu-test-gpu").into_iter().find(|t| !others.contains(t)).expect("the box's thread");
    let remote = RemoteDevice::attach(host_options(gpu.addr, key_a())).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    d.launch(op::NOP, [0; 5], WaitMode::Poll).unwrap();
    let before = thread_cpu_s(&task);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let idle = thread_cpu_s(&task) - before;
    // Spinning 20 ms after each of its 40-80 wakes would be 0.8 s at least.
    assert!(idle < 0.4, "the idle box ran {idle:.3} s of CPU in 2 s");
    // And TLPs still find it: the link is up and answers at once.
    d.launch(op::NOP, [0; 5], WaitMode::Poll).unwrap();
    assert!(d.pci().removed().is_none());
}

/// An attach to a port nothing listens on says so — its machine answers ICMP port
/// unreachable — and differs from one to a box that never answers (a port whose datagrams
/// vanish: here one held open by a socket that never reads), which says nothing came back.
#[test]
fn an_attach_to_a_closed_port_says_nothing_listens_and_a_silent_box_says_nothing_came_back() {
    let _g = serial();
    let closed = std::net::SocketAddr::from(([127, 0, 0, 1], dxpu_tests::free_udp_port()));
    let mut o = host_options(closed, key_a());
    o.attach_timeout = std::time::Duration::from_millis(500);
    let e = RemoteDevice::attach(o).err().expect("nothing to attach to").to_string();
    // As docs/troubleshooting.md quotes it.
    let quoted =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/troubleshooting.md")).unwrap();
    let said = e.replace(&closed.to_string(), "10.0.0.7:7440");
    assert!(quoted.contains(&format!("`{said}`")), "docs/troubleshooting.md does not quote: {said}");
    assert!(e.contains("nothing listens on") && e.contains("port unreachable"), "{e}");
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut o = host_options(silent.local_addr().unwrap(), key_a());
    o.attach_timeout = std::time::Duration::from_millis(500);
    let e = RemoteDevice::attach(o).err().expect("a box that never answers").to_string();
    assert!(e.contains("nothing came back") && !e.contains("port unreachable"), "{e}");
}

/// Where the link's own handshake timeout ends the session before the attach's time is up
/// (a handshake_timeout shorter than attach_timeout, as with the defaults' 5 s each and a
/// slow start), the attach still says why from what came back, not that a handshake timed out.
#[test]
fn a_handshake_that_times_out_first_still_says_nothing_listens_or_nothing_came_back() {
    let _g = serial();
    let closed = std::net::SocketAddr::from(([127, 0, 0, 1], dxpu_tests::free_udp_port()));
    let mut o = host_options(closed, key_a());
    o.link.handshake_timeout = std::time::Duration::from_millis(300);
    o.link.handshake_retry = std::time::Duration::from_millis(100);
    o.attach_timeout = std::time::Duration::from_secs(3);
    let e = RemoteDevice::attach(o).err().expect("nothing to attach to").to_string();
    assert!(e.contains("nothing listens on") && e.contains("port unreachable"), "{e}");
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut o = host_options(silent.local_addr().unwrap(), key_a());
    o.link.handshake_timeout = std::time::Duration::from_millis(300);
    o.link.handshake_retry = std::time::Duration::from_millis(100);
    o.attach_timeout = std::time::Duration::from_secs(3);
    let e = RemoteDevice::attach(o).err().expect("a box that never answers").to_string();
    assert!(e.contains("no handshake within 300ms: nothing came back"), "{e}");
}
