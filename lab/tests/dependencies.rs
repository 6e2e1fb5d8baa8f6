//! Hand-made traces with known answers, one per kind of dependency the plan takes from a
//! trace: a stream waiting for an event, a synchronization (stated, and inferred in a trace
//! that does not say), a synchronous copy, `cudaFree`; each replayed with its work made
//! late (as through a slow link) and again with the dependency dropped from what the replay
//! follows, where the replay's verification must fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use driver::SimGpuDriver;
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use lab::plan::{DeviceEdge, Plan, Stated};
use lab::replay::{ReplayError, ReplayRun, Replayer};
use lab::trace::{Pick, Trace, parse};
use serde_json::{Value, json};
use testbed::concurrent::ConcurrentAttach;

/// The trace's clock starts here (µs).
const T0: u64 = 1_700_000_000_000_000;

fn runtime(name: &str, ts: u64, dur: u64, correlation: u64) -> Value {
    json!({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": T0 + ts, "dur": dur,
           "args": {"correlation": correlation, "cbid": 1}})
}

fn kernel(name: &str, stream: u32, ts: u64, dur: u64, correlation: u64) -> Value {
    json!({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": T0 + ts, "dur": dur,
           "args": {"correlation": correlation, "stream": stream, "device": 0}})
}

fn copy(name: &str, stream: u32, ts: u64, dur: u64, correlation: u64, bytes: u64) -> Value {
    json!({"ph": "X", "cat": "gpu_memcpy", "name": name, "pid": 0, "tid": stream, "ts": T0 + ts, "dur": dur,
           "args": {"correlation": correlation, "stream": stream, "device": 0, "bytes": bytes}})
}

/// A `cuda_sync` event of `kind` for the call of `correlation`, with `args` besides.
fn sync(kind: &str, ts: u64, correlation: u64, args: Value) -> Value {
    let mut a = json!({"cuda_sync_kind": kind, "correlation": correlation, "device": 0, "stream": -1});
    for (k, v) in args.as_object().unwrap() {
        a[k] = v.clone();
    }
    json!({"ph": "X", "cat": "cuda_sync", "name": kind, "pid": 0, "tid": 0, "ts": T0 + ts, "dur": 1, "args": a})
}

fn read(events: Vec<Value>) -> Trace {
    parse(json!({ "traceEvents": events }).to_string().as_bytes(), "hand-made", Pick::ANY).unwrap()
}

fn direct() -> SimGpuDriver<ConcurrentAttach<SimGpu>> {
    let dev = SimGpu::new(tlp::Bdf::new(1, 0, 0), SimGpuParams::default());
    SimGpuDriver::open(ConcurrentAttach::new(dev, 256 << 20).unwrap()).unwrap()
}

/// The tests that replay take the two cores in turn: a device thread and a launching thread
/// each, several at once, delay each other by milliseconds.
static CORES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn replay(plan: &Plan) -> Result<ReplayRun, ReplayError> {
    let _cores = CORES.lock().unwrap_or_else(|p| p.into_inner());
    let mut d = direct();
    let mut r = Replayer::new(&mut d, plan)?;
    r.run(&mut d, plan)
}

/// The verification's complaint, where the replay was refused for it.
fn refused(r: Result<ReplayRun, ReplayError>) -> String {
    match r {
        Err(ReplayError::Verification(why)) => why,
        Err(e) => panic!("refused for something else: {e}"),
        Ok(_) => panic!("verified, with a dependency dropped"),
    }
}

/// A copy in on stream 7, an event recorded after it, stream 13 waiting for the event, and
/// a kernel on stream 13 that must not start before the copy has landed.
fn event_wait(with_sync_events: bool) -> Trace {
    let mut e = vec![
        runtime("cudaMemcpyAsync", 0, 5, 1),
        copy("Memcpy HtoD (Pinned -> Device)", 7, 4, 1000, 1, 8 << 20),
        runtime("cudaEventRecord", 10, 2, 2),
        runtime("cudaStreamWaitEvent", 15, 2, 3),
        runtime("cudaLaunchKernel", 20, 5, 4),
        kernel("consumer_kernel", 13, 1006, 50, 4),
        runtime("cudaDeviceSynchronize", 30, 1030, 5),
    ];
    if with_sync_events {
        e.push(sync(
            "Stream Wait Event",
            15,
            3,
            json!({"stream": 13, "wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": 2}),
        ));
        e.push(sync("Context Sync", 30, 5, json!({})));
    }
    read(e)
}

