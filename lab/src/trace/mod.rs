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

mod scan;

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

/// Why a trace cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read (or its gzip stream is broken or cut short).
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        error: std::io::Error,
    },
    /// Not JSON, or not the shape torch.profiler writes.
    #[error("{path}: not a PyTorch profiler trace: {why}")]
    NotATrace {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// One event lacks a field replay needs, or has it in a form it cannot take.
    #[error("{path}: traceEvents[{index}] ({name}): {field}: {why}")]
    BadEvent {
        /// The file.
        path: String,
        /// The event's index in `traceEvents`.
        index: usize,
        /// Its name, where it has one.
        name: String,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// Activities of several GPUs, and no `--rank` to say which.
    #[error("{path}: activities of GPUs {devices:?}: give one (--rank)")]
    SeveralDevices {
        /// The file.
        path: String,
        /// The devices seen.
        devices: Vec<u32>,
    },
    /// Not a regular file: a FIFO would block until a writer comes, a device may never end.
    #[error("{path}: {what}, not a regular file: give the trace's file (a FIFO or device is not read)")]
    NotAFile {
        /// The path.
        path: String,
        /// What it is.
        what: &'static str,
    },
    /// The file, or the JSON it inflates to, is past its limit.
    #[error("{path}: {why}")]
    TooLarge {
        /// The file.
        path: String,
        /// Which limit, and what to do.
        why: String,
    },
    /// An event's time lies so far from the others (or its duration is so long) that no
    /// profiler run took it.
    #[error(
        "{path}: traceEvents[{index}] ({name}): {field} {value_s:.0} s {what}: not a time a profiler run takes (more than a day); the file is broken"
    )]
    Implausible {
        /// The file.
        path: String,
        /// The event's index in `traceEvents`.
        index: usize,
        /// Its name.
        name: String,
        /// `ts` or `dur`.
        field: &'static str,
        /// How far, or how long, in seconds.
        value_s: f64,
        /// From what.
        what: &'static str,
    },
    /// Nothing to replay: no GPU activity (of the device asked for).
    #[error("{path}: no kernels, copies or memsets{}", .device.map(|d| format!(" on GPU {d}")).unwrap_or_default())]
    Empty {
        /// The file.
        path: String,
        /// The device asked for.
        device: Option<u32>,
    },
}

/// A runtime call the CPU made, as replay issues it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CallKind {
    /// `cudaLaunchKernel` / `hipLaunchKernel` (and their variants).
    LaunchKernel,
    /// `cudaMemcpyAsync`, `cudaMemcpy`.
    Memcpy,
    /// `cudaMemsetAsync`, `cudaMemset`.
    Memset,
    /// `cudaStreamSynchronize`.
    StreamSynchronize,
    /// `cudaDeviceSynchronize`.
    DeviceSynchronize,
    /// `cudaEventRecord`.
    EventRecord,
    /// `cudaStreamWaitEvent`.
    StreamWaitEvent,
    /// `cudaEventSynchronize`.
    EventSynchronize,
    /// `cudaEventQuery`.
    EventQuery,
    /// Anything else: CPU time the job spent in the runtime.
    Other,
}

impl CallKind {
    /// The kind of the runtime call named `name` (CUDA's or HIP's).
    pub fn of(name: &str) -> CallKind {
        let base = name.strip_prefix("cuda").or_else(|| name.strip_prefix("hip")).unwrap_or("");
        // Variants (`_v2`, `_ptsz`, `ExC`) are the same call.
        let base = base.split('_').next().unwrap_or(base);
        match base {
            "LaunchKernel" | "LaunchKernelExC" | "ModuleLaunchKernel" | "ExtModuleLaunchKernel" => {
                CallKind::LaunchKernel
            }
            "MemcpyAsync" | "Memcpy" | "MemcpyDtoHAsync" | "MemcpyHtoDAsync" | "MemcpyDtoDAsync" => {
                CallKind::Memcpy
            }
            "MemsetAsync" | "Memset" | "MemsetD32Async" | "MemsetD8Async" => CallKind::Memset,
            "StreamSynchronize" => CallKind::StreamSynchronize,
            "DeviceSynchronize" => CallKind::DeviceSynchronize,
            "EventRecord" | "EventRecordWithFlags" => CallKind::EventRecord,
            "StreamWaitEvent" => CallKind::StreamWaitEvent,
            "EventSynchronize" => CallKind::EventSynchronize,
            "EventQuery" => CallKind::EventQuery,
            _ => CallKind::Other,
        }
    }
}

