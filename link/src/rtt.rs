//! The least round trip the session has measured, and the tail-loss probe timeout it gives
//! (after RFC 8985's tail loss probe): where at most [`PROBE_FRAMES`] DATA frames are
//! unacknowledged — request and response, a register read — a lost frame is resent after a
//! few round trips rather than the replay timeout, which must stay long enough for a full
//! window of bulk data to be acknowledged.
//!
//! The least round trip, not a smoothed one: a sample is taken when the acknowledgement
//! covering the timed frame arrives, and when the acknowledgement that frame caused was
//! lost, a later one covers it — a sample that counts loss recovery as round trip, which
//! would stretch a smoothed estimate exactly when loss is heavy. The minimum is not moved by
//! such samples.
#![forbid(unsafe_code)]

use std::time::Duration;

/// The most DATA frames unacknowledged for the probe timeout to apply.
pub(crate) const PROBE_FRAMES: usize = 2;

/// The least probe timeout: a few of a peer's scheduling delays (50–80 µs per wake-up on a
/// 2-core VM), so that a peer merely slow to run is rarely probed.
pub(crate) const MIN_PROBE_TIMEOUT: Duration = Duration::from_micros(200);

/// The least round trip measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MinRtt {
    least: Option<Duration>,
}

impl MinRtt {
    /// A round trip measured.
    pub(crate) fn sample(&mut self, rtt: Duration) {
        self.least = Some(self.least.map_or(rtt, |l| l.min(rtt)));
    }

    /// The tail-loss probe timeout: four least round trips and the peer's acknowledgement
    /// delay, at least [`MIN_PROBE_TIMEOUT`], at most `replay_timeout`; `replay_timeout`
    /// before the first sample.
    pub(crate) fn probe_timeout(&self, ack_delay: Duration, replay_timeout: Duration) -> Duration {
        match self.least {
            None => replay_timeout,
            Some(l) => (4 * l + ack_delay).max(MIN_PROBE_TIMEOUT).min(replay_timeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn the_probe_follows_the_least_round_trip_within_its_bounds() {
        let (delay, replay) = (50 * US, 2000 * US);
        let mut r = MinRtt::default();
        assert_eq!(r.probe_timeout(delay, replay), replay, "no sample yet");
        r.sample(100 * US);
        assert_eq!(r.probe_timeout(delay, replay), 450 * US);
        // A sample stretched by a lost acknowledgement does not move it.
        r.sample(5000 * US);
        assert_eq!(r.probe_timeout(delay, replay), 450 * US);
        r.sample(10 * US);
        assert_eq!(r.probe_timeout(delay, replay), MIN_PROBE_TIMEOUT, "the floor");
        let mut far = MinRtt::default();
        far.sample(Duration::from_millis(30));
        assert_eq!(far.probe_timeout(delay, replay), replay, "never past the replay timeout");
    }
}
