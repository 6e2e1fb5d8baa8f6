//! PyTorch profiler (Kineto) traces read for replay and for the performance model: the Chrome
//! trace JSON that `torch.profiler` writes (plain or gzip), reduced to what a GPU and its
//! driver did — the CUDA (or HIP) runtime calls the CPU made, with their times and threads,
//! and the GPU activities they caused (kernels, copies with their kind and bytes, memsets),
//! with their streams, tied to their calls by `correlation`.
//!
//! Times are kept in nanoseconds from the trace's first kept event: Kineto writes
//! microseconds, with a fraction where it has nanoseconds, and an f64 cannot hold today's
//! epoch microseconds to the nanosecond, so each time is read from its digits.
//!
//! Nothing in a file panics this reader: what is not JSON, truncated, or lacks a field that
//! replay needs is an error naming the event (its index in `traceEvents`) and the field.
//!
//! Nor does a file exhaust memory or hang it ([`ReadLimits`]): only regular files are read
//! (a FIFO would block, `/dev/zero` never ends); the file and the JSON it inflates to are
//! capped, and a gzip stream may not inflate past [`MAX_GZIP_RATIO`] times its size; the
//! JSON streams through `scan`, one event at a time, so memory is bounded by what is kept
//! (the calls and activities, some 100 bytes each) and the largest event; times and
//! durations that no profiler run can have (an event days away from the others) are refused
//! naming the event.

mod error;
mod job;
mod scan;

pub use error::TraceError;
pub use job::{
    ASSUMED_COPY_BYTES_PER_S, ActivityKind, Assumed, CallKind, CopyKind, GpuActivity, Recorded, RuntimeCall,
    SyncSaid, Trace,
};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::Deserialize;
use serde_json::value::RawValue;

use scan::{Piece, ScanError, scan};

/// Bounds on what a trace file may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    /// The most bytes of the file as stored, and of the JSON it inflates to.
    pub max_bytes: u64,
}

impl Default for ReadLimits {
    /// 16 GiB: a day of a busy job's events, far beyond the traces people share (1–500 MB).
    fn default() -> ReadLimits {
        ReadLimits { max_bytes: 16 << 30 }
    }
}

/// A gzip trace may inflate to at most this many times its size (and at least 256 MiB):
/// Kineto's JSON compresses 10–20 times; a stream that inflates further is a gzip bomb.
pub const MAX_GZIP_RATIO: u64 = 100;

/// No profiler trace spans more than this (ns): events farther apart, or a duration longer,
/// are a broken clock or a broken file.
pub const MAX_SPAN_NS: u128 = 24 * 3600 * 1_000_000_000;

#[derive(Deserialize)]
struct DeviceProperties {
    id: Option<u32>,
    name: Option<String>,
}

#[derive(Deserialize)]
struct DistributedInfo {
    rank: Option<u32>,
}

#[derive(Deserialize)]
struct Event<'a> {
    ph: Option<&'a str>,
    cat: Option<&'a str>,
    #[serde(borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
    tid: Option<&'a RawValue>,
    ts: Option<&'a RawValue>,
    dur: Option<&'a RawValue>,
    #[serde(default, borrow)]
    args: Option<BTreeMap<&'a str, &'a RawValue>>,
}

/// Which GPU's work to take from a trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pick {
    /// The distributed rank the trace must be of (its `distributedInfo.rank`): a trace of
    /// another rank, or of none, is refused.
    pub rank: Option<u32>,
    /// The device whose activities to keep, where the file holds several (the only one if
    /// `None`).
    pub device: Option<u32>,
}

impl Pick {
    /// The trace's only GPU, whatever its rank.
    pub const ANY: Pick = Pick { rank: None, device: None };
}

/// Reads the trace at `path` (gzip if it starts so), keeping the GPU `pick` asks for,
/// within the default [`ReadLimits`].
pub fn read(path: &Path, pick: Pick) -> Result<Trace, TraceError> {
    read_with(path, pick, ReadLimits::default())
}

