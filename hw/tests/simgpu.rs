//! The simgpu through its driver on a directly attached device: every command checked
//! against a CPU reference, fences by polling and by interrupt, error paths (bad opcode,
//! DMA to memory the host did not provide → UR), reset mid-work, sparse VRAM.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use hw::direct::{DirectAttach, HOST_MEMORY_BASE};
use hw::driver::{DriverError, SimGpuDriver, WaitMode};
use hw::simgpu::SimGpuParams;
use hw::simgpu_device::{err, op, reg};
use hw::{Device, SimGpu};
use tlp::Bdf;

fn open_with(p: SimGpuParams) -> SimGpuDriver<DirectAttach<SimGpu>> {
    let dev = SimGpu::new(Bdf::new(1, 0, 0), p);
    SimGpuDriver::open(DirectAttach::new(dev, 64 << 20)).unwrap()
}

fn open() -> SimGpuDriver<DirectAttach<SimGpu>> {
    open_with(SimGpuParams::default())
}

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) as u8).collect()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read_f32s(d: &mut SimGpuDriver<DirectAttach<SimGpu>>, vram: u64, n: usize) -> Vec<f32> {
    let mut b = vec![0u8; n * 4];
    d.memcpy_from_device(vram, &mut b).unwrap();
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn opens_and_sizes_the_bars() {
    let mut d = open();
    assert_eq!(d.vram_size(), 256 << 20);
    assert_eq!(d.read_reg(reg::ID) & 0xffff_ffff, 0x474d_4953);
    assert_eq!(d.read_reg(reg::VRAM_SIZE), 256 << 20);
    assert_eq!(d.read_reg(reg::ERROR), 0);
}

#[test]
fn copies_both_ways_any_size_and_alignment() {
    let mut d = open();
    for (vram, len) in
        [(0u64, 1usize), (3, 7), (4096 - 5, 10), (0x10000, 4096), (0x20003, 100_003), (0x100000, 1 << 20)]
    {
        let data = pattern(len, vram as u32);
        d.memcpy_to_device(vram, &data).unwrap();
        let mut back = vec![0u8; len];
        d.memcpy_from_device(vram, &mut back).unwrap();
        assert_eq!(back, data, "copy of {len} bytes at VRAM {vram:#x}");
    }
    // A large host→VRAM copy keeps several reads (tags) in flight, split at MRRS.
    assert!(
        d.pci().device().max_reads_in_flight > 1,
        "reads in flight: {}",
        d.pci().device().max_reads_in_flight
    );
}

#[test]
fn vram_to_vram_and_fill() {
    let mut d = open();
    let data = pattern(10_000, 9);
    d.memcpy_to_device(0x1000, &data).unwrap();
    d.launch(op::COPY_V2V, [0x1000, 0x9_0002, 10_000, 0, 0], WaitMode::Poll).unwrap();
    let mut back = vec![0u8; 10_000];
    d.memcpy_from_device(0x9_0002, &mut back).unwrap();
    assert_eq!(back, data);
    d.launch(op::FILL, [0x5000, 10, 0xa1b2_c3d4, 0, 0], WaitMode::Poll).unwrap();
    let mut f = vec![0u8; 12];
    d.memcpy_from_device(0x5000, &mut f).unwrap();
    assert_eq!(f, [0xd4, 0xc3, 0xb2, 0xa1, 0xd4, 0xc3, 0xb2, 0xa1, 0xd4, 0xc3, 0, 0]);
}

#[test]
fn kernels_match_the_cpu() {
    let mut d = open();
    let n = 1000;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 17) as f32 * 1.25).collect();
    let (xa, ya, za) = (0x0u64, 0x10_000u64, 0x20_000u64);
    d.memcpy_to_device(xa, &f32s(&x)).unwrap();
    d.memcpy_to_device(ya, &f32s(&y)).unwrap();
    d.launch(op::VADD, [xa, ya, za, n as u64, 0], WaitMode::Poll).unwrap();
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    assert_eq!(read_f32s(&mut d, za, n), want);
    let alpha = 2.5f32;
    d.launch(op::SAXPY, [xa, ya, n as u64, alpha.to_bits() as u64, 0], WaitMode::Interrupt).unwrap();
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| alpha * a + b).collect();
    assert_eq!(read_f32s(&mut d, ya, n), want);
    d.launch(op::REDUCE_SUM, [xa, n as u64, 0x30_000, 0, 0], WaitMode::Poll).unwrap();
    assert_eq!(read_f32s(&mut d, 0x30_000, 1)[0], x.iter().sum::<f32>());
    // 7x5 times 5x3.
    let (m, k, nn) = (7usize, 5usize, 3usize);
    let a: Vec<f32> = (0..m * k).map(|i| (i as f32).sin()).collect();
    let b: Vec<f32> = (0..k * nn).map(|i| (i as f32).cos()).collect();
    d.memcpy_to_device(0x40_000, &f32s(&a)).unwrap();
    d.memcpy_to_device(0x50_000, &f32s(&b)).unwrap();
    let dims = m as u64 | (nn as u64) << 16 | (k as u64) << 32;
    d.launch(op::MATMUL, [0x40_000, 0x50_000, 0x60_000, dims, 0], WaitMode::Poll).unwrap();
    let mut want = vec![0f32; m * nn];
    for i in 0..m {
        for j in 0..nn {
            want[i * nn + j] = (0..k).map(|p| a[i * k + p] * b[p * nn + j]).sum();
        }
    }
    assert_eq!(read_f32s(&mut d, 0x60_000, m * nn), want);
}

