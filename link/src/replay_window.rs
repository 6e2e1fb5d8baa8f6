//! The anti-replay window over packet numbers (after IPsec's, RFC 4303 §3.4.3): a frame is
//! taken once, and only if its packet number is new and at most 63 below the highest seen.
//! Checked after the tag, so that only authentic frames move it.
#![forbid(unsafe_code)]

/// Packet numbers below the highest seen that the window still tells apart.
pub(crate) const WIDTH: u64 = 64;

/// Which of the last [`WIDTH`] packet numbers have been seen.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReplayWindow {
    /// The highest packet number seen, if any.
    highest: Option<u64>,
    /// Bit `i`: packet number `highest - i` was seen.
    seen: u64,
}

impl ReplayWindow {
    /// Takes packet number `pn` if it was not seen and is within the window; `false` for a
    /// replay (or one too old to tell).
    pub(crate) fn accept(&mut self, pn: u64) -> bool {
        match self.highest {
            Some(h) if pn <= h => {
                let back = h - pn;
                if back >= WIDTH || self.seen & (1 << back) != 0 {
                    return false;
                }
                self.seen |= 1 << back;
                true
            }
            Some(h) => {
                let shift = pn - h;
                self.seen = if shift >= WIDTH { 0 } else { self.seen << shift };
                self.seen |= 1;
                self.highest = Some(pn);
                true
            }
            None => {
                self.seen = 1;
                self.highest = Some(pn);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_packet_number_is_taken_once_in_any_order_within_the_window() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(0));
        assert!(!w.accept(0), "a replay of the first");
        for pn in [5, 3, 4, 1, 2] {
            assert!(w.accept(pn), "{pn}, reordered");
        }
        for pn in 0..=5 {
            assert!(!w.accept(pn), "{pn} again");
        }
        assert!(w.accept(5 + 63));
        assert!(w.accept(6), "63 below the highest: still told apart");
        assert!(!w.accept(4), "64 below: too old to tell, refused");
        assert!(w.accept(u64::MAX), "a jump past the window forgets it");
        assert!(!w.accept(u64::MAX));
        assert!(w.accept(u64::MAX - 63));
        assert!(!w.accept(u64::MAX - 64));
    }

    /// Against a set of every number seen: the window takes exactly the new ones no older
    /// than 63 below the highest.
    #[test]
    fn the_window_agrees_with_a_plain_set() {
        let mut w = ReplayWindow::default();
        let mut seen = std::collections::BTreeSet::new();
        let mut x: u64 = 12345;
        let mut highest = None::<u64>;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let base = highest.unwrap_or(0);
            let pn = (base + x % 80).saturating_sub(40);
            let expect = !seen.contains(&pn) && highest.is_none_or(|h| pn + WIDTH > h);
            assert_eq!(w.accept(pn), expect, "pn {pn}, highest {highest:?}");
            if expect {
                seen.insert(pn);
                highest = Some(highest.map_or(pn, |h| h.max(pn)));
            }
        }
    }
}
