//! `dxpu bench bridge`: the bridges' figures against their floors, side by side in one run:
//!
//! (a) MMIO read round trip through both endpoints (driver → RemoteDevice → link → box →
//!     simgpu → back) against a bare UDP ping-pong in the same mode, both with plain
//!     sockets and through the same link driver (no session);
//! (b) DMA throughput through the bridges (simgpu copies host↔VRAM) against the same bytes
//!     streamed through bare sockets;
//! (c) the demo workload bridged against a directly attached simgpu.

use std::time::Duration;

use bridge_host::RemoteDevice;
use driver::SimGpuDriver;
use link::driver::{DriverKind, Impairment, PollMode};

use serde_json::{Value, json};

use crate::affinity::{self, Placement};
use crate::bulk::{Copied, bridged_copies, direct_copies};
use crate::error::LabError;
use crate::floor::{
    Buffers, GsoRun, bare_gso_stream, bare_gso_stream_with, bare_pingpong, bare_stream, driver_pingpong, us,
};
use crate::harness::{Frames, LocalBox, Spread, mmio_rtt};
use crate::report::driver_name;

/// What `dxpu bench bridge` measures.
#[derive(Debug)]
pub struct BridgeOptions {
    /// MMIO reads timed per case (at least 100, after 10 % warm-up).
    pub iterations: usize,
    /// Bytes per DMA copy.
    pub copy_bytes: usize,
    /// Copies timed per DMA row, after one untimed; the row shows their median.
    pub copy_repeat: u32,
    /// (a) register reads through the bridges against the ping-pong floors, with the
    /// spinning threads placed so (`None`: wherever the scheduler puts them).
    pub mmio: Option<Option<Placement>>,
    /// (b) DMA through the bridges against bare sockets, the GSO + GRO floor and direct.
    pub dma: bool,
    /// (c) this workload (the demo, sized `scale`) bridged against direct.
    pub workload: Option<(u32, crate::loopback::Options)>,
    /// Only this link driver's bridged rows (`Portable` or `IoUring`); both (where io_uring
    /// exists) where `None`.
    pub driver: Option<DriverKind>,
}

/// MB/s (the tables' unit) as bytes per second (the JSON's, docs/cli.md).
fn bytes_per_s(mb_per_s: f64) -> f64 {
    mb_per_s * 1e6
}

fn open(gpu: &LocalBox, driver: DriverKind, poll: PollMode) -> Result<SimGpuDriver<RemoteDevice>, String> {
    let remote = RemoteDevice::attach(gpu.attach_options(driver, poll, Impairment::default()))
        .map_err(|e| e.to_string())?;
    SimGpuDriver::open(remote).map_err(|e| e.to_string())
}

/// The link's datagram size on loopback in these benchmarks (`LocalBox`).
const LINK_MTU: usize = 9000;

/// Runs the sections `args` names, says each row through `say` as it is measured, and gives
/// the report as `--json` prints it (docs/cli.md).
pub fn run(args: &BridgeOptions, say: &dyn Fn(String)) -> Result<Value, LabError> {
    measure(args, say).map_err(LabError::Bench)
}

/// The largest copy: its host buffer comes from the host endpoint's 256 MiB of DMA memory.
pub const MAX_COPY_BYTES: usize = 128 << 20;

