//! [`Fence`]: a switch another thread throws to take a device away from its users at once,
//! for a host that may no longer drive it (a pool's lease it could not renew in time,
//! `docs/pool.md`). Once raised, the device counts as surprise-removed with the reason given,
//! every access fails without a TLP being sent, and its session is closed: from then on the
//! host sends the box nothing for that device, whatever its users do.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A cloneable handle; every clone raises the same fence.
#[derive(Clone, Debug, Default)]
pub struct Fence {
    inner: Arc<FenceInner>,
}

#[derive(Debug, Default)]
struct FenceInner {
    raised: AtomicBool,
    why: Mutex<String>,
}

impl Fence {
    /// A fence not raised.
    pub fn new() -> Fence {
        Fence::default()
    }

    /// Raises the fence for `why` (the first reason given stays).
    pub fn raise(&self, why: &str) {
        let mut w = self.inner.why.lock().unwrap_or_else(|p| p.into_inner());
        if !self.inner.raised.load(Ordering::Acquire) {
            *w = why.to_string();
            self.inner.raised.store(true, Ordering::Release);
        }
    }

    /// Whether it is raised (one atomic load: checked on every access).
    pub fn is_raised(&self) -> bool {
        self.inner.raised.load(Ordering::Acquire)
    }

    /// Why it was raised, if it was.
    pub fn reason(&self) -> Option<String> {
        self.is_raised().then(|| self.inner.why.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_stays_and_every_clone_sees_it() {
        let f = Fence::new();
        let g = f.clone();
        assert!(!g.is_raised());
        assert_eq!(g.reason(), None);
        f.raise("lease not renewed");
        g.raise("something else");
        assert!(g.is_raised());
        assert_eq!(f.reason().as_deref(), Some("lease not renewed"));
    }
}
