//! TLPs an [`crate::InPlace`] sink keeps from a receive buffer to handle after the poll that
//! received them — requests whose answer needs the session, which the sink cannot reach —
//! so that what follows them in the datagram can still be taken in place.
#![forbid(unsafe_code)]

/// Kept TLPs in arrival order, each with a label of the caller's (the session it came on,
/// say). Buffers are reused from one poll to the next: keeping a TLP allocates nothing once
/// as many as a poll keeps have been kept before.
#[derive(Debug, Default)]
pub struct Kept<L> {
    tlps: Vec<(L, Vec<u8>)>,
    len: usize,
}

impl<L: Copy + Default> Kept<L> {
    /// Nothing kept.
    pub fn new() -> Kept<L> {
        Kept { tlps: Vec::new(), len: 0 }
    }

    /// Keeps a copy of `tlp` (a header, or a short TLP: the copy is what the receive queue
    /// would have made).
    pub fn keep(&mut self, label: L, tlp: &[u8]) {
        if self.len == self.tlps.len() {
            self.tlps.push((L::default(), Vec::new()));
        }
        let (l, b) = &mut self.tlps[self.len];
        *l = label;
        b.clear();
        b.extend_from_slice(tlp);
        self.len += 1;
    }

    /// The kept TLPs, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (L, &[u8])> {
        self.tlps[..self.len].iter().map(|(l, b)| (*l, &b[..]))
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets the kept TLPs (their buffers stay for reuse).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_in_order_and_reuses_buffers() {
        let mut k = Kept::new();
        k.keep(1u32, &[1, 2, 3]);
        k.keep(2, &[4]);
        assert_eq!(k.iter().collect::<Vec<_>>(), vec![(1, &[1u8, 2, 3][..]), (2, &[4u8][..])]);
        let first = k.tlps[0].1.as_ptr();
        k.clear();
        assert!(k.is_empty() && k.iter().next().is_none());
        k.keep(3, &[5, 6]);
        assert_eq!(k.iter().collect::<Vec<_>>(), vec![(3, &[5u8, 6][..])]);
        assert_eq!(k.tlps[0].1.as_ptr(), first, "the buffer is reused");
    }
}
