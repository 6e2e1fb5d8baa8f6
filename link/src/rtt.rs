//! The round-trip estimate the replay timer follows (RFC 6298 §2, as QUIC's RFC 9002 §5
//! keeps it): a smoothed round trip and its variation from the samples the session takes
//! (one DATA frame timed at a time, never one that was replayed: Karn's rule).
#![forbid(unsafe_code)]

use std::time::Duration;

/// A smoothed round trip and its mean deviation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RttEstimator {
    smoothed: Option<Duration>,
    variation: Duration,
}

impl RttEstimator {
    /// A round trip measured: the first sets the estimate, later ones move it by 1/8 (the
    /// variation by 1/4).
    pub(crate) fn sample(&mut self, rtt: Duration) {
        match self.smoothed {
            None => {
                self.smoothed = Some(rtt);
                self.variation = rtt / 2;
            }
            Some(s) => {
                let dev = s.abs_diff(rtt);
                self.variation = (self.variation * 3 + dev) / 4;
                self.smoothed = Some((s * 7 + rtt) / 8);
            }
        }
    }

    /// The smoothed round trip, once there is a sample.
    #[cfg(test)]
    pub(crate) fn smoothed(&self) -> Option<Duration> {
        self.smoothed
    }

    /// The replay timeout the estimate gives: the smoothed round trip, four variations and
    /// the peer's acknowledgement delay, within `floor` and `ceiling` (the floor before the
    /// first sample). The floor is the configured replay timeout: below a few of a peer's
    /// scheduling delays, a peer that is merely slow to run would be replayed to.
    pub(crate) fn replay_timeout(&self, floor: Duration, ack_delay: Duration, ceiling: Duration) -> Duration {
        match self.smoothed {
            None => floor,
            Some(s) => (s + 4 * self.variation + ack_delay).clamp(floor, ceiling.max(floor)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn the_timeout_follows_the_samples_within_its_floor_and_ceiling() {
        let (floor, delay, ceiling) = (250 * US, 50 * US, 200_000 * US);
        let mut r = RttEstimator::default();
        assert_eq!(r.replay_timeout(floor, delay, ceiling), floor, "no sample yet");
        r.sample(100 * US);
        // 100 + 4 × 50 + 50.
        assert_eq!(r.replay_timeout(floor, delay, ceiling), 350 * US);
        for _ in 0..50 {
            r.sample(100 * US);
        }
        assert_eq!(r.smoothed(), Some(100 * US));
        assert_eq!(r.replay_timeout(floor, delay, ceiling), floor, "steady: the floor");
        // One slow round trip raises it at once (the variation), and it decays after.
        r.sample(5000 * US);
        let after_spike = r.replay_timeout(floor, delay, ceiling);
        assert!(after_spike > 5000 * US, "{after_spike:?}");
        for _ in 0..40 {
            r.sample(100 * US);
        }
        assert!(r.replay_timeout(floor, delay, ceiling) < after_spike / 4);
        // A long path: capped at the ceiling.
        r.sample(Duration::from_secs(5));
        assert_eq!(r.replay_timeout(floor, delay, ceiling), ceiling);
    }
}