/// [`read`] within `limits`.
pub fn read_with(path: &Path, pick: Pick, limits: ReadLimits) -> Result<Trace, TraceError> {
    let at = path.display().to_string();
    let io = |error| TraceError::Io { path: at.clone(), error };
    // Looked at before it is opened: opening a FIFO blocks until a writer comes.
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(TraceError::NotAFile { path: at, what: file_kind(&meta) });
    }
    let too_large = |why: String| TraceError::TooLarge { path: at.clone(), why };
    if meta.len() > limits.max_bytes {
        return Err(too_large(format!(
            "{} bytes, past the limit of {} bytes (--max-trace-bytes)",
            meta.len(),
            limits.max_bytes
        )));
    }
    let mut file = BufReader::with_capacity(1 << 16, std::fs::File::open(path).map_err(io)?);
    let gzip = file.fill_buf().map_err(io)?.starts_with(&[0x1f, 0x8b]);
    let (cap, why) = if gzip {
        let ratio_cap = (meta.len().saturating_mul(MAX_GZIP_RATIO)).max(256 << 20);
        match ratio_cap < limits.max_bytes {
            true => (
                ratio_cap,
                format!(
                    "its gzip stream inflates past {MAX_GZIP_RATIO} times the file's {} bytes (a gzip bomb?): \
                 a real trace compresses 10–20 times; gunzip it and give the JSON if it is one",
                    meta.len()
                ),
            ),
            false => (
                limits.max_bytes,
                format!("it inflates past the limit of {} bytes (--max-trace-bytes)", limits.max_bytes),
            ),
        }
    } else {
        (limits.max_bytes, format!("it grew past the limit of {} bytes while read", limits.max_bytes))
    };
    let result = if gzip {
        let inflated = Capped { inner: flate2::bufread::MultiGzDecoder::new(file), left: cap };
        parse_from(BufReader::with_capacity(1 << 16, inflated), &at, pick)
    } else {
        parse_from(Capped { inner: file, left: cap }, &at, pick)
    };
    result.map_err(|e| match e {
        TraceError::Io { error, .. } if error.get_ref().is_some_and(|e| e.is::<PastCap>()) => too_large(why),
        e => e,
    })
}

/// What a path that is not a regular file is.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    match () {
        _ if t.is_dir() => "a directory",
        _ if t.is_fifo() => "a FIFO",
        _ if t.is_char_device() => "a character device",
        _ if t.is_block_device() => "a block device",
        _ if t.is_socket() => "a socket",
        _ => "not a file",
    }
}

/// The marker error of a [`Capped`] reader past its cap.
#[derive(Debug)]
struct PastCap;

impl std::fmt::Display for PastCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("past the size limit")
    }
}

impl std::error::Error for PastCap {}

/// A reader that fails once more than `left` bytes were asked of it.
struct Capped<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| std::io::Error::other(PastCap))?;
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Capped<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        let left = self.left;
        let b = self.inner.fill_buf()?;
        if b.len() as u64 > left {
            return Err(std::io::Error::other(PastCap));
        }
        Ok(b)
    }
    fn consume(&mut self, n: usize) {
        self.left = self.left.saturating_sub(n as u64);
        self.inner.consume(n);
    }
}

/// Parses trace JSON (`what` names it in errors).
pub fn parse(text: &[u8], what: &str, pick: Pick) -> Result<Trace, TraceError> {
    parse_from(text, what, pick)
}

