//! `dxpu loopback`: both endpoints and a simulated GPU on one machine, over real UDP
//! loopback. The simgpu driver runs the demo workload through the bridges (every result
//! checked against the CPU), then the same workload on a directly attached simgpu, and the
//! report compares them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bridge_gpu::{DeviceSpec, ExportSpec, GpuEndpoint, GpuOptions, HostKey};
use bridge_host::{AttachOptions, HostStats, RemoteDevice};
use clap::Args;
use driver::SimGpuDriver;
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use link::PresharedKey;
use link::driver::{DriverKind, Impairment, PollMode};
use serde_json::json;
use testbed::direct::DirectAttach;
use testbed::workload::{self, WorkloadReport, WorkloadSize};

use crate::config::{DriverArg, PollArg};

/// Options of `dxpu loopback`.
#[derive(Args, Debug, Clone)]
pub(crate) struct LoopbackArgs {
    /// Workload size, 1..=32: MiB copied each way, ×64 Ki-element vectors.
    #[arg(long, default_value_t = 4)]
    pub(crate) scale: u32,
    /// UDP driver.
    #[arg(long, value_enum, default_value_t = DriverArg::Auto)]
    driver: DriverArg,
    /// How the endpoints wait for work.
    #[arg(long, value_enum, default_value_t = PollArg::Busy)]
    poll: PollArg,
    /// Busy-poll budget before sleeping in the kernel, µs.
    #[arg(long, default_value_t = 2000)]
    spin_us: u64,
    /// Added one-way delay in each direction, µs (emulates distance).
    #[arg(long, default_value_t = 0)]
    delay_us: u64,
    /// Random extra delay per datagram, up to this many µs (reorders).
    #[arg(long, default_value_t = 0)]
    jitter_us: u64,
    /// Datagram loss probability in each direction, 0.0..=0.5.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Encrypt the frames' bodies (link.encrypt_frames), as on a fabric others can read.
    #[arg(long)]
    encrypt: bool,
    /// MMIO reads timed for the round-trip figures.
    #[arg(long, default_value_t = 2000)]
    pub(crate) rtt_samples: usize,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Instead of running the workload, serve the remote simgpu to a VMM over vfio-user on
    /// DIR/gpu0.sock (QEMU: -device vfio-user-pci) until SIGINT or SIGTERM.
    #[arg(long, value_name = "DIR")]
    vfio_user: Option<std::path::PathBuf>,
    /// Log level: error, warn, info, debug or trace.
    #[arg(long, default_value = "warn")]
    log_level: String,
}

impl LoopbackArgs {
    /// The impairment the options ask for, seeded.
    fn impairment(&self, seed: u64) -> Impairment {
        Impairment {
            loss: self.loss,
            delay: Duration::from_micros(self.delay_us),
            jitter: Duration::from_micros(self.jitter_us),
            seed,
            ..Impairment::default()
        }
    }

    /// What `dxpu loopback` runs with no options.
    pub(crate) fn defaults() -> LoopbackArgs {
        LoopbackArgs {
            scale: 4,
            driver: DriverArg::Auto,
            poll: PollArg::Busy,
            spin_us: 2000,
            delay_us: 0,
            jitter_us: 0,
            loss: 0.0,
            encrypt: false,
            rtt_samples: 2000,
            json: false,
            vfio_user: None,
            log_level: "warn".into(),
        }
    }
}

fn us(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

fn gbps(bytes: usize, seconds: f64) -> f64 {
    if seconds > 0.0 { bytes as f64 * 8.0 / seconds / 1e9 } else { 0.0 }
}

/// What one run found.
pub(crate) struct Outcome {
    pub(crate) bridged: WorkloadReport,
    pub(crate) direct: WorkloadReport,
    rtt: (Duration, Duration),
    direct_rtt: (Duration, Duration),
    host: HostStats,
    driver: String,
    offload: link::driver::OffloadState,
    /// The link's MTU and the device's Max_Payload_Size through it.
    sizes: (usize, u32),
}

fn random_key() -> PresharedKey {
    let mut rng = link::driver::os_rng(&mut |m| log::warn!("{m}"));
    let mut k = [0u8; 32];
    rng.fill(&mut k);
    PresharedKey::new(&k).unwrap_or_else(|| unreachable!("32 bytes is a valid key length"))
}

/// How a loopback link protects its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frames {
    /// Tagged (the link's default, `authenticate_frames`).
    Tagged,
    /// Bodies encrypted and tagged (`encrypt_frames`).
    Encrypted,
    /// Neither: for measuring what the tags cost (both ends must agree).
    Unauthenticated,
}

impl Frames {
    pub(crate) fn from_encrypt(encrypt: bool) -> Frames {
        if encrypt { Frames::Encrypted } else { Frames::Tagged }
    }
}

