//! The floors the benches compare against: a bare UDP ping-pong and stream with plain
//! sockets (and with GSO), and a ping-pong through a link driver alone.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use link::driver::{AnyUdp, Datagrams, DriverKind, PollMode, PortableUdp};

/// Where the benches bind: loopback, any port.
pub const LOCAL: ([u8; 4], u16) = ([127, 0, 0, 1], 0);

/// How a bench's endpoints wait: spinning (`busy`) or sleeping in the kernel.
pub fn mode_of(busy: bool) -> PollMode {
    if busy { PollMode::Busy { spin: Duration::from_secs(3600) } } else { PollMode::Blocking }
}

/// The `p` quantile (0..=1) of `sorted`, nearest rank; zero for none.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A round trip's median and 99th percentile.
pub struct Rtt {
    /// The median.
    pub p50: Duration,
    /// The 99th percentile.
    pub p99: Duration,
}

/// The median and 99th percentile of `v`.
pub fn summarize(mut v: Vec<Duration>) -> Rtt {
    v.sort();
    Rtt { p50: percentile(&v, 0.50), p99: percentile(&v, 0.99) }
}

/// `d` in microseconds.
pub fn us(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

/// Bare UDP ping-pong with 64-byte datagrams. With `connected`, the client's socket is
/// connected to the server, as a session's client socket is (the server's serves any peer,
/// as a session server's does): the floor with the same socket set-up as the sessions. The
/// echoing thread runs on `echo_cpu` where given (the caller's stays where it is).
pub fn bare_pingpong(busy: bool, connected: bool, n: usize, echo_cpu: Option<usize>) -> std::io::Result<Rtt> {
    let server = UdpSocket::bind(SocketAddr::from(LOCAL))?;
    let client = UdpSocket::bind(SocketAddr::from(LOCAL))?;
    let (sa, ca) = (server.local_addr()?, client.local_addr()?);
    server.set_nonblocking(busy)?;
    client.set_nonblocking(busy)?;
    if connected {
        client.connect(sa)?;
    }
    let total = n + n / 10;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        crate::affinity::pin_to(echo_cpu).map_err(std::io::Error::other)?;
        let mut buf = [0u8; 2048];
        for _ in 0..total {
            loop {
                match server.recv_from(&mut buf) {
                    Ok((len, from)) => {
                        server.send_to(&buf[..len], from)?;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    });
    let msg = [0x5au8; 64];
    let mut buf = [0u8; 2048];
    let mut rtts = Vec::with_capacity(n);
    for i in 0..total {
        let t0 = Instant::now();
        if connected {
            client.send(&msg)?;
        } else {
            client.send_to(&msg, sa)?;
        }
        loop {
            match client.recv_from(&mut buf) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(e),
            }
        }
        if i >= total - n {
            rtts.push(t0.elapsed());
        }
    }
    let _ = ca;
    echo.join().map_err(|_| std::io::Error::other("echo thread panicked"))??;
    Ok(summarize(rtts))
}

/// The same ping-pong through one of the link's drivers (no session): the floor of that
/// driver in that mode, the echoing thread on `echo_cpu` where given.
pub fn driver_pingpong(
    driver: DriverKind,
    busy: bool,
    n: usize,
    echo_cpu: Option<usize>,
) -> std::io::Result<Rtt> {
    let mode = mode_of(busy);
    let mut server = AnyUdp::bind(SocketAddr::from(LOCAL), driver, &mut |_| {})?;
    let mut client = AnyUdp::bind(SocketAddr::from(LOCAL), driver, &mut |_| {})?;
    let sa = server.local_addr()?;
    // Connected, as a session's client socket is.
    client.connect(sa)?;
    let total = n + n / 10;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        crate::affinity::pin_to(echo_cpu).map_err(std::io::Error::other)?;
        let mut echoed = 0;
        let mut from_to = Vec::new();
        while echoed < total {
            from_to.clear();
            server.recv(&mut |from, _| from_to.push(from))?;
            for from in &from_to {
                server.send_to(*from, &[0x5a; 64])?;
                echoed += 1;
            }
            if from_to.is_empty() {
                if mode == PollMode::Blocking {
                    server.wait(Some(Duration::from_millis(100)))?;
                } else {
                    std::hint::spin_loop();
                }
            } else {
                server.flush()?;
            }
        }
        Ok(())
    });
    let mut rtts = Vec::with_capacity(n);
    for i in 0..total {
        let t0 = Instant::now();
        client.send_to(sa, &[0x5a; 64])?;
        client.flush()?;
        loop {
            if client.recv(&mut |_, _| {})? > 0 {
                break;
            }
            if mode == PollMode::Blocking {
                client.wait(Some(Duration::from_millis(100)))?;
            } else {
                std::hint::spin_loop();
            }
        }
        if i >= total - n {
            rtts.push(t0.elapsed());
        }
    }
    echo.join().map_err(|_| std::io::Error::other("echo thread panicked"))??;
    Ok(summarize(rtts))
}

