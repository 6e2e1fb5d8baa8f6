//! Flow-control credits as a session keeps them (after PCIe 6.0 §2.6.1): per class — posted,
//! non-posted, completion — a header count (one per TLP) and a data count (one per 16 bytes
//! of payload), cumulative and wrapping like the spec's CREDIT_LIMIT, CREDITS_CONSUMED and
//! CREDITS_ALLOCATED counters, so that a comparison is a wrapping difference and a limit never
//! has to be reset.
//!
//! [`TxCredits`] is the sending side's view (the peer's limits against what this side
//! consumed), [`RxCredits`] the receiving side's (what this side allocated and advertised
//! against what the peer used).
#![forbid(unsafe_code)]

use tlp::FcClass;

use crate::config::CreditGrant;
use crate::wire::FcLimits;

/// Per-class arrays (queues, counts) are indexed in this order.
pub(crate) const CLASSES: [FcClass; 3] = [FcClass::Posted, FcClass::NonPosted, FcClass::Completion];

/// `class`'s index into per-class arrays.
pub(crate) const fn index(class: FcClass) -> usize {
    match class {
        FcClass::Posted => 0,
        FcClass::NonPosted => 1,
        FcClass::Completion => 2,
    }
}

/// A header and a data count.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) struct Counts {
    pub(crate) header: u32,
    pub(crate) data: u32,
}

impl Counts {
    /// `self - other`, each wrapping, as a signed difference.
    fn minus(self, other: Counts) -> (i32, i32) {
        (self.header.wrapping_sub(other.header) as i32, self.data.wrapping_sub(other.data) as i32)
    }
    fn plus(self, header: u32, data: u32) -> Counts {
        Counts { header: self.header.wrapping_add(header), data: self.data.wrapping_add(data) }
    }
}

/// One [`Counts`] per class, indexed by [`index`].
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) struct CreditTable([Counts; 3]);

impl CreditTable {
    pub(crate) fn of_grant(g: CreditGrant) -> CreditTable {
        let c = |(header, data): (u32, u32)| Counts { header, data };
        CreditTable([c(g.posted), c(g.non_posted), c(g.completion)])
    }
    fn of_limits(l: FcLimits) -> CreditTable {
        let c = |(header, data): (u32, u32)| Counts { header, data };
        CreditTable([c(l.posted), c(l.non_posted), c(l.completion)])
    }
    fn limits(&self) -> FcLimits {
        let p = |c: Counts| (c.header, c.data);
        FcLimits { posted: p(self.0[0]), non_posted: p(self.0[1]), completion: p(self.0[2]) }
    }
    /// `class`'s counts.
    pub(crate) fn get(&self, class: usize) -> Counts {
        self.0[class]
    }
    fn add(&mut self, class: usize, header: u32, data: u32) {
        self.0[class] = self.0[class].plus(header, data);
    }
}

/// The sending side: the peer's cumulative limits, what this side consumed of them, and the
/// peer's first grant (its first FC block).
#[derive(Clone, Debug, Default)]
pub(crate) struct TxCredits {
    limit: CreditTable,
    consumed: CreditTable,
    grant: CreditTable,
}

impl TxCredits {
    /// Whether the peer's limits cover `header` and `data` more of `class` now.
    pub(crate) fn covers(&self, class: usize, header: u32, data: u32) -> bool {
        let (h, d) = self.limit.get(class).minus(self.consumed.get(class));
        h >= header as i32 && d >= data as i32
    }

    pub(crate) fn charge(&mut self, class: usize, header: u32, data: u32) {
        self.consumed.add(class, header, data);
    }

    /// The peer's FC block. Limits start at zero, so the first block is the grant; a limit
    /// only grows, and an older frame's smaller one is ignored.
    pub(crate) fn update(&mut self, limits: FcLimits) {
        let new = CreditTable::of_limits(limits);
        if self.grant == CreditTable::default() {
            self.grant = new;
        }
        for (l, n) in self.limit.0.iter_mut().zip(new.0) {
            if n.header.wrapping_sub(l.header) as i32 > 0 {
                l.header = n.header;
            }
            if n.data.wrapping_sub(l.data) as i32 > 0 {
                l.data = n.data;
            }
        }
    }

    /// What a chunk of held-back TLPs of `class` asks at most: a quarter of the peer's grant,
    /// and one TLP of `data` data credits at least — so that it can go as soon as that much
    /// has come back.
    pub(crate) fn chunk_cap(&self, class: usize, data: u32) -> (u32, u32) {
        let g = self.grant.get(class);
        ((g.header / 4).max(1), (g.data / 4).max(data))
    }

    /// The peer's first grant.
    #[cfg(test)]
    pub(crate) fn grant(&self) -> &CreditTable {
        &self.grant
    }

    /// Credits the peer granted that this side has not used, in the public order.
    pub(crate) fn available(&self) -> [i64; 6] {
        let mut out = [0i64; 6];
        for class in 0..3 {
            let (h, d) = self.limit.get(class).minus(self.consumed.get(class));
            out[2 * class] = h as i64;
            out[2 * class + 1] = d as i64;
        }
        out
    }
}

/// The receiving side: what this side allocated to the peer (its cumulative limits), what it
/// last advertised, what the peer used of it, and the configured grant.
#[derive(Clone, Debug)]
pub(crate) struct RxCredits {
    allocated: CreditTable,
    advertised: CreditTable,
    used: CreditTable,
    grant: CreditTable,
}

