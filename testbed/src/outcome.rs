//! What a workload's run gives: its steps, timed, each result checked against the CPU's,
//! and why one failed — below both the workloads (`workload`) and the AI ones (`ai`).
#![forbid(unsafe_code)]

use driver::DriverError;

/// One step and how long it took.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// What ran.
    pub name: String,
    /// Wall time.
    pub seconds: f64,
}

/// What ran, verified.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadReport {
    /// Every step, in order, each verified against the CPU.
    pub steps: Vec<Step>,
    /// Bytes and seconds of the host→device copy (the demo's; an AI workload's bulk upload
    /// or stream).
    pub h2d: (usize, f64),
    /// Bytes and seconds of the device→host copy (the demo's; (0, 0) where none stands
    /// alone).
    pub d2h: (usize, f64),
    /// Wall time of the whole workload.
    pub seconds: f64,
}

/// Why the workload failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    /// The driver failed.
    #[error("{step}: {error}")]
    Driver {
        /// Which step.
        step: String,
        /// What the driver said.
        error: DriverError,
    },
    /// A result differs from the CPU reference.
    #[error("{step}: result differs from the CPU reference at element {index}: {got} != {want}")]
    Mismatch {
        /// Which step.
        step: String,
        /// First differing element.
        index: usize,
        /// Device value.
        got: String,
        /// CPU value.
        want: String,
    },
}

pub(crate) fn check<T: PartialEq + std::fmt::Debug>(
    step: &str,
    got: &[T],
    want: &[T],
) -> Result<(), WorkloadError> {
    let index = match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(i) => i,
        None if got.len() == want.len() => return Ok(()),
        None => got.len().min(want.len()),
    };
    Err(WorkloadError::Mismatch {
        step: step.to_string(),
        index,
        got: format!("{:?}", got.get(index)),
        want: format!("{:?}", want.get(index)),
    })
}
