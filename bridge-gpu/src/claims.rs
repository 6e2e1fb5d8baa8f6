//! What a pool says of claims ([`ClaimCheck`]), the attaches waiting for it to confirm one,
//! a device's owner, and the journal where changes of owner and of health are sent
//! (`docs/pool.md`). The endpoint acting on them is in `pool`.

/// How long an attach waits for the pool to confirm its claim before it is refused.
pub const CLAIM_CONFIRM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// What the pool says of a claim (`ClaimCheck::verdict`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimVerdict {
    /// The pool holds this claim: the host may attach (or keep) the device.
    Valid,
    /// The pool holds no such claim (another host's, a newer one, or none): refused, why.
    Refused(String),
    /// The pool has not seen that far yet (the token is newer than what it has read).
    Unknown,
}

/// The box's view of a pool's claims (`docs/pool.md`): with one set
/// ([`GpuEndpoint::set_claims`](crate::GpuEndpoint::set_claims)), an attach is accepted only with the token of a claim the
/// pool holds for that host on that device, and an owner whose claim goes is cut off and the
/// device reset. The datapath never waits on it: it is asked from the poll loop, and must
/// answer from what it has (a lock and a map, no I/O).
pub trait ClaimCheck: Send {
    /// A number that changes whenever the claims may have changed (read every poll).
    fn generation(&self) -> u64;
    /// Whether `host` holds the claim on `device` with fencing token `token`. With the
    /// `ticket` of a look-up asked after the attach arrived and since answered, a token
    /// still unknown is one etcd never issued (the look-up read a revision at least as new
    /// as any claim the host could hold then): refused, not waited on.
    fn verdict(&self, device: &str, host: &str, token: u64, ticket: Option<u64>) -> ClaimVerdict;
    /// Asks the pool to read `device`'s claim now (an attach is waiting on a token it has
    /// not seen); the answer comes as a new generation. Returns the look-up's ticket.
    fn look_up(&self, device: &str) -> u64;
}

/// One change of a device's owner, as the box made it (its ownership log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnershipEvent {
    /// The export.
    pub device: String,
    /// The host.
    pub host: String,
    /// The claim's fencing token, for a pool device.
    pub token: Option<u64>,
    /// Attached (true) or released (false).
    pub attached: bool,
    /// Why it was released.
    pub why: String,
}

/// Where [`GpuEndpoint::set_ownership_sink`](crate::GpuEndpoint::set_ownership_sink) sends ownership changes.
pub type OwnershipSink = Box<dyn FnMut(&OwnershipEvent) + Send>;

/// Where [`GpuEndpoint::set_health_sink`](crate::GpuEndpoint::set_health_sink) sends health changes: the export and `ok` or why
/// it is unhealthy.
pub type HealthSink = Box<dyn FnMut(&str, &str) + Send>;

/// Who holds an export: the session, its host, and the claim's token (pool devices).
#[derive(Clone)]
pub(crate) struct Owner {
    pub(crate) sid: u32,
    pub(crate) host: String,
    pub(crate) token: Option<u64>,
}

/// An attach waiting for the pool to confirm its claim.
pub(crate) struct PendingAttach {
    pub(crate) sid: u32,
    pub(crate) device: String,
    pub(crate) token: u64,
    pub(crate) ticket: u64,
    pub(crate) since: std::time::Instant,
}

/// The pool's claims as this endpoint uses them.
pub(crate) struct Claims {
    pub(crate) check: Box<dyn ClaimCheck>,
    pub(crate) generation: u64,
    pub(crate) pending: Vec<PendingAttach>,
}

/// What the attach path needs besides the session and the exports.
pub(crate) struct AttachCtx<'a> {
    pub(crate) claims: &'a mut Option<Claims>,
    pub(crate) journal: &'a mut Journal,
}

/// Where ownership changes go.
#[derive(Default)]
pub(crate) struct Journal {
    pub(crate) sink: Option<OwnershipSink>,
    pub(crate) health: Option<HealthSink>,
}

impl Journal {
    pub(crate) fn health(&mut self, device: &str, health: &str) {
        if let Some(sink) = &mut self.health {
            sink(device, health);
        }
    }

    pub(crate) fn record(&mut self, device: &str, owner: &Owner, attached: bool, why: &str) {
        if let Some(sink) = &mut self.sink {
            sink(&OwnershipEvent {
                device: device.to_string(),
                host: owner.host.clone(),
                token: owner.token,
                attached,
                why: why.to_string(),
            });
        }
    }
}
