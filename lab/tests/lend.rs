//! The replay's thread lends the platform only time it has: where a bridge's host side runs
//! on the job's thread, every pass over the link (a look at host memory that lets the
//! device's writes arrive, a loan) is time the job does not launch in, and a step due within
//! the loan's margin must not wait behind one. A platform whose every pass costs 100 µs (a
//! link with bulk completions to send) replays a job that synchronizes with one stream while
//! another thread launches every 8 µs: its launches stay on time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use driver::{BusAddr, DmaBuf, PciFunction, SimGpuDriver};
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use lab::plan::Plan;
use lab::replay::Replayer;
use lab::trace::{Pick, parse};
use serde_json::{Value, json};
use testbed::concurrent::ConcurrentAttach;

const T0: u64 = 1_700_000_000_000_000;

/// What one pass over the link costs the caller.
const PASS: Duration = Duration::from_micros(100);

/// A platform driven by its caller whose every pass over the link (a read of host memory
/// that lets the device's writes arrive, a loan) takes [`PASS`]; a look at host memory as
/// it stands takes nothing. Counts its passes. With `whole_loans`, a loan is served for
/// all of it instead, as a bridge's host side answering a copy's reads would, and a read
/// costs nothing.
struct SlowPasses<P> {
    inner: P,
    passes: u64,
    whole_loans: bool,
}

impl<P> SlowPasses<P> {
    fn pass(&mut self) {
        self.busy(PASS)
    }

    /// Busy for `d`, a pass counted.
    fn busy(&mut self, d: Duration) {
        self.passes += 1;
        let t = Instant::now();
        while t.elapsed() < d {
            std::hint::spin_loop();
        }
    }
}

impl<P: PciFunction> PciFunction for SlowPasses<P> {
    fn config_read(&mut self, offset: u16) -> u32 {
        self.inner.config_read(offset)
    }
    fn config_write(&mut self, offset: u16, value: u32) {
        self.inner.config_write(offset, value)
    }
    fn mmio_read(&mut self, addr: BusAddr, len: usize) -> u64 {
        self.inner.mmio_read(addr, len)
    }
    fn mmio_write(&mut self, addr: BusAddr, len: usize, value: u64) {
        self.inner.mmio_write(addr, len, value)
    }
    fn dma_alloc(&mut self, len: usize) -> Option<DmaBuf> {
        self.inner.dma_alloc(len)
    }
    fn dma_read(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        if !self.whole_loans {
            self.pass();
        }
        self.inner.dma_read(buf, offset, out)
    }
    fn dma_peek(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        self.inner.dma_peek(buf, offset, out)
    }
    fn dma_write(&mut self, buf: &DmaBuf, offset: usize, data: &[u8]) {
        self.inner.dma_write(buf, offset, data)
    }
    fn serve_for(&mut self, budget: Duration) -> bool {
        if self.whole_loans {
            self.busy(budget);
        } else if budget >= PASS {
            // A loan at least a pass long: the pass; a shorter one is not taken.
            self.pass();
        }
        false
    }
    fn wait_interrupt(&mut self, vector: u16, timeout: Duration) -> bool {
        self.inner.wait_interrupt(vector, timeout)
    }
}

