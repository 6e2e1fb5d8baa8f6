//! dxpu's experiments, as a library tested in process: what `dxpu loopback`, `dxpu model`,
//! `dxpu replay` and the benches measure with, where the `dxpu` command keeps only their
//! arguments, tables and JSON.
//!
//! - [`affinity`]: which CPUs the spinning threads run on; [`cores`]: how far apart two
//!   CPUs are (a cache line's round trip), and whether that moved during a comparison;
//! - [`loopback`]: a workload run through both endpoints and directly attached, in turns,
//!   with the link measured and the workload's transaction profile counted;
//! - [`bulk`]: bulk copies measured, pinned (the DMA engine alone, each side's CPU and
//!   work) and staged (the driver's `memcpy`), bridged or direct;
//! - [`floor`]: what the benches compare the bridges with: bare UDP ping-pongs and streams
//!   (with GSO and GRO), plain sockets and a link driver alone;
//! - [`harness`]: a GPU-box endpoint with one simgpu on a thread of its own, and a figure's
//!   median and spread over runs;
//! - [`model`]: the performance model, a bridged time predicted from a transaction profile,
//!   and [`model::LinkParams`], the link as every prediction here sees it;
//! - [`trace`], [`plan`], [`replay`]: PyTorch profiler traces read, made a dependency graph
//!   (evaluated at a link: the model of a traced job), and replayed on the simgpu;
//! - [`served`]: a remote simgpu served over vfio-user, and clients as QEMU's;
//! - [`session`]: the link's sessions alone: a request's round trip, a stream of writes,
//!   their CPU per frame, and a frame's tag, CRC and encryption;
//! - [`simgpu`]: the directly attached simgpu's own figures;
//! - [`error`]: what goes wrong in an experiment, and where;
//! - `chaos` (feature `chaos`): the chaos soak, a pool of boxes and hosts run as `dxpu`
//!   processes under injected faults, and what must hold whatever happens;
//! - [`compare`]: a trace replayed directly attached and through both endpoints in turns,
//!   the link measured, and the model's prediction beside what was measured.
#![forbid(unsafe_code)]

pub mod affinity;
pub mod bench;
pub mod bulk;
#[cfg(feature = "chaos")]
pub mod chaos;
pub mod compare;
pub mod cores;
pub mod error;
pub mod floor;
pub mod harness;
pub mod loopback;
pub mod model;
pub mod plan;
pub mod replay;
pub mod report;
pub mod served;
pub mod session;
pub mod simgpu;
pub mod steal;
pub mod trace;
