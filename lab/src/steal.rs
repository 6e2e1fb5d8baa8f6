//! The hypervisor's steal time: how long a virtual CPU was ready to run while the host ran
//! something else (`/proc/stat`, the eighth figure of each `cpuN` line, in clock ticks;
//! proc(5)). On the machine the experiments were measured on, the A100 training job's
//! bridged runs were either 33–37 % or 50–80 % slower than direct, with the cores in one
//! placement throughout; the slow ones came in the invocations where the hypervisor took
//! 110–520 ms from the two CPUs, and none where it took 0–20 ms
//! (docs/performance-model.md, *The host's looks at its words*). A run it took a share of
//! measured the machine, not the job: the comparison reads the steal around each run and
//! says which pairs ran so.

use std::time::Duration;

/// A run is stolen from when the hypervisor took at least this share of its time from one
/// of its CPUs …
pub const STOLEN_SHARE: f64 = 0.02;
/// … and at least this many clock ticks (the counter's unit: one tick's change may be what
/// an earlier fraction of a tick carried over).
pub const STOLEN_TICKS: u64 = 2;

/// The steal time of each of `cpus` so far; `None` where `/proc/stat` cannot be read or
/// lacks one of them (a kernel without steal accounting reports 0).
pub fn read(cpus: &[usize]) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse(&stat, cpus)
}

/// [`read`] from the text of `/proc/stat`: clock ticks per CPU, in the order asked.
pub fn parse(stat: &str, cpus: &[usize]) -> Option<Vec<u64>> {
    cpus.iter()
        .map(|&cpu| {
            let label = format!("cpu{cpu}");
            let line = stat.lines().find(|l| l.split_whitespace().next() == Some(label.as_str()))?;
            // user nice system idle iowait irq softirq steal …: the eighth figure.
            line.split_whitespace().nth(8)?.parse().ok()
        })
        .collect()
}

/// [`read`] of the two CPUs a placement pins the experiments' threads to; `None` unplaced.
pub fn of_placed(placement: Option<crate::affinity::Placement>) -> Option<Vec<u64>> {
    placement.and_then(|p| read(&[p.device, p.host]))
}

/// [`most_between`] two readings where both were made.
pub fn during(before: &Option<Vec<u64>>, after: &Option<Vec<u64>>) -> Option<Duration> {
    Some(most_between(before.as_ref()?, after.as_ref()?))
}

/// What the hypervisor took during a pair's two runs: the most from either placed CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PairSteal {
    /// During the direct run.
    pub direct: Duration,
    /// During the bridged run.
    pub bridged: Duration,
}

impl PairSteal {
    /// From each run's two readings ([`of_placed`]); `None` where one was not made.
    pub fn of(direct: [&Option<Vec<u64>>; 2], bridged: [&Option<Vec<u64>>; 2]) -> Option<PairSteal> {
        Some(PairSteal { direct: during(direct[0], direct[1])?, bridged: during(bridged[0], bridged[1])? })
    }

    /// Whether it took a share of either run, of the lengths given ([`stole_from`]).
    pub fn stole_from(&self, direct_run: Duration, bridged_run: Duration) -> bool {
        stole_from(self.direct, direct_run) || stole_from(self.bridged, bridged_run)
    }

    /// Direct and bridged, in milliseconds, as the reports give them.
    pub fn ms(&self) -> [f64; 2] {
        [self.direct.as_secs_f64() * 1e3, self.bridged.as_secs_f64() * 1e3]
    }
}

/// How many pairs were stolen from, of each pair's verdict; `None` where no pair's steal
/// was read.
pub fn count(from: &[Option<bool>]) -> Option<usize> {
    from.iter().any(Option::is_some).then(|| from.iter().filter(|f| **f == Some(true)).count())
}

/// The report's line where `n` of `pairs` pairs were stolen from: what they measured was
/// the machine, not `what`.
pub fn stolen_line(n: usize, pairs: usize, what: &str) -> String {
    format!(
        "  STOLEN: in {n} of {pairs} pairs the hypervisor took {:.0} % or more of a run's time from one of its CPUs (steal time, /proc/stat): those pairs measured the machine, not {what}",
        STOLEN_SHARE * 100.0
    )
}

/// The most any CPU lost between two readings, as a time.
pub fn most_between(before: &[u64], after: &[u64]) -> Duration {
    let ticks = before.iter().zip(after).map(|(b, a)| a.saturating_sub(*b)).max().unwrap_or(0);
    ticks_to_time(ticks)
}

/// Whether `stolen` from a run of `run` makes it the machine's rather than the job's.
pub fn stole_from(stolen: Duration, run: Duration) -> bool {
    stolen >= ticks_to_time(STOLEN_TICKS) && stolen.as_secs_f64() >= STOLEN_SHARE * run.as_secs_f64()
}

fn ticks_to_time(ticks: u64) -> Duration {
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Duration::from_nanos(ticks.saturating_mul(1_000_000_000 / hz))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  328231 0 36859 427735 21973 0 2457 7448 0 0\n\
                        cpu0 155415 0 17675 224243 10084 0 1057 3793 0 0\n\
                        cpu1 172815 0 19183 203491 11889 0 1400 3654 0 0\n\
                        intr 1 2 3\n";

    #[test]
    fn each_cpus_steal_is_its_eighth_figure_and_a_cpu_not_there_is_none() {
        assert_eq!(parse(STAT, &[1, 0]), Some(vec![3654, 3793]));
        assert_eq!(parse(STAT, &[2]), None);
        // An older kernel's line, without the steal column.
        assert_eq!(parse("cpu0 1 2 3 4 5 6 7\n", &[0]), None);
        assert_eq!(parse("cpu0 1 2 3 4 5 6 7 x\n", &[0]), None);
    }

    #[test]
    fn a_run_is_stolen_from_past_both_the_share_and_two_ticks() {
        let tick = ticks_to_time(1);
        assert_eq!(most_between(&[10, 20], &[11, 25]), 5 * tick);
        // A counter that went back (another boot's reading) counts for nothing.
        assert_eq!(most_between(&[10], &[5]), Duration::ZERO);
        // A pair stolen from in either run, and the count over pairs read and not.
        let run = Duration::from_millis(700);
        let pair = PairSteal { direct: Duration::ZERO, bridged: Duration::from_millis(100) };
        assert!(pair.stole_from(run, run) && !pair.stole_from(run, Duration::from_secs(100)));
        assert_eq!(pair.ms(), [0.0, 100.0]);
        assert_eq!(count(&[Some(true), None, Some(false), Some(true)]), Some(2));
        assert_eq!(count(&[None, None]), None);
        assert_eq!(count(&[Some(false)]), Some(0));
        // A reading not made: no figure, not a zero.
        assert_eq!(during(&Some(vec![1, 2]), &Some(vec![3, 2])), Some(2 * tick));
        assert_eq!(during(&None, &Some(vec![3])), None);
        assert_eq!(during(&Some(vec![3]), &None), None);
        assert_eq!(PairSteal::of([&Some(vec![1]), &Some(vec![1])], [&None, &Some(vec![3])]), None);
        let run = Duration::from_millis(700);
        assert!(!stole_from(tick, run), "one tick may be an earlier fraction carried over");
        assert!(stole_from((2 * tick).max(Duration::from_millis(14)), run));
        // A short run: two ticks are far more than its share, and they count.
        assert!(stole_from(2 * tick, Duration::from_micros(400)));
        // A long run: two ticks are less than its share.
        assert!(!stole_from(2 * tick, Duration::from_secs(100)));
    }
}
