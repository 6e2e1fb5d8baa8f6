//! Bulk DMA through both endpoints over UDP loopback at MTU 9000 (issue 17): a GiB each way
//! on a clean link, checked byte for byte; 256 MiB each way at 1 % loss with reordering;
//! Max_Payload_Size and Max_Read_Request_Size of 4096 bytes negotiated, used and never
//! exceeded on the wire (the dispatchers on both sides record the largest TLP they saw).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use bridge_host::{AttachOptions, RemoteDevice};
use driver::{DmaBuf, PciFunction, SimGpuDriver, WaitMode};
use dxpu_tests::{GpuBox, gpu_options, host_options, key_a, serial};
use hw::simgpu::SimGpuParams;
use link::driver::Impairment;
use simgpu_abi::op;

/// Bytes a chunk of the pattern is written, cleared and checked in.
const CHUNK: usize = 16 << 20;

/// The pattern's bytes at `offset..offset + out.len()` (8-aligned): a word per 8 bytes,
/// different for every word of the first 2^61, so a byte landing in the wrong place shows.
fn pattern(offset: usize, seed: u64, out: &mut [u8]) {
    for (i, w) in out.chunks_exact_mut(8).enumerate() {
        let n = (offset / 8 + i) as u64;
        w.copy_from_slice(&(n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed).to_le_bytes());
    }
}

/// The PCI Express capability's Device Control: (Max_Payload_Size, Max_Read_Request_Size)
/// in bytes, as the host's view of the device reports them.
fn payload_sizes(d: &mut impl PciFunction) -> (u32, u32) {
    let mut at = d.config_read(0x34) as u16 & 0xfc;
    for _ in 0..48 {
        if at == 0 {
            break;
        }
        let header = d.config_read(at);
        if header & 0xff == 0x10 {
            let control = d.config_read(at + 8) & 0xffff;
            return (128 << ((control >> 5) & 7), 128 << ((control >> 12) & 7));
        }
        at = (header >> 8) as u16 & 0xfc;
    }
    panic!("no PCI Express capability");
}

struct Bulk {
    gpu: GpuBox,
    d: SimGpuDriver<RemoteDevice>,
    buf: DmaBuf,
}

fn attach(bytes: usize, impairment: Impairment) -> Bulk {
    attach_with(bytes, impairment, |_| {})
}

fn attach_with(bytes: usize, impairment: Impairment, host: impl FnOnce(&mut AttachOptions)) -> Bulk {
    let mut g = gpu_options("127.0.0.1:0".parse().unwrap());
    g.link.mtu = 9000;
    g.link.size_for_path(link::DEFAULT_PATH_BANDWIDTH, link::DEFAULT_PATH_RTT);
    g.impairment = Impairment { seed: impairment.seed ^ 1, ..impairment };
    g.exports[0].device =
        bridge_gpu::DeviceSpec::Sim(SimGpuParams { vram_bytes: bytes as u64, ..SimGpuParams::default() });
    let gpu = GpuBox::start(g);
    let mut h = host_options(gpu.addr, key_a());
    h.link.mtu = 9000;
    h.link.size_for_path(link::DEFAULT_PATH_BANDWIDTH, link::DEFAULT_PATH_RTT);
    h.impairment = impairment;
    h.dma_memory = bytes + (1 << 20);
    h.completion_timeout = Duration::from_secs(2);
    host(&mut h);
    let remote = RemoteDevice::attach(h).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    d.set_timeout(Duration::from_secs(300));
    let buf = d.pci().dma_alloc(bytes).unwrap();
    Bulk { gpu, d, buf }
}

/// Copies the pattern host→VRAM and back through the bridges and checks every byte that
/// came back, and a sample of VRAM read through BAR2 in between. Returns the seconds each
/// way.
fn round_trip(b: &mut Bulk, seed: u64) -> (f64, f64) {
    let (bus, len) = (b.buf.bus.get(), b.buf.len);
    let mut chunk = vec![0u8; CHUNK];
    for off in (0..len).step_by(CHUNK) {
        let n = CHUNK.min(len - off);
        pattern(off, seed, &mut chunk[..n]);
        b.d.pci().dma_write(&b.buf, off, &chunk[..n]);
    }
    let t = Instant::now();
    if let Err(e) = b.d.launch(op::COPY_H2V, [bus, 0, len as u64, 0, 0], WaitMode::Poll) {
        panic!("after {:?}: {e}; {:?}", t.elapsed(), b.d.pci().stats());
    }
    let h2d = t.elapsed().as_secs_f64();
    // VRAM holds the pattern: 64 words read through BAR2, spread over the whole copy.
    let bar2 = b.d.vram_bar();
    for k in 0..64u64 {
        let at = (k * 0x0100_0f38 % len as u64) & !7;
        let mut want = [0u8; 8];
        pattern(at as usize, seed, &mut want);
        let got = b.d.pci().mmio_read(bar2 + at, 8);
        assert_eq!(got, u64::from_le_bytes(want), "VRAM at {at:#x} after the copy in");
    }
    chunk.fill(0);
    for off in (0..len).step_by(CHUNK) {
        b.d.pci().dma_write(&b.buf, off, &chunk[..CHUNK.min(len - off)]);
    }
    let t = Instant::now();
    b.d.launch(op::COPY_V2H, [0, bus, len as u64, 0, 0], WaitMode::Poll).unwrap();
    let d2h = t.elapsed().as_secs_f64();
    let mut want = vec![0u8; CHUNK];
    for off in (0..len).step_by(CHUNK) {
        let n = CHUNK.min(len - off);
        b.d.pci().dma_read(&b.buf, off, &mut chunk[..n]);
        pattern(off, seed, &mut want[..n]);
        if chunk[..n] != want[..n] {
            let i = (0..n).find(|&i| chunk[i] != want[i]).unwrap_or(0);
            panic!("the copy back differs first at byte {:#x}", off + i);
        }
    }
    (h2d, d2h)
}

