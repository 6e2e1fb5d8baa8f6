//! Which CPUs a thread runs on: the placement the experiments' `--pin` asks for.
//!
//! Through the bridges two threads spin at once on one machine — the GPU-box endpoint's
//! (which also runs the simulated device) and the host's driver thread. Left to the
//! scheduler, a wake-up sometimes puts both on one CPU, where they take turns for
//! milliseconds while the other CPU idles, and the device may compute on another CPU than it
//! did in the directly attached run it is compared with (docs/performance-model.md, *CPU
//! placement*). Pinning gives each spinning thread a CPU of its own and the device the same
//! CPU both ways.

use rustix::thread::{CpuSet, Pid, gettid, sched_getaffinity, sched_setaffinity};

/// Why a thread's CPUs could not be read or set.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CpuError {
    /// The kernel refused to say which CPUs the thread may use.
    #[error("sched_getaffinity: {0}")]
    Read(rustix::io::Errno),
    /// An empty set of CPUs was asked for.
    #[error("no CPU to pin to")]
    NoCpu,
    /// A CPU number past what a CPU set holds.
    #[error("CPU {cpu}: a CPU set holds CPUs 0..{max}")]
    OutOfSet {
        /// The CPU asked for.
        cpu: usize,
        /// The first CPU a set cannot hold.
        max: usize,
    },
    /// The kernel refused the set (a CPU the machine lacks or the process may not use; a
    /// thread that has ended).
    #[error("pinning to CPU {cpus:?}: {errno}")]
    Refused {
        /// The CPUs asked for.
        cpus: Vec<usize>,
        /// What the kernel said.
        errno: rustix::io::Errno,
    },
}

/// The CPUs the calling thread may run on, ascending.
pub fn allowed() -> Result<Vec<usize>, CpuError> {
    let set = sched_getaffinity(None).map_err(CpuError::Read)?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

/// Lets the calling thread run only on `cpus` (not empty).
pub fn pin(cpus: &[usize]) -> Result<(), CpuError> {
    pin_thread(None, cpus)
}

/// [`pin`] to `cpu` where given; nothing where not.
pub fn pin_to(cpu: Option<usize>) -> Result<(), CpuError> {
    cpu.map_or(Ok(()), |c| pin(&[c]))
}

/// A thread of this process, to pin from another ([`Thread::here`] in it, then
/// [`Thread::pin`] anywhere).
#[derive(Clone, Copy, Debug)]
pub struct Thread(Pid);

impl Thread {
    /// The calling thread.
    pub fn here() -> Thread {
        Thread(gettid())
    }

    /// Lets this thread run only on `cpus` (not empty); an error where it has exited.
    pub fn pin(self, cpus: &[usize]) -> Result<(), CpuError> {
        pin_thread(Some(self.0), cpus)
    }
}

fn pin_thread(tid: Option<Pid>, cpus: &[usize]) -> Result<(), CpuError> {
    if cpus.is_empty() {
        return Err(CpuError::NoCpu);
    }
    let mut set = CpuSet::new();
    for &cpu in cpus {
        if cpu >= CpuSet::MAX_CPU {
            return Err(CpuError::OutOfSet { cpu, max: CpuSet::MAX_CPU });
        }
        set.set(cpu);
    }
    sched_setaffinity(tid, &set).map_err(|errno| CpuError::Refused { cpus: cpus.to_vec(), errno })
}

/// Where `--pin` puts the threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The GPU-box endpoint's thread and the directly attached device.
    pub device: usize,
    /// The host's driver thread (the bridged runs' workload).
    pub host: usize,
}

/// Restores the calling thread's CPUs when dropped (on every return, errors included).
pub struct Restore(Vec<usize>);

impl Restore {
    /// Remembers the calling thread's CPUs now.
    pub fn here() -> Result<Restore, CpuError> {
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
        // Gone: the kernel has no such thread any more (once it has reaped it: a joined
        // thread's task may linger for a moment, and pinning it then still succeeds).
        let gone = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while other.pin(&all).is_ok() {
            assert!(std::time::Instant::now() < gone, "a thread joined 5 s ago can still be pinned");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn refuses_cpus_it_cannot_pin_to() {
        std::thread::spawn(|| {
            let before = allowed().unwrap();
            assert!(pin(&[]).unwrap_err().to_string().contains("no CPU"));
            let e = pin(&[CpuSet::MAX_CPU]).unwrap_err().to_string();
            assert!(e.contains(&format!("CPU {}", CpuSet::MAX_CPU)), "{e}");
            // A CPU this machine does not have: the kernel refuses, nothing changes.
            let e = pin(&[CpuSet::MAX_CPU - 1]).unwrap_err().to_string();
            assert!(e.contains("pinning to CPU"), "{e}");
            assert_eq!(allowed().unwrap(), before);
        })
        .join()
        .unwrap();
    }
}
