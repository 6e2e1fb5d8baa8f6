//! Transaction rules a bridge needs (PCIe 6.0 §2.2.5, §2.3.1.1, §2.6.1): byte enables for a
//! byte range, splitting a transfer at Max_Read_Request_Size / Max_Payload_Size and 4 KiB,
//! the completions that answer a read under the Read Completion Boundary, and the error
//! completion for a request that fails.

use crate::fields::{CplStatus, Kind};
use crate::ids::Bdf;
use crate::repr::{Body, Completion, TlpRepr};

/// A Max_Payload_Size or Max_Read_Request_Size: a power of two from 128 to 4096 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TransferSize(u16);

impl TransferSize {
    /// 128 bytes, the smallest.
    pub const B128: TransferSize = TransferSize(128);
    /// 256 bytes.
    pub const B256: TransferSize = TransferSize(256);
    /// 512 bytes.
    pub const B512: TransferSize = TransferSize(512);
    /// 4096 bytes, the largest.
    pub const B4096: TransferSize = TransferSize(4096);

    /// `bytes` if it is a power of two in 128..=4096.
    pub const fn from_bytes(bytes: u32) -> Option<TransferSize> {
        if bytes.is_power_of_two() && bytes >= 128 && bytes <= 4096 {
            Some(TransferSize(bytes as u16))
        } else {
            None
        }
    }
    /// From the 3-bit encoding of the Device Control register (000b = 128 .. 101b = 4096).
    pub const fn from_encoding(code: u8) -> Option<TransferSize> {
        if code <= 5 { Some(TransferSize(128 << code)) } else { None }
    }
    /// The 3-bit Device Control encoding.
    pub const fn encoding(self) -> u8 {
        (self.0 / 128).trailing_zeros() as u8
    }
    /// Size in bytes.
    pub const fn bytes(self) -> u32 {
        self.0 as u32
    }
}

/// Read Completion Boundary: 64 or 128 bytes (Link Control RCB bit).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Rcb {
    /// 64-byte RCB.
    B64,
    /// 128-byte RCB.
    B128,
}

impl Rcb {
    /// Size in bytes.
    pub const fn bytes(self) -> u64 {
        match self {
            Rcb::B64 => 64,
            Rcb::B128 => 128,
        }
    }
}

/// A request's DW-granular form: DW-aligned address, Length in DW, and byte enables.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DwSpan {
    /// DW-aligned address.
    pub address: u64,
    /// Length in DW.
    pub length_dw: u16,
    /// First DW BE.
    pub first_be: u8,
    /// Last DW BE (0 for a 1 DW request).
    pub last_be: u8,
}

impl DwSpan {
    /// The span that covers `len` bytes at `addr` (`len` at most 4096 and not crossing
    /// 4 KiB for a valid request). A zero-length access is Length 1 with both byte enables
    /// 0000b, the spec's zero-length read/write.
    pub fn for_bytes(addr: u64, len: u32) -> DwSpan {
        let address = addr & !3;
        if len == 0 {
            return DwSpan { address, length_dw: 1, first_be: 0, last_be: 0 };
        }
        let end = addr + len as u64; // exclusive
        let length_dw = ((end - address).div_ceil(4)) as u16;
        let first_be = (0xfu8 << (addr & 3)) & 0xf;
        let last_be = 0xfu8 >> ((4 - (end & 3)) & 3);
        if length_dw == 1 {
            DwSpan { address, length_dw, first_be: first_be & last_be, last_be: 0 }
        } else {
            DwSpan { address, length_dw, first_be, last_be }
        }
    }
}

/// The pieces of a transfer split so that none exceeds `max` bytes nor crosses a
/// `max`-aligned boundary (and so none crosses 4 KiB): `(address, bytes)` pairs.
#[derive(Clone, Debug)]
pub struct Split {
    addr: u64,
    end: u64,
    max: u64,
}

impl Iterator for Split {
    type Item = (u64, u32);

    fn next(&mut self) -> Option<(u64, u32)> {
        if self.addr >= self.end {
            return None;
        }
        let boundary = (self.addr / self.max + 1) * self.max;
        let stop = boundary.min(self.end);
        let piece = (self.addr, (stop - self.addr) as u32);
        self.addr = stop;
        Some(piece)
    }
}

