//! The attach protocol: the few control messages a host endpoint and a GPU-box endpoint
//! exchange over a session, carried in it as PCIe Vendor_Defined Type 1 messages (MsgD,
//! routed "local, terminate at receiver", Vendor ID [`VENDOR_ID`]) so that the link carries
//! nothing but TLPs. A receiver that does not know the Vendor ID discards them silently, as
//! PCIe 6.0 §2.2.8.6 asks of Type 1 vendor messages.
//!
//! The payload is `op u8 ‖ fields`, zero-padded to whole DWs. Strings are `len u8 ‖ UTF-8`.
//!
//! | op | message | direction | fields |
//! |---|---|---|---|
//! | 1 | ATTACH | host → box | device name, then optionally `1 u8 ‖ fencing token u64` |
//! | 2 | ATTACHED | box → host | device name, box BDF u16, Max_Payload_Size u16, 6 × BAR, then optionally `1 u8 ‖ Vendor ID u16 ‖ Device ID u16 ‖ box name ‖ PCI address` |
//! | 3 | REFUSED | box → host | device name, reason |
//! | 4 | DETACH | host → box | device name |
//!
//! A BAR is `address u64 ‖ size u64 ‖ flags u8` (bit 0 memory, bit 1 64-bit, bit 2
//! prefetchable; size 0: no BAR), the address being where the box placed it.
//!
//! The fencing token is the etcd revision of the host's claim on the device (`docs/pool.md`):
//! a box serving a pool attaches only a host whose claim etcd holds with that revision. A
//! host outside a pool sends none; the byte after the name is then padding (0) or absent.
//!
//! ATTACHED's optional tail says what the device is and where it sits ([`Origin`]): its
//! Vendor and Device IDs, the box's name (its pool name, else its host name) and the device's
//! PCI address on the box in sysfs's form (`0000:41:00.0`), so that a host labels its metrics
//! as the box and dcgm-exporter do. A box
//! of an earlier version sends none (padding 0 or the end); a host of an earlier version
//! reads the BARs and ignores the rest.
#![forbid(unsafe_code)]

use tlp::{Bdf, Body, Message, MessageCode, MsgRouting, ParseConfig, Tag, TlpRepr};

/// The Vendor ID of dxpu's control messages. PCI-SIG has not assigned dxpu one; the value is
/// a reserved-looking ID unlikely to collide on a link that carries only dxpu's traffic.
pub const VENDOR_ID: u16 = 0xd15a;

/// Longest device name or reason carried.
pub const MAX_TEXT: usize = 255;

/// One BAR as the box placed it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BarInfo {
    /// Bus address on the box.
    pub address: u64,
    /// Size in bytes (0: not implemented; the upper half of a 64-bit BAR is 0 too).
    pub size: u64,
    /// Memory (not IO).
    pub memory: bool,
    /// 64-bit.
    pub is_64: bool,
    /// Prefetchable.
    pub prefetchable: bool,
}

/// What an attached device is and where it sits: its IDs, the box and its address there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The device's Vendor ID.
    pub vendor_id: u16,
    /// The device's Device ID.
    pub device_id: u16,
    /// The box's name (its pool name, else its host name).
    pub box_name: String,
    /// The device's PCI address on the box, sysfs's form (`0000:41:00.0`).
    pub pci_address: String,
}

/// A control message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// Asks for the device named.
    Attach {
        /// Device name as the box exports it.
        device: String,
        /// The claim's fencing token (its etcd revision), for a device taken from a pool.
        token: Option<u64>,
    },
    /// The device is this session's.
    Attached {
        /// Device name.
        device: String,
        /// The device's BDF on the box.
        box_id: Bdf,
        /// Max_Payload_Size the box's link carries for it, bytes.
        max_payload: u16,
        /// BARs 0..6 as the box placed them.
        bars: [BarInfo; 6],
        /// What the device is and where it sits (none from a box of an earlier version).
        origin: Option<Origin>,
    },
    /// The device is not this session's.
    Refused {
        /// Device name asked for.
        device: String,
        /// Why, for the operator.
        reason: String,
    },
    /// Gives the device back.
    Detach {
        /// Device name.
        device: String,
    },
}

/// Why bytes are not a control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// Not a TLP, or not a Vendor_Defined Type 1 MsgD with dxpu's Vendor ID.
    #[error("not a dxpu control message")]
    NotControl,
    /// The op byte is unknown.
    #[error("unknown control op {0}")]
    UnknownOp(u8),
    /// The payload ends early or a string is not UTF-8.
    #[error("control message truncated or malformed at byte {0}")]
    Malformed(usize),
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], ControlError> {
        let s = self.b.get(self.at..self.at + n).ok_or(ControlError::Malformed(self.at))?;
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, ControlError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ControlError> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u64(&mut self) -> Result<u64, ControlError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_be_bytes(a))
    }
    /// An optional tail's flag: 1 says it follows, padding (0) or the payload's end that it
    /// does not.
    fn optional(&mut self) -> Result<bool, ControlError> {
        match self.b.get(self.at) {
            Some(1) => {
                self.at += 1;
                Ok(true)
            }
            Some(0) | None => Ok(false),
            Some(_) => Err(ControlError::Malformed(self.at)),
        }
    }
    fn text(&mut self) -> Result<String, ControlError> {
        let at = self.at;
        let n = self.u8()? as usize;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| ControlError::Malformed(at))
    }
}

