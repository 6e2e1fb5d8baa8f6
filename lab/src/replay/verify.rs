//! What a replay measured, and its verification: the work ran as the plan and the trace
//! say, and the copies' bytes landed.

use std::collections::BTreeMap;

use driver::{PciFunction, SimGpuDriver, WaitMode};

use super::{
    MAX_COPY_BYTES, RATE_COPY_BYTES, ReplayError, ReplayRun, Replaying, copied, copy_bytes, driver, to_device,
};
use crate::plan::Stated;

impl Replaying<'_> {
    /// The run's times and where they went, checked against the plan.
    pub(super) fn measure<P: PciFunction>(
        &mut self,
        d: &mut SimGpuDriver<P>,
    ) -> Result<ReplayRun, ReplayError> {
        let plan = self.plan;
        let words: Vec<(u64, u64, u64)> = (0..plan.activities.len()).map(|a| self.word(d, a)).collect();
        // Every activity has released its word (or is a problem below): the device's count of
        // what its copy engines moved, before the checks' own read-backs add to it.
        let (after, before) = (copied(d), self.copied_before);
        let bytes_copied = (after.0.wrapping_sub(before.0), after.1.wrapping_sub(before.1));
        let (first, origin) = (self.first, self.origin);
        let trace_t = move |real: u64| first as f64 + real.saturating_sub(origin) as f64;
        let mut problems = Vec::new();
        let mut out = ReplayRun {
            host_late_ns: self.host_late.0,
            host_late_max_ns: self.host_late.1,
            ..ReplayRun::default()
        };
        let mut large = [LargeCopies::default(); 2];
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
                let way = &mut large[usize::from(!to_device(k))];
                way.bytes += bytes.min(MAX_COPY_BYTES) as f64;
                way.ns += (end - begin) as f64;
                way.served_ns += overlap(&self.served, begin, end) as f64;
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
        if bytes_copied != self.bytes_submitted {
            problems.push(format!(
                "the device's copy engines moved {} bytes to VRAM and {} to host memory; the run's copies are {} and {}",
                bytes_copied.0, bytes_copied.1, self.bytes_submitted.0, self.bytes_submitted.1
            ));
        }
        out.bytes_copied = bytes_copied;
        problems.extend(self.check_copies(d, &words)?);
        out.copies_checked = self.copies_checked;
        out.copies_made = (self.copies_made.0 as usize, self.copies_made.1 as usize);
        if !problems.is_empty() {
            let n = problems.len();
            problems.truncate(5);
            return Err(ReplayError::Verification(format!("{n} problems: {}", problems.join("; "))));
        }
        let [to, from] = large;
        out.copy_bytes_per_s = (to.rate(), from.rate());
        out.copy_served_share = (to.served_share(), from.served_share());
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

    /// Checks copy out `a` where it landed, once, if its place in host memory was given to
    /// no later copy out.
    pub(super) fn check_out<P: PciFunction>(&mut self, d: &mut SimGpuDriver<P>, a: usize) {
        let Some(c) = self.copy_at[a] else { return };
        if self.copy_checked[a] || self.out_given[self.r.copies.place_out(&c)] != Some(a) {
            return;
        }
        self.copy_checked[a] = true;
        self.copies_checked.1 += 1;
        self.wrong.extend(self.r.copies.check_out(d, &c));
    }

    /// Checks the copies where they landed after the run: in each place, the last copy to
    /// land there, where no other copy into it ran beside it; and says what was wrong with
    /// any copy, now or when it was waited for.
    fn check_copies<P: PciFunction>(
        &mut self,
        d: &mut SimGpuDriver<P>,
        words: &[(u64, u64, u64)],
    ) -> Result<Vec<String>, ReplayError> {
        let mut by_place: BTreeMap<(bool, usize), Vec<usize>> = BTreeMap::new();
        for (a, c) in self.copy_at.iter().enumerate() {
            let Some(c) = c else { continue };
            let to_dev = copy_bytes(self.plan.activities[a].kind).is_some_and(|(k, _)| to_device(k));
            let place = if to_dev { self.r.copies.place_in(c) } else { self.r.copies.place_out(c) };
            by_place.entry((to_dev, place)).or_default().push(a);
        }
        for ((to_dev, _), copies) in by_place {
            let Some(&last) = copies.iter().max_by_key(|&&a| (words[a].2, a)) else { continue };
            let beside = |o: usize| o != last && words[o].1 < words[last].2 && words[o].2 > words[last].1;
            if copies.iter().any(|&o| beside(o)) || self.copy_checked[last] {
                continue;
            }
            let Some(c) = self.copy_at[last] else { continue };
            if to_dev {
                self.copy_checked[last] = true;
                self.copies_checked.0 += 1;
                self.wrong.extend(self.r.copies.check_in(d, &c)?);
            } else {
                self.out_given[self.r.copies.place_out(&c)] = Some(last);
                self.check_out(d, last);
            }
        }
        Ok(std::mem::take(&mut self.wrong))
    }
}

/// The copies one way that tell the platform's rate ([`RATE_COPY_BYTES`] or more, held
/// beyond their traced time): their bytes, their time, and how much of it the platform was
/// served on the replay's thread, ns.
#[derive(Clone, Copy, Default)]
struct LargeCopies {
    bytes: f64,
    ns: f64,
    served_ns: f64,
}

impl LargeCopies {
    fn rate(&self) -> Option<f64> {
        (self.ns > 0.0).then(|| self.bytes / self.ns * 1e9)
    }

    fn served_share(&self) -> Option<f64> {
        (self.ns > 0.0).then(|| self.served_ns / self.ns)
    }
}

/// How much of `[begin, end)` the intervals `spans` (in order, not overlapping) cover, ns.
fn overlap(spans: &[(u64, u64)], begin: u64, end: u64) -> u64 {
    let first = spans.partition_point(|&(_, e)| e <= begin);
    spans[first..]
        .iter()
        .take_while(|&&(b, _)| b < end)
        .map(|&(b, e)| e.min(end).saturating_sub(b.max(begin)))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::overlap;

    #[test]
    fn the_time_served_inside_a_copy_counts_only_what_falls_inside_it() {
        let spans = [(10, 20), (30, 40), (50, 60)];
        assert_eq!(overlap(&spans, 0, 100), 30);
        assert_eq!(overlap(&spans, 15, 35), 10, "half of the first, half of the second");
        assert_eq!(overlap(&spans, 20, 30), 0, "between two");
        assert_eq!(overlap(&spans, 55, 55), 0, "an empty copy");
        assert_eq!(overlap(&spans, 60, 1_000), 0, "after them all");
        assert_eq!(overlap(&[], 0, 100), 0);
        assert_eq!(overlap(&[(0, u64::MAX)], 5, 7), 2);
    }
}