/// One runtime call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeCall {
    /// Its kind.
    pub kind: CallKind,
    /// Its name, as the trace gives it.
    pub name: String,
    /// The CPU thread that made it.
    pub thread: u64,
    /// When it began, ns from the trace's start.
    pub start_ns: u64,
    /// How long it took, ns.
    pub dur_ns: u64,
    /// What ties it to the GPU activity it caused.
    pub correlation: Option<u64>,
    /// Its index in the file's `traceEvents`, for messages that name it.
    pub event: usize,
}

/// Where a copy's bytes come from and go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CopyKind {
    /// Host → device from pinned memory: the copy engine reads host memory by DMA.
    HtoDPinned,
    /// Host → device from pageable memory: the driver stages it through a pinned buffer.
    HtoDPageable,
    /// Device → host into pinned memory.
    DtoHPinned,
    /// Device → host into pageable memory, staged.
    DtoHPageable,
    /// Inside the device.
    DtoD,
    /// Between devices, or a kind this reader does not know (replayed as inside the device).
    Other,
}

impl CopyKind {
    /// The kind Kineto's name says (`Memcpy HtoD (Pinned -> Device)`).
    pub fn of(name: &str) -> CopyKind {
        let pageable = name.contains("Pageable");
        if name.contains("HtoD") {
            if pageable { CopyKind::HtoDPageable } else { CopyKind::HtoDPinned }
        } else if name.contains("DtoH") {
            if pageable { CopyKind::DtoHPageable } else { CopyKind::DtoHPinned }
        } else if name.contains("DtoD") {
            CopyKind::DtoD
        } else {
            CopyKind::Other
        }
    }

    /// Whether its bytes cross the host's PCIe link.
    pub fn crosses_pcie(self) -> bool {
        matches!(
            self,
            CopyKind::HtoDPinned | CopyKind::HtoDPageable | CopyKind::DtoHPinned | CopyKind::DtoHPageable
        )
    }
}

/// What the GPU did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivityKind {
    /// A kernel.
    Kernel,
    /// A copy of `bytes`.
    Memcpy {
        /// Its direction and the host memory's kind.
        kind: CopyKind,
        /// Bytes copied.
        bytes: u64,
    },
    /// A memset of `bytes`.
    Memset {
        /// Bytes set.
        bytes: u64,
    },
}

/// One GPU activity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuActivity {
    /// What it was.
    pub kind: ActivityKind,
    /// The stream it ran on.
    pub stream: u32,
    /// When it began, ns from the trace's start.
    pub start_ns: u64,
    /// How long it ran, ns.
    pub dur_ns: u64,
    /// The runtime call that caused it.
    pub correlation: u64,
    /// Its index in the file's `traceEvents`, for messages that name it.
    pub event: usize,
}

/// A trace, reduced to what replay needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// The GPU's name (`deviceProperties`), where the trace gives it.
    pub gpu: Option<String>,
    /// The GPU the activities are of.
    pub device: u32,
    /// The distributed rank (`distributedInfo`), where the trace gives it.
    pub rank: Option<u32>,
    /// The runtime calls, by start time.
    pub calls: Vec<RuntimeCall>,
    /// The GPU's activities, by start time.
    pub activities: Vec<GpuActivity>,
    /// Runtime calls whose correlation matched no activity of a kind that needs one (a
    /// launch whose kernel is missing), counted rather than refused: the profiler drops
    /// records under load.
    pub unmatched_launches: u64,
    /// Events skipped: other categories (CPU operators, annotations, flows), counted.
    pub skipped: u64,
}

impl Trace {
    /// The span of the GPU's own activity: first start to last end, ns.
    pub fn gpu_span_ns(&self) -> u64 {
        let first = self.activities.iter().map(|a| a.start_ns).min().unwrap_or(0);
        let last = self.activities.iter().map(|a| a.start_ns + a.dur_ns).max().unwrap_or(0);
        last.saturating_sub(first)
    }

    /// Kernels, copies and memsets.
    pub fn counts(&self) -> (usize, usize, usize) {
        let k = self.activities.iter().filter(|a| a.kind == ActivityKind::Kernel).count();
        let c = self.activities.iter().filter(|a| matches!(a.kind, ActivityKind::Memcpy { .. })).count();
        (k, c, self.activities.len() - k - c)
    }

    /// The synchronizing calls (stream, device and event syncs).
    pub fn syncs(&self) -> usize {
        self.calls
            .iter()
            .filter(|c| {
                matches!(
                    c.kind,
                    CallKind::StreamSynchronize | CallKind::DeviceSynchronize | CallKind::EventSynchronize
                )
            })
            .count()
    }

    /// The streams, in order.
    pub fn streams(&self) -> BTreeSet<u32> {
        self.activities.iter().map(|a| a.stream).collect()
    }

