//! The simgpu through its driver on a directly attached device: the driver's suite
//! (`testbed::suite`: every command checked against a CPU reference, fences by polling and by
//! interrupt, error paths), the demo workload, and what only a direct attachment can see:
//! DMA refusals counted, reads in flight, reset mid-work, sparse VRAM, Bus Master Enable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use driver::{DriverError, SimGpuDriver, WaitMode};
use hw::simgpu::SimGpuParams;
use hw::{Device, SimGpu};
use simgpu_abi::{err, op, reg};
use testbed::direct::{DirectAttach, HOST_MEMORY_BASE};
use tlp::Bdf;

fn open_with(p: SimGpuParams) -> SimGpuDriver<DirectAttach<SimGpu>> {
    let dev = SimGpu::new(Bdf::new(1, 0, 0), p);
    SimGpuDriver::open(DirectAttach::new(dev, 64 << 20)).unwrap()
}

fn open() -> SimGpuDriver<DirectAttach<SimGpu>> {
    open_with(SimGpuParams::default())
}

use testbed::suite::pattern;

#[test]
fn driver_suite_on_a_directly_attached_simgpu() {
    let failed = testbed::suite::failures(open);
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn demo_workload_is_verified() {
    let mut d = open();
    let r = testbed::workload::run(&mut d, testbed::workload::WorkloadSize::scaled(1), &mut |_| {}).unwrap();
    assert!(r.steps.len() > 10);
    assert_eq!(r.h2d.0, 1 << 20);
}

#[test]
fn large_copies_keep_several_reads_in_flight() {
    let mut d = open();
    d.memcpy_to_device(0x100000, &pattern(1 << 20, 1)).unwrap();
    // A large host→VRAM copy keeps several reads (tags) in flight, split at MRRS.
    assert!(
        d.pci().device().max_reads_in_flight() > 1,
        "reads in flight: {}",
        d.pci().device().max_reads_in_flight()
    );
}

#[test]
fn dma_outside_host_memory_is_refused_and_counted() {
    let mut d = open();
    // DMA from host memory the platform never provided: UR, counted, reported.
    assert_eq!(
        d.launch(op::COPY_H2V, [HOST_MEMORY_BASE + (1 << 40), 0, 4096, 0, 0], WaitMode::Poll),
        Err(DriverError::Device { code: err::DMA })
    );
    assert!(d.pci().dma_read_refused() > 0);
    // DMA writes outside host memory are dropped and counted.
    let _ = d.launch(op::COPY_V2H, [0, 0x10, 64, 0, 0], WaitMode::Poll);
    assert!(d.pci().dma_write_dropped() > 0);
}

#[test]
fn reset_mid_work_returns_to_power_on() {
    let mut d = open();
    d.memcpy_to_device(0, &pattern(4096, 3)).unwrap();
    // Queue work without letting the device run it, then reset the function.
    d.submit(driver::Command { opcode: op::FILL, args: [0, 4096, 7, 0, 0] }).unwrap();
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
    assert_eq!(d.pci().device().vram_resident(), hw::simgpu_device::VRAM_PAGE, "one page backed");
}

#[test]
fn no_bus_master_no_dma() {
    let mut d = open();
    // Clear Bus Master Enable: the device must not fetch commands.
    let cmd = d.pci().device().function().config().command() as u32;
    driver::PciFunction::config_write(d.pci(), 0x04, cmd & !0x4);
    d.submit(driver::Command { opcode: op::NOP, args: [0; 5] }).unwrap();
    assert!(!d.pci().run(), "no progress without Bus Master Enable");
    assert_eq!(d.read_reg(reg::COMPLETED), 0);
    driver::PciFunction::config_write(d.pci(), 0x04, cmd);
    d.pci().run();
    assert_eq!(d.read_reg(reg::COMPLETED), 1);
}

#[test]
fn reset_with_dma_in_flight_drops_it() {
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
        request(dev, &t, up);
    };
    let reg_write = |dev: &mut SimGpu, up: &mut TlpQueue, off: u64, v: u64| {
        let d = v.to_le_bytes();
        let t = base(Body::MemWrite {
            req: Request { requester: host, tag: Tag::default(), first_be: 0xf, last_be: 0xf },
            address: Address::new(0xfe00_0000 + off),
            ph: 0,
            data: &d,
        });
        request(dev, &t, up);
    };
    cfg_write(&mut dev, &mut up, 0x10, 0xfe00_0000);
    cfg_write(&mut dev, &mut up, 0x04, 0x6);
    reg_write(&mut dev, &mut up, reg::RING_BASE, 0x1_0000_0000);
    reg_write(&mut dev, &mut up, reg::RING_SIZE, 4);
    reg_write(&mut dev, &mut up, reg::RING_TAIL, 1);
    up.0.clear();
    // The device fetches the command...
    assert!(poll(&mut dev, &mut up));
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
    completion(&mut dev, &rules::completion_with_data(&fetch, host, &chunk, &cmd), &mut up);
    assert!(poll(&mut dev, &mut up)); // decode
    assert!(poll(&mut dev, &mut up)); // reads go out
    let reads: Vec<Vec<u8>> = std::mem::take(&mut up.0);
    assert_eq!(reads.len(), MAX_READS_IN_FLIGHT, "reads in flight before the reset");
    // Function-level reset in the middle of the copy.
    dev.reset();
    assert_eq!(dev.function().config().command(), 0);
    assert!(!poll(&mut dev, &mut up), "idle after reset (and no Bus Master Enable)");
    // Completions for the dropped reads arrive late: counted, not written anywhere.
    let r = TlpRepr::parse_bytes(&reads[0], &ParseConfig::default()).unwrap();
    let data = vec![0xeeu8; r.length_dw().unwrap() as usize * 4];
    let chunk = rules::CompletionChunk {
        byte_count: data.len() as u16,
        lower_address: 0,
        data_offset: 0,
        length_dw: r.length_dw().unwrap(),
    };
    completion(&mut dev, &rules::completion_with_data(&r, host, &chunk, &data), &mut up);
    assert_eq!(dev.stray_completions, 1);
    assert_eq!(dev.vram_resident(), 0, "nothing landed in VRAM");
    assert!(up.0.is_empty());
}