fn measure(args: &BridgeOptions, say: &dyn Fn(String)) -> Result<Value, String> {
    if args.dma && !(1..=MAX_COPY_BYTES).contains(&args.copy_bytes) {
        // Refused before anything runs: the floors would stream a size this large without end.
        return Err(format!("a copy of {} bytes: must be 1..={MAX_COPY_BYTES}", args.copy_bytes));
    }
    let n = args.iterations.max(100);
    let spin = Duration::from_millis(2);
    let uring = link::driver::UringUdp::probe();
    say(format!("dxpu bench bridge — both endpoints on UDP loopback, MTU {LINK_MTU}, simgpu behind the box"));
    if let Err(e) = &uring {
        say(format!("io_uring unavailable ({e}): its rows are skipped"));
    }
    let drivers: Vec<DriverKind> = [DriverKind::Portable, DriverKind::IoUring]
        .into_iter()
        .filter(|d| *d == DriverKind::Portable || uring.is_ok())
        .filter(|d| args.driver.is_none_or(|only| only == *d))
        .collect();
    // Where the hypervisor put this machine's CPUs, before and after: the bridges' bulk rate
    // over loopback about halves on cores apart (lab::cores).
    let cores_before = crate::cores::first_two_ns();
    if let Some(((a, b), ns)) = cores_before {
        say(format!("CPUs {a} and {b}: a cache line's round trip {ns:.0} ns"));
    }
    // Only the register reads are pinned.
    let placement = args.mmio.flatten();
    let mmio = match args.mmio {
        Some(placement) => mmio_section(n, spin, &drivers, placement, say)?,
        None => Vec::new(),
    };
    let (dma, gso, floors, [copy_floor, staged_floor], floor_cpu, floors_taken) = if args.dma {
        dma_section(args, spin, &drivers, say)?
    } else {
        (Vec::new(), None, Vec::new(), [None; 2], serde_json::Value::Null, None)
    };
    let workload = match &args.workload {
        Some((scale, options)) => workload_section(*scale, options, say)?,
        None => Value::Null,
    };
    let cores = cores_before.zip(crate::cores::first_two_ns()).map(|((cpus, before), (_, after))| {
        crate::cores::RoundTrips { cpus, first_ns: before, later_ns: vec![after] }
    });
    if let Some(c) = &cores {
        say(String::new());
        say(format!(
            "CPUs {} and {}: a cache line's round trip {:.0} ns after the bench",
            c.cpus.0, c.cpus.1, c.later_ns[0]
        ));
        if c.moved() {
            say(format!(
                "CORES MOVED during the bench ({:.0} → {:.0} ns): the hypervisor placed the CPUs on other cores, and \
                 rows measured before and after compare two machines; run it again",
                c.first_ns, c.later_ns[0]
            ));
        }
    }
    Ok(json!({
            "mtu_bytes": LINK_MTU,
            "cpus": placement.map(|p| json!({ "device": p.device, "host": p.host })),
            "core_round_trip_ns": cores.as_ref().map(|c| json!({
                "cpus": [c.cpus.0, c.cpus.1], "before": c.first_ns, "after": c.later_ns[0],
            })),
            "cores_moved": cores.as_ref().map(|c| c.moved()),
            "mmio": mmio,
            "dma": dma,
            "floor_gso_bytes_per_s": gso.map(bytes_per_s),
            "floor_gso_runs_bytes_per_s": floors.iter().map(|&f| bytes_per_s(f)).collect::<Vec<_>>(),
            "floor_gso_copy_bytes_per_s": copy_floor.map(bytes_per_s),
            "floor_gso_staged_bytes_per_s": staged_floor.map(bytes_per_s),
            "floor_gso_cpu_s_per_gib": floor_cpu,
            "floor_samples_taken_from": floors_taken,
            "workload": workload,
    }))
}

