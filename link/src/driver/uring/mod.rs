//! The io_uring driver. Sends are Send operations with a destination address (sendto),
//! batched into one submission; each in-flight send owns its slot (bytes, address) until its
//! completion arrives. The socket is a registered (fixed) file.
//!
//! Receiving has two modes, because the two ways of waiting want different things:
//! - Sleeping (`wait`): one multishot RecvMsg into a ring of provided buffers receives every
//!   datagram; each buffer goes back to the ring once its datagram was handed on. A datagram
//!   completes the receive through task work in this thread, which is what lets it sleep in
//!   `io_uring_enter` until a completion or the next timer.
//! - Spinning (`recv` without `wait`, or after [`Datagrams::spin`]): each poll submits one
//!   RecvMsg with `MSG_DONTWAIT`, which the kernel runs inline in the `io_uring_enter` that
//!   submits it (together with any queued sends) and completes at once, with a datagram or
//!   `EAGAIN`. No task work, no poll wake-up: on this VM the multishot path cost 9.6 µs per
//!   bare ping-pong against 6.7 µs for plain sockets, because every datagram went through a
//!   wake-up, a flag, an enter and task work before its completion was visible.
//!
//! The driver switches to sleeping when `wait` is called, and back to spinning (cancelling
//! the multishot receive, whose last completions are still delivered in order) when told.
//!
//! Offloads (`offload.rs`): borrowed frames in runs of equal size leave as one SendMsg each
//! with a `UDP_SEGMENT` control message (GSO); with GRO on, every receive is a RecvMsg with
//! room for the `UDP_GRO` control message, and a coalesced read is split back into frames.
#![allow(unsafe_code)]

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::types::{BufRingEntry, RecvMsgOut, Timespec};
use io_uring::{IoUring, cqueue, opcode, types};

use super::offload::{Offload, OffloadState, gro_segments};
use super::portable::{ControlBuf, addr_of, enlarge_buffers, gro_segment, gso_refused, probe_offload};

/// Provided receive buffers (a power of two).
const RX_BUFFERS: u16 = 64;
/// Bytes per receive buffer: the recvmsg header, the source address, the control message
/// (GRO's segment size), one datagram (or a coalesced read). A multiple of 8: each buffer,
/// and the control message in it, is aligned for `cmsghdr`.
const RX_BUF_SIZE: usize = 16 + 128 + RX_CONTROL + 65536;
/// Control-message room of a multishot receive.
const RX_CONTROL: usize = std::mem::size_of::<ControlBuf>();
/// Send operations in flight at most.
const TX_SLOTS: usize = 64;
/// Buffer group of the receive ring.
const BGID: u16 = 7;
const RECV_TAG: u64 = u64::MAX;
/// The single-shot `MSG_DONTWAIT` receives of the spinning mode: `POLL_TAG + i` for buffer i.
const POLL_TAG: u64 = 1 << 32;
/// Single-shot receives submitted together at most (while datagrams keep coming).
const POLL_BATCH: usize = 8;
/// Cancellation of the multishot receive.
const CANCEL_TAG: u64 = u64::MAX - 2;
/// Sends of borrowed frames (`send_borrowed`), waited for before it returns.
const BORROWED_TAG: u64 = u64::MAX - 3;
/// GSO sends of borrowed frames (a SendMsg carrying a run of them), waited for the same way.
const BORROWED_GSO_TAG: u64 = u64::MAX - 4;
/// Zero-copy sends of borrowed frames (`SEND_ZC`, `SENDMSG_ZC`): each completes twice, with
/// its result and then (flagged MORE first) with the notification that the kernel is done
/// with the bytes; the borrow lasts until the second.
const BORROWED_ZC_TAG: u64 = u64::MAX - 5;
/// Pages a zero-copy GSO unit may span: the kernel's `MAX_SKB_FRAGS` (17), less one for the
/// headers' own.
const ZC_MAX_PAGES: usize = 16;

/// The 4 KiB pages `frames` lie in, counted per frame (each is its own run of fragments).
fn pages_spanned(frames: &[&[u8]]) -> usize {
    frames
        .iter()
        .map(|f| {
            let start = f.as_ptr() as usize;
            (start + f.len().max(1) - 1) / 4096 - start / 4096 + 1
        })
        .sum()
}

