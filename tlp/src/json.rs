//! The JSON form of a TLP (feature `json`): the object `dxpu tlp decode` prints (from hex
//! or from a capture) and `dxpu tlp encode` reads, documented key by key in docs/cli.md. Every
//! field the codec parses has a key; [`TlpJson::encode`] builds the same TLP back.

use crate::{
    Address, AddressType, AtomicOp, Attr, Bdf, Body, Completion, ConfigTarget, CplStatus, Kind, Message,
    MessageCode, MsgRouting, Prefix, PrefixKind, Prefixes, Request, Tag, TlpRepr,
};
use serde::{Deserialize, Serialize};

/// What was wrong with a TLP's JSON or hex: the key or input, the value, and what it must be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct JsonError(String);

/// A flag that reads as `0`/`1` or `false`/`true` and prints as `0`/`1`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(untagged)]
enum Bit {
    Int(u8),
    Bool(bool),
}

impl Bit {
    fn of(b: bool) -> Option<Bit> {
        Some(Bit::Int(b as u8))
    }
    fn get(v: Option<Bit>, key: &str) -> Result<bool, String> {
        match v {
            None | Some(Bit::Int(0)) | Some(Bit::Bool(false)) => Ok(false),
            Some(Bit::Int(1)) | Some(Bit::Bool(true)) => Ok(true),
            Some(Bit::Int(n)) => Err(format!("`{key}` must be 0 or 1, found {n}")),
        }
    }
}

/// A 16-bit ID (a Vendor ID): written as `"0x1af4"`, read from that or a number.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
enum Id16 {
    /// `"0x1af4"`, as decode writes it (or a decimal string).
    Text(String),
    /// A number, as older decodes wrote it.
    Int(u64),
}

impl Id16 {
    fn value(&self, key: &str) -> Result<u16, String> {
        let v = match self {
            Id16::Text(t) => parse_u64(t, key)?,
            Id16::Int(v) => *v,
        };
        u16::try_from(v).map_err(|_| format!("`{key}`: {v:#x} is wider than 16 bits"))
    }
}

/// A message code by name, by number, or as `{"name": …, "code": …}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
enum MessageJson {
    Full {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<u8>,
    },
    Code(u8),
    Name(String),
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(deny_unknown_fields)]
struct PrefixJson {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    raw: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pasid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    privileged: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    execute: Option<bool>,
}

/// One TLP as a JSON object. Optional keys are absent where the TLP has no such field.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct TlpJson {
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fmt: Option<u8>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    ty: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tc: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attr: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    th: Option<Bit>,
    /// DW0 bit 17 (LN in PCIe 3.x–5.0, reserved since 6.0): printed only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ln: Option<Bit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    td: Option<Bit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ep: Option<Bit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    length: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    requester_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tag: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    first_be: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_be: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ph: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    register: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    completer_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bcm: Option<Bit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    byte_count: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lower_address: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    routing: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message: Option<MessageJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vendor_id: Option<Id16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fields: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prefixes: Option<Vec<PrefixJson>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ecrc: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    non_conforming: Option<Vec<String>>,
}

/// Bytes as lowercase hex digits, as `decode` prints a TLP's `data`.
pub fn to_hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// Parses hex, ignoring a leading `0x`, whitespace, `_` and `:` between digit pairs (the
/// separators are dropped here; the `hex` crate decodes the digits).
pub fn from_hex(text: &str, what: &str) -> Result<Vec<u8>, JsonError> {
    hex_bytes(text, what).map_err(JsonError)
}

fn hex_bytes(text: &str, what: &str) -> Result<Vec<u8>, String> {
    let t = text.trim();
    let t = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    if let Some((i, c)) =
        t.char_indices().find(|(_, c)| !matches!(c, ' ' | '\t' | '_' | ':') && !c.is_ascii_hexdigit())
    {
        return Err(format!("{what}: invalid hex character {c:?} at offset {i}"));
    }
    let digits: String = t.chars().filter(char::is_ascii_hexdigit).collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!("{what}: odd number of hex digits ({})", digits.len()));
    }
    hex::decode(&digits).map_err(|e| format!("{what}: {e}"))
}

fn parse_u64(text: &str, key: &str) -> Result<u64, String> {
    let t = text.trim();
    let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(&h.replace('_', ""), 16),
        None => t.parse(),
    };
    r.map_err(|_| format!("`{key}`: {text:?} is not a number (decimal or 0x-hex, up to 64 bits)"))
}

fn bdf_of(text: &Option<String>, key: &str, kind: Kind) -> Result<Bdf, String> {
    match text {
        None => Err(format!("`{key}` is required for {kind}")),
        Some(t) => t.parse::<Bdf>().map_err(|e| format!("`{key}`: {e}")),
    }
}

