//! Wrap-aware sequence numbers (serial number arithmetic, RFC 1982 style, 32 bits).
#![forbid(unsafe_code)]

use core::cmp::Ordering;
use core::fmt;

/// A DATA frame sequence number. Compares correctly across wrap-around as long as the two
/// numbers are within 2^31 of each other.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SeqNum(pub u32);

impl SeqNum {
    /// The next number.
    pub fn next(self) -> SeqNum {
        SeqNum(self.0.wrapping_add(1))
    }
    /// `self + n`.
    pub fn plus(self, n: u32) -> SeqNum {
        SeqNum(self.0.wrapping_add(n))
    }
    /// How far `self` is ahead of `earlier` (negative if behind).
    pub fn distance_from(self, earlier: SeqNum) -> i32 {
        self.0.wrapping_sub(earlier.0) as i32
    }
}

impl PartialOrd for SeqNum {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SeqNum {
    fn cmp(&self, other: &Self) -> Ordering {
        self.distance_from(*other).cmp(&0)
    }
}

impl fmt::Debug for SeqNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        let a = SeqNum(u32::MAX);
        let b = a.next();
        assert_eq!(b, SeqNum(0));
        assert!(a < b);
        assert!(SeqNum(5) > SeqNum(u32::MAX - 5));
        assert_eq!(SeqNum(3).distance_from(SeqNum(u32::MAX)), 4);
    }
}