/// `IORING_SEND_ZC_REPORT_USAGE`: the notification says whether the kernel copied after all.
const ZC_REPORT_USAGE: u16 = 1 << 3;
/// The socket, registered with the ring as fixed file 0 (no file lookup per operation).
const SOCKET: types::Fixed = types::Fixed(0);

struct PollRecv {
    bytes: Vec<u8>,
    addr: libc::sockaddr_storage,
    iov: libc::iovec,
    msg: libc::msghdr,
    control: ControlBuf,
}

struct SendSlot {
    bytes: Vec<u8>,
    addr: libc::sockaddr_storage,
}

/// A UDP socket driven through io_uring.
pub struct UringUdp {
    ring: IoUring,
    /// The ring signals pending completion work with a flag (see `bind`).
    taskrun_flag: bool,
    socket: UdpSocket,
    ring_entries: *mut BufRingEntry,
    ring_layout: Layout,
    rx_bufs: Vec<u8>,
    rx_tail: u16,
    /// The template the kernel reads for each multishot completion (name length).
    rx_msg: Box<libc::msghdr>,
    /// The multishot receive is in the kernel (from arming to its last completion).
    recv_armed: bool,
    /// A cancellation of the multishot receive was submitted.
    cancel_sent: bool,
    /// Receive through the multishot (sleeping) rather than single-shot polls (spinning).
    sleeping: bool,
    /// The spinning mode's receives: datagram buffers with their address, iovec and msghdr,
    /// each owned by its single-shot receive while in flight.
    polls: Box<[PollRecv]>,
    polls_in_flight: usize,
    /// How many single-shot receives the next poll submits: one after a poll that found
    /// nothing, up to `POLL_BATCH` while every one of them finds a datagram.
    poll_batch: usize,
    /// The peer the socket is connected to: sends to it go without an address, and the
    /// spinning receives are plain Recv (no msghdr for the kernel to copy in).
    connected: Option<SocketAddr>,
    /// Slots never move: the kernel holds pointers into them while a send is in flight.
    slots: Box<[SendSlot]>,
    free: Vec<usize>,
    /// Sends of borrowed frames not yet completed (only inside `send_borrowed`).
    borrowed_in_flight: usize,
    /// The destination of borrowed frames, for the kernel to read while they are in flight.
    borrowed_addr: libc::sockaddr_storage,
    /// Completions read while waiting for sends, left for `reap`: (user data, result, flags).
    deferred: std::collections::VecDeque<(u64, i32, u32)>,
    /// The ring failed while Sends of borrowed frames may still sit in its submission queue,
    /// pointing at memory that is no longer theirs: nothing may enter it again.
    broken: bool,
    unsubmitted: usize,
    truncated: u64,
    send_errors: u64,
    /// GSO and GRO as probed and used.
    offload: OffloadState,
    /// The GSO units of one `send_borrowed`: headers, iovecs and control messages the kernel
    /// reads while they are in flight (sized before any is pushed, so they do not move).
    gso_msgs: Vec<libc::msghdr>,
    gso_iovs: Vec<libc::iovec>,
    gso_ctrl: Vec<ControlBuf>,
}

// SAFETY: the raw pointer refers to memory this value owns exclusively.
unsafe impl Send for UringUdp {}

impl UringUdp {
    /// Binds a UDP socket and sets up the ring, or says why io_uring cannot be used here;
    /// with GSO and GRO where the kernel has them.
    pub fn bind(addr: SocketAddr) -> io::Result<UringUdp> {
        UringUdp::bind_with(addr, Offload::AUTO)
    }

