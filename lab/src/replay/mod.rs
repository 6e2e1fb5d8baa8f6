//! A traced job replayed on the simgpu at the speed the traced GPU ran it (`dxpu replay`,
//! docs/performance-model.md): the job's [`Plan`] followed in real time by the host, the
//! GPU's work run by the device for the times the trace gives.
//!
//! Each stream gets a command channel of its own. An activity is, on its stream's channel:
//! a semaphore acquire for each activity on another stream it waits for, its command — a
//! TIMED kernel of its traced duration (kernels, device-to-device copies, memsets), or a real
//! copy of its traced bytes between pinned host memory and VRAM held to at least its traced
//! duration — and a release of a word in host memory with the begin and end of its command
//! (the device's clock), then, if another stream waits for it, a release of the channel's
//! semaphore in VRAM.
//!
//! The host issues the runtime calls as the plan says: each at the traced gap after the
//! return of the calls it follows, lasting at least its traced CPU time; a call that submits
//! work publishes it (RING_TAIL, doorbell) where the trace's call submitted it; a
//! synchronization (or a pageable copy) watches the release words in host memory of the
//! work it waits for — no register is read — and returns the traced CPU time after it sees
//! the last. Calls of several threads are issued by one replaying thread in time order, so
//! a synchronization late on one thread delays only what follows it.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::time::Duration;

use driver::{Command, PciFunction, Pinned, SimGpuDriver, WaitMode};
use simgpu_abi::{CHANNELS, op, sem};

use crate::plan::{DeviceEdge, Plan};
use crate::trace::{ActivityKind, CopyKind};
pub use copies::MAX_COPY_BYTES;
use copies::{Copies, CopyAt, OUT_PLACES, copy_bytes, to_device};
pub use error::ReplayError;
use error::driver;

mod copies;
mod error;
mod verify;

/// Bytes of each activity's release word (value, begin, end), padded.
const SLOT: usize = 32;
/// Entries of each channel's ring.
const RING: u64 = 4096;
/// A replay with nothing moving for this long has stalled.
const STALL_NS: u64 = 10_000_000_000;

/// What one replay measured. Times are ns on the trace's clock: the replay's start is the
/// trace's first call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplayRun {
    /// The first call's issue to the later of the last call's return and the last
    /// activity's end.
    pub job_ns: f64,
    /// The GPU's span: the first activity's begin to the last one's end (the device's
    /// clock).
    pub gpu_span_ns: f64,
    /// Each activity's begin and end.
    pub activity_begin_ns: Vec<f64>,
    /// Each activity's end.
    pub activity_end_ns: Vec<f64>,
    /// Each call's return.
    pub call_return_ns: Vec<f64>,
    /// Where the time went. The device ready for an activity (its stream and what it waits
    /// for done, its submission made) but its command not yet fetched, summed.
    pub fetch_wait_ns: f64,
    /// Copies of host memory longer than traced, summed.
    pub copy_extra_ns: f64,
    /// Synchronizations: from the end of the work they waited for to the host seeing it,
    /// summed.
    pub sync_notify_ns: f64,
    /// Submissions made later than the plan said (the host's own cost of submitting, where
    /// it exceeds the traced call's), summed, and the most.
    pub host_late_ns: f64,
    /// The latest submission.
    pub host_late_max_ns: f64,
    /// Traced copies whose bytes were more than [`MAX_COPY_BYTES`]: moved in part.
    pub copies_capped: usize,
    /// The rate the platform moved host memory at during the run, each way (host → device,
    /// device → host), bytes per second: the bytes of the copies of at least
    /// [`RATE_COPY_BYTES`] that the platform held beyond their traced time, over their time.
    /// `None` where no copy was. (Through a bridge whose host side serves the device on the
    /// job's own thread, as here, below what one copy alone gets: the job's work shares it.)
    pub copy_bytes_per_s: (Option<f64>, Option<f64>),
    /// The share of those copies' time (each way, as [`ReplayRun::copy_bytes_per_s`] counts
    /// them) in which the replay's thread let the platform serve the device — lent it the
    /// time until its next step, or drove it looking at a release word. Through a bridge
    /// whose host side runs on the job's thread, the rest of a copy's time the device's reads
    /// of host memory wait for the job's next step. `None` where no copy was counted.
    pub copy_served_share: (Option<f64>, Option<f64>),
    /// Copies made of host memory, each way (in, out).
    pub copies_made: (usize, usize),
    /// Of those, the copies whose bytes were read back where they landed and found their
    /// own (a copy's place taken by a later copy before it could be read is not): each way.
    pub copies_checked: (usize, usize),
    /// Bytes the device's copy engines counted moving (host → VRAM, VRAM → host) during the
    /// run (`reg::COPIED_TO_VRAM`, `reg::COPIED_TO_HOST`): each way the copies' bytes, or
    /// the run fails verification.
    pub bytes_copied: (u64, u64),
}

