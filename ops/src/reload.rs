//! A configuration read off the endpoint's loop: the file is read and validated on a thread
//! of its own, with a deadline, and only the validated result reaches the loop — a key file
//! that blocks (a FIFO, a hung network mount) costs that reload, never the datapath, the
//! control socket or the other devices.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::control::{Call, RpcError};

/// How long a reload may take to read and validate its files.
pub const READ_DEADLINE: Duration = Duration::from_secs(10);

/// Why a reload could not start or did not end with a reading.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The thread that reads the files could not be started.
    #[error("reload: starting the reading thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The reading thread ended without an answer (it panicked).
    #[error("reload of {what}: the reading thread ended without an answer")]
    NoAnswer {
        /// What was read (the file's path).
        what: String,
    },
    /// Reading and validating took longer than the deadline.
    #[error(
        "reload of {what}: reading and validating did not finish within {deadline:?} (a file that blocks: a FIFO, a hung mount?)"
    )]
    Deadline {
        /// What was read (the file's path).
        what: String,
        /// The deadline.
        deadline: Duration,
    },
}

/// A reload in progress: its reading thread's answer (`T`, or the reading's error `E`), and
/// the `ctl reload` calls waiting.
pub struct PendingRead<T, E> {
    rx: mpsc::Receiver<Result<T, E>>,
    started: Instant,
    deadline: Duration,
    what: String,
    waiters: Vec<Call>,
}

/// What became of a pending read when looked at.
pub enum ReadState<T, E> {
    /// Still reading, within its deadline.
    Reading,
    /// Read and validated (or refused, saying why).
    Done(Result<T, E>),
}

impl<T: Send + 'static, E: From<ReloadError> + Send + 'static> PendingRead<T, E> {
    /// Starts `read` on a thread of its own; `what` names it in errors (the file's path).
    pub fn start(
        what: String,
        deadline: Duration,
        read: impl FnOnce() -> Result<T, E> + Send + 'static,
    ) -> Result<PendingRead<T, E>, ReloadError> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("dxpu-reload".into())
            .spawn(move || {
                let _ = tx.send(read());
            })
            .map_err(ReloadError::Thread)?;
        Ok(PendingRead { rx, started: Instant::now(), deadline, what, waiters: Vec::new() })
    }

    /// A `ctl reload` call, answered when the reload ends.
    pub fn wait_with(&mut self, c: Call) {
        self.waiters.push(c);
    }

    /// Whether the read ended: its result, or an error once the deadline passed (the thread
    /// is left to finish on its own; what it reads then is dropped).
    pub fn poll(&mut self) -> ReadState<T, E> {
        let what = || self.what.clone();
        match self.rx.try_recv() {
            Ok(r) => ReadState::Done(r),
            Err(mpsc::TryRecvError::Disconnected) => {
                ReadState::Done(Err(ReloadError::NoAnswer { what: what() }.into()))
            }
            Err(mpsc::TryRecvError::Empty) if self.started.elapsed() >= self.deadline => {
                ReadState::Done(Err(ReloadError::Deadline { what: what(), deadline: self.deadline }.into()))
            }
            Err(mpsc::TryRecvError::Empty) => ReadState::Reading,
        }
    }

    /// Answers every waiting call with `r` (an error as its message).
    pub fn answer(self, r: &Result<serde_json::Value, impl std::fmt::Display>) {
        for w in self.waiters {
            w.answer(match r {
                Ok(v) => Ok(v.clone()),
                Err(e) => Err(RpcError::failed(e)),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_blocks_ends_at_its_deadline_and_one_that_answers_is_done() {
        let (hold, blocked) = mpsc::channel::<()>();
        let mut p = PendingRead::start("slow.toml".into(), Duration::from_millis(100), move || {
            let _ = blocked.recv();
            Ok::<_, ReloadError>(1)
        })
        .unwrap();
        assert!(matches!(p.poll(), ReadState::Reading));
        std::thread::sleep(Duration::from_millis(150));
        match p.poll() {
            ReadState::Done(Err(e)) => {
                let e = e.to_string();
                assert!(e.contains("slow.toml") && e.contains("did not finish"), "{e}")
            }
            _ => panic!("the deadline passed"),
        }
        drop(hold);
        let mut q = PendingRead::start("ok.toml".into(), READ_DEADLINE, || Ok::<_, ReloadError>(2)).unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            match q.poll() {
                ReadState::Done(r) => break assert_eq!(r.ok(), Some(2)),
                ReadState::Reading => assert!(Instant::now() < end),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
