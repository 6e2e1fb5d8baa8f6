//! The trace reader on the real traces in `testbed/traces` (A100 and V100 training jobs, an
//! A100 event-sync case) and on hand-made edge cases: what it keeps, how fast, and the errors
//! that name the event and the field.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use testbed::trace::{ActivityKind, CallKind, CopyKind, TraceError, parse, read};

fn traces() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces")
}

#[test]
fn the_a100_training_trace_reads_as_its_readme_describes_within_seconds_in_a_debug_build() {
    let t0 = Instant::now();
    let t = read(&traces().join("a100-training-8k-kernels.json.gz"), None).unwrap();
    let took = t0.elapsed();
    // A debug build; the release build is several times faster.
    assert!(took.as_secs_f64() < 3.0, "{took:?}");
    eprintln!("a 1.8 MB gzip trace read in {took:?}");
    assert_eq!(t.gpu.as_deref(), Some("NVIDIA A100-PG509-200"));
    assert_eq!(t.rank, Some(3));
    let (kernels, copies, memsets) = t.counts();
    assert_eq!((kernels, copies, memsets), (8568, 228, 654));
    assert_eq!(t.streams().into_iter().collect::<Vec<_>>(), [7, 20, 21, 22]);
    let pinned: Vec<u64> = t
        .activities
        .iter()
        .filter_map(|a| match a.kind {
            ActivityKind::Memcpy { kind: CopyKind::HtoDPinned, bytes } => Some(bytes),
            _ => None,
        })
        .collect();
    assert_eq!(pinned.len(), 150);
    let mb = pinned.iter().sum::<u64>() as f64 / 1e6;
    assert!((400.0..450.0).contains(&mb), "{mb} MB pinned host→device");
    assert_eq!(t.calls.iter().filter(|c| c.kind == CallKind::StreamSynchronize).count(), 60);
    let span = t.gpu_span_ns() as f64 / 1e6;
    assert!((400.0..520.0).contains(&span), "{span} ms");
    // Every kernel came from a launch the trace holds.
    let launches: std::collections::HashSet<u64> =
        t.calls.iter().filter(|c| c.kind == CallKind::LaunchKernel).filter_map(|c| c.correlation).collect();
    assert!(
        t.activities
            .iter()
            .filter(|a| a.kind == ActivityKind::Kernel)
            .all(|a| launches.contains(&a.correlation))
    );
    // Times are ordered, and relative to the first event.
    assert!(t.activities.windows(2).all(|w| w[0].start_ns <= w[1].start_ns));
    assert!(t.calls.first().unwrap().start_ns < 1_000_000_000);
}

#[test]
fn the_v100_trace_has_one_stream_and_device_to_device_copies() {
    let t = read(&traces().join("v100-training-4k-kernels.json.gz"), None).unwrap();
    assert_eq!(t.gpu.as_deref(), Some("Tesla V100-SXM2-32GB"));
    let (kernels, copies, _) = t.counts();
    assert_eq!((kernels, copies), (4350, 1600));
    assert_eq!(t.streams().len(), 1);
    assert!(t.activities.iter().filter(|a| matches!(a.kind, ActivityKind::Memcpy { .. })).all(|a| a.kind
        == ActivityKind::Memcpy {
            kind: CopyKind::DtoD,
            bytes: match a.kind {
                ActivityKind::Memcpy { bytes, .. } => bytes,
                _ => 0,
            }
        }));
}

#[test]
fn the_event_sync_case_keeps_its_syncs_and_event_calls() {
    let t = read(&traces().join("a100-event-sync-small.json.gz"), Some(0)).unwrap();
    let (kernels, copies, _) = t.counts();
    assert_eq!((kernels, copies), (4, 1));
    let kinds: Vec<CallKind> = t.calls.iter().map(|c| c.kind).collect();
    for k in [
        CallKind::LaunchKernel,
        CallKind::Memcpy,
        CallKind::StreamSynchronize,
        CallKind::EventRecord,
        CallKind::EventSynchronize,
        CallKind::EventQuery,
        CallKind::DeviceSynchronize,
    ] {
        assert!(kinds.contains(&k), "{k:?} missing: {kinds:?}");
    }
    assert_eq!(t.syncs(), 3);
}

fn event(cat: &str, name: &str, ts: &str, dur: &str, args: &str) -> String {
    format!(
        r#"{{"ph":"X","cat":"{cat}","name":"{name}","pid":1,"tid":1,"ts":{ts},"dur":{dur},"args":{{{args}}}}}"#
    )
}

