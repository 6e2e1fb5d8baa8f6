//! What a traced job's steps wait on, and what a link between host and GPU adds to them: the
//! dependency graph that `dxpu replay` follows and `dxpu model --trace` evaluates.
//!
//! A trace shows when each runtime call and each GPU activity happened, not why. The plan
//! recovers the why as edges, each with the gap the trace shows across it:
//!
//! - **host**: a call follows its thread's previous call by the CPU time the job spent
//!   between them (Python, the framework); a call after its thread sat idle (longer than
//!   [`IDLE_THREAD_NS`], or its first) also follows the latest call each other thread had
//!   returned from — of the [`WOKEN_BY`] threads that returned last, so that a trace of many
//!   threads gives a plan linear in its calls — as a backward pass follows the forward
//!   thread that started it;
//! - **submit**: an activity starts after the call that issued it, by the launch latency the
//!   trace shows;
//! - **stream**: an activity starts after the one before it on its stream;
//! - **cross-stream**: an activity whose stream waited for an event (`cudaStreamWaitEvent`)
//!   starts after the work issued on the event's stream before the event was recorded, as
//!   the trace's `cuda_sync` events say ([`Stated`]); in a trace without them (before
//!   PyTorch 2.3, or recorded without CUDA sync events), where neither its submission nor
//!   its stream explains its start and an activity on another stream ended just before, it
//!   is taken to have waited for that one (inferred, counted);
//! - **await**: a synchronizing call returns after the work it waited for, by the CPU time
//!   it spent after that: a stream or event synchronization after the work its `cuda_sync`
//!   event names (in a trace without them, the stream whose work ended while it waited, or
//!   else its thread's last stream: inferred, counted), a device synchronization and
//!   `cudaFree` after every stream's, a synchronous copy or one of pageable memory after
//!   its own.
//!
//! The edge that decided each step keeps the gap the trace shows; the others keep the
//! smaller of their gap and the trace's typical one for their kind (an activity queued long
//! behind its stream would start a launch latency after its call, not the long wait after,
//! were its call late). Evaluated with no link, the plan reproduces the trace's times.
//!
//! A link between host and GPU ([`LinkParams`](crate::model::LinkParams)) stretches three kinds of edge: a submission by the
//! doorbell's one-way trip and the command fetch's round trip (1.5 round trips, hidden when
//! the stream is busy for longer), an await by the fence's one-way trip back, and a copy of
//! host memory by its bytes at the link's rate (and, for reads, one round trip to fill the
//! window) where that is slower than the trace's copy. Device-side edges (stream order, one
//! stream waiting for another's event) do not cross the link. The host's own cost of
//! publishing a submission through a bridge (its posted writes are sends) lengthens the
//! calls that submit.

use std::collections::{BTreeMap, HashMap};

use crate::trace::{ActivityKind, CallKind, CopyKind, SyncSaid, Trace};

/// A thread idle longer than this before a call (ns) is taken to have been waiting for the
/// other threads.
pub const IDLE_THREAD_NS: i64 = 100_000;

/// The most other threads a call after an idle spell follows (those that returned last).
pub const WOKEN_BY: usize = 4;

/// How far back on its stream an activity looks for one submitted before it.
const STREAM_LOOKBACK: usize = 64;

/// A cross-stream wait is inferred only where it explains an activity's start this much
/// (ns) better than its submission and its stream do (traces have microsecond resolution).
const CROSS_STREAM_MARGIN_NS: i64 = 1_000;

/// One runtime call, as the plan issues it.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedCall {
    /// What it is.
    pub kind: CallKind,
    /// Its thread (dense index).
    pub thread: usize,
    /// When the trace shows it began and how long it took, ns.
    pub trace_start_ns: i64,
    /// How long it took in the trace, ns.
    pub trace_dur_ns: i64,
    /// The calls it follows: (call, gap after that call returned, ns).
    pub after: Vec<(usize, i64)>,
    /// The activities it issues, at `submit_ns` after it begins.
    pub submits: Vec<usize>,
    /// When in the call its activities are submitted (ns after it begins).
    pub submit_ns: i64,
    /// The activities whose completion it waits for.
    pub awaits: Vec<usize>,
    /// The CPU time it spends after seeing the last of them complete, ns.
    pub await_tail_ns: i64,
    /// The least it lasts, ns: the traced duration, or for a waiting call the part after the
    /// wait.
    pub floor_ns: i64,
    /// What the trace's synchronization event says it waited for.
    pub waited: Option<SyncSaid>,
    /// A synchronous copy: it returns once its copy is done.
    pub copies_synchronously: bool,
}

/// Why an activity waits for another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceEdge {
    /// The activity before it on its stream.
    Stream,
    /// An activity on another stream (an event it waited on).
    CrossStream,
}

