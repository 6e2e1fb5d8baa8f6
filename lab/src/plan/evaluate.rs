//! The plan evaluated at a link: each step's time, and what the link added on the critical path.

use super::{AddedTime, Outcome, Plan};
use crate::model::LinkParams;
use crate::trace::{ActivityKind, CopyKind};

/// A step of the job: a call's issue or return, or an activity.
#[derive(Clone, Copy, Debug)]
enum Node {
    Issue(usize),
    Return(usize),
    Activity(usize),
}

/// What the link added on the edge that decided a step.
#[derive(Clone, Copy, Debug, Default)]
struct Added {
    fetch: f64,
    copy: f64,
    sync: f64,
    submit: f64,
}

struct Evaluation<'a> {
    plan: &'a Plan,
    link: &'a LinkParams,
    issue: Vec<f64>,
    ret: Vec<f64>,
    start: Vec<f64>,
    end: Vec<f64>,
    /// The decisive predecessor of each step and what the link added on that edge.
    why: Vec<Option<(Node, Added)>>,
}

impl<'a> Evaluation<'a> {
    fn id(&self, n: Node) -> usize {
        let nc = self.plan.calls.len();
        match n {
            Node::Issue(c) => c,
            Node::Return(c) => nc + c,
            Node::Activity(a) => 2 * nc + a,
        }
    }

    fn node(&self, id: usize) -> Node {
        let nc = self.plan.calls.len();
        if id < nc {
            Node::Issue(id)
        } else if id < 2 * nc {
            Node::Return(id - nc)
        } else {
            Node::Activity(id - 2 * nc)
        }
    }

    /// The steps `n` waits for.
    fn preds(&self, n: Node) -> Vec<Node> {
        let p = self.plan;
        match n {
            Node::Issue(c) => p.calls[c].after.iter().map(|&(u, _)| Node::Return(u)).collect(),
            Node::Return(c) => {
                let mut v = vec![Node::Issue(c)];
                v.extend(p.calls[c].awaits.iter().map(|&a| Node::Activity(a)));
                v
            }
            Node::Activity(a) => {
                let a = &p.activities[a];
                let mut v: Vec<Node> = a.after.iter().map(|&(q, _, _)| Node::Activity(q)).collect();
                v.extend(a.call.map(|(c, _)| Node::Issue(c)));
                v
            }
        }
    }

