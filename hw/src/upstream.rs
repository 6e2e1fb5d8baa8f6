//! The upstream port, as values: what a function sends towards the host — completions, its
//! DMA reads and writes, MSI-X writes — waits in its [`Outbox`], each a TLP's header and
//! where its payload lies, until the platform takes it ([`crate::Device::upstream`]), in the
//! order sent. A payload in the device's own memory (VRAM) is read when the platform takes
//! the TLP, not copied when the device sends it: the payload's one copy is the platform's,
//! into its frame. Should the device write that memory before the platform took it, the
//! payload is copied out first ([`Outbox::before_memory_write`]), so that what leaves is
//! what the memory held when the device sent it. Its own module, below `function`, `msix`
//! and the devices, which send through it.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use tlp::TlpRepr;

/// A device's own memory, where the payload of what it sends may lie.
pub trait Memory {
    /// The `len` bytes at `at` where they lie, if they lie in one place.
    fn slice(&self, at: u64, len: usize) -> Option<&[u8]>;
    /// The bytes at `at` into `out`.
    fn read(&self, at: u64, out: &mut [u8]);
}

/// No memory of its own: a device whose payloads are carried ([`Outbox::send`]).
pub struct NoMemory;

impl Memory for NoMemory {
    fn slice(&self, _at: u64, _len: usize) -> Option<&[u8]> {
        None
    }
    fn read(&self, _at: u64, out: &mut [u8]) {
        out.fill(0);
    }
}

/// Payloads carried in the TLP's own entry, at most: a register's value, an MSI-X message,
/// a fence.
const INLINE: usize = 8;

/// Where a queued TLP's payload lies.
#[derive(Default)]
enum Payload {
    /// In the header: none (a read, a completion without data), or the header's own.
    #[default]
    None,
    /// Carried, up to [`INLINE`] bytes.
    Inline { bytes: [u8; INLINE], len: u8 },
    /// Carried in a buffer of the outbox's, back among its spares once taken.
    Owned(Vec<u8>),
    /// `len` bytes of the device's memory at `at`, `lead` bytes into a payload of `dws`
    /// bytes (whole DWs; the bytes around them zero).
    Memory { at: u64, len: u32, lead: u8, dws: u32 },
}

/// What the device sent and the platform has not taken yet.
#[derive(Default)]
pub struct Outbox {
    queue: VecDeque<(TlpRepr<'static>, Payload)>,
    /// The carried payload of the TLP taken last, lent to the platform until the next take.
    taken: Payload,
    /// Buffers of carried payloads taken, for the next ones.
    spare: Vec<Vec<u8>>,
    /// A payload in memory assembled: it does not lie in one place, or is not whole DWs.
    assembled: Vec<u8>,
    /// How many queued payloads are in the device's memory: while none is, a write to that
    /// memory needs no look at the queue.
    in_memory: usize,
}

impl Outbox {
    /// Sends `tlp`, its payload carried (copied here: for payloads that do not lie in the
    /// device's memory, or are small).
    pub fn send(&mut self, tlp: &TlpRepr<'_>) {
        let data = tlp.data().unwrap_or(&[]);
        let payload = if data.is_empty() {
            Payload::None
        } else if data.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..data.len()].copy_from_slice(data);
            Payload::Inline { bytes, len: data.len() as u8 }
        } else {
            let mut b = self.spare.pop().unwrap_or_default();
            b.clear();
            b.extend_from_slice(data);
            Payload::Owned(b)
        };
        self.queue.push_back((tlp.with_data(&[]), payload));
    }

    /// Sends `header` (a memory write or a completion with data) with the `len` bytes of the
    /// device's memory at `at` as its payload, placed `lead` bytes into `dws` bytes of whole
    /// DWs: read when the platform takes it.
    pub fn send_from_memory(&mut self, header: &TlpRepr<'_>, at: u64, len: usize, lead: usize, dws: usize) {
        let payload = Payload::Memory { at, len: len as u32, lead: lead as u8, dws: dws as u32 };
        self.in_memory += 1;
        self.queue.push_back((header.with_data(&[]), payload));
    }

    /// The next TLP the device sent, its payload where it lies (in `memory`, the device's,
    /// for one sent from it), lent until the next call.
    #[inline]
    pub fn take<'a>(&'a mut self, memory: &'a dyn Memory) -> Option<TlpRepr<'a>> {
        if self.queue.is_empty() && matches!(self.taken, Payload::None) {
            return None;
        }
        if let Payload::Owned(b) = std::mem::replace(&mut self.taken, Payload::None) {
            self.spare.push(b);
        }
        let (header, payload) = self.queue.pop_front()?;
        let data: &'a [u8] = match payload {
            Payload::None => return Some(header),
            Payload::Memory { at, len, lead, dws } => {
                self.in_memory -= 1;
                let (len, lead, dws) = (len as usize, lead as usize, dws as usize);
                match memory.slice(at, len) {
                    Some(bytes) if lead == 0 && dws == len => bytes,
                    _ => {
                        self.assembled.clear();
                        self.assembled.resize(dws, 0);
                        memory.read(at, &mut self.assembled[lead..lead + len]);
                        &self.assembled
                    }
                }
            }
            carried => {
                self.taken = carried;
                match &self.taken {
                    Payload::Inline { bytes, len } => &bytes[..*len as usize],
                    Payload::Owned(b) => b,
                    _ => &[],
                }
            }
        };
        Some(header.with_data(data))
    }

    /// The device is about to write `len` bytes of its memory at `at`: payloads queued from
    /// there are copied out first (what leaves is what the memory held when sent).
    #[inline]
    pub fn before_memory_write(&mut self, at: u64, len: u64, memory: &dyn Memory) {
        if self.in_memory == 0 {
            return;
        }
        self.copy_out_overlapping(at, len, memory);
    }

    fn copy_out_overlapping(&mut self, at: u64, len: u64, memory: &dyn Memory) {
        let end = at.saturating_add(len);
        for (_, payload) in self.queue.iter_mut() {
            let Payload::Memory { at: p, len: n, lead, dws } = *payload else { continue };
            if p >= end || p.saturating_add(n as u64) <= at {
                continue;
            }
            let mut b = self.spare.pop().unwrap_or_default();
            b.clear();
            b.resize(dws as usize, 0);
            memory.read(p, &mut b[lead as usize..lead as usize + n as usize]);
            *payload = Payload::Owned(b);
            self.in_memory -= 1;
        }
    }

    /// Whether nothing waits to be taken.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// How many TLPs wait to be taken.
    pub fn len(&self) -> usize {
        self.queue.len()
    }
}

