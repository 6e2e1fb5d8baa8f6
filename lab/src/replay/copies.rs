//! The copies' bytes: each copy moves bytes of its own, and the replay checks where they
//! landed, each way.
//!
//! The host memory copies in read from, and the VRAM copies out read from, hold patterns
//! that depend on each byte's place; copy `k` (counted over the replayer's runs) reads from
//! its own offset, `k` mod [`Copies::shifts`] pages in, so neither its neighbours nor the
//! same copy of the run before move the same bytes.
//!
//! Copies in land in VRAM: each copy of a run in a place of its own where the device's VRAM
//! holds them all, else in up to four places in turn (one lands while the next starts, as
//! into a real job's tensors). After the run, each copy that was the last to land in its
//! place (and ran beside no other copy into it) is read back, its first and last
//! [`CHECKED`] bytes: with a place each, every copy in.
//!
//! Copies out land in one of up to [`OUT_PLACES`] places of host memory in turn. Each is
//! checked when a call that waits for it sees it done, if no later copy out has been given
//! its place since; after the run, the last in each place.

use driver::{Command, PciFunction, Pinned, SimGpuDriver};
use simgpu_abi::op;

use super::error::{ReplayError, driver};
use crate::plan::Plan;
use crate::trace::{ActivityKind, CopyKind};

/// Host memory a copy may take at most, each way: larger traced copies move their first
/// this many bytes (and keep their traced duration).
pub const MAX_COPY_BYTES: u64 = 96 << 20;

/// Bytes of a copy's beginning, and of its end, that are checked.
pub(super) const CHECKED: u64 = 4096;
/// Bytes between the offsets copies read from.
const SHIFT: u64 = 4096;
/// The most places of host memory copies out land in, in turn.
pub(super) const OUT_PLACES: usize = 4;
/// Host memory the places of copies out take at most together.
const OUT_HOST_BYTES: u64 = 128 << 20;
/// VRAM places are this aligned.
const PLACE_ALIGN: u64 = 64 << 10;

/// `len` pattern bytes, each from its place and `seed`.
fn pattern(seed: u32, len: u64) -> Vec<u8> {
    (0..len).map(|i| ((i as u32) ^ seed).wrapping_mul(2_654_435_761).to_le_bytes()[3]).collect()
}

/// The copies' buffers, patterns and places.
pub(super) struct Copies {
    /// Host memory copies in read from: `pattern_in`.
    h2d: Option<Pinned>,
    pattern_in: Vec<u8>,
    /// VRAM offsets copies in land at: one per copy of a run, or a few in turn.
    places_in: Vec<u64>,
    /// VRAM copies out read from, holding `pattern_out`.
    out_source: u64,
    pattern_out: Vec<u8>,
    /// Host memory copies out land in: `out_places` places of `out_slot` bytes.
    d2h: Option<Pinned>,
    out_slot: u64,
    out_places: usize,
    /// The offsets copies read from go round this many pages: a prime that divides neither
    /// count of copies a run makes, so each run's copies read other bytes than the last's.
    shifts: u64,
    /// Copies in and out a run makes.
    per_run: (u64, u64),
}

/// A copy of a run: the activity, where it reads and lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CopyAt {
    /// The activity.
    pub(super) activity: usize,
    /// Its number among the run's copies its way.
    pub(super) nth: u64,
    /// Its number over the replayer's runs.
    k: u64,
    /// Bytes it moves.
    pub(super) n: u64,
}

