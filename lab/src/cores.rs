//! How far apart two CPUs are: a cache line's round trip between a thread on each.
//!
//! On a virtual machine the hypervisor decides which physical cores the virtual CPUs run on,
//! and moves them. On the machine the experiments were measured on (2 vCPUs of an AMD EPYC),
//! the two were sometimes on cores that share an L3 cache (a cache line's round trip 52–80
//! ns) and sometimes on cores of different dies (306–406 ns), for whole runs or switching
//! within one; the bridges' bulk rate over loopback followed it, about halved on dies apart,
//! since every datagram the kernel hands from one endpoint's thread to the other's crosses
//! between the cores (docs/performance.md, *Where the cores are*). A comparison measured
//! across such a move compares two machines; the experiments measure the round trip where
//! they calibrate and after they replay, and say so when it moved.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::affinity::{self, CpuError};

/// Round trips per batch; the figure is the fastest batch's mean.
const BATCH: u64 = 2_000;
/// Batches measured.
const BATCHES: usize = 9;
/// How long the two threads may take in all before the measurement gives up (a thread
/// descheduled for this long says nothing about the cores).
const LIMIT: Duration = Duration::from_secs(1);
/// The caller's word that it is done.
const STOP: u64 = u64::MAX;

/// What the two threads share: the word they pass back and forth, and the partner's word
/// that it could not be placed on its CPU (apart: the caller writes the first).
#[derive(Default)]
struct Line {
    word: AtomicU64,
    unplaced: std::sync::atomic::AtomicBool,
}

/// Why the round trip could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum CoresError {
    /// A thread could not be put on its CPU.
    #[error("CPU {cpu}: {source}")]
    Cpu {
        /// The CPU asked for.
        cpu: usize,
        /// What the kernel said.
        source: CpuError,
    },
    /// The thread on the other CPU did not start.
    #[error("starting a thread for CPU {cpu}: {source}")]
    Spawn {
        /// Its CPU.
        cpu: usize,
        /// What the system said.
        source: std::io::Error,
    },
    /// The two threads did not finish in time: one of them was not running (a busy machine).
    #[error(
        "a cache line's round trip between CPUs {a} and {b}: {done} of {BATCHES} batches in {LIMIT:?} (a thread was \
         not running: the machine is busy)"
    )]
    TooSlow {
        /// The caller's CPU.
        a: usize,
        /// The partner's.
        b: usize,
        /// Batches finished.
        done: usize,
    },
}

/// A cache line's round trip between a thread on CPU `a` (the caller, pinned there for the
/// measurement and given its CPUs back after) and one on CPU `b` (another: on one CPU the
/// two would take turns for the scheduler's slices): the fastest of nine batches'
/// means, each of 2,000 round trips. The fastest, not the median: another thread on one of
/// the CPUs (a spinning endpoint, the system's work) only adds to a batch, and what is
/// measured is where the cores are, not how busy they are.
pub fn round_trip(a: usize, b: usize) -> Result<Duration, CoresError> {
    let _restore = affinity::Restore::here().map_err(|source| CoresError::Cpu { cpu: a, source })?;
    affinity::pin(&[a]).map_err(|source| CoresError::Cpu { cpu: a, source })?;
    let line = Arc::new(Line::default());
    let deadline = Instant::now() + LIMIT;
    let partner = {
        let line = line.clone();
        std::thread::Builder::new()
            .name("dxpu-cores".into())
            .spawn(move || answer(&line, b, deadline))
            .map_err(|source| CoresError::Spawn { cpu: b, source })?
    };
    let measured = ask(&line, deadline);
    line.word.store(STOP, Ordering::Release);
    // The partner ends at STOP or its deadline, whichever first.
    let pinned = partner.join().unwrap_or(Ok(()));
    pinned.map_err(|source| CoresError::Cpu { cpu: b, source })?;
    let means = measured.map_err(|done| CoresError::TooSlow { a, b, done })?;
    let fastest = means.iter().copied().reduce(f64::min);
    fastest.map(Duration::from_secs_f64).ok_or(CoresError::TooSlow { a, b, done: 0 })
}