/// Everything `dev` has sent, taken and emitted as bytes, in order (tests, and a platform that
/// queues them).
pub fn take_all(dev: &mut dyn crate::Device) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(t) = dev.upstream() {
        let mut b = vec![0u8; t.buffer_len()];
        if let Ok(n) = t.emit(&mut b) {
            b.truncate(n);
            out.push(b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tlp::{Address, Bdf, Body, Request, Tag};

    struct Mem(Vec<u8>);
    impl Memory for Mem {
        fn slice(&self, at: u64, len: usize) -> Option<&[u8]> {
            // Pages of 16 bytes: a longer piece does not lie in one place.
            let at = at as usize;
            (at / 16 == (at + len - 1) / 16).then(|| &self.0[at..at + len])
        }
        fn read(&self, at: u64, out: &mut [u8]) {
            out.copy_from_slice(&self.0[at as usize..at as usize + out.len()]);
        }
    }

    fn write(address: u64, data: &[u8]) -> TlpRepr<'_> {
        let req = Request { requester: Bdf::new(1, 0, 0), tag: Tag::default(), first_be: 0xf, last_be: 0xf };
        TlpRepr::new(Body::MemWrite { req, address: Address::new(address), ph: 0, data })
    }

    fn payload(t: &TlpRepr<'_>) -> Vec<u8> {
        t.data().unwrap_or(&[]).to_vec()
    }

    #[test]
    fn payloads_leave_in_order_from_where_they_lie_and_memory_written_meanwhile_is_not_seen() {
        let mut mem = Mem((0..64).collect());
        let mut out = Outbox::default();
        out.send(&write(0x1000, &[1, 2, 3, 4]));
        out.send(&write(0x2000, &[9; 12]));
        out.send_from_memory(&write(0x3000, &[]), 0, 8, 0, 8);
        out.send_from_memory(&write(0x4000, &[]), 12, 8, 0, 8); // across a "page"
        out.send_from_memory(&write(0x5000, &[]), 33, 2, 1, 4); // not whole DWs
        out.send_from_memory(&write(0x6000, &[]), 40, 8, 0, 8);
        // The device writes what the third and the last lie in before they are taken.
        out.before_memory_write(4, 2, &mem);
        mem.0[4] = 0xee;
        out.before_memory_write(40, 1, &mem);
        mem.0[40] = 0xdd;
        assert_eq!(out.len(), 6);
        let expect: [&[u8]; 6] = [
            &[1, 2, 3, 4],
            &[9; 12],
            &[0, 1, 2, 3, 4, 5, 6, 7],
            &[12, 13, 14, 15, 16, 17, 18, 19],
            &[0, 33, 34, 0],
            &[40, 41, 42, 43, 44, 45, 46, 47],
        ];
        for (i, e) in expect.iter().enumerate() {
            let t = out.take(&mem).unwrap();
            assert_eq!(payload(&t), *e, "TLP {i}");
        }
        assert!(out.take(&mem).is_none());
        assert!(out.is_empty());
        // Carried buffers are kept for the next payloads.
        out.send(&write(0x7000, &[5; 16]));
        assert_eq!(out.spare.len(), 2, "the three carried buffers taken, less the one this payload took");
        assert_eq!(payload(&out.take(&NoMemory).unwrap()), [5; 16]);
    }
}