impl Copies {
    /// Host buffers and VRAM for `plan`'s copies, the patterns written; VRAM from
    /// `vram_top` up is not the copies'.
    pub(super) fn new<P: PciFunction>(
        d: &mut SimGpuDriver<P>,
        plan: &Plan,
        vram_top: u64,
    ) -> Result<Copies, ReplayError> {
        let sizes = |to_dev: bool| {
            plan.activities
                .iter()
                .filter_map(|a| copy_bytes(a.kind))
                .filter(move |(k, _)| to_device(*k) == to_dev)
                .map(|(_, b)| b.min(MAX_COPY_BYTES))
        };
        let per_run = (sizes(true).count() as u64, sizes(false).count() as u64);
        let shifts = [31u64, 37, 41, 43, 47, 53]
            .into_iter()
            .find(|p| !per_run.0.is_multiple_of(*p) && !per_run.1.is_multiple_of(*p))
            .unwrap_or(59);
        let spread = (shifts - 1) * SHIFT;
        let (most_in, most_out) = (sizes(true).max(), sizes(false).max());
        let pattern_in = most_in.map_or_else(Vec::new, |m| pattern(0, m + spread));
        let pattern_out = most_out.map_or_else(Vec::new, |m| pattern(0x5eed, m + spread));
        // VRAM from the top down: the copies out's source, then the copies in's places.
        let out_source = vram_top
            .saturating_sub(1 << 20)
            .saturating_sub((pattern_out.len() as u64).next_multiple_of(PLACE_ALIGN));
        let own: Vec<u64> = sizes(true)
            .scan(0u64, |at, n| {
                let here = *at;
                *at += n.next_multiple_of(PLACE_ALIGN);
                Some(here)
            })
            .collect();
        let all: u64 = sizes(true).map(|n| n.next_multiple_of(PLACE_ALIGN)).sum();
        let places_in = if all <= out_source {
            own
        } else {
            let slot = most_in.unwrap_or(0).next_multiple_of(PLACE_ALIGN);
            let places = (out_source / slot).min(4);
            if places == 0 {
                return Err(ReplayError::Verification(format!(
                    "the device's VRAM ({} MiB) holds no place for the trace's largest copy in ({slot} bytes) beside the copies out's {} bytes",
                    d.vram_size() >> 20,
                    pattern_out.len()
                )));
            }
            (0..places).map(|i| i * slot).collect()
        };
        let h2d = match most_in {
            Some(_) => {
                let h = d
                    .pin(pattern_in.len())
                    .map_err(driver(format!("{} bytes of host memory to copy from", pattern_in.len())))?;
                d.pci().dma_write(&h, 0, &pattern_in);
                Some(h)
            }
            None => None,
        };
        let out_slot = most_out.unwrap_or(0).next_multiple_of(SHIFT);
        let out_places = (OUT_HOST_BYTES / out_slot.max(1)).clamp(1, OUT_PLACES as u64) as usize;
        let d2h = match most_out {
            Some(_) => {
                let bytes = out_slot as usize * out_places;
                let h = d.pin(bytes).map_err(driver(format!("{bytes} bytes of host memory to copy into")))?;
                d.memcpy_to_device(out_source, &pattern_out)
                    .map_err(driver("writing the copies out's source into VRAM"))?;
                Some(h)
            }
            None => None,
        };
        Ok(Copies {
            h2d,
            pattern_in,
            places_in,
            out_source,
            pattern_out,
            d2h,
            out_slot,
            out_places,
            shifts,
            per_run,
        })
    }

    /// Copy `nth` of its way (of run `run`) of `bytes` (capped).
    /// Gives the pinned buffers back to `d`.
    pub(super) fn release<P: PciFunction>(self, d: &mut SimGpuDriver<P>) {
        for p in [self.h2d, self.d2h].into_iter().flatten() {
            d.unpin(p);
        }
    }

    pub(super) fn at(&self, run: u64, activity: usize, nth: u64, bytes: u64, to_dev: bool) -> CopyAt {
        let per = if to_dev { self.per_run.0 } else { self.per_run.1 };
        CopyAt { activity, nth, k: run.wrapping_mul(per).wrapping_add(nth), n: bytes.min(MAX_COPY_BYTES) }
    }

    fn offset(&self, c: &CopyAt) -> usize {
        ((c.k % self.shifts) * SHIFT) as usize
    }

    /// The VRAM place copy in `c` lands at.
    pub(super) fn place_in(&self, c: &CopyAt) -> usize {
        c.nth as usize % self.places_in.len()
    }

    /// The place in host memory copy out `c` lands in.
    pub(super) fn place_out(&self, c: &CopyAt) -> usize {
        c.nth as usize % self.out_places
    }

