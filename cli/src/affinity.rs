//! Which CPUs a thread runs on: `dxpu loopback`'s `--pin`.
//!
//! Through the bridges two threads spin at once on one machine — the GPU-box endpoint's
//! (which also runs the simulated device) and the host's driver thread. Left to the
//! scheduler, a wake-up sometimes puts both on one CPU, where they take turns for
//! milliseconds while the other CPU idles, and the device may compute on another CPU than it
//! did in the directly attached run it is compared with (docs/performance-model.md, *CPU
//! placement*). Pinning gives each spinning thread a CPU of its own and the device the same
//! CPU both ways.

use rustix::thread::{CpuSet, Pid, gettid, sched_getaffinity, sched_setaffinity};

/// The CPUs the calling thread may run on, ascending.
pub(crate) fn allowed() -> Result<Vec<usize>, String> {
    let set = sched_getaffinity(None).map_err(|e| format!("sched_getaffinity: {e}"))?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

/// Lets the calling thread run only on `cpus` (not empty).
pub(crate) fn pin(cpus: &[usize]) -> Result<(), String> {
    pin_thread(None, cpus)
}

/// [`pin`] to `cpu` where given; nothing where not.
pub(crate) fn pin_to(cpu: Option<usize>) -> Result<(), String> {
    cpu.map_or(Ok(()), |c| pin(&[c]))
}

/// A thread of this process, to pin from another ([`Thread::here`] in it, then
/// [`Thread::pin`] anywhere).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Thread(Pid);

impl Thread {
    /// The calling thread.
    pub(crate) fn here() -> Thread {
        Thread(gettid())
    }

    /// Lets this thread run only on `cpus` (not empty); an error where it has exited.
    pub(crate) fn pin(self, cpus: &[usize]) -> Result<(), String> {
        pin_thread(Some(self.0), cpus)
    }
}

fn pin_thread(tid: Option<Pid>, cpus: &[usize]) -> Result<(), String> {
    if cpus.is_empty() {
        return Err("no CPU to pin to".into());
    }
    let mut set = CpuSet::new();
    for &c in cpus {
        if c >= CpuSet::MAX_CPU {
            return Err(format!("CPU {c}: a CPU set holds CPUs 0..{}", CpuSet::MAX_CPU));
        }
        set.set(c);
    }
    sched_setaffinity(tid, &set).map_err(|e| format!("pinning to CPU {cpus:?}: {e}"))
}

/// Where `--pin` puts the threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The GPU-box endpoint's thread and the directly attached device.
    pub(crate) device: usize,
    /// The host's driver thread (the bridged runs' workload).
    pub(crate) host: usize,
}

/// `--pin`'s value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PinArg {
    /// The first two CPUs this process may use; no pinning where it may use only one.
    Auto,
    /// Wherever the scheduler puts the threads.
    Off,
    /// These two CPUs.
    Cpus(Placement),
}

impl PinArg {
    /// Parses `auto`, `off` or `DEVICE,HOST` (two different CPU numbers).
    pub(crate) fn parse(v: &str) -> Result<PinArg, String> {
        match v {
            "auto" => return Ok(PinArg::Auto),
            "off" => return Ok(PinArg::Off),
            _ => {}
        }
        let bad = || format!("{v:?}: expected auto, off or DEVICE,HOST (two CPU numbers, e.g. 0,1)");
        let (d, h) = v.split_once(',').ok_or_else(bad)?;
        let (device, host) =
            (d.trim().parse::<usize>().map_err(|_| bad())?, h.trim().parse::<usize>().map_err(|_| bad())?);
        if device == host {
            return Err(format!("{v:?}: the device's and the host's CPU must differ (both spin)"));
        }
        Ok(PinArg::Cpus(Placement { device, host }))
    }