#[test]
fn an_event_wait_holds_its_consumer_until_the_producers_copy_lands() {
    let t = event_wait(true);
    assert_eq!(t.sync_events, 2);
    let mut plan = Plan::of(&t);
    assert!(plan.explicit);
    assert_eq!((plan.stated_waits, plan.cross_stream_waits), (1, 0));
    assert_eq!(plan.activities[1].after.iter().filter(|e| e.1 == DeviceEdge::CrossStream).count(), 1);
    assert!(plan.stated.contains(&Stated::Activity { consumer: 1, producer: 0 }));
    // The copy three times as long as traced (a slow link): the kernel still waits for it.
    plan.activities[0].dur_ns *= 3;
    let run = replay(&plan).unwrap();
    assert!(
        run.activity_begin_ns[1] >= run.activity_end_ns[0],
        "{:?}",
        (run.activity_begin_ns, run.activity_end_ns)
    );
    // Dropped: the kernel starts while the copy is landing, and the verification says so.
    for a in &mut plan.activities {
        a.after.retain(|e| e.1 != DeviceEdge::CrossStream);
    }
    let why = refused(replay(&plan));
    assert!(why.contains("activity 1 began") && why.contains("which its stream waited for"), "{why}");
}

/// Without `cuda_sync` events the wait is inferred from timing, and counted so.
#[test]
fn a_trace_that_does_not_say_has_its_event_wait_inferred_and_counted() {
    let plan = Plan::of(&event_wait(false));
    assert!(!plan.explicit);
    assert_eq!((plan.stated_waits, plan.cross_stream_waits), (0, 1));
    assert!(!plan.stated.iter().any(|s| matches!(s, Stated::Activity { .. })));
}

/// A kernel on stream 7 that the trace shows done before its stream's synchronization began.
fn early_kernel_then_sync(with_sync_events: bool) -> Trace {
    let mut e = vec![
        runtime("cudaLaunchKernel", 0, 5, 1),
        kernel("k", 7, 4, 20, 1),
        runtime("cudaStreamSynchronize", 40, 3, 2),
    ];
    if with_sync_events {
        e.push(sync("Stream Sync", 40, 2, json!({"stream": 7})));
    }
    read(e)
}

#[test]
fn a_sync_waits_for_late_work_even_when_the_traced_one_returned_at_once() {
    for with_sync_events in [true, false] {
        let mut plan = Plan::of(&early_kernel_then_sync(with_sync_events));
        assert_eq!(plan.calls[1].awaits, vec![0], "sync events: {with_sync_events}");
        assert_eq!(plan.syncs_inferred, usize::from(!with_sync_events));
        // The kernel runs 2 ms instead of 20 µs: the synchronization returns after it.
        plan.activities[0].dur_ns = 2_000_000;
        let run = replay(&plan).unwrap();
        assert!(run.call_return_ns[1] >= run.activity_end_ns[0]);
        if with_sync_events {
            plan.calls[1].awaits.clear();
            let why = refused(replay(&plan));
            assert!(why.contains("call 1 (StreamSynchronize) returned"), "{why}");
        }
    }
}

#[test]
fn a_synchronous_copy_blocks_until_its_copy_is_done() {
    let t = read(vec![
        runtime("cudaMemcpy", 0, 100, 1),
        copy("Memcpy DtoH (Device -> Pinned)", 7, 10, 80, 1, 1 << 20),
        runtime("cudaMemcpyAsync", 200, 5, 2),
        copy("Memcpy DtoH (Device -> Pinned)", 7, 204, 80, 2, 1 << 20),
    ]);
    let mut plan = Plan::of(&t);
    assert_eq!(plan.calls[0].awaits, vec![0]);
    assert!(plan.calls[1].awaits.is_empty(), "an asynchronous copy of pinned memory does not block");
    assert_eq!(plan.implicit_syncs, 1);
    plan.activities[0].dur_ns = 3_000_000;
    let run = replay(&plan).unwrap();
    assert!(run.call_return_ns[0] >= run.activity_end_ns[0]);
    plan.calls[0].awaits.clear();
    let why = refused(replay(&plan));
    assert!(why.contains("call 0 (Memcpy) returned"), "{why}");
}

#[test]
fn cuda_free_waits_for_the_device() {
    let t = read(vec![
        runtime("cudaLaunchKernel", 0, 5, 1),
        kernel("k", 7, 4, 20, 1),
        runtime("cudaLaunchKernel", 6, 5, 2),
        kernel("k2", 13, 10, 30, 2),
        runtime("cudaFree", 60, 10, 3),
    ]);
    let plan = Plan::of(&t);
    let mut awaited = plan.calls[2].awaits.clone();
    awaited.sort_unstable();
    assert_eq!(awaited, vec![0, 1]);
    assert_eq!(plan.implicit_syncs, 1);
}