/// The caller's half: writes an odd number and waits for the next even one, [`BATCH`] times
/// a batch; each batch's mean round trip, or how many batches finished before the deadline.
fn ask(line: &Line, deadline: Instant) -> Result<Vec<f64>, usize> {
    // The partner says it is placed by writing 0 → 0 (nothing); the first round trip waits for
    // it to start, so one batch more is run and the first dropped.
    let mut means = Vec::with_capacity(BATCHES + 1);
    let mut n = 0u64;
    for _ in 0..=BATCHES {
        let t = Instant::now();
        for _ in 0..BATCH {
            line.word.store(n + 1, Ordering::Release);
            let mut spins = 0u32;
            while line.word.load(Ordering::Acquire) != n + 2 {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(4096) {
                    if line.unplaced.load(Ordering::Acquire) {
                        return Err(0);
                    }
                    if Instant::now() > deadline {
                        return Err(means.len().saturating_sub(1));
                    }
                }
                std::hint::spin_loop();
            }
            n += 2;
        }
        means.push(t.elapsed().as_secs_f64() / BATCH as f64);
    }
    means.remove(0);
    Ok(means)
}

/// The partner's half, on CPU `cpu`: answers each odd number with the next, until [`STOP`]
/// or the deadline.
fn answer(line: &Line, cpu: usize, deadline: Instant) -> Result<(), CpuError> {
    if let Err(e) = affinity::pin(&[cpu]) {
        line.unplaced.store(true, Ordering::Release);
        return Err(e);
    }
    let mut spins = 0u32;
    loop {
        let v = line.word.load(Ordering::Acquire);
        if v == STOP {
            return Ok(());
        }
        if v % 2 == 1 {
            line.word.store(v + 1, Ordering::Release);
            continue;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) && Instant::now() > deadline {
            return Ok(());
        }
        std::hint::spin_loop();
    }
}

/// The first two CPUs this process may use, where it may use two.
pub fn first_two() -> Option<(usize, usize)> {
    let all = affinity::allowed().ok()?;
    Some((*all.first()?, *all.get(1)?))
}

/// [`round_trip`] between CPUs `a` and `b`, ns, for a report: a measurement that failed is
/// logged and none (a figure missing, not an experiment stopped).
pub fn round_trip_ns(a: usize, b: usize) -> Option<f64> {
    round_trip(a, b).map(|rt| rt.as_secs_f64() * 1e9).map_err(|e| log::warn!("{e}")).ok()
}

/// [`round_trip_ns`] between the first two CPUs this process may use: none where it may use
/// one only.
pub fn first_two_ns() -> Option<((usize, usize), f64)> {
    let (a, b) = first_two()?;
    round_trip_ns(a, b).map(|ns| ((a, b), ns))
}

/// Two CPUs' round trip measured first and again later: in a comparison where the link is
/// calibrated and after each replay pair; in a bench before and after it.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundTrips {
    /// The CPUs: in a comparison the device's (the GPU-box endpoint's) and the host's.
    pub cpus: (usize, usize),
    /// The first round trip, ns.
    pub first_ns: f64,
    /// The later ones, ns.
    pub later_ns: Vec<f64>,
}

/// How much the round trip may change before the cores count as moved: the two modes
/// measured differ about fivefold, a batch's noise by a few percent.
pub const MOVED_RATIO: f64 = 2.0;

impl RoundTrips {
    /// Whether the round trip changed by [`MOVED_RATIO`] or more between any two
    /// measurements.
    pub fn moved(&self) -> bool {
        let all = || std::iter::once(self.first_ns).chain(self.later_ns.iter().copied());
        let lo = all().fold(f64::INFINITY, f64::min);
        let hi = all().fold(0.0, f64::max);
        lo > 0.0 && hi / lo >= MOVED_RATIO
    }

