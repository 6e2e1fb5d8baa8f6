//! Errors of the link layer.
#![forbid(unsafe_code)]

/// Why a datagram is not a frame. Such datagrams are dropped and counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than the smallest frame.
    #[error("datagram of {len} bytes is shorter than the {min}-byte minimum frame")]
    Truncated {
        /// Bytes received.
        len: usize,
        /// Minimum frame size.
        min: usize,
    },
    /// Not a dxpu frame.
    #[error("bad magic {found:#06x} (expected 0x4458)")]
    BadMagic {
        /// The first two bytes.
        found: u16,
    },
    /// A version this endpoint does not speak.
    #[error("unsupported protocol version {found} (this endpoint speaks 1)")]
    UnsupportedVersion {
        /// The version byte.
        found: u8,
    },
    /// The CRC32C does not match.
    #[error("CRC32C mismatch: frame says {found:#010x}, computed {computed:#010x}")]
    BadCrc {
        /// CRC carried.
        found: u32,
        /// CRC computed.
        computed: u32,
    },
    /// The body length field disagrees with the datagram size.
    #[error("frame length fields give {expected} bytes, datagram has {actual}")]
    LengthMismatch {
        /// Size the header implies.
        expected: usize,
        /// Datagram size.
        actual: usize,
    },
    /// A TLP record of a DATA body is cut short or empty.
    #[error("malformed TLP record {offset_from_end} bytes before the end of the body")]
    BadRecord {
        /// Where, counted from the end of the body.
        offset_from_end: usize,
    },
    /// A selective acknowledgement's body is not whole ranges, or has too many.
    #[error("selective acknowledgement of {len} bytes: not whole 8-byte ranges, or more than 16")]
    BadSack {
        /// Body length.
        len: usize,
    },
    /// The frame does not fit the buffer or the MTU.
    #[error("frame of {len} bytes exceeds {max}")]
    TooLarge {
        /// Frame size.
        len: usize,
        /// Limit.
        max: usize,
    },
}

/// Why a TLP was not queued for sending.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The session is not established (still handshaking, or down).
    #[error("session is not up")]
    NotConnected,
    /// The send queue of the TLP's class is full (configured bound); try after progress.
    #[error("send queue for {class:?} TLPs is full ({limit} queued)")]
    QueueFull {
        /// The flow-control class.
        class: tlp::FcClass,
        /// The configured bound.
        limit: usize,
    },
    /// The bytes are not a valid TLP.
    #[error("not a valid TLP: {0}")]
    InvalidTlp(tlp::Error),
    /// The TLP (with its record header) does not fit one frame at the negotiated MTU.
    #[error("TLP of {len} bytes does not fit a frame (MTU {mtu})")]
    TooLarge {
        /// TLP size.
        len: usize,
        /// Negotiated MTU.
        mtu: usize,
    },
}

/// A configuration the link cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The named setting is out of range.
    #[error("link setting `{key}` = {value}: {problem}")]
    Invalid {
        /// Setting name.
        key: &'static str,
        /// Its value, printed.
        value: String,
        /// What is wrong.
        problem: &'static str,
    },
}
