//! What a replay measured, and its verification: the work ran as the plan and the trace
//! say, and the copies' bytes landed.

use driver::{PciFunction, SimGpuDriver, WaitMode};

use super::{
    MAX_COPY_BYTES, RATE_COPY_BYTES, ReplayError, ReplayRun, Replayer, Run, copy_bytes, driver, to_device,
};
use crate::plan::{Plan, Stated};
use crate::trace::CopyKind;

impl Replayer {
    /// The last copy in's first bytes are in VRAM where it wrote them.
    pub(super) fn verify_copy<P: PciFunction>(
        &self,
        d: &mut SimGpuDriver<P>,
        plan: &Plan,
    ) -> Result<(), ReplayError> {
        let copies: Vec<usize> = plan
            .activities
            .iter()
            .enumerate()
            .filter(|(_, a)| copy_bytes(a.kind).is_some_and(|(k, _)| to_device(k)))
            .map(|(i, _)| i)
            .collect();
        let Some(&last) = copies.last() else { return Ok(()) };
        let (_, bytes) = copy_bytes(plan.activities[last].kind).unwrap_or((CopyKind::Other, 0));
        let n = bytes.min(MAX_COPY_BYTES).min(4096) as usize;
        let at = self.h2d_dest[(copies.len() - 1) % self.h2d_dest.len()];
        let mut back = vec![0u8; n];
        d.memcpy_from_device(at, &mut back).map_err(driver("reading back the last copy in"))?;
        if back != self.pattern[..n] {
            return Err(ReplayError::Verification(format!(
                "the last copy in (activity {last}, {bytes} bytes) did not put its bytes at VRAM {at:#x}"
            )));
        }
        Ok(())
    }
}

impl Run<'_> {
    /// The run's times and where they went, checked against the plan.
    pub(super) fn measure<P: PciFunction>(&self, d: &mut SimGpuDriver<P>) -> Result<ReplayRun, ReplayError> {
        let plan = self.plan;
        let words: Vec<(u64, u64, u64)> = (0..plan.activities.len()).map(|a| self.word(d, a)).collect();
        let trace_t = |real: u64| self.first as f64 + real.saturating_sub(self.origin) as f64;
        let mut problems = Vec::new();
        let mut out = ReplayRun {
            host_late_ns: self.host_late.0,
            host_late_max_ns: self.host_late.1,
            ..ReplayRun::default()
        };
        let (mut rate_in, mut rate_out) = ((0.0, 0.0), (0.0, 0.0));
        for (a, (act, &(v, begin, end))) in plan.activities.iter().zip(&words).enumerate() {
            if v != 1 || end < begin {
                problems.push(format!("activity {a}: release word {v} (begin {begin}, end {end})"));
                continue;
            }
            if (end - begin) as i64 + 1_000 < act.dur_ns {
                problems.push(format!(
                    "activity {a}: ran {} ns of its traced {} ns",
                    end - begin,
                    act.dur_ns
                ));
            }
            let mut ready = self.submit_real[a];
            for &(p, kind, _) in &act.after {
                let p_end = words[p].2;
                if begin < p_end {
                    problems.push(format!(
                        "activity {a} began {} ns before {kind:?} predecessor {p} ended",
                        p_end - begin
                    ));
                }
                ready = ready.max(p_end);
            }
            out.fetch_wait_ns += begin.saturating_sub(ready) as f64;
            if let Some((_, _)) = copy_bytes(act.kind) {
                out.copy_extra_ns += ((end - begin) as f64 - act.dur_ns as f64).max(0.0);
            }
            if copy_bytes(act.kind).is_some_and(|(_, b)| b > MAX_COPY_BYTES) {
                out.copies_capped += 1;
            }
            if let Some((k, bytes)) = copy_bytes(act.kind)
                && bytes >= RATE_COPY_BYTES
                && (end - begin) as f64 > act.dur_ns as f64 * 1.05
            {
                let way = if to_device(k) { &mut rate_in } else { &mut rate_out };
                way.0 += bytes.min(MAX_COPY_BYTES) as f64;
                way.1 += (end - begin) as f64;
            }
        }
        // What the trace states, whatever edges this replay followed: each stream wait held
        // its work until what it waited for ended, each synchronization returned after it.
        for st in &plan.stated {
            match *st {
                Stated::Activity { consumer, producer } if words[consumer].1 < words[producer].2 => {
                    problems.push(format!(
                        "activity {consumer} began {} ns before activity {producer} ended, which its stream waited for",
                        words[producer].2 - words[consumer].1
                    ));
                }
                Stated::Call { call, activity } => {
                    let (ret, end) = (self.ret[call].unwrap_or(f64::NAN), trace_t(words[activity].2));
                    if ret.is_nan() || ret < end {
                        problems.push(format!(
                            "call {call} ({:?}) returned {:.0} ns before activity {activity} ended, which it synchronizes with",
                            plan.calls[call].kind,
                            end - ret
                        ));
                    }
                }
                Stated::Activity { .. } => {}
            }
        }
        if !problems.is_empty() {
            let n = problems.len();
            problems.truncate(5);
            return Err(ReplayError::Verification(format!("{n} problems: {}", problems.join("; "))));
        }
        let rate = |(bytes, ns): (f64, f64)| (ns > 0.0).then(|| bytes / ns * 1e9);
        out.copy_bytes_per_s = (rate(rate_in), rate(rate_out));
        for (c, call) in plan.calls.iter().enumerate() {
            if let Some(last) = call.awaits.iter().map(|&a| words[a].2).max() {
                out.sync_notify_ns += self.seen_at[c].saturating_sub(last) as f64;
            }
        }
        out.activity_begin_ns = words.iter().map(|w| trace_t(w.1)).collect();
        out.activity_end_ns = words.iter().map(|w| trace_t(w.2)).collect();
        out.call_return_ns = self.ret.iter().map(|r| r.unwrap_or(f64::NAN)).collect();
        let first_begin = out.activity_begin_ns.iter().copied().fold(f64::INFINITY, f64::min);
        let last_end = out.activity_end_ns.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let last_return =
            out.call_return_ns.iter().copied().filter(|t| t.is_finite()).fold(f64::NEG_INFINITY, f64::max);
        out.gpu_span_ns = if last_end.is_finite() { last_end - first_begin } else { 0.0 };
        out.job_ns = last_end.max(last_return) - self.first as f64;
        // The device drained: a fence on channel 0 for good measure (reports a device error).
        d.sync(WaitMode::Poll).map_err(driver("the last fence"))?;
        Ok(out)
    }
}
