//! The GPU-box endpoint: it exports the box's devices (simulated GPUs, or real ones through
//! VFIO) to hosts over the link. Hosts authenticate with their own pre-shared keys (the
//! session proves the key the host names, see `docs/wire-protocol.md`); each device lists
//! the hosts that may attach it and belongs to one host at a time. The endpoint executes the
//! owner's TLPs against the device, carries the device's DMA requests and MSI-X writes to
//! the owner, and hands the owner's completions back to the device. When the owner detaches
//! or its session goes down, the device is reset (function-level) so the next host gets a
//! clean device; its in-flight DMA is dropped and counted.
//!
//! One thread runs everything, run-to-completion: [`GpuEndpoint::poll`] receives what the
//! socket has, steps every session and every attached device, and sends what they produced.
//! [`GpuEndpoint::run`] loops on it until told to stop, spinning or sleeping in the kernel
//! as the [`PollMode`](link::driver::PollMode) says.
//!
//! The rooms, each below the ones that use it: `spec` (what the endpoint is told), `error`,
//! `stats` (what it counts), `claims` (what a pool says of claims, the ownership journal),
//! `export` (each exported device: its BARs, owner and backlog, its upstream port, opening
//! and releasing it), `session` (what the box knows of a host's session), `attach` (how an
//! ATTACH is answered), `endpoint` (the endpoint and its poll loop in named phases: receive,
//! answer the kept requests, timers and session events, let the devices work), `pool` (the
//! endpoint serving a pool: claims confirmed, owners cut off), `ops` (what the control
//! socket reports and changes), `hosts` (hosts removed and re-keyed while it runs), `thread` (the endpoint on a thread of its own). This file
//! only names them.
#![forbid(unsafe_code)]

mod attach;
mod claims;
mod endpoint;
mod error;
mod export;
mod hosts;
mod ops;
mod pool;
mod session;
mod spec;
mod stats;
mod thread;

pub use claims::{
    CLAIM_CONFIRM_TIMEOUT, ClaimCheck, ClaimVerdict, HealthSink, OwnershipEvent, OwnershipSink,
};
pub use endpoint::GpuEndpoint;
pub use error::GpuError;
pub use export::BOX_ROOT;
pub use ops::{ExportReport, SessionReport};
pub use spec::{DeviceSpec, ExportSpec, GpuOptions, HostKey};
pub use stats::{ExportIdentity, ExportStats, GpuStats};
pub use thread::{EndpointThread, SpawnError};
