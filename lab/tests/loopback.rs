//! `lab::loopback` in process: the demo workload through both endpoints and directly, in
//! turns, over more than one attachment, with the link measured and the profile counted; a
//! delay added to the link shows in the round trip and in the bridged runs, not the direct.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lab::harness::Frames;
use lab::loopback::{BaselineKind, Options, count_direct, run};
use link::driver::{DriverKind, Impairment, PollMode};
use testbed::workload::Workload;

fn opts(repeat: u32, delay: Duration) -> Options {
    Options {
        workload: Workload::named("demo", 1).unwrap(),
        baseline: BaselineKind::Synchronous,
        repeat,
        rtt_samples: 200,
        driver: DriverKind::Portable,
        poll: PollMode::Busy { spin: Duration::from_micros(200) },
        impairment: Impairment { delay, ..Impairment::default() },
        frames: Frames::Tagged,
        tap: None,
        placement: None,
    }
}

#[test]
fn the_demo_runs_in_turns_over_two_attachments_and_every_figure_is_filled() {
    // Four runs: three through the first attachment, the fourth through a second.
    let mut said = Vec::new();
    let o = run(&opts(4, Duration::ZERO), &mut |s| said.push(s.to_string())).unwrap();
    assert_eq!((o.bridged.len(), o.direct.len()), (4, 4));
    assert_eq!(o.workload.name(), "demo");
    let attached = said.iter().filter(|s| s.as_str() == "attaching gpu0 through the host endpoint").count();
    assert_eq!(attached, 2, "{said:?}");
    assert!(said.iter().any(|s| s.starts_with("bridged (4 of 4): ")), "{said:?}");
    assert!(said.iter().any(|s| s.starts_with("direct (warm-up): ")), "{said:?}");
    // Every run has the same steps on both platforms.
    let names =
        |r: &testbed::workload::WorkloadReport| r.steps.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
    for (b, d) in o.bridged.iter().zip(&o.direct) {
        assert_eq!(names(b), names(d));
        assert!(b.seconds > 0.0 && d.seconds > 0.0);
    }
    // The link as measured, the profile as counted, and what crossed the link.
    assert!(o.rtt.0 > Duration::ZERO && o.rtt.0 <= o.rtt.1, "{:?}", o.rtt);
    assert!(o.link.h2d_bytes_per_s > 0.0 && o.link.d2h_bytes_per_s > 0.0, "{:?}", o.link);
    assert!(o.profile.direct_h2d_bytes_per_s > 0.0 && o.profile.round_trips() > 0);
    assert!(o.captured.0 > 0 && o.captured.1 > 0, "{:?}", o.captured);
    assert!(!o.host.tlps_sent.is_empty() && !o.host.tlps_received.is_empty());
    assert!(o.overhead().median.is_finite());
    let (p, _) = o.prediction();
    assert!(p.bridged_seconds > 0.0, "{p:?}");
}

#[test]
fn a_delay_on_the_link_shows_in_the_bridged_round_trip_and_runs_only() {
    let delay = Duration::from_micros(500);
    let o = run(&opts(1, delay), &mut |_| {}).unwrap();
    // A register read crosses the link twice.
    assert!(o.rtt.0 >= 2 * delay, "{:?}", o.rtt);
    assert!(o.direct_rtt.0 < delay, "{:?}", o.direct_rtt);
    assert!(o.bridged[0].seconds > o.direct[0].seconds, "{} {}", o.bridged[0].seconds, o.direct[0].seconds);
    assert!(o.link.rtt_ns >= 2.0 * delay.as_nanos() as f64);
}

#[test]
fn the_direct_count_gives_a_profile_with_rates_and_the_runs_spread() {
    let (profile, seconds) = count_direct(Workload::named("demo", 1).unwrap(), 3).unwrap();
    assert!(profile.direct_h2d_bytes_per_s > 0.0 && profile.direct_d2h_bytes_per_s > 0.0);
    assert!(profile.round_trips() > 0 && profile.waits() > 0);
    assert!(seconds.min > 0.0 && seconds.min <= seconds.median && seconds.median <= seconds.max);
}
