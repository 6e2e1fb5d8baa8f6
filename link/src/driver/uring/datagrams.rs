//! The io_uring driver's [`Datagrams`]: sends batched or borrowed (GSO, zero-copy), the two
//! receive modes, waits, and what the driver tells of its offloads.
#![allow(unsafe_code)]

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use io_uring::opcode;
use io_uring::types::{SubmitArgs, Timespec};

use super::{
    BORROWED_GSO_TAG, BORROWED_TAG, BORROWED_ZC_TAG, SOCKET, UringUdp, ZC_MAX_PAGES, ZC_REPORT_USAGE,
    pages_spanned,
};
use crate::driver::Datagrams;
use crate::driver::offload::{OffloadState, gso_unit};
use crate::driver::portable::{ControlBuf, set_segment_cmsg, sockaddr_of};

impl Datagrams for UringUdp {
    fn send_with(
        &mut self,
        to: SocketAddr,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> io::Result<usize> {
        self.usable()?;
        while self.free.is_empty() {
            // Every slot is in flight: submit and wait for one to come back.
            self.submit_and_wait_one()?;
            self.collect_sends();
        }
        let Some(i) = self.free.pop() else { return Ok(0) };
        let slot = &mut self.slots[i];
        // The slot's buffer only grows: no zeroing of an MTU per send attempt.
        if slot.bytes.len() < max {
            slot.bytes.resize(max, 0);
        }
        let n = fill(&mut slot.bytes[..max]).min(max);
        if n == 0 {
            self.free.push(i);
            return Ok(0);
        }
        // Send with a destination (sendto): no msghdr or iovec for the kernel to copy in; to
        // the connected peer without one, the socket keeping its route.
        let op = opcode::Send::new(SOCKET, slot.bytes.as_ptr(), n as u32);
        let op = if self.connected == Some(to) {
            op
        } else {
            let (ss, len) = sockaddr_of(&to);
            slot.addr = ss;
            op.dest_addr(&slot.addr as *const _ as *const libc::sockaddr).dest_addr_len(len)
        };
        let op = op.build().user_data(i as u64);
        self.push(op)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.usable()?;
        if self.unsubmitted > 0 {
            self.ring.submit()?;
            self.unsubmitted = 0;
        }
        Ok(())
    }
    /// One Send per frame, pointing into the caller's memory, submitted with whatever is
    /// queued; then it waits for their completions, so that the kernel has read every frame
    /// when the borrow ends. A UDP send the socket has room for completes inline, in the
    /// enter that submits it: the wait costs no system call of its own then.
    fn send_borrowed(&mut self, to: SocketAddr, frames: &[&[u8]]) -> io::Result<()> {
        self.usable()?;
        let connected = self.connected == Some(to);
        let len = if connected {
            0
        } else {
            let (ss, len) = sockaddr_of(&to);
            self.borrowed_addr = ss;
            len
        };
        let mut result = Ok(());
        // The GSO units first, all of them, so that the headers, iovecs and control messages
        // the kernel reads are in place (and stay put) before any send is pushed.
        let mut units: [(usize, usize, usize); 64] = [(0, 0, 0); 64];
        let n_units = gso_units(to, frames, self.offload.gso, self.offload.zero_copy_send, &mut units);
        self.gso_msgs.clear();
        self.gso_iovs.clear();
        self.gso_ctrl.clear();
        self.gso_iovs.extend(
            units[..n_units]
                .iter()
                .flat_map(|&(first, count, _)| &frames[first..first + count])
                .map(|f| libc::iovec { iov_base: f.as_ptr() as *mut libc::c_void, iov_len: f.len() }),
        );
        self.gso_ctrl.resize(n_units, ControlBuf::default());
        let mut at = 0;
        for (k, &(_, count, segment)) in units[..n_units].iter().enumerate() {
            // SAFETY: plain old data, zero is valid.
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            if !connected {
                m.msg_name = &mut self.borrowed_addr as *mut _ as *mut libc::c_void;
                m.msg_namelen = len;
            }
            m.msg_iov = &mut self.gso_iovs[at];
            m.msg_iovlen = count as _;
            set_segment_cmsg(&mut m, &mut self.gso_ctrl[k], segment as u16);
            self.gso_msgs.push(m);
            at += count;
        }
        let (mut i, mut unit) = (0, 0);
        while i < frames.len() {
            let zc = self.offload.zero_copy_send;
            let op = if unit < n_units && units[unit].0 == i {
                let msg = &self.gso_msgs[unit];
                let op = if zc {
                    opcode::SendMsgZc::new(SOCKET, msg)
                        .ioprio(ZC_REPORT_USAGE)
                        .build()
                        .user_data(BORROWED_ZC_TAG)
                } else {
                    opcode::SendMsg::new(SOCKET, msg).build().user_data(BORROWED_GSO_TAG)
                };
                i += units[unit].1;
                unit += 1;
                op
            } else {
                let f = frames[i];
                i += 1;
                let to = &self.borrowed_addr as *const _ as *const libc::sockaddr;
                if zc {
                    let op =
                        opcode::SendZc::new(SOCKET, f.as_ptr(), f.len() as u32).zc_flags(ZC_REPORT_USAGE);
                    let op = if connected { op } else { op.dest_addr(to).dest_addr_len(len) };
                    op.build().user_data(BORROWED_ZC_TAG)
                } else {
                    let op = opcode::Send::new(SOCKET, f.as_ptr(), f.len() as u32);
                    let op = if connected { op } else { op.dest_addr(to).dest_addr_len(len) };
                    op.build().user_data(BORROWED_TAG)
                }
            };
            // SAFETY (for `push`): the frames, `borrowed_addr` and the GSO headers, iovecs
            // and control messages stay valid and unchanged until the completion, which
            // this function waits for before returning — also when it fails (below).
            if let Err(e) = self.push(op) {
                result = Err(e);
                break;
            }
            self.borrowed_in_flight += 1;
        }
        self.offload.gso_sends += unit as u64;
        if self.unsubmitted > 0 {
            match self.ring.submit() {
                Ok(_) => self.unsubmitted = 0,
                // Left in the submission queue; the wait below submits again.
                Err(e) => result = result.and(Err(e)),
            }
        }
        self.collect_sends();
        // Every Send pushed must complete before the borrow ends. A UDP send usually has: it
        // ran inline in the submit. Otherwise the socket's buffer was full, and the kernel
        // sends when there is room.
        while self.borrowed_in_flight > 0 {
            if let Err(e) = self.submit_and_wait_one() {
                // The ring cannot be entered: Sends may still sit in it pointing at the
                // caller's memory. It must never be entered again.
                self.borrowed_in_flight = 0;
                self.broken = true;
                return Err(e);
            }
            self.collect_sends();
        }
        result
    }

    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        self.usable()?;
        self.reap(f)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.usable()?;
        // Sleeping needs the multishot receive (a single-shot one is never left in flight:
        // it completes in the enter that submits it).
        self.sleeping = true;
        if !self.recv_armed {
            self.arm_recv()?;
        }
        if self.deferred.is_empty() && self.ring.completion().is_empty() {
            let r = match timeout {
                Some(t) => {
                    let ts = Timespec::from(t);
                    let args = SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(1, &args)
                }
                None => self.ring.submit_and_wait(1),
            };
            self.unsubmitted = 0;
            if let Err(e) = r
                && e.raw_os_error() != Some(libc::ETIME)
                && e.kind() != io::ErrorKind::Interrupted
            {
                return Err(e);
            }
        } else {
            self.flush()?;
        }
        Ok(())
    }

