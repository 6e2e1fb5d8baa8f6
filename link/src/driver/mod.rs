//! UDP drivers: what moves a session's frames through the kernel. The state machine never
//! sees them. Two drivers — portable (`recvmmsg`/`sendmmsg` on a non-blocking socket) and,
//! where the kernel has it, io_uring — behind one trait, an impairment layer that wraps
//! either, and runners that drive a client session or a server endpoint over a driver in
//! busy-poll or blocking mode.
//!
//! The rooms: `datagrams` (the trait), `portable` and `uring` (the two drivers), `any` (the
//! one chosen at start-up), `offload` (GSO and GRO), `path` (Don't Fragment, the route's MTU), `impair` and `tap` (what can wrap a
//! driver), `runner` (what drives a session over one), `spin` (what its busy polls spend on nothing), `random` (the kernel's randomness).
//! This file only names them.

mod any;
mod datagrams;
mod impair;
mod offload;
mod path;
mod portable;
mod random;
mod runner;
mod spin;
mod tap;
mod uring;

pub use any::{AnyUdp, DriverKind, PORT_WAIT};
pub use datagrams::Datagrams;
pub use impair::{Impaired, Impairment};
pub use offload::{MAX_SEGMENTS, MAX_UNIT_BYTES, Offload, OffloadState, gro_segments, gso_unit};
pub use path::{PathMtu, header_bytes, path_mtu};
pub use portable::{PortableUdp, set_udp_gro, set_udp_segment};
pub use random::{os_random, os_rng, rng_from_os};
pub use runner::{Clock, PollMode, ServerRunner, SessionRunner};
pub use spin::{SPIN_GAP_MAX, SpinMeter, SpinTotals};
pub use tap::{Direction, Tap, TapFn, Tapped};
pub use uring::UringUdp;

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::time::Duration;
    use std::time::Instant;

    /// The kernel's bytes fill a buffer of any length — empty, one byte, more than the 256
    /// that one `getrandom` call is guaranteed to return whole — and two draws differ.
    #[test]
    fn os_random_fills_every_length() {
        os_random(&mut []).unwrap();
        for n in [1usize, 32, 257, 1 << 20] {
            let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
            os_random(&mut a).unwrap();
            os_random(&mut b).unwrap();
            if n >= 32 {
                assert_ne!(a, b, "two draws of {n} bytes were equal");
                // The last bytes were written too (a short read not retried would leave zeros).
                assert!(a[n - 32..].iter().any(|&x| x != 0), "the tail of {n} bytes stayed zero");
            }
        }
        assert!(rng_from_os().is_some());
    }

    /// Receives until `want` datagrams came or a second passed.
    fn collect(d: &mut dyn Datagrams, want: usize) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut got = Vec::new();
        let end = Instant::now() + Duration::from_secs(1);
        while got.len() < want && Instant::now() < end {
            d.recv(&mut |from, b| got.push((from, b.to_vec()))).unwrap();
        }
        // Anything beyond `want` would show here.
        std::thread::sleep(Duration::from_millis(20));
        d.recv(&mut |from, b| got.push((from, b.to_vec()))).unwrap();
        got
    }

    /// A connected socket sends to its peer without an address, one datagram or a batch (a
    /// datagram for another address among them still reaches it), says its peer as the source
    /// of what it receives, and hears no one else.
    fn connected_socket_talks_to_its_peer_alone(kind: DriverKind) {
        let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut a = AnyUdp::bind(local, kind, &mut |_| {}).unwrap();
        let mut b = AnyUdp::bind(local, kind, &mut |_| {}).unwrap();
        let stranger = std::net::UdpSocket::bind(local).unwrap();
        let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        a.connect(ba).unwrap();
        a.send_to(ba, b"one").unwrap();
        a.flush().unwrap();
        // A batch with one datagram for someone else in the middle: it keeps its address.
        let mut other = AnyUdp::bind(local, DriverKind::Portable, &mut |_| {}).unwrap();
        let oa = other.local_addr().unwrap();
        for i in 0..5u8 {
            a.send_to(ba, &[i; 40]).unwrap();
            if i == 2 {
                a.send_to(oa, b"elsewhere").unwrap();
            }
        }
        a.flush().unwrap();
        assert_eq!(collect(&mut other, 1), vec![(aa, b"elsewhere".to_vec())], "{kind:?}");
        let got = collect(&mut b, 6);
        assert_eq!(got.len(), 6, "{kind:?}");
        assert!(got.iter().all(|(from, _)| *from == aa));
        assert_eq!(got[0].1, b"one");
        assert_eq!(got[5].1, [4u8; 40]);
        stranger.send_to(b"not for you", aa).unwrap();
        for i in 0..3u8 {
            b.send_to(aa, &[i; 8]).unwrap();
        }
        b.flush().unwrap();
        let got = collect(&mut a, 3);
        assert_eq!(got, (0..3u8).map(|i| (ba, vec![i; 8])).collect::<Vec<_>>(), "{kind:?}");
    }

    /// Frames sent where they lie follow the datagrams queued before them, in order, one
    /// datagram each, to a connected peer or not; the caller may change them at once.
    fn borrowed_frames_follow_the_queued_ones(kind: DriverKind) {
        let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut a = AnyUdp::bind(local, kind, &mut |_| {}).unwrap();
        let mut b = AnyUdp::bind(local, kind, &mut |_| {}).unwrap();
        let ba = b.local_addr().unwrap();
        for connected in [false, true] {
            if connected {
                a.connect(ba).unwrap();
            }
            let mut frames: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 100 + i as usize]).collect();
            a.send_to(ba, b"queued first").unwrap();
            let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
            a.send_borrowed(ba, &refs).unwrap();
            // The kernel has read them: overwriting changes nothing that was sent.
            for f in &mut frames {
                f.fill(0xee);
            }
            let got = collect(&mut b, 41);
            assert_eq!(got.len(), 41, "{kind:?}, connected {connected}");
            assert_eq!(got[0].1, b"queued first");
            for (i, (_, bytes)) in got[1..].iter().enumerate() {
                assert_eq!(bytes, &vec![i as u8; 100 + i], "{kind:?}, connected {connected}");
            }
        }
    }

    #[test]
    fn borrowed_frames_follow_the_queued_ones_portable() {
        borrowed_frames_follow_the_queued_ones(DriverKind::Portable);
    }

    #[test]
    fn borrowed_frames_follow_the_queued_ones_io_uring() {
        if let Err(e) = UringUdp::probe() {
            eprintln!("skipping: io_uring unavailable here ({e})");
            return;
        }
        borrowed_frames_follow_the_queued_ones(DriverKind::IoUring);
    }

    #[test]
    fn connected_portable_socket_talks_to_its_peer_alone() {
        connected_socket_talks_to_its_peer_alone(DriverKind::Portable);
    }

    #[test]
    fn connected_io_uring_socket_talks_to_its_peer_alone() {
        if let Err(e) = UringUdp::probe() {
            eprintln!("skipping: io_uring unavailable here ({e})");
            return;
        }
        connected_socket_talks_to_its_peer_alone(DriverKind::IoUring);
    }
}