    /// The activity each correlation caused (the first, where a call caused several).
    pub fn by_correlation(&self) -> HashMap<u64, usize> {
        let mut m = HashMap::new();
        for (i, a) in self.activities.iter().enumerate() {
            m.entry(a.correlation).or_insert(i);
        }
        m
    }
}

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

/// Reads the trace at `path` (gzip if it starts so), keeping the GPU `rank` asks for (the
/// only one, if `None`), within the default [`ReadLimits`].
pub fn read(path: &Path, rank: Option<u32>) -> Result<Trace, TraceError> {
    read_with(path, rank, ReadLimits::default())
}

/// [`read`] within `limits`.
pub fn read_with(path: &Path, rank: Option<u32>, limits: ReadLimits) -> Result<Trace, TraceError> {
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
        parse_from(BufReader::with_capacity(1 << 16, inflated), &at, rank)
    } else {
        parse_from(Capped { inner: file, left: cap }, &at, rank)
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
pub fn parse(text: &[u8], what: &str, rank: Option<u32>) -> Result<Trace, TraceError> {
    parse_from(text, what, rank)
}

/// Parses trace JSON as it streams from `r`: one event at a time.
fn parse_from(r: impl BufRead, what: &str, rank: Option<u32>) -> Result<Trace, TraceError> {
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
    let mut t = Trace { rank: distributed.and_then(|d| d.rank), ..Trace::default() };
    let Events { activities, calls, origin, skipped, .. } = events;
    t.skipped = skipped;
    let devices: BTreeSet<u32> = activities.iter().map(|(d, _, _)| *d).collect();
    let device = match (rank, devices.len()) {
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
        return Err(TraceError::Empty { path: what.to_string(), device: rank });
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
}

impl Events {
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
    let cat = e.cat.unwrap_or("");
    let gpu = matches!(cat, "kernel" | "gpu_memcpy" | "gpu_memset");
    let runtime = matches!(cat, "cuda_runtime" | "cuda_driver" | "hip_runtime");
    if e.ph != Some("X") || !(gpu || runtime) {
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
        let thread = match e.tid {
            Some(v) => serde_json::from_str::<i64>(v.get())
                .map(|t| t as u64)
                .or_else(|_| serde_json::from_str::<String>(v.get()).map(|s| hash_name(&s)))
                .map_err(|_| bad(name, "tid", format!("{} is not a thread", v.get())))?,
            None => 0,
        };
        out.calls.push((
            ts,
            RuntimeCall {
                kind: CallKind::of(name),
                name: name.to_string(),
                thread,
                start_ns: 0,
                dur_ns: u64::try_from(dur).unwrap_or(u64::MAX),
                correlation: arg_u64("correlation")?,
                event: index,
            },
        ));
        return Ok(());
    }
    let correlation =
        arg_u64("correlation")?.ok_or_else(|| bad(name, "args.correlation", "missing".into()))?;
    let stream = arg_u64("stream")?.ok_or_else(|| bad(name, "args.stream", "missing".into()))?;
    let device = arg_u64("device")?.unwrap_or(0);
    let kind = match cat {
        "kernel" => ActivityKind::Kernel,
        "gpu_memcpy" => ActivityKind::Memcpy {
            kind: CopyKind::of(name),
            bytes: arg_u64("bytes")?.ok_or_else(|| bad(name, "args.bytes", "missing".into()))?,
        },
        _ => ActivityKind::Memset {
            bytes: arg_u64("bytes")?.ok_or_else(|| bad(name, "args.bytes", "missing".into()))?,
        },
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
        },
    ));
    Ok(())
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

    #[test]
    fn calls_and_copies_are_named_as_cuda_and_hip_name_them() {
        assert_eq!(CallKind::of("cudaLaunchKernel"), CallKind::LaunchKernel);
        assert_eq!(CallKind::of("hipLaunchKernel"), CallKind::LaunchKernel);
        assert_eq!(CallKind::of("cudaMemcpyAsync"), CallKind::Memcpy);
        assert_eq!(CallKind::of("hipMemsetAsync"), CallKind::Memset);
        assert_eq!(CallKind::of("cudaStreamSynchronize"), CallKind::StreamSynchronize);
        assert_eq!(CallKind::of("cudaStreamGetCaptureInfo_v2"), CallKind::Other);
        assert_eq!(CopyKind::of("Memcpy HtoD (Pinned -> Device)"), CopyKind::HtoDPinned);
        assert_eq!(CopyKind::of("Memcpy DtoH (Device -> Pageable)"), CopyKind::DtoHPageable);
        assert_eq!(CopyKind::of("Memcpy DtoD (Device -> Device)"), CopyKind::DtoD);
    }
}