/// Splits `len` bytes at `addr` into requests no larger than `max` (Max_Read_Request_Size
/// for reads, Max_Payload_Size for writes), each ending on a naturally aligned `max`
/// boundary, which also keeps every piece within one 4 KiB page (PCIe 6.0 §2.2.7).
pub fn split(addr: u64, len: u64, max: TransferSize) -> Split {
    Split { addr, end: addr.saturating_add(len), max: max.bytes() as u64 }
}

/// Whether this completion is the last of its request's (PCIe 6.0 §2.3.1.1): an error
/// status ends the request; otherwise the bytes it returns — its payload less the Lower
/// Address offset into the first DW — cover the Byte Count still owed. Only the last
/// completion may carry bytes past the end of the read (in its last DW).
pub fn completes_request(cpl: &Completion, data: Option<&[u8]>) -> bool {
    if cpl.status != CplStatus::Success {
        return true;
    }
    let pad = (cpl.lower_address & 3) as usize;
    data.is_none_or(|d| d.len() >= cpl.byte_count as usize + pad)
}

/// Stores a write's payload into `dst` (the bytes at its address), only the bytes its byte
/// enables select (PCIe 6.0 §2.2.5): First DW BE for the first DW, Last DW BE for the last
/// (a 1-DW write has only First DW BE), every byte of the DWs between. `dst` and `data` are
/// the same length; extra bytes of the longer one are ignored.
pub fn write_enabled_bytes(dst: &mut [u8], data: &[u8], first_be: u8, last_be: u8) {
    let n = data.len().min(dst.len());
    if first_be & 0xf == 0xf && (last_be & 0xf == 0xf || (n <= 4 && last_be == 0)) {
        dst[..n].copy_from_slice(&data[..n]);
        return;
    }
    for (i, (d, s)) in dst[..n].iter_mut().zip(data).enumerate() {
        let on = if i < 4 {
            first_be & (1 << i) != 0
        } else if n > 4 && i >= n - 4 {
            last_be & (1 << (i - (n - 4))) != 0
        } else {
            true
        };
        if on {
            *d = *s;
        }
    }
}

/// Bytes a read of `length_dw` DW with these byte enables returns (PCIe 6.0 §2.3.1.1,
/// Table 2-39): for 1 DW, first enabled byte through last enabled byte (1 for a zero-length
/// read); otherwise every byte from the first enabled in the first DW to the last enabled
/// in the last DW.
pub fn read_byte_count(length_dw: u16, first_be: u8, last_be: u8) -> u16 {
    if length_dw == 1 {
        if first_be & 0xf == 0 {
            return 1;
        }
        let lo = first_be.trailing_zeros() as u16;
        let hi = 7 - (first_be & 0xf).leading_zeros() as u16;
        return hi - lo + 1;
    }
    let first_skip = (first_be & 0xf).trailing_zeros().min(4) as u16;
    let last_skip = ((last_be & 0xf) << 4).leading_zeros().min(4) as u16;
    length_dw * 4 - first_skip - last_skip
}

/// One completion of a read, as [`read_completions`] plans it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CompletionChunk {
    /// Byte Count: bytes still owed, this completion's included.
    pub byte_count: u16,
    /// Lower Address: bits 6:0 of the first byte this completion returns.
    pub lower_address: u8,
    /// Offset in bytes of this completion's first DW from the request's DW-aligned address.
    pub data_offset: u32,
    /// Payload length in DW.
    pub length_dw: u16,
}

/// The completions answering a memory read, in order.
#[derive(Clone, Debug)]
pub struct ReadCompletions {
    request_addr: u64,
    cursor: u64,
    end: u64,
    first_byte: u64,
    end_byte: u64,
    rcb: u64,
    mps: u64,
}

impl Iterator for ReadCompletions {
    type Item = CompletionChunk;

    fn next(&mut self) -> Option<CompletionChunk> {
        if self.cursor >= self.end {
            return None;
        }
        let s = self.cursor;
        // Every completion but the last ends on a naturally aligned RCB boundary and
        // carries at most Max_Payload_Size (PCIe 6.0 §2.3.1.1).
        let e = if self.end - s <= self.mps {
            self.end
        } else {
            let cut = (s + self.mps) / self.rcb * self.rcb;
            if cut > s { cut } else { (s / self.rcb + 1) * self.rcb }
        };
        self.cursor = e;
        let from = s.max(self.first_byte);
        Some(CompletionChunk {
            byte_count: (self.end_byte - from) as u16,
            lower_address: (from & 0x7f) as u8,
            data_offset: (s - self.request_addr) as u32,
            length_dw: ((e - s) / 4) as u16,
        })
    }
}