/// One GPU activity, as the plan runs it.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedActivity {
    /// What it is.
    pub kind: ActivityKind,
    /// Its stream.
    pub stream: u32,
    /// When the trace shows it began, ns.
    pub trace_start_ns: i64,
    /// How long it ran, ns.
    pub dur_ns: i64,
    /// The call that issued it, and how long after that call's submission it began (ns; may
    /// be negative: the device took it before the call returned). None: a call the trace
    /// lacks; it begins no earlier than its traced time.
    pub call: Option<(usize, i64)>,
    /// The activities it follows on the device: (activity, why, gap ns).
    pub after: Vec<(usize, DeviceEdge, i64)>,
}

/// A traced job as a dependency graph.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The calls, by traced start.
    pub calls: Vec<PlannedCall>,
    /// The activities, by traced start.
    pub activities: Vec<PlannedActivity>,
    /// CPU threads.
    pub threads: usize,
    /// Cross-stream waits inferred.
    pub cross_stream_waits: usize,
    /// Calls nested inside another call of their thread (a driver call inside a runtime
    /// call), folded into it.
    pub nested: usize,
    /// Activities whose stream predecessor by start was submitted after them (by a later
    /// call): each follows the latest earlier one submitted before it instead.
    pub out_of_submission_order: usize,
    /// Activities the trace shows beginning before the call that submitted them began (a
    /// broken clock): each planned to begin with its call.
    pub before_their_call: usize,
    /// Whether the trace says what its synchronizations and stream waits waited for (its
    /// `cuda_sync` events): then nothing is inferred from timing.
    pub explicit: bool,
    /// Cross-stream waits the trace states (a stream waiting for an event).
    pub stated_waits: usize,
    /// Stream and event synchronizations whose stream was inferred from timing.
    pub syncs_inferred: usize,
    /// Synchronizations CUDA and HIP document that the trace does not show as such: a
    /// synchronous copy waits for its copy, `cudaFree` for the device.
    pub implicit_syncs: usize,
    /// Synchronizations whose awaited work the trace shows ending after the call returned
    /// (its times disagree): each keeps its traced time, waiting for nothing.
    pub awaits_contradicted: usize,
    /// The dependencies the trace states or CUDA documents, as the replay's verification
    /// checks them (whatever edges the replay followed).
    pub stated: Vec<Stated>,
    /// Each call by its correlation.
    by_correlation: HashMap<u64, usize>,
}

/// A dependency the trace states (or the runtime documents), as a fact of the replay to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stated {
    /// Activity `consumer` begins after `producer` ends: its stream waited for an event
    /// recorded after `producer`.
    Activity {
        /// The activity that waits.
        consumer: usize,
        /// The one it waits for.
        producer: usize,
    },
    /// Call `call` returns after activity `activity` ends: a synchronization.
    Call {
        /// The synchronizing call.
        call: usize,
        /// The activity it waits for.
        activity: usize,
    },
}

/// Where the link's time went on the job's critical path, ns.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AddedTime {
    /// Submissions waiting for the doorbell and the command fetch.
    pub command_fetch_ns: f64,
    /// Copies of host memory slower or later than in the trace.
    pub copies_ns: f64,
    /// Synchronizations waiting for the fence's trip back.
    pub synchronizations_ns: f64,
    /// The host publishing submissions.
    pub submissions_ns: f64,
}

impl AddedTime {
    /// All of it.
    pub fn total_ns(&self) -> f64 {
        self.command_fetch_ns + self.copies_ns + self.synchronizations_ns + self.submissions_ns
    }
}

/// A plan evaluated at one link.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The job: its first call's start to the later of its last return and its last
    /// activity's end, ns.
    pub job_ns: f64,
    /// The GPU's span: first activity start to last activity end, ns.
    pub gpu_span_ns: f64,
    /// The link's time on the critical path, by kind.
    pub added: AddedTime,
    /// Each activity's start, ns on the trace's clock.
    pub activity_start_ns: Vec<f64>,
    /// Each call's return, ns on the trace's clock.
    pub call_return_ns: Vec<f64>,
}

