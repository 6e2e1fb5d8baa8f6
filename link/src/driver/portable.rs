//! The portable driver: a non-blocking UDP socket, `sendmmsg` / `recvmmsg` through libc to
//! batch datagrams, `ppoll` to sleep. Runs on any Linux kernel. Where the kernel has them,
//! runs of equal-sized frames leave as UDP GSO units (one `mmsghdr` with an iovec per frame
//! and a `UDP_SEGMENT` control message) and reads come coalesced by UDP GRO, split back
//! into frames (`offload.rs`).
#![allow(unsafe_code)]

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use super::Datagrams;
use super::offload::{Offload, OffloadState, gro_segments, gso_unit};

/// Datagrams handled per system call.
const BATCH: usize = 32;
/// Largest datagram received.
const MAX_DATAGRAM: usize = 65536;

/// A UDP socket with batched I/O.
pub struct PortableUdp {
    socket: UdpSocket,
    /// Receive headers, built once: they point into `rx` and `rx_addrs`, which never move.
    rx_msgs: Vec<libc::mmsghdr>,
    /// Never read here, but kept alive: the receive headers point at these iovecs.
    #[allow(dead_code)]
    rx_iovs: Vec<libc::iovec>,
    rx_addrs: Box<[libc::sockaddr_storage]>,
    /// Send headers, reused across flushes.
    tx_msgs: Vec<libc::mmsghdr>,
    tx_iovs: Vec<libc::iovec>,
    tx_addrs: Vec<(libc::sockaddr_storage, libc::socklen_t)>,
    /// Queued outgoing datagrams: bytes back to back, and (destination, start, end).
    /// Queued datagrams' bytes: `out_bytes[..out_len]`. The buffer only grows, so that a
    /// send attempt does not zero an MTU's worth of bytes each time.
    out_bytes: Vec<u8>,
    out_len: usize,
    out: Vec<(SocketAddr, usize, usize)>,
    rx: Vec<u8>,
    /// The last receive found more than one datagram: batch the next.
    rx_busy: bool,
    /// The peer the socket is connected to: datagrams for it go without an address.
    connected: Option<SocketAddr>,
    /// GSO and GRO as probed and used.
    offload: OffloadState,
    /// Receive control-message buffers, one per receive header (GRO's segment size).
    #[allow(dead_code)]
    rx_ctrl: Box<[ControlBuf]>,
    /// Send control messages, one per GSO unit of a batch (`UDP_SEGMENT`).
    tx_ctrl: Vec<ControlBuf>,
    /// A batch's units: (first datagram, datagrams, segment size).
    tx_units: Vec<(usize, usize, usize)>,
}

/// Room for one control message with an int, aligned for `cmsghdr`.
#[derive(Clone, Copy, Default)]
#[repr(C, align(8))]
pub(super) struct ControlBuf(pub(super) [u8; 32]);

/// `CMSG_SPACE` of `len` data bytes.
fn cmsg_space(len: usize) -> usize {
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    unsafe { libc::CMSG_SPACE(len as u32) as usize }
}

/// Points `m` at `ctrl` holding one `UDP_SEGMENT` control message for `segment`.
pub(super) fn set_segment_cmsg(m: &mut libc::msghdr, ctrl: &mut ControlBuf, segment: u16) {
    m.msg_control = ctrl.0.as_mut_ptr() as *mut libc::c_void;
    m.msg_controllen = cmsg_space(std::mem::size_of::<u16>()) as _;
    // SAFETY: the control buffer is 32 bytes, aligned for cmsghdr, and CMSG_SPACE(2) = 24
    // fits it: CMSG_FIRSTHDR returns its start, and the header and the u16 after it lie
    // inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(m);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, segment);
    }
}

