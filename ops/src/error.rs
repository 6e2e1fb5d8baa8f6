//! [`RunError`]: why a run time (`dxpu gpu`, `dxpu host`) could not start, check, reload or
//! go on — what was wrong, with the value and where, as each part below it says it.

use crate::capture::CaptureError;
use crate::config::ConfigError;
use crate::control::StartError;
use crate::process::ProcessError;
use crate::reload::ReloadError;

/// Why a run time could not start, check, reload or go on.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration file could not be read, or a value of it is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A value of the configuration, wrong as the endpoint's options take it, in the file
    /// at `path`.
    #[error("{path}: {source}")]
    InFile {
        /// The file.
        path: String,
        /// What is wrong, where in it.
        #[source]
        source: ConfigError,
    },
    /// The host's file gives both `[[attach]]` and `[pool]`.
    #[error("{path}: give [[attach]] or [pool], not both")]
    AttachAndPool {
        /// The file.
        path: String,
    },
    /// `--capture` given to a pool host, whose devices are not captured.
    #[error("--capture: for the devices of [[attach]]; a pool's are not captured")]
    CaptureInPool,
    /// A reload changes what only a restart may (`what`: the keys, a host removed, a host's
    /// key): refused, nothing changed.
    #[error("{path}: {what} changed: that needs a restart")]
    NeedsRestart {
        /// The file.
        path: String,
        /// What changed.
        what: String,
    },
    /// `ctl detach` of a label no `[[attach]]` has.
    #[error("detach {label}: not configured (configured: {})", configured.join(", "))]
    NotConfigured {
        /// The label asked for.
        label: String,
        /// The labels there are.
        configured: Vec<String>,
    },
    /// `ctl detach` of a device detached already.
    #[error("detach {label}: not attached")]
    NotAttached {
        /// The label.
        label: String,
    },
    /// `ctl export` of a name no `[[device]]` of the file has.
    #[error("export {name}: no [[device]] of that name in {path}")]
    NoSuchExport {
        /// The name asked for.
        name: String,
        /// The file.
        path: String,
    },
    /// A served device's vfio-user server thread panicked while it was stopped.
    #[error("{label}: {source}")]
    Served {
        /// The device's label.
        label: String,
        /// What happened.
        #[source]
        source: bridge_host::vfio_user::ServerPanicked,
    },
    /// The box's endpoint could not be made, or refused a change (an export, a host).
    #[error(transparent)]
    Endpoint(#[from] bridge_gpu::GpuError),
    /// The box endpoint's socket or event loop failed while serving.
    #[error("the GPU-box endpoint: {0}")]
    Serving(#[source] std::io::Error),
    /// The control socket or the metrics listener could not start.
    #[error(transparent)]
    Control(#[from] StartError),
    /// Signals or logging could not be set up.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// The capture file could not be begun.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// The box could not join its pool (the file at `path` names it).
    #[error("{path}: {source}")]
    Pool {
        /// The file.
        path: String,
        /// What failed.
        #[source]
        source: BoxStartError,
    },
    /// A reload could not start, or did not finish in time.
    #[error(transparent)]
    Reload(#[from] ReloadError),
    /// `--check`: a device the start would open cannot be (`hw::vfio::check_ready`).
    #[error("device {device}: {why}")]
    DeviceNotReady {
        /// The export's name.
        device: String,
        /// Why, and what to do.
        why: String,
    },
    /// `--against-running`: the file names no control socket to ask the daemon on.
    #[error("{path}: no [control] socket: --against-running asks the running daemon there")]
    NoControlSocket {
        /// The file.
        path: String,
    },
    /// `--against-running`: the running daemon could not be asked, or said no.
    #[error("asking the running daemon what runs: {0}")]
    Running(String),
    /// A reload asked for while the endpoint stops.
    #[error("reload: the endpoint is stopping")]
    Stopping,
}

/// For callers that print it (`dxpu`'s `main`, whose errors are text).
impl From<RunError> for String {
    fn from(e: RunError) -> String {
        e.to_string()
    }
}

/// Why a box could not join its pool.
#[derive(Debug, thiserror::Error)]
pub enum BoxStartError {
    /// `pool.ownership_log` could not be opened or written.
    #[error("pool.ownership_log = {}: {source}", path.display())]
    OwnershipLog {
        /// The file.
        path: std::path::PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The pool's agent could not start.
    #[error("{0}")]
    Agent(#[source] pool::PoolError),
}

/// For the run times' errors, which are text.
impl From<BoxStartError> for String {
    fn from(e: BoxStartError) -> String {
        e.to_string()
    }
}
