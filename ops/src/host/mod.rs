//! `dxpu host` with `[[attach]]`: each configured device attached (and served over
//! vfio-user where the file says), watched, and changed at run time — `dxpu ctl attach` /
//! `detach` of a configured device, SIGHUP or `dxpu ctl reload` for the whole file — while
//! the others keep running.
//!
//! A fault stays with its device: every attach runs on a thread of its own, and one that
//! fails (a box that does not answer, a key it refuses) or a device removed later (its link
//! dead) is tried again with backoff and jitter, said in the log, shown as `down` in `dxpu
//! ctl devices` and the metrics — never touching another device. The control socket and the
//! metrics server answer from the main loop, which holds no device's lock and waits on no
//! attach: a `ctl attach` is answered when its attempt ends, other calls meanwhile.
//!
//! `runtime` holds the devices, the calls and the file; `process` runs them as a process
//! (signals, readiness, the main loop). This file only names them.

mod process;
mod runtime;

pub use crate::Workload;
pub use crate::stats::{device_metrics, host_exposition, host_stats_json};
pub use process::{HostStart, check, check_against_running, run, serve};
pub use runtime::{Entry, HostConfig, HostRuntime, METHODS, Overrides, entries, read_host_file};
