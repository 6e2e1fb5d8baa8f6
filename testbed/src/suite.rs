//! The simgpu driver's test suite, generic over the platform: the same checks run on a
//! directly attached simgpu (`testbed/tests/simgpu.rs`), on a remote one through the bridges
//! (`tests/bridge.rs`), and wherever else a [`PciFunction`] is built. Each check opens
//! nothing itself: it gets a driver on a freshly opened device and says what went wrong,
//! with the values, instead of panicking. Checks that need a device's internals (reset with
//! DMA in flight, sparse VRAM residency) stay with the platform that can see them.
#![forbid(unsafe_code)]

use driver::{DriverError, PciFunction, SimGpuDriver, WaitMode};
use simgpu_abi::{err, op, reg};

/// One check: its name and what it runs.
pub struct Check<P: PciFunction> {
    /// Name, as a test would be called.
    pub name: &'static str,
    /// Runs the check on an opened driver.
    pub run: fn(&mut SimGpuDriver<P>) -> Result<(), String>,
}

/// Runs every check, each on a driver `open` gives it; the failures, named.
pub fn failures<P: PciFunction>(mut open: impl FnMut() -> SimGpuDriver<P>) -> Vec<String> {
    let mut failed = Vec::new();
    for c in checks() {
        let mut d = open();
        if let Err(e) = (c.run)(&mut d) {
            failed.push(format!("{}: {e}", c.name));
        }
    }
    failed
}

/// Every platform-independent check of the driver.
pub fn checks<P: PciFunction>() -> Vec<Check<P>> {
    vec![
        Check { name: "opens_and_sizes_the_bars", run: opens_and_sizes_the_bars },
        Check { name: "copies_both_ways_any_size_and_alignment", run: copies_both_ways },
        Check { name: "vram_to_vram_and_fill", run: vram_to_vram_and_fill },
        Check { name: "kernels_match_the_cpu", run: kernels_match_the_cpu },
        Check { name: "kernels_across_vram_pages_and_after_larger_ones", run: kernels_across_pages },
        Check { name: "fences_and_interrupts", run: fences_and_interrupts },
        Check { name: "errors_are_reported_and_the_device_goes_on", run: errors_are_reported },
        Check { name: "big_fills_and_overlapping_copies", run: big_fills_and_overlapping_copies },
        Check { name: "ring_indices_wrap_around", run: ring_indices_wrap_around },
    ]
}

/// Deterministic test bytes.
pub fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) as u8).collect()
}

/// fp32 values as little-endian bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Reads `n` fp32 values from VRAM.
pub fn read_f32s<P: PciFunction>(
    d: &mut SimGpuDriver<P>,
    vram: u64,
    n: usize,
) -> Result<Vec<f32>, DriverError> {
    let mut b = vec![0u8; n * 4];
    d.memcpy_from_device(vram, &mut b)?;
    Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

fn ok<T>(r: Result<T, DriverError>, what: &str) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

fn same<T: PartialEq + std::fmt::Debug>(got: T, want: T, what: &str) -> Result<(), String> {
    if got == want { Ok(()) } else { Err(format!("{what}: got {got:?}, want {want:?}")) }
}

fn same_bytes(got: &[u8], want: &[u8], what: &str) -> Result<(), String> {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None if got.len() == want.len() => Ok(()),
        None => Err(format!("{what}: {} bytes, want {}", got.len(), want.len())),
        Some(i) => Err(format!("{what}: first difference at byte {i}: {:#04x} != {:#04x}", got[i], want[i])),
    }
}

fn opens_and_sizes_the_bars<P: PciFunction>(d: &mut SimGpuDriver<P>) -> Result<(), String> {
    same(d.read_reg(reg::ID) & 0xffff_ffff, 0x474d_4953, "ID register")?;
    let size = d.vram_size();
    same(d.read_reg(reg::VRAM_SIZE), size, "VRAM_SIZE register vs BAR2 size")?;
    same(d.read_reg(reg::ERROR), 0, "ERROR register")
}

fn copies_both_ways<P: PciFunction>(d: &mut SimGpuDriver<P>) -> Result<(), String> {
    for (vram, len) in
        [(0u64, 1usize), (3, 7), (4096 - 5, 10), (0x10000, 4096), (0x20003, 100_003), (0x100000, 1 << 20)]
    {
        let data = pattern(len, vram as u32);
        ok(d.memcpy_to_device(vram, &data), "copy to VRAM")?;
        let mut back = vec![0u8; len];
        ok(d.memcpy_from_device(vram, &mut back), "copy from VRAM")?;
        same_bytes(&back, &data, &format!("copy of {len} bytes at VRAM {vram:#x}"))?;
    }
    Ok(())
}