fn put_text(out: &mut Vec<u8>, s: &str) {
    // Cut at a character boundary so that what is sent stays UTF-8.
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.push(end as u8);
    out.extend_from_slice(&s.as_bytes()[..end]);
}

impl Control {
    fn payload(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(160);
        match self {
            Control::Attach { device, token } => {
                p.push(1);
                put_text(&mut p, device);
                if let Some(t) = token {
                    p.push(1);
                    p.extend_from_slice(&t.to_be_bytes());
                }
            }
            Control::Attached { device, box_id, max_payload, bars, origin } => {
                p.push(2);
                put_text(&mut p, device);
                p.extend_from_slice(&box_id.raw().to_be_bytes());
                p.extend_from_slice(&max_payload.to_be_bytes());
                for b in bars {
                    p.extend_from_slice(&b.address.to_be_bytes());
                    p.extend_from_slice(&b.size.to_be_bytes());
                    p.push(b.memory as u8 | (b.is_64 as u8) << 1 | (b.prefetchable as u8) << 2);
                }
                if let Some(o) = origin {
                    p.push(1);
                    p.extend_from_slice(&o.vendor_id.to_be_bytes());
                    p.extend_from_slice(&o.device_id.to_be_bytes());
                    put_text(&mut p, &o.box_name);
                    put_text(&mut p, &o.pci_address);
                }
            }
            Control::Refused { device, reason } => {
                p.push(3);
                put_text(&mut p, device);
                put_text(&mut p, reason);
            }
            Control::Detach { device } => {
                p.push(4);
                put_text(&mut p, device);
            }
        }
        p.resize(p.len().div_ceil(4) * 4, 0);
        p
    }

    /// The message as TLP bytes, from `requester`.
    pub fn to_tlp(&self, requester: Bdf) -> Vec<u8> {
        let payload = self.payload();
        let mut fields = [0u8; 8];
        fields[2..4].copy_from_slice(&VENDOR_ID.to_be_bytes());
        let msg = Message {
            routing: MsgRouting::Local,
            requester,
            tag: Tag::from_bits(0),
            code: MessageCode::VendorDefinedType1,
            fields,
        };
        let t = TlpRepr::new(Body::Message { msg, data: Some(&payload) });
        let mut out = vec![0u8; t.buffer_len()];
        match t.emit(&mut out) {
            Ok(n) => out.truncate(n),
            // A Msg of at most ~900 bytes (three texts of 255) always fits its own buffer_len.
            Err(_) => out.clear(),
        }
        out
    }

    /// Reads a control message out of a parsed TLP.
    pub fn from_repr(t: &TlpRepr<'_>) -> Result<Control, ControlError> {
        let Body::Message { msg, data: Some(data) } = t.body else { return Err(ControlError::NotControl) };
        if msg.code != MessageCode::VendorDefinedType1 || msg.vendor_id() != VENDOR_ID {
            return Err(ControlError::NotControl);
        }
        let mut r = Reader { b: data, at: 0 };
        match r.u8()? {
            1 => {
                let device = r.text()?;
                let token = if r.optional()? { Some(r.u64()?) } else { None };
                Ok(Control::Attach { device, token })
            }
            2 => {
                let device = r.text()?;
                let box_id = Bdf::from_raw(r.u16()?);
                let max_payload = r.u16()?;
                let mut bars = [BarInfo::default(); 6];
                for b in &mut bars {
                    let (address, size, f) = (r.u64()?, r.u64()?, r.u8()?);
                    *b = BarInfo {
                        address,
                        size,
                        memory: f & 1 != 0,
                        is_64: f & 2 != 0,
                        prefetchable: f & 4 != 0,
                    };
                }
                let origin = if r.optional()? {
                    Some(Origin {
                        vendor_id: r.u16()?,
                        device_id: r.u16()?,
                        box_name: r.text()?,
                        pci_address: r.text()?,
                    })
                } else {
                    None
                };
                Ok(Control::Attached { device, box_id, max_payload, bars, origin })
            }
            3 => Ok(Control::Refused { device: r.text()?, reason: r.text()? }),
            4 => Ok(Control::Detach { device: r.text()? }),
            op => Err(ControlError::UnknownOp(op)),
        }
    }