/// (a): register reads through the bridges against the plain-socket and driver floors.
fn mmio_section(
    n: usize,
    spin: Duration,
    drivers: &[DriverKind],
    placement: Option<Placement>,
    say: &dyn Fn(String),
) -> Result<Vec<serde_json::Value>, String> {
    // The reading thread on the host's CPU until this returns; the echoing one on the device's.
    let _restore = affinity::Restore::here()?;
    affinity::pin_to(placement.map(|p| p.host))?;
    let echo_cpu = placement.map(|p| p.device);
    let mut mmio = Vec::new();
    let row = |path: &str, driver: &str, poll: &str, p50: Duration, p99: Duration| json!({"path": path, "driver": driver, "poll": poll, "p50_us": us(p50), "p99_us": us(p99)});
    say(String::new());
    let line = |cells: &[String]| say(crate::report::row(&[48, 8, 8, 11, 11], cells));
    line(&[
        match placement {
            Some(p) => format!("(a) MMIO read round trip, {n} reads, CPUs {},{}", p.device, p.host),
            None => format!("(a) MMIO read round trip, {n} reads"),
        },
        "p50 µs".into(),
        "p99 µs".into(),
        "/ sockets".into(),
        "/ driver".into(),
    ]);
    let io = |e: std::io::Error| e.to_string();
    for busy in [true, false] {
        let floor = bare_pingpong(busy, true, n, echo_cpu).map_err(io)?;
        let mode = if busy { "busy-poll" } else { "blocking" };
        let poll_name = if busy { "busy" } else { "blocking" };
        mmio.push(row("bare", "plain", poll_name, floor.p50, floor.p99));
        line(&[
            format!("bare UDP ping-pong, plain sockets, {mode}"),
            format!("{:.1}", us(floor.p50)),
            format!("{:.1}", us(floor.p99)),
            "1.00".into(),
        ]);
        for &driver in drivers {
            let dfloor = driver_pingpong(driver, busy, n, echo_cpu).map_err(io)?;
            mmio.push(row("bare", driver_name(driver), poll_name, dfloor.p50, dfloor.p99));
            line(&[
                format!("bare UDP ping-pong, {} driver, {mode}", driver_name(driver)),
                format!("{:.1}", us(dfloor.p50)),
                format!("{:.1}", us(dfloor.p99)),
                format!("{:.2}", us(dfloor.p50) / us(floor.p50)),
                "1.00".into(),
            ]);
            let poll = if busy { PollMode::Busy { spin } } else { PollMode::Blocking };
            let gpu = LocalBox::start_offload(
                driver,
                poll,
                Impairment::default(),
                Frames::Tagged,
                link::driver::Offload::AUTO,
                echo_cpu,
            )?;
            let mut d = open(&gpu, driver, poll)?;
            let (p50, p99) = mmio_rtt(&mut d, n);
            mmio.push(row("bridged", driver_name(driver), poll_name, p50, p99));
            line(&[
                format!("  through the bridges, {}, {mode}", driver_name(driver)),
                format!("{:.1}", us(p50)),
                format!("{:.1}", us(p99)),
                format!("{:.2}", us(p50) / us(floor.p50)),
                format!("{:.2}", us(p50) / us(dfloor.p50)),
            ]);
        }
    }

    Ok(mmio)
}

/// Section (b)'s rows, the GSO floor's median and its samples, and the medians of the same
/// floor from and into buffers of the copy's size: directly (one copy per side) and staged (two).
type DmaRows =
    (Vec<serde_json::Value>, Option<f64>, Vec<f64>, [Option<f64>; 2], serde_json::Value, Option<usize>);

/// The GSO + GRO floor's samples: with hot buffers, from and into copy-sized ones, and
/// staged; or why the kernel refused the offloads.
#[derive(Default)]
struct Floors {
    hot: Vec<GsoRun>,
    copy: Vec<GsoRun>,
    staged: Vec<GsoRun>,
    refused: Option<String>,
    /// What the machine took from each sample (its three streams).
    taken: Vec<crate::steal::RunTaken>,
}

impl Floors {
    /// One sample of each, unless the kernel refused the first.
    fn sample(&mut self, bytes: usize) -> Result<(), String> {
        if self.refused.is_some() {
            return Ok(());
        }
        let before = crate::steal::MachineReading::now();
        match bare_gso_stream(bytes, LINK_MTU) {
            Ok(r) => {
                self.hot.push(r);
                let io = |e: std::io::Error| e.to_string();
                self.copy.push(bare_gso_stream_with(bytes, LINK_MTU, Buffers::Copy).map_err(io)?);
                self.staged.push(bare_gso_stream_with(bytes, LINK_MTU, Buffers::Staged).map_err(io)?);
                self.taken
                    .push(crate::steal::RunTaken::between(&before, &crate::steal::MachineReading::now()));
            }
            Err(e) => self.refused = Some(e.to_string()),
        }
        Ok(())
    }
}

/// A floor's CPU per GiB as the bridged rows' columns have it (host h→d, box h→d, host d→h,
/// box d→h): in h→d the host sends and the box receives, in d→h the other way round.
fn floor_cpu(runs: &[GsoRun]) -> Option<[f64; 4]> {
    if runs.is_empty() {
        return None;
    }
    let send = Spread::of(runs.iter().map(|r| r.send_cpu_s_per_gib)).median;
    let receive = Spread::of(runs.iter().map(|r| r.receive_cpu_s_per_gib)).median;
    Some([send, receive, receive, send])
}

