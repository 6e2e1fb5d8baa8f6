//! SIGINT and SIGTERM for the experiment commands (`loopback`, `model`, `replay`, `bench`):
//! the first asks the command to stop — a loop that can stop cleanly (a soak stopping its
//! processes) looks at [`requested`] — and if the command has not ended half a second
//! later, the process exits at once (130 for SIGINT, 143 for SIGTERM), so that no spinning
//! replay or benchmark outlives the signal by a second. The
//! handlers replace an inherited "ignore" (a background job of a non-interactive shell
//! starts with SIGINT ignored), so `kill -INT` stops such a command too. The daemons have
//! their own handling (`ops::process`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// The grace a command gets to stop by itself.
const GRACE: Duration = Duration::from_millis(500);

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Whether SIGINT or SIGTERM arrived.
pub(crate) fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}

/// Installs the handlers and the watchdog that ends the process half a second after a signal.
/// Where a handler cannot be installed, the signal keeps its default action (which ends the
/// process too), said once.
pub(crate) fn install() {
    let signal = Arc::new(AtomicUsize::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register_usize(sig, signal.clone(), sig as usize) {
            eprintln!("dxpu: cannot handle signal {sig} ({e}); it ends the process at once");
        }
    }
    let _ = std::thread::Builder::new().name("dxpu-interrupt".into()).spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let sig = signal.load(Ordering::Relaxed);
            if sig != 0 {
                REQUESTED.store(true, Ordering::Relaxed);
                std::thread::sleep(GRACE);
                eprintln!("dxpu: interrupted (signal {sig})");
                std::process::exit(128 + sig as i32);
            }
        }
    });
}