    /// [`UringUdp::bind`], using of GSO and GRO what `offload` asks for and the kernel
    /// allows.
    pub fn bind_with(addr: SocketAddr, offload: Offload) -> io::Result<UringUdp> {
        // Blocking on purpose: io_uring honours O_NONBLOCK, and would fail a send to a full
        // socket buffer with EAGAIN (and end the multishot receive) instead of waiting for room.
        let socket = UdpSocket::bind(addr)?;
        enlarge_buffers(&socket);
        let mut offload_state = probe_offload(&socket, offload);
        offload_state.zero_copy_send = offload.zero_copy_send;
        offload_state.dont_fragment = super::path::set_dont_fragment(&socket);
        let offload = offload_state;
        // COOP_TASKRUN with TASKRUN_FLAG: the kernel does not interrupt this thread to post
        // completions (interrupts are slow on virtual machines); it raises a flag in shared
        // memory instead, and `reap` enters the kernel only when that flag is set. Older
        // kernels get a plain ring.
        let (ring, taskrun_flag) =
            match IoUring::builder().setup_coop_taskrun().setup_taskrun_flag().build(256) {
                Ok(r) => (r, true),
                Err(_) => (IoUring::new(256)?, false),
            };
        let ring_layout =
            Layout::from_size_align(RX_BUFFERS as usize * std::mem::size_of::<BufRingEntry>(), 4096)
                .map_err(|e| io::Error::other(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let ring_entries = unsafe { alloc_zeroed(ring_layout) } as *mut BufRingEntry;
        if ring_entries.is_null() {
            return Err(io::Error::other("cannot allocate the provided-buffer ring"));
        }
        // SAFETY: zeroed msghdr is valid; only msg_namelen matters to a multishot RecvMsg.
        let mut rx_msg: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        rx_msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if offload.gro {
            rx_msg.msg_controllen = RX_CONTROL as _;
        }
        let slots: Box<[SendSlot]> = (0..TX_SLOTS)
            .map(|_| SendSlot {
                bytes: Vec::new(),
                // SAFETY: plain old data, zero is valid.
                addr: unsafe { std::mem::zeroed() },
            })
            .collect();
        let mut u = UringUdp {
            ring,
            taskrun_flag,
            socket,
            ring_entries,
            ring_layout,
            rx_bufs: vec![0u8; RX_BUFFERS as usize * RX_BUF_SIZE],
            rx_tail: 0,
            rx_msg,
            recv_armed: false,
            cancel_sent: false,
            sleeping: false,
            polls: (0..POLL_BATCH)
                .map(|_| PollRecv {
                    bytes: vec![0u8; 65536],
                    // SAFETY: plain old data, zero is valid.
                    addr: unsafe { std::mem::zeroed() },
                    iov: libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 },
                    // SAFETY: plain old data, zero is valid.
                    msg: unsafe { std::mem::zeroed() },
                    control: ControlBuf::default(),
                })
                .collect(),
            polls_in_flight: 0,
            poll_batch: 1,
            connected: None,
            slots,
            free: (0..TX_SLOTS).rev().collect(),
            borrowed_in_flight: 0,
            // SAFETY: plain old data, zero is valid.
            borrowed_addr: unsafe { std::mem::zeroed() },
            deferred: std::collections::VecDeque::new(),
            broken: false,
            unsubmitted: 0,
            truncated: 0,
            send_errors: 0,
            offload,
            gso_msgs: Vec::new(),
            gso_iovs: Vec::new(),
            gso_ctrl: Vec::new(),
        };
        // The socket as a fixed file: each operation skips a file-table lookup and its
        // reference count.
        u.ring.submitter().register_files(&[u.socket.as_raw_fd()])?;
        // SAFETY: the ring memory is page-aligned, holds RX_BUFFERS entries, and lives (not
        // moving) until drop, which unregisters it first.
        unsafe {
            u.ring.submitter().register_buf_ring_with_flags(u.ring_entries as u64, RX_BUFFERS, BGID, 0)?
        };
        for bid in 0..RX_BUFFERS {
            u.provide(bid);
        }
        u.publish_tail();
        Ok(u)
    }

    /// Whether io_uring works on this kernel: sets up a ring and a buffer ring on a scratch
    /// socket. The error says why not.
    pub fn probe() -> io::Result<()> {
        let mut u = UringUdp::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        u.arm_recv()?;
        u.ring.submit()?;
        Ok(())
    }

    /// Sends that failed (counted, not retried: the link layer replays).
    pub fn send_errors(&self) -> u64 {
        self.send_errors
    }

    /// Datagrams dropped because they did not fit a receive buffer.
    pub fn truncated(&self) -> u64 {
        self.truncated
    }

    /// Puts buffer `bid` at the ring's tail (published by `publish_tail`).
    fn provide(&mut self, bid: u16) {
        let mask = RX_BUFFERS - 1;
        let idx = (self.rx_tail & mask) as usize;
        // SAFETY: idx < RX_BUFFERS, inside the ring allocation; the kernel only reads entries
        // between its head and the published tail, and this one is beyond the tail.
        let e = unsafe { &mut *self.ring_entries.add(idx) };
        e.set_addr(self.rx_bufs[bid as usize * RX_BUF_SIZE..].as_ptr() as u64);
        e.set_len(RX_BUF_SIZE as u32);
        e.set_bid(bid);
        self.rx_tail = self.rx_tail.wrapping_add(1);
    }

    fn publish_tail(&self) {
        // SAFETY: the tail shares memory with entry 0's reserved field, as the kernel ABI
        // defines; it is a naturally aligned u16 written only here.
        let tail = unsafe { &*(BufRingEntry::tail(self.ring_entries) as *const AtomicU16) };
        tail.store(self.rx_tail, Ordering::Release);
    }

    fn arm_recv(&mut self) -> io::Result<()> {
        let op = opcode::RecvMsgMulti::new(SOCKET, &*self.rx_msg, BGID).build().user_data(RECV_TAG);
        self.push(op)?;
        self.recv_armed = true;
        Ok(())
    }

    fn push(&mut self, op: io_uring::squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every pointer in `op` refers to memory owned by self that stays put
            // until the operation completes (slots, rx_msg, buffer ring).
            if unsafe { self.ring.submission().push(&op) }.is_ok() {
                self.unsubmitted += 1;
                return Ok(());
            }
            self.ring.submit()?;
            self.unsubmitted = 0;
        }
    }