/// An event synchronization waits for the work issued on the event's stream before it was
/// recorded, not for work issued after; `cudaEventQuery`, which Kineto reports as an event
/// sync too, waits for nothing.
#[test]
fn an_event_sync_waits_for_what_was_recorded_and_a_query_for_nothing() {
    let t = read(vec![
        runtime("cudaLaunchKernel", 0, 5, 1),
        kernel("before", 7, 4, 20, 1),
        runtime("cudaEventRecord", 8, 2, 2),
        runtime("cudaLaunchKernel", 12, 5, 3),
        kernel("after", 7, 24, 500, 3),
        runtime("cudaEventQuery", 20, 2, 4),
        sync("Event Sync", 20, 4, json!({"wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": 2})),
        runtime("cudaEventSynchronize", 30, 3, 5),
        sync("Event Sync", 30, 5, json!({"wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": 2})),
    ]);
    let plan = Plan::of(&t);
    assert!(plan.calls[3].awaits.is_empty());
    assert_eq!(plan.calls[4].awaits, vec![0]);
    assert_eq!(plan.syncs_inferred, 0);
    replay(&plan).unwrap();
}

#[test]
fn a_collective_is_told_apart() {
    let t = read(vec![
        runtime("cudaLaunchKernel", 0, 5, 1),
        kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            7,
            4,
            300,
            1,
        ),
        runtime("cudaLaunchKernel", 6, 5, 2),
        kernel("void at::native::vectorized_elementwise_kernel<4>", 7, 310, 20, 2),
    ]);
    assert_eq!(t.collectives(), (1, 300_000));
}

/// The shared small A100 trace says what each of its synchronizations waited for.
#[test]
fn the_small_a100_traces_synchronizations_are_taken_as_it_states_them() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/a100-event-sync-small.json.gz");
    let t = lab::trace::read(&path, Pick::ANY).unwrap();
    assert_eq!(t.sync_events, 4);
    let plan = Plan::of(&t);
    assert!(plan.explicit);
    assert_eq!((plan.syncs_inferred, plan.cross_stream_waits), (0, 0));
    let syncing = plan.calls.iter().filter(|c| !c.awaits.is_empty()).count();
    assert_eq!(syncing, 4, "a copy into pageable memory; a stream, an event and a device synchronization");
}

/// Forty streams, each given one 2 ms kernel at once: each runs on a channel of its own, all
/// at the same time, as a GPU runs independent streams (the simgpu has 63 channels for
/// streams; with 15 they shared channels in turn and ran one after another, a false
/// serialization: 6 ms).
#[test]
fn forty_streams_run_side_by_side() {
    let mut e = Vec::new();
    for s in 0..40u32 {
        let corr = u64::from(s) + 1;
        e.push(runtime("cudaLaunchKernel", u64::from(s) * 3, 2, corr));
        e.push(kernel("k", 100 + s, u64::from(s) * 3 + 2, 2_000, corr));
    }
    e.push(runtime("cudaDeviceSynchronize", 130, 2_000, 1000));
    let plan = Plan::of(&read(e));
    // Judged on the best of five runs: a launch thread descheduled for milliseconds delays
    // kernels as a shared channel would.
    let _cores = CORES.lock().unwrap_or_else(|p| p.into_inner());
    let mut d = direct();
    let mut r = Replayer::new(&mut d, &plan).unwrap();
    let best = (0..5)
        .map(|_| r.run(&mut d, &plan).unwrap())
        .min_by(|a, b| a.fetch_wait_ns.total_cmp(&b.fetch_wait_ns))
        .unwrap();
    // A kernel waiting behind another stream's on a shared channel waits 2 ms with its
    // command unfetched: with fifteen channels for forty streams, 25 of them, 50 ms in all.
    eprintln!("fetch wait {} ms, span {} ms", best.fetch_wait_ns / 1e6, best.gpu_span_ns / 1e6);
    assert!(best.fetch_wait_ns < 10e6, "kernels waited {} ms unfetched in all", best.fetch_wait_ns / 1e6);
    assert!(best.gpu_span_ns < 4e6, "span {} ns for forty 2 ms kernels side by side", best.gpu_span_ns);
    assert_eq!(plan.streams_sharing_channels(lab::replay::STREAM_CHANNELS), 0);
}

