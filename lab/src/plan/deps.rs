//! The plan's edges inside the device and its synchronizations' awaits.

use std::collections::{BTreeMap, HashMap};

use super::{
    CROSS_STREAM_MARGIN_NS, DeviceEdge, Plan, PlannedActivity, STREAM_LOOKBACK, Stated, activity_end,
    blocking_copy, call_end, median, ns,
};
use crate::trace::{ActivityKind, CallKind, SyncSaid, Trace};

impl Plan {
    /// The activities, each after the call that submitted it.
    pub(super) fn activities_of(&mut self, trace: &Trace, by_corr: &HashMap<u64, usize>) {
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
    pub(super) fn device_edges(&mut self) {
        // Device edges: the binding one keeps its gap, the others the typical gap of their
        // kind at most.
        let stated = self.stated_producers();
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
            // A trace that says what its streams waited for is taken at its word: nothing
            // inferred from timing.
            let other = latest_end
                .iter()
                .filter(|&(&s, &j)| !self.explicit && s != a.stream && submitted_before(j))
                .map(|(_, &j)| (j, a.trace_start_ns - activity_end(&self.activities[j])))
                .min_by_key(|&(j, gap)| (gap, j));
            let stated: Vec<(usize, i64)> = stated[i]
                .iter()
                .map(|&p| (p, a.trace_start_ns - activity_end(&self.activities[p])))
                .collect();
            rank[i] = match call_of(i) {
                Some(c) => c as i64,
                None => stream.iter().chain(&other).map(|&(p, _)| rank[p]).max().unwrap_or(-1),
            };
            cands.push(Candidates { submit: a.call.map(|(_, g)| g), stream, other, stated });
        }
        self.edges_of(&cands);
    }

