//! `dxpu bench pool`: a claim-and-release storm against a three-member etcd cluster (started
//! here, or the one `--etcd` names): simulated hosts over simulated boxes, at each pool size
//! asked for with the same number of hosts per device, so that what grows with the pool
//! shows. Claims per second, claim latency (p50, p99), etcd round trips per claim, double
//! allocations.

use std::time::Duration;

use clap::Args;
use pool::storm::{StormParams, StormReport};

/// Options of `dxpu bench pool`.
#[derive(Args, Debug)]
pub(crate) struct PoolBench {
    /// etcd endpoints, comma-separated, as URLs or host:port (default: a three-member cluster
    /// started here from the `etcd` binary, Debian's etcd-server).
    #[arg(long, value_delimiter = ',')]
    etcd: Vec<String>,
    /// Pool sizes as boxes (each of --devices-per-box devices), comma-separated; the largest
    /// gets --hosts hosts, the others as many per device.
    #[arg(long, value_delimiter = ',', default_value = "10,100",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    boxes: Vec<u32>,
    /// Devices per box (1..=64).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    devices_per_box: u32,
    /// Simulated hosts at the largest size (1..=10000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    hosts: u32,
    /// Seconds of storm per size (1..=600).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    seconds: u64,
    /// How long a host holds a device, ms (0..=10000).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    hold_ms: u64,
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run_pool_bench(args: PoolBench) -> Result<(), String> {
    let cluster;
    let cfg = if args.etcd.is_empty() {
        cluster = pool::cluster::EtcdCluster::start(3).map_err(|e| e.to_string())?;
        cluster.config()
    } else {
        let urls: Result<Vec<String>, _> = args.etcd.iter().map(|e| pool::etcd_url(e)).collect();
        let c = pool::PoolConfig::new(urls.map_err(|e| format!("--etcd: {e}"))?);
        c.validate().map_err(|e| format!("--{e}"))?;
        c
    };
    let mut cfg = cfg;
    cfg.request_timeout = Duration::from_secs(5);
    let largest = args.boxes.iter().copied().max().unwrap_or(1) as f64;
    let mut reports: Vec<StormReport> = Vec::new();
    let steps = crate::out::Steps::counted("bench pool", args.boxes.len() as u32);
    for (i, &b) in args.boxes.iter().enumerate() {
        let hosts = ((args.hosts as f64 * b as f64 / largest).round() as usize).max(1);
        let p = StormParams {
            boxes: b as usize,
            devices_per_box: args.devices_per_box as usize,
            hosts,
            duration: Duration::from_secs(args.seconds),
            hold: Duration::from_millis(args.hold_ms),
        };
        steps.step(&format!(
            "storm {} of {}: {} boxes × {} devices, {hosts} hosts, {} s",
            i + 1,
            args.boxes.len(),
            b,
            args.devices_per_box,
            args.seconds
        ));
        let r = pool::block_on(pool::storm::storm(&cfg, &p)).and_then(|r| r).map_err(|e| e.to_string())?;
        reports.push(r);
    }
    drop(steps);
    if args.json {
        outln!("{}", crate::out::json_pretty(&reports));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = reports.iter().map(StormReport::row).collect();
    out!("{}", ops::table::table(&StormReport::COLUMNS, &rows));
    if reports.iter().any(|r| r.double_allocations > 0) {
        return Err("double allocations: see the log".into());
    }
    Ok(())
}