    /// A send completed: its slot is free again (or one fewer borrowed frame is in flight).
    fn send_done(&mut self, user_data: u64, result: i32) {
        if result < 0 {
            // The network's loss: the link layer replays what mattered.
            self.send_errors += 1;
            // Larger than the path (Don't Fragment set) — a GSO unit's refusal is GSO's.
            if user_data != BORROWED_GSO_TAG && super::path::too_large(Some(-result)) {
                self.offload.too_large += 1;
            }
            if -result == libc::ECONNREFUSED {
                self.offload.port_unreachable += 1;
            }
        }
        if user_data == BORROWED_GSO_TAG && result < 0 && gso_refused(&io::Error::from_raw_os_error(-result))
        {
            // Its frames are lost (the link replays them); later ones go without GSO.
            self.offload.gso = false;
            self.offload.gso_off =
                Some(format!("a GSO send was refused: {}", io::Error::from_raw_os_error(-result)));
        }
        if user_data == BORROWED_TAG || user_data == BORROWED_GSO_TAG || user_data == BORROWED_ZC_TAG {
            // Saturating: after a failed wait the count was given up (see `send_borrowed`).
            self.borrowed_in_flight = self.borrowed_in_flight.saturating_sub(1);
        } else {
            self.free.push(user_data as usize);
        }
    }

    /// A zero-copy send's completion: its result (the borrow goes on if a notification is to
    /// follow), or the notification (the kernel is done with the bytes).
    fn zero_copy_done(&mut self, result: i32, flags: u32) {
        if cqueue::notif(flags) {
            // The notification's high bit (IORING_NOTIF_USAGE_ZC_COPIED) says the kernel
            // copied the bytes after all.
            if result as u32 & 1 << 31 != 0 {
                self.offload.zero_copy_copied += 1;
            }
            self.borrowed_in_flight = self.borrowed_in_flight.saturating_sub(1);
        } else if cqueue::more(flags) {
            if result < 0 {
                self.send_errors += 1;
            }
        } else {
            self.send_done(BORROWED_ZC_TAG, result);
        }
    }

    /// Reads the completion queue for sends: their slots come back; every other completion
    /// (a received datagram, say) waits in `deferred` for `reap`, nothing lost.
    fn collect_sends(&mut self) {
        loop {
            let Some(c) = self.ring.completion().next() else { break };
            let (t, result, flags) = (c.user_data(), c.result(), c.flags());
            if t == BORROWED_ZC_TAG {
                self.zero_copy_done(result, flags);
            } else if t == BORROWED_TAG || t == BORROWED_GSO_TAG || t < TX_SLOTS as u64 {
                self.send_done(t, result);
            } else {
                self.deferred.push_back((t, result, flags));
            }
        }
    }

