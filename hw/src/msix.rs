//! MSI-X table and pending-bit array (PCIe 6.0 §6.1.4), after cloud-hypervisor's `msix.rs`.
//! Entries start masked. Only aligned 4- and 8-byte accesses reach the table or the PBA
//! (others read all-ones and write nothing). Signalling a vector that is masked — by its
//! entry, by Function Mask, or because MSI-X is disabled — sets its pending bit; unmasking
//! delivers it. Deliveries are returned as values, for the function to send as MWr TLPs.
#![forbid(unsafe_code)]

/// One table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixEntry {
    /// Message Address.
    pub address: u64,
    /// Message Data.
    pub data: u32,
    /// Vector Control bit 0.
    pub masked: bool,
}

impl Default for MsixEntry {
    fn default() -> Self {
        MsixEntry { address: 0, data: 0, masked: true }
    }
}

/// A message to send: the MWr of one interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixMessage {
    /// Vector number.
    pub vector: u16,
    /// Address to write.
    pub address: u64,
    /// Data to write (one DW).
    pub data: u32,
}

impl MsixMessage {
    /// Sends this interrupt upstream as the MWr of one DW that MSI-X is, from `requester`.
    pub fn send(&self, requester: tlp::Bdf, out: &mut crate::upstream::Outbox) {
        let data = self.data.to_le_bytes();
        out.send(&tlp::TlpRepr::new(tlp::Body::MemWrite {
            req: tlp::Request { requester, tag: tlp::Tag::default(), first_be: 0xf, last_be: 0 },
            address: tlp::Address::new(self.address),
            ph: 0,
            data: &data,
        }));
    }
}

/// The table, the PBA, and the capability's Enable and Function Mask as last written.
#[derive(Clone, Debug)]
pub struct MsixTable {
    entries: Vec<MsixEntry>,
    pending: Vec<u64>,
    enabled: bool,
    function_mask: bool,
}

impl MsixTable {
    /// A table of `vectors` masked entries.
    pub fn new(vectors: u16) -> MsixTable {
        let n = vectors.max(1) as usize;
        MsixTable {
            entries: vec![MsixEntry::default(); n],
            pending: vec![0; n.div_ceil(64)],
            enabled: false,
            function_mask: false,
        }
    }

    /// Number of vectors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// No vectors (never: at least one).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// An entry.
    pub fn entry(&self, vector: u16) -> Option<MsixEntry> {
        self.entries.get(vector as usize).copied()
    }
    /// Whether a vector's pending bit is set.
    pub fn is_pending(&self, vector: u16) -> bool {
        let v = vector as usize;
        v < self.entries.len() && self.pending[v / 64] & (1 << (v % 64)) != 0
    }

    fn deliverable(&self, v: usize) -> bool {
        self.enabled && !self.function_mask && !self.entries[v].masked
    }

    fn message(&self, v: usize) -> MsixMessage {
        let e = self.entries[v];
        MsixMessage { vector: v as u16, address: e.address, data: e.data }
    }

    /// Delivers every pending vector that is no longer masked, clearing its pending bit.
    fn flush_pending(&mut self, out: &mut Vec<MsixMessage>) {
        for v in 0..self.entries.len() {
            if self.pending[v / 64] & (1 << (v % 64)) != 0 && self.deliverable(v) {
                self.pending[v / 64] &= !(1 << (v % 64));
                out.push(self.message(v));
            }
        }
    }

    /// The device raises `vector`: a message now, or a pending bit.
    pub fn signal(&mut self, vector: u16) -> Option<MsixMessage> {
        let v = vector as usize;
        if v >= self.entries.len() {
            return None;
        }
        if self.deliverable(v) {
            Some(self.message(v))
        } else {
            self.pending[v / 64] |= 1 << (v % 64);
            None
        }
    }

    /// Sets a vector's pending bit without delivering (a function that may not issue
    /// requests keeps its message for later).
    pub fn set_pending(&mut self, vector: u16) {
        let v = vector as usize;
        if v < self.entries.len() {
            self.pending[v / 64] |= 1 << (v % 64);
        }
    }

    /// Message Control was written (Enable bit 15, Function Mask bit 14): pending vectors that
    /// became deliverable go out.
    pub fn set_control(&mut self, control: u16) -> Vec<MsixMessage> {
        self.enabled = control & 0x8000 != 0;
        self.function_mask = control & 0x4000 != 0;
        let mut out = Vec::new();
        self.flush_pending(&mut out);
        out
    }