fn vram_to_vram_and_fill<P: PciFunction>(d: &mut SimGpuDriver<P>) -> Result<(), String> {
    let data = pattern(10_000, 9);
    ok(d.memcpy_to_device(0x1000, &data), "copy to VRAM")?;
    ok(d.launch(op::COPY_V2V, [0x1000, 0x9_0002, 10_000, 0, 0], WaitMode::Poll), "COPY_V2V")?;
    let mut back = vec![0u8; 10_000];
    ok(d.memcpy_from_device(0x9_0002, &mut back), "copy from VRAM")?;
    same_bytes(&back, &data, "VRAM→VRAM copy")?;
    ok(d.launch(op::FILL, [0x5000, 10, 0xa1b2_c3d4, 0, 0], WaitMode::Poll), "FILL")?;
    let mut f = vec![0u8; 12];
    ok(d.memcpy_from_device(0x5000, &mut f), "copy from VRAM")?;
    same_bytes(&f, &[0xd4, 0xc3, 0xb2, 0xa1, 0xd4, 0xc3, 0xb2, 0xa1, 0xd4, 0xc3, 0, 0], "FILL of 10 bytes")
}

fn kernels_match_the_cpu<P: PciFunction>(d: &mut SimGpuDriver<P>) -> Result<(), String> {
    let n = 1000;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 17) as f32 * 1.25).collect();
    let (xa, ya, za) = (0x0u64, 0x10_000u64, 0x20_000u64);
    ok(d.memcpy_to_device(xa, &f32_bytes(&x)), "copy x")?;
    ok(d.memcpy_to_device(ya, &f32_bytes(&y)), "copy y")?;
    ok(d.launch(op::VADD, [xa, ya, za, n as u64, 0], WaitMode::Poll), "VADD")?;
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    same(ok(read_f32s(d, za, n), "read z")?, want, "VADD result")?;
    let alpha = 2.5f32;
    ok(d.launch(op::SAXPY, [xa, ya, n as u64, alpha.to_bits() as u64, 0], WaitMode::Interrupt), "SAXPY")?;
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| alpha * a + b).collect();
    same(ok(read_f32s(d, ya, n), "read y")?, want, "SAXPY result")?;
    ok(d.launch(op::REDUCE_SUM, [xa, n as u64, 0x30_000, 0, 0], WaitMode::Poll), "REDUCE_SUM")?;
    same(ok(read_f32s(d, 0x30_000, 1), "read sum")?[0], x.iter().sum::<f32>(), "REDUCE_SUM result")?;
    // 7x5 times 5x3.
    let (m, k, nn) = (7usize, 5usize, 3usize);
    let a: Vec<f32> = (0..m * k).map(|i| (i as f32).sin()).collect();
    let b: Vec<f32> = (0..k * nn).map(|i| (i as f32).cos()).collect();
    ok(d.memcpy_to_device(0x40_000, &f32_bytes(&a)), "copy A")?;
    ok(d.memcpy_to_device(0x50_000, &f32_bytes(&b)), "copy B")?;
    let dims = m as u64 | (nn as u64) << 16 | (k as u64) << 32;
    ok(d.launch(op::MATMUL, [0x40_000, 0x50_000, 0x60_000, dims, 0], WaitMode::Poll), "MATMUL")?;
    same(ok(read_f32s(d, 0x60_000, m * nn), "read C")?, matmul_reference(&a, &b, m, k, nn), "MATMUL result")
}

/// `m`×`k` times `k`×`n` on the CPU, in the device's order.
fn matmul_reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

/// Operands that straddle VRAM's 64 KiB pages, longer than a page, and a small MATMUL right
/// after a larger one (the device keeps its kernels' working buffers between commands).
fn kernels_across_pages<P: PciFunction>(d: &mut SimGpuDriver<P>) -> Result<(), String> {
    let n = 40_000;
    let x: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.25 - 7.0).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 1.5).collect();
    let (xa, ya, za) = (0xf_fff0u64, 0x20_0004u64, 0x30_0008u64);
    ok(d.memcpy_to_device(xa, &f32_bytes(&x)), "copy x")?;
    ok(d.memcpy_to_device(ya, &f32_bytes(&y)), "copy y")?;
    ok(d.launch(op::VADD, [xa, ya, za, n as u64, 0], WaitMode::Poll), "VADD")?;
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    same(ok(read_f32s(d, za, n), "read z")?, want, "VADD across pages")?;
    let alpha = -0.75f32;
    ok(d.launch(op::SAXPY, [xa, ya, n as u64, alpha.to_bits() as u64, 0], WaitMode::Poll), "SAXPY")?;
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| alpha * a + b).collect();
    same(ok(read_f32s(d, ya, n), "read y")?, want, "SAXPY across pages")?;
    ok(d.launch(op::REDUCE_SUM, [xa, n as u64, 0x40_fffc, 0, 0], WaitMode::Poll), "REDUCE_SUM")?;
    same(ok(read_f32s(d, 0x40_fffc, 1), "read sum")?[0], x.iter().sum::<f32>(), "REDUCE_SUM across pages")?;
    for (m, k, nn, at) in [(64usize, 48usize, 80usize, 0x50_fff0u64), (3, 2, 4, 0x70_0000)] {
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.1).sin()).collect();
        let b: Vec<f32> = (0..k * nn).map(|i| (i as f32 * 0.3).cos()).collect();
        let (aa, ba, ca) = (at, at + 0x1_0000, at + 0x2_0004);
        ok(d.memcpy_to_device(aa, &f32_bytes(&a)), "copy A")?;
        ok(d.memcpy_to_device(ba, &f32_bytes(&b)), "copy B")?;
        let dims = m as u64 | (nn as u64) << 16 | (k as u64) << 32;
        ok(d.launch(op::MATMUL, [aa, ba, ca, dims, 0], WaitMode::Poll), "MATMUL")?;
        let got = ok(read_f32s(d, ca, m * nn), "read C")?;
        same(got, matmul_reference(&a, &b, m, k, nn), &format!("MATMUL {m}x{k} times {k}x{nn}"))?;
    }
    Ok(())
}

