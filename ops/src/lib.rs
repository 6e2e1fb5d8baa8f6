//! The endpoints as daemons: what `dxpu gpu` and `dxpu host` run besides the endpoints
//! themselves, as a library, so that reload, fencing and control behaviour are tested in
//! process rather than by signalling a process. `dxpu` parses arguments and prints; this
//! crate does the rest:
//!
//! - `config` — the TOML files (`gpu.toml`, `host.toml`) read, bounded and validated, with
//!   every error naming the file, the key and the value; the options they give.
//! - `gpu_run`, `host_run`, `pool_run` — the box's loop, the host's (each `[[attach]]` on a
//!   thread of its own, tried again with backoff when it fails), the pool host's; reload;
//!   readiness.
//! - `control` — the JSON-RPC 2.0 control socket, a thread per client; `metrics` — the
//!   Prometheus endpoint on hyper; `capture` — pcapng of the link; `notify` — sd_notify;
//!   `reload` — configuration read off the loop with a deadline; `process` — logging and the
//!   signal flags.
//!
//! Nothing here is on a datapath: the loops poll the endpoints and hand control calls and
//! scrapes to them between polls; no client, file or scrape can hold a session up.
#![forbid(unsafe_code)]

pub mod capture;
pub mod config;
pub mod control;
pub mod gpu_run;
pub mod host_run;
pub mod metrics;
pub mod notify;
pub mod pool_run;
pub mod process;
pub mod reload;