/// Parses trace JSON as it streams from `r`: one event at a time.
fn parse_from(r: impl BufRead, what: &str, pick: Pick) -> Result<Trace, TraceError> {
    let not = |why: String| TraceError::NotATrace { path: what.to_string(), why };
    let mut events = Events::default();
    let mut device_properties: Vec<DeviceProperties> = Vec::new();
    let mut distributed: Option<DistributedInfo> = None;
    let mut failed = None;
    let scanned = scan(r, "traceEvents", |piece| {
        let done = match piece {
            Piece::Element(bytes) => read_event(&mut events, bytes, what),
            Piece::Member("deviceProperties", v) => serde_json::from_slice(v)
                .map(|d| device_properties = d)
                .map_err(|e| not(format!("deviceProperties: {e}"))),
            Piece::Member("distributedInfo", v) => serde_json::from_slice(v)
                .map(|d| distributed = d)
                .map_err(|e| not(format!("distributedInfo: {e}"))),
            Piece::Member(..) => Ok(()),
        };
        done.map_err(|e| failed = Some(e)).is_ok()
    });
    match scanned {
        Ok(true) => {}
        Ok(false) => return Err(not("no traceEvents".into())),
        Err(ScanError::Stopped) => return Err(failed.unwrap_or_else(|| not("stopped".into()))),
        Err(ScanError::Io(error)) => return Err(TraceError::Io { path: what.to_string(), error }),
        Err(e) => return Err(not(e.to_string())),
    }
    events.check_span(what)?;
    let assumed = events.resolve_bytes();
    let mut t = Trace { rank: distributed.and_then(|d| d.rank), assumed, ..Trace::default() };
    if let Some(asked) = pick.rank
        && t.rank != Some(asked)
    {
        return Err(TraceError::NotThatRank { path: what.to_string(), asked, named: t.rank });
    }
    let Events { activities, calls, origin, skipped, syncs, profiler_ranges, .. } = events;
    t.skipped = skipped;
    let devices: BTreeSet<u32> = activities.iter().map(|(d, _, _)| *d).collect();
    let device = match (pick.device, devices.len()) {
        (Some(r), _) => r,
        (None, 0 | 1) => devices.first().copied().unwrap_or(0),
        (None, _) => {
            return Err(TraceError::SeveralDevices {
                path: what.to_string(),
                devices: devices.into_iter().collect(),
            });
        }
    };
    t.device = device;
    let origin = origin.unwrap_or(0);
    let rel = |ns: u128| u64::try_from(ns.saturating_sub(origin)).unwrap_or(u64::MAX);
    t.activities = activities
        .into_iter()
        .filter(|(d, _, _)| *d == device)
        .map(|(_, ts, mut a)| {
            a.start_ns = rel(ts);
            a
        })
        .collect();
    if t.activities.is_empty() {
        if profiler_ranges > 0 && devices.is_empty() {
            return Err(TraceError::ProfilerRangesOnly { path: what.to_string(), ranges: profiler_ranges });
        }
        return Err(TraceError::Empty { path: what.to_string(), device: pick.device });
    }
    // The calls that go with the kept activities' device: the process that made them (a
    // file of several ranks has several).
    let kept: HashMap<u64, ()> = t.activities.iter().map(|a| (a.correlation, ())).collect();
    t.calls = calls
        .into_iter()
        .map(|(ts, mut c)| {
            c.start_ns = rel(ts);
            c
        })
        .collect();
    if devices.len() > 1 {
        // Keep the threads whose calls caused this device's activities.
        let threads: BTreeSet<u64> = t
            .calls
            .iter()
            .filter(|c| c.correlation.is_some_and(|k| kept.contains_key(&k)))
            .map(|c| c.thread)
            .collect();
        t.calls.retain(|c| threads.contains(&c.thread));
    }
    // What the trace's synchronization events say each call waited for.
    let said: HashMap<u64, SyncSaid> =
        syncs.iter().filter(|(d, _, _)| *d == device).map(|&(_, k, s)| (k, s)).collect();
    for c in &mut t.calls {
        c.waited = c.correlation.and_then(|k| said.get(&k).copied());
    }
    t.sync_events = said.len() as u64;
    t.gpu = device_properties
        .iter()
        .find(|p| p.id == Some(device))
        .or(device_properties.first())
        .and_then(|p| p.name.clone());
    t.activities.sort_by_key(|a| (a.start_ns, a.stream));
    t.calls.sort_by_key(|c| (c.start_ns, c.thread));
    t.unmatched_launches = t
        .calls
        .iter()
        .filter(|c| matches!(c.kind, CallKind::LaunchKernel | CallKind::Memcpy | CallKind::Memset))
        .filter(|c| c.correlation.is_none_or(|k| !kept.contains_key(&k)))
        .count() as u64;
    Ok(t)
}

/// The runtime calls and GPU activities of a trace's events, times as read (ns since the
/// epoch): each activity with its device, each call with its start.
#[derive(Default)]
struct Events {
    activities: Vec<(u32, u128, GpuActivity)>,
    calls: Vec<(u128, RuntimeCall)>,
    /// The earliest time of them all.
    origin: Option<u128>,
    /// Events of other kinds, counted.
    skipped: u64,
    /// The index the next event has in `traceEvents`.
    index: usize,
    /// The copies and memsets (indices in `activities`) whose event gave no bytes.
    without_bytes: Vec<usize>,
    /// `cuda_sync` events: (device, correlation, what was waited for).
    syncs: Vec<(u32, u64, SyncSaid)>,
    /// CUPTI range-profiler events (`cuda_profiler_range`): counted, to say why a trace of
    /// them alone has nothing to replay.
    profiler_ranges: u64,
}