/// Datagrams of one size through bare sockets with sendmmsg/recvmmsg, the
/// sender's socket connected (as a session client's is).
pub fn bare_stream(datagrams: u64, size: usize) -> std::io::Result<(f64, u64)> {
    // A datagram per sendmmsg/recvmmsg slot: the offloads have a row of their own.
    let off = link::driver::Offload::OFF;
    let mut rx = PortableUdp::bind_with(SocketAddr::from(LOCAL), off)?;
    let to = rx.local_addr()?;
    let received = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (received2, done2) = (received.clone(), done.clone());
    let reader = std::thread::spawn(move || -> std::io::Result<()> {
        let mut idle_since = Instant::now();
        while !done2.load(Ordering::Relaxed) || idle_since.elapsed() < Duration::from_millis(50) {
            let n = rx.recv(&mut |_, _| {})?;
            if n > 0 {
                received2.fetch_add(n as u64, Ordering::Relaxed);
                idle_since = Instant::now();
            }
        }
        Ok(())
    });
    let mut tx = PortableUdp::bind_with(SocketAddr::from(LOCAL), off)?;
    tx.connect(to)?;
    let payload = vec![0x5au8; size];
    let t0 = Instant::now();
    for _ in 0..datagrams {
        tx.send_to(to, &payload)?;
    }
    tx.flush()?;
    // Wait until everything arrived, or nothing more does.
    let mut last = 0;
    let mut last_change = Instant::now();
    while received.load(Ordering::Relaxed) < datagrams && last_change.elapsed() < Duration::from_millis(100) {
        let now = received.load(Ordering::Relaxed);
        if now != last {
            last = now;
            last_change = Instant::now();
        }
        std::hint::spin_loop();
    }
    let seconds = if received.load(Ordering::Relaxed) >= datagrams { t0.elapsed() } else { last_change - t0 }
        .as_secs_f64();
    done.store(true, Ordering::Relaxed);
    reader.join().map_err(|_| std::io::Error::other("the GSO floor's receiving thread panicked"))??;
    Ok((seconds, received.load(Ordering::Relaxed)))
}

/// The bare floor of bulk UDP with the kernel's offloads: `bytes` streamed over loopback in
/// sends of up to 64 segments of `segment` bytes (UDP GSO) to a receiver that takes
/// coalesced batches (UDP GRO), plain sockets, no session. Returns MB/s received, or why
/// the kernel refused the offloads. The sender sends one 64 KB buffer over and over and the
/// receiver reads into one: both stay in cache, so this is the kernel path's own ceiling.
pub fn bare_gso_stream(bytes: usize, segment: usize) -> std::io::Result<GsoRun> {
    bare_gso_stream_with(bytes, segment, Buffers::Hot)
}

/// Where [`bare_gso_stream_with`]'s sender reads and its receiver writes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Buffers {
    /// One 64 KB buffer each side, reused: cache-resident.
    Hot,
    /// A `bytes`-long source read from start to end and a `bytes`-long destination written
    /// the same way, as a copy of that size reads and writes memory (each touched once first,
    /// so no page is faulted in while timed): one kernel copy per side and nothing else.
    Copy,
    /// As `Copy`, but each side also copies the bytes once in user space, as any sender that
    /// must keep what it sent until it is acknowledged (a replay buffer) and any receiver that
    /// learns where bytes go only from the datagram they arrive in must: the sender copies each
    /// unit from the source into a 64 KB staging buffer and sends that, the receiver reads
    /// into a 64 KB buffer and copies it to the destination. Two copies per side.
    Staged,
}

/// One run of [`bare_gso_stream_with`]: the rate and the CPU each side spent per byte.
#[derive(Clone, Copy, Debug)]
pub struct GsoRun {
    /// MB/s received.
    pub mb_s: f64,
    /// The sending thread's CPU seconds per GiB it sent (a full socket buffer drops on
    /// loopback, so per byte sent, not received).
    pub send_cpu_s_per_gib: f64,
    /// The receiving thread's CPU seconds per GiB it received: it sleeps in `recv` when
    /// nothing is there, so this is its work.
    pub receive_cpu_s_per_gib: f64,
}

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// CPU seconds per GiB: `cpu` spent on `bytes`.
fn per_gib(cpu: Duration, bytes: u64) -> f64 {
    if bytes == 0 { 0.0 } else { cpu.as_secs_f64() / (bytes as f64 / (1u64 << 30) as f64) }
}

