//! What the machine took from a run, in two ways a run cannot tell from the job's own pace:
//!
//! - **The hypervisor's steal**: how long a virtual CPU was ready to run while the host ran
//!   something else (`/proc/stat`, the eighth figure of each `cpuN` line, in clock ticks;
//!   proc(5)). On the machine the experiments were measured on, the A100 training job's
//!   bridged runs were either 33–37 % or 50–80 % slower than direct, with the cores in one
//!   placement throughout; the slow ones came in the invocations where the hypervisor took
//!   110–520 ms from the two CPUs, and none where it took 0–20 ms
//!   (docs/performance-model.md, *The host's looks at its words*).
//! - **Another process on its CPUs**: how long the experiment's threads waited on a run
//!   queue — runnable while the CPU ran another task (`/proc/self/task/*/schedstat`, the
//!   second figure, in ns; the kernel's sched_info). The experiment's own threads hand the
//!   CPUs to each other too, so a quiet run has some: at most 4.7 % of a run's time in the
//!   real traces' replays of half a second or more (3.5–30 ms), 0.1–7 ms in an MI250
//!   trace's runs of 10 ms; with a busy loop on one of the two CPUs, 354–507 ms per run of
//!   0.65–0.95 s (docs/performance-model.md, *Another process on the CPUs*).
//!
//! A run either took a share of measured the machine, not the job: the comparison reads
//! both around each run and says which pairs ran so. Where the run's threads are not placed
//! and end with it (a bench row's endpoints), [`MachineReading`] reads the whole machine
//! instead: the most any CPU lost to steal, and the CPU time other tasks had (the CPUs'
//! busy time less this process's CPU clock, which keeps what ended threads used).

use std::time::Duration;

/// A run is stolen from when the hypervisor took at least this share of its time from one
/// of its CPUs …
pub const STOLEN_SHARE: f64 = 0.02;
/// … and at least this many clock ticks (the counter's unit: one tick's change may be what
/// an earlier fraction of a tick carried over).
pub const STOLEN_TICKS: u64 = 2;
/// A run is contended when the experiment's threads waited on a run queue, in all, at least
/// this share of its time: above what its own threads' hand-overs make in a quiet run …
pub const CONTENDED_SHARE: f64 = 0.15;
/// … and at least this long: a few of another task's time slices (a few ms each), more than
/// the hand-overs of a quiet run of a few ms (the MI250 trace's 9–10 ms runs: 0.1–7 ms).
pub const CONTENDED_FLOOR: Duration = Duration::from_millis(20);

/// How long this process's threads have waited on a run queue so far, summed over the
/// threads alive now (`/proc/self/task/*/schedstat`); `None` where it cannot be read (a
/// kernel without sched_info). A thread that ended between two readings takes its waits
/// with it: read around runs whose threads outlive them.
pub fn run_queue_waits() -> Option<Duration> {
    let (mut ns, mut read) = (0u64, false);
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        // A thread that ended since the listing has no file any more.
        let Ok(text) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else { continue };
        ns = ns.saturating_add(waited_ns(&text)?);
        read = true;
    }
    read.then(|| Duration::from_nanos(ns))
}

/// The run-queue wait of one `schedstat` line: time on the CPU, time waiting, time slices.
fn waited_ns(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().nth(1)?.parse().ok()
}

/// What the machine had taken so far: the steal of each placed CPU, and the threads'
/// run-queue waits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    steal: Option<Vec<u64>>,
    waited: Option<Duration>,
}

impl Reading {
    /// Now, with the steal of the two CPUs `placement` pins the threads to (none unplaced).
    pub fn now(placement: Option<crate::affinity::Placement>) -> Reading {
        Reading { steal: of_placed(placement), waited: run_queue_waits() }
    }
}

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

/// What the machine took during a pair's two runs, direct then bridged: the most the
/// hypervisor took from either placed CPU, and how long the threads waited for a CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairTaken {
    /// The steal, where it was read.
    pub steal: Option<[Duration; 2]>,
    /// The run-queue waits, where they were read.
    pub waited: Option<[Duration; 2]>,
}

impl PairTaken {
    /// From the readings around each run ([`Reading::now`]).
    pub fn of(direct: [&Reading; 2], bridged: [&Reading; 2]) -> PairTaken {
        let steal = |r: [&Reading; 2]| during(&r[0].steal, &r[1].steal);
        let waited = |r: [&Reading; 2]| Some(r[1].waited?.saturating_sub(r[0].waited?));
        PairTaken {
            steal: steal(direct).zip(steal(bridged)).map(|(d, b)| [d, b]),
            waited: waited(direct).zip(waited(bridged)).map(|(d, b)| [d, b]),
        }
    }