impl Events {
    /// Gives each copy or memset that came without its bytes those of its runtime call, or
    /// failing that its traced duration at the median rate of the trace's copies that have
    /// them (else [`ASSUMED_COPY_BYTES_PER_S`]); says how many of each in the result.
    fn resolve_bytes(&mut self) -> Assumed {
        let by_call: HashMap<u64, u64> =
            self.calls.iter().filter_map(|(_, c)| Some((c.correlation?, c.bytes?))).collect();
        let missing: BTreeSet<usize> = self.without_bytes.iter().copied().collect();
        let mut rates: Vec<f64> = self
            .activities
            .iter()
            .enumerate()
            .filter(|(i, (_, _, a))| !missing.contains(i) && a.dur_ns > 0)
            .filter_map(|(_, (_, _, a))| match a.kind {
                ActivityKind::Memcpy { bytes, kind } if kind.crosses_pcie() && bytes > 0 => {
                    Some(bytes as f64 / a.dur_ns as f64 * 1e9)
                }
                _ => None,
            })
            .collect();
        rates.sort_by(f64::total_cmp);
        let mut assumed = Assumed {
            estimated_at_bytes_per_s: rates.get(rates.len() / 2).copied().unwrap_or(ASSUMED_COPY_BYTES_PER_S),
            ..Assumed::default()
        };
        for &i in &self.without_bytes {
            let a = &mut self.activities[i].2;
            let bytes = match by_call.get(&a.correlation) {
                Some(&b) => {
                    assumed.bytes_from_calls += 1;
                    b
                }
                None => {
                    assumed.bytes_estimated += 1;
                    (a.dur_ns as f64 * assumed.estimated_at_bytes_per_s / 1e9) as u64
                }
            };
            match &mut a.kind {
                ActivityKind::Memcpy { bytes: b, .. } | ActivityKind::Memset { bytes: b } => *b = bytes,
                ActivityKind::Kernel => {}
            }
        }
        assumed
    }

    /// Refuses a trace whose kept events span more than [`MAX_SPAN_NS`], naming the event
    /// farthest from the median time (the outlier: an event at time 0 among this year's).
    fn check_span(&self, what: &str) -> Result<(), TraceError> {
        let mut times: Vec<(u128, usize, &str)> = self
            .calls
            .iter()
            .map(|(ts, c)| (*ts, c.event, c.name.as_str()))
            .chain(self.activities.iter().map(|(_, ts, a)| (*ts, a.event, "")))
            .collect();
        if times.len() < 2 {
            return Ok(());
        }
        times.sort_unstable_by_key(|t| t.0);
        let (first, last) = (times[0], times[times.len() - 1]);
        if last.0 - first.0 <= MAX_SPAN_NS {
            return Ok(());
        }
        let median = times[times.len() / 2].0;
        let (t, what_from) = match median - first.0 > last.0 - median {
            true => (first, "before the trace's median time"),
            false => (last, "after the trace's median time"),
        };
        Err(TraceError::Implausible {
            path: what.to_string(),
            index: t.1,
            name: if t.2.is_empty() { "a GPU activity".into() } else { t.2.chars().take(80).collect() },
            field: "ts",
            value_s: t.0.abs_diff(median) as f64 / 1e9,
            what: what_from,
        })
    }
}

