//! UDP segmentation and receive offload (GSO and GRO) as the drivers use them: which
//! consecutive frames may leave in one system call as one GSO unit, and how a coalesced read
//! splits back into the frames it carries. Each frame stays its own datagram on the wire —
//! its own sequence number, MAC and acknowledgement — and the session never sees a unit:
//! the drivers hand it frames one by one, as without offload.
//!
//! The kernel's rules (Linux `udp_send_skb`, `udp_gro_receive`): a GSO send gives a segment
//! size in a `UDP_SEGMENT` control message; every segment but the last has that size, the
//! last may be shorter, at most 64 segments, and the whole must fit one IP datagram. A GRO
//! read carries the segment size in a `UDP_GRO` control message on the same rules.
#![forbid(unsafe_code)]

use std::net::SocketAddr;

/// Segments one GSO send carries at most (the kernel's `UDP_MAX_SEGMENTS`).
pub const MAX_SEGMENTS: usize = 64;
/// Bytes one GSO send carries at most: one IPv4 datagram's payload (65535 less the IP and
/// UDP headers).
pub const MAX_UNIT_BYTES: usize = 65_507;

/// What a driver is asked to use; each is probed at start and turned off, with the reason
/// kept, where the kernel or the socket refuses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offload {
    /// Send runs of equal-sized frames with UDP GSO.
    pub gso: bool,
    /// Receive with UDP GRO and split coalesced reads.
    pub gro: bool,
    /// io_uring only: send borrowed DATA frames with zero-copy sends (`SEND_ZC`,
    /// `SENDMSG_ZC`), the kernel reading them from where they lie until it says it is done.
    /// Off by default: on loopback the kernel copies anyway and the notifications cost more
    /// than they save (docs/performance.md).
    pub zero_copy_send: bool,
}

impl Offload {
    /// GSO and GRO, where the kernel has them.
    pub const AUTO: Offload = Offload { gso: true, gro: true, zero_copy_send: false };
    /// Neither: a datagram per system call slot each way, as before offload.
    pub const OFF: Offload = Offload { gso: false, gro: false, zero_copy_send: false };
}

impl Default for Offload {
    fn default() -> Offload {
        Offload::AUTO
    }
}

/// What a driver uses after probing, and why it does not use what it does not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OffloadState {
    /// GSO in use.
    pub gso: bool,
    /// GRO in use.
    pub gro: bool,
    /// Why GSO is off (not asked for, refused at start, or refused by a send).
    pub gso_off: Option<String>,
    /// Why GRO is off.
    pub gro_off: Option<String>,
    /// GSO sends made (units of two or more frames).
    pub gso_sends: u64,
    /// Coalesced reads split back into frames.
    pub gro_reads: u64,
    /// Zero-copy sends in use (io_uring, when asked for).
    pub zero_copy_send: bool,
    /// Zero-copy sends whose notification said the kernel copied after all.
    pub zero_copy_copied: u64,
    /// Don't Fragment set on the socket's datagrams (`driver::path`): one larger than the
    /// path is refused, never sent in IP fragments.
    pub dont_fragment: bool,
    /// Datagrams the kernel refused as larger than the path allows (`EMSGSIZE`, Don't
    /// Fragment set): dropped, as the network would drop them, for the link to replay.
    pub too_large: u64,
    /// ICMP "port unreachable" heard back (`ECONNREFUSED`): nothing listened where a
    /// datagram went.
    pub port_unreachable: u64,
}

impl OffloadState {
    /// One line for a log: what is on, what is off and why.
    pub fn describe(&self) -> String {
        let part = |name: &str, on: bool, why: &Option<String>| match (on, why) {
            (true, _) => format!("{name} on"),
            (false, Some(w)) => format!("{name} off ({w})"),
            (false, None) => format!("{name} off"),
        };
        let zc = if self.zero_copy_send { ", zero-copy sends" } else { "" };
        let df = if self.dont_fragment { ", Don't Fragment set" } else { ", Don't Fragment refused" };
        format!(
            "{}, {}{zc}{df}",
            part("UDP GSO", self.gso, &self.gso_off),
            part("UDP GRO", self.gro, &self.gro_off)
        )
    }
}

