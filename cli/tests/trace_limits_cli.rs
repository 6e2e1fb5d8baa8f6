//! `dxpu model --trace` and `dxpu replay` on input made to exhaust memory or hang them
//! (docs/reliability.md, *Input that cannot exhaust*): `/dev/zero`, a gzip bomb, a FIFO, a
//! time at 0 among this year's — each refused within seconds, naming what is wrong — and a
//! trace of 10,000 threads read and predicted within seconds, all under 256 MB; and a replay
//! that SIGINT ends within a second. Its own test binary, so that the children's peak
//! memory (`RUSAGE_CHILDREN`) is these commands' alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::*;

/// `dxpu model --trace PATH`, killed if it runs past 30 s; its output and how long it took.
fn model(path: &Path) -> (Output, Duration) {
    let t = Instant::now();
    let child = dxpu()
        .args(["model", "--rtt-us", "10", "--trace"])
        .arg(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(30));
        let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
    });
    let out = child.wait_with_output().unwrap();
    drop(killer);
    (out, t.elapsed())
}

fn event(cat: &str, name: &str, tid: u64, ts: u64, dur: u64, args: &str) -> String {
    format!(
        r#"{{"ph":"X","cat":"{cat}","name":"{name}","pid":1,"tid":{tid},"ts":{ts},"dur":{dur},"args":{{{args}}}}}"#
    )
}

/// A launch on each of `threads` threads and its kernel, from `base` µs, and the extra events.
fn trace(threads: u64, base: u64, extra: &[String]) -> String {
    let mut ev = Vec::new();
    for i in 0..threads {
        let ts = base + 10 * i;
        ev.push(event("cuda_runtime", "cudaLaunchKernel", 100 + i, ts, 4, &format!(r#""correlation":{i}"#)));
        ev.push(event("kernel", "k", 0, ts + 5, 3, &format!(r#""correlation":{i},"stream":7,"device":0"#)));
    }
    ev.extend_from_slice(extra);
    format!(r#"{{"traceEvents":[{}]}}"#, ev.join(","))
}

#[test]
fn hostile_traces_are_refused_within_seconds_and_a_huge_one_read_all_under_256_mb() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("hostile-traces");
    // A gzip bomb: 400 gzip members of 1 MiB of JSON whitespace each (400 MiB inflated), a
    // file of about 400 KB.
    let bomb = dir.join("bomb.json.gz");
    let member = {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&vec![b' '; 1 << 20]).unwrap();
        gz.finish().unwrap()
    };
    let mut f = std::fs::File::create(&bomb).unwrap();
    f.write_all(&member.repeat(400)).unwrap();
    drop(f);
    // A FIFO nobody writes.
    let fifo = dir.join("fifo.json");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // One call at time 0 among 2024's times (1.7e15 µs).
    let outlier = dir.join("outlier.json");
    let zero = event("cuda_runtime", "cudaEventQuery", 1, 0, 1, "");
    std::fs::write(&outlier, trace(20, 1_707_417_525_512_145, &[zero])).unwrap();
    // A duration of 9.2e9 s.
    let long = dir.join("long.json");
    let kernel = event(
        "kernel",
        "k",
        0,
        1_707_417_525_512_200,
        9_200_000_000_000_000,
        r#""correlation":1,"stream":7"#,
    );
    std::fs::write(&long, trace(20, 1_707_417_525_512_145, &[kernel])).unwrap();
    for (path, says) in [
        (Path::new("/dev/zero"), "a character device, not a regular file"),
        (bomb.as_path(), "inflates past 100 times"),
        (fifo.as_path(), "a FIFO, not a regular file"),
        (outlier.as_path(), "traceEvents[40] (cudaEventQuery): ts"),
        (long.as_path(), "traceEvents[40] (k): dur"),
    ] {
        let (out, took) = model(path);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", path.display());
        assert!(err.contains(says), "{}: {err}", path.display());
        assert!(took < Duration::from_secs(10), "{}: {took:?}", path.display());
        eprintln!("{}: refused in {took:.2?}: {}", path.display(), err.trim());
    }
    // 10,000 threads, one launch each: read, planned and predicted (linear in the calls).
    let many = dir.join("threads.json");
    std::fs::write(&many, trace(10_000, 1_707_417_525_512_145, &[])).unwrap();
    let (out, took) = model(&many);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(took < Duration::from_secs(10), "10,000 threads: {took:?}");
    eprintln!("10,000 threads: predicted in {took:.2?}");
    let peak_kib =
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap().max_rss();
    eprintln!("peak memory of the commands: {} MiB", peak_kib / 1024);
    assert!(peak_kib < 256 * 1024, "a command took {} MiB", peak_kib / 1024);
    let _ = std::fs::remove_dir_all(dir);
}

/// SIGINT, and SIGTERM, to a replay in progress: it exits within a second, with 130 (143).
#[test]
fn sigint_or_sigterm_ends_a_replay_within_a_second() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/traces/v100-training-4k-kernels.json.gz");
    use rustix::process::Signal;
    for (signal, code) in [(Signal::INT, 130), (Signal::TERM, 143)] {
        let mut child = dxpu()
            .args(["replay", "--repeat", "5"])
            .arg(&trace)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Well into it: the trace read, replays running.
        std::thread::sleep(Duration::from_secs(3));
        assert!(child.try_wait().unwrap().is_none(), "the replay ended before {signal:?}");
        let t = Instant::now();
        rustix::process::kill_process(rustix::process::Pid::from_child(&child), signal).unwrap();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "still running 5 s after {signal:?}");
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = t.elapsed();
        assert!(took < Duration::from_secs(1), "ended {took:?} after {signal:?}");
        assert_eq!(status.code(), Some(code), "{signal:?}: {status}");
        eprintln!("replay ended {took:.2?} after {signal:?}");
    }
}

/// `--max-trace-bytes` reaches the reader: a real trace past it is refused before it is read,
/// naming the flag.
#[test]
fn max_trace_bytes_refuses_a_trace_past_it() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/traces/a100-event-sync-small.json.gz");
    let limit = ["--max-trace-bytes", "1000"];
    for cmd in
        [&["model", limit[0], limit[1], "--rtt-us", "10", "--trace"][..], &["replay", limit[0], limit[1]][..]]
    {
        let out = dxpu().args(cmd).arg(&trace).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {err}");
        assert!(err.contains("past the limit of 1000 bytes (--max-trace-bytes)"), "{cmd:?}: {err}");
    }
}
