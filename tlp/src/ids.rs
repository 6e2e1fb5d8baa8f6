//! Identifiers that appear in TLP headers: bus/device/function and tags.

use core::fmt;
use core::str::FromStr;

/// A PCI bus/device/function number, as carried in Requester ID, Completer ID and the
/// target of a configuration request (PCIe 6.0 §2.2.6.2). Packed as `bus[15:8] dev[7:3]
/// fn[2:0]`; `Display` prints the familiar `bb:dd.f`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Bdf(u16);

impl Bdf {
    /// Builds a BDF from its parts; `device` is taken modulo 32 and `function` modulo 8.
    pub const fn new(bus: u8, device: u8, function: u8) -> Self {
        Bdf(((bus as u16) << 8) | (((device & 0x1f) as u16) << 3) | ((function & 0x7) as u16))
    }
    /// The BDF whose 16-bit wire encoding is `raw`.
    pub const fn from_raw(raw: u16) -> Self {
        Bdf(raw)
    }
    /// The 16-bit wire encoding.
    pub const fn raw(self) -> u16 {
        self.0
    }
    /// Bus number.
    pub const fn bus(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// Device number, 0..=31.
    pub const fn device(self) -> u8 {
        ((self.0 >> 3) & 0x1f) as u8
    }
    /// Function number, 0..=7.
    pub const fn function(self) -> u8 {
        (self.0 & 0x7) as u8
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02x}:{:02x}.{}", self.bus(), self.device(), self.function())
    }
}

impl fmt::Debug for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bdf({self})")
    }
}

/// Why a `bb:dd.f` string is not a BDF.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid BDF {input:?}: {reason} (expected bb:dd.f in hex, device <= 1f, function <= 7)")]
pub struct ParseBdfError {
    input: String,
    reason: &'static str,
}

impl FromStr for Bdf {
    type Err = ParseBdfError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseBdfError { input: s.to_owned(), reason };
        let (bus, rest) = s.split_once(':').ok_or_else(|| err("missing ':'"))?;
        let (dev, func) = rest.split_once('.').ok_or_else(|| err("missing '.'"))?;
        let bus = u8::from_str_radix(bus, 16).map_err(|_| err("bus is not a hex byte"))?;
        let dev = u8::from_str_radix(dev, 16).map_err(|_| err("device is not hex"))?;
        let func = u8::from_str_radix(func, 16).map_err(|_| err("function is not hex"))?;
        if dev > 0x1f {
            return Err(err("device out of range"));
        }
        if func > 7 {
            return Err(err("function out of range"));
        }
        Ok(Bdf::new(bus, dev, func))
    }
}

/// A transaction tag. With 10-bit tags (PCIe 6.0 §2.2.6.2) the header carries T9 and T8 in
/// DW0 and T7..T0 in the tag byte; values above 1023 cannot be encoded.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Tag(u16);

impl Tag {
    /// The largest 10-bit tag.
    pub const MAX: u16 = 0x3ff;

    /// A tag, or `None` if `value` does not fit in 10 bits.
    pub const fn new(value: u16) -> Option<Self> {
        if value <= Self::MAX { Some(Tag(value)) } else { None }
    }
    /// A tag from its low 10 bits (higher bits are dropped).
    pub const fn from_bits(value: u16) -> Self {
        Tag(value & Self::MAX)
    }
    /// The tag's value, 0..=1023.
    pub const fn value(self) -> u16 {
        self.0
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#05x}", self.0)
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tag({:#05x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_parts_and_text() {
        let b = Bdf::new(0x3b, 0x1f, 7);
        assert_eq!(b.raw(), 0x3bff);
        assert_eq!(b.to_string(), "3b:1f.7");
        assert_eq!("3b:1f.7".parse::<Bdf>().unwrap(), b);
        assert_eq!(Bdf::from_raw(0x0108).to_string(), "01:01.0");
    }

    #[test]
    fn bdf_rejects_out_of_range() {
        assert!("00:20.0".parse::<Bdf>().is_err());
        assert!("00:00.8".parse::<Bdf>().is_err());
        assert!("100:00.0".parse::<Bdf>().is_err());
        assert!("0000.0".parse::<Bdf>().is_err());
        let e = "00:00".parse::<Bdf>().unwrap_err().to_string();
        assert!(e.contains("\"00:00\""), "{e}");
    }

    #[test]
    fn tag_range() {
        assert_eq!(Tag::new(1023).map(Tag::value), Some(1023));
        assert_eq!(Tag::new(1024), None);
        assert_eq!(Tag::from_bits(0x7ff).value(), 0x3ff);
        assert_eq!(Tag::from_bits(0x12).to_string(), "0x012");
    }
}
