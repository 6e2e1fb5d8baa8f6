//! Nothing is allocated per TLP on the datapath: both endpoints in this process, a counting
//! allocator under them, and register reads and DMA copies in steady state (after one round
//! that fills the pools: frame buffers, the box's backlog, the link's spare frames).
//!
//! The counting allocator is the one `unsafe` of the tests crate (docs/architecture.md): a
//! global allocator is unsafe by contract; it only counts and hands every call to the
//! system's. One test in this binary, so that nothing else allocates meanwhile.
#![deny(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use bridge_host::RemoteDevice;
use driver::SimGpuDriver;
use dxpu_tests::{GpuBox, gpu_options, host_options, key_a};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed unchanged to `System`, which upholds GlobalAlloc's contract.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc` and `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

#[test]
fn register_reads_and_dma_allocate_nothing_per_tlp_in_steady_state() {
    let gpu = GpuBox::start(gpu_options("127.0.0.1:0".parse().unwrap()));
    let remote = RemoteDevice::attach(host_options(gpu.addr, key_a())).unwrap();
    let mut d = SimGpuDriver::open(remote).unwrap();
    let reads = 2000;
    for _ in 0..reads {
        d.read_reg(0);
    }
    let before = allocations();
    for _ in 0..reads {
        d.read_reg(0);
    }
    let per_read = allocations() - before;
    // A few for the occasional timer's work, not one per read (each read is two TLPs).
    assert!(per_read <= 10, "{per_read} allocations in {reads} register reads");

    // Host→VRAM and VRAM→host copies of 4 MiB: 2048 reads of 4 KiB and as many writes, with
    // their completions; the copy's own buffers are the test's (a handful).
    let bytes = 4 << 20;
    for _ in 0..3 {
        lab::model::copy_rates(&mut d, bytes, 1).unwrap();
    }
    // The least of three rounds: one allocation per TLP shows in every round, while the
    // timers' work (a retransmission, an acknowledgement's) varies with the machine's load
    // (42 to 106 in one round of six, under the whole suite).
    let per_copy = (0..3)
        .map(|_| {
            let before = allocations();
            lab::model::copy_rates(&mut d, bytes, 1).unwrap();
            allocations() - before
        })
        .min()
        .unwrap_or(u64::MAX);
    assert!(
        per_copy <= 40,
        "{per_copy} allocations moving 8 MiB in 4 KiB TLPs (4096 of them and their completions)"
    );
    d.into_pci().detach();
    drop(gpu);
}
