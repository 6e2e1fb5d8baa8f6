//! Time as the state machine sees it: an argument, never read from a clock.
#![forbid(unsafe_code)]

use core::fmt;
use core::ops::{Add, Sub};
use core::time::Duration;

/// A point in time: nanoseconds since an origin the caller chooses (a monotonic clock's
/// start in a driver, zero in a simulation).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(u64);

impl Time {
    /// The origin.
    pub const ZERO: Time = Time(0);
    /// `nanos` after the origin.
    pub const fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }
    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// Time from `earlier` to `self` (zero if `earlier` is later).
    pub fn since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(d.as_nanos().min(u64::MAX as u128) as u64))
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    fn sub(self, rhs: Time) -> Duration {
        self.since(rhs)
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{:.6}s", self.0 as f64 / 1e9)
    }
}
