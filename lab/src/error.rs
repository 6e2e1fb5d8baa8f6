//! What goes wrong in an experiment, and where.

use crate::affinity::CpuError;
use crate::replay::ReplayError;

/// Why an experiment stopped: which part, on which platform, and the error beneath.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The chaos soak could not start or run (`lab::chaos`): what went wrong, with the file,
    /// process or option.
    #[error("{0}")]
    Chaos(String),
    /// A thread could not be put on the CPUs asked for.
    #[error("{what}: {source}")]
    Cpus {
        /// Whose thread.
        what: &'static str,
        /// What the kernel or the request said.
        source: CpuError,
    },
    /// The GPU-box endpoint refused its options.
    #[error("the GPU-box endpoint: {0}")]
    Endpoint(#[from] bridge_gpu::GpuError),
    /// The GPU-box endpoint's thread did not start, or ended at its start.
    #[error("{0}")]
    EndpointThread(bridge_gpu::SpawnError<std::convert::Infallible>),
    /// The GPU-box endpoint's thread has ended (its ID may be another thread's by now).
    #[error("the GPU-box endpoint's thread has ended (its log says why)")]
    EndpointEnded,
    /// The directly attached simgpu's thread did not start.
    #[error("the direct simgpu: {0}")]
    Direct(#[source] std::io::Error),
    /// Attaching through the bridges failed.
    #[error("attaching through the bridges: {0}")]
    Attach(#[from] bridge_host::AttachError),
    /// A platform's driver refused or its device reported an error.
    #[error("{platform} {what}: {source}")]
    Driver {
        /// `direct` or `bridged`; `bulk` for a copy measured on either.
        platform: &'static str,
        /// What was being done.
        what: &'static str,
        /// The driver's error.
        source: driver::DriverError,
    },
    /// A workload failed on a platform (its result wrong, or its driver refused).
    #[error("{platform} workload{run}: {source}")]
    Workload {
        /// `direct` or `bridged`.
        platform: &'static str,
        /// Which run, as ` (2 of 15)` or ` (warm-up)`; empty for the only one.
        run: String,
        /// The workload's error.
        source: testbed::workload::WorkloadError,
    },
    /// No DMA memory of that size was left for a copy's buffer.
    #[error("no {bytes} B of DMA memory for the copy")]
    NoDmaMemory {
        /// The buffer's size.
        bytes: usize,
    },
    /// A copy to the device and back returned other bytes than were sent.
    #[error("a copy of {bytes} B to the device and back came back different")]
    CopyCorrupted {
        /// The copy's size.
        bytes: usize,
    },
    /// The host endpoint removed the device while a measurement ran.
    #[error("{during}: the host endpoint reported the device removed: {why}")]
    Removed {
        /// What failed.
        during: Box<LabError>,
        /// Why the host endpoint removed it.
        why: String,
    },
    /// The vfio-user server or a client of it failed.
    #[error("vfio-user, {what}: {source}")]
    VfioUser {
        /// What was being done.
        what: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// A bench could not measure what it was asked to (the step and why, in its words).
    #[error("{0}")]
    Bench(String),
    /// A profile's field absent, or not the kind of number it must be.
    #[error("profile.{field}: missing or not {expected}")]
    ProfileField {
        /// The field's key.
        field: String,
        /// What it must be: "a count", "a rate ≥ 0".
        expected: &'static str,
    },
    /// A workload's direct time that is no time: the model divides by it.
    #[error("direct time {seconds} s: must be > 0")]
    DirectTime {
        /// What was given.
        seconds: f64,
    },
    /// A replay failed on a platform.
    #[error("{platform} replay: {source}")]
    Replay {
        /// `direct` or `bridged`.
        platform: &'static str,
        /// The replay's error.
        source: ReplayError,
    },
}

impl LabError {
    /// A [`LabError::Cpus`] for `what`'s thread.
    pub fn cpus(what: &'static str) -> impl FnOnce(CpuError) -> LabError {
        move |source| LabError::Cpus { what, source }
    }

    /// A [`LabError::Driver`] for `what` on `platform`.
    pub fn driver(
        platform: &'static str,
        what: &'static str,
    ) -> impl FnOnce(driver::DriverError) -> LabError {
        move |source| LabError::Driver { platform, what, source }
    }
}

/// The `dxpu` command's commands report an error as its text.
impl From<LabError> for String {
    fn from(e: LabError) -> String {
        e.to_string()
    }
}

/// As [`LabError`]'s.
impl From<CpuError> for String {
    fn from(e: CpuError) -> String {
        e.to_string()
    }
}
