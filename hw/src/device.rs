//! The device interface a bridge drives, the same for a simulated and a real device: it
//! receives host-originated TLPs (config, memory, IO) and answers non-posted ones; it
//! originates its own requests (DMA reads and writes, MSI-X writes) and receives the
//! completions to its reads; it resets. What it sends are values the platform takes after
//! each call ([`Device::upstream`]), as quinn's connection hands out its datagrams: no
//! callback into the platform while the device runs. Errors become completion statuses,
//! never panics.
#![forbid(unsafe_code)]

use tlp::{Bdf, TlpRepr};

/// The devices' clock: CLOCK_MONOTONIC in nanoseconds, the clock a host process on the same
/// machine reads too, so that times a device writes compare with the host's.
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
}

/// A PCIe function behind a bridge.
pub trait Device {
    /// The function's ID: completer ID of its completions, requester ID of its requests.
    fn id(&self) -> Bdf;
    /// Max_Payload_Size in bytes as its Device Control register says now.
    fn max_payload(&self) -> u32;
    /// A host-originated request. Non-posted requests get exactly one completion upstream.
    fn request(&mut self, tlp: &TlpRepr<'_>);
    /// A completion for one of the device's own reads.
    fn completion(&mut self, tlp: &TlpRepr<'_>);
    /// Lets the device progress (command processing, DMA, interrupts). Returns whether it
    /// did anything.
    fn poll(&mut self) -> bool;
    /// The next TLP the device sends towards the host, in the order it sent them, its
    /// payload lent until the next call: the platform takes them all after each call above
    /// (`crate::upstream`).
    fn upstream(&mut self) -> Option<TlpRepr<'_>>;
    /// Function-level reset: back to the power-on state; in-flight DMA is dropped.
    fn reset(&mut self);
    /// How often, since it was made, the device waited — in a link's time, whatever the
    /// platform's — for reads of host memory it had issued: the round trips its reads put on
    /// its own critical path, for a platform that completes reads at once and cannot see
    /// which the device would have waited on. `None` for a device that does not count them.
    fn reads_waited_on(&self) -> Option<u64> {
        None
    }
    /// When the device next has work to do though nothing arrives (a timed kernel's end),
    /// ns on CLOCK_MONOTONIC: a platform that sleeps while the device is idle wakes by then
    /// to poll it. `None`: only what arrives makes work.
    fn wake_at_ns(&self) -> Option<u64> {
        None
    }
}
