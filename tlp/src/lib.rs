//! The PCIe transaction layer for dxpu: Transaction Layer Packets of PCIe Base
//! Specification 6.x in non-flit mode — parse, validate, emit — and the transaction rules
//! a bridge needs (splitting requests, building read completions, flow-control classes and
//! credits). No I/O, no allocation on the parse and emit paths.
//!
//! Bytes become a [`TlpPacket`] (a checked view: structure and sizes) and then a
//! [`TlpRepr`] (the validated value, borrowing its payload). A `TlpRepr` emits back to the
//! same bytes. Every malformed case the spec names is its own [`Error`] variant; unknown
//! but legal codes (message codes, reserved completion statuses, prefix types) round-trip.
#![forbid(unsafe_code)]

mod ecrc;
mod error;
mod fields;
mod ids;
mod packet;
mod prefix;
mod repr;
pub mod rules;

pub use ecrc::ecrc;
pub use error::Error;
pub use fields::{AddressType, AtomicOp, Attr, CplStatus, Credits, FcClass, Kind, MessageCode, MsgRouting};
pub use ids::{Bdf, ParseBdfError, Tag};
pub use packet::{ParseConfig, TlpPacket};
pub use prefix::{MAX_END_TO_END_PREFIXES, MAX_PREFIXES, Prefix, PrefixKind, Prefixes};
pub use repr::{Address, Body, Completion, ConfigTarget, Message, NonConformance, Request, TlpRepr};
