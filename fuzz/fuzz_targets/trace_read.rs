//! Arbitrary bytes through the trace reader's JSON parser: an error or a trace, never a
//! panic; a trace's plan evaluates at no link and at a slow one, its job finite and no
//! shorter through the slow link.
#![no_main]

use lab::model::LinkParams;
use lab::plan::Plan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(t) = lab::trace::parse(data, "fuzz", lab::trace::Pick::ANY) else { return };
    let plan = Plan::of(&t);
    let local = plan.evaluate(&LinkParams::LOCAL);
    let slow = LinkParams { rtt_ns: 10_000.0, h2d_bytes_per_s: 1e9, d2h_bytes_per_s: 1e9, ..LinkParams::LOCAL };
    let far = plan.evaluate(&slow);
    assert!(local.job_ns.is_finite() && far.job_ns.is_finite(), "{local:?} {far:?}");
    assert!(far.job_ns >= local.job_ns, "a link made the job shorter: {} < {}", far.job_ns, local.job_ns);
});