/// A broken trace whose event is recorded after the wait on it names a producer issued after
/// the waiting work: that wait is not taken (the consumer's call would wait for a later
/// call's submission, which waits for it), and the replay runs to its end.
#[test]
fn a_wait_on_an_event_recorded_later_is_not_taken_and_does_not_stall() {
    let t = read(vec![
        runtime("cudaStreamWaitEvent", 10, 2, 3),
        sync(
            "Stream Wait Event",
            10,
            3,
            json!({"stream": 13, "wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": 5}),
        ),
        runtime("cudaLaunchKernel", 15, 2, 4),
        kernel("consumer", 13, 16, 50, 4),
        runtime("cudaLaunchKernel", 20, 2, 6),
        kernel("producer", 7, 21, 50, 6),
        runtime("cudaEventRecord", 30, 2, 5),
        runtime("cudaDeviceSynchronize", 40, 40, 7),
        sync("Context Sync", 40, 7, json!({})),
    ]);
    let plan = Plan::of(&t);
    assert_eq!(plan.stated_waits, 0);
    replay(&plan).unwrap();
}

/// `cuda_sync` events as a file may carry them wrongly: a value of the wrong type or a stream
/// sync naming no stream refused naming the event and field; a kind this reader does not know
/// skipped and counted; an event never recorded (-1) waited for by nothing.
#[test]
fn malformed_sync_events_are_refused_or_skipped_saying_so() {
    let base = || {
        vec![
            runtime("cudaLaunchKernel", 0, 5, 1),
            kernel("k", 7, 4, 20, 1),
            runtime("cudaStreamSynchronize", 40, 3, 2),
        ]
    };
    let parse_with = |extra: Value| {
        let mut e = base();
        e.push(extra);
        parse(json!({ "traceEvents": e }).to_string().as_bytes(), "bad", Pick::ANY)
    };
    let e = parse_with(sync("Stream Sync", 40, 2, json!({"stream": "seven"}))).unwrap_err();
    assert!(e.to_string().contains("traceEvents[3]") && e.to_string().contains("stream"), "{e}");
    let e = parse_with(sync("Stream Sync", 40, 2, json!({}))).unwrap_err();
    assert!(e.to_string().contains("missing or none for a stream synchronization"), "{e}");
    let e = parse_with(sync(
        "Event Sync",
        40,
        2,
        json!({"wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": 1.5}),
    ))
    .unwrap_err();
    assert!(e.to_string().contains("wait_on_cuda_event_record_corr_id"), "{e}");
    let t = parse_with(sync("Some Future Sync", 40, 2, json!({"stream": 7}))).unwrap();
    assert_eq!((t.sync_events, t.skipped), (0, 1));
    let t = parse_with(sync(
        "Event Sync",
        40,
        2,
        json!({"wait_on_stream": -1, "wait_on_cuda_event_record_corr_id": -1}),
    ))
    .unwrap();
    assert_eq!(t.sync_events, 1);
    let plan = Plan::of(&t);
    assert!(plan.explicit && plan.calls[1].awaits.is_empty(), "{:?}", plan.calls[1]);
}

/// The calibration's copy sizes are the job's own: each way, the size that carries the
/// median byte of its copies (a job of many small copies and a few large ones is timed at
/// the large ones, which move its bytes); none where it copies nothing that way.
#[test]
fn a_calibration_times_copies_at_the_sizes_that_carry_the_jobs_bytes() {
    let mut e = Vec::new();
    // Host → device: ten of 4 KiB and two of 8 MiB (the bytes are in the large ones).
    for i in 0..12u64 {
        let bytes = if i < 10 { 4096 } else { 8 << 20 };
        e.push(runtime("cudaMemcpyAsync", i * 100, 5, i + 1));
        e.push(copy("Memcpy HtoD (Pinned -> Device)", 7, i * 100 + 10, 50, i + 1, bytes));
    }
    // Device → host: three of 1 MiB.
    for i in 12..15u64 {
        e.push(runtime("cudaMemcpyAsync", i * 100, 5, i + 1));
        e.push(copy("Memcpy DtoH (Device -> Pinned)", 7, i * 100 + 10, 50, i + 1, 1 << 20));
    }
    let plan = Plan::of(&read(e.clone()));
    assert_eq!(plan.copy_sizes(), (Some(8 << 20), Some(1 << 20)));
    assert_eq!(lab::compare::rate_sizes(Some(&plan)), (8 << 20, 1 << 20));
    // Without device → host copies: none that way, and the calibration's default there.
    let plan = Plan::of(&read(e[..24].to_vec()));
    assert_eq!(plan.copy_sizes(), (Some(8 << 20), None));
    assert_eq!(lab::compare::rate_sizes(Some(&plan)), (8 << 20, 16 << 20));
    assert_eq!(lab::compare::rate_sizes(None), (16 << 20, 16 << 20));
}