fn address_text(a: u64) -> String {
    format!("{a:#018x}")
}

impl TlpJson {
    /// The JSON form of a parsed TLP.
    pub fn from_repr(r: &TlpRepr<'_>) -> TlpJson {
        let kind = r.kind();
        let (requester, tag) = r.requester_tag();
        let mut j = TlpJson {
            kind: kind.name().to_owned(),
            fmt: Some(r.fmt()),
            ty: Some(r.ty()),
            tc: Some(r.tc),
            attr: Some(r.attr.bits()),
            th: Bit::of(r.th),
            ln: r.ln.then_some(Bit::Int(1)),
            td: Bit::of(r.td),
            ep: Bit::of(r.ep),
            at: Some(r.at.bits()),
            length: r.length_dw(),
            requester_id: Some(requester.to_string()),
            tag: Some(tag.value()),
            ..TlpJson::default()
        };
        if let Some(req) = r.request() {
            j.first_be = Some(req.first_be);
            j.last_be = Some(req.last_be);
        }
        match r.body {
            Body::MemRead { address, ph, .. }
            | Body::MemWrite { address, ph, .. }
            | Body::Atomic { address, ph, .. } => {
                j.address = Some(address_text(address.value()));
                if r.th {
                    j.ph = Some(ph);
                }
            }
            Body::IoRead { address, .. } | Body::IoWrite { address, .. } => {
                j.address = Some(address_text(address as u64));
            }
            Body::CfgRead { cfg, .. } | Body::CfgWrite { cfg, .. } => {
                j.target = Some(cfg.target.to_string());
                j.register = Some(cfg.register);
            }
            Body::Completion { cpl, .. } => {
                j.completer_id = Some(cpl.completer.to_string());
                j.status = Some(cpl.status.name().to_owned());
                j.bcm = Bit::of(cpl.bcm);
                j.byte_count = Some(cpl.byte_count);
                j.lower_address = Some(cpl.lower_address);
            }
            Body::Message { msg, .. } => {
                j.routing = Some(msg.routing.name().to_owned());
                j.message = Some(MessageJson::Full {
                    name: Some(msg.code.name().to_owned()),
                    code: Some(msg.code.code()),
                });
                match msg.routing {
                    MsgRouting::ByAddress => j.address = Some(address_text(msg.address())),
                    MsgRouting::ById => j.target = Some(msg.target().to_string()),
                    _ => {}
                }
                if matches!(msg.code, MessageCode::VendorDefinedType0 | MessageCode::VendorDefinedType1) {
                    j.vendor_id = Some(Id16::Text(format!("{:#06x}", msg.vendor_id())));
                }
                j.fields = Some(format!("0x{}", to_hex(&msg.fields)));
            }
        }
        if !r.prefixes.is_empty() {
            j.prefixes = Some(
                r.prefixes
                    .iter()
                    .map(|p| {
                        let pasid = p.kind() == PrefixKind::Pasid;
                        PrefixJson {
                            kind: Some(p.name().to_owned()),
                            raw: format!("{:#010x}", p.raw()),
                            pasid: p.pasid_value(),
                            privileged: pasid.then(|| p.privileged()),
                            execute: pasid.then(|| p.execute()),
                        }
                    })
                    .collect(),
            );
        }
        if let Some(d) = r.data() {
            j.data = Some(to_hex(d));
        }
        if r.td {
            let mut buf = vec![0u8; r.buffer_len()];
            if r.emit(&mut buf).is_ok() {
                let d = &buf[buf.len() - 4..];
                j.ecrc = Some(format!("{:#010x}", u32::from_be_bytes([d[0], d[1], d[2], d[3]])));
            }
        }
        if let Some(n) = r.non_conformance() {
            j.non_conforming = Some(vec![n.describe().to_owned()]);
        }
        j
    }

    /// Builds the TLP's bytes, checking that redundant keys (fmt, type, length, ecrc) agree.
    pub fn encode(&self) -> Result<Vec<u8>, JsonError> {
        self.bytes().map_err(JsonError)
    }