/// The GSO unit that starts at datagram `start` of `total`, whose destination and length
/// `at(i)` gives: `(count, segment)`, `count` datagrams of `segment` bytes each, the last
/// perhaps shorter, all for one destination, within the kernel's limits. A unit of one is a
/// plain send.
pub fn gso_unit(start: usize, total: usize, at: &dyn Fn(usize) -> (SocketAddr, usize)) -> (usize, usize) {
    let (dest, segment) = at(start);
    let mut count = 1;
    if segment == 0 {
        return (1, 0);
    }
    while start + count < total && count < MAX_SEGMENTS && (count + 1) * segment <= MAX_UNIT_BYTES {
        let (d, len) = at(start + count);
        if d != dest || len > segment || len == 0 {
            break;
        }
        count += 1;
        if len < segment {
            // A shorter datagram ends the unit.
            break;
        }
    }
    (count, segment)
}

/// The frames a read carries: with GRO's segment size, the read cut at every `segment`
/// bytes (the last piece may be shorter); without, the read itself. Every piece goes to the
/// session on its own, verified as its own datagram.
pub fn gro_segments(read: &[u8], segment: Option<usize>) -> impl Iterator<Item = &[u8]> {
    let size = match segment {
        Some(s) if s > 0 && s < read.len() => s,
        _ => read.len().max(1),
    };
    read.chunks(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(lens: &[(u16, usize)]) -> Vec<(usize, usize)> {
        let at = |i: usize| (SocketAddr::from(([127, 0, 0, 1], lens[i].0)), lens[i].1);
        let mut out = Vec::new();
        let mut i = 0;
        while i < lens.len() {
            let (n, seg) = gso_unit(i, lens.len(), &at);
            out.push((n, seg));
            i += n;
        }
        out
    }

    #[test]
    fn equal_frames_go_together_and_a_shorter_one_ends_the_unit() {
        let l = [(1, 1000), (1, 1000), (1, 1000), (1, 400), (1, 1000), (1, 1000)];
        assert_eq!(units(&l), vec![(4, 1000), (2, 1000)]);
    }

    #[test]
    fn a_longer_frame_or_another_destination_starts_a_new_unit() {
        let l = [(1, 500), (1, 500), (1, 900), (2, 900), (2, 900), (1, 900)];
        assert_eq!(units(&l), vec![(2, 500), (1, 900), (2, 900), (1, 900)]);
    }

    #[test]
    fn units_stay_within_the_kernels_limits() {
        let many = vec![(1, 100); 200];
        assert_eq!(units(&many), vec![(64, 100), (64, 100), (64, 100), (8, 100)]);
        let jumbo = vec![(1, 9000); 10];
        // 7 × 9000 = 63,000 bytes fit one IP datagram; 8 would not.
        assert_eq!(units(&jumbo), vec![(7, 9000), (3, 9000)]);
        let max = vec![(1, 65_507); 2];
        assert_eq!(units(&max), vec![(1, 65_507), (1, 65_507)]);
    }

    #[test]
    fn a_coalesced_read_splits_at_the_segment_size() {
        let read: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        let pieces: Vec<usize> = gro_segments(&read, Some(1000)).map(|p| p.len()).collect();
        assert_eq!(pieces, vec![1000, 1000, 500]);
        assert_eq!(gro_segments(&read, None).count(), 1);
        assert_eq!(gro_segments(&read, Some(0)).count(), 1, "a zero segment size is no split");
        assert_eq!(gro_segments(&read, Some(5000)).count(), 1, "larger than the read: one frame");
        assert_eq!(gro_segments(&[], Some(10)).count(), 0, "an empty read carries nothing");
    }
}