/// Channels the replay gives streams (all but the driver's channel 0): a trace with more
/// streams than this shares channels among them in turn (see
/// [`Plan::streams_sharing_channels`]).
pub const STREAM_CHANNELS: usize = CHANNELS - 1;

/// Copies at least this large tell the platform's bulk rate (smaller ones mostly its round
/// trip).
pub const RATE_COPY_BYTES: u64 = 1 << 20;

/// What the replay keeps between runs on one device: the channels it opened, its buffers,
/// and where its semaphores' values go on from.
pub struct Replayer {
    channel_of: HashMap<u32, usize>,
    /// Each activity's release word, pinned ([`SimGpuDriver::pin`]).
    slots: Pinned,
    /// The copies' buffers, patterns and places.
    copies: Copies,
    /// Runs made.
    runs: u64,
    semaphores: u64,
    /// Values of the channels' semaphores go on from here (never reset: each run's are
    /// above the last's).
    sem_base: u64,
    /// Activities another stream waits for.
    waited_across: Vec<bool>,
}

impl Replayer {
    /// Sets up `d` for replaying `plan`: a channel per stream (streams beyond the device's
    /// channels share them, in turn), the release words, the copies' host buffers and VRAM.
    pub fn new<P: PciFunction>(d: &mut SimGpuDriver<P>, plan: &Plan) -> Result<Replayer, ReplayError> {
        let channels = d.channels();
        if channels < 2 {
            return Err(ReplayError::Verification("the device has no command channels besides 0".into()));
        }
        let streams: BTreeSet<u32> = plan.activities.iter().map(|a| a.stream).collect();
        let mut channel_of = HashMap::new();
        for (i, s) in streams.iter().enumerate() {
            let ch = 1 + i % (channels - 1);
            if !channel_of.values().any(|&c| c == ch) {
                d.open_channel(ch, RING).map_err(driver(format!("opening channel {ch}")))?;
            }
            channel_of.insert(*s, ch);
        }
        let slots = d.pin(plan.activities.len().max(1) * SLOT).map_err(driver("the release words"))?;
        let semaphores = d.vram_size().saturating_sub(4096);
        let copies = Copies::new(d, plan, semaphores)?;
        let mut waited_across = vec![false; plan.activities.len()];
        for a in &plan.activities {
            for &(q, kind, _) in &a.after {
                if kind == DeviceEdge::CrossStream {
                    waited_across[q] = true;
                }
            }
        }
        Ok(Replayer { channel_of, slots, copies, runs: 0, semaphores, sem_base: 0, waited_across })
    }

    /// Gives the replay's pinned buffers back to `d`, the device it was set up on.
    pub fn release<P: PciFunction>(self, d: &mut SimGpuDriver<P>) {
        d.unpin(self.slots);
        self.copies.release(d);
    }

    /// Replays `plan` once.
    pub fn run<P: PciFunction>(
        &mut self,
        d: &mut SimGpuDriver<P>,
        plan: &Plan,
    ) -> Result<ReplayRun, ReplayError> {
        let na = plan.activities.len();
        d.pci().dma_write(&self.slots, 0, &vec![0u8; na.max(1) * SLOT]);
        // The device (and a bridge's box) awake when the job starts, as a GPU in use is: a
        // fence first.
        d.sync(WaitMode::Poll).map_err(driver("the fence before the replay"))?;
        let mut run = Replaying::new(self, plan);
        run.copied_before = copied(d);
        run.go(d)?;
        let out = run.measure(d);
        self.sem_base += na as u64 + 1;
        self.runs += 1;
        out
    }