/// One bridged variant's copies.
struct Bridged {
    label: String,
    driver: DriverKind,
    authenticated: bool,
    zero_copy: bool,
    copied: Copied,
    link: link::Stats,
    /// What the machine took while it copied.
    taken: crate::steal::RunTaken,
}

/// (b): DMA through the bridges against bare sockets, the GSO + GRO floor and direct.
fn dma_section(
    args: &BridgeOptions,
    spin: Duration,
    drivers: &[DriverKind],
    say: &dyn Fn(String),
) -> Result<DmaRows, String> {
    let io = |e: std::io::Error| e.to_string();
    say(String::new());
    let mb = args.copy_bytes as f64 / 1e6;
    let line = |cells: &[String]| say(crate::report::row(&[48, 10, 10, 12], cells));
    line(&[format!("(b) DMA, {mb:.0} MB per copy"), "h→d MB/s".into(), "d→h MB/s".into(), "vs bare".into()]);
    let (mut dma, bytes) = (Vec::new(), args.copy_bytes);
    let dma_row = |path: &str, driver: &str, h2d: f64, d2h: f64, authenticated: bool| {
        json!({"path": path, "driver": driver, "h2d_bytes_per_s": bytes_per_s(h2d), "d2h_bytes_per_s": bytes_per_s(d2h), "bytes": bytes,
               "authenticated": authenticated})
    };
    // Bare sockets carrying the same bytes in datagrams as large as the link's.
    let dgram = 8192;
    let count = args.copy_bytes.div_ceil(dgram) as u64;
    let (bare_s, bare_got) = bare_stream(count, dgram).map_err(io)?;
    let bare = (bare_got as usize * dgram) as f64 / bare_s / 1e6;
    dma.push(dma_row("bare", "plain", bare, bare, false));
    line(&[
        format!("bare sockets, {count} × {dgram} B datagrams"),
        format!("{bare:.0}"),
        format!("{bare:.0}"),
        "1.00".into(),
    ]);
    // The floor issue 17 measures the bridges against: the kernel's UDP GSO and GRO with the
    // link's datagram size; and the same with the copy's bytes read from and written to
    // buffers of the copy's size, as the bridges must (how much of the gap to the floor is
    // memory traffic, not software), directly and staged. Sampled before the bridged rows and
    // after each of them, and taken as the median: one run of it spreads 0.6–4.5 GB/s on
    // this machine, from one minute to the next.
    let mut floors = Floors::default();
    floors.sample(args.copy_bytes)?;
    let before = crate::steal::MachineReading::now();
    let c = direct_copies(args.copy_bytes, args.copy_repeat)?;
    let direct_taken = crate::steal::RunTaken::between(&before, &crate::steal::MachineReading::now());
    let (h2d, d2h) = (c.h2d_mb_s, c.d2h_mb_s);
    let mut row = dma_row("direct", "none", h2d, d2h, false);
    taken_fields(&mut row, &direct_taken);
    dma.push(row);
    line(&[
        "directly attached simgpu (no network)".into(),
        format!("{h2d:.0}"),
        format!("{d2h:.0}"),
        format!("{:.2} / {:.2}", h2d / bare, d2h / bare),
    ]);
    // With the link's tags (the default) and without them: what authentication costs in bulk.
    // Printed once the floor's samples are in.
    // io_uring also with zero-copy sends, to see whether they win here.
    let mut bridged = Vec::new();
    for variant @ (driver, frames, offload) in variants(drivers) {
        let before = crate::steal::MachineReading::now();
        let (copied, link) = bridged_copies(args.copy_bytes, args.copy_repeat, variant, spin)?;
        let taken = crate::steal::RunTaken::between(&before, &crate::steal::MachineReading::now());
        let label = if offload.zero_copy_send {
            "  the same, zero-copy sends".to_string()
        } else if frames == Frames::Tagged {
            format!("through the bridges, {}, busy-poll", driver_name(driver))
        } else {
            "  the same, frames untagged".to_string()
        };
        let (authenticated, zero_copy) = (frames != Frames::Unauthenticated, offload.zero_copy_send);
        bridged.push(Bridged { label, driver, authenticated, zero_copy, copied, link, taken });
        floors.sample(args.copy_bytes)?;
    }
    let rates = |runs: &[GsoRun]| runs.iter().map(|r| r.mb_s).collect::<Vec<_>>();
    let (gso, copy, staged) = floor_lines(
        say,
        &rates(&floors.hot),
        floors.refused.as_deref(),
        &rates(&floors.copy),
        &rates(&floors.staged),
        mb,
        bare,
    );
    let floor_cpus = [floor_cpu(&floors.hot), floor_cpu(&floors.copy), floor_cpu(&floors.staged)];
    for b in &bridged {
        let (h2d, d2h) = (b.copied.h2d_mb_s, b.copied.d2h_mb_s);
        let mut row = dma_row("bridged", driver_name(b.driver), h2d, d2h, b.authenticated);
        cpu_fields(&mut row, b, floor_cpus);
        row["retransmits"] = json!(b.link.retransmits);
        row["replay_timeouts"] = json!(b.link.replay_timeouts);
        taken_fields(&mut row, &b.taken);
        if let Some(f) = gso {
            row["vs_gso_floor_ratio"] = json!({"h2d": h2d / f, "d2h": d2h / f});
        }
        if let Some(c) = staged {
            row["vs_gso_staged_floor_ratio"] = json!({"h2d": h2d / c.median, "d2h": d2h / c.median});
        }
        dma.push(row);
        say(crate::report::row(
            &[48, 10, 10, 12],
            &[
                b.label.clone(),
                format!("{h2d:.0}"),
                format!("{d2h:.0}"),
                format!("{:.2} / {:.2}", h2d / bare, d2h / bare),
            ],
        ) + &gso.map_or(String::new(), |f| format!("   GSO floor {:.2} / {:.2}", h2d / f, d2h / f))
            + &staged.map_or(String::new(), |c| {
                format!(", staged {:.2} / {:.2}", h2d / c.median, d2h / c.median)
            }));
    }
    cpu_table(say, &bridged, floor_cpus, mb);
    let floors_taken = crate::steal::count(&floors.taken.iter().map(|t| t.taken_from()).collect::<Vec<_>>());
    taken_line(say, direct_taken, &bridged, floors_taken.map(|n| (n, floors.taken.len())));
    let hot = floors.hot.iter().map(|r| r.mb_s).collect();
    // Each floor's sender and receiver, CPU seconds per GiB (medians of the samples).
    let cpu = |f: Option<[f64; 4]>| f.map(|[send, receive, _, _]| json!({"send": send, "receive": receive}));
    let floor_cpu =
        json!({"hot": cpu(floor_cpus[0]), "copy": cpu(floor_cpus[1]), "staged": cpu(floor_cpus[2])});
    Ok((dma, gso, hot, [copy.map(|c| c.median), staged.map(|c| c.median)], floor_cpu, floors_taken))
}

