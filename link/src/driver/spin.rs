//! What a busy-polling loop spends on nothing: the time from the start of a pass that found
//! no work to the start of the next pass, summed. A thread's CPU time less this is the CPU
//! its work took — what `dxpu bench bridge` reports per GiB — where the CPU time of a
//! spinning thread alone is only the inverse of the rate.
//!
//! A pass is timed by the clock reading the loop takes at its start anyway, so the meter
//! reads no clock of its own. A gap longer than [`SPIN_GAP_MAX`] is not counted (the thread
//! slept, was descheduled, or did other work between the passes: none of that is a spin),
//! nor one across a sleep in the kernel ([`SpinMeter::slept`]).
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::Time;

/// The longest gap between an empty pass's start and the next pass's start counted as
/// spinning: an empty pass takes one or two system calls (1–10 µs); a longer gap had
/// something else in it.
pub const SPIN_GAP_MAX: Duration = Duration::from_micros(100);

/// The totals, readable from any thread while the loop runs.
#[derive(Debug, Default)]
pub struct SpinTotals {
    spun_ns: AtomicU64,
    empty_passes: AtomicU64,
}

impl SpinTotals {
    /// Time spent on passes that found nothing to do.
    pub fn spun(&self) -> Duration {
        Duration::from_nanos(self.spun_ns.load(Ordering::Relaxed))
    }
    /// Passes that found nothing to do.
    pub fn empty_passes(&self) -> u64 {
        self.empty_passes.load(Ordering::Relaxed)
    }
}

/// Meters one loop's passes; see the module's doc.
#[derive(Debug, Default)]
pub struct SpinMeter {
    totals: Arc<SpinTotals>,
    /// The start of the last pass, if it found nothing.
    empty_since: Option<Time>,
}

impl SpinMeter {
    /// A meter with nothing counted.
    pub fn new() -> SpinMeter {
        SpinMeter::default()
    }

    /// A pass starts at `now`: the gap since an empty one counts, if short.
    #[inline]
    pub fn pass_began(&mut self, now: Time) {
        if let Some(then) = self.empty_since.take() {
            let gap = now - then;
            if gap <= SPIN_GAP_MAX {
                self.totals.spun_ns.fetch_add(gap.as_nanos() as u64, Ordering::Relaxed);
            }
        }
    }

    /// The pass that began at `began` ended, having done work or not.
    #[inline]
    pub fn pass_ended(&mut self, began: Time, worked: bool) {
        if !worked {
            self.empty_since = Some(began);
            self.totals.empty_passes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The loop slept in the kernel since its last pass: the gap to the next one is not a spin.
    pub fn slept(&mut self) {
        self.empty_since = None;
    }

    /// The totals, shared: they go on counting.
    pub fn totals(&self) -> Arc<SpinTotals> {
        self.totals.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(us: u64) -> Time {
        Time::from_nanos(us * 1000)
    }

    #[test]
    fn only_short_gaps_after_empty_passes_count() {
        let mut m = SpinMeter::new();
        let totals = m.totals();
        // Working passes count nothing, however far apart.
        m.pass_began(at(0));
        m.pass_ended(at(0), true);
        m.pass_began(at(50));
        m.pass_ended(at(50), false);
        // 3 µs from an empty pass to the next: spun.
        m.pass_began(at(53));
        m.pass_ended(at(53), false);
        // 500 µs: the thread did something else (or was descheduled) — not counted.
        m.pass_began(at(553));
        m.pass_ended(at(553), false);
        // A sleep in between: not counted either, however short.
        m.slept();
        m.pass_began(at(560));
        m.pass_ended(at(560), true);
        m.pass_began(at(561));
        assert_eq!(totals.spun(), Duration::from_micros(3));
        assert_eq!(totals.empty_passes(), 3);
    }

    /// At the edge: a gap of exactly the maximum counts, one nanosecond more does not; a
    /// clock that went backwards counts nothing.
    #[test]
    fn the_gap_limit_is_inclusive_and_time_never_runs_back() {
        let mut m = SpinMeter::new();
        let max = SPIN_GAP_MAX.as_nanos() as u64;
        m.pass_ended(Time::from_nanos(0), false);
        m.pass_began(Time::from_nanos(max));
        m.pass_ended(Time::from_nanos(max), false);
        m.pass_began(Time::from_nanos(2 * max + 1));
        m.pass_ended(Time::from_nanos(2 * max + 1), false);
        m.pass_began(Time::from_nanos(5));
        assert_eq!(m.totals().spun(), SPIN_GAP_MAX);
    }
}