/// [`bare_gso_stream`] with the sender's and receiver's buffers chosen by `buffers`.
pub fn bare_gso_stream_with(bytes: usize, segment: usize, buffers: Buffers) -> std::io::Result<GsoRun> {
    let rx = UdpSocket::bind(SocketAddr::from(LOCAL))?;
    link::driver::set_udp_gro(&rx, true)?;
    rx.set_read_timeout(Some(Duration::from_millis(20)))?;
    let to = rx.local_addr()?;
    let tx = UdpSocket::bind(SocketAddr::from(LOCAL))?;
    tx.connect(to)?;
    link::driver::set_udp_segment(&tx, segment as u16)?;
    let received = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (received2, done2) = (received.clone(), done.clone());
    let window = 1 << 16;
    let span = if buffers == Buffers::Hot { window } else { bytes + window };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![1u8; span];
        let mut staging = vec![1u8; window];
        let _ = ready_tx.send(());
        let cpu0 = thread_cpu();
        let mut at = 0;
        while !done2.load(Ordering::Relaxed) {
            let got = match buffers {
                Buffers::Staged => rx.recv(&mut staging).inspect(|&n| {
                    buf[at..at + n].copy_from_slice(&staging[..n]);
                }),
                _ => rx.recv(&mut buf[at..at + window]),
            };
            if let Ok(n) = got {
                received2.fetch_add(n as u64, Ordering::Relaxed);
                at = if at + n + window <= span { at + n } else { 0 };
            }
        }
        thread_cpu() - cpu0
    });
    let _ = ready_rx.recv();
    // A GSO send carries at most 64 segments and 64 KiB of payload.
    let per_send = (65_000 / segment).clamp(1, 64) * segment;
    let payload = vec![0x5au8; if buffers == Buffers::Hot { per_send } else { bytes }];
    let mut staging = vec![0u8; per_send];
    let (t0, cpu0) = (Instant::now(), thread_cpu());
    let mut sent = 0;
    while sent < bytes {
        let n = per_send.min(bytes - sent);
        // A full socket buffer drops on loopback rather than blocking; what arrives counts.
        let _ = match buffers {
            Buffers::Hot => tx.send(&payload[..n]),
            Buffers::Copy => tx.send(&payload[sent..sent + n]),
            Buffers::Staged => {
                staging[..n].copy_from_slice(&payload[sent..sent + n]);
                tx.send(&staging[..n])
            }
        };
        sent += n;
    }
    let send_cpu = thread_cpu() - cpu0;
    let mut last = 0;
    let mut last_change = Instant::now();
    while (received.load(Ordering::Relaxed) as usize) < bytes
        && last_change.elapsed() < Duration::from_millis(100)
    {
        let now = received.load(Ordering::Relaxed);
        if now != last {
            last = now;
            last_change = Instant::now();
        }
        std::hint::spin_loop();
    }
    let got = received.load(Ordering::Relaxed);
    let seconds = if got as usize >= bytes { t0.elapsed() } else { last_change - t0 }.as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let receive_cpu =
        reader.join().map_err(|_| std::io::Error::other("the GSO floor's receiving thread panicked"))?;
    Ok(GsoRun {
        mb_s: got as f64 / seconds / 1e6,
        send_cpu_s_per_gib: per_gib(send_cpu, bytes as u64),
        receive_cpu_s_per_gib: per_gib(receive_cpu, got),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_percentile_takes_the_nearest_rank_and_none_is_zero() {
        let ms = |v: &[u64]| v.iter().map(|&m| Duration::from_millis(m)).collect::<Vec<_>>();
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
        assert_eq!(percentile(&ms(&[7]), 0.99), Duration::from_millis(7));
        assert_eq!(percentile(&ms(&[1, 2, 3, 4, 5]), 0.5), Duration::from_millis(3));
        assert_eq!(percentile(&ms(&[1, 2, 3, 4, 5]), 1.0), Duration::from_millis(5));
        let r = summarize(ms(&[9, 1, 5, 3, 7]));
        assert_eq!((r.p50, r.p99), (Duration::from_millis(5), Duration::from_millis(9)));
        assert_eq!(us(Duration::from_nanos(2500)), 2.5);
        assert_eq!(per_gib(Duration::from_secs(1), 0), 0.0);
        assert_eq!(per_gib(Duration::from_secs(2), 1 << 31), 1.0);
    }
}