fn ns(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn median(mut v: Vec<i64>, default: i64) -> i64 {
    if v.is_empty() {
        return default;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

fn blocking_copy(kind: ActivityKind) -> bool {
    matches!(kind, ActivityKind::Memcpy { kind: CopyKind::HtoDPageable | CopyKind::DtoHPageable, .. })
}

impl Plan {
    /// The copy size that carries the median byte of the job's copies across PCIe each way
    /// (host → device, device → host): half the bytes move in copies of at most this size.
    /// `None` for a direction without copies. A calibration measures the link's copy rates
    /// at these sizes.
    pub fn copy_sizes(&self) -> (Option<u64>, Option<u64>) {
        let median_byte = |want: fn(CopyKind) -> bool| {
            let mut sizes: Vec<u64> = self
                .activities
                .iter()
                .filter_map(|a| match a.kind {
                    ActivityKind::Memcpy { kind, bytes } if want(kind) && bytes > 0 => Some(bytes),
                    _ => None,
                })
                .collect();
            sizes.sort_unstable();
            let total: u128 = sizes.iter().map(|&b| u128::from(b)).sum();
            let mut so_far = 0u128;
            sizes.into_iter().find(|&b| {
                so_far += u128::from(b);
                2 * so_far >= total
            })
        };
        (
            median_byte(|k| matches!(k, CopyKind::HtoDPinned | CopyKind::HtoDPageable)),
            median_byte(|k| matches!(k, CopyKind::DtoHPinned | CopyKind::DtoHPageable)),
        )
    }

    /// The streams beyond `channels` (a device's command channels for streams), which share
    /// a channel with another and may wait for its work, as no GPU's stream would: none
    /// unless the job has more streams than that.
    pub fn streams_sharing_channels(&self, channels: usize) -> usize {
        let streams: std::collections::BTreeSet<u32> = self.activities.iter().map(|a| a.stream).collect();
        streams.len().saturating_sub(channels)
    }

    /// The plan of `trace`'s job.
    pub fn of(trace: &Trace) -> Plan {
        let (mut plan, by_corr) = Plan::calls_of(trace);
        plan.explicit = trace.sync_events > 0;
        plan.by_correlation = by_corr.clone();
        plan.host_edges();
        plan.activities_of(trace, &by_corr);
        plan.device_edges();
        plan.awaits();
        plan
    }

    /// The calls, on threads densely numbered, calls nested inside an earlier call of their
    /// thread folded into it; and each call by its correlation ID.
    fn calls_of(trace: &Trace) -> (Plan, HashMap<u64, usize>) {
        let mut plan = Plan::default();
        let mut thread_ix: BTreeMap<u64, usize> = BTreeMap::new();
        let mut open_until: HashMap<usize, i64> = HashMap::new();
        let mut kept = Vec::new();
        for c in &trace.calls {
            let next = thread_ix.len();
            let t = *thread_ix.entry(c.thread).or_insert(next);
            let end = ns(c.start_ns).saturating_add(ns(c.dur_ns));
            if open_until.get(&t).is_some_and(|&u| end <= u) && c.kind == CallKind::Other {
                plan.nested += 1;
                continue;
            }
            open_until.insert(t, end.max(open_until.get(&t).copied().unwrap_or(0)));
            kept.push((t, c));
        }
        plan.threads = thread_ix.len();

        let by_corr: HashMap<u64, usize> =
            kept.iter().enumerate().filter_map(|(i, (_, c))| c.correlation.map(|k| (k, i))).collect();
        plan.calls = kept
            .iter()
            .map(|&(thread, c)| PlannedCall {
                kind: c.kind,
                thread,
                trace_start_ns: ns(c.start_ns),
                trace_dur_ns: ns(c.dur_ns),
                after: Vec::new(),
                submits: Vec::new(),
                submit_ns: ns(c.dur_ns),
                awaits: Vec::new(),
                await_tail_ns: 0,
                floor_ns: ns(c.dur_ns),
                waited: c.waited,
                copies_synchronously: c.copies_synchronously(),
            })
            .collect();
        (plan, by_corr)
    }

    /// Each call after its thread's previous one, and after an idle thread, after the latest
    /// returns of the [`WOKEN_BY`] other threads that returned last.
    fn host_edges(&mut self) {
        let mut last_on: Vec<Option<usize>> = vec![None; self.threads];
        // Calls by end, to find the other threads' latest returns before a call.
        let mut by_end: Vec<usize> = (0..self.calls.len()).collect();
        by_end.sort_by_key(|&i| (call_end(&self.calls[i]), i));
        let mut ended = 0usize;
        // The latest return of the threads that returned last, latest first: one per thread,
        // at most WOKEN_BY + 1 (a call's own thread among them).
        let mut recent: Vec<usize> = Vec::with_capacity(WOKEN_BY + 2);
        for i in 0..self.calls.len() {
            let start = self.calls[i].trace_start_ns;
            while ended < by_end.len() && call_end(&self.calls[by_end[ended]]) <= start {
                let j = by_end[ended];
                if j < i {
                    let thread = self.calls[j].thread;
                    recent.retain(|&k| self.calls[k].thread != thread);
                    recent.insert(0, j);
                    recent.truncate(WOKEN_BY + 1);
                }
                ended += 1;
            }
            let t = self.calls[i].thread;
            let mut after = Vec::new();
            let own_gap = last_on[t].map(|p| start - call_end(&self.calls[p]));
            if let (Some(p), Some(gap)) = (last_on[t], own_gap) {
                after.push((p, gap));
            }
            if own_gap.is_none_or(|g| g > IDLE_THREAD_NS) {
                for &j in recent.iter().filter(|&&j| self.calls[j].thread != t).take(WOKEN_BY) {
                    after.push((j, start - call_end(&self.calls[j])));
                }
            }
            self.calls[i].after = after;
            last_on[t] = Some(i);
        }
    }
}

mod deps;
mod evaluate;

/// When a call returned in the trace.
fn call_end(c: &PlannedCall) -> i64 {
    c.trace_start_ns.saturating_add(c.trace_dur_ns)
}

/// When an activity ended in the trace.
fn activity_end(a: &PlannedActivity) -> i64 {
    a.trace_start_ns.saturating_add(a.dur_ns)
}
