//! What a trace says a GPU and its driver did: the runtime calls, the GPU's activities, and
//! what the reader assumed where the trace did not say.

use std::collections::{BTreeSet, HashMap};

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
    /// `cudaFree`, `hipFree`, `cuMemFree`: CUDA and HIP synchronize the device before
    /// freeing.
    Free,
    /// Anything else: CPU time the job spent in the runtime.
    Other,
}

impl CallKind {
    /// The kind of the runtime call named `name`: CUDA's runtime (`cuda…`), HIP's (`hip…`) or
    /// CUDA's driver API (`cu…`: Triton's launches).
    pub fn of(name: &str) -> CallKind {
        let base = name
            .strip_prefix("cuda")
            .or_else(|| name.strip_prefix("hip"))
            .or_else(|| name.strip_prefix("cu"))
            .unwrap_or("");
        // Variants (`_v2`, `_ptsz`, `ExC`) are the same call.
        let base = base.split('_').next().unwrap_or(base);
        match base {
            // A graph launch submits its graph's kernels (all under its correlation).
            "LaunchKernel"
            | "LaunchKernelExC"
            | "LaunchKernelEx"
            | "LaunchCooperativeKernel"
            | "ModuleLaunchKernel"
            | "ExtModuleLaunchKernel"
            | "GraphLaunch" => CallKind::LaunchKernel,
            "MemcpyAsync" | "Memcpy" | "MemcpyDtoHAsync" | "MemcpyHtoDAsync" | "MemcpyDtoDAsync"
            | "MemcpyDtoH" | "MemcpyHtoD" | "MemcpyDtoD" | "MemcpyWithStream" | "Memcpy2DAsync" => {
                CallKind::Memcpy
            }
            "MemsetAsync" | "Memset" | "MemsetD32Async" | "MemsetD8Async" | "MemsetD32" | "MemsetD8" => {
                CallKind::Memset
            }
            "StreamSynchronize" => CallKind::StreamSynchronize,
            "DeviceSynchronize" | "CtxSynchronize" => CallKind::DeviceSynchronize,
            "EventRecord" | "EventRecordWithFlags" => CallKind::EventRecord,
            "StreamWaitEvent" => CallKind::StreamWaitEvent,
            "EventSynchronize" => CallKind::EventSynchronize,
            "EventQuery" => CallKind::EventQuery,
            "Free" | "MemFree" => CallKind::Free,
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
    /// The bytes it asked to copy or set, where its arguments say (ROCm's `size`).
    pub bytes: Option<u64>,
    /// Its index in the file's `traceEvents`, for messages that name it.
    pub event: usize,
    /// What the trace's `cuda_sync` event of the same correlation says it waited for.
    pub waited: Option<SyncSaid>,
}

impl RuntimeCall {
    /// Whether the call returns only once its copy is done, as CUDA and HIP document for
    /// their synchronous copies (`cudaMemcpy`, `cuMemcpyHtoD`, `hipMemcpyWithStream`;
    /// host ↔ device: a synchronous copy inside the device does not wait).
    pub fn copies_synchronously(&self) -> bool {
        self.kind == CallKind::Memcpy && !self.name.contains("Async")
    }
}

/// An event recorded on a stream: the work its stream had been given before the call that
/// recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The stream it was recorded on.
    pub stream: u32,
    /// The correlation of the `cudaEventRecord` call that recorded it.
    pub record: u64,
}

/// What a `cuda_sync` event (Kineto with CUDA synchronization events, PyTorch 2.3 and
/// later) says a call waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncSaid {
    /// The host waited for a stream's work (`cudaStreamSynchronize`).
    Stream(u32),
    /// The host waited for an event (`cudaEventSynchronize`; `cudaEventQuery` is reported
    /// so too, and waits for nothing); `None`: an event never recorded.
    Event(Option<Recorded>),
    /// The device: `stream`'s later work waits for an event (`cudaStreamWaitEvent`).
    StreamWaitsEvent {
        /// The stream that waits.
        stream: u32,
        /// What it waits for.
        on: Option<Recorded>,
    },
    /// The host waited for the whole device (`cudaDeviceSynchronize`).
    Context,
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
    /// A collective kernel (NCCL's, RCCL's: [`Trace::is_collective`]): replayed at its traced
    /// time, as the other ranks and the network between the GPUs are not replayed.
    pub collective: bool,
}

/// A trace, reduced to what replay needs.
#[derive(Clone, Debug, Default, PartialEq)]
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
    /// What the reader assumed where the trace did not say.
    pub assumed: Assumed,
    /// `cuda_sync` events read (each tied to its call's [`RuntimeCall::waited`]): where there
    /// are any, the trace says what each synchronization and stream wait waited for.
    pub sync_events: u64,
}