/// A GPU-box endpoint with one simgpu on its own thread, on 127.0.0.1.
pub(crate) struct LocalBox {
    pub(crate) addr: SocketAddr,
    pub(crate) key: PresharedKey,
    pub(crate) link: link::Config,
    /// The offloads both endpoints ask their drivers for.
    pub(crate) offload: link::driver::Offload,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LocalBox {
    pub(crate) fn start(
        driver: DriverKind,
        poll: PollMode,
        impairment: Impairment,
    ) -> Result<LocalBox, String> {
        LocalBox::start_with(driver, poll, impairment, Frames::Tagged)
    }

    /// [`LocalBox::start`], its link's frames protected as `frames` says.
    pub(crate) fn start_with(
        driver: DriverKind,
        poll: PollMode,
        impairment: Impairment,
        frames: Frames,
    ) -> Result<LocalBox, String> {
        LocalBox::start_offload(driver, poll, impairment, frames, link::driver::Offload::AUTO)
    }

    /// [`LocalBox::start_with`], both endpoints' drivers asked for `offload`.
    pub(crate) fn start_offload(
        driver: DriverKind,
        poll: PollMode,
        impairment: Impairment,
        frames: Frames,
        offload: link::driver::Offload,
    ) -> Result<LocalBox, String> {
        let key = random_key();
        let mut link_cfg = link::Config::new(key.clone());
        // Loopback carries 4 KiB payloads in one datagram.
        link_cfg.mtu = 9000;
        link_cfg.size_for_path(link::DEFAULT_PATH_BANDWIDTH, link::DEFAULT_PATH_RTT);
        link_cfg.encrypt_frames = frames == Frames::Encrypted;
        // Tags are on when either end asks for them: both ends here share this setting.
        link_cfg.authenticate_frames = frames != Frames::Unauthenticated;
        let opts = GpuOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            link: link_cfg.clone(),
            hosts: vec![HostKey { name: "loopback-host".into(), key: key.clone() }],
            exports: vec![ExportSpec {
                name: "gpu0".into(),
                device: DeviceSpec::Sim(SimGpuParams::default()),
                allow: vec!["loopback-host".into()],
            }],
            driver,
            offload,
            poll,
            impairment,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("dxpu-gpu".into())
            .spawn(move || {
                let mut ep = match GpuEndpoint::new(opts) {
                    Ok(ep) => ep,
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = tx.send(ep.local_addr().map_err(|e| e.to_string()));
                if let Err(e) = ep.run(&stop2) {
                    log::error!("GPU-box endpoint: {e}");
                }
            })
            .map_err(|e| format!("starting the GPU-box endpoint: {e}"))?;
        let addr = rx.recv().map_err(|_| "the GPU-box endpoint did not start".to_string())??;
        Ok(LocalBox { addr, key, link: link_cfg, offload, stop, thread: Some(thread) })
    }

    /// Options for attaching its gpu0.
    pub(crate) fn attach_options(
        &self,
        driver: DriverKind,
        poll: PollMode,
        impairment: Impairment,
    ) -> AttachOptions {
        let mut o = AttachOptions::new(self.addr, "gpu0", self.key.clone());
        o.link = self.link.clone();
        o.driver = driver;
        o.offload = self.offload;
        o.poll = poll;
        o.impairment = impairment;
        o.dma_memory = 256 << 20;
        o
    }
}

impl Drop for LocalBox {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub(crate) use testbed::workload::mmio_read_rtt as mmio_rtt;

pub(crate) fn run(args: &LoopbackArgs, progress: &mut dyn FnMut(&str)) -> Result<Outcome, String> {
    if !(1..=32).contains(&args.scale) {
        return Err(format!("--scale {}: must be 1..=32", args.scale));
    }
    if !(0.0..=0.5).contains(&args.loss) {
        return Err(format!("--loss {}: must be 0.0..=0.5", args.loss));
    }
    let driver = args.driver.kind();
    let poll = args.poll.mode(Duration::from_micros(args.spin_us));
    let imp = |seed| args.impairment(seed);
    let gpu = LocalBox::start_with(driver, poll, imp(11), Frames::from_encrypt(args.encrypt))?;
    progress("attaching gpu0 through the host endpoint");
    let mut o = gpu.attach_options(driver, poll, imp(12));
    // Distance adds to every round trip: keep the timeout above it.
    o.completion_timeout += 4 * Duration::from_micros(args.delay_us + args.jitter_us);
    let remote = RemoteDevice::attach(o).map_err(|e| e.to_string())?;
    let driver_name = remote.driver_name().to_string();
    let mut d = SimGpuDriver::open(remote).map_err(|e| format!("opening the remote simgpu: {e}"))?;
    let (offload, sizes) = (d.pci().offload(), d.pci().payload_sizes());
    progress("timing MMIO reads");
    let rtt = mmio_rtt(&mut d, args.rtt_samples);
    let size = WorkloadSize::scaled(args.scale);
    let bridged = workload::run(&mut d, size, &mut |s| progress(&format!("bridged: {s}")))
        .map_err(|e| format!("bridged workload: {e}"))?;
    let host = d.pci().stats();
    d.into_pci().detach();
    drop(gpu);

    let dev = SimGpu::new(tlp::Bdf::new(1, 0, 0), SimGpuParams::default());
    let mut direct = SimGpuDriver::open(DirectAttach::new(dev, 256 << 20))
        .map_err(|e| format!("opening the direct simgpu: {e}"))?;
    let direct_rtt = mmio_rtt(&mut direct, args.rtt_samples);
    let direct_report = workload::run(&mut direct, size, &mut |s| progress(&format!("direct: {s}")))
        .map_err(|e| format!("direct workload: {e}"))?;
    Ok(Outcome { bridged, direct: direct_report, rtt, direct_rtt, host, driver: driver_name, offload, sizes })
}

fn tlp_totals(h: &HostStats) -> BTreeMap<&'static str, u64> {
    let mut t = h.tlps_sent.clone();
    for (k, v) in &h.tlps_received {
        *t.entry(k).or_default() += v;
    }
    t
}

/// `--vfio-user DIR`: the box and the host endpoint as for the workload, the remote simgpu
/// served on DIR/gpu0.sock until SIGINT or SIGTERM.
fn serve_vfio_user(args: &LoopbackArgs, dir: &std::path::Path) -> Result<(), String> {
    let driver = args.driver.kind();
    // The server waits on the client socket and the link together: the portable driver
    // gives it a descriptor to wait on (docs/vfio-user.md).
    let driver = if driver == DriverKind::Auto { DriverKind::Portable } else { driver };
    let poll = args.poll.mode(Duration::from_micros(args.spin_us));
    let imp = |seed| args.impairment(seed);
    let stop = crate::daemon::stop_flag()?;
    std::fs::create_dir_all(dir).map_err(|e| format!("--vfio-user {}: {e}", dir.display()))?;
    let gpu = LocalBox::start_with(driver, poll, imp(11), Frames::from_encrypt(args.encrypt))?;
    let mut o = gpu.attach_options(driver, poll, imp(12));
    o.completion_timeout += 4 * Duration::from_micros(args.delay_us + args.jitter_us);
    // The VMM grants guest memory; the server thread drives the link.
    o.dma_memory = 0;
    o.service_interval = None;
    let remote = RemoteDevice::attach(o).map_err(|e| e.to_string())?;
    let path = dir.join("gpu0.sock");
    let mut server = bridge_host::vfio_user::VfioUserServer::bind(&path, remote, poll)
        .map_err(|e| format!("--vfio-user: {e}"))?;
    eprintln!(
        "dxpu loopback: serving the remote simgpu on {} (QEMU: -device '{{\"driver\":\"vfio-user-pci\",\"socket\":{{\"path\":\"{}\",\"type\":\"unix\"}}}}'); SIGINT or SIGTERM stops",
        path.display(),
        path.display()
    );
    server.serve(&stop).map_err(|e| format!("vfio-user: {e}"))?;
    let c = server.counters();
    eprintln!(
        "dxpu loopback: stopped after {} client(s), {} commands ({} errors), {} interrupts delivered",
        c.clients.load(Ordering::Relaxed),
        c.commands.load(Ordering::Relaxed),
        c.errors.load(Ordering::Relaxed),
        c.interrupts.load(Ordering::Relaxed)
    );
    let stats = server.device().stats();
    eprintln!("dxpu loopback: TLPs host→box {:?}, box→host {:?}", stats.tlps_sent, stats.tlps_received);
    server.into_device().detach();
    drop(gpu);
    Ok(())
}

pub(crate) fn run_loopback(args: LoopbackArgs) -> ExitCode {
    if let Err(e) = crate::daemon::init_logging(&args.log_level) {
        eprintln!("dxpu loopback: {e}");
        return ExitCode::FAILURE;
    }
    if let Some(dir) = args.vfio_user.clone() {
        return match serve_vfio_user(&args, &dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dxpu loopback: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let start = Instant::now();
    let quiet = args.json;
    let mut progress = |s: &str| {
        if !quiet {
            eprintln!("[{:6.2} s] {s}", start.elapsed().as_secs_f64());
        }
    };
    let o = match run(&args, &mut progress) {
        Ok(o) => o,
        Err(e) => {
            if args.json {
                println!("{}", json!({ "verified": false, "error": e }));
            } else {
                eprintln!("dxpu loopback: {e}");
            }
            return ExitCode::FAILURE;
        }
    };
    let overhead = (o.bridged.seconds / o.direct.seconds - 1.0) * 100.0;
    let tlps = tlp_totals(&o.host);
    if args.json {
        let report = report_json(&args, &o);
        println!("{report}");
        return ExitCode::SUCCESS;
    }
    println!(
        "dxpu loopback — a simulated GPU behind a GPU-box endpoint, used through a host endpoint over UDP"
    );
    println!(
        "  link: 127.0.0.1, driver {}, {} poll, added delay {} µs one-way, jitter {} µs, loss {:.1} %, frames {}",
        o.driver,
        args.poll.name(),
        args.delay_us,
        args.jitter_us,
        args.loss * 100.0,
        if args.encrypt { "encrypted" } else { "authenticated" }
    );
    println!();
    println!("  workload (every result checked against the CPU)          bridged      direct");
    for (b, d) in o.bridged.steps.iter().zip(&o.direct.steps) {
        println!("    {:<52} {:>9}  {:>9}", b.name, fmt_s(b.seconds), fmt_s(d.seconds));
    }
    println!("  all results verified: yes");
    println!();
    println!("  TLPs by kind (host→box / box→host):");
    for k in tlps.keys() {
        println!(
            "    {:<8} {:>9} / {}",
            k,
            o.host.tlps_sent.get(k).copied().unwrap_or(0),
            o.host.tlps_received.get(k).copied().unwrap_or(0)
        );
    }
    println!("  interrupts {}, retransmitted frames {}", o.host.interrupts, o.host.link.retransmits);
    println!(
        "  link: {} driver, MTU {}, Max_Payload_Size {} B, {}",
        o.driver,
        o.sizes.0,
        o.sizes.1,
        o.offload.describe()
    );
    println!();
    println!(
        "  MMIO read round trip: p50 {:.1} µs, p99 {:.1} µs   (direct: p50 {:.2} µs)",
        us(o.rtt.0),
        us(o.rtt.1),
        us(o.direct_rtt.0)
    );
    println!(
        "  DMA host→device {:.2} Gbit/s, device→host {:.2} Gbit/s   (direct: {:.2} / {:.2})",
        gbps(o.bridged.h2d.0, o.bridged.h2d.1),
        gbps(o.bridged.d2h.0, o.bridged.d2h.1),
        gbps(o.direct.h2d.0, o.direct.h2d.1),
        gbps(o.direct.d2h.0, o.direct.d2h.1)
    );
    println!(
        "  workload: bridged {}, direct {}, overhead {overhead:.0} %",
        fmt_s(o.bridged.seconds),
        fmt_s(o.direct.seconds)
    );
    ExitCode::SUCCESS
}

fn fmt_s(s: f64) -> String {
    workload::human(Duration::from_secs_f64(s.max(0.0)))
}

/// `loopback --json`'s object (and `bench bridge --json`'s `workload`).
pub(crate) fn report_json(args: &LoopbackArgs, o: &Outcome) -> serde_json::Value {
    let overhead = (o.bridged.seconds / o.direct.seconds - 1.0) * 100.0;
    let tlps = tlp_totals(&o.host);
    json!({
        "verified": true,
        "steps": o.bridged.steps.iter().map(|s| json!({"name": s.name, "bridged_seconds": s.seconds})).collect::<Vec<_>>(),
        "tlps": tlps,
        "tlps_host_to_box": o.host.tlps_sent,
        "tlps_box_to_host": o.host.tlps_received,
        "mmio_read_rtt_us": { "p50": us(o.rtt.0), "p99": us(o.rtt.1) },
        "direct_mmio_read_rtt_us": { "p50": us(o.direct_rtt.0), "p99": us(o.direct_rtt.1) },
        "dma_h2d_gbps": gbps(o.bridged.h2d.0, o.bridged.h2d.1),
        "dma_d2h_gbps": gbps(o.bridged.d2h.0, o.bridged.d2h.1),
        "direct_dma_h2d_gbps": gbps(o.direct.h2d.0, o.direct.h2d.1),
        "direct_dma_d2h_gbps": gbps(o.direct.d2h.0, o.direct.d2h.1),
        "direct_seconds": o.direct.seconds,
        "bridged_seconds": o.bridged.seconds,
        "overhead_percent": overhead,
        "interrupts": o.host.interrupts,
        "retransmits": o.host.link.retransmits,
        "link_driver": o.driver,
        "mtu": o.sizes.0,
        "max_payload": o.sizes.1,
        "gso": o.offload.gso,
        "gro": o.offload.gro,
        "poll": args.poll.name(),
        "delay_us": args.delay_us,
        "loss": args.loss,
        "encrypted": args.encrypt,
    })
}
