//! The floors the benches compare the bridges with, run in process on loopback: each gives
//! figures in its range, ping-pongs a median no greater than their tail, streams a rate and
//! each side's CPU per byte.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lab::floor::{Buffers, bare_gso_stream_with, bare_pingpong, bare_stream, driver_pingpong};
use link::driver::DriverKind;

#[test]
fn ping_pongs_plain_and_through_a_driver_give_a_median_and_a_tail() {
    for (busy, connected) in [(false, false), (false, true), (true, true)] {
        let r = bare_pingpong(busy, connected, 200, None).unwrap();
        assert!(r.p50 > std::time::Duration::ZERO && r.p50 <= r.p99, "busy {busy}: {:?} {:?}", r.p50, r.p99);
    }
    let r = driver_pingpong(DriverKind::Portable, false, 200, None).unwrap();
    assert!(r.p50 > std::time::Duration::ZERO && r.p50 <= r.p99);
}

#[test]
fn streams_count_what_arrived_and_each_sides_cpu() {
    let (mb_s, received) = bare_stream(2000, 1400).unwrap();
    assert!(mb_s > 0.0 && received > 0 && received <= 2000, "{mb_s} {received}");
    for buffers in [Buffers::Hot, Buffers::Copy, Buffers::Staged] {
        let r = match bare_gso_stream_with(8 << 20, 8972, buffers) {
            Ok(r) => r,
            // A kernel without UDP GSO/GRO refuses the options: nothing to measure there.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOPROTOOPT.raw_os_error()) => {
                eprintln!("skipped: the kernel refused UDP GSO/GRO: {e}");
                return;
            }
            Err(e) => panic!("{buffers:?}: {e}"),
        };
        assert!(r.mb_s > 0.0, "{buffers:?}: {r:?}");
        assert!(r.send_cpu_s_per_gib > 0.0 && r.receive_cpu_s_per_gib > 0.0, "{buffers:?}: {r:?}");
    }
}
