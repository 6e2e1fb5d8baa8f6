//! The PCIe transaction layer for dxpu: Transaction Layer Packets of PCIe Base
//! Specification 6.x in non-flit mode — parse, validate, emit — and the transaction rules
//! a bridge needs (splitting requests, building read completions, flow-control classes and
//! credits). No I/O, no allocation on the parse and emit paths.
//!
//! Bytes become a [`TlpPacket`] (a checked view: structure and sizes) and then a
//! [`TlpRepr`] (the validated value, borrowing its payload). A `TlpRepr` emits back to the
//! same bytes. Every malformed case the spec names is its own [`Error`] variant; unknown
//! but legal codes (message codes, reserved completion statuses, prefix types) round-trip.
//!
//! ```
//! use tlp::{Kind, ParseConfig, TlpRepr, rules};
//!
//! // A 64-bit memory read of 64 bytes from 01:00.0, tag 0x12.
//! let bytes = [0x20, 0x00, 0x00, 0x10, 0x01, 0x00, 0x12, 0xff,
//!              0x00, 0x00, 0x00, 0x01, 0xfe, 0xe0, 0x00, 0x00];
//! let read = TlpRepr::parse_bytes(&bytes, &ParseConfig::default())?;
//! assert_eq!(read.kind(), Kind::MRd64);
//! assert_eq!(read.to_string(), "MRd64 01:00.0 tag=0x012 addr=0x00000001_fee00000 len=16 be=f/f");
//!
//! // Answer it the way a completer must: completions split at the Read Completion Boundary.
//! let data = [0xa5u8; 64];
//! let mut wire = [0u8; 128];
//! for chunk in rules::read_completions(0x1_fee0_0000, 16, 0xf, 0xf, rules::Rcb::B64, rules::TransferSize::B128) {
//!     let off = chunk.data_offset as usize;
//!     let payload = &data[off..off + chunk.length_dw as usize * 4];
//!     let cpl = rules::completion_with_data(&read, tlp::Bdf::new(0x3b, 0, 0), &chunk, payload);
//!     let n = cpl.emit(&mut wire)?;
//!     assert_eq!(TlpRepr::parse_bytes(&wire[..n], &ParseConfig::default())?, cpl);
//! }
//! # Ok::<(), tlp::Error>(())
//! ```
#![forbid(unsafe_code)]

mod ecrc;
mod error;
mod fields;
mod ids;
#[cfg(feature = "json")]
pub mod json;
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