fn fences_and_interrupts<P: PciFunction>(d: &mut SimGpuDriver<P>) -> Result<(), String> {
    let (fence0, done0) = (d.read_reg(reg::FENCE), d.read_reg(reg::COMPLETED));
    for i in 0..5 {
        ok(d.launch(op::NOP, [0; 5], WaitMode::Interrupt), &format!("NOP {i} waited by interrupt"))?;
    }
    same(d.read_reg(reg::FENCE), fence0 + 5, "FENCE register after 5 fences")?;
    same(d.read_reg(reg::INT_STATUS) & 1, 1, "INT_STATUS done bit")?;
    d.write_reg(reg::INT_STATUS, 1);
    same(d.read_reg(reg::INT_STATUS) & 1, 0, "INT_STATUS done bit after write-1-to-clear")?;
    same(d.read_reg(reg::COMPLETED), done0 + 15, "commands completed: 5 x (NOP, FENCE, INTERRUPT)")
}

fn errors_are_reported<P: PciFunction>(d: &mut SimGpuDriver<P>) -> Result<(), String> {
    same(
        d.launch(0x77, [0; 5], WaitMode::Poll),
        Err(DriverError::Device { code: err::BAD_OPCODE }),
        "bad opcode",
    )?;
    let end = d.vram_size();
    same(
        d.launch(op::FILL, [end - 4, 8, 0, 0, 0], WaitMode::Poll),
        Err(DriverError::Device { code: err::BAD_ARGUMENT }),
        "FILL past the end of VRAM",
    )?;
    // DMA from a bus address no platform hands out (1 TiB up): UR, reported as a DMA error.
    same(
        d.launch(op::COPY_H2V, [1 << 40, 0, 4096, 0, 0], WaitMode::Poll),
        Err(DriverError::Device { code: err::DMA }),
        "copy from host memory never provided",
    )?;
    let data = pattern(777, 1);
    ok(d.memcpy_to_device(0x100, &data), "copy after errors")?;
    let mut back = vec![0u8; 777];
    ok(d.memcpy_from_device(0x100, &mut back), "copy back after errors")?;
    same_bytes(&back, &data, "the device still works after errors")
}

fn big_fills_and_overlapping_copies<P: PciFunction>(d: &mut SimGpuDriver<P>) -> Result<(), String> {
    // A fill larger than the device's 1 MiB working buffer keeps the pattern in phase.
    let len = (3 << 20) + 8;
    ok(d.launch(op::FILL, [0x40_0000, len, 0x0403_0201, 0, 0], WaitMode::Poll), "FILL 3 MiB")?;
    let mut f = vec![0u8; 16];
    ok(d.memcpy_from_device(0x40_0000 + len - 8, &mut f), "read the fill's end")?;
    same_bytes(&f, &[1, 2, 3, 4, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0], "the fill's last bytes")?;
    // Overlapping VRAM copies behave like memmove, in both directions, across chunks.
    let n = (2 << 20) + 100;
    let data = pattern(n as usize, 77);
    ok(d.memcpy_to_device(0x100_0000, &data), "copy to VRAM")?;
    ok(d.launch(op::COPY_V2V, [0x100_0000, 0x100_0000 + 4096, n, 0, 0], WaitMode::Poll), "COPY_V2V up")?;
    let mut back = vec![0u8; n as usize];
    ok(d.memcpy_from_device(0x100_0000 + 4096, &mut back), "copy from VRAM")?;
    same_bytes(&back, &data, "copy to a higher, overlapping range")?;
    ok(
        d.launch(op::COPY_V2V, [0x100_0000 + 4096, 0x100_0000 + 1000, n, 0, 0], WaitMode::Poll),
        "COPY_V2V down",
    )?;
    ok(d.memcpy_from_device(0x100_0000 + 1000, &mut back), "copy from VRAM")?;
    same_bytes(&back, &data, "copy to a lower, overlapping range")
}

fn ring_indices_wrap_around<P: PciFunction>(d: &mut SimGpuDriver<P>) -> Result<(), String> {
    // 200 commands through a 64-entry ring without a sync: head and tail wrap three times.
    let done0 = d.read_reg(reg::COMPLETED);
    for i in 0..200 {
        ok(d.submit(driver::Command { opcode: op::NOP, args: [0; 5] }), &format!("submit {i}"))?;
    }
    ok(d.sync(WaitMode::Poll), "sync")?;
    same(d.read_reg(reg::COMPLETED), done0 + 201, "commands completed")
}
