//! The client's memory as the device reaches it. A memfd sealed against shrinking is mapped
//! here and its bytes read and written in place; any other memory is reached with DMA_READ /
//! DMA_WRITE messages on the client's channel, in pieces no larger than the client takes.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use super::channel::Channel;
use super::proto::{self, cmd};
use super::{Counters, MAX_DATA_XFER, bump, lock};
use crate::{BusAddr, ClientMemory};

/// Client memory without a file descriptor, reached with DMA_READ / DMA_WRITE.
pub(super) struct ClientDma {
    pub(super) chan: Arc<Mutex<Channel>>,
    pub(super) counters: Arc<Counters>,
}

impl ClientMemory for ClientDma {
    fn read(&mut self, addr: BusAddr, out: &mut [u8]) -> io::Result<()> {
        let addr = addr.get();
        let mut c = lock(&self.chan);
        let chunk = c.peer_max_xfer.clamp(4, MAX_DATA_XFER) as usize;
        let mut done = 0;
        while done < out.len() {
            let n = chunk.min(out.len() - done);
            let at = addr + done as u64;
            bump(&self.counters.client_dma);
            let reply = c.call(cmd::DMA_READ, &proto::dma_read(at, n as u64))?;
            let data = proto::dma_read_data(&reply, at, n)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            out[done..done + n].copy_from_slice(data);
            done += n;
        }
        Ok(())
    }

    fn write(&mut self, addr: BusAddr, data: &[u8]) -> io::Result<()> {
        let addr = addr.get();
        let mut c = lock(&self.chan);
        let chunk = c.peer_max_xfer.clamp(4, MAX_DATA_XFER) as usize;
        for (i, piece) in data.chunks(chunk).enumerate() {
            bump(&self.counters.client_dma);
            c.call(cmd::DMA_WRITE, &proto::dma_write(addr + (i * chunk) as u64, piece))?;
        }
        Ok(())
    }
}

/// Maps `len` bytes of the client's file at `offset`: shared and writable if the device may
/// write it, otherwise a private read-only view (which this process never writes).
///
/// Touching a mapping beyond the end of its file raises SIGBUS, which would end this process
/// and every device it serves. So only a file that can never shrink is mapped: a memfd
/// sealed with F_SEAL_SHRINK (as QEMU's memfd backend seals by default), checked before its
/// size is read (seals are never removed), covering the whole range. For any other file
/// (`Ok(None)`) the caller reaches the memory through DMA_READ / DMA_WRITE messages instead,
/// where a truncated file is the client's error, not this process's fault.
#[allow(unsafe_code)]
pub(super) fn map_client_file(
    fd: OwnedFd,
    offset: u64,
    len: usize,
    write: bool,
) -> io::Result<Option<memmap2::MmapMut>> {
    // The seals first: once F_SEAL_SHRINK is there, the size read after it can only grow.
    let sealed = rustix::fs::fcntl_get_seals(&fd).is_ok_and(|s| s.contains(rustix::fs::SealFlags::SHRINK));
    let st = rustix::fs::fstat(&fd)?;
    let regular = rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
    if regular && !sealed {
        return Ok(None);
    }
    let end = offset.checked_add(len as u64);
    if !regular || end.is_none_or(|e| e > st.st_size as u64) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "not a regular file covering {offset:#x}+{len:#x} (type {:?}, {} bytes)",
                rustix::fs::FileType::from_raw_mode(st.st_mode),
                st.st_size
            ),
        ));
    }
    let file = File::from(fd);
    let mut o = memmap2::MmapOptions::new();
    o.offset(offset).len(len);
    if write {
        // SAFETY: the mapping is guest memory shared with the VMM by design; the guest and
        // the VMM may change it at any time, so this process only ever copies bytes in and
        // out of it (no references into it outlive a copy), which stays sound whatever
        // they do concurrently. The file is sealed against shrinking and covers the range,
        // so no access to the mapping can fault.
        unsafe { o.map_mut(&file) }.map(Some)
    } else {
        // SAFETY: as above; the private mapping is never written here.
        unsafe { o.map_copy(&file) }.map(Some)
    }
}