/// Reads the next event of `traceEvents` (of the file `what`), from its bytes, into `out`;
/// or says what is wrong with it.
fn read_event(out: &mut Events, raw: &[u8], what: &str) -> Result<(), TraceError> {
    let index = out.index;
    out.index += 1;
    let bad = |name: &str, field: &'static str, why: String| TraceError::BadEvent {
        path: what.to_string(),
        index,
        name: name.chars().take(80).collect(),
        field,
        why,
    };
    let e: Event<'_> = serde_json::from_slice(raw).map_err(|e| bad("?", "(event)", e.to_string()))?;
    // Today's categories, and those Kineto wrote before PyTorch 1.10 (`Kernel`, `Memcpy`,
    // `Memset`, `Runtime`, GPU events on `"tid": "stream 7"`), whose events are otherwise
    // the same.
    let cat = match e.cat.unwrap_or("") {
        "Kernel" => "kernel",
        "Memcpy" => "gpu_memcpy",
        "Memset" => "gpu_memset",
        "Runtime" => "cuda_runtime",
        c => c,
    };
    let gpu = matches!(cat, "kernel" | "gpu_memcpy" | "gpu_memset");
    let runtime = matches!(cat, "cuda_runtime" | "cuda_driver" | "hip_runtime" | "hip_driver");
    let sync = cat == "cuda_sync";
    if cat == "cuda_profiler_range" {
        out.profiler_ranges += 1;
    }
    if e.ph != Some("X") || !(gpu || runtime || sync) {
        out.skipped += 1;
        return Ok(());
    }
    let name = e.name.as_deref().unwrap_or("");
    let ts = micros_ns(e.ts).map_err(|why| bad(name, "ts", why))?;
    let dur = micros_ns(e.dur).map_err(|why| bad(name, "dur", why))?;
    if dur > MAX_SPAN_NS {
        return Err(TraceError::Implausible {
            path: what.to_string(),
            index,
            name: name.chars().take(80).collect(),
            field: "dur",
            value_s: dur as f64 / 1e9,
            what: "long",
        });
    }
    out.origin = Some(out.origin.map_or(ts, |o| o.min(ts)));
    let args = e.args.unwrap_or_default();
    let arg_u64 = |k: &'static str| -> Result<Option<u64>, TraceError> {
        match args.get(k) {
            None => Ok(None),
            Some(v) => serde_json::from_str::<u64>(v.get())
                .map(Some)
                .map_err(|_| bad(name, k, format!("{} is not a whole number", v.get()))),
        }
    };
    if runtime {
        let thread = thread_of(e.tid).map_err(|why| bad(name, "tid", why))?;
        let bytes = call_bytes(&args);
        out.calls.push((
            ts,
            RuntimeCall {
                kind: CallKind::of(name),
                name: name.to_string(),
                thread,
                start_ns: 0,
                dur_ns: u64::try_from(dur).unwrap_or(u64::MAX),
                correlation: arg_u64("correlation")?,
                bytes,
                event: index,
                waited: None,
            },
        ));
        return Ok(());
    }
    if sync {
        let device = arg_u64("device")?.unwrap_or(0);
        let correlation =
            arg_u64("correlation")?.ok_or_else(|| bad(name, "args.correlation", "missing".into()))?;
        match sync_said(&args, name).map_err(|(field, why)| bad(name, field, why))? {
            Some(said) => out.syncs.push((u32::try_from(device).unwrap_or(u32::MAX), correlation, said)),
            None => out.skipped += 1,
        }
        return Ok(());
    }
    let correlation =
        arg_u64("correlation")?.ok_or_else(|| bad(name, "args.correlation", "missing".into()))?;
    let stream = arg_u64("stream")?.ok_or_else(|| bad(name, "args.stream", "missing".into()))?;
    let device = arg_u64("device")?.unwrap_or(0);
    // A copy or memset without its bytes (ROCm's) takes them from its call, or failing
    // that from its duration, once every event is read (`Events::resolve_bytes`).
    let bytes = arg_u64("bytes")?;
    if bytes.is_none() && cat != "kernel" {
        out.without_bytes.push(out.activities.len());
    }
    let bytes = bytes.unwrap_or(0);
    let kind = match cat {
        "kernel" => ActivityKind::Kernel,
        "gpu_memcpy" => ActivityKind::Memcpy { kind: CopyKind::of(name), bytes },
        _ => ActivityKind::Memset { bytes },
    };
    let (Ok(stream), Ok(device)) = (u32::try_from(stream), u32::try_from(device)) else {
        return Err(bad(name, "args.stream", format!("stream {stream} or device {device} out of range")));
    };
    out.activities.push((
        device,
        ts,
        GpuActivity {
            kind,
            stream,
            start_ns: 0,
            dur_ns: u64::try_from(dur).unwrap_or(u64::MAX),
            correlation,
            event: index,
            collective: cat == "kernel" && Trace::is_collective(name),
        },
    ));
    Ok(())
}

/// The CPU thread a runtime call's `tid` names: a number, or a name (hashed).
fn thread_of(tid: Option<&RawValue>) -> Result<u64, String> {
    let Some(v) = tid else { return Ok(0) };
    serde_json::from_str::<i64>(v.get())
        .map(|t| t as u64)
        .or_else(|_| {
            serde_json::from_str::<String>(v.get())
                .map(|s| s.trim().parse::<i64>().map_or_else(|_| hash_name(&s), |t| t as u64))
        })
        .map_err(|_| format!("{} is not a thread", v.get()))
}