    /// The command of a copy in, `dur` ns as traced.
    pub(super) fn command_in(&self, c: &CopyAt, dur: u64) -> Command {
        let src = self.h2d.as_ref().map_or(0, |b| b.bus.get()) + self.offset(c) as u64;
        Command { opcode: op::COPY_H2V, args: [src, self.places_in[self.place_in(c)], c.n, dur, 0] }
    }

    /// The command of a copy out, `dur` ns as traced.
    pub(super) fn command_out(&self, c: &CopyAt, dur: u64) -> Command {
        let src = self.out_source + self.offset(c) as u64;
        let dst = self.d2h.as_ref().map_or(0, |b| b.bus.get()) + self.place_out(c) as u64 * self.out_slot;
        Command { opcode: op::COPY_V2H, args: [src, dst, c.n, dur, 0] }
    }

    /// Reads copy out `c`'s bytes where it landed, as a driver copies a staged copy into
    /// the caller's pageable memory.
    pub(super) fn read_out<P: PciFunction>(&self, d: &mut SimGpuDriver<P>, c: &CopyAt) {
        if let Some(buf) = &self.d2h {
            let mut out = vec![0u8; c.n as usize];
            d.pci().dma_read(buf, self.place_out(c) * self.out_slot as usize, &mut out);
        }
    }

    /// What is wrong with `c`'s bytes `got` at `part` against `expected`, if anything.
    fn mismatch(expected: &[u8], got: &[u8], c: &CopyAt, way: &str, part: &str) -> Option<String> {
        (expected != got).then(|| {
            format!(
                "copy {way} {} (activity {}, {} bytes): its {part} {} bytes are not its own",
                c.nth,
                c.activity,
                c.n,
                got.len()
            )
        })
    }

    /// The parts of copy `c` that are checked: (where in the copy, bytes).
    fn parts(c: &CopyAt) -> [(usize, usize, &'static str); 2] {
        let m = c.n.min(CHECKED) as usize;
        [(0, m, "first"), (c.n as usize - m, m, "last")]
    }

    /// Checks copy out `c` where it landed in host memory.
    pub(super) fn check_out<P: PciFunction>(&self, d: &mut SimGpuDriver<P>, c: &CopyAt) -> Option<String> {
        let buf = self.d2h.as_ref()?;
        let (at, src) = (self.place_out(c) * self.out_slot as usize, self.offset(c));
        Self::parts(c).into_iter().find_map(|(from, m, part)| {
            let mut got = vec![0u8; m];
            d.pci().dma_read(buf, at + from, &mut got);
            Self::mismatch(&self.pattern_out[src + from..src + from + m], &got, c, "out", part)
        })
    }

    /// Checks copy in `c` where it landed in VRAM.
    pub(super) fn check_in<P: PciFunction>(
        &self,
        d: &mut SimGpuDriver<P>,
        c: &CopyAt,
    ) -> Result<Option<String>, ReplayError> {
        let (at, src) = (self.places_in[self.place_in(c)], self.offset(c));
        for (from, m, part) in Self::parts(c) {
            let mut got = vec![0u8; m];
            d.memcpy_from_device(at + from as u64, &mut got).map_err(driver("reading back a copy in"))?;
            if let Some(why) =
                Self::mismatch(&self.pattern_in[src + from..src + from + m], &got, c, "in", part)
            {
                return Ok(Some(why));
            }
        }
        Ok(None)
    }
}

/// The bytes a copy moves, and whether it was capped.
pub(super) fn copy_bytes(kind: ActivityKind) -> Option<(CopyKind, u64)> {
    match kind {
        ActivityKind::Memcpy { kind: k @ (CopyKind::HtoDPinned | CopyKind::HtoDPageable), bytes }
        | ActivityKind::Memcpy { kind: k @ (CopyKind::DtoHPinned | CopyKind::DtoHPageable), bytes }
            if bytes > 0 =>
        {
            Some((k, bytes))
        }
        _ => None,
    }
}

pub(super) fn to_device(k: CopyKind) -> bool {
    matches!(k, CopyKind::HtoDPinned | CopyKind::HtoDPageable)
}