    /// Reads a control message out of TLP bytes.
    pub fn from_tlp(bytes: &[u8]) -> Result<Control, ControlError> {
        let t = TlpRepr::parse_bytes(bytes, &ParseConfig::default()).map_err(|_| ControlError::NotControl)?;
        Control::from_repr(&t)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_message_round_trips_through_a_tlp() {
        let mut bars = [BarInfo::default(); 6];
        bars[0] =
            BarInfo { address: 0xfe00_0000, size: 0x1_0000, memory: true, is_64: true, prefetchable: false };
        bars[2] =
            BarInfo { address: 0x40_0000_0000, size: 1 << 28, memory: true, is_64: true, prefetchable: true };
        let msgs = [
            Control::Attach { device: "gpu0".into(), token: None },
            Control::Attach { device: "gpu0".into(), token: Some(0x0123_4567_89ab_cdef) },
            Control::Attach { device: "gpu".into(), token: Some(u64::MAX) },
            Control::Attach { device: "gpu".into(), token: None },
            Control::Attached {
                device: "gpu0".into(),
                box_id: Bdf::new(3, 0, 0),
                max_payload: 256,
                bars,
                origin: None,
            },
            Control::Attached {
                device: "gpu0".into(),
                box_id: Bdf::new(0x41, 0, 0),
                max_payload: 4096,
                bars,
                origin: Some(Origin {
                    vendor_id: 0x10de,
                    device_id: 0x2330,
                    box_name: "box-a".into(),
                    pci_address: "0000:41:00.0".into(),
                }),
            },
            Control::Refused { device: "gpu0".into(), reason: "attached to host-a".into() },
            Control::Detach { device: "gpu0".into() },
        ];
        for m in msgs {
            let b = m.to_tlp(Bdf::new(0, 0, 0));
            assert_eq!(b.len() % 4, 0);
            assert_eq!(Control::from_tlp(&b), Ok(m));
        }
    }

    #[test]
    fn other_tlps_and_damaged_payloads_are_refused_without_panic() {
        let b = Control::Attach { device: "x".repeat(300), token: None }.to_tlp(Bdf::new(0, 0, 0));
        // Cut at 255 bytes.
        assert_eq!(Control::from_tlp(&b), Ok(Control::Attach { device: "x".repeat(255), token: None }));
        // A token cut short, or a flag byte that is neither padding nor a token.
        let mut short = Control::Attach { device: "g".into(), token: Some(7) }.to_tlp(Bdf::new(0, 0, 0));
        let len = short.len();
        short.truncate(len - 4);
        short[3] -= 1; // one DW less in the header's Length
        assert!(matches!(
            Control::from_tlp(&short),
            Err(ControlError::Malformed(_) | ControlError::NotControl)
        ));
        let mut flag = Control::Attach { device: "g".into(), token: Some(7) }.to_tlp(Bdf::new(0, 0, 0));
        flag[16 + 3] = 2;
        assert!(matches!(Control::from_tlp(&flag), Err(ControlError::Malformed(3))));
        let mut other = Control::Detach { device: "g".into() }.to_tlp(Bdf::new(0, 0, 0));
        other[10] ^= 0xff; // Vendor ID
        assert_eq!(Control::from_tlp(&other), Err(ControlError::NotControl));
        let mut bad = Control::Detach { device: "g".into() }.to_tlp(Bdf::new(0, 0, 0));
        bad[16] = 9;
        assert_eq!(Control::from_tlp(&bad), Err(ControlError::UnknownOp(9)));
        let mut cut = Control::Attached {
            device: "gpu".into(),
            box_id: Bdf::new(1, 0, 0),
            max_payload: 128,
            bars: [BarInfo::default(); 6],
            origin: None,
        }
        .to_tlp(Bdf::new(0, 0, 0));
        cut[17] = 200; // the name's length runs past the payload
        assert!(matches!(Control::from_tlp(&cut), Err(ControlError::Malformed(_))));
        assert_eq!(Control::from_tlp(&[0x40, 0, 0]), Err(ControlError::NotControl));
        // An origin cut after its flag, or a flag that is neither padding nor an origin.
        let placed = Control::Attached {
            device: "gpu".into(),
            box_id: Bdf::new(1, 0, 0),
            max_payload: 128,
            bars: [BarInfo::default(); 6],
            origin: Some(Origin {
                vendor_id: 0x1ae0,
                device_id: 1,
                box_name: "b".repeat(300),
                pci_address: "0000:01:00.0".into(),
            }),
        };
        let whole = placed.to_tlp(Bdf::new(0, 0, 0));
        assert!(matches!(
            Control::from_tlp(&whole),
            Ok(Control::Attached { origin: Some(Origin { box_name, .. }), .. }) if box_name.len() == 255
        ));
        // The tail starts after op, name (1 + 3), BDF, MPS and six BARs of 17 bytes.
        let tail = 16 + 1 + 4 + 2 + 2 + 6 * 17;
        let mut cut = whole.clone();
        cut[tail + 5] = 255; // the box name's length (after the IDs) runs past what is left
        let header_dws = 4;
        let keep = (tail + 8).div_ceil(4) * 4;
        cut.truncate(keep);
        cut[3] = ((keep / 4) - header_dws) as u8;
        cut[2] = 0;
        assert!(matches!(Control::from_tlp(&cut), Err(ControlError::Malformed(_))));
        let mut flag = whole;
        flag[tail] = 7;
        assert!(matches!(Control::from_tlp(&flag), Err(ControlError::Malformed(_))));
        let multibyte = "é".repeat(200);
        let b = Control::Attach { device: multibyte, token: None }.to_tlp(Bdf::new(0, 0, 0));
        assert!(matches!(Control::from_tlp(&b), Ok(Control::Attach { device, .. }) if device.len() <= 255));
    }
}
