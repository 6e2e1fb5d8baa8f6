//! The endpoints as daemons: what `dxpu gpu` and `dxpu host` run besides the endpoints
//! themselves, as a library, so that reload, fencing and control behaviour are tested in
//! process rather than by signalling a process. `dxpu` parses arguments and prints; this
//! crate does the rest:
//!
//! - `config` — the TOML files (`gpu.toml`, `host.toml`) read, bounded and validated, with
//!   every error naming the file, the key and the value; the options they give.
//! - `gpu`, `host`, `pool_host` — the box's loop, the host's (each `[[attach]]` on a
//!   thread of its own, tried again with backoff when it fails), the pool host's; reload;
//!   readiness.
//! - `control` — the JSON-RPC 2.0 control socket, a thread per client; `metrics` — the
//!   Prometheus endpoint on hyper; `capture` — pcapng of the link; `notify` — sd_notify;
//!   `reload` — configuration read off the loop with a deadline; `process` — logging and the
//!   signal flags; `error` — why a run time could not start or go on, typed; `stats` — the endpoints' counters as JSON and a host's metrics, which the
//!   three run times share (below them, so that none reaches into another for them).
//!
//! Nothing here is on a datapath: the loops poll the endpoints and hand control calls and
//! scrapes to them between polls; no client, file or scrape can hold a session up.
#![forbid(unsafe_code)]

pub mod against;
pub mod caller;
pub mod capture;
pub mod config;
pub mod control;
pub mod error;
pub mod gpu;
pub mod host;
pub mod metrics;
pub mod notify;
pub mod pool_host;
pub mod process;
pub mod reload;
pub mod stats;
pub mod table;

/// What runs on each device a `--workload` host attached (not served over vfio-user): its
/// label, the device, and the stop flag (raised by a signal); whether it verified. The
/// device is the callee's to detach. (The static host's and the pool host's run times both
/// take one.)
pub type Workload<'a> =
    &'a mut dyn FnMut(&str, bridge_host::RemoteDevice, &std::sync::atomic::AtomicBool) -> bool;
