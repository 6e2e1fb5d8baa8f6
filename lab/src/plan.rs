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
//! - **cross-stream**: where neither explains its start and an activity on another stream
//!   ended just before, it waited for that one (`cudaStreamWaitEvent`; older traces do not
//!   say on which event);
//! - **await**: a synchronizing call (stream, event or device synchronization, a copy to or
//!   from pageable memory) returns after the last activity that ended while it waited, by
//!   the CPU time it spent after that.
//!
//! The edge that decided each step keeps the gap the trace shows; the others keep the
//! smaller of their gap and the trace's typical one for their kind (an activity queued long
//! behind its stream would start a launch latency after its call, not the long wait after,
//! were its call late). Evaluated with no link, the plan reproduces the trace's times.
//!
//! A link between host and GPU ([`LinkParams`]) stretches three kinds of edge: a submission by the
//! doorbell's one-way trip and the command fetch's round trip (1.5 round trips, hidden when
//! the stream is busy for longer), an await by the fence's one-way trip back, and a copy of
//! host memory by its bytes at the link's rate (and, for reads, one round trip to fill the
//! window) where that is slower than the trace's copy. Device-side edges (stream order, one
//! stream waiting for another's event) do not cross the link. The host's own cost of
//! publishing a submission through a bridge (its posted writes are sends) lengthens the
//! calls that submit.

use std::collections::{BTreeMap, HashMap};

