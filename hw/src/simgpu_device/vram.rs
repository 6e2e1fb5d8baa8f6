//! The simulated GPU's VRAM: sparse, in pages allocated when first written.

/// VRAM is backed in pages of this size, each allocated when first written.
pub const VRAM_PAGE: u64 = 64 << 10;

type VramPage = Box<[u8; VRAM_PAGE as usize]>;

/// Untouched VRAM reads as this.
static ZERO_PAGE: [u8; VRAM_PAGE as usize] = [0; VRAM_PAGE as usize];

/// Sparse VRAM: pages exist once written; reads of untouched memory return zeros. The page
/// table is indexed by page number and grows to the highest page written (8 bytes per page
/// below it: 8 MiB for a write at the top of 64 GiB).
#[derive(Clone, Default)]
pub(super) struct Vram {
    size: u64,
    pages: Vec<Option<VramPage>>,
    resident: u64,
}

impl Vram {
    /// `size` bytes of VRAM, none of it touched.
    pub(super) fn new(size: u64) -> Vram {
        Vram { size, ..Vram::default() }
    }
    /// Its size in bytes.
    pub(super) fn size(&self) -> u64 {
        self.size
    }
    pub(super) fn in_bounds(&self, off: u64, len: u64) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.size)
    }
    /// The `len` bytes at `off` where they lie, if they lie in one page (untouched pages
    /// read as zeros). The caller checked the bounds.
    pub(super) fn slice(&self, off: u64, len: usize) -> Option<&[u8]> {
        let (page, at) = ((off / VRAM_PAGE) as usize, (off % VRAM_PAGE) as usize);
        if at + len > VRAM_PAGE as usize {
            return None;
        }
        let p = self.pages.get(page).and_then(|p| p.as_deref()).unwrap_or(&ZERO_PAGE);
        Some(&p[at..at + len])
    }
    pub(super) fn read(&self, off: u64, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let a = off + done as u64;
            let n = (VRAM_PAGE - a % VRAM_PAGE).min((out.len() - done) as u64) as usize;
            if let Some(src) = self.slice(a, n) {
                out[done..done + n].copy_from_slice(src);
            }
            done += n;
        }
    }
    pub(super) fn write(&mut self, off: u64, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let a = off + done as u64;
            let (page, at) = ((a / VRAM_PAGE) as usize, (a % VRAM_PAGE) as usize);
            let n = (VRAM_PAGE as usize - at).min(data.len() - done);
            if self.pages.len() <= page {
                self.pages.resize_with(page + 1, || None);
            }
            let p = self.pages[page].get_or_insert_with(|| {
                self.resident += VRAM_PAGE;
                // Built on the heap: a 64 KiB array on the stack first is wasted work.
                vec![0u8; VRAM_PAGE as usize].into_boxed_slice().try_into().unwrap_or_else(|_| unreachable!())
            });
            p[at..at + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }
    pub(super) fn clear(&mut self) {
        self.pages = Vec::new();
        self.resident = 0;
    }
    /// The `n` floats at `off` (a multiple of 4: no float straddles a page) into `out`,
    /// replacing what it held, straight from the pages.
    pub(super) fn read_f32s_into(&self, off: u64, n: u64, out: &mut Vec<f32>) {
        out.clear();
        let (mut at, end) = (off, off + n * 4);
        while at < end {
            let len = (VRAM_PAGE - at % VRAM_PAGE).min(end - at) as usize;
            let bytes = self.slice(at, len).unwrap_or(&[]);
            out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
            at += len as u64;
        }
    }
    /// `v` at `off` (a multiple of 4), straight into the pages.
    pub(super) fn write_f32s(&mut self, off: u64, v: &[f32]) {
        // Through a stack buffer of this many bytes at a time.
        const STAGE: usize = 4096;
        let mut bytes = [0u8; STAGE];
        for (i, chunk) in v.chunks(STAGE / 4).enumerate() {
            for (b, x) in bytes.chunks_exact_mut(4).zip(chunk) {
                b.copy_from_slice(&x.to_le_bytes());
            }
            self.write(off + (i * STAGE) as u64, &bytes[..chunk.len() * 4]);
        }
    }
    /// Bytes actually backed by memory.
    pub(super) fn resident(&self) -> u64 {
        self.resident
    }
}

/// What the device sends from VRAM is read from here as the platform takes it.
impl crate::upstream::Memory for Vram {
    fn slice(&self, at: u64, len: usize) -> Option<&[u8]> {
        if !self.in_bounds(at, len as u64) {
            return None;
        }
        Vram::slice(self, at, len)
    }
    fn read(&self, at: u64, out: &mut [u8]) {
        if self.in_bounds(at, out.len() as u64) {
            Vram::read(self, at, out);
        } else {
            out.fill(0);
        }
    }
}
