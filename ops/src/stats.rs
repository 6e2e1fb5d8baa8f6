//! The endpoints' counters as JSON (`dxpu ctl stats`, `sessions`) and a host's metrics: what
//! the static host, the pool host and the box all report, below each of their run times.

use bridge::attach::Origin;
use bridge_host::{HostStats, LatencyHistogram};
use serde_json::{Value, json};

use crate::metrics::{Exposition, labels, link_metrics};

/// A pool agent's series, `role` `box` or `host`: its leases, their renewals and failed
/// renewals, fences, claims and their time, releases, and etcd's errors.
pub fn pool_agent_metrics(x: &mut Exposition, role: &str, c: &pool::AgentCounts) {
    let l = || labels(&[("role", role)]);
    x.counter("pool_leases", "Leases the pool agent was granted", l(), c.leases);
    x.counter("pool_lease_renewals", "Lease renewals etcd answered", l(), c.renewals);
    x.counter(
        "pool_lease_renewal_failures",
        "Lease renewals that failed (etcd unreachable or slow, or its stream broken)",
        l(),
        c.renewal_failures,
    );
    x.counter(
        "pool_fences",
        "Leases lost: a host's claims under one fenced, or a box's registration ended",
        l(),
        c.fences,
    );
    x.counter("pool_etcd_errors", "Requests to etcd that failed", l(), c.etcd_errors);
    if role == "host" {
        x.counter("pool_claims", "Devices claimed", l(), c.claims);
        x.counter_f64(
            "pool_claim_seconds",
            "Seconds the claims made took, together (over pool_claims_total: the mean)",
            l(),
            c.claim_ns as f64 / 1e9,
        );
        x.counter("pool_releases", "Claims given back", l(), c.releases);
    }
}

/// A host endpoint's exposition, before its devices.
pub fn host_exposition() -> Exposition {
    let mut x = Exposition::default();
    x.gauge(
        "up",
        "The endpoint runs (1), by role and version",
        labels(&[("role", "host"), ("version", env!("CARGO_PKG_VERSION"))]),
        1.0,
    );
    crate::metrics::build_info(&mut x);
    x
}

/// One device on a host, as its metrics name it: its label, its box's address, and what the
/// box said of it at attach (`origin`; none before the first attach).
pub struct DeviceLabels<'a> {
    /// The host's name for it.
    pub label: &'a str,
    /// The box's address.
    pub peer: &'a str,
    /// Its IDs, the box's name and its PCI address there.
    pub origin: Option<&'a Origin>,
}

/// One device's metrics on a host: its info (box, the box's PCI address in dcgm-exporter's
/// form, IDs), state, removals, and with `stats` (an attached device) its TLPs, DMA,
/// interrupts, timeouts, register-read latency and link.
pub fn device_metrics(
    x: &mut Exposition,
    dev: &DeviceLabels<'_>,
    state: &str,
    removals: u64,
    stats: Option<&HostStats>,
) {
    let (label, peer) = (dev.label, dev.peer);
    // The same labels as the box's dxpu_device_info, so that the two join on box and
    // pci_bus_id (and with dcgm-exporter on pci_bus_id); known once the device has attached.
    let mut info = vec![("device", label.to_string()), ("peer", peer.to_string())];
    if let Some(o) = dev.origin {
        info.extend([
            ("box", o.box_name.clone()),
            ("pci_bus_id", crate::metrics::dcgm_bus_id(&o.pci_address)),
            ("vendor_id", format!("{:#06x}", o.vendor_id)),
            ("device_id", format!("{:#06x}", o.device_id)),
        ]);
    }
    let info: Vec<(&str, &str)> = info.iter().map(|(k, v)| (*k, v.as_str())).collect();
    x.gauge(
        "device_info",
        "A configured device (1): its box's address, and once attached the box, the device's PCI address there and its IDs",
        labels(&info),
        1.0,
    );
    for st in ["attached", "silent", "attaching", "down", "detached", "removed"] {
        x.gauge(
            "device_state",
            "1 for the device's state, 0 for the others (attached, silent, attaching, down, detached, removed)",
            labels(&[("device", label), ("state", st)]),
            if state == st { 1.0 } else { 0.0 },
        );
    }
    let d = labels(&[("device", label)]);
    x.counter("surprise_removals", "Devices seen removed (link down, box gone, fenced)", d.clone(), removals);
    let Some(s) = stats else { return };
    for (dir, m) in [("sent", &s.tlps_sent), ("received", &s.tlps_received)] {
        for (kind, n) in m {
            x.counter(
                "tlps",
                "TLPs by kind and direction",
                labels(&[("device", label), ("direction", dir), ("kind", kind)]),
                *n,
            );
        }
    }
    for (op, n, bytes, outside) in [
        ("read", s.dma_reads, s.dma_read_bytes, s.dma_read_refused),
        ("write", s.dma_writes, s.dma_write_bytes, s.dma_write_dropped),
    ] {
        let l = labels(&[("device", label), ("op", op)]);
        x.counter("dma", "Device DMA into granted windows", l.clone(), n);
        x.counter("dma_bytes", "Bytes of device DMA into granted windows", l.clone(), bytes);
        x.counter("dma_outside_windows", "Device DMA outside every granted window (refused)", l, outside);
    }
    for (name, help, v) in [
        ("interrupts", "MSI-X messages received", s.interrupts),
        ("completion_timeouts", "Non-posted requests that timed out", s.completion_timeouts),
        ("failed_requests", "Non-posted requests failed (link down, device removed)", s.failed_requests),
        ("stray_completions", "Completions matching no request", s.stray_completions),
        ("unclaimed_mmio", "MMIO to addresses no BAR claims", s.unclaimed_mmio),
        ("malformed_tlps", "TLPs from the box that did not parse", s.malformed_tlps),
        (
            "link_datagrams_too_large",
            "Datagrams the kernel refused as larger than the route carries whole (Don't Fragment set)",
            s.datagrams_too_large,
        ),
    ] {
        x.counter(name, help, d.clone(), v);
    }
    mmio_histogram(x, &d, &s.mmio_reads);
    link_metrics(x, &labels(&[("device", label), ("peer", peer)]), &s.link);
}