/// A copy to the host goes out a step per poll — at most 64 KiB of writes — so a platform
/// that polls the device only once its upstream took what the device sent (as the GPU-box
/// endpoint does) bounds what waits there, and a register read between two steps is
/// answered behind one step, not behind the whole copy. The test plays the platform: it
/// feeds the device's command fetch and counts what each poll sends.
#[test]
fn a_copy_to_the_host_goes_out_a_step_per_poll() {
    use driver::PciFunction;
    use tlp::rules::{self, Rcb, TransferSize};
    use tlp::{Address, Body, ParseConfig, Request, Tag, TlpRepr};
    let len = 1usize << 20;
    let mut d = open();
    d.memcpy_to_device(0, &pattern(len, 9)).unwrap();
    let dst = d.pci().dma_alloc(len).unwrap();
    let (ring, tail) = (d.read_reg(reg::RING_BASE), d.read_reg(reg::RING_TAIL));
    let mut cmd = [0u8; 64];
    cmd[0..4].copy_from_slice(&op::COPY_V2H.to_le_bytes());
    for (i, a) in [0, dst.bus.get(), len as u64].iter().enumerate() {
        cmd[8 + 8 * i..16 + 8 * i].copy_from_slice(&a.to_le_bytes());
    }
    // Requests straight to the device: nothing polls it but this test.
    let bar0 = testbed::direct::BAR0_BASE;
    let host = Request { requester: Bdf::new(0, 0, 0), tag: Tag::from_bits(1), first_be: 0xf, last_be: 0xf };
    let next = ((tail + 1) % 64).to_le_bytes();
    let set_tail = TlpRepr::new(Body::MemWrite {
        req: host,
        address: Address::new(bar0 + reg::RING_TAIL),
        ph: 0,
        data: &next,
    });
    let mut q = TlpQueue::default();
    let dev = d.pci().device();
    request(dev, &set_tail, &mut q);
    fn parse(b: &[u8]) -> TlpRepr<'_> {
        TlpRepr::parse_bytes(b, &ParseConfig::default()).unwrap()
    }
    // The command fetch, answered from `cmd`.
    let mut polls = 0;
    while q.0.is_empty() {
        assert!(poll(dev, &mut q));
        polls += 1;
        assert!(polls < 10, "no command fetch");
    }
    let fetch = q.0.remove(0);
    let fetch = parse(&fetch);
    let Body::MemRead { address, .. } = fetch.body else { panic!("not a read: {fetch:?}") };
    assert_eq!(address.value(), ring + tail * 64);
    let mut cpls = TlpQueue::default();
    assert!(rules::complete_read(&fetch, Bdf::new(0, 0, 0), &cmd, Rcb::B64, TransferSize::B512, |c| {
        cpls.0.push(emit(c))
    }));
    for c in &cpls.0 {
        completion(dev, &parse(c), &mut q);
    }
    let mut written = 0;
    let mut steps = 0;
    while written < len {
        q.0.clear();
        poll(dev, &mut q);
        let step: usize =
            q.0.iter()
                .map(|b| match parse(b).body {
                    Body::MemWrite { data, .. } => data.len(),
                    _ => 0,
                })
                .sum();
        assert!(step <= 64 << 10, "one poll wrote {step} bytes");
        written += step;
        steps += usize::from(step > 0);
        polls += 1;
        assert!(polls <= 64, "copy not done after {polls} polls ({written} bytes)");
        // A register read between two steps is answered at once.
        let read = TlpRepr::new(Body::MemRead {
            req: Request { tag: Tag::from_bits(2), last_be: 0, ..host },
            address: Address::new(bar0 + reg::ID),
            ph: 0,
            length_dw: 1,
            locked: false,
        });
        q.0.clear();
        request(dev, &read, &mut q);
        assert!(matches!(q.0.first().map(|b| parse(b).body), Some(Body::Completion { .. })));
    }
    assert_eq!(written, len);
    assert_eq!(steps, len / (64 << 10), "polls that wrote");
}