use crate::model::LinkParams;
use crate::trace::{ActivityKind, CallKind, CopyKind, Trace};

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
    /// The plan of `trace`'s job.
    pub fn of(trace: &Trace) -> Plan {
        let (mut plan, by_corr) = Plan::calls_of(trace);
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

    /// The activities, each after the call that submitted it.
    fn activities_of(&mut self, trace: &Trace, by_corr: &HashMap<u64, usize>) {
        self.activities = trace
            .activities
            .iter()
            .map(|a| PlannedActivity {
                kind: a.kind,
                stream: a.stream,
                trace_start_ns: ns(a.start_ns),
                dur_ns: ns(a.dur_ns),
                call: None,
                after: Vec::new(),
            })
            .collect();
        for (ai, a) in trace.activities.iter().enumerate() {
            let Some(&ci) = by_corr.get(&a.correlation) else { continue };
            let c = &mut self.calls[ci];
            let start = self.activities[ai].trace_start_ns;
            if blocking_copy(a.kind) {
                // The driver stages the copy inside the call and returns when it is done.
                c.submit_ns = (start - c.trace_start_ns).clamp(0, c.trace_dur_ns);
            }
            c.submits.push(ai);
            let submitted = c.trace_start_ns + c.submit_ns;
            // Work cannot begin before the call that submitted it did: a trace that says so
            // has a broken clock (the fuzzer's: a kernel an hour before its launch), and
            // planned so, a link would make the job shorter. It begins with its call.
            if start < c.trace_start_ns {
                self.before_their_call += 1;
            }
            self.activities[ai].call = Some((ci, start.max(c.trace_start_ns) - submitted));
        }
    }

    /// The edges inside the device (see below).
    fn device_edges(&mut self) {
        // Device edges: the binding one keeps its gap, the others the typical gap of their
        // kind at most.
        struct Candidates {
            submit: Option<i64>,
            stream: Option<(usize, i64)>,
            other: Option<(usize, i64)>,
        }
        let mut cands = Vec::with_capacity(self.activities.len());
        // Each stream's activities so far, by start.
        let mut on_stream: HashMap<u32, Vec<usize>> = HashMap::new();
        // The latest call an activity's submission waits for, through its own call or what it
        // follows on the device (-1: none). An activity of call C may follow only work of a
        // rank below C, or earlier work of C itself: the replay submits a call's work when
        // the call is issued, so following work of a later call (which waits for C to
        // return) would never be submitted — a trace whose device order differs from the
        // order its calls submitted in (a stream fed by two threads, a graph launch).
        let mut rank: Vec<i64> = vec![-1; self.activities.len()];
        // Activities by end, to find the latest end on another stream before a start.
        let mut a_by_end: Vec<usize> = (0..self.activities.len()).collect();
        a_by_end.sort_by_key(|&i| (activity_end(&self.activities[i]), i));
        let mut a_ended = 0usize;
        let mut latest_end: HashMap<u32, usize> = HashMap::new();
        for i in 0..self.activities.len() {
            let a = &self.activities[i];
            while a_ended < a_by_end.len()
                && activity_end(&self.activities[a_by_end[a_ended]]) <= a.trace_start_ns
            {
                let j = a_by_end[a_ended];
                if j < i {
                    let s = self.activities[j].stream;
                    if latest_end.get(&s).is_none_or(|&k| {
                        activity_end(&self.activities[k]) <= activity_end(&self.activities[j])
                    }) {
                        latest_end.insert(s, j);
                    }
                }
                a_ended += 1;
            }
            // Only work submitted before this one's can be waited for (an event is recorded
            // after the work it marks, and waited on before the work that waits).
            let call_of = |k: usize| self.activities[k].call.map(|(c, _)| c);
            let submitted_before = |j: usize| match call_of(i) {
                Some(ci) => rank[j] < ci as i64 || call_of(j) == Some(ci),
                None => true,
            };
            let earlier = on_stream.entry(a.stream).or_default();
            let stream = earlier
                .iter()
                .rev()
                .take(STREAM_LOOKBACK)
                .find(|&&p| submitted_before(p))
                .map(|&p| (p, a.trace_start_ns - activity_end(&self.activities[p])));
            if earlier.last().is_some_and(|&p| stream.is_none_or(|(s, _)| s != p)) {
                self.out_of_submission_order += 1;
            }
            earlier.push(i);
            let other = latest_end
                .iter()
                .filter(|&(&s, &j)| s != a.stream && submitted_before(j))
                .map(|(_, &j)| (j, a.trace_start_ns - activity_end(&self.activities[j])))
                .min_by_key(|&(j, gap)| (gap, j));
            rank[i] = match call_of(i) {
                Some(c) => c as i64,
                None => stream.iter().chain(&other).map(|&(p, _)| rank[p]).max().unwrap_or(-1),
            };
            cands.push(Candidates { submit: a.call.map(|(_, g)| g), stream, other });
        }
        let explained = |c: &Candidates| c.submit.into_iter().chain(c.stream.map(|s| s.1)).min();
        let cross = |c: &Candidates| match (c.other, explained(c)) {
            (Some((_, o)), Some(e)) => o.saturating_add(CROSS_STREAM_MARGIN_NS) < e,
            (Some(_), None) => true,
            _ => false,
        };
        // Typical gaps where each kind decided.
        let mut typical = [Vec::new(), Vec::new()];
        for c in &cands {
            if cross(c) {
                continue;
            } else if let (Some(s), Some((_, p))) = (c.submit, c.stream) {
                if s <= p { typical[0].push(s) } else { typical[1].push(p) }
            } else if let Some(s) = c.submit {
                typical[0].push(s);
            } else if let Some((_, p)) = c.stream {
                typical[1].push(p);
            }
        }
        let [t_submit, t_stream] = typical.map(|v| median(v, 0).max(0));
        for (i, c) in cands.iter().enumerate() {
            let is_cross = cross(c);
            let decided = if is_cross { c.other.map(|o| o.1) } else { explained(c) };
            let keep = |gap: i64, typical: i64| if Some(gap) == decided { gap } else { gap.min(typical) };
            let a = &mut self.activities[i];
            if let (Some((ci, _)), Some(g)) = (a.call, c.submit) {
                a.call = Some((ci, if is_cross { g.min(t_submit) } else { keep(g, t_submit) }));
            }
            if let Some((p, g)) = c.stream {
                a.after.push((
                    p,
                    DeviceEdge::Stream,
                    if is_cross { g.min(t_stream) } else { keep(g, t_stream) },
                ));
            }
            if is_cross && let Some((j, g)) = c.other {
                a.after.push((j, DeviceEdge::CrossStream, g));
                self.cross_stream_waits += 1;
            }
        }
    }

    /// What each synchronizing call waited for (see below).
    fn awaits(&mut self) {
        // Awaits. A synchronizing call returns after the work it waited for: a device
        // synchronization after the last activity issued before it on every stream, a stream
        // or event synchronization after the last issued before it on the stream whose work
        // ended while it waited (the trace does not say which stream), a pageable copy after
        // its own. It spends the CPU time the trace shows after the latest of them.
        let mut a_end_sorted: Vec<(i64, usize)> =
            self.activities.iter().enumerate().map(|(i, a)| (activity_end(a), i)).collect();
        a_end_sorted.sort_unstable();
        let mut issued_by: Vec<Vec<usize>> = vec![Vec::new(); self.calls.len()];
        for (i, a) in self.activities.iter().enumerate() {
            if let Some((c, _)) = a.call {
                issued_by[c].push(i);
            }
        }
        // The last activity issued so far on each stream, as the calls go by.
        let mut last_issued: BTreeMap<u32, usize> = BTreeMap::new();
        for (ci, issued) in issued_by.iter().enumerate() {
            let c = &self.calls[ci];
            let (start, end) = (c.trace_start_ns, call_end(c));
            let ended_inside = || {
                let lo = a_end_sorted.partition_point(|&(e, _)| e < start);
                let hi = a_end_sorted.partition_point(|&(e, _)| e <= end);
                a_end_sorted[lo..hi]
                    .iter()
                    .rev()
                    .map(|&(_, a)| a)
                    .find(|&a| self.activities[a].call.is_none_or(|(k, _)| k < ci))
            };
            let awaited: Vec<usize> = match c.kind {
                CallKind::DeviceSynchronize => last_issued.values().copied().collect(),
                CallKind::StreamSynchronize | CallKind::EventSynchronize => ended_inside()
                    .and_then(|a| last_issued.get(&self.activities[a].stream).copied())
                    .into_iter()
                    .collect(),
                _ => {
                    let mut own =
                        c.submits.iter().copied().filter(|&a| blocking_copy(self.activities[a].kind));
                    own.rfind(|&a| activity_end(&self.activities[a]) <= end).into_iter().collect()
                }
            };
            for &a in issued {
                last_issued.insert(self.activities[a].stream, a);
            }
            let Some(latest) = awaited.iter().map(|&a| activity_end(&self.activities[a])).max() else {
                continue;
            };
            // Work that ended after the call returned was not waited for (a trace whose
            // times disagree): the call keeps its own time.
            if latest > end {
                continue;
            }
            // Work done before the call began left it only its own time.
            let tail = end - latest.max(start);
            let c = &mut self.calls[ci];
            c.awaits = awaited;
            c.await_tail_ns = tail;
            c.floor_ns = if c.submits.is_empty() { tail } else { tail.max(c.submit_ns) };
        }
    }

    /// The job's times at `link`.
    pub fn evaluate(&self, link: &LinkParams) -> Outcome {
        Evaluation::run(self, link)
    }
}

