//! One eventfd per MSI-X vector, the way VFIO delivers a function's interrupts
//! (`VFIO_DEVICE_SET_IRQS` with `VFIO_IRQ_SET_DATA_EVENTFD`): both the box's VFIO device and
//! a driver's vfio-pci platform hand these to the kernel and read which vectors fired.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use rustix::event::{EventfdFlags, PollFd, PollFlags, eventfd, poll};

/// One eventfd per MSI-X vector: VFIO signals them, [`MsixEventfds::fired`] reads them.
pub struct MsixEventfds {
    fds: Vec<OwnedFd>,
}

impl MsixEventfds {
    /// `n` non-blocking eventfds.
    pub fn new(n: usize) -> io::Result<MsixEventfds> {
        let fds = (0..n)
            .map(|_| eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MsixEventfds { fds })
    }

    /// The raw descriptors, in vector order, for VFIO.
    pub fn raw(&self) -> Vec<RawFd> {
        self.fds.iter().map(|f| f.as_raw_fd()).collect()
    }

    /// How many times each vector was signalled since the last call, in vector order.
    pub fn counts(&self) -> Vec<u64> {
        self.fds
            .iter()
            .map(|fd| {
                let mut b = [0u8; 8];
                match rustix::io::read(fd, &mut b) {
                    Ok(8) => u64::from_ne_bytes(b),
                    _ => 0,
                }
            })
            .collect()
    }

    /// The vectors signalled since the last call (each once, however often it fired).
    pub fn fired(&self) -> Vec<u16> {
        self.counts().iter().enumerate().filter(|(_, n)| **n > 0).map(|(v, _)| v as u16).collect()
    }

    /// Sleeps until some vector is signalled or `timeout` passes (an interrupted sleep
    /// returns early; the caller looks again).
    pub fn wait(&self, timeout: std::time::Duration) {
        let mut p: Vec<PollFd<'_>> = self.fds.iter().map(|f| PollFd::new(f, PollFlags::IN)).collect();
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: timeout.subsec_nanos() as i64,
        };
        let _ = poll(&mut p, Some(&ts));
    }

    /// Vector `v`'s descriptor.
    pub fn fd(&self, v: usize) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.fds.get(v).map(|f| f.as_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signalled_vector_is_read_once_with_its_count() {
        let e = MsixEventfds::new(3).unwrap();
        let fd = e.fd(1).unwrap();
        rustix::io::write(fd, &2u64.to_ne_bytes()).unwrap();
        rustix::io::write(fd, &1u64.to_ne_bytes()).unwrap();
        assert_eq!(e.counts(), vec![0, 3, 0]);
        assert_eq!(e.fired(), Vec::<u16>::new());
        rustix::io::write(e.fd(2).unwrap(), &1u64.to_ne_bytes()).unwrap();
        e.wait(std::time::Duration::from_secs(5));
        assert_eq!(e.fired(), vec![2]);
    }
}