/// Plans the completions for a memory read of `length_dw` DW at DW-aligned `address` with
/// the given byte enables, under Read Completion Boundary `rcb` and Max_Payload_Size `mps`.
pub fn read_completions(
    address: u64,
    length_dw: u16,
    first_be: u8,
    last_be: u8,
    rcb: Rcb,
    mps: TransferSize,
) -> ReadCompletions {
    let address = address & !3;
    let first_offset = if first_be & 0xf == 0 { 0 } else { (first_be & 0xf).trailing_zeros() as u64 };
    let first_byte = address + first_offset;
    let count = read_byte_count(length_dw, first_be, last_be) as u64;
    ReadCompletions {
        request_addr: address,
        cursor: address,
        end: address + length_dw as u64 * 4,
        first_byte,
        end_byte: first_byte + count,
        rcb: rcb.bytes(),
        mps: mps.bytes() as u64,
    }
}

/// A successful completion carrying `data` for one planned chunk of `request`'s read.
/// TC and Attr are copied from the request, as the spec requires of a completer.
pub fn completion_with_data<'a>(
    request: &TlpRepr<'_>,
    completer: Bdf,
    chunk: &CompletionChunk,
    data: &'a [u8],
) -> TlpRepr<'a> {
    let (requester, tag) = request.requester_tag();
    TlpRepr {
        prefixes: request.prefixes,
        tc: request.tc,
        attr: request.attr,
        th: false,
        ln: false,
        td: false,
        ep: false,
        at: Default::default(),
        body: Body::Completion {
            cpl: Completion {
                completer,
                status: CplStatus::Success,
                bcm: false,
                byte_count: chunk.byte_count,
                requester,
                tag,
                lower_address: chunk.lower_address,
            },
            locked: matches!(request.kind(), Kind::MRdLk32 | Kind::MRdLk64),
            data: Some(data),
        },
    }
}

