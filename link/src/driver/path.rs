//! The path a link's datagrams take: sent with Don't Fragment set, so that the kernel
//! refuses a datagram larger than the path (`EMSGSIZE`, counted and dropped as the network
//! would drop it) rather than sending it in IP fragments, where one fragment lost loses the
//! whole datagram; and [`path_mtu`], the largest datagram the route to a peer carries
//! whole, which an attach compares with the link's `mtu` before it proposes one.
//!
//! A link's `mtu` is the UDP payload: on an IPv4 path the interface MTU less 28 bytes (the
//! IP header's 20 and UDP's 8), on IPv6 less 48 (40 and 8) — 1472 and 8972 on 1500- and
//! 9000-byte Ethernet.
#![allow(unsafe_code)]

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

/// IP and UDP header bytes in front of a datagram's payload on the path to `peer`.
pub fn header_bytes(peer: SocketAddr) -> usize {
    if peer.is_ipv4() { 20 + 8 } else { 40 + 8 }
}

/// The route to a peer: its MTU and the largest link datagram it carries whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathMtu {
    /// The route's MTU as the kernel knows it (the interface's, or less where an ICMP
    /// "fragmentation needed" or "packet too big" said so).
    pub mtu: usize,
    /// The largest UDP payload that goes whole: `mtu` less the IP and UDP headers.
    pub datagram: usize,
}

/// The route's MTU to `peer`, from a UDP socket connected to it (nothing is sent): what
/// `getsockopt(IP_MTU)` (`IPV6_MTU`) says.
pub fn path_mtu(peer: SocketAddr) -> io::Result<PathMtu> {
    let any: SocketAddr = if peer.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let s = UdpSocket::bind(any)?;
    s.connect(peer)?;
    let (level, name) =
        if peer.is_ipv4() { (libc::IPPROTO_IP, libc::IP_MTU) } else { (libc::IPPROTO_IPV6, libc::IPV6_MTU) };
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes (one c_int) into `v`, which lives
    // through the call.
    let r = unsafe {
        libc::getsockopt(s.as_raw_fd(), level, name, &mut v as *mut _ as *mut libc::c_void, &mut len)
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("the route's MTU to {peer} (getsockopt IP_MTU): {e}")));
    }
    let mtu = usize::try_from(v).unwrap_or(0);
    Ok(PathMtu { mtu, datagram: mtu.saturating_sub(header_bytes(peer)) })
}

/// Sets Don't Fragment on `socket`'s datagrams (`IP_PMTUDISC_DO`, and its IPv6 twin on an
/// IPv6 socket): the kernel sends none larger than the path's MTU and says `EMSGSIZE`
/// instead. False where the socket refuses it.
pub(super) fn set_dont_fragment(socket: &UdpSocket) -> bool {
    let v6 = socket.local_addr().is_ok_and(|a| a.is_ipv6());
    let mut opts = vec![(libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)];
    if v6 {
        opts.push((libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_DO));
    }
    let mut ok = false;
    for (level, name, value) in opts {
        // SAFETY: setsockopt reads one c_int from a valid pointer.
        let r = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                level,
                name,
                &value as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        ok |= r == 0;
    }
    ok
}

/// Whether a send failed because its datagram is larger than the path allows (Don't
/// Fragment set).
pub(super) fn too_large(errno: Option<i32>) -> bool {
    errno == Some(libc::EMSGSIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback's route MTU is loopback's (65536 here): a datagram of 64 KiB less headers.
    #[test]
    fn the_route_to_loopback_has_loopbacks_mtu() {
        let p = path_mtu(SocketAddr::from(([127, 0, 0, 1], 9))).unwrap();
        assert!(p.mtu >= 1500, "{p:?}");
        assert_eq!(p.datagram, p.mtu - 28);
    }

    #[test]
    fn dont_fragment_is_set_and_a_datagram_over_the_path_is_refused() {
        let rx = UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let tx = UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        assert!(set_dont_fragment(&tx));
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let p = path_mtu(rx.local_addr().unwrap()).unwrap();
        // Within the path: sent. Past it (and within UDP's limit): refused, not fragmented.
        tx.send(&vec![0u8; p.datagram]).unwrap();
        if p.datagram < 65507 {
            let e = tx.send(&vec![0u8; p.datagram + 1]).unwrap_err();
            assert!(too_large(e.raw_os_error()), "{e}");
        }
    }
}