/// What the reader took from elsewhere, or assumed, where the trace did not say: ROCm's
/// copies and memsets carry no byte count.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Assumed {
    /// Copies and memsets whose bytes came from their runtime call's arguments.
    pub bytes_from_calls: u64,
    /// Copies and memsets whose bytes neither they nor their call gave: taken as their
    /// traced duration at [`Assumed::estimated_at_bytes_per_s`].
    pub bytes_estimated: u64,
    /// The rate those were estimated at: the median of the trace's copies that have bytes,
    /// else [`ASSUMED_COPY_BYTES_PER_S`].
    pub estimated_at_bytes_per_s: f64,
}

/// The rate a copy with no byte count is taken to have run at where no copy of the trace
/// says better: a PCIe 4.0 x16 link's practical host↔device rate.
pub const ASSUMED_COPY_BYTES_PER_S: f64 = 20e9;

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

    /// The collective kernels: how many, and their traced time, ns.
    pub fn collectives(&self) -> (usize, u64) {
        self.activities
            .iter()
            .filter(|a| a.collective)
            .fold((0, 0), |(n, t), a| (n + 1, t.saturating_add(a.dur_ns)))
    }

    /// Whether a kernel named `name` is a collective (NCCL's or RCCL's).
    pub fn is_collective(name: &str) -> bool {
        let n = name.to_ascii_lowercase();
        n.contains("nccl") || n.contains("rccl")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_and_copies_are_named_as_cuda_and_hip_name_them() {
        assert_eq!(CallKind::of("cudaLaunchKernel"), CallKind::LaunchKernel);
        assert_eq!(CallKind::of("hipLaunchKernel"), CallKind::LaunchKernel);
        assert_eq!(CallKind::of("cudaMemcpyAsync"), CallKind::Memcpy);
        assert_eq!(CallKind::of("hipMemsetAsync"), CallKind::Memset);
        assert_eq!(CallKind::of("cudaStreamSynchronize"), CallKind::StreamSynchronize);
        assert_eq!(CallKind::of("cudaStreamGetCaptureInfo_v2"), CallKind::Other);
        // The driver API (Triton launches through it), graph launches, ROCm's copy.
        assert_eq!(CallKind::of("cuLaunchKernel"), CallKind::LaunchKernel);
        assert_eq!(CallKind::of("cuLaunchKernelEx"), CallKind::LaunchKernel);
        assert_eq!(CallKind::of("cudaGraphLaunch"), CallKind::LaunchKernel);
        assert_eq!(CallKind::of("hipGraphLaunch"), CallKind::LaunchKernel);
        assert_eq!(CallKind::of("cuMemcpyHtoDAsync_v2"), CallKind::Memcpy);
        assert_eq!(CallKind::of("hipMemcpyWithStream"), CallKind::Memcpy);
        assert_eq!(CallKind::of("cuCtxSynchronize"), CallKind::DeviceSynchronize);
        assert_eq!(CallKind::of("cuModuleGetFunction"), CallKind::Other);
        assert_eq!(CallKind::of("cudaFree"), CallKind::Free);
        assert_eq!(CallKind::of("cuMemFree_v2"), CallKind::Free);
        assert_eq!(CallKind::of("cudaFreeHost"), CallKind::Other);
        let call = |name: &str| RuntimeCall {
            kind: CallKind::of(name),
            name: name.into(),
            thread: 0,
            start_ns: 0,
            dur_ns: 0,
            correlation: None,
            bytes: None,
            event: 0,
            waited: None,
        };
        for (name, sync) in [
            ("cudaMemcpy", true),
            ("cuMemcpyDtoH_v2", true),
            ("hipMemcpyWithStream", true),
            ("cudaMemcpyAsync", false),
            ("cuMemcpyHtoDAsync_v2", false),
            ("cudaLaunchKernel", false),
        ] {
            assert_eq!(call(name).copies_synchronously(), sync, "{name}");
        }
        assert!(Trace::is_collective("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"));
        assert!(Trace::is_collective("void rcclGenericKernel<1, false>(ncclDevComm*)"));
        assert!(!Trace::is_collective("void at::native::vectorized_elementwise_kernel<4>"));
        assert_eq!(CopyKind::of("Memcpy HtoD (Pinned -> Device)"), CopyKind::HtoDPinned);
        assert_eq!(CopyKind::of("Memcpy DtoH (Device -> Pageable)"), CopyKind::DtoHPageable);
        assert_eq!(CopyKind::of("Memcpy DtoD (Device -> Device)"), CopyKind::DtoD);
    }
}