/// Answers a memory read with `data` (its DWs, `length_dw × 4` bytes from the DW-aligned
/// address): the completions [`read_completions`] plans under `rcb` and `mps`, each handed to
/// `send` in order. Returns false, sending nothing, if `request` is not a memory read or
/// `data` is shorter than the request.
pub fn complete_read(
    request: &TlpRepr<'_>,
    completer: Bdf,
    data: &[u8],
    rcb: Rcb,
    mps: TransferSize,
    mut send: impl FnMut(&TlpRepr<'_>),
) -> bool {
    let Body::MemRead { req, address, length_dw, .. } = request.body else { return false };
    if data.len() < length_dw as usize * 4 {
        return false;
    }
    for chunk in read_completions(address.value(), length_dw, req.first_be, req.last_be, rcb, mps) {
        let s = chunk.data_offset as usize;
        send(&completion_with_data(request, completer, &chunk, &data[s..s + chunk.length_dw as usize * 4]));
    }
    true
}

/// The completion for a non-posted request that carries no data: a successful one for an
/// IO or configuration write, or an error (UR, CA, CRS) for any request. Byte Count and
/// Lower Address follow PCIe 6.0 §2.3.1.1: a read's full byte count and its first byte's
/// address; 4 and 0 otherwise.
pub fn completion_without_data(request: &TlpRepr<'_>, completer: Bdf, status: CplStatus) -> TlpRepr<'static> {
    let (requester, tag) = request.requester_tag();
    let (byte_count, lower_address) = match request.body {
        Body::MemRead { req, address, length_dw, .. } => {
            let off = if req.first_be == 0 { 0 } else { req.first_be.trailing_zeros() as u64 };
            (read_byte_count(length_dw, req.first_be, req.last_be), ((address.value() + off) & 0x7f) as u8)
        }
        _ => (4, 0),
    };
    TlpRepr {
        prefixes: request.prefixes,
        tc: request.tc,
        attr: request.attr,
        th: false,
        ln: false,
        td: false,
        ep: false,
        at: Default::default(),
        body: Body::Completion {
            cpl: Completion { completer, status, bcm: false, byte_count, requester, tag, lower_address },
            locked: matches!(request.kind(), Kind::MRdLk32 | Kind::MRdLk64),
            data: None,
        },
    }
}

#[cfg(test)]
mod write_enable_tests {
    use super::{completes_request, write_enabled_bytes};
    use crate::fields::CplStatus;
    use crate::ids::{Bdf, Tag};
    use crate::repr::Completion;

    #[test]
    fn the_last_completion_covers_the_byte_count() {
        let cpl = |byte_count, lower_address, status| Completion {
            completer: Bdf::new(1, 0, 0),
            status,
            bcm: false,
            byte_count,
            requester: Bdf::new(0, 0, 0),
            tag: Tag::from_bits(1),
            lower_address,
        };
        // A 130-byte read from ...0x3e under a 64-byte RCB: 2 bytes (1 DW), 64, 64.
        assert!(!completes_request(&cpl(130, 0x3e, CplStatus::Success), Some(&[0; 4])));
        assert!(!completes_request(&cpl(128, 0x40, CplStatus::Success), Some(&[0; 64])));
        assert!(completes_request(&cpl(64, 0x00, CplStatus::Success), Some(&[0; 64])));
        // One DW read of bytes 1..3: payload of 4, Byte Count 2, offset 1.
        assert!(completes_request(&cpl(2, 0x01, CplStatus::Success), Some(&[0; 4])));
        // A non-last completion whose length plus offset reaches the Byte Count is not last.
        assert!(!completes_request(&cpl(66, 0x3e, CplStatus::Success), Some(&[0; 64])));
        assert!(completes_request(&cpl(4, 0, CplStatus::UnsupportedRequest), None));
    }

    #[test]
    fn only_enabled_bytes_are_written() {
        let mut m = [0u8; 12];
        write_enabled_bytes(&mut m, &[1; 12], 0b1100, 0b0011);
        assert_eq!(m, [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]);
        let mut m = [0u8; 4];
        write_enabled_bytes(&mut m, &[7; 4], 0b0110, 0);
        assert_eq!(m, [0, 7, 7, 0]);
        let mut m = [0u8; 8];
        write_enabled_bytes(&mut m, &[9; 8], 0xf, 0xf);
        assert_eq!(m, [9; 8]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_size_encodings() {
        for code in 0..=5u8 {
            let s = TransferSize::from_encoding(code).unwrap();
            assert_eq!(s.bytes(), 128 << code);
            assert_eq!(s.encoding(), code);
        }
        assert_eq!(TransferSize::from_encoding(6), None);
        assert_eq!(TransferSize::from_bytes(192), None);
        assert_eq!(TransferSize::from_bytes(64), None);
    }

    #[test]
    fn byte_enables_for_ranges() {
        assert_eq!(
            DwSpan::for_bytes(0x1001, 2),
            DwSpan { address: 0x1000, length_dw: 1, first_be: 0b0110, last_be: 0 }
        );
        assert_eq!(
            DwSpan::for_bytes(0x1002, 4),
            DwSpan { address: 0x1000, length_dw: 2, first_be: 0b1100, last_be: 0b0011 }
        );
        assert_eq!(
            DwSpan::for_bytes(0x1000, 16),
            DwSpan { address: 0x1000, length_dw: 4, first_be: 0xf, last_be: 0xf }
        );
        assert_eq!(
            DwSpan::for_bytes(0x1003, 0),
            DwSpan { address: 0x1000, length_dw: 1, first_be: 0, last_be: 0 }
        );
    }

    #[test]
    fn split_respects_max_and_4k() {
        let pieces: Vec<_> = split(0x0ff0, 0x230, TransferSize::B256).collect();
        assert_eq!(pieces, vec![(0x0ff0, 0x10), (0x1000, 0x100), (0x1100, 0x100), (0x1200, 0x20)]);
        let total: u32 = split(0x12345, 100_000, TransferSize::B512).map(|(_, n)| n).sum();
        assert_eq!(total, 100_000);
        for (a, n) in split(0x12345, 100_000, TransferSize::B4096) {
            assert!(n <= 4096 && (a & 0xfff) + n as u64 <= 0x1000);
        }
        assert_eq!(split(5, 0, TransferSize::B128).count(), 0);
    }

    #[test]
    fn byte_count_table() {
        // PCIe 6.0 Table 2-39, Length = 1.
        for (be, bc) in [
            (0b1001, 4),
            (0b1011, 4),
            (0b1101, 4),
            (0b1111, 4),
            (0b0101, 3),
            (0b0111, 3),
            (0b1010, 3),
            (0b1110, 3),
            (0b0011, 2),
            (0b0110, 2),
            (0b1100, 2),
            (0b0001, 1),
            (0b0010, 1),
            (0b0100, 1),
            (0b1000, 1),
            (0b0000, 1),
        ] {
            assert_eq!(read_byte_count(1, be, 0), bc, "first_be={be:04b}");
        }
        // Length > 1: first DW xxx1/xx10/x100/1000 and last DW 1xxx/01xx/001x/0001.
        assert_eq!(read_byte_count(4, 0b1111, 0b1111), 16);
        assert_eq!(read_byte_count(4, 0b1110, 0b0111), 14);
        assert_eq!(read_byte_count(4, 0b1000, 0b0001), 10);
        assert_eq!(read_byte_count(2, 0b0101, 0b1010), 8);
    }

    #[test]
    fn completions_honour_rcb_and_mps() {
        // 512 bytes from 0x1020 with RCB 64 and MPS 128: the first completion ends at the
        // first RCB boundary that keeps it within MPS (0x1080), later ones are 128 bytes.
        let chunks: Vec<_> = read_completions(0x1020, 128, 0xf, 0xf, Rcb::B64, TransferSize::B128).collect();
        let sizes: Vec<u16> = chunks.iter().map(|c| c.length_dw * 4).collect();
        assert_eq!(sizes, vec![96, 128, 128, 128, 32]);
        assert_eq!(chunks[0].byte_count, 512);
        assert_eq!(chunks[0].lower_address, 0x20);
        assert_eq!(chunks[1].byte_count, 512 - 96);
        assert_eq!(chunks[1].lower_address, 0x00);
        assert_eq!(chunks[1].data_offset, 96);
        assert_eq!(chunks[4].byte_count, 32);
        // Byte enables trim the first and last DW: Lower Address points at the first byte.
        let c: Vec<_> = read_completions(0x2000, 4, 0b1100, 0b0011, Rcb::B128, TransferSize::B256).collect();
        assert_eq!(
            c,
            vec![CompletionChunk { byte_count: 12, lower_address: 2, data_offset: 0, length_dw: 4 }]
        );
        // 4096-byte read: Byte Count 4096 in the first completion.
        let c: Vec<_> = read_completions(0x3000, 1024, 0xf, 0xf, Rcb::B128, TransferSize::B4096).collect();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].byte_count, 4096);
    }

    #[test]
    fn completion_plans_cover_every_byte_once() {
        for addr in (0..0x200u64).step_by(4) {
            for length_dw in [1u16, 2, 3, 31, 32, 33, 64, 200] {
                if (addr & 0xfff) + length_dw as u64 * 4 > 0x1000 {
                    continue;
                }
                for (rcb, mps) in [(Rcb::B64, TransferSize::B128), (Rcb::B128, TransferSize::B256)] {
                    let mut next = 0u32;
                    let mut owed = read_byte_count(length_dw, 0xf, if length_dw > 1 { 0xf } else { 0 });
                    let chunks: Vec<_> = read_completions(addr, length_dw, 0xf, 0xf, rcb, mps).collect();
                    for (i, c) in chunks.iter().enumerate() {
                        assert_eq!(c.data_offset, next);
                        assert_eq!(c.byte_count, owed);
                        assert!(c.length_dw as u32 * 4 <= mps.bytes());
                        let end = addr + c.data_offset as u64 + c.length_dw as u64 * 4;
                        if i + 1 < chunks.len() {
                            assert_eq!(end % rcb.bytes(), 0, "non-final completion must end on RCB");
                        }
                        next += c.length_dw as u32 * 4;
                        owed -= c.length_dw * 4;
                    }
                    assert_eq!(next, length_dw as u32 * 4);
                }
            }
        }
    }
}