/// The segment size of a GRO-coalesced read, from the `UDP_GRO` control message the kernel
/// wrote into `m`'s control buffer (none: the read is one datagram).
pub(super) fn gro_segment(m: &libc::msghdr) -> Option<usize> {
    if m.msg_control.is_null() || m.msg_controllen < std::mem::size_of::<libc::cmsghdr>() {
        return None;
    }
    // SAFETY: the kernel wrote `msg_controllen` bytes of well-formed control messages into
    // the buffer `msg_control` points at; CMSG_FIRSTHDR / CMSG_NXTHDR stay inside that
    // length, and the int is read only when the header says it is there.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(m);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP
                && (*c).cmsg_type == libc::UDP_GRO
                && (*c).cmsg_len as usize
                    >= libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as usize
            {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                return usize::try_from(v).ok().filter(|v| *v > 0);
            }
            c = libc::CMSG_NXTHDR(m, c);
        }
    }
    None
}

/// Probes and turns on what `want` asks for on `socket`: GSO by setting `UDP_SEGMENT` to 0
/// (per-send control messages give the size; the option only proves the kernel has it),
/// GRO by turning `UDP_GRO` on.
pub(super) fn probe_offload(socket: &UdpSocket, want: Offload) -> OffloadState {
    let mut st = OffloadState::default();
    if want.gso {
        match set_udp_segment(socket, 0) {
            Ok(()) => st.gso = true,
            Err(e) => st.gso_off = Some(format!("refused at start: {e}")),
        }
    } else {
        st.gso_off = Some("not asked for".into());
    }
    if want.gro {
        match set_udp_gro(socket, true) {
            Ok(()) => st.gro = true,
            Err(e) => st.gro_off = Some(format!("refused at start: {e}")),
        }
    } else {
        st.gro_off = Some("not asked for".into());
    }
    st
}

/// Whether a send failed because of its `UDP_SEGMENT` (the device cannot segment or
/// checksum it, or the segment size is refused — EMSGSIZE where a segment is larger than
/// the path's MTU, which the kernel would fragment without GSO but refuses with it): then
/// the send is made again without GSO.
pub(super) fn gso_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE | libc::EOPNOTSUPP | libc::ENOPROTOOPT)
    )
}