    /// Each activity's edges from its candidates: the one that decided its start keeps the
    /// gap the trace shows, the others the typical gap of their kind at most.
    fn edges_of(&mut self, cands: &[Candidates]) {
        let explained = |c: &Candidates| {
            c.submit.into_iter().chain(c.stream.map(|s| s.1)).chain(c.stated.iter().map(|s| s.1)).min()
        };
        let cross = |c: &Candidates| match (c.other, explained(c)) {
            (Some((_, o)), Some(e)) => o.saturating_add(CROSS_STREAM_MARGIN_NS) < e,
            (Some(_), None) => true,
            _ => false,
        };
        // Typical gaps where each kind decided: submission, stream, a stated wait.
        let mut typical = [Vec::new(), Vec::new(), Vec::new()];
        for c in cands {
            if cross(c) {
                continue;
            }
            let Some(decided) = explained(c) else { continue };
            if c.submit == Some(decided) {
                typical[0].push(decided);
            } else if c.stream.is_some_and(|s| s.1 == decided) {
                typical[1].push(decided);
            } else {
                typical[2].push(decided);
            }
        }
        let [t_submit, t_stream, t_stated] = typical.map(|v| median(v, 0).max(0));
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
            for &(p, g) in &c.stated {
                a.after.push((
                    p,
                    DeviceEdge::CrossStream,
                    if is_cross { g.min(t_stated) } else { keep(g, t_stated) },
                ));
                self.stated_waits += 1;
                self.stated.push(Stated::Activity { consumer: i, producer: p });
            }
        }
    }

    /// The work each call issued on each stream, in the calls' order: per stream, (call,
    /// activity) by call.
    fn issued_on_streams(&self) -> HashMap<u32, Vec<(usize, usize)>> {
        let mut on: HashMap<u32, Vec<(usize, usize)>> = HashMap::new();
        for (ci, c) in self.calls.iter().enumerate() {
            for &a in &c.submits {
                on.entry(self.activities[a].stream).or_default().push((ci, a));
            }
        }
        on
    }

    /// What each activity waits for on other streams as the trace states it (a stream that
    /// waited for an event: its first work issued after the wait waits for the work issued
    /// on the event's stream before the event was recorded). Empty for a trace that does not
    /// say.
    fn stated_producers(&self) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new(); self.activities.len()];
        if !self.explicit {
            return out;
        }
        let on = self.issued_on_streams();
        for (ci, c) in self.calls.iter().enumerate() {
            let Some(SyncSaid::StreamWaitsEvent { stream, on: Some(rec) }) = c.waited else { continue };
            let Some(&recorded_by) = self.by_correlation.get(&rec.record) else { continue };
            let (Some(producer), Some(consumer)) =
                (last_before(&on, rec.stream, recorded_by), first_after(&on, stream, ci))
            else {
                continue;
            };
            // Only work submitted before the waiting work can be waited for: a record that a
            // broken trace places after the wait would make the consumer's call wait for a
            // later call's submission, which waits for it (a stall).
            let call = |a: usize| self.activities[a].call.map_or(usize::MAX, |(c, _)| c);
            if stream != rec.stream && call(producer) < call(consumer) && !out[consumer].contains(&producer) {
                out[consumer].push(producer);
            }
        }
        out
    }

    /// What each synchronizing call waited for (see below).
    pub(super) fn awaits(&mut self) {
        // Awaits. A synchronizing call returns after the work it waited for: a device
        // synchronization (or `cudaFree`) after the last activity issued before it on every
        // stream; a stream or event synchronization after the last issued before it on the
        // stream the trace names (its `cuda_sync` event) or, in a trace that does not say,
        // the stream whose work ended while it waited; a synchronous or pageable copy after
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
        // The last activity issued so far on each stream, as the calls go by; the stream each
        // thread gave work to last.
        let mut last_issued: BTreeMap<u32, usize> = BTreeMap::new();
        let mut last_stream_of: Vec<Option<u32>> = vec![None; self.threads];
        let on = self.issued_on_streams();
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
            let own_copies = || {
                c.submits.iter().copied().filter(|&a| {
                    let k = self.activities[a].kind;
                    blocking_copy(k) || (c.copies_synchronously && copy_crosses_pcie(k))
                })
            };
            let stated = if self.explicit { c.waited } else { None };
            let (awaited, how): (Vec<usize>, Said) = match (c.kind, stated) {
                (CallKind::EventQuery | CallKind::StreamWaitEvent, _) => (Vec::new(), Said::Stated),
                (_, Some(SyncSaid::Context)) => (last_issued.values().copied().collect(), Said::Stated),
                (_, Some(SyncSaid::Stream(s))) => {
                    (last_issued.get(&s).copied().into_iter().collect(), Said::Stated)
                }
                (_, Some(SyncSaid::Event(rec))) => {
                    let by = rec.and_then(|r| Some((r.stream, *self.by_correlation.get(&r.record)?)));
                    (by.and_then(|(s, by)| last_before(&on, s, by)).into_iter().collect(), Said::Stated)
                }
                (CallKind::DeviceSynchronize, _) => (last_issued.values().copied().collect(), Said::Stated),
                // CUDA and HIP document these as synchronizing the device.
                (CallKind::Free, _) => (last_issued.values().copied().collect(), Said::Documented),
                (CallKind::StreamSynchronize | CallKind::EventSynchronize, _) => {
                    // The stream whose work ended while it waited; failing that, the one its
                    // thread gave work to last (a framework synchronizes its current stream).
                    let s = ended_inside()
                        .map(|a| self.activities[a].stream)
                        .or_else(|| last_stream_of[c.thread]);
                    (s.and_then(|s| last_issued.get(&s).copied()).into_iter().collect(), Said::Inferred)
                }
                _ => (own_copies().collect(), Said::Documented),
            };
            for &a in issued {
                last_issued.insert(self.activities[a].stream, a);
                last_stream_of[c.thread] = Some(self.activities[a].stream);
            }
            let Some(latest) = awaited.iter().map(|&a| activity_end(&self.activities[a])).max() else {
                continue;
            };
            // Work that ended after the call returned was not waited for (a trace whose
            // times disagree): the call keeps its own time, counted.
            if latest > end {
                self.awaits_contradicted += 1;
                continue;
            }
            match how {
                Said::Stated => {}
                Said::Documented => self.implicit_syncs += 1,
                Said::Inferred => self.syncs_inferred += 1,
            }
            if how != Said::Inferred {
                self.stated.extend(awaited.iter().map(|&a| Stated::Call { call: ci, activity: a }));
            }
            // Work done before the call began left it only its own time.
            let tail = end - latest.max(start);
            let c = &mut self.calls[ci];
            c.awaits = awaited;
            c.await_tail_ns = tail;
            c.floor_ns = if c.submits.is_empty() { tail } else { tail.max(c.submit_ns) };
        }
    }
}

/// What may explain an activity's start: its submission's gap, its stream predecessor, the
/// latest end on another stream (for inference), the producers the trace states.
struct Candidates {
    submit: Option<i64>,
    stream: Option<(usize, i64)>,
    other: Option<(usize, i64)>,
    stated: Vec<(usize, i64)>,
}

/// How a synchronizing call's await is known.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Said {
    /// The trace says (its `cuda_sync` events, or a device synchronization).
    Stated,
    /// CUDA and HIP document it (a synchronous copy, `cudaFree`).
    Documented,
    /// Inferred from timing.
    Inferred,
}

/// The last activity issued on `stream` by a call before call `before`.
fn last_before(on: &HashMap<u32, Vec<(usize, usize)>>, stream: u32, before: usize) -> Option<usize> {
    let v = on.get(&stream)?;
    let n = v.partition_point(|&(c, _)| c < before);
    n.checked_sub(1).map(|k| v[k].1)
}

/// The first activity issued on `stream` by a call after call `after`.
fn first_after(on: &HashMap<u32, Vec<(usize, usize)>>, stream: u32, after: usize) -> Option<usize> {
    let v = on.get(&stream)?;
    v.get(v.partition_point(|&(c, _)| c <= after)).map(|&(_, a)| a)
}

fn copy_crosses_pcie(kind: ActivityKind) -> bool {
    matches!(kind, ActivityKind::Memcpy { kind, .. } if kind.crosses_pcie())
}
