//! [`EndpointThread`]: a GPU-box endpoint on a thread of its own — what `dxpu loopback`, the
//! benches and the integration tests run a box with. The thread makes the endpoint itself
//! (an endpoint is not `Send`: its devices and socket stay on the thread that made them),
//! serves until stopped the way SIGTERM does (sessions closed, devices reset) or killed (it
//! vanishes without a word, as a killed process), and gives back its counters.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crate::endpoint::GpuEndpoint;
use crate::stats::GpuStats;

/// Why an [`EndpointThread`] did not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError<E> {
    /// The caller's `make` failed (on the thread): its error.
    #[error("{0}")]
    Make(E),
    /// The thread could not be started.
    #[error("starting the GPU-box endpoint's thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The endpoint was made but has no address.
    #[error("the endpoint's address: {0}")]
    Address(#[source] std::io::Error),
    /// The thread ended before it said how its start went (it panicked).
    #[error("the GPU-box endpoint's thread ended at its start")]
    Ended,
}

/// A GPU-box endpoint serving on its own thread until stopped, killed or dropped.
pub struct EndpointThread {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    kill: Arc<AtomicBool>,
    thread: Option<JoinHandle<GpuStats>>,
}

impl EndpointThread {
    /// Starts a thread named `name` that runs `make` — which makes the endpoint (after
    /// whatever must come first on that thread: entering a network namespace, pinning it to a
    /// CPU) and returns it with anything the caller wants back from the thread — then serves
    /// it. Returns once it listens, with its address; `make`'s error, if it fails.
    pub fn spawn<T: Send + 'static, E: Send + 'static>(
        name: &str,
        make: impl FnOnce() -> Result<(GpuEndpoint, T), E> + Send + 'static,
    ) -> Result<(EndpointThread, T), SpawnError<E>> {
        let stop = Arc::new(AtomicBool::new(false));
        let kill = Arc::new(AtomicBool::new(false));
        let (s, k) = (stop.clone(), kill.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let (mut ep, extra) = match make() {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = tx.send(Err(SpawnError::Make(e)));
                        return GpuStats::default();
                    }
                };
                match ep.local_addr() {
                    Ok(a) => {
                        let _ = tx.send(Ok((a, extra)));
                    }
                    Err(e) => {
                        let _ = tx.send(Err(SpawnError::Address(e)));
                        return ep.stats();
                    }
                }
                while !s.load(Ordering::Relaxed) && !k.load(Ordering::Relaxed) {
                    let r = ep.poll().and_then(|did| if did { Ok(()) } else { ep.wait() });
                    if let Err(e) = r {
                        log::error!("GPU-box endpoint: {e}");
                        break;
                    }
                }
                if !k.load(Ordering::Relaxed)
                    && let Err(e) = ep.shutdown()
                {
                    log::error!("GPU-box endpoint: {e}");
                }
                ep.stats()
            })
            .map_err(SpawnError::Thread)?;
        let (addr, extra) = rx.recv().map_err(|_| SpawnError::Ended)??;
        Ok((EndpointThread { addr, stop, kill, thread: Some(thread) }, extra))
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether its thread still runs.
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Asks it to stop the way SIGTERM does, without waiting ([`EndpointThread::is_running`]
    /// says when it has).
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Stops it the way SIGTERM does (sessions closed, devices reset); its counters.
    pub fn stop(mut self) -> GpuStats {
        self.stop.store(true, Ordering::Relaxed);
        self.join()
    }

    /// Kills it: it stops answering at once and closes nothing; its counters.
    pub fn kill(mut self) -> GpuStats {
        self.kill.store(true, Ordering::Relaxed);
        self.join()
    }

    fn join(&mut self) -> GpuStats {
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

impl Drop for EndpointThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.join();
    }
}