    /// Submits what is queued and waits for one completion, through interruptions, a full
    /// completion queue (whose entries `collect_sends` moves aside) and a momentary lack of
    /// kernel memory.
    fn submit_and_wait_one(&mut self) -> io::Result<()> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {
                    self.unsubmitted = 0;
                    return Ok(());
                }
                Err(e)
                    if e.kind() == io::ErrorKind::Interrupted
                        || matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EAGAIN)) =>
                {
                    self.collect_sends();
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Refuses to enter a ring that `send_borrowed` had to give up on.
    fn usable(&self) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::other(
                "io_uring driver unusable: its ring failed while sending borrowed frames",
            ));
        }
        Ok(())
    }

    /// Queues the spinning mode's single-shot receive into buffer `i`: `MSG_DONTWAIT` makes
    /// the kernel complete it inline, with a datagram or `EAGAIN`, instead of arming a poll.
    /// Several submitted together complete in order, each with the next datagram.
    fn push_poll_recv(&mut self, i: usize) -> io::Result<()> {
        let p = &mut self.polls[i];
        p.iov = libc::iovec { iov_base: p.bytes.as_mut_ptr() as *mut libc::c_void, iov_len: p.bytes.len() };
        p.msg.msg_name = &mut p.addr as *mut _ as *mut libc::c_void;
        p.msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        p.msg.msg_iov = &mut p.iov;
        p.msg.msg_iovlen = 1;
        p.msg.msg_flags = 0;
        if self.offload.gro {
            p.msg.msg_control = p.control.0.as_mut_ptr() as *mut libc::c_void;
            p.msg.msg_controllen = std::mem::size_of::<ControlBuf>() as _;
        }
        // A plain Recv to the connected peer saves the msghdr, unless GRO's control message
        // must come back.
        let op = if self.connected.is_some() && !self.offload.gro {
            opcode::Recv::new(SOCKET, p.bytes.as_mut_ptr(), p.bytes.len() as u32)
                .flags(libc::MSG_DONTWAIT)
                .build()
        } else {
            opcode::RecvMsg::new(SOCKET, &mut p.msg).flags(libc::MSG_DONTWAIT as u32).build()
        }
        .user_data(POLL_TAG + i as u64);
        self.push(op)?;
        self.polls_in_flight += 1;
        Ok(())
    }

    /// Reads the completion queue: send slots come back, datagrams go to `f`. Spinning, it
    /// first submits the single-shot receives (with whatever sends are queued).
    fn reap(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        let polled = !self.sleeping && !self.recv_armed && self.polls_in_flight == 0;
        if polled {
            for i in 0..self.poll_batch {
                self.push_poll_recv(i)?;
            }
            self.ring.submit()?;
            self.unsubmitted = 0;
        } else if self.taskrun_flag && self.ring.completion().is_empty() && self.ring.submission().taskrun() {
            // Completion work is pending in the kernel: one enter runs it.
            self.ring.submit()?;
            self.unsubmitted = 0;
        }
        let mut received = 0;
        let mut polls_filled = 0;
        let mut returned = false;
        let mut error = None;
        loop {
            // Completions read while waiting for sends come first: they are older.
            let next = self.deferred.pop_front();
            let next = next
                .or_else(|| self.ring.completion().next().map(|c| (c.user_data(), c.result(), c.flags())));
            let Some((user_data, result, flags)) = next else { break };
            match user_data {
                t if (POLL_TAG..POLL_TAG + POLL_BATCH as u64).contains(&t) => {
                    self.polls_in_flight -= 1;
                    let p = &self.polls[(t - POLL_TAG) as usize];
                    if result > 0 {
                        polls_filled += 1;
                        if p.msg.msg_flags & libc::MSG_TRUNC != 0 {
                            self.truncated += 1;
                        } else if let Some(from) = self.connected.or_else(|| addr_of(&p.addr)) {
                            let segment = if self.offload.gro { gro_segment(&p.msg) } else { None };
                            self.offload.gro_reads += segment.is_some() as u64;
                            for frame in gro_segments(&p.bytes[..result as usize], segment) {
                                f(from, frame);
                                received += 1;
                            }
                        }
                    } else if result < 0 && -result != libc::EAGAIN {
                        error = Some(io::Error::from_raw_os_error(-result));
                    }
                }
                CANCEL_TAG => {}
                BORROWED_TAG | BORROWED_GSO_TAG => self.send_done(user_data, result),
                BORROWED_ZC_TAG => self.zero_copy_done(result, flags),
                RECV_TAG => {
                    if !cqueue::more(flags) {
                        self.recv_armed = false;
                        self.cancel_sent = false;
                    }
                    if result < 0 {
                        // ENOBUFS: every buffer was in use; re-arming after returning them
                        // fixes it. ECANCELED: switched to spinning.
                        if -result != libc::ENOBUFS && -result != libc::ECANCELED {
                            error = Some(io::Error::from_raw_os_error(-result));
                        }
                        continue;
                    }
                    let Some(bid) = cqueue::buffer_select(flags) else { continue };
                    received += self.deliver_multishot(bid, result as usize, f);
                    self.provide(bid);
                    returned = true;
                }
                slot => self.send_done(slot, result),
            }
        }
        if returned {
            self.publish_tail();
        }
        if polled {
            self.poll_batch = if polls_filled == self.poll_batch {
                (self.poll_batch * 2).min(POLL_BATCH)
            } else {
                polls_filled.max(1)
            };
        }
        if self.sleeping && !self.recv_armed {
            self.arm_recv()?;
            self.ring.submit()?;
            self.unsubmitted = 0;
        } else if !self.sleeping && self.recv_armed && !self.cancel_sent {
            // Back to spinning: the multishot receive ends; what it still completes comes
            // first, then the single-shot receives take over.
            let op = opcode::AsyncCancel::new(RECV_TAG).build().user_data(CANCEL_TAG);
            self.push(op)?;
            self.cancel_sent = true;
            self.ring.submit()?;
            self.unsubmitted = 0;
        }
        match error {
            Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                self.offload.port_unreachable += 1;
                Ok(received)
            }
            Some(e) => Err(e),
            None => Ok(received),
        }
    }

    /// The datagram the multishot receive put in provided buffer `bid` (`len` bytes with
    /// its header, address and control data) handed to `f`, frame by frame where GRO
    /// coalesced it; how many frames.
    fn deliver_multishot(&mut self, bid: u16, len: usize, f: &mut dyn FnMut(SocketAddr, &[u8])) -> usize {
        let mut received = 0;
        let start = bid as usize * RX_BUF_SIZE;
        let buf = &self.rx_bufs[start..start + len.min(RX_BUF_SIZE)];
        if let Ok(out) = RecvMsgOut::parse(buf, &self.rx_msg) {
            if out.is_payload_truncated() {
                self.truncated += 1;
            } else {
                let mut ss: libc::sockaddr_storage =
                    // SAFETY: plain old data, zero is valid.
                    unsafe { std::mem::zeroed() };
                let name = out.name_data();
                let n = name.len().min(std::mem::size_of::<libc::sockaddr_storage>());
                // SAFETY: copying at most sizeof(sockaddr_storage) bytes into it.
                unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), &mut ss as *mut _ as *mut u8, n) };
                let segment = if self.offload.gro {
                    let control = out.control_data();
                    // SAFETY: plain old data, zero is valid.
                    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
                    m.msg_control = control.as_ptr() as *mut libc::c_void;
                    m.msg_controllen = control.len() as _;
                    gro_segment(&m)
                } else {
                    None
                };
                if let Some(from) = addr_of(&ss) {
                    self.offload.gro_reads += segment.is_some() as u64;
                    for frame in gro_segments(out.payload_data(), segment) {
                        f(from, frame);
                        received += 1;
                    }
                }
            }
        }
        received
    }
}

