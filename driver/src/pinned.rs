//! Pinned host memory a caller holds: DMA buffers the device copies from or into, as
//! CUDA's `cudaHostAlloc`. The platform's DMA memory is never taken back (`DmaArena`), so
//! the driver keeps what is given back ([`crate::SimGpuDriver::unpin`]) and hands it out
//! again: a workload run again does not use up the platform's memory.

use std::ops::Deref;

use crate::function::DmaBuf;

/// A pinned buffer of at least the length asked for, held by its caller until given back
/// to the driver that pinned it. Not `Clone` or `Copy`: one holder at a time. Dropped
/// instead of given back, its memory is not handed out again.
#[derive(Debug, PartialEq, Eq)]
pub struct Pinned {
    /// The bytes asked for.
    buf: DmaBuf,
    /// The bytes the piece of DMA memory holds (at least `buf.len`).
    capacity: usize,
}

impl Deref for Pinned {
    type Target = DmaBuf;

    fn deref(&self) -> &DmaBuf {
        &self.buf
    }
}

/// Pinned buffers given back, for the next pins.
#[derive(Debug, Default)]
pub(crate) struct PinnedPool {
    free: Vec<DmaBuf>,
}

impl PinnedPool {
    /// `len` bytes: the smallest buffer given back that holds them, else a new one from
    /// `alloc`.
    pub(crate) fn take(&mut self, len: usize, alloc: impl FnOnce(usize) -> Option<DmaBuf>) -> Option<Pinned> {
        let fit = self.free.iter().enumerate().filter(|(_, b)| b.len >= len).min_by_key(|(_, b)| b.len);
        let whole = match fit.map(|(i, _)| i) {
            Some(i) => self.free.swap_remove(i),
            None => alloc(len)?,
        };
        Some(Pinned { buf: DmaBuf { bus: whole.bus, len }, capacity: whole.len })
    }

    /// `p`'s memory, for a later [`Self::take`].
    pub(crate) fn give_back(&mut self, p: Pinned) {
        self.free.push(DmaBuf { bus: p.buf.bus, len: p.capacity });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::function::BusAddr;

    fn arena() -> impl FnMut(usize) -> Option<DmaBuf> {
        let mut next = 0x1000u64;
        move |len| {
            let b = DmaBuf { bus: BusAddr(next), len };
            next += len.next_multiple_of(64) as u64;
            Some(b)
        }
    }

    #[test]
    fn a_buffer_given_back_is_taken_again_by_the_smallest_fit_and_keeps_its_size() {
        let mut alloc = arena();
        let mut pool = PinnedPool::default();
        let big = pool.take(4096, &mut alloc).unwrap();
        let small = pool.take(256, &mut alloc).unwrap();
        let (big_at, small_at) = (big.bus, small.bus);
        assert_ne!(big_at, small_at);
        pool.give_back(big);
        pool.give_back(small);
        // 200 bytes fit both: the smaller is taken, its length what was asked.
        let a = pool.take(200, &mut alloc).unwrap();
        assert_eq!((a.bus, a.len), (small_at, 200));
        // 1000 bytes fit only the big one; given back, it holds 4096 again.
        let b = pool.take(1000, &mut alloc).unwrap();
        assert_eq!(b.bus, big_at);
        pool.give_back(b);
        let c = pool.take(4096, &mut alloc).unwrap();
        assert_eq!(c.bus, big_at);
        // Nothing given back holds 8192: new memory.
        let d = pool.take(8192, &mut alloc).unwrap();
        assert!(d.bus != big_at && d.bus != small_at);
        assert!(pool.take(1, |_| None).is_none());
    }
}