#[test]
fn fences_and_interrupts() {
    let mut d = open();
    for _ in 0..5 {
        d.launch(op::NOP, [0; 5], WaitMode::Interrupt).unwrap();
    }
    assert_eq!(d.read_reg(reg::FENCE), 5);
    assert_eq!(d.read_reg(reg::INT_STATUS) & 1, 1);
    d.write_reg(reg::INT_STATUS, 1);
    assert_eq!(d.read_reg(reg::INT_STATUS) & 1, 0, "W1C");
    assert_eq!(d.read_reg(reg::COMPLETED), 15, "5 x (NOP, FENCE, INTERRUPT)");
}

#[test]
fn errors_are_reported_and_the_device_goes_on() {
    let mut d = open();
    // A bad opcode.
    assert_eq!(d.launch(0x77, [0; 5], WaitMode::Poll), Err(DriverError::Device { code: err::BAD_OPCODE }));
    // A copy beyond VRAM.
    assert_eq!(
        d.launch(op::FILL, [(256 << 20) - 4, 8, 0, 0, 0], WaitMode::Poll),
        Err(DriverError::Device { code: err::BAD_ARGUMENT })
    );
    // DMA from host memory the platform never provided: UR, counted, reported.
    let refused_before = d.pci().dma_read_refused;
    assert_eq!(
        d.launch(op::COPY_H2V, [HOST_MEMORY_BASE + (1 << 40), 0, 4096, 0, 0], WaitMode::Poll),
        Err(DriverError::Device { code: err::DMA })
    );
    assert!(d.pci().dma_read_refused > refused_before);
    // DMA writes outside host memory are dropped and counted.
    let _ = d.launch(op::COPY_V2H, [0, 0x10, 64, 0, 0], WaitMode::Poll);
    assert!(d.pci().dma_write_dropped > 0);
    // The device still works.
    let data = pattern(777, 1);
    d.memcpy_to_device(0x100, &data).unwrap();
    let mut back = vec![0u8; 777];
    d.memcpy_from_device(0x100, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn reset_mid_work_returns_to_power_on() {
    let mut d = open();
    d.memcpy_to_device(0, &pattern(4096, 3)).unwrap();
    // Queue work without letting the device run it, then reset the function.
    d.submit(hw::driver::Command { opcode: op::FILL, args: [0, 4096, 7, 0, 0] }).unwrap();
    d.pci().device().reset();
    let dev = d.pci().device();
    assert_eq!(dev.vram_resident(), 0, "VRAM back to empty");
    assert_eq!(dev.function().config().command(), 0, "Command register cleared");
    assert!(!dev.function().bus_master());
    // A new driver instance opens it again and it works.
    let platform = DirectAttach::new(SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default()), 1 << 20);
    let mut d2 = SimGpuDriver::open(platform).unwrap();
    d2.launch(op::NOP, [0; 5], WaitMode::Poll).unwrap();
}

#[test]
fn large_vram_is_sparse() {
    let mut d = open_with(SimGpuParams { vram_bytes: 64 << 30, ..SimGpuParams::default() });
    assert_eq!(d.vram_size(), 64 << 30);
    d.memcpy_to_device((64 << 30) - 4096, &pattern(4096, 5)).unwrap();
    assert_eq!(d.pci().device().vram_resident(), 4096);
}

#[test]
fn no_bus_master_no_dma() {
    let mut d = open();
    // Clear Bus Master Enable: the device must not fetch commands.
    let cmd = d.pci().device().function().config().command() as u32;
    hw::driver::PciFunction::config_write(d.pci(), 0x04, cmd & !0x4);
    d.submit(hw::driver::Command { opcode: op::NOP, args: [0; 5] }).unwrap();
    assert!(!d.pci().run(), "no progress without Bus Master Enable");
    assert_eq!(d.read_reg(reg::COMPLETED), 0);
    hw::driver::PciFunction::config_write(d.pci(), 0x04, cmd);
    d.pci().run();
    assert_eq!(d.read_reg(reg::COMPLETED), 1);
}

#[test]
fn reset_with_dma_in_flight_drops_it() {
    use hw::TlpQueue;
    use hw::simgpu_device::{COMMAND_BYTES, MAX_READS_IN_FLIGHT};
    use tlp::{Address, Body, ConfigTarget, ParseConfig, Request, Tag, TlpRepr, rules};

    let host = Bdf::new(0, 0, 0);
    let mut dev = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    let mut up = TlpQueue::default();
    fn base(body: Body<'_>) -> TlpRepr<'_> {
        TlpRepr::new(body)
    }
    let cfg_write = |dev: &mut SimGpu, up: &mut TlpQueue, reg: u16, v: u32| {
        let d = v.to_le_bytes();
        let t = base(Body::CfgWrite {
            req: Request { requester: host, tag: Tag::new(1).unwrap(), first_be: 0xf, last_be: 0 },
            cfg: ConfigTarget { type1: false, target: Bdf::new(1, 0, 0), register: reg },
            data: &d,
        });
        dev.request(&t, up);
    };
    let reg_write = |dev: &mut SimGpu, up: &mut TlpQueue, off: u64, v: u64| {
        let d = v.to_le_bytes();
        let t = base(Body::MemWrite {
            req: Request { requester: host, tag: Tag::default(), first_be: 0xf, last_be: 0xf },
            address: Address::new(0xfe00_0000 + off),
            ph: 0,
            data: &d,
        });
        dev.request(&t, up);
    };
    cfg_write(&mut dev, &mut up, 0x10, 0xfe00_0000);
    cfg_write(&mut dev, &mut up, 0x04, 0x6);
    reg_write(&mut dev, &mut up, reg::RING_BASE, 0x1_0000_0000);
    reg_write(&mut dev, &mut up, reg::RING_SIZE, 4);
    reg_write(&mut dev, &mut up, reg::RING_TAIL, 1);
    up.0.clear();
    // The device fetches the command...
    assert!(dev.poll(&mut up));
    let fetch = up.0.pop().unwrap();
    let fetch = TlpRepr::parse_bytes(&fetch, &ParseConfig::default()).unwrap();
    assert_eq!(fetch.address(), Some(0x1_0000_0000));
    // ...which is a 1 MiB host→VRAM copy.
    let mut cmd = [0u8; COMMAND_BYTES as usize];
    cmd[0..4].copy_from_slice(&op::COPY_H2V.to_le_bytes());
    cmd[8..16].copy_from_slice(&0x2_0000_0000u64.to_le_bytes());
    cmd[16..24].copy_from_slice(&0u64.to_le_bytes());
    cmd[24..32].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let chunk = rules::CompletionChunk { byte_count: 64, lower_address: 0, data_offset: 0, length_dw: 16 };
    dev.completion(&rules::completion_with_data(&fetch, host, &chunk, &cmd), &mut up);
    assert!(dev.poll(&mut up)); // decode
    assert!(dev.poll(&mut up)); // reads go out
    let reads: Vec<Vec<u8>> = std::mem::take(&mut up.0);
    assert_eq!(reads.len(), MAX_READS_IN_FLIGHT, "reads in flight before the reset");
    // Function-level reset in the middle of the copy.
    dev.reset();
    assert_eq!(dev.function().config().command(), 0);
    assert!(!dev.poll(&mut up), "idle after reset (and no Bus Master Enable)");
    // Completions for the dropped reads arrive late: counted, not written anywhere.
    let r = TlpRepr::parse_bytes(&reads[0], &ParseConfig::default()).unwrap();
    let data = vec![0xeeu8; r.length_dw().unwrap() as usize * 4];
    let chunk = rules::CompletionChunk {
        byte_count: data.len() as u16,
        lower_address: 0,
        data_offset: 0,
        length_dw: r.length_dw().unwrap(),
    };
    dev.completion(&rules::completion_with_data(&r, host, &chunk, &data), &mut up);
    assert_eq!(dev.stray_completions, 1);
    assert_eq!(dev.vram_resident(), 0, "nothing landed in VRAM");
    assert!(up.0.is_empty());
}

#[test]
fn big_fills_and_overlapping_copies_are_chunked_correctly() {
    let mut d = open();
    // A fill larger than the device's 1 MiB working buffer keeps the pattern in phase.
    let len = (3 << 20) + 8;
    d.launch(op::FILL, [0x40_0000, len, 0x0403_0201, 0, 0], WaitMode::Poll).unwrap();
    let mut f = vec![0u8; 16];
    d.memcpy_from_device(0x40_0000 + len - 8, &mut f).unwrap();
    assert_eq!(f, [1, 2, 3, 4, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0]);
    // Overlapping VRAM copies behave like memmove, in both directions, across chunks.
    let n = (2 << 20) + 100;
    let data = pattern(n as usize, 77);
    d.memcpy_to_device(0x100_0000, &data).unwrap();
    d.launch(op::COPY_V2V, [0x100_0000, 0x100_0000 + 4096, n, 0, 0], WaitMode::Poll).unwrap();
    let mut back = vec![0u8; n as usize];
    d.memcpy_from_device(0x100_0000 + 4096, &mut back).unwrap();
    assert_eq!(back, data, "copy to a higher, overlapping range");
    d.launch(op::COPY_V2V, [0x100_0000 + 4096, 0x100_0000 + 1000, n, 0, 0], WaitMode::Poll).unwrap();
    d.memcpy_from_device(0x100_0000 + 1000, &mut back).unwrap();
    assert_eq!(back, data, "copy to a lower, overlapping range");
}

#[test]
fn ring_indices_wrap_around() {
    // 200 commands through a 64-entry ring without a sync: head and tail wrap three times.
    let mut d = open();
    for _ in 0..200 {
        d.submit(hw::driver::Command { opcode: op::NOP, args: [0; 5] }).unwrap();
    }
    d.sync(WaitMode::Poll).unwrap();
    assert_eq!(d.read_reg(reg::COMPLETED), 201);
}
