//! DATA frames that arrived ahead of the next one expected, held (bounded by the window)
//! until the gap before them fills, so that one loss does not make the sender replay the
//! whole window. Slot 0 is the frame right after the next expected one.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use crate::seq::SeqNum;

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

    /// Whether no frame is held (after [`ReorderBuffer::pop_next`] said `Gap` or `Empty`).
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Frames held.
    pub(crate) fn held(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// The runs of held frames, as ranges of sequence numbers `[start, end)`, ascending, when
    /// `next` is the next expected frame: what a selective acknowledgement says.
    pub(crate) fn ranges(&self, next: SeqNum) -> impl Iterator<Item = (u32, u32)> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || {
            let start = at + self.slots.iter().skip(at).position(Option::is_some)?;
            let len = self.slots.iter().skip(start).take_while(|s| s.is_some()).count();
            at = start + len;
            // Slot 0 is the frame right after `next`.
            let seq = |i: usize| next.0.wrapping_add(1 + i as u32);
            Some((seq(start), seq(start + len)))
        })
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
    fn the_held_frames_come_out_as_ranges_of_sequence_numbers() {
        let mut r = ReorderBuffer::default();
        let mut pool = Vec::new();
        assert_eq!(r.ranges(SeqNum(10)).count(), 0);
        // Expecting 10: 11, 12, 14, 17, 18 held.
        for ahead in [1, 2, 4, 7, 8] {
            assert!(r.hold(ahead, b"x", &mut pool));
        }
        let got: Vec<_> = r.ranges(SeqNum(10)).collect();
        assert_eq!(got, [(11, 13), (14, 15), (17, 19)]);
        // Across the wrap of the sequence space.
        let got: Vec<_> = r.ranges(SeqNum(u32::MAX - 1)).collect();
        assert_eq!(got, [(u32::MAX, 1), (2, 3), (5, 7)]);
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