fn trace(events: &[String]) -> Vec<u8> {
    format!(r#"{{"deviceProperties":[{{"id":0,"name":"Test GPU"}}],"traceEvents":[{}]}}"#, events.join(","))
        .into_bytes()
}

#[test]
fn edge_cases_are_taken_or_refused_naming_the_event_and_field() {
    let launch = |ts: &str, c: u32| {
        event("cuda_runtime", "cudaLaunchKernel", ts, "5", &format!(r#""correlation":{c}"#))
    };
    let kernel = |ts: &str, c: u32| {
        event("kernel", "k", ts, "7", &format!(r#""correlation":{c},"stream":7,"device":0"#))
    };
    // Out of order, an unknown call, a zero-length copy, a launch whose kernel is missing.
    let t = parse(
        &trace(&[
            kernel("1000.5", 2),
            launch("990", 2),
            event("cuda_runtime", "cudaSomethingNew", "980", "1", ""),
            event(
                "gpu_memcpy",
                "Memcpy HtoD (Pinned -> Device)",
                "1010",
                "0",
                r#""correlation":3,"stream":7,"device":0,"bytes":0"#,
            ),
            launch("995", 9),
            event("cpu_op", "aten::add", "970", "50", ""),
        ]),
        "t.json",
        None,
    )
    .unwrap();
    assert_eq!(t.gpu.as_deref(), Some("Test GPU"));
    assert_eq!(
        t.calls.iter().map(|c| c.kind).collect::<Vec<_>>(),
        [CallKind::Other, CallKind::LaunchKernel, CallKind::LaunchKernel]
    );
    assert_eq!(t.calls[0].start_ns, 0, "relative to the first event kept");
    assert_eq!(t.activities[0].start_ns, 20_500, "ns, to the digit");
    assert_eq!(t.activities[1].kind, ActivityKind::Memcpy { kind: CopyKind::HtoDPinned, bytes: 0 });
    assert_eq!(t.unmatched_launches, 1);
    assert_eq!(t.skipped, 1);

    // Missing correlation on a kernel: refused, naming the event's index and the field.
    let e = parse(&trace(&[launch("1", 1), event("kernel", "k", "2", "1", r#""stream":7"#)]), "t.json", None)
        .unwrap_err();
    assert!(matches!(e, TraceError::BadEvent { index: 1, field: "args.correlation", .. }), "{e}");
    assert!(e.to_string().contains("traceEvents[1] (k): args.correlation: missing"), "{e}");
    // A bad time.
    let e = parse(
        &trace(&[event("kernel", "k", r#""soon""#, "1", r#""correlation":1,"stream":7"#)]),
        "t.json",
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("ts: soon is not a time"), "{e}");
    // A copy without its bytes.
    let e = parse(
        &trace(&[event(
            "gpu_memcpy",
            "Memcpy DtoH (Device -> Pinned)",
            "1",
            "1",
            r#""correlation":1,"stream":7"#,
        )]),
        "t.json",
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("args.bytes: missing"), "{e}");
    // Not JSON, truncated JSON, JSON without events, and nothing on the GPU.
    for (text, says) in [
        (&b"garbage"[..], "not a PyTorch profiler trace"),
        (&br#"{"traceEvents":[{"ph":"X""#[..], "not a PyTorch profiler trace"),
        (&br#"{"schemaVersion":1}"#[..], "no traceEvents"),
        (&br#"{"traceEvents":[]}"#[..], "no kernels, copies or memsets"),
    ] {
        let e = parse(text, "t.json", None).unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
    }
    // Two GPUs and no rank: which one must be said; with one, its activities only.
    let two = trace(&[
        event("kernel", "k", "1", "1", r#""correlation":1,"stream":7,"device":0"#),
        event("kernel", "k", "2", "1", r#""correlation":2,"stream":7,"device":1"#),
    ]);
    let e = parse(&two, "t.json", None).unwrap_err();
    assert!(matches!(e, TraceError::SeveralDevices { .. }), "{e}");
    assert_eq!(parse(&two, "t.json", Some(1)).unwrap().activities.len(), 1);
}

#[test]
fn a_truncated_gzip_is_an_error_not_a_panic() {
    let whole = std::fs::read(traces().join("a100-event-sync-small.json.gz")).unwrap();
    let dir = std::env::temp_dir().join(format!("dxpu-trace-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cut = dir.join("cut.json.gz");
    std::fs::File::create(&cut).unwrap().write_all(&whole[..whole.len() / 2]).unwrap();
    let e = read(&cut, None).unwrap_err();
    assert!(matches!(e, TraceError::Io { .. } | TraceError::NotATrace { .. }), "{e}");
    assert!(e.to_string().contains("cut.json.gz"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
