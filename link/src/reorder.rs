//! DATA frames that arrived ahead of the next one expected, held (bounded by the window)
//! until the gap before them fills, so that one loss does not make the sender replay the
//! whole window. Slot 0 is the frame right after the next expected one.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

/// What [`ReorderBuffer::pop_next`] found after a frame was delivered.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// The next frame was held: deliver it, then ask again.
    Held(Vec<u8>),
    /// The next frame is still missing, and frames after it are held: a gap remains.
    Gap,
    /// Nothing is held.
    Empty,
}

/// The held frames' bodies, by distance past the next expected frame.
#[derive(Debug, Default)]
pub(crate) struct ReorderBuffer {
    slots: VecDeque<Option<Vec<u8>>>,
}

impl ReorderBuffer {
    /// Holds `body`, the frame `ahead` (≥ 1, below the window) past the next expected one, in
    /// a buffer from `pool`; `false` if that frame is held already (a duplicate).
    pub(crate) fn hold(&mut self, ahead: usize, body: &[u8], pool: &mut Vec<Vec<u8>>) -> bool {
        let slot = ahead - 1;
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, || None);
        }
        if self.slots[slot].is_some() {
            return false;
        }
        let mut b = pool.pop().unwrap_or_default();
        b.clear();
        b.extend_from_slice(body);
        self.slots[slot] = Some(b);
        true
    }

    /// The next expected frame was just delivered: the one after it, if held. After a
    /// [`Next::Gap`], slots count from the new next expected frame again.
    pub(crate) fn pop_next(&mut self) -> Next {
        match self.slots.pop_front() {
            Some(Some(b)) => Next::Held(b),
            Some(None) if self.slots.iter().any(Option::is_some) => Next::Gap,
            Some(None) | None => {
                self.slots.clear();
                Next::Empty
            }
        }
    }

    /// Frames held.
    pub(crate) fn held(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_out_in_order_once_the_gap_fills() {
        let mut r = ReorderBuffer::default();
        let mut pool = Vec::new();
        // Expecting 10: 12, 11 and 14 arrive (ahead 2, 1, 4); 12 again is a duplicate.
        assert!(r.hold(2, b"12", &mut pool));
        assert!(r.hold(1, b"11", &mut pool));
        assert!(r.hold(4, b"14", &mut pool));
        assert!(!r.hold(2, b"12", &mut pool));
        assert_eq!(r.held(), 3);
        // 10 arrives and is delivered: 11 and 12 follow, then 13 is missing with 14 held.
        assert_eq!(r.pop_next(), Next::Held(b"11".to_vec()));
        assert_eq!(r.pop_next(), Next::Held(b"12".to_vec()));
        assert_eq!(r.pop_next(), Next::Gap);
        // Now expecting 13: 14 is one ahead.
        assert!(!r.hold(1, b"14", &mut pool), "still held, at its new distance");
        assert_eq!(r.pop_next(), Next::Held(b"14".to_vec()));
        assert_eq!(r.pop_next(), Next::Empty);
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn an_empty_buffer_and_trailing_gaps_leave_nothing_held() {
        let mut r = ReorderBuffer::default();
        assert_eq!(r.pop_next(), Next::Empty);
        let mut pool = vec![vec![9u8; 100]];
        assert!(r.hold(1, b"x", &mut pool));
        assert!(pool.is_empty(), "the pooled buffer was used");
        assert_eq!(r.pop_next(), Next::Held(b"x".to_vec()));
        assert_eq!(r.pop_next(), Next::Empty);
    }
}