/// The floors' lines — bare sockets with UDP GSO and GRO (or why not), the same from and
/// into buffers of the copy's size, and staged — each the median of its samples; the three
/// figures.
fn floor_lines(
    say: &dyn Fn(String),
    floors: &[f64],
    gso_refused: Option<&str>,
    copy_floors: &[f64],
    staged_floors: &[f64],
    mb: f64,
    bare: f64,
) -> (Option<f64>, Option<Spread>, Option<Spread>) {
    let line = |cells: &[String]| say(crate::report::row(&[48, 10, 10, 12], cells));
    let floor = Spread::of(floors.iter().copied());
    let gso = (!floors.is_empty()).then_some(floor.median);
    match (gso, gso_refused) {
        (Some(f), _) => line(&[
            format!(
                "bare sockets, UDP GSO + GRO, {LINK_MTU} B segs: median of {} ({:.0}–{:.0})",
                floors.len(),
                floor.min,
                floor.max
            ),
            format!("{f:.0}"),
            format!("{f:.0}"),
            format!("{:.2}", f / bare),
        ]),
        (None, Some(e)) => say(format!("bare sockets with UDP GSO + GRO: refused here ({e}); no floor")),
        (None, None) => {}
    }
    let copy = (!copy_floors.is_empty()).then(|| Spread::of(copy_floors.iter().copied()));
    let staged = (!staged_floors.is_empty()).then(|| Spread::of(staged_floors.iter().copied()));
    for (what, s) in [("from and into", copy), ("staged, from and into", staged)] {
        if let Some(c) = s {
            line(&[
                format!("  the same, {what} {mb:.0} MB buffers ({:.0}–{:.0})", c.min, c.max),
                format!("{:.0}", c.median),
                format!("{:.0}", c.median),
                format!("{:.2}", c.median / bare),
            ]);
        }
    }
    (gso, copy, staged)
}