/// Commands published together are fetched in one DMA read, and each fetched entry runs
/// exactly once: 30 launches of three commands each (the command, FENCE, INTERRUPT) go round
/// the 64-entry ring and past it with every fence value new, and the device counts 90
/// commands done.
#[test]
fn commands_published_together_are_fetched_together_lap_after_lap() {
    let mut d = open();
    let (fetches0, done0) = (d.pci().device().command_fetches(), d.read_reg(reg::COMPLETED));
    for i in 0..30 {
        d.launch(op::NOP, [0; 5], WaitMode::Interrupt).unwrap_or_else(|e| panic!("launch {i}: {e}"));
    }
    assert_eq!(d.read_reg(reg::COMPLETED), done0 + 90);
    // One read per launch, and one more each time a launch's entries straddle the ring's end.
    let fetches = d.pci().device().command_fetches() - fetches0;
    assert!((30..=32).contains(&fetches), "{fetches} reads fetched 90 commands");
}

/// What a device sent, taken after each call and emitted (the tests play the platform).
#[derive(Default)]
struct TlpQueue(Vec<Vec<u8>>);

fn emit(t: &tlp::TlpRepr<'_>) -> Vec<u8> {
    let mut b = vec![0u8; t.buffer_len()];
    let n = t.emit(&mut b).unwrap();
    b.truncate(n);
    b
}

fn request(dev: &mut dyn hw::Device, t: &tlp::TlpRepr<'_>, q: &mut TlpQueue) {
    dev.request(t);
    q.0.extend(hw::take_all(dev));
}

fn completion(dev: &mut dyn hw::Device, t: &tlp::TlpRepr<'_>, q: &mut TlpQueue) {
    dev.completion(t);
    q.0.extend(hw::take_all(dev));
}

fn poll(dev: &mut dyn hw::Device, q: &mut TlpQueue) -> bool {
    let did = dev.poll();
    q.0.extend(hw::take_all(dev));
    did
}
