//! What the host endpoint counts for one device: TLPs by kind each way, DMA served and
//! refused, interrupts, completion timeouts, and the session's own counters.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use tlp::TlpRepr;

/// What the host endpoint counted for one device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostStats {
    /// TLPs sent to the box, by kind (`MRd64`, `CfgWr0`, …).
    pub tlps_sent: BTreeMap<&'static str, u64>,
    /// TLPs received from the box, by kind.
    pub tlps_received: BTreeMap<&'static str, u64>,
    /// Device DMA reads served from granted windows.
    pub dma_reads: u64,
    /// Device DMA writes into granted windows.
    pub dma_writes: u64,
    /// Bytes the device read from granted windows (the requests' lengths).
    pub dma_read_bytes: u64,
    /// Bytes the device wrote into granted windows.
    pub dma_write_bytes: u64,
    /// Device DMA reads outside every window (answered UR).
    pub dma_read_refused: u64,
    /// Device DMA writes outside every window (dropped).
    pub dma_write_dropped: u64,
    /// MSI-X messages received.
    pub interrupts: u64,
    /// Non-posted requests that timed out.
    pub completion_timeouts: u64,
    /// Completion timeouts that found the link had been recovering lost frames and were
    /// extended (see `AttachOptions::completion_timeout`).
    pub completion_timeouts_extended: u64,
    /// Completion timeouts that passed while the box was silent and were paused until it was
    /// heard again (the link riding an outage through).
    pub completion_timeouts_paused: u64,
    /// Times the link fell silent (nothing from the box for the idle timeout) and rode
    /// through; a silence past the ride-through time removes the device.
    pub link_silences: u64,
    /// Non-posted requests failed because the link went down or the device was removed.
    pub failed_requests: u64,
    /// Completions that matched no outstanding request.
    pub stray_completions: u64,
    /// MMIO to host addresses no BAR claims (all-ones, nothing sent).
    pub unclaimed_mmio: u64,
    /// TLPs from the box that did not parse (dropped by the dispatcher).
    pub malformed_tlps: u64,
    /// The largest data payload the device sent (bytes): at most its Max_Payload_Size.
    pub largest_payload_received: u32,
    /// The largest memory read the device asked for (bytes): at most its
    /// Max_Read_Request_Size.
    pub largest_read_request_received: u32,
    /// Register reads (MMIO reads a driver waited on), from the request to its completion.
    pub mmio_reads: LatencyHistogram,
    /// The session's counters.
    pub link: link::Stats,
    /// Nanoseconds the passes over the link that found nothing took, gap to the next pass
    /// included (`link::driver::SpinMeter`): a busy-polling caller's spins. Its thread's CPU
    /// time less this is the endpoint's work.
    pub spin_ns: u64,
    /// Passes over the link that found nothing to do.
    pub empty_passes: u64,
    /// Datagrams the kernel refused as larger than the path to the box carries whole
    /// (`EMSGSIZE`: Don't Fragment is set; dropped and replayed, never fragmented).
    pub datagrams_too_large: u64,
}

/// Durations in power-of-two buckets of nanoseconds: `buckets[i]` counts those in
/// `[2^i, 2^(i+1))` ns (bucket 0 from zero, the last one everything from 2^31 ns up).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Counts per bucket.
    pub buckets: [u64; 32],
    /// The durations' sum, in nanoseconds.
    pub sum_ns: u64,
}

impl LatencyHistogram {
    /// One more duration.
    pub fn record(&mut self, d: std::time::Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        self.buckets[(63 - ns.max(1).leading_zeros() as usize).min(31)] += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    /// How many were recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The upper edge in nanoseconds of bucket `i` (`u64::MAX` for the last).
    pub fn upper_ns(i: usize) -> u64 {
        if i >= 31 { u64::MAX } else { 1u64 << (i + 1) }
    }

    /// The `q`-quantile's bucket upper edge, in nanoseconds; `None` if empty.
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        let n = self.count();
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.buckets.iter().enumerate() {
            seen += c;
            if n > 0 && seen >= rank {
                return Some(Self::upper_ns(i));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::LatencyHistogram;
    use std::time::Duration;

    #[test]
    fn durations_fall_in_power_of_two_buckets() {
        let mut h = LatencyHistogram::default();
        assert_eq!(h.quantile_ns(0.5), None);
        h.record(Duration::ZERO);
        h.record(Duration::from_nanos(5_000));
        h.record(Duration::from_nanos(5_000));
        h.record(Duration::from_secs(100));
        assert_eq!(h.buckets[0], 1);
        assert_eq!(h.buckets[12], 2, "5 µs lies in [4096, 8192) ns");
        assert_eq!(h.buckets[31], 1);
        assert_eq!(h.count(), 4);
        assert_eq!(h.quantile_ns(0.5), Some(8192));
        assert_eq!(h.quantile_ns(1.0), Some(u64::MAX));
        assert_eq!(h.sum_ns, 10_000 + 100_000_000_000);
    }
}

/// TLPs counted by kind, indexed by their first header byte (Fmt and Type).
#[derive(Clone, Debug)]
pub(crate) struct KindCounts(Box<[u64; 256]>);

impl Default for KindCounts {
    fn default() -> Self {
        KindCounts(Box::new([0; 256]))
    }
}

impl KindCounts {
    /// One more `t`.
    pub(crate) fn count(&mut self, t: &TlpRepr<'_>) {
        self.0[t.kind() as u8 as usize] += 1;
    }

    /// The counts by kind name (`MRd64`, `CfgWr0`, …), the kinds seen only.
    pub(crate) fn by_name(&self) -> BTreeMap<&'static str, u64> {
        let mut out = BTreeMap::new();
        for (i, n) in self.0.iter().enumerate() {
            if *n > 0
                && let Some(k) = tlp::Kind::BY_BYTE0[i]
            {
                out.insert(k.name(), *n);
            }
        }
        out
    }
}