/// A step of the job: a call's issue or return, or an activity.
#[derive(Clone, Copy, Debug)]
enum Node {
    Issue(usize),
    Return(usize),
    Activity(usize),
}

/// What the link added on the edge that decided a step.
#[derive(Clone, Copy, Debug, Default)]
struct Added {
    fetch: f64,
    copy: f64,
    sync: f64,
    submit: f64,
}

struct Evaluation<'a> {
    plan: &'a Plan,
    link: &'a LinkParams,
    issue: Vec<f64>,
    ret: Vec<f64>,
    start: Vec<f64>,
    end: Vec<f64>,
    /// The decisive predecessor of each step and what the link added on that edge.
    why: Vec<Option<(Node, Added)>>,
}

impl<'a> Evaluation<'a> {
    fn id(&self, n: Node) -> usize {
        let nc = self.plan.calls.len();
        match n {
            Node::Issue(c) => c,
            Node::Return(c) => nc + c,
            Node::Activity(a) => 2 * nc + a,
        }
    }

    fn node(&self, id: usize) -> Node {
        let nc = self.plan.calls.len();
        if id < nc {
            Node::Issue(id)
        } else if id < 2 * nc {
            Node::Return(id - nc)
        } else {
            Node::Activity(id - 2 * nc)
        }
    }

    /// The steps `n` waits for.
    fn preds(&self, n: Node) -> Vec<Node> {
        let p = self.plan;
        match n {
            Node::Issue(c) => p.calls[c].after.iter().map(|&(u, _)| Node::Return(u)).collect(),
            Node::Return(c) => {
                let mut v = vec![Node::Issue(c)];
                v.extend(p.calls[c].awaits.iter().map(|&a| Node::Activity(a)));
                v
            }
            Node::Activity(a) => {
                let a = &p.activities[a];
                let mut v: Vec<Node> = a.after.iter().map(|&(q, _, _)| Node::Activity(q)).collect();
                v.extend(a.call.map(|(c, _)| Node::Issue(c)));
                v
            }
        }
    }