    /// Where each channel the replay uses stands: head, tail, commands done.
    fn channels_state<P: PciFunction>(&self, d: &mut SimGpuDriver<P>) -> String {
        let mut chans: Vec<usize> = self.channel_of.values().copied().collect();
        chans.sort_unstable();
        chans.dedup();
        let reg = |d: &mut SimGpuDriver<P>, ch: usize, r: u64| d.read_reg(simgpu_abi::chreg::at(ch, r));
        chans
            .into_iter()
            .map(|ch| {
                use simgpu_abi::chreg::{COMPLETED, RING_HEAD, RING_TAIL};
                let (h, t, c) = (reg(d, ch, RING_HEAD), reg(d, ch, RING_TAIL), reg(d, ch, COMPLETED));
                format!("channel {ch}: head {h} tail {t}, {c} done")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The device's count of the bytes its copy engines moved, host → VRAM and VRAM → host
/// (`reg::COPIED_TO_VRAM`, `reg::COPIED_TO_HOST`).
fn copied<P: PciFunction>(d: &mut SimGpuDriver<P>) -> (u64, u64) {
    (d.read_reg(simgpu_abi::reg::COPIED_TO_VRAM), d.read_reg(simgpu_abi::reg::COPIED_TO_HOST))
}

/// One replay in progress.
struct Replaying<'a> {
    r: &'a Replayer,
    plan: &'a Plan,
    /// Real ns (the device's clock) at the trace's first call.
    origin: u64,
    first: i64,
    /// Host predecessors not yet returned, and the issue time so far, per call.
    pending: Vec<usize>,
    issue: Vec<f64>,
    ret: Vec<Option<f64>>,
    dependents: Vec<Vec<usize>>,
    /// Calls (and activities without one) due at a time: (time, kind, index).
    due: BinaryHeap<Reverse<(u64, u8, usize)>>,
    /// Due but waiting for work before theirs on a stream to be submitted.
    blocked: Vec<(u8, usize)>,
    /// Synchronizing calls watching their release words.
    awaiting: Vec<usize>,
    submitted: Vec<bool>,
    submitted_count: usize,
    submit_real: Vec<u64>,
    seq: Vec<u64>,
    chan_seq: [u64; CHANNELS],
    /// Copies in and out submitted so far; each copy's place and bytes; the copy out last
    /// given each place in host memory.
    copies_made: (u64, u64),
    /// The bytes of the copies submitted, each way.
    bytes_submitted: (u64, u64),
    /// The device's count of bytes its copy engines moved, each way, before the run ([`copied`]).
    copied_before: (u64, u64),
    copy_at: Vec<Option<CopyAt>>,
    out_given: [Option<usize>; OUT_PLACES],
    /// Copies checked where they landed, each way; what was wrong with any.
    copies_checked: (usize, usize),
    copy_checked: Vec<bool>,
    wrong: Vec<String>,
    seen_at: Vec<u64>,
    host_late: (f64, f64),
    calls_done: usize,
    next_pump: u64,
    /// When the platform was served on this thread (real ns, begin and end, in order).
    served: Vec<(u64, u64)>,
}

/// How long a pass over the link may answer the device's reads when the replay's host
/// endpoint runs on the job's thread (`bridge_host::AttachOptions::answer_slice`): the
/// replay lends it the time between steps ([`PciFunction::serve_for`]), and a look at a
/// release word costs no more than this beside it.
pub const HOST_ANSWER_SLICE: Duration = Duration::from_micros(5);

/// With nothing to watch, how often the replay lets the platform run (ns).
const PUMP_NS: u64 = 2_000;
/// The most time lent to the platform at once (ns): between loans the replay looks at
/// what is due.
const LEND_MAX_NS: u64 = 100_000;
/// … while a synchronization waits for its word (ns).
const LEND_WATCHING_NS: u64 = 10_000;
/// How long before a step is due the platform's loan ends (ns): a pass over the link runs
/// over its deadline by up to one request's answer and a send.
const LEND_MARGIN_NS: u64 = 10_000;

const CALL: u8 = 0;
const ORPHAN: u8 = 1;

impl<'a> Replaying<'a> {
    fn new(r: &'a Replayer, plan: &'a Plan) -> Replaying<'a> {
        let nc = plan.calls.len();
        let mut dependents = vec![Vec::new(); nc];
        let mut pending = vec![0; nc];
        for (c, call) in plan.calls.iter().enumerate() {
            pending[c] = call.after.len();
            for &(p, _) in &call.after {
                dependents[p].push(c);
            }
        }
        let first = plan
            .calls
            .iter()
            .map(|c| c.trace_start_ns)
            .chain(plan.activities.iter().map(|a| a.trace_start_ns))
            .min()
            .unwrap_or(0);
        Replaying {
            r,
            plan,
            origin: 0,
            first,
            pending,
            issue: vec![f64::NEG_INFINITY; nc],
            ret: vec![None; nc],
            dependents,
            due: BinaryHeap::new(),
            blocked: Vec::new(),
            awaiting: Vec::new(),
            submitted: vec![false; plan.activities.len()],
            submitted_count: 0,
            submit_real: vec![0; plan.activities.len()],
            seq: vec![0; plan.activities.len()],
            chan_seq: [0; CHANNELS],
            copies_made: (0, 0),
            bytes_submitted: (0, 0),
            copied_before: (0, 0),
            copy_at: vec![None; plan.activities.len()],
            out_given: [None; OUT_PLACES],
            copies_checked: (0, 0),
            copy_checked: vec![false; plan.activities.len()],
            wrong: Vec::new(),
            seen_at: vec![0; nc],
            host_late: (0.0, 0.0),
            calls_done: 0,
            next_pump: 0,
            served: Vec::new(),
        }
    }

    /// Now, ns on the trace's clock.
    fn now(&self) -> f64 {
        self.first as f64 + hw::device::now_ns().saturating_sub(self.origin) as f64
    }

    /// The real time of trace time `t`.
    fn real(&self, t: f64) -> u64 {
        self.origin.saturating_add((t - self.first as f64).max(0.0) as u64)
    }

    fn go<P: PciFunction>(&mut self, d: &mut SimGpuDriver<P>) -> Result<(), ReplayError> {
        let plan = self.plan;
        self.origin = hw::device::now_ns();
        // The calls that follow none, taken before any returns (a return readies others).
        let roots: Vec<usize> = (0..plan.calls.len()).filter(|&c| self.pending[c] == 0).collect();
        for c in roots {
            self.issue[c] = plan.calls[c].trace_start_ns as f64;
            self.ready(c);
        }
        for (i, a) in plan.activities.iter().enumerate() {
            if a.call.is_none() {
                self.due.push(Reverse((self.real(a.trace_start_ns as f64), ORPHAN, i)));
            }
        }
        let mut moved = hw::device::now_ns();
        while self.calls_done < plan.calls.len()
            || self.submitted_count < plan.activities.len()
            || !self.awaiting.is_empty()
        {
            let before = (self.calls_done, self.submitted_count, self.awaiting.len(), self.blocked.len());
            self.watch(d);
            // What is due.
            let now = hw::device::now_ns();
            while let Some(&Reverse((at, kind, i))) = self.due.peek() {
                if at > now {
                    break;
                }
                self.due.pop();
                self.act(d, kind, i, at)?;
            }
            if !self.blocked.is_empty() {
                let blocked = std::mem::take(&mut self.blocked);
                for (kind, i) in blocked {
                    let at = if kind == CALL {
                        self.submit_at(i)
                    } else {
                        self.real(plan.activities[i].trace_start_ns as f64)
                    };
                    self.act(d, kind, i, at)?;
                }
            }
            self.lend(d);
            let after = (self.calls_done, self.submitted_count, self.awaiting.len(), self.blocked.len());
            if before != after {
                moved = hw::device::now_ns();
            } else if hw::device::now_ns() - moved > STALL_NS && self.due.is_empty() {
                return Err(ReplayError::Stalled(format!(
                    "{} of {} calls returned, {} waiting for the device, {} submissions held back{}",
                    self.calls_done,
                    plan.calls.len(),
                    self.awaiting.len(),
                    self.blocked.len(),
                    self.first_held_back()
                )));
            }
        }
        // Every activity done: its release word written.
        let t = hw::device::now_ns();
        for i in 0..plan.activities.len() {
            while self.word(d, i).0 == 0 {
                if hw::device::now_ns() - t > STALL_NS {
                    let ch = self.r.channel_of.get(&plan.activities[i].stream).copied().unwrap_or(1);
                    return Err(ReplayError::Stalled(format!(
                        "activity {i} ({:?} on stream {}, channel {ch}) never finished; {}",
                        plan.activities[i].kind,
                        plan.activities[i].stream,
                        self.r.channels_state(d)
                    )));
                }
                if let Some(why) = d.pci().removed() {
                    return Err(ReplayError::Stalled(format!("the device was removed: {why}")));
                }
            }
        }
        Ok(())
    }

    /// Lends the platform the time until the next step is due (a bridge's host side serves
    /// the device's reads of host memory on this thread): as an endpoint with a core of its
    /// own would, without making the job's next launch late. While a synchronization is
    /// watched, in short slices, so that its return is seen when its word lands.
    fn lend<P: PciFunction>(&mut self, d: &mut SimGpuDriver<P>) {
        let now = hw::device::now_ns();
        let next = self.due.peek().map_or(u64::MAX, |Reverse((at, _, _))| *at);
        let cap = if self.awaiting.is_empty() { LEND_MAX_NS } else { LEND_WATCHING_NS };
        let budget = next.saturating_sub(now).saturating_sub(LEND_MARGIN_NS).min(cap);
        if budget > 0 {
            d.pci().serve_for(Duration::from_nanos(budget));
            self.served.push((now, hw::device::now_ns()));
        }
    }

    /// When call `c`'s work is submitted: the traced point in the call after its issue.
    fn submit_at(&self, c: usize) -> u64 {
        self.real(self.issue[c] + self.plan.calls[c].submit_ns as f64)
    }

    /// Call `c` has all it follows returned: it is issued (a call of CPU time only returns
    /// at once, on the trace's clock).
    fn ready(&mut self, c: usize) {
        let call = &self.plan.calls[c];
        if call.submits.is_empty() && call.awaits.is_empty() {
            let t = self.issue[c] + call.floor_ns as f64;
            self.returned(c, t);
        } else if call.submits.is_empty() {
            self.due.push(Reverse((self.real(self.issue[c]), CALL, c)));
        } else {
            self.due.push(Reverse((self.submit_at(c), CALL, c)));
        }
    }

    fn returned(&mut self, c: usize, t: f64) {
        // A worklist: the calls made ready by this one may return at once too.
        let mut work = vec![(c, t)];
        while let Some((c, t)) = work.pop() {
            self.ret[c] = Some(t);
            self.calls_done += 1;
            for k in 0..self.dependents[c].len() {
                let n = self.dependents[c][k];
                let gap = self.plan.calls[n].after.iter().find(|(p, _)| *p == c).map_or(0, |(_, g)| *g);
                self.issue[n] = self.issue[n].max(t + gap as f64);
                self.pending[n] -= 1;
                if self.pending[n] == 0 {
                    let call = &self.plan.calls[n];
                    if call.submits.is_empty() && call.awaits.is_empty() {
                        work.push((n, self.issue[n] + call.floor_ns as f64));
                    } else {
                        self.ready(n);
                    }
                }
            }
        }
    }

    fn act<P: PciFunction>(
        &mut self,
        d: &mut SimGpuDriver<P>,
        kind: u8,
        i: usize,
        at: u64,
    ) -> Result<(), ReplayError> {
        let plan = self.plan;
        if kind == ORPHAN {
            if !self.can_submit(i) {
                self.blocked.push((ORPHAN, i));
                return Ok(());
            }
            let ch = self.submit(d, i)?;
            d.flush_on(ch);
            return Ok(());
        }
        let call = &plan.calls[i];
        if !call.submits.is_empty() {
            // A call's own earlier work is submitted just before (its submits are in order).
            let ready = |a: usize| {
                plan.activities[a]
                    .after
                    .iter()
                    .all(|&(p, _, _)| self.submitted[p] || (p < a && call.submits.binary_search(&p).is_ok()))
            };
            if !call.submits.iter().all(|&a| ready(a)) {
                self.blocked.push((CALL, i));
                return Ok(());
            }
            let mut touched = BTreeSet::new();
            for &a in &call.submits {
                touched.insert(self.submit(d, a)?);
            }
            for ch in touched {
                d.flush_on(ch);
            }
            let done = hw::device::now_ns();
            let late = done.saturating_sub(at) as f64;
            self.host_late.0 += late;
            self.host_late.1 = self.host_late.1.max(late);
            if call.awaits.is_empty() {
                let t = (self.issue[i] + call.floor_ns as f64).max(self.now());
                self.returned(i, t);
                return Ok(());
            }
        }
        self.awaiting.push(i);
        Ok(())
    }

    /// What the first submission held back waits for: the call or activity, and the
    /// dependency not met (for the stall's message).
    fn first_held_back(&self) -> String {
        let plan = self.plan;
        let Some(&(kind, i)) = self.blocked.first() else { return String::new() };
        let (who, acts): (String, Vec<usize>) = match kind {
            CALL => {
                let c = &plan.calls[i];
                (
                    format!(
                        "call {i} ({:?} on thread {}, traced at {} ns)",
                        c.kind, c.thread, c.trace_start_ns
                    ),
                    c.submits.clone(),
                )
            }
            _ => (format!("activity {i} (no call)"), vec![i]),
        };
        let unmet = acts.iter().find_map(|&a| {
            plan.activities[a]
                .after
                .iter()
                .find(|&&(p, _, _)| !self.submitted[p])
                .map(|&(p, why, _)| (a, p, why))
        });
        match unmet {
            Some((a, p, why)) => {
                let (x, y) = (&plan.activities[a], &plan.activities[p]);
                let by = y.call.map_or("no call".to_string(), |(c, _)| format!("call {c}"));
                format!(
                    "; the first, {who}, holds activity {a} ({:?} on stream {}) back: it follows activity {p} \
                     ({:?} on stream {}, {why:?}), which {by} has not submitted",
                    x.kind, x.stream, y.kind, y.stream
                )
            }
            None => format!("; the first, {who}"),
        }
    }

    /// Whether everything before activity `a` on its stream, and what it waits for on
    /// others, has been submitted.
    fn can_submit(&self, a: usize) -> bool {
        self.plan.activities[a].after.iter().all(|&(p, _, _)| self.submitted[p])
    }

    /// Queues activity `a`'s commands on its stream's channel; returns the channel.
    fn submit<P: PciFunction>(&mut self, d: &mut SimGpuDriver<P>, a: usize) -> Result<usize, ReplayError> {
        let r = self.r;
        let act = &self.plan.activities[a];
        let ch = r.channel_of.get(&act.stream).copied().unwrap_or(1);
        let what = || format!("submitting activity {a} on channel {ch}");
        let mut q = |c: Command| d.enqueue_on(ch, c).map_err(driver(what()));
        for &(p, kind, _) in &act.after {
            if kind == DeviceEdge::CrossStream {
                let pch = r.channel_of.get(&self.plan.activities[p].stream).copied().unwrap_or(1);
                q(Command {
                    opcode: op::SEM_ACQUIRE,
                    args: [r.semaphores + 8 * pch as u64, self.seq[p], 0, 0, 0],
                })?;
            }
        }
        let dur = act.dur_ns.max(0) as u64;
        let command = match copy_bytes(act.kind) {
            Some((k, bytes)) if to_device(k) => {
                let c = r.copies.at(r.runs, a, self.copies_made.0, bytes, true);
                self.copies_made.0 += 1;
                self.bytes_submitted.0 += c.n;
                self.copy_at[a] = Some(c);
                r.copies.command_in(&c, dur)
            }
            Some((_, bytes)) => {
                let c = r.copies.at(r.runs, a, self.copies_made.1, bytes, false);
                self.copies_made.1 += 1;
                self.bytes_submitted.1 += c.n;
                self.copy_at[a] = Some(c);
                self.out_given[r.copies.place_out(&c)] = Some(a);
                r.copies.command_out(&c, dur)
            }
            None => Command { opcode: op::TIMED, args: [dur, 0, 0, 0, 0] },
        };
        q(command)?;
        let word = r.slots.bus.get() + (a * SLOT) as u64;
        q(Command { opcode: op::SEM_RELEASE, args: [word, 1, sem::TIMESTAMPS, 0, 0] })?;
        if r.waited_across[a] {
            self.chan_seq[ch] += 1;
            self.seq[a] = r.sem_base + self.chan_seq[ch];
            q(Command {
                opcode: op::SEM_RELEASE,
                args: [r.semaphores + 8 * ch as u64, self.seq[a], sem::VRAM, 0, 0],
            })?;
        }
        self.submitted[a] = true;
        self.submitted_count += 1;
        self.submit_real[a] = hw::device::now_ns();
        Ok(ch)
    }

    /// Activity `a`'s release word: (value, begin, end).
    fn word<P: PciFunction>(&self, d: &mut SimGpuDriver<P>, a: usize) -> (u64, u64, u64) {
        self.word_as(d, a, true)
    }

    /// [`Replaying::word`], letting the platform serve the device first (`drive`) or not: a
    /// bridge's host side on this thread answers the device's reads whenever it is driven,
    /// and a step due within [`LEND_MARGIN_NS`] must not wait for that.
    fn word_as<P: PciFunction>(&self, d: &mut SimGpuDriver<P>, a: usize, drive: bool) -> (u64, u64, u64) {
        let mut b = [0u8; 24];
        if drive {
            d.pci().dma_read(&self.r.slots, a * SLOT, &mut b);
        } else {
            d.pci().dma_peek(&self.r.slots, a * SLOT, &mut b);
        }
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        (w(0), w(1), w(2))
    }

    /// Looks at the release words the synchronizing calls wait for (in host memory), and
    /// lets the platform serve the device (a bridge's host side is driven by its caller's
    /// calls): a turn that looked at no word looks at one anyway, now and then. (A replay
    /// whose synchronizations were not yet due looked at nothing, and through the bridges
    /// the device's copies and command fetches waited for the host's next call.)
    fn watch<P: PciFunction>(&mut self, d: &mut SimGpuDriver<P>) {
        // One pass over the link a turn, and none with a step due within the loan's margin:
        // then the words are read as they stand and the link is left to the loans, as an
        // endpoint with a core of its own would leave the job's thread (looks that drove it,
        // a pass for each word, ran past the steps' times with the bridges' bulk: 52–58 ms of
        // the A100 job's 68–83 ms of late submissions).
        let next = self.due.peek().map_or(u64::MAX, |Reverse((at, _, _))| *at);
        let mut drive = next.saturating_sub(hw::device::now_ns()) > LEND_MARGIN_NS;
        let drove = drive;
        let mut looked = false;
        let mut i = 0;
        while i < self.awaiting.len() {
            let c = self.awaiting[i];
            let call = &self.plan.calls[c];
            let now = hw::device::now_ns();
            if now < self.real(self.issue[c]) {
                i += 1;
                continue;
            }
            looked = true;
            let driving = drive;
            let landed = call.awaits.iter().all(|&a| {
                let w = self.word_as(d, a, drive);
                drive = false;
                w.0 != 0
            });
            if driving {
                self.served.push((now, hw::device::now_ns()));
            }
            if !landed {
                i += 1;
                continue;
            }
            self.awaiting.swap_remove(i);
            self.seen_at[c] = now;
            let seen = self.now();
            // A pageable copy out: the driver copies the staged bytes to the caller. Each
            // copy out waited for is checked, where its place was not given to another since.
            if let Some(&a) = call.awaits.first()
                && let Some(c) = self.copy_at[a]
                && matches!(
                    self.plan.activities[a].kind,
                    ActivityKind::Memcpy { kind: CopyKind::DtoHPageable, .. }
                )
            {
                self.r.copies.read_out(d, &c);
            }
            for &a in &call.awaits {
                self.check_out(d, a);
            }
            let t = (self.issue[c] + call.floor_ns as f64).max(seen + call.await_tail_ns as f64);
            self.returned(c, t);
        }
        let now = hw::device::now_ns();
        if drove && !looked && now >= self.next_pump {
            let _ = self.word(d, 0);
            self.next_pump = now + PUMP_NS;
            self.served.push((now, hw::device::now_ns()));
        }
    }
}