fn mmio_histogram(x: &mut Exposition, l: &crate::metrics::Labels, h: &LatencyHistogram) {
    x.log2_histogram(
        "mmio_read_seconds",
        "Register reads through the bridges, request to completion",
        l.clone(),
        &h.buckets,
        1e-9,
        h.sum_ns as f64 * 1e-9,
    );
}

/// A host device's counters as `dxpu ctl stats` gives them.
pub fn host_stats_json(s: &HostStats) -> Value {
    json!({
        "tlps_sent": s.tlps_sent, "tlps_received": s.tlps_received,
        "dma_reads": s.dma_reads, "dma_writes": s.dma_writes,
        "dma_read_bytes": s.dma_read_bytes, "dma_write_bytes": s.dma_write_bytes,
        "dma_read_outside_windows": s.dma_read_refused, "dma_write_outside_windows": s.dma_write_dropped,
        "interrupts": s.interrupts, "completion_timeouts": s.completion_timeouts,
        "failed_requests": s.failed_requests, "stray_completions": s.stray_completions,
        "unclaimed_mmio": s.unclaimed_mmio, "malformed_tlps": s.malformed_tlps,
        "link_datagrams_too_large": s.datagrams_too_large,
        "mmio_read_samples": s.mmio_reads.count(),
        "mmio_read_p50_le_ns": s.mmio_reads.quantile_ns(0.5), "mmio_read_p99_le_ns": s.mmio_reads.quantile_ns(0.99),
        "link": link_json(&s.link),
    })
}

/// A session's link counters as JSON (both endpoints' `sessions`).
pub fn link_json(l: &link::Stats) -> Value {
    json!({
        "rtt_p50_le_us": l.rtt_quantile_us(0.5), "rtt_p99_le_us": l.rtt_quantile_us(0.99),
        "rtt_samples": l.rtt_samples(),
        "frames_sent": l.frames_sent, "frames_received": l.frames_received,
        "bytes_sent": l.bytes_sent, "bytes_received": l.bytes_received,
        "tlps_sent": l.tlps_sent, "tlps_received": l.tlps_received,
        "data_frames_sent": l.data_frames_sent, "acks_sent": l.acks_sent,
        "retransmits": l.retransmits, "replay_timeouts": l.replay_timeouts,
        "naks_sent": l.naks_sent, "naks_received": l.naks_received,
        "credit_stalls": l.credit_stalls,
        "dropped_malformed": l.dropped_malformed, "dropped_bad_mac": l.dropped_bad_mac,
        "dropped_replayed": l.dropped_replayed, "dropped_stale_epoch": l.dropped_stale_epoch,
        "dropped_out_of_window": l.dropped_out_of_window, "dropped_duplicate": l.duplicate_data,
        "key_updates": l.key_updates,
    })
}

#[cfg(test)]
mod tests {
    use bridge::attach::Origin;

    use super::{DeviceLabels, device_metrics, host_exposition};

    /// What the box says at attach becomes label values: a box name with a quote, a
    /// backslash and a newline (a hostile or careless box) is escaped, not a broken
    /// exposition, and the device's IDs and address are in the forms the box's own use.
    #[test]
    fn what_a_box_says_of_its_device_is_escaped_into_the_hosts_labels() {
        let origin = Origin {
            vendor_id: 0x10de,
            device_id: 0x2330,
            box_name: "box \"a\"\\\nb".into(),
            pci_address: "0000:41:00.0".into(),
        };
        let mut x = host_exposition();
        let dev = DeviceLabels { label: "gpu0", peer: "10.0.0.2:7440", origin: Some(&origin) };
        device_metrics(&mut x, &dev, "attached", 0, None);
        let text = x.render();
        let info = text.lines().find(|l| l.starts_with("dxpu_device_info{")).unwrap_or_default();
        assert!(info.contains(r#"box="box \"a\"\\\nb""#), "{info}");
        assert!(info.contains(r#"pci_bus_id="00000000:41:00.0""#), "{info}");
        assert!(info.contains(r#"vendor_id="0x10de""#) && info.contains(r#"device_id="0x2330""#), "{info}");
        assert_eq!(text.lines().filter(|l| l.starts_with("dxpu_device_info{")).count(), 1, "{text}");
        // Before the first attach: the device and its box's address only.
        let mut x = host_exposition();
        device_metrics(&mut x, &DeviceLabels { origin: None, ..dev }, "attaching", 0, None);
        let text = x.render();
        assert!(text.contains(r#"dxpu_device_info{device="gpu0",peer="10.0.0.2:7440"} 1"#), "{text}");
    }
}
