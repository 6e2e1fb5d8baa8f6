//! `dxpu bench link`: the transport's figures, measured side by side in one run so that
//! their ratios mean something on a shared, noisy machine.
//!
//! (a) the floor: a bare UDP ping-pong with plain sockets, busy-polling and blocking, the
//!     client's socket connected to the server's as a session client's is (and, for
//!     reference, not connected);
//! (b) a one-TLP request/response (MRd → CplD) through two sessions, for each driver and
//!     mode, run to completion by the requesting thread;
//! (c) streaming 256-byte posted writes through a session (the receiver takes them in
//!     place), against the same datagrams through bare sockets;
//! (d) the cost of the per-frame MAC, and of encrypting a frame's body (`link.encrypt_frames`);
//! (e) the sessions' own CPU time, in memory (no sockets): per round trip, and per streamed
//!     frame on each side, frames tagged and frames encrypted.

use serde_json::Value;

use crate::floor::{Rtt, bare_pingpong, bare_stream, us};
use crate::report::driver_name;
use crate::session::{aead_cost, crc_cost, mac_cost, session_cpu, session_rtt, session_stream, write_tlp};
use link::driver::DriverKind;

/// What `dxpu bench link` measures.
#[derive(Debug, Clone, Copy)]
pub struct LinkOptions {
    /// Round trips measured per case (at least 100, after 10 % warm-up).
    pub iterations: usize,
    /// Posted writes streamed per streaming case.
    pub stream: usize,
    /// The sessions' MTU.
    pub mtu: u32,
}

/// `bench link`'s columns: the case, then its three figures.
const LINK_COLUMNS: [usize; 4] = [44, 10, 10, 12];

/// Measures every case, says each row through `say` as it is measured, and gives the report
/// as `--json` prints it (docs/cli.md).
pub fn run(args: &LinkOptions, say: &dyn Fn(String)) -> std::io::Result<Value> {
    let n = args.iterations.max(100);
    let mtu = args.mtu as usize;
    macro_rules! say {
        () => { say(String::new()) };
        ($($t:tt)*) => { say(format!($($t)*)) };
    }
    let mut rtt_rows = Vec::new();
    let mut stream_rows = Vec::new();
    let mut cpu_rows = Vec::new();
    say!("dxpu bench link — {n} round trips per case (after warm-up), UDP loopback, MTU {}", args.mtu);
    let uring = link::driver::UringUdp::probe();
    if let Err(e) = &uring {
        say!("io_uring unavailable ({e}): its rows are skipped");
    }
    say!();
    let row = |cells: &[String]| crate::report::row(&LINK_COLUMNS, cells);
    say!(
        "{}",
        row(&[
            "round trip (64 B / one MRd→CplD)".into(),
            "p50 µs".into(),
            "p99 µs".into(),
            "p50 / floor".into()
        ])
    );
    let say_row = |cells: &[String]| say!("{}", row(cells));
    let floors = floor_rows(&say_row, n, &mut rtt_rows)?;
    session_rows(&say_row, n, uring.is_ok(), &floors, &mut rtt_rows, mtu)?;
    say!();
    let size = 256;
    let tlp_len = write_tlp(size).len();
    say!(
        "{}",
        row(&[
            format!("streaming {} × {size} B posted writes", args.stream),
            "MB/s".into(),
            "Mdgram/s".into(),
            "vs bare".into()
        ])
    );
    for driver in [DriverKind::Portable, DriverKind::IoUring] {
        if driver == DriverKind::IoUring && uring.is_err() {
            continue;
        }
        let s = session_stream(driver, args.stream, size, mtu)?;
        let per = args.stream as f64 / s.datagrams.max(1) as f64;
        let dgram =
            (link::wire::HEADER_LEN + link::wire::TRAILER_LEN) + (per.round() as usize) * (tlp_len + 2);
        let (bare_s, bare_got) = bare_stream(s.datagrams, dgram)?;
        let mbps = (args.stream * size) as f64 / s.seconds / 1e6;
        let bare_mbps = (bare_got as f64 * per * size as f64) / bare_s / 1e6;
        stream_rows.push(serde_json::json!({"driver": driver_name(driver), "tlp_bytes": size,
            "tlps": args.stream, "tlps_per_datagram": per, "bytes_per_s": mbps * 1e6, "bare_bytes_per_s": bare_mbps * 1e6,
            "datagrams": s.datagrams, "bare_lost": s.datagrams.saturating_sub(bare_got)}));
        let name = format!(
            "session, {} ({:.1} TLPs per datagram)",
            if driver == DriverKind::Portable { "portable" } else { "io_uring" },
            per
        );
        say!(
            "{}",
            row(&[
                name,
                format!("{mbps:.0}"),
                format!("{:.3}", s.datagrams as f64 / s.seconds / 1e6),
                format!("{:.2}", mbps / bare_mbps)
            ])
        );
        say!(
            "{}",
            row(&[
                format!("  bare sockets, same {} × {dgram} B datagrams", s.datagrams),
                format!("{bare_mbps:.0}"),
                format!("{:.3}", bare_got as f64 / bare_s / 1e6),
                if bare_got < s.datagrams {
                    format!("({} lost)", s.datagrams - bare_got)
                } else {
                    "1.00".into()
                }
            ])
        );
    }
    say!();
    let say_line = |line: String| say!("{line}");
    let costs = frame_costs(&say_line);
    cpu_rows.extend(session_cpu_lines(&say_line, size, mtu));
    Ok(serde_json::json!({
        "mtu_bytes": args.mtu,
        "round_trips": rtt_rows,
        "streaming": stream_rows,
        "mac_ns": costs["mac_ns"],
        "aead_ns": costs["aead_ns"],
        "crc_ns": costs["crc_ns"],
        "session_cpu": cpu_rows,
    }))
}