    /// The placement this asks for among `allowed` (the CPUs the process may use): `None`
    /// for off, and for auto where fewer than two are allowed; an error for a CPU given that
    /// is not among them.
    pub(crate) fn placement(self, allowed: &[usize]) -> Result<Option<Placement>, String> {
        match self {
            PinArg::Off => Ok(None),
            PinArg::Auto => Ok(match allowed {
                [device, host, ..] => Some(Placement { device: *device, host: *host }),
                _ => None,
            }),
            PinArg::Cpus(p) => {
                for c in [p.device, p.host] {
                    if !allowed.contains(&c) {
                        return Err(format!("--pin: CPU {c} is not one this process may use ({allowed:?})"));
                    }
                }
                Ok(Some(p))
            }
        }
    }
}

/// Restores the calling thread's CPUs when dropped (on every return, errors included).
pub(crate) struct Restore(Vec<usize>);

impl Restore {
    /// Remembers the calling thread's CPUs now.
    pub(crate) fn here() -> Result<Restore, String> {
        allowed().map(Restore)
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        if let Err(e) = pin(&self.0) {
            log::warn!("restoring the thread's CPUs {:?}: {e}", self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn parses_auto_off_and_two_different_cpus() {
        assert_eq!(PinArg::parse("auto"), Ok(PinArg::Auto));
        assert_eq!(PinArg::parse("off"), Ok(PinArg::Off));
        assert_eq!(PinArg::parse("3, 1"), Ok(PinArg::Cpus(Placement { device: 3, host: 1 })));
        for bad in ["", "1", "1,", "a,b", "-1,2", "1,2,3", "on"] {
            let e = PinArg::parse(bad).unwrap_err();
            assert!(e.contains("DEVICE,HOST"), "{bad:?}: {e}");
        }
        assert!(PinArg::parse("2,2").unwrap_err().contains("must differ"));
    }

    #[test]
    fn placement_takes_the_first_two_allowed_or_none() {
        assert_eq!(PinArg::Auto.placement(&[2, 5, 7]), Ok(Some(Placement { device: 2, host: 5 })));
        assert_eq!(PinArg::Auto.placement(&[4]), Ok(None));
        assert_eq!(PinArg::Off.placement(&[0, 1]), Ok(None));
        let p = Placement { device: 1, host: 0 };
        assert_eq!(PinArg::Cpus(p).placement(&[0, 1]), Ok(Some(p)));
        let e = PinArg::Cpus(Placement { device: 0, host: 9 }).placement(&[0, 1]).unwrap_err();
        assert!(e.contains("CPU 9") && e.contains("[0, 1]"), "{e}");
    }

    #[test]
    fn pins_a_thread_and_restores_it() {
        // On a thread of its own: the test harness's threads keep their CPUs.
        std::thread::spawn(|| {
            let all = allowed().unwrap();
            assert!(!all.is_empty());
            {
                let _restore = Restore::here().unwrap();
                pin(&all[..1]).unwrap();
                assert_eq!(allowed().unwrap(), all[..1]);
            }
            assert_eq!(allowed().unwrap(), all);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pins_another_thread() {
        let all = allowed().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(Thread::here()).unwrap();
            done_rx.recv().unwrap();
            allowed().unwrap()
        });
        let other = rx.recv().unwrap();
        other.pin(&all[all.len() - 1..]).unwrap();
        done_tx.send(()).unwrap();
        assert_eq!(t.join().unwrap(), all[all.len() - 1..]);
        // Gone: the kernel has no such thread any more.
        assert!(other.pin(&all).is_err());
    }

    #[test]
    fn refuses_cpus_it_cannot_pin_to() {
        std::thread::spawn(|| {
            let before = allowed().unwrap();
            assert!(pin(&[]).unwrap_err().contains("no CPU"));
            let e = pin(&[CpuSet::MAX_CPU]).unwrap_err();
            assert!(e.contains(&format!("CPU {}", CpuSet::MAX_CPU)), "{e}");
            // A CPU this machine does not have: the kernel refuses, nothing changes.
            let e = pin(&[CpuSet::MAX_CPU - 1]).unwrap_err();
            assert!(e.contains("pinning to CPU"), "{e}");
            assert_eq!(allowed().unwrap(), before);
        })
        .join()
        .unwrap();
    }
}