    fn run(plan: &'a Plan, link: &'a LinkParams) -> Outcome {
        let (nc, na) = (plan.calls.len(), plan.activities.len());
        let mut ev = Evaluation {
            plan,
            link,
            issue: vec![f64::NAN; nc],
            ret: vec![f64::NAN; nc],
            start: vec![f64::NAN; na],
            end: vec![f64::NAN; na],
            why: vec![None; 2 * nc + na],
        };
        // Every step once all it waits for is done (Kahn's order). The plan's edges run
        // forward in the trace's time, so there is no cycle; were there one, its steps are
        // taken in the trace's order with what is known.
        let total = 2 * nc + na;
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); total];
        let mut waiting: Vec<usize> = (0..total)
            .map(|id| {
                let preds = ev.preds(ev.node(id));
                for q in &preds {
                    dependents[ev.id(*q)].push(id);
                }
                preds.len()
            })
            .collect();
        let mut ready: Vec<usize> = (0..total).filter(|&i| waiting[i] == 0).collect();
        let mut done = vec![false; total];
        let mut next_unfinished = 0usize;
        let order = |id: usize, ev: &Evaluation<'_>| -> (i64, usize) {
            match ev.node(id) {
                Node::Issue(c) => (plan.calls[c].trace_start_ns, id),
                Node::Return(c) => (plan.calls[c].trace_start_ns + plan.calls[c].trace_dur_ns, id),
                Node::Activity(a) => (plan.activities[a].trace_start_ns, id),
            }
        };
        let mut by_time: Vec<usize> = (0..total).collect();
        by_time.sort_by_key(|&id| order(id, &ev));
        let mut finished = 0usize;
        while finished < total {
            let id = match ready.pop() {
                Some(id) => id,
                None => {
                    // A cycle: take the earliest step not yet done.
                    while done[by_time[next_unfinished]] {
                        next_unfinished += 1;
                    }
                    by_time[next_unfinished]
                }
            };
            if done[id] {
                continue;
            }
            done[id] = true;
            finished += 1;
            ev.step(ev.node(id));
            for &d in &dependents[id] {
                waiting[d] = waiting[d].saturating_sub(1);
                if waiting[d] == 0 && !done[d] {
                    ready.push(d);
                }
            }
        }
        ev.outcome()
    }

    /// The later of `best` and `t` (a step not yet known counts for nothing).
    fn later(best: &mut (f64, Option<(Node, Added)>), t: f64, why: Option<(Node, Added)>) {
        if t > best.0 || best.0.is_nan() {
            *best = (t, why);
        }
    }

    fn step(&mut self, n: Node) {
        let (plan, link) = (self.plan, self.link);
        let one_way = link.rtt_ns.max(0.0) / 2.0;
        let mut best: (f64, Option<(Node, Added)>) = (f64::NAN, None);
        match n {
            Node::Issue(ci) => {
                let c = &plan.calls[ci];
                if c.after.is_empty() {
                    best.0 = c.trace_start_ns as f64;
                }
                for &(p, gap) in &c.after {
                    Self::later(
                        &mut best,
                        self.ret[p] + gap as f64,
                        Some((Node::Return(p), Added::default())),
                    );
                }
                if best.0.is_nan() {
                    best.0 = c.trace_start_ns as f64;
                }
                self.issue[ci] = best.0;
            }
            Node::Return(ci) => {
                let c = &plan.calls[ci];
                let submit = if c.submits.is_empty() { 0.0 } else { link.submit_ns() };
                let own = Added { submit, ..Added::default() };
                best = (self.issue[ci] + c.floor_ns as f64 + submit, Some((Node::Issue(ci), own)));
                let sync = Added { sync: one_way, ..Added::default() };
                for &a in &c.awaits {
                    let t = self.end[a] + one_way + c.await_tail_ns as f64;
                    Self::later(&mut best, t, Some((Node::Activity(a), sync)));
                }
                self.ret[ci] = best.0;
            }
            Node::Activity(ai) => {
                let a = &plan.activities[ai];
                let fetch = link.fetch_ns();
                match a.call {
                    Some((c, gap)) => {
                        let submit = link.submit_ns();
                        let t = self.issue[c] + plan.calls[c].submit_ns as f64 + submit + gap as f64 + fetch;
                        best = (t, Some((Node::Issue(c), Added { fetch, submit, ..Added::default() })));
                    }
                    None => best.0 = a.trace_start_ns as f64,
                }
                for &(p, _, gap) in &a.after {
                    Self::later(
                        &mut best,
                        self.end[p] + gap as f64,
                        Some((Node::Activity(p), Added::default())),
                    );
                }
                let dur = a.dur_ns as f64;
                let at_link = match a.kind {
                    ActivityKind::Memcpy { kind: CopyKind::HtoDPinned | CopyKind::HtoDPageable, bytes } => {
                        let fill = if bytes > 0 { link.rtt_ns.max(0.0) } else { 0.0 };
                        dur.max(bytes as f64 / link.h2d_bytes_per_s * 1e9) + fill
                    }
                    ActivityKind::Memcpy { kind: CopyKind::DtoHPinned | CopyKind::DtoHPageable, bytes } => {
                        dur.max(bytes as f64 / link.d2h_bytes_per_s * 1e9)
                    }
                    _ => dur,
                };
                self.start[ai] = best.0;
                self.end[ai] = best.0 + at_link;
                // A copy's own added time is charged where the path enters it.
                if let Some((_, added)) = best.1.as_mut() {
                    added.copy += at_link - dur;
                }
            }
        }
        let id = self.id(n);
        self.why[id] = best.1;
    }

    fn outcome(&self) -> Outcome {
        let first_activity =
            self.start.iter().copied().filter(|s| s.is_finite()).fold(f64::INFINITY, f64::min);
        let first_call = self.issue.iter().copied().filter(|s| s.is_finite()).fold(f64::INFINITY, f64::min);
        let origin = first_call.min(first_activity);
        let (mut last, mut last_node) = (f64::NEG_INFINITY, None);
        for (i, &e) in self.end.iter().enumerate() {
            if e > last {
                (last, last_node) = (e, Some(Node::Activity(i)));
            }
        }
        let gpu_last = last;
        for (i, &r) in self.ret.iter().enumerate() {
            if r > last {
                (last, last_node) = (r, Some(Node::Return(i)));
            }
        }
        let mut added = AddedTime::default();
        let mut node = last_node;
        let mut steps = 0usize;
        while let Some(n) = node {
            // Each step's predecessor ends no later than it does; the bound only guards a
            // plan whose cycle was broken.
            steps += 1;
            if steps > self.why.len() {
                break;
            }
            node = self.why[self.id(n)].map(|(p, a)| {
                added.command_fetch_ns += a.fetch;
                added.copies_ns += a.copy;
                added.synchronizations_ns += a.sync;
                added.submissions_ns += a.submit;
                p
            });
        }
        let finite = |x: f64| if x.is_finite() { x } else { 0.0 };
        Outcome {
            job_ns: finite(last - origin),
            gpu_span_ns: finite(gpu_last - first_activity),
            added,
            activity_start_ns: self.start.clone(),
            call_return_ns: self.ret.clone(),
        }
    }
}