/// (a) The floor: a bare UDP ping-pong busy-polling and blocking (and, for reference, with
/// the client's socket not connected), a row each; the two floors.
fn floor_rows(
    say: &dyn Fn(&[String]),
    n: usize,
    rows: &mut Vec<serde_json::Value>,
) -> std::io::Result<[(bool, Rtt); 2]> {
    let floors = [(true, bare_pingpong(true, true, n, None)?), (false, bare_pingpong(false, true, n, None)?)];
    for (busy, f) in &floors {
        let mode = if *busy { "busy-poll" } else { "blocking" };
        let poll = if *busy { "busy" } else { "blocking" };
        rows.push(serde_json::json!({"path": "bare", "driver": "plain", "poll": poll,
            "p50_us": us(f.p50), "p99_us": us(f.p99)}));
        say(&[
            format!("bare UDP ping-pong, {mode} (floor)"),
            format!("{:.1}", us(f.p50)),
            format!("{:.1}", us(f.p99)),
            "1.00".into(),
        ]);
        // For reference: what not connecting the client's socket costs.
        let unconnected = bare_pingpong(*busy, false, n, None)?;
        say(&[
            "  the same, client socket not connected".into(),
            format!("{:.1}", us(unconnected.p50)),
            format!("{:.1}", us(unconnected.p99)),
            format!("{:.2}", us(unconnected.p50) / us(f.p50)),
        ]);
    }
    Ok(floors)
}

/// (b) A one-TLP request/response through two sessions, for each driver (io_uring where the
/// kernel has it) and mode, a row each against its floor.
fn session_rows(
    say: &dyn Fn(&[String]),
    n: usize,
    uring: bool,
    floors: &[(bool, Rtt); 2],
    rows: &mut Vec<serde_json::Value>,
    mtu: usize,
) -> std::io::Result<()> {
    for driver in [DriverKind::Portable, DriverKind::IoUring] {
        if driver == DriverKind::IoUring && !uring {
            continue;
        }
        for (busy, floor) in floors {
            let rtt = session_rtt(driver, *busy, n, mtu)?;
            rows.push(serde_json::json!({"path": "session", "driver": driver_name(driver),
                "poll": if *busy { "busy" } else { "blocking" }, "p50_us": us(rtt.p50), "p99_us": us(rtt.p99),
                "per_floor": us(rtt.p50) / us(floor.p50)}));
            let name = format!(
                "session, {}, {}",
                if driver == DriverKind::Portable { "portable" } else { "io_uring" },
                if *busy { "busy-poll" } else { "blocking" }
            );
            say(&[
                name,
                format!("{:.1}", us(rtt.p50)),
                format!("{:.1}", us(rtt.p99)),
                format!("{:.2}", us(rtt.p50) / us(floor.p50)),
            ]);
        }
    }
    Ok(())
}

/// (d) The per-frame costs of the CRC, the MAC and encryption, said and returned as JSON.
fn frame_costs(say: &dyn Fn(String)) -> serde_json::Value {
    let (mac64, mac1472, aead64, aead1472) = (mac_cost(64), mac_cost(1472), aead_cost(64), aead_cost(1472));
    let (mac9000, aead9000) = (mac_cost(9000), aead_cost(9000));
    let (crc1472, crc9000) = (crc_cost(1472), crc_cost(9000));
    say(format!(
        "frame CRC32C: {crc1472:.0} ns per 1472-byte frame ({:.2} GB/s), {crc9000:.0} ns per 9000-byte \
         frame ({:.2} GB/s)",
        1472.0 / crc1472,
        9000.0 / crc9000
    ));
    say(format!(
        "frame MAC (AES-128-GMAC): {mac64:.0} ns per 64-byte frame, {mac1472:.0} ns per 1472-byte frame \
         ({:.2} GB/s), {mac9000:.0} ns per 9000-byte frame ({:.2} GB/s)",
        1472.0 / mac1472,
        9000.0 / mac9000
    ));
    say(format!(
        "frame AEAD (AES-128-GCM, body encrypted): {aead64:.0} ns per 64-byte frame, {aead1472:.0} ns per \
         1472-byte frame ({:.2} GB/s), {aead9000:.0} ns per 9000-byte frame ({:.2} GB/s)",
        1472.0 / aead1472,
        9000.0 / aead9000
    ));
    serde_json::json!({
        "mac_ns": {"64": mac64, "1472": mac1472, "9000": mac9000},
        "aead_ns": {"64": aead64, "1472": aead1472, "9000": aead9000},
        "crc_ns": {"1472": crc1472, "9000": crc9000},
    })
}

/// (e) The sessions' own CPU time in memory, frames tagged and frames encrypted, said and
/// returned as JSON rows.
fn session_cpu_lines(say: &dyn Fn(String), size: usize, mtu: usize) -> Vec<serde_json::Value> {
    let mut rows = Vec::new();
    for (encrypt, what) in [(false, "tagged"), (true, "encrypted")] {
        let cpu = session_cpu(size, encrypt, mtu);
        if let Some((rtt, tx, rx)) = cpu {
            rows.push(serde_json::json!({"frames": what, "round_trip_ns": rtt, "send_frame_ns": tx,
                "receive_frame_ns": rx}));
        }
        match cpu {
            Some((rtt, tx, rx)) => say(format!(
                "session CPU, in memory, frames {what}: {rtt:.0} ns per round trip (both sides); per \
                 streamed frame {tx:.0} ns sending, {rx:.0} ns receiving"
            )),
            None => say(format!("session CPU, in memory, frames {what}: the sessions did not come up")),
        }
    }
    rows
}