    /// What a moved placement means for the comparison, if the cores moved.
    pub fn why_moved(&self) -> Option<String> {
        if !self.moved() {
            return None;
        }
        let after: Vec<String> = self.later_ns.iter().map(|ns| format!("{ns:.0}")).collect();
        Some(format!(
            "the cores moved: a cache line's round trip between CPUs {} and {} was {:.0} ns where the link was \
             calibrated and {} ns after the replay pairs (the hypervisor placed the virtual CPUs on other cores; \
             bulk copies through the bridges run about half as fast on cores apart), so the model's inputs and the \
             pairs measured after a move are not the same machine's",
            self.cpus.0,
            self.cpus.1,
            self.first_ns,
            after.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The first and last CPU this thread may use, and all of them; none (said) where it
    /// may use one only.
    fn two_cpus() -> Option<(usize, usize, Vec<usize>)> {
        let all = affinity::allowed().unwrap();
        let (a, b) = (all[0], *all.last().unwrap());
        if a == b {
            eprintln!("skipped: this process may use one CPU only ({all:?})");
            return None;
        }
        Some((a, b, all))
    }

    #[test]
    fn measures_a_round_trip_between_two_cpus_and_gives_the_cpus_back() {
        std::thread::spawn(|| {
            let Some((a, b, all)) = two_cpus() else { return };
            let rt = round_trip(a, b).unwrap();
            // A cache line's round trip is nanoseconds to microseconds on any machine; a
            // thread descheduled for the whole second is an error, not a figure.
            assert!(rt > Duration::from_nanos(1) && rt < Duration::from_millis(5), "{rt:?}");
            assert_eq!(affinity::allowed().unwrap(), all);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_cpu_it_cannot_use_is_an_error_naming_it() {
        std::thread::spawn(|| {
            let all = affinity::allowed().unwrap();
            let missing = rustix::thread::CpuSet::MAX_CPU - 1;
            let t = Instant::now();
            let e = round_trip(all[0], missing).unwrap_err().to_string();
            assert!(e.contains(&format!("CPU {missing}")), "{e}");
            // The partner says it could not be placed: no wait for the limit.
            assert!(t.elapsed() < LIMIT / 2, "{:?}", t.elapsed());
            let e = round_trip(missing, all[0]).unwrap_err().to_string();
            assert!(e.contains(&format!("CPU {missing}")), "{e}");
            assert_eq!(affinity::allowed().unwrap(), all);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_spinning_beside_the_partner_slows_it_but_never_hangs_it() {
        std::thread::spawn(|| {
            let Some((a, b, all)) = two_cpus() else { return };
            // A third thread spinning on the partner's CPU for longer than the limit: the two
            // take turns for the scheduler's slices.
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (running, spinning) = std::sync::mpsc::channel();
            let spinner = {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let _ = affinity::pin(&[b]);
                    let _ = running.send(());
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            };
            spinning.recv().unwrap();
            let t = Instant::now();
            let r = round_trip(a, b);
            stop.store(true, Ordering::Relaxed);
            spinner.join().unwrap();
            eprintln!("beside a spinning thread: {r:?} in {:?}", t.elapsed());
            // A figure (the fastest batch) or "the machine is busy", within the limit and a
            // scheduler's slice or two.
            assert!(t.elapsed() < LIMIT + Duration::from_millis(500), "{:?}", t.elapsed());
            match r {
                Ok(rt) => assert!(rt > Duration::ZERO, "{rt:?}"),
                Err(e) => assert!(e.to_string().contains("the machine is busy"), "{e}"),
            }
            assert_eq!(affinity::allowed().unwrap(), all);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_partner_that_never_answers_ends_the_measurement_at_its_limit() {
        let line = Line::default();
        let t = Instant::now();
        // No partner: the deadline ends it, counting no batch.
        assert_eq!(ask(&line, Instant::now() + Duration::from_millis(50)), Err(0));
        assert!(t.elapsed() < Duration::from_millis(500));
    }

    #[test]
    fn moved_is_a_change_of_at_least_the_ratio_either_way() {
        let p = |c: f64, after: &[f64]| RoundTrips { cpus: (0, 1), first_ns: c, later_ns: after.to_vec() };
        assert!(!p(58.0, &[61.0, 55.0, 69.0]).moved());
        assert!(p(58.0, &[61.0, 330.0]).moved());
        assert!(p(330.0, &[61.0]).moved());
        assert!(!p(306.0, &[345.0, 340.0]).moved());
        assert!(p(50.0, &[100.0]).moved());
        assert!(!p(50.0, &[99.0]).moved());
        let why = p(58.0, &[61.0, 330.0]).why_moved().unwrap();
        assert!(why.contains("58 ns") && why.contains("61, 330 ns") && why.contains("CPUs 0 and 1"), "{why}");
        assert_eq!(p(58.0, &[]).why_moved(), None);
    }
}
