//! Why a replay failed.

use driver::DriverError;

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The driver refused or the device reported an error.
    #[error("{what}: {error}")]
    Driver {
        /// What the replay was doing.
        what: String,
        /// The driver's error.
        error: DriverError,
    },
    /// The replay did not do what the plan says (an activity missing, out of order, shorter
    /// than its traced time, a copy's bytes not in VRAM).
    #[error("the replay is not the trace's job: {0}")]
    Verification(String),
    /// Nothing moved for the stall timeout.
    #[error("the replay stalled: {0}")]
    Stalled(String),
}

pub(super) fn driver(what: impl Into<String>) -> impl FnOnce(DriverError) -> ReplayError {
    let what = what.into();
    move |error| ReplayError::Driver { what, error }
}
