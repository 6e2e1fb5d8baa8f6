//! The ways a TLP can be malformed, one variant per rule.

use crate::fields::Kind;

/// Why bytes are not a valid TLP, or a [`TlpRepr`](crate::TlpRepr) cannot be emitted.
/// Each message names the field and the value at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Fewer bytes than the header (or the Length field) requires.
    #[error("truncated TLP: {needed} bytes needed, {actual} present")]
    Truncated {
        /// Bytes required by the header and Length field.
        needed: usize,
        /// Bytes present.
        actual: usize,
    },
    /// A TLP with data whose Length field disagrees with the bytes present.
    #[error("Length field {length_dw} DW needs {expected} bytes in all, but {actual} are present")]
    LengthMismatch {
        /// The Length field, in DW (1024 for an encoded 0).
        length_dw: u16,
        /// Bytes the header, payload and digest need.
        expected: usize,
        /// Bytes present.
        actual: usize,
    },
    /// Bytes after the header of a TLP whose Fmt says it carries no data.
    #[error("{kind} carries no data, but {extra} bytes follow the header")]
    UnexpectedPayload {
        /// The TLP kind.
        kind: Kind,
        /// Bytes beyond header and digest.
        extra: usize,
    },
    /// Fmt/Type names no TLP (reserved, deprecated or flit-mode-only encodings).
    #[error("reserved Fmt/Type encoding: Fmt={fmt:03b} Type={ty:05b}")]
    ReservedFmtType {
        /// Fmt\[2:0\].
        fmt: u8,
        /// Type\[4:0\].
        ty: u8,
    },
    /// Prefixes beyond the limit.
    #[error("{count} TLP prefixes exceed the limit of {max}")]
    TooManyPrefixes {
        /// How many were present.
        count: usize,
        /// The limit that was exceeded.
        max: usize,
    },
    /// A local prefix after an end-to-end prefix (PCIe 6.0 §2.2.10).
    #[error("local TLP prefix {raw:#010x} follows an end-to-end prefix")]
    LocalPrefixAfterEndToEnd {
        /// The raw DW of the misplaced prefix.
        raw: u32,
    },
    /// A Length field the kind does not allow (IO/config: 1 DW; AtomicOps: operand sizes).
    #[error("{kind} with Length {length_dw} DW; allowed: {allowed:?}")]
    InvalidLength {
        /// The TLP kind.
        kind: Kind,
        /// The Length, in DW.
        length_dw: u16,
        /// The lengths the spec allows for this kind.
        allowed: &'static [u16],
    },
    /// Payload bytes not a whole number of DWs, or outside 1..=1024 DW (emit only).
    #[error("payload of {bytes} bytes is not 1..=1024 whole DWs")]
    InvalidPayload {
        /// Payload size in bytes.
        bytes: usize,
    },
    /// Length = 1 DW but Last DW BE is not 0000b.
    #[error("Length 1 DW requires Last DW BE 0000b, found {last_be:04b}")]
    LastBeNotZero {
        /// The Last DW BE field.
        last_be: u8,
    },
    /// Length > 1 DW but Last DW BE is 0000b.
    #[error("Length {length_dw} DW requires a non-zero Last DW BE")]
    LastBeZero {
        /// The Length, in DW.
        length_dw: u16,
    },
    /// Length > 1 DW but First DW BE is 0000b.
    #[error("Length {length_dw} DW requires a non-zero First DW BE")]
    FirstBeZero {
        /// The Length, in DW.
        length_dw: u16,
    },
    /// Byte enables that leave holes where the spec requires contiguous bytes
    /// (Length >= 3, or 2 DW not QW-aligned; PCIe 6.0 §2.2.5).
    #[error(
        "non-contiguous byte enables first={first_be:04b} last={last_be:04b} not allowed for Length {length_dw} DW at address {address:#x}"
    )]
    NonContiguousBe {
        /// First DW BE.
        first_be: u8,
        /// Last DW BE.
        last_be: u8,
        /// The Length, in DW.
        length_dw: u16,
        /// The request address.
        address: u64,
    },
    /// A memory request whose range crosses a 4 KiB boundary (PCIe 6.0 §2.2.7).
    #[error("request at {address:#x} of {length_dw} DW crosses a 4 KiB boundary")]
    Crosses4KiB {
        /// The request address.
        address: u64,
        /// The Length, in DW.
        length_dw: u16,
    },
    /// Payload larger than the configured Max_Payload_Size.
    #[error("payload of {bytes} bytes exceeds Max_Payload_Size {max_payload} bytes")]
    PayloadExceedsMps {
        /// Payload bytes.
        bytes: usize,
        /// The configured Max_Payload_Size in bytes.
        max_payload: usize,
    },
    /// The TLP digest does not match the ECRC computed over the TLP.
    #[error("ECRC mismatch: digest {found:#010x}, computed {computed:#010x}")]
    EcrcMismatch {
        /// The digest carried in the TLP.
        found: u32,
        /// The ECRC computed here.
        computed: u32,
    },
    /// A field that must hold a fixed value for this kind (TC, Attr, AT of IO/config
    /// requests; PH without TH).
    #[error("{kind}: field {field} must be {required}, found {found}")]
    FieldNotAllowed {
        /// The TLP kind.
        kind: Kind,
        /// The field name.
        field: &'static str,
        /// The value found.
        found: u32,
        /// The value the spec requires.
        required: u32,
    },
    /// An address not aligned as the kind requires (low 2 bits of any request address;
    /// AtomicOp operand alignment).
    #[error("{kind}: address {address:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// The TLP kind.
        kind: Kind,
        /// The address.
        address: u64,
        /// The required alignment.
        align: u64,
    },
    /// A value that does not fit its field (emit only).
    #[error("field {field} value {value:#x} does not fit (max {max:#x})")]
    FieldOverflow {
        /// The field name.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest encodable value.
        max: u64,
    },
    /// A completion with data whose status is not Successful Completion (PCIe 6.0 §2.2.9).
    #[error("completion with data has status {status}; only SC may carry data")]
    DataWithErrorStatus {
        /// The status name.
        status: &'static str,
    },
    /// A completion whose payload extends past the bytes its Byte Count and Lower Address leave.
    #[error(
        "completion payload of {length_dw} DW exceeds Byte Count {byte_count} at Lower Address {lower_address:#x}"
    )]
    CompletionTooLong {
        /// Payload length in DW.
        length_dw: u16,
        /// Byte Count field.
        byte_count: u16,
        /// Lower Address field.
        lower_address: u8,
    },
    /// The output buffer is too small (emit only).
    #[error("output buffer of {actual} bytes, {needed} needed")]
    BufferTooSmall {
        /// Bytes the TLP needs.
        needed: usize,
        /// Bytes available.
        actual: usize,
    },
}