    fn bytes(&self) -> Result<Vec<u8>, String> {
        let kind = Kind::from_name(&self.kind).ok_or_else(|| {
            format!(
                "`kind`: {:?} is not a TLP kind (one of {})",
                self.kind,
                Kind::ALL.map(Kind::name).join(" ")
            )
        })?;
        let data = match &self.data {
            Some(d) => Some(hex_bytes(d, "`data`")?),
            None => None,
        };
        if kind.has_data() != data.is_some() {
            return Err(if kind.has_data() {
                format!("`data` is required for {kind}")
            } else {
                format!("`data` given, but {kind} carries no payload")
            });
        }
        let data = data.unwrap_or_default();
        let requester = || bdf_of(&self.requester_id, "requester_id", kind);
        let tag = || {
            let t = self.tag.unwrap_or(0);
            Tag::new(t).ok_or_else(|| format!("`tag`: {t} exceeds 1023 (10-bit tags)"))
        };
        let req = || -> Result<Request, String> {
            Ok(Request {
                requester: requester()?,
                tag: tag()?,
                first_be: self.first_be.unwrap_or(0xf),
                last_be: self.last_be.unwrap_or(0),
            })
        };
        let address = || -> Result<Address, String> {
            let text = self.address.as_ref().ok_or_else(|| format!("`address` is required for {kind}"))?;
            let a = parse_u64(text, "address")?;
            Ok(if kind.is_4dw() {
                Address::Bits64(a)
            } else {
                let a = u32::try_from(a)
                    .map_err(|_| format!("`address` {text} does not fit the 32-bit address of {kind}"))?;
                Address::Bits32(a)
            })
        };
        let io_address = || -> Result<u32, String> {
            match address()? {
                Address::Bits32(a) => Ok(a),
                Address::Bits64(a) => Err(format!("`address` {a:#x} is not a 32-bit IO address")),
            }
        };
        let ph = self.ph.unwrap_or(0);
        let cfg = || -> Result<ConfigTarget, String> {
            Ok(ConfigTarget {
                type1: matches!(kind, Kind::CfgRd1 | Kind::CfgWr1),
                target: bdf_of(&self.target, "target", kind)?,
                register: self.register.ok_or_else(|| format!("`register` is required for {kind}"))?,
            })
        };
        let atomic = |op| -> Result<Body<'_>, String> {
            Ok(Body::Atomic { op, req: req()?, address: address()?, ph, data: &data })
        };
        let body = match kind {
            Kind::MRd32 | Kind::MRd64 | Kind::MRdLk32 | Kind::MRdLk64 => Body::MemRead {
                req: req()?,
                address: address()?,
                ph,
                length_dw: self.length.unwrap_or(1),
                locked: matches!(kind, Kind::MRdLk32 | Kind::MRdLk64),
            },
            Kind::MWr32 | Kind::MWr64 => Body::MemWrite { req: req()?, address: address()?, ph, data: &data },
            Kind::IORd => Body::IoRead { req: req()?, address: io_address()? },
            Kind::IOWr => Body::IoWrite { req: req()?, address: io_address()?, data: &data },
            Kind::CfgRd0 | Kind::CfgRd1 => Body::CfgRead { req: req()?, cfg: cfg()? },
            Kind::CfgWr0 | Kind::CfgWr1 => Body::CfgWrite { req: req()?, cfg: cfg()?, data: &data },
            Kind::FetchAdd32 | Kind::FetchAdd64 => atomic(AtomicOp::FetchAdd)?,
            Kind::Swap32 | Kind::Swap64 => atomic(AtomicOp::Swap)?,
            Kind::CAS32 | Kind::CAS64 => atomic(AtomicOp::Cas)?,
            Kind::Cpl | Kind::CplD | Kind::CplLk | Kind::CplDLk => {
                let status = self.status()?;
                Body::Completion {
                    cpl: Completion {
                        completer: bdf_of(&self.completer_id, "completer_id", kind)?,
                        status,
                        bcm: Bit::get(self.bcm, "bcm")?,
                        byte_count: self
                            .byte_count
                            .ok_or_else(|| format!("`byte_count` is required for {kind}"))?,
                        requester: requester()?,
                        tag: tag()?,
                        lower_address: self.lower_address.unwrap_or(0),
                    },
                    locked: matches!(kind, Kind::CplLk | Kind::CplDLk),
                    data: kind.has_data().then_some(&data[..]),
                }
            }
            Kind::Msg | Kind::MsgD => {
                Body::Message { msg: self.message(kind)?, data: kind.has_data().then_some(&data[..]) }
            }
        };
        let prefixes = self.prefixes()?;
        let (tc, attr, at) = self.header_fields()?;
        let repr = TlpRepr {
            prefixes,
            tc,
            attr: Attr::from_bits(attr),
            th: Bit::get(self.th, "th")?,
            ln: Bit::get(self.ln, "ln")?,
            td: Bit::get(self.td, "td")?,
            ep: Bit::get(self.ep, "ep")?,
            at: AddressType::from_bits(at),
            body,
        };
        let mut out = vec![0u8; repr.buffer_len()];
        repr.emit(&mut out).map_err(|e| e.to_string())?;
        self.check_given(kind, &repr, &out)?;
        Ok(out)
    }

    /// `prefixes`, each a prefix DW (Fmt 100b).
    fn prefixes(&self) -> Result<Prefixes, String> {
        let mut prefixes = Prefixes::EMPTY;
        for (i, p) in self.prefixes.iter().flatten().enumerate() {
            let raw = parse_u64(&p.raw, "prefixes[].raw")?;
            let prefix = u32::try_from(raw)
                .ok()
                .and_then(Prefix::from_raw)
                .ok_or_else(|| format!("`prefixes[{i}].raw` {} is not a prefix DW (Fmt 100b)", p.raw))?;
            prefixes.push(prefix).map_err(|e| format!("`prefixes[{i}]`: {e}"))?;
        }
        Ok(prefixes)
    }

    /// `tc`, `attr` and `at` (0 when not given), `attr` and `at` within their bits.
    fn header_fields(&self) -> Result<(u8, u8, u8), String> {
        let tc = self.tc.unwrap_or(0);
        let attr = self.attr.unwrap_or(0);
        if attr > 7 {
            return Err(format!("`attr` {attr} does not fit 3 bits (bit0 NS, bit1 RO, bit2 IDO)"));
        }
        let at = self.at.unwrap_or(0);
        if at > 3 {
            return Err(format!("`at` {at} does not fit 2 bits"));
        }
        Ok((tc, attr, at))
    }

    /// `status`, by name (SC when not given).
    fn status(&self) -> Result<CplStatus, String> {
        match &self.status {
            None => Ok(CplStatus::Success),
            Some(s) => CplStatus::from_name(s)
                .ok_or_else(|| format!("`status`: {s:?} is not one of SC UR CRS CA rsvd3 rsvd5 rsvd6 rsvd7")),
        }
    }

    /// The fields given that the TLP's own must match: `fmt`, `type`, `length`, `ecrc`
    /// (against `out`, the TLP's bytes).
    fn check_given(&self, kind: Kind, repr: &TlpRepr<'_>, out: &[u8]) -> Result<(), String> {
        for (key, given, actual) in [("fmt", self.fmt, repr.fmt()), ("type", self.ty, repr.ty())] {
            if let Some(g) = given
                && g != actual
            {
                return Err(format!("`{key}` {g} does not match {kind}, which has {key} {actual}"));
            }
        }
        if let (Some(given), Some(actual)) = (self.length, repr.length_dw())
            && given != actual
        {
            return Err(format!("`length` {given} does not match the {actual} DW the TLP carries"));
        }
        if let Some(e) = &self.ecrc {
            let given = parse_u64(e, "ecrc")?;
            let d = &out[out.len() - 4..];
            let actual = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as u64;
            if !repr.td || given != actual {
                return Err(format!("`ecrc` {e} does not match the computed digest {actual:#010x}"));
            }
        }
        Ok(())
    }

    fn message(&self, kind: Kind) -> Result<Message, String> {
        let routing = match &self.routing {
            None => return Err(format!("`routing` is required for {kind}")),
            Some(r) => MsgRouting::from_name(r).ok_or_else(|| {
                format!(
                    "`routing`: {r:?} is not one of to_rc address id broadcast local gathered rsvd6 rsvd7"
                )
            })?,
        };
        let code = match &self.message {
            None => return Err(format!("`message` is required for {kind}")),
            Some(MessageJson::Code(c)) | Some(MessageJson::Full { code: Some(c), .. }) => {
                MessageCode::from_code(*c)
            }
            Some(MessageJson::Name(n)) | Some(MessageJson::Full { name: Some(n), code: None }) => {
                MessageCode::from_name(n)
                    .ok_or_else(|| format!("`message`: {n:?} is not a known message name"))?
            }
            Some(MessageJson::Full { name: None, code: None }) => {
                return Err("`message` needs a `name` or a `code`".to_owned());
            }
        };
        let mut fields = [0u8; 8];
        if let Some(f) = &self.fields {
            let bytes = hex_bytes(f, "`fields`")?;
            fields = bytes
                .try_into()
                .map_err(|b: Vec<u8>| format!("`fields` must be 8 bytes, found {}", b.len()))?;
        } else {
            if let Some(a) = &self.address {
                fields = parse_u64(a, "address")?.to_be_bytes();
            }
            if let Some(t) = &self.target {
                let t: Bdf = t.parse().map_err(|e| format!("`target`: {e}"))?;
                fields[..2].copy_from_slice(&t.raw().to_be_bytes());
            }
            if let Some(v) = &self.vendor_id {
                let v = v.value("vendor_id")?;
                fields[2..4].copy_from_slice(&v.to_be_bytes());
            }
        }
        Ok(Message {
            routing,
            requester: bdf_of(&self.requester_id, "requester_id", kind)?,
            tag: Tag::from_bits(self.tag.unwrap_or(0)),
            code,
            fields,
        })
    }
}
