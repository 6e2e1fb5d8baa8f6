//! The simgpu on a thread of its own (`testbed::concurrent`): the driver's whole suite and
//! every workload, verified, as on the synchronous direct platform.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use driver::{PciFunction, SimGpuDriver};
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use testbed::concurrent::ConcurrentAttach;
use testbed::workload::Workload;
use tlp::Bdf;

fn open() -> SimGpuDriver<ConcurrentAttach<SimGpu>> {
    let dev = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    SimGpuDriver::open(ConcurrentAttach::new(dev, 64 << 20).unwrap()).unwrap()
}

#[test]
fn driver_suite_passes_with_the_device_on_its_own_thread() {
    let failed = testbed::suite::failures(open);
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn every_workload_is_verified_with_the_device_on_its_own_thread() {
    let mut d = open();
    for name in Workload::NAMES {
        let w = Workload::named(name, 1).unwrap();
        w.run(&mut d, &mut |_| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // The device comes back with its thread stopped.
    assert!(d.into_pci().into_device().is_some());
}

/// The driver keeps what it polled while the device has written nothing: each fence the
/// device writes, each interrupt it raises, and each copy into a word the driver had read is
/// seen at once, and the driver's own writes read back.
#[test]
fn what_the_driver_polls_follows_every_write_of_the_devices() {
    use driver::simgpu::{Command, WaitMode};
    use simgpu_abi::op;
    let mut d = open();
    for i in 0..2000 {
        let mode = if i % 4 == 0 { WaitMode::Interrupt } else { WaitMode::Poll };
        d.sync(mode).unwrap_or_else(|e| panic!("sync {i}: {e}"));
    }
    let word = d.pci().dma_alloc(64).unwrap();
    let mut seen = [0u8; 64];
    for i in 1..=200u8 {
        // The driver reads the word (and keeps it), then has the device write it.
        d.pci().dma_read(&word, 0, &mut seen);
        assert_eq!(seen, [i - 1; 64], "before copy {i}");
        d.enqueue(Command { opcode: op::FILL, args: [0, 64, u64::from(u32::from_le_bytes([i; 4])), 0, 0] })
            .unwrap();
        d.enqueue(Command { opcode: op::COPY_V2H, args: [0, word.bus.get(), 64, 0, 0] }).unwrap();
        d.sync(WaitMode::Poll).unwrap();
        d.pci().dma_read(&word, 0, &mut seen);
        assert_eq!(seen, [i; 64], "after copy {i}");
        // The driver's own write reads back, then goes back to what the device wrote.
        d.pci().dma_write(&word, 0, &[0xee; 64]);
        d.pci().dma_read(&word, 0, &mut seen);
        assert_eq!(seen, [0xee; 64]);
        d.pci().dma_write(&word, 0, &[i; 64]);
    }
}

/// Copies of megabytes each way while the driver reads the destination's first words, writes
/// a buffer of its own and reads it back: the device's reads are served many to a taking of
/// the host's lock and its writes a step to a taking, the driver's calls in between. What the
/// driver wrote reads back at once, and once the fence is seen every byte copied out is there.
#[test]
fn long_copies_each_way_beside_a_driver_that_reads_and_writes_throughout() {
    use driver::simgpu::{Command, WaitMode};
    use simgpu_abi::op;
    const BYTES: usize = 8 << 20;
    let mut d = open();
    let src = d.pin(BYTES).unwrap();
    let dst = d.pin(BYTES).unwrap();
    let own = d.pci().dma_alloc(4096).unwrap();
    // Written by the device after the copy out, in ring order: the driver's sign it is done.
    let done = d.pci().dma_alloc(64).unwrap();
    let marker = BYTES as u64;
    for round in 0..4u8 {
        let data: Vec<u8> = (0..BYTES).map(|i| (i as u8).wrapping_mul(7).wrapping_add(round)).collect();
        d.pci().dma_write(&src, 0, &data);
        d.pci().dma_write(&dst, 0, &vec![0xa5; BYTES]);
        d.enqueue(Command { opcode: op::COPY_H2V, args: [src.bus.get(), 0, BYTES as u64, 0, 0] }).unwrap();
        d.enqueue(Command { opcode: op::COPY_V2H, args: [0, dst.bus.get(), BYTES as u64, 0, 0] }).unwrap();
        let value = u64::from(u32::from_le_bytes([round + 1; 4]));
        d.enqueue(Command { opcode: op::FILL, args: [marker, 64, value, 0, 0] }).unwrap();
        d.enqueue(Command { opcode: op::COPY_V2H, args: [marker, done.bus.get(), 64, 0, 0] }).unwrap();
        d.flush();
        let mut polls = 0u64;
        let (mut head, mut sign) = ([0u8; 64], [0u8; 64]);
        let start = std::time::Instant::now();
        loop {
            d.pci().dma_read(&done, 0, &mut sign);
            if sign == [round + 1; 64] {
                break;
            }
            assert!(start.elapsed() < std::time::Duration::from_secs(60), "round {round}: not done");
            polls += 1;
            d.pci().dma_read(&dst, 0, &mut head);
            assert!(head == [0xa5; 64] || head[..] == data[..64], "round {round}: torn head {head:?}");
            let word = [(polls as u8) ^ round; 4096];
            d.pci().dma_write(&own, 0, &word);
            let mut back = [0u8; 4096];
            d.pci().dma_read(&own, 0, &mut back);
            assert_eq!(back, word, "round {round}, poll {polls}: the driver's own write");
        }
        d.sync(WaitMode::Poll).unwrap();
        let mut out = vec![0u8; BYTES];
        d.pci().dma_read(&dst, 0, &mut out);
        assert!(out == data, "round {round}: the copy out differs after {polls} polls");
    }
}
