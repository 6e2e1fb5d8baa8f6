//! What the endpoint counts: per export, and for the endpoint as a whole; and what a pool's
//! inventory says of an export.

/// Counters of one exported device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Successful attaches.
    pub attaches: u64,
    /// Attaches refused (not allowed, or owned by another host).
    pub refusals: u64,
    /// Requests from the owner executed against the device.
    pub host_requests: u64,
    /// Requests the device originated (DMA, MSI-X) sent to the owner.
    pub device_requests: u64,
    /// Completions from the owner for the device's reads.
    pub device_completions: u64,
    /// Device DMA dropped at a reset (reads without their completion, queued TLPs).
    pub dma_dropped: u64,
    /// TLPs that did not fit the link (Max_Payload_Size above what the MTU carries).
    pub too_large: u64,
    /// Function-level resets done on release.
    pub resets: u64,
    /// Owners cut off because their pool claim went (released, expired, revoked).
    pub claims_revoked: u64,
    /// Attaches refused because the pool did not hold the claim they named.
    pub stale_tokens: u64,
}

/// What a pool's inventory says of an export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportIdentity {
    /// PCI Vendor ID.
    pub vendor_id: u16,
    /// PCI Device ID.
    pub device_id: u16,
    /// Class code (base, sub-class, programming interface).
    pub class: u32,
    /// The largest BAR's size in bytes (a GPU's VRAM aperture).
    pub largest_bar: u64,
    /// The hosts that may attach it.
    pub allow: Vec<String>,
}

/// What the endpoint counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuStats {
    /// Per export, by name.
    pub exports: Vec<(String, ExportStats)>,
    /// Sessions that came up.
    pub sessions_up: u64,
    /// Sessions their host closed (CLOSE), rather than leaving them to time out.
    pub sessions_closed_by_hosts: u64,
    /// Times a session's link fell silent (nothing from its host for the idle timeout); it
    /// rode through if its host was heard again within the ride-through time.
    pub sessions_silent: u64,
    /// Requests from sessions that own no device (answered UR / dropped).
    pub unowned_requests: u64,
    /// Control messages that did not parse.
    pub bad_control: u64,
    /// TLPs from the hosts that did not parse (dropped by the dispatcher).
    pub malformed_tlps: u64,
    /// The largest data payload a host sent (bytes): at most the Max_Payload_Size the
    /// attach negotiated.
    pub largest_payload_received: u32,
    /// Datagrams the kernel refused as larger than the path to their host carries whole
    /// (`EMSGSIZE`: Don't Fragment is set; dropped and replayed, never fragmented).
    pub datagrams_too_large: u64,
}
