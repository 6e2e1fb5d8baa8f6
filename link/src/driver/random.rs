//! Randomness from the kernel, for what the state machine is given: session IDs, nonces,
//! epochs.

/// Fills `out` from the kernel's random source (`getrandom(2)`, blocking only until the pool
/// is first initialised at boot).
///
/// Straight from the kernel rather than through AWS-LC's generator: AWS-LC seeds itself once
/// a process with its CPU-jitter entropy source, 28–37 ms of one core before an endpoint could
/// make its first session ID (`perf record -F 4000` of `dxpu bench bridge --only mmio
/// --iterations 100`, three runs, 2026-12-03: 111–147 samples in `jent_*`; none since).
pub fn os_random(out: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < out.len() {
        match rustix::rand::getrandom(&mut out[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A generator seeded with the kernel's random bytes ([`os_random`]), or `None` if it has
/// none to give. (Here, not in the sans-IO `auth`: the state machine takes its generator
/// as an argument and never asks the OS.)
pub fn rng_from_os() -> Option<crate::Rng> {
    let mut seed = [0u8; 32];
    os_random(&mut seed).ok()?;
    Some(crate::Rng::new(seed))
}

/// A generator seeded from the OS ([`rng_from_os`]), for session IDs, nonces and
/// epochs. If the OS has none to give, the clock and process ID seed it (and it says so
/// through `log`).
pub fn os_rng(log: &mut dyn FnMut(&str)) -> crate::Rng {
    match rng_from_os() {
        Some(r) => r,
        None => {
            log("the operating system gave no random bytes; seeding from the clock and process ID");
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            crate::Rng::from_u64(t ^ (std::process::id() as u64) << 32)
        }
    }
}
