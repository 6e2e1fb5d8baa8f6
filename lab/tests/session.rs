//! The link's sessions measured alone (`lab::session`), in process on loopback and in
//! memory: a request's round trip, a stream of posted writes whose frames follow the MTU
//! given, the sessions' CPU per round trip and frame, and a frame's tag, CRC and seal.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lab::session::{aead_cost, crc_cost, mac_cost, session_cpu, session_rtt, session_stream, write_tlp};
use link::driver::DriverKind;

#[test]
fn a_request_crosses_two_sessions_and_its_completion_comes_back() {
    let r = session_rtt(DriverKind::Portable, false, 200, 1472).unwrap();
    assert!(r.p50 > Duration::ZERO && r.p50 <= r.p99, "{:?} {:?}", r.p50, r.p99);
}

#[test]
fn a_stream_of_writes_arrives_whole_in_frames_as_large_as_the_mtu_allows() {
    let n = 4000;
    let small = session_stream(DriverKind::Portable, n, 256, 1472).unwrap();
    let jumbo = session_stream(DriverKind::Portable, n, 256, 9000).unwrap();
    assert!(small.seconds > 0.0 && jumbo.seconds > 0.0);
    // A 256-byte write is about 270 bytes on the wire: at most five fit a 1472-byte frame,
    // about thirty a 9000-byte one.
    let tlp = write_tlp(256).len() as u64;
    assert!(small.datagrams >= n as u64 * tlp / 1472, "{} frames at 1472", small.datagrams);
    assert!(
        jumbo.datagrams < small.datagrams,
        "{} frames at 9000, {} at 1472",
        jumbo.datagrams,
        small.datagrams
    );
}

#[test]
fn the_sessions_cpu_and_each_frames_costs_are_measured() {
    for encrypt in [false, true] {
        let (rtt, tx, rx) = session_cpu(256, encrypt, 1472).expect("sessions joined in memory");
        assert!(rtt > 0.0 && tx > 0.0 && rx > 0.0, "encrypt {encrypt}: {rtt} {tx} {rx}");
    }
    for len in [64, 1472, 9000] {
        assert!(mac_cost(len) > 0.0 && crc_cost(len) > 0.0 && aead_cost(len) > 0.0, "{len}");
    }
}