    fn spin(&mut self) {
        self.sleeping = false;
    }

    /// The socket while spinning with no multishot receive armed: datagrams then stay in the
    /// socket until a single-shot receive takes them, so it polls readable exactly when
    /// `recv` has something. `None` while the multishot receive is armed (it takes datagrams
    /// through task work, which no descriptor signals) until `spin` and a `recv` end it, and
    /// while datagrams read during a send wait for `recv`.
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        // Datagrams read while waiting for a send (`deferred`) are no longer in the socket.
        (!self.sleeping && !self.recv_armed && self.deferred.is_empty()).then(|| self.socket.as_raw_fd())
    }

    fn connect(&mut self, peer: SocketAddr) -> io::Result<()> {
        self.socket.connect(peer)?;
        self.connected = Some(peer);
        Ok(())
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn offload(&self) -> OffloadState {
        self.offload.clone()
    }

    fn too_large(&self) -> u64 {
        self.offload.too_large
    }

    fn port_unreachable(&self) -> u64 {
        self.offload.port_unreachable
    }
}

/// The runs of `frames` (all to `to`) that go as GSO units (with `gso`), as (first frame, count, segment
/// size) into `units`, as many as it holds; how many. With zero-copy sends, a unit spans at
/// most `ZC_MAX_PAGES` pages: the kernel pins them as the skb's fragments, at most
/// MAX_SKB_FRAGS of them, and a unit spanning more fails with EMSGSIZE.
fn gso_units(
    to: SocketAddr,
    frames: &[&[u8]],
    gso: bool,
    zero_copy: bool,
    units: &mut [(usize, usize, usize)],
) -> usize {
    let mut n_units = 0;
    let mut i = 0;
    while i < frames.len() {
        let (mut count, segment) = if gso && n_units < units.len() {
            gso_unit(i, frames.len(), &|k| (to, frames[k].len()))
        } else {
            (1, 0)
        };
        if zero_copy {
            while count > 1 && pages_spanned(&frames[i..i + count]) > ZC_MAX_PAGES {
                count -= 1;
            }
        }
        if count > 1 && n_units < units.len() {
            units[n_units] = (i, count, segment);
            n_units += 1;
        }
        i += count;
    }
    n_units
}