/// The round trip (ns) at which the plan's job at `link` (its rates; its round trip
/// replaced) is `percent` slower than with no link: 0 if the rates alone make it so, `None`
/// if no round trip up to a second does. The job's time grows with the round trip, so a
/// bisection finds it (to 1 ns).
pub fn crossing_rtt_ns(plan: &Plan, link: &LinkParams, percent: f64) -> Option<f64> {
    let local = plan.evaluate(&LinkParams::LOCAL).job_ns;
    if local <= 0.0 {
        return None;
    }
    let over =
        |rtt_ns: f64| plan.evaluate(&LinkParams { rtt_ns, ..*link }).job_ns / local - 1.0 >= percent / 100.0;
    if over(0.0) {
        return Some(0.0);
    }
    let (mut lo, mut hi) = (0.0, 1e9);
    if !over(hi) {
        return None;
    }
    while hi - lo > 1.0 {
        let mid = (lo + hi) / 2.0;
        if over(mid) { hi = mid } else { lo = mid }
    }
    Some(hi)
}

/// When a call returned in the trace.
fn call_end(c: &PlannedCall) -> i64 {
    c.trace_start_ns.saturating_add(c.trace_dur_ns)
}

/// When an activity ended in the trace.
fn activity_end(a: &PlannedActivity) -> i64 {
    a.trace_start_ns.saturating_add(a.dur_ns)
}