pub(super) fn sockaddr_of(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid (unspecified) value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

pub(super) fn addr_of(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Socket buffer size asked for: room for bursts of full-size frames.
const SOCKET_BUFFER: libc::c_int = 4 << 20;

/// Enlarges the socket's send and receive buffers (forcing past the system limit where the
/// process may, else up to it). A small receive buffer turns bursts into loss.
pub(super) fn enlarge_buffers(socket: &UdpSocket) {
    for (force, plain) in [(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF), (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)] {
        let v = SOCKET_BUFFER;
        for opt in [force, plain] {
            // SAFETY: setsockopt reads one c_int from a valid pointer.
            let r = unsafe {
                libc::setsockopt(
                    socket.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    &v as *const libc::c_int as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r == 0 {
                break;
            }
        }
    }
}

impl PortableUdp {
    /// Binds a non-blocking UDP socket, with GSO and GRO where the kernel has them.
    pub fn bind(addr: SocketAddr) -> io::Result<PortableUdp> {
        PortableUdp::bind_with(addr, Offload::AUTO)
    }

    /// Binds a non-blocking UDP socket, using of GSO and GRO what `offload` asks for and
    /// the kernel allows ([`PortableUdp::offload`] says what and why not).
    pub fn bind_with(addr: SocketAddr, offload: Offload) -> io::Result<PortableUdp> {
        PortableUdp::from_socket_with(UdpSocket::bind(addr)?, offload)
    }

    /// Wraps a socket the caller bound (made non-blocking here), with GSO and GRO where the
    /// kernel has them.
    pub fn from_socket(socket: UdpSocket) -> io::Result<PortableUdp> {
        PortableUdp::from_socket_with(socket, Offload::AUTO)
    }

    /// [`PortableUdp::from_socket`] with the offloads `offload` asks for.
    pub fn from_socket_with(socket: UdpSocket, offload: Offload) -> io::Result<PortableUdp> {
        socket.set_nonblocking(true)?;
        enlarge_buffers(&socket);
        let mut offload = probe_offload(&socket, offload);
        offload.dont_fragment = super::path::set_dont_fragment(&socket);
        let mut rx_ctrl: Box<[ControlBuf]> = vec![ControlBuf::default(); BATCH].into_boxed_slice();
        let mut rx = vec![0u8; BATCH * MAX_DATAGRAM];
        let mut rx_iovs: Vec<libc::iovec> = rx
            .chunks_exact_mut(MAX_DATAGRAM)
            .map(|c| libc::iovec { iov_base: c.as_mut_ptr() as *mut libc::c_void, iov_len: MAX_DATAGRAM })
            .collect();
        // SAFETY: sockaddr_storage is plain old data; zero is valid.
        let mut rx_addrs: Box<[libc::sockaddr_storage]> =
            (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect();
        let rx_msgs = (0..BATCH)
            .map(|i| {
                // SAFETY: mmsghdr is plain old data; zero is a valid starting value.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = &mut rx_addrs[i] as *mut _ as *mut libc::c_void;
                m.msg_hdr.msg_iov = &mut rx_iovs[i];
                m.msg_hdr.msg_iovlen = 1;
                if offload.gro {
                    m.msg_hdr.msg_control = rx_ctrl[i].0.as_mut_ptr() as *mut libc::c_void;
                }
                m
            })
            .collect();
        // The heap blocks behind `rx`, `rx_iovs` and `rx_addrs` do not move when the vectors
        // are moved into the struct, so the pointers stay valid.
        Ok(PortableUdp {
            socket,
            rx_msgs,
            rx_iovs,
            rx_addrs,
            tx_msgs: Vec::with_capacity(BATCH),
            tx_iovs: Vec::with_capacity(BATCH),
            tx_addrs: Vec::with_capacity(BATCH),
            out_bytes: Vec::new(),
            out_len: 0,
            out: Vec::new(),
            rx,
            rx_busy: false,
            connected: None,
            offload,
            rx_ctrl,
            tx_ctrl: Vec::with_capacity(BATCH),
            tx_units: Vec::with_capacity(BATCH),
        })
    }
}

impl PortableUdp {
    /// The `i`th datagram of a send: the queued ones first, then `frames` (for `to`).
    fn outgoing<'a>(&'a self, i: usize, to: SocketAddr, frames: &[&'a [u8]]) -> (SocketAddr, &'a [u8]) {
        match self.out.get(i) {
            Some(&(dest, start, end)) => (dest, &self.out_bytes[start..end]),
            None => (to, frames[i - self.out.len()]),
        }
    }

    /// Sends the queued datagrams, then `frames` to `to`, in order, in as few system calls
    /// as the batch size allows: one datagram by `sendto`, more by `sendmmsg`. The kernel has
    /// read every byte when this returns.
    fn send_all(&mut self, to: SocketAddr, frames: &[&[u8]]) -> io::Result<()> {
        let total = self.out.len() + frames.len();
        let result = if total == 1 { self.send_one(to, frames) } else { self.send_many(total, to, frames) };
        self.out.clear();
        self.out_len = 0;
        result
    }

    fn send_one(&mut self, to: SocketAddr, frames: &[&[u8]]) -> io::Result<()> {
        // One datagram: plain sendto, the kernel's shortest path (without an address to the
        // connected peer, whose route the socket keeps).
        let (dest, bytes) = self.outgoing(0, to, frames);
        let addr = (self.connected != Some(dest)).then(|| sockaddr_of(&dest));
        let (name, len) = match &addr {
            Some((ss, len)) => (ss as *const _ as *const libc::sockaddr, *len),
            None => (std::ptr::null(), 0),
        };
        loop {
            // SAFETY: `bytes` and `ss` are valid for the lengths given during the call (a
            // null address with length 0 means the connected peer).
            let r = unsafe {
                libc::sendto(
                    self.socket.as_raw_fd(),
                    bytes.as_ptr() as *const libc::c_void,
                    bytes.len(),
                    0,
                    name,
                    len,
                )
            };
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => continue,
                // A datagram to an unreachable port is the network's loss, not ours.
                io::ErrorKind::ConnectionRefused => {
                    self.offload.port_unreachable += 1;
                    return Ok(());
                }
                // Larger than the path (Don't Fragment set): dropped, as the network would.
                _ if super::path::too_large(e.raw_os_error()) => {
                    self.offload.too_large += 1;
                    return Ok(());
                }
                _ => return Err(e),
            }
        }
    }

    /// Sends datagrams `0..total` (see [`PortableUdp::outgoing`]) by `sendmmsg`, up to
    /// `BATCH` headers a call, each header one GSO unit (a run of equal-sized datagrams for
    /// one destination, the last perhaps shorter) or one datagram.
    fn send_many(&mut self, total: usize, to: SocketAddr, frames: &[&[u8]]) -> io::Result<()> {
        let mut done = 0;
        while done < total {
            let gso = self.offload.gso;
            let mut units = std::mem::take(&mut self.tx_units);
            units.clear();
            let mut end = done;
            while end < total && units.len() < BATCH {
                let (count, segment) = if gso {
                    gso_unit(end, total, &|k| {
                        let (d, b) = self.outgoing(k, to, frames);
                        (d, b.len())
                    })
                } else {
                    (1, 0)
                };
                units.push((end, count, segment));
                end += count;
            }
            // Addresses only for units not bound for the connected peer.
            let connected = self.connected;
            let mut addrs = std::mem::take(&mut self.tx_addrs);
            let mut iovs = std::mem::take(&mut self.tx_iovs);
            let mut ctrl = std::mem::take(&mut self.tx_ctrl);
            addrs.clear();
            iovs.clear();
            ctrl.clear();
            for i in done..end {
                let (_, bytes) = self.outgoing(i, to, frames);
                iovs.push(libc::iovec {
                    iov_base: bytes.as_ptr() as *mut libc::c_void,
                    iov_len: bytes.len(),
                });
            }
            for &(first, ..) in &units {
                let dest = self.outgoing(first, to, frames).0;
                if connected != Some(dest) {
                    addrs.push(sockaddr_of(&dest));
                }
            }
            ctrl.resize(units.len(), ControlBuf::default());
            self.tx_msgs.clear();
            let mut addr = 0;
            for (k, &(first, count, segment)) in units.iter().enumerate() {
                // SAFETY: mmsghdr is plain old data; zero is a valid starting value.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                if connected != Some(self.outgoing(first, to, frames).0) {
                    m.msg_hdr.msg_name = &mut addrs[addr].0 as *mut _ as *mut libc::c_void;
                    m.msg_hdr.msg_namelen = addrs[addr].1;
                    addr += 1;
                }
                m.msg_hdr.msg_iov = &mut iovs[first - done];
                m.msg_hdr.msg_iovlen = count as _;
                if count > 1 {
                    set_segment_cmsg(&mut m.msg_hdr, &mut ctrl[k], segment as u16);
                }
                self.tx_msgs.push(m);
            }
            // SAFETY: every pointer in `tx_msgs` refers to `addrs`, `iovs`, `ctrl`,
            // `out_bytes` or `frames`, alive and unmoved until the call returns; the count
            // matches.
            let n = unsafe {
                libc::sendmmsg(
                    self.socket.as_raw_fd(),
                    self.tx_msgs.as_mut_ptr(),
                    self.tx_msgs.len() as u32,
                    0,
                )
            };
            self.tx_addrs = addrs;
            self.tx_iovs = iovs;
            self.tx_ctrl = ctrl;
            let first_count = units.first().map_or(1, |u| u.1);
            let sent: usize = units.iter().take(n.max(0) as usize).map(|u| u.1).sum();
            self.offload.gso_sends += units.iter().take(n.max(0) as usize).filter(|u| u.1 > 1).count() as u64;
            self.tx_units = units;
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => continue,
                    // A datagram to an unreachable port is the network's loss, not ours.
                    io::ErrorKind::ConnectionRefused => {
                        self.offload.port_unreachable += 1;
                        done += first_count;
                        continue;
                    }
                    _ if first_count > 1 && gso_refused(&e) => {
                        // Sent again below, a datagram per header, and from now on.
                        self.offload.gso = false;
                        self.offload.gso_off = Some(format!("a GSO send was refused: {e}"));
                        continue;
                    }
                    // Larger than the path (Don't Fragment set): dropped, as the network
                    // would drop it, for the link to replay; the rest go on.
                    _ if super::path::too_large(e.raw_os_error()) => {
                        self.offload.too_large += first_count as u64;
                        done += first_count;
                        continue;
                    }
                    _ => return Err(e),
                }
            }
            done += sent;
        }
        Ok(())
    }
}

// SAFETY: the raw pointers in the headers refer to heap memory this value owns exclusively.
unsafe impl Send for PortableUdp {}

impl Datagrams for PortableUdp {
    fn send_with(
        &mut self,
        to: SocketAddr,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> io::Result<usize> {
        let start = self.out_len;
        if self.out_bytes.len() < start + max {
            self.out_bytes.resize(start + max, 0);
        }
        let n = fill(&mut self.out_bytes[start..start + max]).min(max);
        self.out_len = start + n;
        if n > 0 {
            self.out.push((to, start, start + n));
            if self.out.len() >= BATCH {
                self.flush()?;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        // No borrowed frames: their destination is never read.
        self.send_all(SocketAddr::from(([0, 0, 0, 0], 0)), &[])
    }
    fn send_borrowed(&mut self, to: SocketAddr, frames: &[&[u8]]) -> io::Result<()> {
        self.send_all(to, frames)
    }
    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        if !self.rx_busy {
            // Idle: probe for one datagram, by the kernel's shortest path — recvfrom, or with
            // GRO one recvmsg, whose control message says whether the read is coalesced.
            let n = if self.offload.gro {
                let m = &mut self.rx_msgs[0].msg_hdr;
                m.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                m.msg_controllen = std::mem::size_of::<ControlBuf>() as _;
                // SAFETY: the header points into `rx_addrs`, `rx_iovs`, `rx_ctrl` and `rx`,
                // owned by self and never moved.
                unsafe { libc::recvmsg(self.socket.as_raw_fd(), m, libc::MSG_DONTWAIT) }
            } else {
                let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                // SAFETY: the buffer and address storage are valid for the lengths given.
                unsafe {
                    libc::recvfrom(
                        self.socket.as_raw_fd(),
                        self.rx.as_mut_ptr() as *mut libc::c_void,
                        MAX_DATAGRAM,
                        libc::MSG_DONTWAIT,
                        &mut self.rx_addrs[0] as *mut _ as *mut libc::sockaddr,
                        &mut len,
                    )
                }
            };
            if n < 0 {
                // Nothing there, most of a busy poll's passes: the errno compared as it is
                // (`ErrorKind` would decode it first).
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::ECONNREFUSED) => {
                        self.offload.port_unreachable += 1;
                        Ok(0)
                    }
                    Some(libc::EAGAIN | libc::EINTR) => Ok(0),
                    _ => Err(e),
                };
            }
            let segment = if self.offload.gro { gro_segment(&self.rx_msgs[0].msg_hdr) } else { None };
            let mut got = 0;
            if let Some(from) = addr_of(&self.rx_addrs[0]) {
                self.offload.gro_reads += segment.is_some() as u64;
                for frame in gro_segments(&self.rx[..(n as usize).min(MAX_DATAGRAM)], segment) {
                    f(from, frame);
                    got += 1;
                }
            }
            // More may be waiting: take a batch next.
            self.rx_busy = true;
            return Ok(got);
        }
        let mut total = 0;
        let vlen = BATCH;
        loop {
            let gro = self.offload.gro;
            for m in &mut self.rx_msgs {
                m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                if gro {
                    m.msg_hdr.msg_controllen = std::mem::size_of::<ControlBuf>() as _;
                }
                m.msg_len = 0;
            }
            // SAFETY: the headers point into `rx_addrs`, `rx_iovs` and `rx`, owned by self and
            // never moved; MSG_DONTWAIT makes the call return at once when nothing is ready.
            let n = unsafe {
                libc::recvmmsg(
                    self.socket.as_raw_fd(),
                    self.rx_msgs.as_mut_ptr(),
                    vlen as u32,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => {
                        self.rx_busy = total > 0;
                        Ok(total)
                    }
                    io::ErrorKind::ConnectionRefused => {
                        self.offload.port_unreachable += 1;
                        continue;
                    }
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            let mut frames = 0;
            for i in 0..n as usize {
                let len = (self.rx_msgs[i].msg_len as usize).min(MAX_DATAGRAM);
                let segment = if gro { gro_segment(&self.rx_msgs[i].msg_hdr) } else { None };
                if let Some(from) = addr_of(&self.rx_addrs[i]) {
                    self.offload.gro_reads += segment.is_some() as u64;
                    for frame in gro_segments(&self.rx[i * MAX_DATAGRAM..i * MAX_DATAGRAM + len], segment) {
                        f(from, frame);
                        frames += 1;
                    }
                }
            }
            total += frames;
            if (n as usize) < vlen {
                self.rx_busy = total > 1;
                return Ok(total);
            }
        }
    }

    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.socket.as_raw_fd())
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let mut pfd = libc::pollfd { fd: self.socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ts = timeout.map(|t| libc::timespec {
            tv_sec: t.as_secs() as libc::time_t,
            tv_nsec: t.subsec_nanos() as libc::c_long,
        });
        let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: one valid pollfd; the timespec (if any) lives across the call.
        let r = unsafe { libc::ppoll(&mut pfd, 1, tsp, std::ptr::null()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(())
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
        "portable"
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

/// Turns on UDP generic segmentation offload for `sock` (`UDP_SEGMENT`, Linux 4.18): from
/// now on a send of more than `segment` bytes leaves as datagrams of `segment` bytes each
/// (the last may be shorter), one system call for up to 64 of them.
pub fn set_udp_segment(sock: &UdpSocket, segment: u16) -> io::Result<()> {
    set_udp_option(sock, libc::UDP_SEGMENT, segment as libc::c_int, "UDP_SEGMENT")
}

/// Turns on UDP generic receive offload for `sock` (`UDP_GRO`, Linux 5.0): datagrams of one
/// flow that arrive together may be handed over as one read of their concatenation, each
/// of the segment size the kernel reports in a `UDP_GRO` control message (all but the last
/// of the same size).
pub fn set_udp_gro(sock: &UdpSocket, on: bool) -> io::Result<()> {
    set_udp_option(sock, libc::UDP_GRO, on as libc::c_int, "UDP_GRO")
}

fn set_udp_option(sock: &UdpSocket, option: libc::c_int, value: libc::c_int, name: &str) -> io::Result<()> {
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live c_int; the descriptor
    // is the socket's own, open for the call.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            option,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("setsockopt({name}, {value}): {e}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_segmented_send_arrives_as_datagrams_or_one_coalesced_read() {
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let plain = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gro = UdpSocket::bind("127.0.0.1:0").unwrap();
        if let Err(e) = set_udp_segment(&tx, 1000) {
            eprintln!("skipped: this kernel refuses UDP_SEGMENT ({e})");
            return;
        }
        set_udp_gro(&gro, true).unwrap();
        let buf: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        for s in [&plain, &gro] {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            tx.send_to(&buf, s.local_addr().unwrap()).unwrap();
        }
        let mut got = vec![0u8; 65536];
        let sizes: Vec<usize> = (0..3).map(|_| plain.recv(&mut got).unwrap()).collect();
        assert_eq!(sizes, vec![1000, 1000, 500], "three datagrams of the segment size");
        let mut all = Vec::new();
        while all.len() < buf.len() {
            let n = gro.recv(&mut got).unwrap();
            all.extend_from_slice(&got[..n]);
        }
        assert_eq!(all, buf, "coalesced or not, the bytes in order");
        assert!(set_udp_segment(&tx, 0).is_ok(), "0 turns segmentation off");
    }

    use super::*;

    #[test]
    fn batches_round_trip_on_loopback() {
        let mut a = PortableUdp::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut b = PortableUdp::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let to = b.local_addr().unwrap();
        for i in 0..100u8 {
            a.send_to(to, &[i; 100]).unwrap();
        }
        a.flush().unwrap();
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while got.len() < 100 && std::time::Instant::now() < deadline {
            b.wait(Some(Duration::from_millis(10))).unwrap();
            b.recv(&mut |from, d| {
                assert_eq!(from, a.local_addr().unwrap());
                got.push(d[0]);
            })
            .unwrap();
        }
        assert_eq!(got, (0..100).collect::<Vec<u8>>());
    }
}