/// Ends the attachment and checks what both ends saw of the TLP sizes against what was
/// negotiated: 4 KiB each way, and never more.
fn finish_and_check_sizes(mut b: Bulk) -> bridge_host::HostStats {
    let (mps, mrrs) = payload_sizes(b.d.pci());
    assert_eq!((mps, mrrs), (4096, 4096), "Max_Payload_Size and Max_Read_Request_Size at MTU 9000");
    assert!(b.d.pci().removed().is_none(), "{:?}", b.d.pci().removed());
    let s = b.d.pci().stats();
    drop(b.d);
    let gpu = b.gpu.stop();
    assert_eq!(s.largest_payload_received, mps, "the device's writes used Max_Payload_Size, no more");
    assert_eq!(s.largest_read_request_received, mrrs, "its reads used Max_Read_Request_Size, no more");
    assert_eq!(gpu.largest_payload_received, mps, "the host's completions carried Max_Payload_Size, no more");
    assert_eq!(gpu.exports[0].1.too_large, 0, "{:?}", gpu.exports[0].1);
    assert_eq!((s.completion_timeouts, s.malformed_tlps, gpu.malformed_tlps), (0, 0, 0), "{s:?}");
    s
}

#[test]
fn a_gibibyte_each_way_through_the_bridges_arrives_byte_for_byte_in_4_kib_tlps() {
    let _g = serial();
    let bytes = 1 << 30;
    let mut b = attach(bytes, Impairment::default());
    let (h2d, d2h) = round_trip(&mut b, 0x5eed);
    eprintln!(
        "1 GiB host→device {:.0} MB/s, device→host {:.0} MB/s (this build's, not a benchmark)",
        bytes as f64 / h2d / 1e6,
        bytes as f64 / d2h / 1e6
    );
    finish_and_check_sizes(b);
}

#[test]
fn a_quarter_gibibyte_each_way_at_1_percent_loss_with_reordering_arrives_byte_for_byte() {
    let _g = serial();
    let lossy =
        Impairment { loss: 0.01, jitter: Duration::from_micros(100), seed: 17, ..Impairment::default() };
    let mut b = attach(256 << 20, lossy);
    round_trip(&mut b, 0xface);
    let s = finish_and_check_sizes(b);
    assert!(s.link.retransmits > 0, "1 % loss replayed nothing: {:?}", s.link);
}

/// A host endpoint on a thread with work of its own answers the device's reads in slices
/// (`AttachOptions::answer_slice`) and serves it in the time its caller lends
/// (`PciFunction::serve_for`): bytes arrive whole and in place whatever the slice — here one
/// read per pass, the rest left queued — and a loan on an idle link ends early.
#[test]
fn a_host_endpoint_answering_in_slices_and_in_lent_time_moves_copies_byte_for_byte() {
    let _g = serial();
    let bytes = 32 << 20;
    let mut b = attach_with(bytes, Impairment::default(), |h| {
        h.answer_slice = Some(Duration::from_nanos(1));
        h.service_interval = None;
    });
    // Waits that poll the fence: each look answers one read.
    round_trip(&mut b, 0x511ce);
    // Nothing but loans: the copy in moves only while the caller lends its time.
    let mut chunk = vec![0u8; CHUNK];
    for off in (0..bytes).step_by(CHUNK) {
        pattern(off, 0x1e4d, &mut chunk);
        b.d.pci().dma_write(&b.buf, off, &chunk);
    }
    let read_before = b.d.pci().stats().dma_read_bytes;
    b.d.enqueue(driver::Command { opcode: op::COPY_H2V, args: [b.buf.bus.get(), 0, bytes as u64, 0, 0] })
        .unwrap();
    let fence = b.d.fence(WaitMode::Poll).unwrap();
    let (t, mut loans) = (Instant::now(), 0);
    while b.d.pci().stats().dma_read_bytes - read_before < bytes as u64 {
        assert!(t.elapsed() < Duration::from_secs(60), "{:?}", b.d.pci().stats());
        b.d.pci().serve_for(Duration::from_micros(200));
        loans += 1;
    }
    assert!(loans > 1, "a loan of 200 µs answered all {bytes} bytes");
    b.d.wait(fence, WaitMode::Poll).unwrap();
    let bar2 = b.d.vram_bar();
    for k in 0..64u64 {
        let at = (k * 0x0010_0f38 % bytes as u64) & !7;
        let mut want = [0u8; 8];
        pattern(at as usize, 0x1e4d, &mut want);
        let got = b.d.pci().mmio_read(bar2 + at, 8);
        assert_eq!(got, u64::from_le_bytes(want), "VRAM at {at:#x} after the copy in");
    }
    // Idle: a loan of a second comes back as soon as a pass finds nothing to do.
    let mut idle = Duration::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        b.d.pci().serve_for(Duration::from_secs(1));
        idle = idle.min(t.elapsed());
    }
    assert!(idle < Duration::from_millis(100), "an idle loan took {idle:?}");
    finish_and_check_sizes(b);
}