/// A row's `steal_ms`, `others_ms` (other tasks' CPU time on the machine while it ran),
/// `run_ms` (its wall time) and `taken_from` ([`crate::steal::RunTaken`]).
fn taken_fields(row: &mut serde_json::Value, t: &crate::steal::RunTaken) {
    let (steal, others) = t.ms();
    row["steal_ms"] = json!(steal);
    row["others_ms"] = json!(others);
    row["run_ms"] = json!(t.run.as_secs_f64() * 1e3);
    row["taken_from"] = json!(t.taken_from());
}

/// The rows and floor samples the machine took a share of, where any: their figures
/// measured it, not the bridges.
fn taken_line(
    say: &dyn Fn(String),
    direct: crate::steal::RunTaken,
    bridged: &[Bridged],
    floors: Option<(usize, usize)>,
) {
    let mut rows: Vec<String> = Vec::new();
    if direct.taken_from() == Some(true) {
        rows.push("direct".into());
    }
    rows.extend(
        bridged.iter().filter(|b| b.taken.taken_from() == Some(true)).map(|b| b.label.trim().to_string()),
    );
    let floors = floors.filter(|(n, _)| *n > 0);
    if rows.is_empty() && floors.is_none() {
        return;
    }
    let mut what = rows.join("; ");
    if let Some((n, of)) = floors {
        what += &format!("{}{n} of {of} floor samples", if what.is_empty() { "" } else { "; " });
    }
    say(format!(
        "TAKEN: the hypervisor ({:.0} % of a run from a CPU) or other tasks ({:.0} % of it on the machine's CPUs) took time from {what}: those figures measured the machine, not the bridges",
        crate::steal::STOLEN_SHARE * 100.0,
        crate::steal::OTHERS_SHARE * 100.0
    ));
}

/// The bridged rows' variants: each driver with the link's tags (the default) and without
/// them (what authentication costs in bulk), io_uring also with zero-copy sends.
fn variants(drivers: &[DriverKind]) -> Vec<(DriverKind, Frames, link::driver::Offload)> {
    let auto = link::driver::Offload::AUTO;
    let zero_copy = link::driver::Offload { zero_copy_send: true, ..auto };
    let mut variants = Vec::new();
    for &driver in drivers {
        variants.push((driver, Frames::Tagged, auto));
        variants.push((driver, Frames::Unauthenticated, auto));
        if driver == DriverKind::IoUring {
            variants.push((driver, Frames::Tagged, zero_copy));
        }
    }
    variants
}

/// A bridged row's CPU figures: per side and way, with the spins and without (the work), and
/// the work over each floor's.
fn cpu_fields(row: &mut serde_json::Value, b: &Bridged, floor_cpus: [Option<[f64; 4]>; 3]) {
    row["zero_copy_send"] = json!(b.zero_copy);
    let c = &b.copied;
    row["host_cpu_s_per_gib"] = json!({"h2d": c.host_cpu[0], "d2h": c.host_cpu[1]});
    row["box_cpu_s_per_gib"] = json!({"h2d": c.box_cpu[0], "d2h": c.box_cpu[1]});
    row["host_work_s_per_gib"] = json!({"h2d": c.host_work[0], "d2h": c.host_work[1]});
    row["box_work_s_per_gib"] = json!({"h2d": c.box_work[0], "d2h": c.box_work[1]});
    // Per direction, both sides together: on loopback the sender's system call also runs
    // the receiver's half of the kernel's path (the softirq that queues the datagram), so
    // a side alone says more about loopback than about the bridge.
    for (key, floor) in [
        ("cpu_vs_gso_floor_ratio", floor_cpus[0]),
        ("cpu_vs_gso_copy_floor_ratio", floor_cpus[1]),
        ("cpu_vs_gso_staged_floor_ratio", floor_cpus[2]),
    ] {
        if let Some(f) = floor {
            let [h2d, d2h] = both_ways(c.work(), f);
            row[key] = json!({"h2d": h2d, "d2h": d2h});
        }
    }
}

