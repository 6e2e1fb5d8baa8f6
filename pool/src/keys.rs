//! The key layout (the crate's docs have the table).

/// Keys under one prefix.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix` (`/dxpu`).
    pub fn new(prefix: &str) -> Keys {
        Keys { prefix: prefix.to_string() }
    }

    /// `{prefix}/devices/`.
    pub fn devices(&self) -> String {
        format!("{}/devices/", self.prefix)
    }

    /// `{prefix}/devices/{box}/`.
    pub fn box_devices(&self, box_name: &str) -> String {
        format!("{}/devices/{box_name}/", self.prefix)
    }

    /// `{prefix}/devices/{box}/{device}`.
    pub fn device(&self, box_name: &str, device: &str) -> String {
        format!("{}/devices/{box_name}/{device}", self.prefix)
    }

    /// `{prefix}/boxes/`.
    pub fn boxes(&self) -> String {
        format!("{}/boxes/", self.prefix)
    }

    /// `{prefix}/boxes/{box}`: the box that holds the name, under the lease its devices'
    /// records live by.
    pub fn box_owner(&self, box_name: &str) -> String {
        format!("{}/boxes/{box_name}", self.prefix)
    }

    /// `{prefix}/claims/`.
    pub fn claims(&self) -> String {
        format!("{}/claims/", self.prefix)
    }

    /// `{prefix}/claims/{box}/`.
    pub fn box_claims(&self, box_name: &str) -> String {
        format!("{}/claims/{box_name}/", self.prefix)
    }

    /// `{prefix}/claims/{box}/{device}`.
    pub fn claim(&self, box_name: &str, device: &str) -> String {
        format!("{}/claims/{box_name}/{device}", self.prefix)
    }

    /// `{prefix}/drain/`.
    pub fn drains(&self) -> String {
        format!("{}/drain/", self.prefix)
    }

    /// `{prefix}/drain/{box}/`.
    pub fn box_drains(&self, box_name: &str) -> String {
        format!("{}/drain/{box_name}/", self.prefix)
    }

    /// `{prefix}/drain/{box}/{device}`.
    pub fn drain(&self, box_name: &str, device: &str) -> String {
        format!("{}/drain/{box_name}/{device}", self.prefix)
    }

    /// `{prefix}/revoked/{box}/{device}`: who revoked the device's last revoked claim.
    pub fn revocation(&self, box_name: &str, device: &str) -> String {
        format!("{}/revoked/{box_name}/{device}", self.prefix)
    }

    /// The box a key under `{prefix}/boxes/` names.
    pub fn box_of<'k>(&self, key: &'k [u8]) -> Option<&'k str> {
        let b = std::str::from_utf8(key).ok()?.strip_prefix(&self.boxes())?;
        (!b.is_empty() && !b.contains('/')).then_some(b)
    }

    /// The `(box, device)` a key under `under` (one of the prefixes above) names.
    pub fn split<'k>(&self, under: &str, key: &'k [u8]) -> Option<(&'k str, &'k str)> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(under)?;
        let (b, d) = rest.split_once('/')?;
        (!b.is_empty() && !d.is_empty() && !d.contains('/')).then_some((b, d))
    }
}

/// Whether `name` may be a box, device or host name: it becomes part of a key.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_back_into_box_and_device() {
        let k = Keys::new("/dxpu");
        assert_eq!(k.claim("box-a", "gpu0"), "/dxpu/claims/box-a/gpu0");
        assert_eq!(k.split(&k.claims(), k.claim("box-a", "gpu0").as_bytes()), Some(("box-a", "gpu0")));
        assert_eq!(k.split(&k.claims(), b"/dxpu/claims/box-a/"), None);
        assert_eq!(k.split(&k.claims(), b"/dxpu/claims/a/b/c"), None);
        assert_eq!(k.split(&k.devices(), b"/dxpu/claims/a/b"), None);
        assert!(valid_name("box-a.rack_3"));
        assert!(!valid_name("a/b") && !valid_name("") && !valid_name(&"x".repeat(65)));
    }
}