    fn run(plan: &'a Plan, link: &'a LinkParams) -> Outcome {
        let (nc, na) = (plan.calls.len(), plan.activities.len());
        let mut ev = Evaluation {
            plan,
            link,
            issue: vec![f64::NAN; nc],
            ret: vec![f64::NAN; nc],
            start: vec![f64::NAN; na],
            end: vec![f64::NAN; na],
            why: vec![None; 2 * nc + na],
        };
        // Every step once all it waits for is done (Kahn's order). The plan's edges run
        // forward in the trace's time, so there is no cycle; were there one, its steps are
        // taken in the trace's order with what is known.
        let total = 2 * nc + na;
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); total];
        let mut waiting: Vec<usize> = (0..total)
            .map(|id| {
                let preds = ev.preds(ev.node(id));
                for q in &preds {
                    dependents[ev.id(*q)].push(id);
                }
                preds.len()
            })
            .collect();
        let mut ready: Vec<usize> = (0..total).filter(|&i| waiting[i] == 0).collect();
        let mut done = vec![false; total];
        let mut next_unfinished = 0usize;
        let order = |id: usize, ev: &Evaluation<'_>| -> (i64, usize) {
            match ev.node(id) {
                Node::Issue(c) => (plan.calls[c].trace_start_ns, id),
                Node::Return(c) => (plan.calls[c].trace_start_ns + plan.calls[c].trace_dur_ns, id),
                Node::Activity(a) => (plan.activities[a].trace_start_ns, id),
            }
        };
        let mut by_time: Vec<usize> = (0..total).collect();
        by_time.sort_by_key(|&id| order(id, &ev));
        let mut finished = 0usize;
        while finished < total {
            let id = match ready.pop() {
                Some(id) => id,
                None => {
                    // A cycle: take the earliest step not yet done.
                    while done[by_time[next_unfinished]] {
                        next_unfinished += 1;
                    }
                    by_time[next_unfinished]
                }
            };
            if done[id] {
                continue;
            }
            done[id] = true;
            finished += 1;
            ev.step(ev.node(id));
            for &d in &dependents[id] {
                waiting[d] = waiting[d].saturating_sub(1);
                if waiting[d] == 0 && !done[d] {
                    ready.push(d);
                }
            }
        }
        ev.outcome()
    }

    /// The later of `best` and `t` (a step not yet known counts for nothing).
    fn later(best: &mut (f64, Option<(Node, Added)>), t: f64, why: Option<(Node, Added)>) {
        if t > best.0 || best.0.is_nan() {
            *best = (t, why);
        }
    }

    fn step(&mut self, n: Node) {
        let (plan, link) = (self.plan, self.link);
        let one_way = link.rtt_ns.max(0.0) / 2.0;
        let mut best: (f64, Option<(Node, Added)>) = (f64::NAN, None);
        match n {
            Node::Issue(ci) => {
                let c = &plan.calls[ci];
                if c.after.is_empty() {
                    best.0 = c.trace_start_ns as f64;
                }
                for &(p, gap) in &c.after {
                    Self::later(
                        &mut best,
                        self.ret[p] + gap as f64,
                        Some((Node::Return(p), Added::default())),
                    );
                }
                if best.0.is_nan() {
                    best.0 = c.trace_start_ns as f64;
                }
                self.issue[ci] = best.0;
            }
            Node::Return(ci) => {
                let c = &plan.calls[ci];
                let submit = if c.submits.is_empty() { 0.0 } else { link.submit_ns() };
                let own = Added { submit, ..Added::default() };
                best = (self.issue[ci] + c.floor_ns as f64 + submit, Some((Node::Issue(ci), own)));
                let sync = Added { sync: one_way, ..Added::default() };
                for &a in &c.awaits {
                    let t = self.end[a] + one_way + c.await_tail_ns as f64;
                    Self::later(&mut best, t, Some((Node::Activity(a), sync)));
                }
                self.ret[ci] = best.0;
            }
            Node::Activity(ai) => {
                let a = &plan.activities[ai];
                let fetch = link.fetch_ns();
                match a.call {
                    Some((c, gap)) => {
                        let submit = link.submit_ns();
                        let t = self.issue[c] + plan.calls[c].submit_ns as f64 + submit + gap as f64 + fetch;
                        best = (t, Some((Node::Issue(c), Added { fetch, submit, ..Added::default() })));
                    }
                    None => best.0 = a.trace_start_ns as f64,
                }
                for &(p, _, gap) in &a.after {
                    Self::later(
                        &mut best,
                        self.end[p] + gap as f64,
                        Some((Node::Activity(p), Added::default())),
                    );
                }
                let dur = a.dur_ns as f64;
                let at_link = match a.kind {
                    ActivityKind::Memcpy { kind: CopyKind::HtoDPinned | CopyKind::HtoDPageable, bytes } => {
                        let fill = if bytes > 0 { link.rtt_ns.max(0.0) } else { 0.0 };
                        dur.max(bytes as f64 / link.h2d_bytes_per_s * 1e9) + fill
                    }
                    ActivityKind::Memcpy { kind: CopyKind::DtoHPinned | CopyKind::DtoHPageable, bytes } => {
                        dur.max(bytes as f64 / link.d2h_bytes_per_s * 1e9)
                    }
                    _ => dur,
                };
                self.start[ai] = best.0;
                self.end[ai] = best.0 + at_link;
                // A copy's own added time is charged where the path enters it.
                if let Some((_, added)) = best.1.as_mut() {
                    added.copy += at_link - dur;
                }
            }
        }
        let id = self.id(n);
        self.why[id] = best.1;
    }

    fn outcome(&self) -> Outcome {
        let first_activity =
            self.start.iter().copied().filter(|s| s.is_finite()).fold(f64::INFINITY, f64::min);
        let first_call = self.issue.iter().copied().filter(|s| s.is_finite()).fold(f64::INFINITY, f64::min);
        let origin = first_call.min(first_activity);
        let (mut last, mut last_node) = (f64::NEG_INFINITY, None);
        for (i, &e) in self.end.iter().enumerate() {
            if e > last {
                (last, last_node) = (e, Some(Node::Activity(i)));
            }
        }
        let gpu_last = last;
        for (i, &r) in self.ret.iter().enumerate() {
            if r > last {
                (last, last_node) = (r, Some(Node::Return(i)));
            }
        }
        let mut added = AddedTime::default();
        let mut node = last_node;
        let mut steps = 0usize;
        while let Some(n) = node {
            // Each step's predecessor ends no later than it does; the bound only guards a
            // plan whose cycle was broken.
            steps += 1;
            if steps > self.why.len() {
                break;
            }
            node = self.why[self.id(n)].map(|(p, a)| {
                added.command_fetch_ns += a.fetch;
                added.copies_ns += a.copy;
                added.synchronizations_ns += a.sync;
                added.submissions_ns += a.submit;
                p
            });
        }
        let finite = |x: f64| if x.is_finite() { x } else { 0.0 };
        Outcome {
            job_ns: finite(last - origin),
            gpu_span_ns: finite(gpu_last - first_activity),
            added,
            activity_start_ns: self.start.clone(),
            call_return_ns: self.ret.clone(),
        }
    }
}

impl Plan {
    /// The job's times at `link`.
    pub fn evaluate(&self, link: &LinkParams) -> Outcome {
        Evaluation::run(self, link)
    }

    /// The round trip (ns) at which the plan's job at `link` (its rates; its round trip
    /// replaced) is `percent` slower than with no link: 0 if the rates alone make it so, `None`
    /// if no round trip up to a second does. The job's time grows with the round trip, so a
    /// bisection finds it (to 1 ns).
    pub fn crossing_rtt_ns(&self, link: &LinkParams, percent: f64) -> Option<f64> {
        let plan = self;
        let local = plan.evaluate(&LinkParams::LOCAL).job_ns;
        if local <= 0.0 {
            return None;
        }
        let over = |rtt_ns: f64| {
            plan.evaluate(&LinkParams { rtt_ns, ..*link }).job_ns / local - 1.0 >= percent / 100.0
        };
        if over(0.0) {
            return Some(0.0);
        }
        let (mut lo, mut hi) = (0.0, 1e9);
        if !over(hi) {
            return None;
        }
        while hi - lo > 1.0 {
            let mid = (lo + hi) / 2.0;
            if over(mid) { hi = mid } else { lo = mid }
        }
        Some(hi)
    }
}