/// Both sides' CPU per GiB together in `w` (the tables' four columns) over the same in the
/// floor's `f`, h→d then d→h.
fn both_ways(w: [f64; 4], f: [f64; 4]) -> [f64; 2] {
    [(w[0] + w[1]) / (f[0] + f[1]), (w[2] + w[3]) / (f[2] + f[3])]
}

/// The CPU seconds per GiB each side spent working — its thread's CPU time less what its
/// passes that found nothing took — the floors' beside them, and the bridged rows' CPU time
/// with the spins (busy polling's: the rate's inverse more than the work).
fn cpu_table(say: &dyn Fn(String), bridged: &[Bridged], floors: [Option<[f64; 4]>; 3], mb: f64) {
    if bridged.is_empty() {
        return;
    }
    say(String::new());
    let line = |cells: &[String]| say(crate::report::row(&[48, 10, 10, 10, 10, 14], cells));
    let head =
        ["    CPU seconds per GiB, working", "host h→d", "box h→d", "host d→h", "box d→h", "both ÷ floor"];
    line(&head.map(String::from));
    let figures = |w: [f64; 4]| w.map(|x| format!("{x:.3}"));
    let names = [
        "bare sockets, UDP GSO + GRO (send / receive)".to_string(),
        format!("  the same, from and into {mb:.0} MB buffers"),
        "  the same, staged".to_string(),
    ];
    for (name, f) in names.iter().zip(floors) {
        if let Some(f) = f {
            line(&[[name.clone()].as_slice(), &figures(f), &["".into()]].concat());
        }
    }
    for b in bridged {
        let w = b.copied.work();
        let ratio = match (floors[0], floors[2]) {
            (Some(hot), Some(staged)) => {
                let ([a, b], [c, d]) = (both_ways(w, hot), both_ways(w, staged));
                format!("{a:.2} / {b:.2}, staged {c:.2} / {d:.2}")
            }
            _ => String::new(),
        };
        line(
            &[[b.label.replace(", busy-poll", ", spins not counted")].as_slice(), &figures(w), &[ratio]]
                .concat(),
        );
        let busy = ["    with the spins".to_string()];
        line(&[busy.as_slice(), &figures(b.copied.sides()), &["".into()]].concat());
    }
    say("(both ÷ floor: host and box together over the floor's sender and receiver, h→d / d→h;".into());
    say(" on loopback a sender's system call also runs the receiver's half of the kernel's path)".into());
}

/// (c): the demo workload bridged against direct.
fn workload_section(
    scale: u32,
    options: &crate::loopback::Options,
    say: &dyn Fn(String),
) -> Result<Value, String> {
    say(String::new());
    let o = crate::loopback::run(options, &mut |_| {})?;
    let ((b, d), overhead) = (o.seconds(), o.overhead());
    say(format!(
        "(c) demo workload (scale {}, medians of {} runs each way in turns): bridged {:.2} ms, direct {:.2} ms, overhead {:.0} % ({:.0} to {:.0} %)",
        scale,
        options.repeat,
        b.median * 1e3,
        d.median * 1e3,
        overhead.median,
        overhead.min,
        overhead.max
    ));
    Ok(crate::loopback::report::json(options, &o, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy size out of range is refused before any floor or copy runs (a floor streams
    /// the size it is given: 2⁶⁴ − 1 bytes would never end).
    #[test]
    fn a_copy_size_out_of_range_is_refused_before_anything_runs() {
        for bytes in [0, MAX_COPY_BYTES + 1, usize::MAX] {
            let args = BridgeOptions {
                iterations: 100,
                copy_bytes: bytes,
                copy_repeat: 1,
                mmio: None,
                dma: true,
                workload: None,
                driver: Some(DriverKind::Portable),
            };
            let said = std::cell::RefCell::new(Vec::new());
            let e = run(&args, &|l| said.borrow_mut().push(l)).unwrap_err();
            assert!(e.to_string().contains(&format!("a copy of {bytes} bytes")), "{e}");
            assert!(said.borrow().is_empty(), "measured something: {:?}", said.borrow());
        }
    }
}