impl Drop for UringUdp {
    fn drop(&mut self) {
        // Nothing of ours may stay in the kernel: the ring's own teardown is deferred to a
        // kernel worker, and until it runs the requests in flight and the registered file
        // table hold the socket, and with it the port (a restarted endpoint's bind failed
        // with EADDRINUSE). So every request in flight is cancelled here, synchronously
        // (their buffers are ours until then), the socket is unregistered, and the buffer
        // ring is given back; dropping the ring and the socket then frees the port at once.
        let submitter = self.ring.submitter();
        let bounded = Some(Timespec::new().sec(1));
        if submitter.register_sync_cancel(bounded, types::CancelBuilder::any()).is_err() {
            // Before Linux 6.0: an asynchronous cancellation of everything, waited for.
            let op = opcode::AsyncCancel2::new(types::CancelBuilder::any()).build().user_data(CANCEL_TAG);
            // SAFETY: the entry refers to no memory.
            if unsafe { self.ring.submission().push(&op) }.is_ok() {
                let _ = self.ring.submit_and_wait(1);
            }
        }
        let submitter = self.ring.submitter();
        let _ = submitter.unregister_files();
        // Stop the kernel using our buffers before they are freed.
        let _ = submitter.unregister_buf_ring(BGID);
        // SAFETY: allocated in `bind` with this layout, unregistered above, freed once.
        unsafe { dealloc(self.ring_entries as *mut u8, self.ring_layout) };
    }
}

mod datagrams;
#[cfg(test)]
mod tests;