    /// Reads the table at byte `offset` (`len` 4 or 8, aligned).
    pub fn read_table(&self, offset: u64, len: usize) -> u64 {
        if !matches!(len, 4 | 8) || !offset.is_multiple_of(len as u64) {
            return u64::MAX;
        }
        let v = (offset / 16) as usize;
        let Some(e) = self.entries.get(v) else { return u64::MAX };
        let dw = |i: u64| -> u64 {
            match i {
                0 => e.address & 0xffff_ffff,
                1 => e.address >> 32,
                2 => e.data as u64,
                _ => e.masked as u64,
            }
        };
        let i = (offset % 16) / 4;
        if len == 4 { dw(i) } else { dw(i) | dw(i + 1) << 32 }
    }

    /// Writes the table; returns pending vectors that an unmask made deliverable.
    pub fn write_table(&mut self, offset: u64, len: usize, value: u64) -> Vec<MsixMessage> {
        let mut out = Vec::new();
        if !matches!(len, 4 | 8) || !offset.is_multiple_of(len as u64) {
            return out;
        }
        let v = (offset / 16) as usize;
        if v >= self.entries.len() {
            return out;
        }
        let first = (offset % 16) / 4;
        let dws: &[(u64, u32)] = &[(first, value as u32), (first + 1, (value >> 32) as u32)];
        for &(i, d) in &dws[..len / 4] {
            let e = &mut self.entries[v];
            match i {
                0 => e.address = (e.address & !0xffff_ffff) | (d as u64 & !3),
                1 => e.address = (e.address & 0xffff_ffff) | (d as u64) << 32,
                2 => e.data = d,
                _ => e.masked = d & 1 != 0,
            }
        }
        self.flush_pending(&mut out);
        out
    }

    /// Reads the PBA at byte `offset` (`len` 4 or 8, aligned). Read-only.
    pub fn read_pba(&self, offset: u64, len: usize) -> u64 {
        if !matches!(len, 4 | 8) || !offset.is_multiple_of(len as u64) {
            return u64::MAX;
        }
        let Some(q) = self.pending.get((offset / 8) as usize) else { return u64::MAX };
        if len == 8 { *q } else { (q >> ((offset % 8) * 8)) & 0xffff_ffff }
    }

    /// Power-on state: every entry masked and zero, nothing pending, disabled.
    pub fn reset(&mut self) {
        *self = MsixTable::new(self.entries.len() as u16);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_vectors_pend_and_deliver_on_unmask() {
        let mut t = MsixTable::new(4);
        // Program vector 1 (entries start masked).
        t.write_table(16, 8, 0x0000_0000_fee0_1000);
        t.write_table(24, 4, 0x41);
        assert_eq!(t.read_table(28, 4), 1, "entries start masked");
        t.set_control(0x8000);
        assert_eq!(t.signal(1), None, "masked entry: pending");
        assert!(t.is_pending(1));
        assert_eq!(t.read_pba(0, 8), 0b10);
        // Unmask: the pending message goes out and the bit clears.
        let out = t.write_table(28, 4, 0);
        assert_eq!(out, vec![MsixMessage { vector: 1, address: 0xfee0_1000, data: 0x41 }]);
        assert!(!t.is_pending(1));
        assert_eq!(t.signal(1), Some(MsixMessage { vector: 1, address: 0xfee0_1000, data: 0x41 }));
        // Function Mask holds everything back; clearing it releases it.
        assert!(t.set_control(0xc000).is_empty());
        assert_eq!(t.signal(1), None);
        assert_eq!(t.set_control(0x8000).len(), 1);
        // Disabled: pending, not delivered.
        t.set_control(0);
        assert_eq!(t.signal(1), None);
        assert!(t.is_pending(1));
        // Only 4/8-byte aligned accesses.
        assert_eq!(t.read_table(1, 4), u64::MAX);
        assert_eq!(t.read_table(0, 2), u64::MAX);
        assert!(t.write_table(2, 4, 0).is_empty());
        assert_eq!(t.read_table(64, 4), u64::MAX, "beyond the table");
        assert_eq!(t.signal(9), None);
        t.reset();
        assert!(!t.is_pending(1) && t.entry(1).unwrap().masked);
    }
}
