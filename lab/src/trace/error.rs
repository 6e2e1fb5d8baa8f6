//! Why a trace cannot be read.

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
    /// Activities of several GPUs, and no `--device` to say which.
    #[error("{path}: activities of GPUs {devices:?}: give one (--device)")]
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
    /// The trace is not of the rank asked for, or names none.
    #[error("{path}: {}", match .named {
        Some(n) => format!("the trace is rank {n}'s, not rank {asked}'s: give rank {asked}'s file"),
        None => format!("the trace names no rank (no distributedInfo), so it is not rank {asked}'s: leave --rank out, or pick a GPU with --device"),
    })]
    NotThatRank {
        /// The file.
        path: String,
        /// The rank asked for.
        asked: u32,
        /// The rank the trace names.
        named: Option<u32>,
    },
    /// No GPU activity, but kernels as CUPTI's range profiler reports them
    /// (`cuda_profiler_range`: a kernel's metrics, with no stream, correlation or time of its
    /// own): a trace of the job's counters, not of its timeline.
    #[error(
        "{path}: its {ranges} kernels are CUPTI range-profiler events (cuda_profiler_range: metrics, with no \
         stream, correlation or time of their own to replay) and it has no kernel activities: record the job with \
         torch.profiler's CUDA activities (ProfilerActivity.CUDA) and without the range profiler"
    )]
    ProfilerRangesOnly {
        /// The file.
        path: String,
        /// The range profiler's events.
        ranges: u64,
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
