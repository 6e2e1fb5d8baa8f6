//! The datacenter transport between dxpu's endpoints: PCIe TLPs in UDP datagrams, with the
//! guarantees a PCIe link gives — nothing lost, nothing duplicated, PCIe ordering kept, a
//! receiver never overrun — and an authenticated peer.
//!
//! [`Session`] is a sans-IO state machine (no sockets, no clock, no threads): the caller
//! feeds it datagrams and time and sends what it produces. The wire format is in [`wire`]
//! and `docs/wire-protocol.md`.
// `unsafe` lives only in the driver module (system calls); the state machine has none.
#![deny(unsafe_code)]

pub mod auth;
mod config;
mod credits;
pub mod driver;
mod endpoint;
mod error;
mod handshake;
mod keys;
mod reorder;
mod replay_buffer;
mod replay_window;
mod rtt;
mod seq;
mod session;
mod session_ids;
mod time;
pub mod wire;

pub use auth::{PresharedKey, Rng};
pub use config::{
    Config, CreditGrant, DEFAULT_PATH_BANDWIDTH, DEFAULT_PATH_RTT, DEFAULT_RIDE_THROUGH, MAX_IN_FLIGHT,
    MAX_QUEUED, MAX_WINDOW_BYTES,
};
pub use endpoint::{Endpoint, EndpointStats, HandshakeFailure};
pub use error::{ConfigError, FrameError, SendError};
pub use handshake::{COOKIE_LEN, Refusal};
pub use keys::DEFAULT_KEY_UPDATE_FRAMES;
pub use seq::SeqNum;
pub use session::{
    DownReason, Event, InPlace, InPlaceFrom, Memory, RTT_BUCKETS, Role, SealedFrame, Session, Stats, Transmit,
};
pub use session_ids::{SessionIdHasher, SessionMap};
pub use time::Time;
