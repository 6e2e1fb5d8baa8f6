//! The capabilities two vfio-user peers announce in VERSION (a JSON object in its version
//! data), parsed with each value checked and built.

/// Capabilities a peer announces in VERSION.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caps {
    /// File descriptors the sender can receive in one message (default 1).
    pub max_msg_fds: u32,
    /// Largest `count` of a data transfer message the sender accepts (default 1 MiB).
    pub max_data_xfer_size: u32,
    /// DMA windows that may be mapped at once (default 65535).
    pub max_dma_maps: u32,
    /// Page sizes for DMA maps, or'ed (default 4 KiB).
    pub pgsizes: u64,
    /// REGION_WRITE_MULTI supported.
    pub write_multiple: bool,
}

impl Default for Caps {
    fn default() -> Caps {
        Caps {
            max_msg_fds: 1,
            max_data_xfer_size: 1 << 20,
            max_dma_maps: 65535,
            pgsizes: 4096,
            write_multiple: false,
        }
    }
}

impl Caps {
    /// The version data JSON (NUL-terminated, as the spec asks).
    pub fn to_json(&self) -> Vec<u8> {
        let j = serde_json::json!({ "capabilities": {
            "max_msg_fds": self.max_msg_fds,
            "max_data_xfer_size": self.max_data_xfer_size,
            "max_dma_maps": self.max_dma_maps,
            "pgsizes": self.pgsizes,
            "write_multiple": self.write_multiple,
        }});
        let mut b = j.to_string().into_bytes();
        b.push(0);
        b
    }

    /// Reads the version data a peer sent (empty: every default).
    pub fn from_json(data: &[u8]) -> Result<Caps, CapsError> {
        let data = data.split(|b| *b == 0).next().unwrap_or(&[]);
        let mut caps = Caps::default();
        if data.iter().all(u8::is_ascii_whitespace) {
            return Ok(caps);
        }
        let v: serde_json::Value =
            serde_json::from_slice(data).map_err(|e| CapsError::NotJson(e.to_string()))?;
        let Some(c) = v.get("capabilities") else { return Ok(caps) };
        let obj = c.as_object().ok_or(CapsError::NotAnObject)?;
        let num = |k: &'static str, max: u64| -> Result<Option<u64>, CapsError> {
            match obj.get(k) {
                None => Ok(None),
                Some(x) => match x.as_u64() {
                    Some(n) if n <= max => Ok(Some(n)),
                    _ => Err(CapsError::NotANumber { key: k, value: x.to_string(), max }),
                },
            }
        };
        if let Some(n) = num("max_msg_fds", u32::MAX as u64)? {
            caps.max_msg_fds = n as u32;
        }
        if let Some(n) = num("max_data_xfer_size", u32::MAX as u64)? {
            caps.max_data_xfer_size = n as u32;
        }
        if let Some(n) = num("max_dma_maps", u32::MAX as u64)? {
            caps.max_dma_maps = n as u32;
        }
        if let Some(n) = num("pgsizes", u64::MAX)? {
            caps.pgsizes = n;
        }
        match obj.get("write_multiple") {
            None => {}
            Some(serde_json::Value::Bool(b)) => caps.write_multiple = *b,
            Some(x) => return Err(CapsError::NotABoolean { key: "write_multiple", value: x.to_string() }),
        }
        Ok(caps)
    }
}

/// Why a peer's VERSION capabilities are refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CapsError {
    /// The version data does not parse.
    #[error("version data is not JSON: {0}")]
    NotJson(String),
    /// `capabilities` is there but not an object.
    #[error("capabilities: not an object")]
    NotAnObject,
    /// A numeric capability out of its range.
    #[error("capabilities.{key}: {value} is not a number in 0..={max}")]
    NotANumber {
        /// The capability.
        key: &'static str,
        /// What the peer sent.
        value: String,
        /// The largest allowed.
        max: u64,
    },
    /// A boolean capability that is not one.
    #[error("capabilities.{key}: {value} is not a boolean")]
    NotABoolean {
        /// The capability.
        key: &'static str,
        /// What the peer sent.
        value: String,
    },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn caps_default_when_absent_and_parse_when_present() {
        assert_eq!(Caps::from_json(b"").unwrap(), Caps::default());
        assert_eq!(Caps::from_json(b"{}\0").unwrap(), Caps::default());
        let c = Caps::from_json(br#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":4096,"pgsizes":4096,"migration":{"pgsize":4096},"write_multiple":true}}"#).unwrap();
        assert_eq!((c.max_msg_fds, c.max_data_xfer_size, c.write_multiple), (16, 4096, true));
        assert!(Caps::from_json(b"{nope").is_err());
        assert!(Caps::from_json(br#"{"capabilities":{"max_msg_fds":-1}}"#).is_err());
        assert!(Caps::from_json(br#"{"capabilities":[]}"#).is_err());
        let ours = Caps { max_msg_fds: 64, ..Caps::default() };
        assert_eq!(Caps::from_json(&ours.to_json()).unwrap(), ours);
    }
}