/// The bytes a runtime call's arguments say it copies or sets: ROCm's give them as a string
/// (`"size": "2560"`).
fn call_bytes(args: &BTreeMap<&str, &RawValue>) -> Option<u64> {
    ["bytes", "size", "sizeBytes"].iter().find_map(|k| args.get(k)).and_then(|v| {
        serde_json::from_str::<u64>(v.get())
            .ok()
            .or_else(|| serde_json::from_str::<String>(v.get()).ok().and_then(|s| s.trim().parse().ok()))
    })
}

/// What a `cuda_sync` event's arguments say was waited for; or the argument that is wrong
/// and why; `None` for a kind of synchronization this reader does not know (skipped, as a
/// later Kineto may add some). Streams and recording correlations of -1 (or 2³²−1) name none.
fn sync_said(
    args: &BTreeMap<&str, &RawValue>,
    name: &str,
) -> Result<Option<SyncSaid>, (&'static str, String)> {
    let int = |k: &'static str| -> Result<Option<i64>, (&'static str, String)> {
        match args.get(k) {
            None => Ok(None),
            Some(v) => serde_json::from_str::<i64>(v.get())
                .map(Some)
                .map_err(|_| (k, format!("{} is not a whole number", v.get()))),
        }
    };
    let stream = |k: &'static str| -> Result<Option<u32>, (&'static str, String)> {
        Ok(int(k)?.and_then(|v| u32::try_from(v).ok()).filter(|&v| v != u32::MAX))
    };
    let recorded = || -> Result<Option<Recorded>, (&'static str, String)> {
        let record = int("wait_on_cuda_event_record_corr_id")?.and_then(|v| u64::try_from(v).ok());
        Ok(stream("wait_on_stream")?.zip(record).map(|(stream, record)| Recorded { stream, record }))
    };
    let kind = match args.get("cuda_sync_kind") {
        Some(v) => serde_json::from_str::<String>(v.get())
            .map_err(|_| ("args.cuda_sync_kind", format!("{} is not a string", v.get())))?,
        None => name.to_string(),
    };
    Ok(Some(match kind.as_str() {
        "Stream Sync" => match stream("stream")? {
            Some(s) => SyncSaid::Stream(s),
            None => return Err(("stream", "missing or none for a stream synchronization".into())),
        },
        "Event Sync" => SyncSaid::Event(recorded()?),
        "Stream Wait Event" => match stream("stream")? {
            Some(s) => SyncSaid::StreamWaitsEvent { stream: s, on: recorded()? },
            None => return Err(("stream", "missing or none for a stream wait".into())),
        },
        "Context Sync" => SyncSaid::Context,
        _ => return Ok(None),
    }))
}

/// A Kineto time in microseconds (`1707417525512145`, or `…145.125` with nanoseconds),
/// as nanoseconds, read from its digits.
fn micros_ns(v: Option<&RawValue>) -> Result<u128, String> {
    let Some(v) = v else { return Err("missing".into()) };
    if v.get().starts_with('"') {
        return Err(format!("{} is a string, not a time in microseconds", v.get()));
    }
    let s = v.get();
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let bad = || format!("{s} is not a time in microseconds");
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let whole: u128 = int.parse().map_err(|_| bad())?;
    let mut ns: u128 = 0;
    for (i, b) in frac.bytes().take(3).enumerate() {
        ns += u128::from(b - b'0') * 10u128.pow(2 - i as u32);
    }
    whole.checked_mul(1000).and_then(|w| w.checked_add(ns)).ok_or_else(bad)
}

/// A thread named by a string (some traces do): a stable number for it.
fn hash_name(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn times_are_read_to_the_nanosecond_from_their_digits() {
        let raw = |s: &str| serde_json::from_str::<Box<RawValue>>(s).unwrap();
        assert_eq!(micros_ns(Some(&raw("1707417525512145"))).unwrap(), 1_707_417_525_512_145_000);
        assert_eq!(micros_ns(Some(&raw("1707417525512145.123"))).unwrap(), 1_707_417_525_512_145_123);
        assert_eq!(micros_ns(Some(&raw("2.5"))).unwrap(), 2_500);
        assert!(micros_ns(Some(&raw("-1"))).is_err());
        assert!(micros_ns(Some(&raw("1e3"))).is_err());
        assert!(micros_ns(None).is_err());
    }
}
