//! TLP prefixes (PCIe 6.0 §2.2.10): one DW each, Fmt = 100b, before the header. Local
//! prefixes (Type[4] = 0) precede end-to-end ones (Type[4] = 1). Every prefix is kept
//! verbatim so that a bridge forwards it unchanged; known ones also decode.

use core::fmt;

use crate::error::Error;

/// The most prefixes a TLP may carry here: up to four end-to-end (the spec's limit) and
/// up to four local.
pub const MAX_PREFIXES: usize = 8;
/// The spec's limit on end-to-end prefixes in one TLP (PCIe 6.0 §2.2.10.2).
pub const MAX_END_TO_END_PREFIXES: usize = 4;

/// One TLP prefix, kept as its raw DW.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix(u32);

/// What a prefix is, by its Type field.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum PrefixKind {
    /// Local L0000b: MR-IOV.
    MrIov,
    /// Local L1110b: vendor-defined local prefix 0.
    VendorLocal0,
    /// Local L1111b: vendor-defined local prefix 1.
    VendorLocal1,
    /// End-to-end E0000b: Extended TPH (ST\[15:8\]).
    ExtendedTph,
    /// End-to-end E0001b: PASID.
    Pasid,
    /// End-to-end E1110b: vendor-defined end-to-end prefix 0.
    VendorEndToEnd0,
    /// End-to-end E1111b: vendor-defined end-to-end prefix 1.
    VendorEndToEnd1,
    /// Any other local (`false`) or end-to-end (`true`) type; carried unchanged.
    Unknown {
        /// Type\[4\]: end-to-end.
        end_to_end: bool,
        /// Type\[3:0\].
        subtype: u8,
    },
}

impl Prefix {
    /// The prefix whose DW is `raw`, or `None` if its Fmt is not 100b.
    pub const fn from_raw(raw: u32) -> Option<Prefix> {
        if raw >> 29 == 0b100 { Some(Prefix(raw)) } else { None }
    }
    /// A PASID prefix: 20-bit PASID, Privileged Mode Requested, Execute Requested.
    pub const fn pasid(pasid: u32, privileged: bool, execute: bool) -> Prefix {
        Prefix(
            (0b1001_0001 << 24) | ((privileged as u32) << 23) | ((execute as u32) << 22) | (pasid & 0xf_ffff),
        )
    }
    /// The raw DW.
    pub const fn raw(self) -> u32 {
        self.0
    }
    /// Type\[4\]: an end-to-end prefix (covered by ECRC, forwarded by switches).
    pub const fn is_end_to_end(self) -> bool {
        self.0 & (1 << 28) != 0
    }
    /// What kind of prefix this is.
    pub const fn kind(self) -> PrefixKind {
        let subtype = ((self.0 >> 24) & 0xf) as u8;
        match (self.is_end_to_end(), subtype) {
            (false, 0b0000) => PrefixKind::MrIov,
            (false, 0b1110) => PrefixKind::VendorLocal0,
            (false, 0b1111) => PrefixKind::VendorLocal1,
            (true, 0b0000) => PrefixKind::ExtendedTph,
            (true, 0b0001) => PrefixKind::Pasid,
            (true, 0b1110) => PrefixKind::VendorEndToEnd0,
            (true, 0b1111) => PrefixKind::VendorEndToEnd1,
            (end_to_end, subtype) => PrefixKind::Unknown { end_to_end, subtype },
        }
    }
    /// For a PASID prefix: the 20-bit PASID.
    pub const fn pasid_value(self) -> Option<u32> {
        match self.kind() {
            PrefixKind::Pasid => Some(self.0 & 0xf_ffff),
            _ => None,
        }
    }
    /// For a PASID prefix: Privileged Mode Requested.
    pub const fn privileged(self) -> bool {
        self.0 & (1 << 23) != 0
    }
    /// For a PASID prefix: Execute Requested.
    pub const fn execute(self) -> bool {
        self.0 & (1 << 22) != 0
    }
    /// The name `dxpu tlp decode` prints.
    pub fn name(self) -> &'static str {
        match self.kind() {
            PrefixKind::MrIov => "MR-IOV",
            PrefixKind::VendorLocal0 => "VendPrefixL0",
            PrefixKind::VendorLocal1 => "VendPrefixL1",
            PrefixKind::ExtendedTph => "ExtTPH",
            PrefixKind::Pasid => "PASID",
            PrefixKind::VendorEndToEnd0 => "VendPrefixE0",
            PrefixKind::VendorEndToEnd1 => "VendPrefixE1",
            PrefixKind::Unknown { end_to_end: false, .. } => "LocalUnknown",
            PrefixKind::Unknown { end_to_end: true, .. } => "EndToEndUnknown",
        }
    }
}

