//! Why the endpoint could not start, or an operator's change could not be made.

use std::io;
use std::net::SocketAddr;

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The options are inconsistent.
    #[error("{0}")]
    Config(String),
    /// A device could not be opened.
    #[error("device {name}: {error}")]
    Device {
        /// Export name.
        name: String,
        /// What failed.
        error: io::Error,
    },
    /// The socket could not be set up.
    #[error("UDP socket on {addr}: {error}")]
    Socket {
        /// Address.
        addr: SocketAddr,
        /// What failed.
        error: io::Error,
    },
}