    /// Whether the hypervisor took a share of either run, of the lengths given
    /// ([`stole_from`]); `None` where the steal was not read.
    pub fn stole_from(&self, direct_run: Duration, bridged_run: Duration) -> Option<bool> {
        self.steal.map(|[d, b]| stole_from(d, direct_run) || stole_from(b, bridged_run))
    }

    /// Whether the threads waited for a CPU [`CONTENDED_SHARE`] or more of either run;
    /// `None` where the waits were not read.
    pub fn contended(&self, direct_run: Duration, bridged_run: Duration) -> Option<bool> {
        self.waited.map(|[d, b]| contended(d, direct_run) || contended(b, bridged_run))
    }

    /// Either: the pair measured the machine; `None` where neither was read.
    pub fn taken_from(&self, direct_run: Duration, bridged_run: Duration) -> Option<bool> {
        either(self.stole_from(direct_run, bridged_run), self.contended(direct_run, bridged_run))
    }

    /// `verdict` of each pair of `taken` with its runs' lengths (direct, bridged), in order.
    pub fn each(
        taken: &[PairTaken],
        runs: impl Iterator<Item = (Duration, Duration)>,
        verdict: fn(&PairTaken, Duration, Duration) -> Option<bool>,
    ) -> Vec<Option<bool>> {
        taken.iter().zip(runs).map(|(t, (d, b))| verdict(t, d, b)).collect()
    }

    /// The steal, direct and bridged, in milliseconds, as the reports give it.
    pub fn steal_ms(&self) -> Option<[f64; 2]> {
        self.steal.map(|s| s.map(|d| d.as_secs_f64() * 1e3))
    }

    /// The run-queue waits, direct and bridged, in milliseconds.
    pub fn waited_ms(&self) -> Option<[f64; 2]> {
        self.waited.map(|w| w.map(|d| d.as_secs_f64() * 1e3))
    }

    /// `"s / s ms stolen, w / w ms waited"` for a report's pair line ("-" where not read).
    pub fn text(&self) -> String {
        let two = |v: Option<[Duration; 2]>| {
            v.map_or("-".to_string(), |[d, b]| format!("{} / {} ms", d.as_millis(), b.as_millis()))
        };
        format!("{} stolen, {} waited", two(self.steal), two(self.waited))
    }
}

/// Two verdicts of which either may not have been read: true if either is, `None` if
/// neither was read.
fn either(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a == Some(true) || b == Some(true)),
    }
}

/// Whether threads that `waited` for a CPU during a run of `run` were contended.
pub fn contended(waited: Duration, run: Duration) -> bool {
    waited >= CONTENDED_FLOOR && waited.as_secs_f64() >= CONTENDED_SHARE * run.as_secs_f64()
}

/// A run is taken from when other tasks ran on the machine's CPUs, in all, at least this
/// share of its time ([`RunTaken`]) …
pub const OTHERS_SHARE: f64 = 0.15;
/// … and at least this many clock ticks of it (the busy figures' unit; a quiet run's
/// difference between the machine's busy ticks and this process's CPU time swings by up to
/// three either way).
pub const OTHERS_TICKS: u64 = 4;

/// The whole machine as a run that is not placed sees it: the most any CPU's steal, the
/// CPUs' busy time, this process's CPU time (all its threads, ended ones too), and when.
#[derive(Clone, Debug)]
pub struct MachineReading {
    steal: Option<Vec<u64>>,
    busy_ticks: Option<u64>,
    own: Option<Duration>,
    at: std::time::Instant,
}

impl MachineReading {
    /// Now.
    pub fn now() -> MachineReading {
        let stat = std::fs::read_to_string("/proc/stat").ok();
        let own = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        MachineReading {
            steal: stat.as_deref().and_then(|s| parse(s, &cpus_in(s))),
            busy_ticks: stat.as_deref().and_then(busy_ticks),
            own: Duration::try_from(own).ok(),
            at: std::time::Instant::now(),
        }
    }
}

/// The CPUs `/proc/stat` has a line for.
fn cpus_in(stat: &str) -> Vec<usize> {
    let cpu = |l: &str| l.split_whitespace().next()?.strip_prefix("cpu")?.parse().ok();
    stat.lines().filter_map(cpu).collect()
}

/// All CPUs' busy ticks (user, nice, system, irq, softirq of the `cpu` line).
fn busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.split_whitespace().next() == Some("cpu"))?;
    let f: Vec<u64> =
        line.split_whitespace().skip(1).take(7).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    (f.len() == 7).then(|| f[0] + f[1] + f[2] + f[5] + f[6])
}

/// What the machine took from one run between two [`MachineReading`]s: the most the
/// hypervisor took from any CPU, and the CPU time other tasks had on the machine (its busy
/// time less this process's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunTaken {
    /// The steal, where it was read.
    pub steal: Option<Duration>,
    /// Other tasks' CPU time, where it was read.
    pub others: Option<Duration>,
    /// The run's wall time.
    pub run: Duration,
}