fn event(cat: &str, name: &str, tid: u32, ts: u64, dur: u64, correlation: u64, stream: Option<u32>) -> Value {
    let mut args = json!({"correlation": correlation});
    if let Some(s) = stream {
        args["stream"] = json!(s);
        args["device"] = json!(0);
    }
    let pid = if stream.is_some() { 0 } else { 1 };
    json!({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": T0 + ts, "dur": dur, "args": args})
}

/// Thread 1's `first` events, and meanwhile thread 2 launching `launches` 2 µs kernels on
/// stream 13, one every 8 µs from 20 µs on.
fn beside_launches(first: Vec<Value>, launches: u64) -> Plan {
    let mut e = first;
    for i in 0..launches {
        let (t, corr) = (20 + 8 * i, 10 + i);
        e.push(event("cuda_runtime", "cudaLaunchKernel", 2, t, 3, corr, None));
        e.push(event("kernel", "short", 13, t + 4, 2, corr, Some(13)));
    }
    let trace = parse(json!({ "traceEvents": e }).to_string().as_bytes(), "hand-made", Pick::ANY).unwrap();
    Plan::of(&trace)
}

/// Thread 1 launches a 4 ms kernel on stream 7 and synchronizes with the stream, beside
/// the launches ([`beside_launches`]).
fn sync_beside_launches(launches: u64) -> Plan {
    let first = vec![
        event("cuda_runtime", "cudaLaunchKernel", 1, 0, 4, 1, None),
        event("kernel", "long", 7, 5, 4000, 1, Some(7)),
        event("cuda_runtime", "cudaStreamSynchronize", 1, 10, 3996, 2, None),
    ];
    beside_launches(first, launches)
}

#[test]
fn a_look_at_host_memory_with_a_launch_due_does_not_make_it_wait_for_a_pass_over_the_link() {
    let launches = 300;
    let plan = sync_beside_launches(launches);
    let dev = SimGpu::new(tlp::Bdf::new(1, 0, 0), SimGpuParams::default());
    let inner = ConcurrentAttach::new(dev, 256 << 20).unwrap();
    let mut d = SimGpuDriver::open(SlowPasses { inner, passes: 0, whole_loans: false }).unwrap();
    let mut r = Replayer::new(&mut d, &plan).unwrap();
    let run = r.run(&mut d, &plan).unwrap();
    // A pass in front of each launch would make each about 100 µs late (30 ms in all): the
    // replay's own cost of a launch is a few µs, and this machine's noise a few ms.
    let late_ms = run.host_late_ns / 1e6;
    assert!(
        late_ms < 8.0,
        "the launches were {late_ms:.1} ms late in all (the latest {:.0} µs) with the platform's \
         passes {}: the synchronization's looks at host memory drove the link with launches due",
        run.host_late_max_ns / 1e3,
        d.pci().passes
    );
    // The synchronization was seen: the link was driven once no launch was due.
    assert!(d.pci().passes > 0);
}

/// Thread 1 copies 32 MiB in (traced as 1 µs, so the platform holds it longer) and
/// synchronizes with its stream for 50 ms, beside the launches ([`beside_launches`]).
fn copy_beside_launches(launches: u64) -> Plan {
    let first = vec![
        event("cuda_runtime", "cudaMemcpyAsync", 1, 0, 4, 1, None),
        json!({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7,
               "ts": T0 + 5, "dur": 1, "args": {"correlation": 1, "stream": 7, "device": 0, "bytes": 32 << 20}}),
        // Traced as waiting 50 ms: the launches traced meanwhile do not follow it.
        event("cuda_runtime", "cudaStreamSynchronize", 1, 10, 50_000, 2, None),
    ];
    beside_launches(first, launches)
}

/// The share of a copy's time the replay's thread served the platform: most of it while the
/// job only waits for the copy, little while another thread launches every 8 µs (a loan ends
/// 10 µs before each launch is due). A share recorded wrong — never, always, or the loans'
/// budgets rather than their time — fails one side or the other.
#[test]
fn a_copy_is_served_while_the_job_waits_and_not_between_launches_8_us_apart() {
    let share = |launches: u64| {
        let plan = copy_beside_launches(launches);
        let dev = SimGpu::new(tlp::Bdf::new(1, 0, 0), SimGpuParams::default());
        let inner = ConcurrentAttach::new(dev, 256 << 20).unwrap();
        let mut d = SimGpuDriver::open(SlowPasses { inner, passes: 0, whole_loans: true }).unwrap();
        let mut r = Replayer::new(&mut d, &plan).unwrap();
        let run = r.run(&mut d, &plan).unwrap();
        let copy_ms = (run.activity_end_ns[0] - run.activity_begin_ns[0]) / 1e6;
        (run.copy_served_share.0.expect("the copy is held beyond its traced 1 µs"), copy_ms)
    };
    let (waiting, copy_ms) = share(0);
    assert!(waiting > 0.6, "served {waiting:.2} of a {copy_ms:.1} ms copy the job only waited for");
    // 5,000 launches, 40 ms as traced: under way through the whole copy (30–110 ms on a
    // debug build here; 0.96–0.97 of it served waiting, 0.00–0.00003 with the launches).
    let (launching, copy_ms) = share(5_000);
    assert!(
        launching < 0.4 && launching < waiting,
        "served {launching:.2} of a {copy_ms:.1} ms copy with a launch due every 8 µs ({waiting:.2} waiting)"
    );
}