impl RxCredits {
    /// Allocated: the grant, not yet advertised.
    pub(crate) fn new(grant: CreditGrant) -> RxCredits {
        let grant = CreditTable::of_grant(grant);
        RxCredits {
            allocated: grant,
            advertised: CreditTable::default(),
            used: CreditTable::default(),
            grant,
        }
    }

    /// A TLP of `class` costing `header` and `data` arrived: charged, or `false` if the peer
    /// sent it beyond what this side allocated (a protocol violation; nothing is charged).
    pub(crate) fn take(&mut self, class: usize, header: u32, data: u32) -> bool {
        let used = self.used.get(class).plus(header, data);
        let (h, d) = used.minus(self.allocated.get(class));
        if h > 0 || d > 0 {
            return false;
        }
        self.used.0[class] = used;
        true
    }

    /// The application took a TLP: its credits are free again.
    pub(crate) fn release(&mut self, class: usize, header: u32, data: u32) {
        self.allocated.add(class, header, data);
    }

    /// Credits came back since the last advertisement.
    pub(crate) fn changed(&self) -> bool {
        self.allocated != self.advertised
    }

    /// A quarter of some grant came back since the last advertisement: a sender may be
    /// waiting for it, so it should go at once (smaller returns can wait, as PCIe batches
    /// UpdateFC DLLPs).
    pub(crate) fn urgent(&self) -> bool {
        (0..3).any(|class| {
            let (g, (h, d)) =
                (self.grant.get(class), self.allocated.get(class).minus(self.advertised.get(class)));
            h as u32 >= g.header.div_ceil(4) || d as u32 >= g.data.div_ceil(4)
        })
    }

    /// The limits to advertise now (they count as advertised from here).
    pub(crate) fn advertise(&mut self) -> FcLimits {
        self.advertised = self.allocated;
        self.allocated.limits()
    }

    /// Credits this side granted that the peer has in use (delivered, not yet drained), in
    /// the public order.
    pub(crate) fn in_use(&self) -> [u32; 6] {
        let mut out = [0u32; 6];
        for class in 0..3 {
            // Used minus what was handed back: used − (allocated − grant).
            let (u, a, g) = (self.used.get(class), self.allocated.get(class), self.grant.get(class));
            out[2 * class] = u.header.wrapping_sub(a.header.wrapping_sub(g.header));
            out[2 * class + 1] = u.data.wrapping_sub(a.data.wrapping_sub(g.data));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> CreditGrant {
        CreditGrant { posted: (8, 256), non_posted: (4, 256), completion: (8, 512) }
    }

    #[test]
    fn a_sender_spends_what_the_peer_grants_and_no_more() {
        let mut tx = TxCredits::default();
        assert!(!tx.covers(0, 1, 0), "nothing before the first FC block");
        let mut rx = RxCredits::new(grant());
        tx.update(rx.advertise());
        assert!(tx.covers(1, 4, 256) && !tx.covers(1, 5, 0) && !tx.covers(1, 1, 257));
        tx.charge(1, 4, 16);
        assert!(!tx.covers(1, 1, 0));
        assert_eq!(tx.available()[2..4], [0, 240]);
        assert_eq!(tx.chunk_cap(2, 1), (2, 128));
        assert_eq!(tx.chunk_cap(1, 100), (1, 100), "one TLP at least");
        // An older, smaller block changes nothing; a larger one returns credits.
        let old = rx.advertise();
        rx.release(1, 2, 16);
        tx.update(rx.advertise());
        tx.update(old);
        assert!(tx.covers(1, 2, 0) && !tx.covers(1, 3, 0));
    }

    #[test]
    fn a_receiver_refuses_what_it_did_not_allocate_and_says_when_to_advertise() {
        let mut rx = RxCredits::new(grant());
        assert!(rx.changed() && rx.urgent(), "the grant itself is due at once");
        rx.advertise();
        assert!(!rx.changed());
        for _ in 0..8 {
            assert!(rx.take(0, 1, 2));
        }
        assert!(!rx.take(0, 1, 0), "a ninth posted TLP is beyond the grant");
        assert_eq!(rx.in_use()[..2], [8, 16]);
        rx.release(0, 1, 2);
        assert!(rx.changed() && !rx.urgent(), "one of eight back: it can wait");
        rx.release(0, 1, 2);
        assert!(rx.urgent(), "a quarter back: at once");
        assert_eq!(rx.in_use()[..2], [6, 12]);
        assert!(rx.take(0, 2, 4));
    }

    #[test]
    fn counts_wrap_like_the_spec_counters() {
        // A receiver whose completion counts are about to wrap, and a sender that saw them.
        let mut rx =
            RxCredits::new(CreditGrant { posted: (4, 256), non_posted: (4, 256), completion: (4, 256) });
        let start = Counts { header: u32::MAX - 5, data: u32::MAX - 300 };
        rx.used.0[2] = start;
        rx.allocated.0[2] = start.plus(4, 256);
        // The sender has seen every limit so far (a limit is compared with the last one, by
        // serial arithmetic), and the grant long ago.
        let mut tx = TxCredits { grant: rx.grant, ..TxCredits::default() };
        tx.consumed.0[2] = start;
        tx.limit.0[2] = start;
        tx.update(rx.advertise());
        for _ in 0..4 {
            for _ in 0..4 {
                assert!(tx.covers(2, 1, 64));
                tx.charge(2, 1, 64);
                assert!(rx.take(2, 1, 64));
            }
            assert!(!tx.covers(2, 1, 0) && !rx.take(2, 1, 0));
            rx.release(2, 4, 256);
            tx.update(rx.advertise());
        }
        assert!(rx.used.get(2).header < 16, "the counts wrapped");
        assert_eq!(rx.in_use()[4..], [0, 0]);
    }
}