impl RunTaken {
    /// Between `before` and `after`.
    pub fn between(before: &MachineReading, after: &MachineReading) -> RunTaken {
        let others = before.busy_ticks.zip(after.busy_ticks).zip(before.own.zip(after.own)).map(
            |((b0, b1), (o0, o1))| ticks_to_time(b1.saturating_sub(b0)).saturating_sub(o1.saturating_sub(o0)),
        );
        RunTaken {
            steal: during(&before.steal, &after.steal),
            others,
            run: after.at.saturating_duration_since(before.at),
        }
    }

    /// Whether the hypervisor or other tasks took a share of it ([`stole_from`],
    /// [`OTHERS_SHARE`]); `None` where neither was read.
    pub fn taken_from(&self) -> Option<bool> {
        let others = self.others.map(|o| {
            o >= ticks_to_time(OTHERS_TICKS) && o.as_secs_f64() >= OTHERS_SHARE * self.run.as_secs_f64()
        });
        either(self.steal.map(|s| stole_from(s, self.run)), others)
    }

    /// The steal and the others' time in milliseconds, as the reports give them.
    pub fn ms(&self) -> (Option<f64>, Option<f64>) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        (self.steal.map(ms), self.others.map(ms))
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

/// The report's line where in `n` of `pairs` pairs the threads waited for a CPU that
/// another task held.
pub fn contended_line(n: usize, pairs: usize, what: &str) -> String {
    format!(
        "  CONTENDED: in {n} of {pairs} pairs the experiment's threads waited {:.0} % or more of a run's time for a CPU another task held (run-queue waits, /proc/self/task/*/schedstat): those pairs measured the machine, not {what}",
        CONTENDED_SHARE * 100.0
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
        let pair = PairTaken { steal: Some([Duration::ZERO, Duration::from_millis(100)]), waited: None };
        assert_eq!(pair.stole_from(run, run), Some(true));
        assert_eq!(pair.stole_from(run, Duration::from_secs(100)), Some(false));
        assert_eq!(pair.steal_ms(), Some([0.0, 100.0]));
        assert_eq!(pair.contended(run, run), None);
        assert_eq!(pair.taken_from(run, run), Some(true));
        assert_eq!(count(&[Some(true), None, Some(false), Some(true)]), Some(2));
        assert_eq!(count(&[None, None]), None);
        assert_eq!(count(&[Some(false)]), Some(0));
        // A reading not made: no figure, not a zero.
        assert_eq!(during(&Some(vec![1, 2]), &Some(vec![3, 2])), Some(2 * tick));
        assert_eq!(during(&None, &Some(vec![3])), None);
        assert_eq!(during(&Some(vec![3]), &None), None);
        let read = |steal: Option<Vec<u64>>, ms: Option<u64>| Reading {
            steal,
            waited: ms.map(Duration::from_millis),
        };
        let half_read = PairTaken::of(
            [&read(Some(vec![1]), Some(5)), &read(Some(vec![1]), Some(9))],
            [&read(None, Some(9)), &read(Some(vec![3]), Some(12))],
        );
        assert_eq!(half_read, PairTaken { steal: None, waited: Some([4, 3].map(Duration::from_millis)) });
        assert_eq!(half_read.text(), "- stolen, 4 / 3 ms waited");
        let run = Duration::from_millis(700);
        assert!(!stole_from(tick, run), "one tick may be an earlier fraction carried over");
        assert!(stole_from((2 * tick).max(Duration::from_millis(14)), run));
        // A short run: two ticks are far more than its share, and they count.
        assert!(stole_from(2 * tick, Duration::from_micros(400)));
        // A long run: two ticks are less than its share.
        assert!(!stole_from(2 * tick, Duration::from_secs(100)));
    }

    #[test]
    fn a_whole_machine_run_is_taken_from_by_steal_or_other_tasks_past_their_share() {
        assert_eq!(cpus_in(STAT), [0, 1]);
        assert_eq!(busy_ticks(STAT), Some(328231 + 36859 + 2457));
        assert_eq!(busy_ticks("cpu 1 2 3\n"), None);
        let tick = ticks_to_time(1);
        let at = std::time::Instant::now();
        let read = |steal: u64, busy: u64, own: Duration, after: Duration| MachineReading {
            steal: Some(vec![steal, 0]),
            busy_ticks: Some(busy),
            own: Some(own),
            at: at + after,
        };
        let second = Duration::from_secs(1);
        let t0 = read(10, 1000, second, Duration::ZERO);
        // Two CPUs busy for a second, all of it this process's: nothing taken.
        let quiet = RunTaken::between(
            &t0,
            &read(10, 1000 + 2 * (second.as_nanos() / tick.as_nanos()) as u64, 3 * second, second),
        );
        assert_eq!((quiet.others, quiet.taken_from()), (Some(Duration::ZERO), Some(false)));
        // A quarter of a second of another task's: taken.
        let busy = RunTaken::between(
            &t0,
            &read(10, 1000 + (2.25 * (1e9 / tick.as_nanos() as f64)) as u64, 3 * second, second),
        );
        assert_eq!(busy.taken_from(), Some(true));
        assert_eq!(busy.ms().1.map(|ms| ms.round()), Some(250.0));
        // Steal alone.
        let stolen = RunTaken::between(&t0, &read(10 + 50, 1000, second, second));
        assert_eq!((stolen.others, stolen.taken_from()), (Some(Duration::ZERO), Some(true)));
        assert_eq!(RunTaken::default().taken_from(), None);
    }

    /// Spins on the calling thread for `d`.
    fn spin(d: Duration) {
        let t = std::time::Instant::now();
        while t.elapsed() < d {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn two_threads_spinning_on_one_cpu_wait_for_it_and_the_waits_say_so() {
        // The kernel's own figure, read as the replay reads it: two threads of this process
        // busy on one CPU for 400 ms each wait about half of it.
        if std::fs::read_to_string("/proc/self/schedstat").is_err() {
            eprintln!("skipped: this kernel keeps no sched_info (/proc/self/schedstat)");
            return;
        }
        let Some(&cpu) = crate::affinity::allowed().ok().and_then(|c| c.first().copied()).as_ref() else {
            return;
        };
        let before = run_queue_waits().expect("sched_info is there");
        let other = std::thread::spawn(move || {
            let _ = crate::affinity::pin(&[cpu]);
            spin(Duration::from_millis(400));
            // Read before this thread ends, which takes its waits with it.
            run_queue_waits()
        });
        let _restore = crate::affinity::Restore::here();
        let _ = crate::affinity::pin(&[cpu]);
        spin(Duration::from_millis(400));
        let after = other.join().ok().flatten().expect("read on the spinning thread");
        let waited = after.saturating_sub(before);
        assert!(waited >= Duration::from_millis(100), "two threads on CPU {cpu} waited {waited:?} in all");
    }

    #[test]
    fn another_process_busy_on_the_machine_is_others_time() {
        let Ok(mut busy) = std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn()
        else {
            eprintln!("skipped: no sh");
            return;
        };
        let before = MachineReading::now();
        std::thread::sleep(Duration::from_millis(600));
        let after = MachineReading::now();
        let _ = busy.kill();
        let _ = busy.wait();
        let t = RunTaken::between(&before, &after);
        if t.others.is_none() {
            eprintln!("skipped: /proc/stat not read");
            return;
        }
        // Most of 600 ms of one CPU, in clock ticks; this process slept meanwhile.
        assert!(t.others.is_some_and(|o| o >= Duration::from_millis(300)), "{t:?}");
        assert_eq!(t.taken_from(), Some(true), "{t:?}");
    }

    #[test]
    fn a_run_is_contended_past_its_share_of_waits_and_the_waits_are_schedstats_second_figure() {
        assert_eq!(waited_ns("245816030 137399223 105\n"), Some(137_399_223));
        assert_eq!(waited_ns("245816030\n"), None);
        assert_eq!(waited_ns("a b c"), None);
        let run = Duration::from_millis(1000);
        assert!(contended(Duration::from_millis(150), run) && !contended(Duration::from_millis(149), run));
        assert!(!contended(Duration::ZERO, Duration::ZERO));
        // A short run: its own hand-overs are a large share, and do not count below the floor.
        let short = Duration::from_millis(10);
        assert!(!contended(Duration::from_millis(7), short) && contended(CONTENDED_FLOOR, short));
        let quiet =
            PairTaken { steal: Some([Duration::ZERO; 2]), waited: Some([Duration::from_millis(40); 2]) };
        assert_eq!((quiet.contended(run, run), quiet.taken_from(run, run)), (Some(false), Some(false)));
        let busy = PairTaken { waited: Some([Duration::ZERO, Duration::from_millis(500)]), ..quiet };
        assert_eq!(
            (busy.contended(run, run), busy.stole_from(run, run), busy.taken_from(run, run)),
            (Some(true), Some(false), Some(true))
        );
        assert_eq!(busy.waited_ms(), Some([0.0, 500.0]));
        assert_eq!(PairTaken::default().taken_from(run, run), None);
        // This process's own, wherever the kernel keeps sched_info.
        let m = MachineReading::now();
        assert!(m.own.is_some());
        if std::path::Path::new("/proc/self/schedstat").exists() {
            assert!(run_queue_waits().is_some());
        }
    }
}