impl fmt::Debug for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Prefix({self})")
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            PrefixKind::Pasid => write!(
                f,
                "PASID={:#07x}{}{}",
                self.0 & 0xf_ffff,
                if self.privileged() { " PMR" } else { "" },
                if self.execute() { " ER" } else { "" }
            ),
            _ => write!(f, "{}[{:08x}]", self.name(), self.0),
        }
    }
}

/// The prefixes of one TLP, in wire order, without allocation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Prefixes {
    len: u8,
    items: [u32; MAX_PREFIXES],
}

impl Prefixes {
    /// No prefixes.
    pub const EMPTY: Prefixes = Prefixes { len: 0, items: [0; MAX_PREFIXES] };

    /// Builds a prefix list, checking the count limits and that local prefixes come first.
    pub fn from_slice(prefixes: &[Prefix]) -> Result<Prefixes, Error> {
        let mut out = Prefixes::EMPTY;
        for p in prefixes {
            out.push(*p)?;
        }
        Ok(out)
    }

    /// Appends a prefix in wire order.
    pub fn push(&mut self, p: Prefix) -> Result<(), Error> {
        let len = self.len as usize;
        if len == MAX_PREFIXES {
            return Err(Error::TooManyPrefixes { count: len + 1, max: MAX_PREFIXES });
        }
        if let Some(last) = self.iter().last()
            && last.is_end_to_end()
            && !p.is_end_to_end()
        {
            return Err(Error::LocalPrefixAfterEndToEnd { raw: p.raw() });
        }
        if p.is_end_to_end() {
            let e2e = self.iter().filter(|q| q.is_end_to_end()).count() + 1;
            if e2e > MAX_END_TO_END_PREFIXES {
                return Err(Error::TooManyPrefixes { count: e2e, max: MAX_END_TO_END_PREFIXES });
            }
        }
        self.items[len] = p.raw();
        self.len += 1;
        Ok(())
    }

    /// Number of prefixes.
    pub const fn len(&self) -> usize {
        self.len as usize
    }
    /// No prefixes.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The prefixes in wire order.
    pub fn iter(&self) -> impl Iterator<Item = Prefix> + '_ {
        self.items[..self.len as usize].iter().map(|&raw| Prefix(raw))
    }
    /// The PASID prefix, if any.
    pub fn pasid(&self) -> Option<Prefix> {
        self.iter().find(|p| p.kind() == PrefixKind::Pasid)
    }
    /// Bytes these prefixes take on the wire.
    pub const fn wire_len(&self) -> usize {
        self.len as usize * 4
    }
}

impl fmt::Debug for Prefixes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pasid_prefix_layout() {
        // PCIe 6.0 §6.20.2.1: byte 0 = 1001_0001b, byte 1 bit 7 PMR, bit 6 ER, PASID[19:0].
        let p = Prefix::pasid(0xabcde, true, false);
        assert_eq!(p.raw(), 0x918a_bcde);
        assert_eq!(p.kind(), PrefixKind::Pasid);
        assert_eq!(p.pasid_value(), Some(0xabcde));
        assert!(p.privileged() && !p.execute());
        assert_eq!(p.to_string(), "PASID=0xabcde PMR");
    }

    #[test]
    fn ordering_and_limits() {
        let local = Prefix::from_raw(0x8e00_0001).unwrap();
        let e2e = Prefix::pasid(1, false, false);
        assert!(Prefixes::from_slice(&[local, e2e]).is_ok());
        assert_eq!(
            Prefixes::from_slice(&[e2e, local]),
            Err(Error::LocalPrefixAfterEndToEnd { raw: local.raw() })
        );
        assert!(matches!(Prefixes::from_slice(&[e2e; 5]), Err(Error::TooManyPrefixes { count: 5, max: 4 })));
        assert_eq!(Prefix::from_raw(0x4000_0000), None);
    }
}
