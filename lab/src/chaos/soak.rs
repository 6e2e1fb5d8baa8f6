//! The soak's running state: its processes, the runs in flight, the faults it injects.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::parts::{
    BoxProc, CONCURRENT_RUNS, ChaosOptions, Imp, KEY_A, KEY_B, PROBE_LIMIT, RUN_LIMIT, Rng, Tally,
    WorkloadRun, free_port, reason, scrape,
};

/// What the soak holds while it runs: its boxes and etcd, the workload runs in flight, the
/// faults' pending returns, the stalling clients, and the tally.
pub(super) struct Soak {
    pub(super) exe: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) etcd: Vec<String>,
    pub(super) cluster: pool::cluster::EtcdCluster,
    pub(super) boxes: Vec<BoxProc>,
    pub(super) runs: Vec<WorkloadRun>,
    pub(super) next_run: u64,
    pub(super) box_b_back: Option<Instant>,
    /// While box-b is stopped (SIGSTOP, an outage the hosts ride through): when it continues.
    pub(super) box_b_stopped_until: Option<Instant>,
    pub(super) etcd_back: Option<(usize, Instant)>,
    pub(super) stallers: Vec<std::thread::JoinHandle<()>>,
    pub(super) tally: Tally,
    pub(super) rng: Rng,
}

impl Soak {
    /// A three-member etcd and two boxes of two devices each, started and registered.
    pub(super) fn start(args: &ChaosOptions) -> Result<Soak, String> {
        let exe = args.dxpu.clone();
        let dir = match &args.dir {
            Some(d) => d.clone(),
            None => std::env::temp_dir().join(format!("dxpu-chaos-{}-{}", args.seed, std::process::id())),
        };
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let cluster = pool::cluster::EtcdCluster::start(3).map_err(|e| e.to_string())?;
        let etcd = cluster.endpoints();
        let mut soak = Soak {
            exe,
            dir,
            etcd,
            cluster,
            boxes: Vec::new(),
            runs: Vec::new(),
            next_run: 0,
            box_b_back: None,
            box_b_stopped_until: None,
            etcd_back: None,
            stallers: Vec::new(),
            tally: Tally::default(),
            rng: Rng(args.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
        };
        for name in ["box-a", "box-b"] {
            let b = BoxProc {
                name,
                port: free_port(true)?,
                metrics: free_port(false)?,
                config: soak.dir.join(format!("{name}.toml")),
                child: None,
                named_allow: true,
                imp: Imp::default(),
            };
            b.write_config(&soak.dir, &soak.etcd)?;
            soak.boxes.push(b);
        }
        for i in 0..soak.boxes.len() {
            let log = soak.dir.join(format!("{}.log", soak.boxes[i].name));
            soak.boxes[i].child = Some(soak.spawn(&["gpu"], &soak.boxes[i].config, &log)?);
        }
        soak.wait_registered()?;
        Ok(soak)
    }

    /// This program with `args` and `--config config`, its standard error appended to `log`.
    fn spawn(&self, args: &[&str], config: &Path, log: &Path) -> Result<Child, String> {
        let f = std::fs::File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        Command::new(&self.exe)
            .args(args)
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(f))
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.exe.display()))
    }

    /// Until the pool lists the boxes' four devices (30 s at most; a box that exits is an
    /// error with its log).
    fn wait_registered(&mut self) -> Result<(), String> {
        let cfg = pool::PoolConfig::new(self.etcd.clone());
        let listed = || {
            pool::block_on(async {
                let mut c = pool::connect(&cfg).await?;
                pool::admin::ls(&mut c, &cfg).await
            })
            .ok()
            .and_then(Result::ok)
            .map_or(0, |l| l.len())
        };
        let t = Instant::now();
        while listed() < 4 {
            for b in &mut self.boxes {
                if let Some(c) = &mut b.child
                    && let Ok(Some(st)) = c.try_wait()
                {
                    let log =
                        std::fs::read_to_string(self.dir.join(format!("{}.log", b.name))).unwrap_or_default();
                    return Err(format!("{} exited ({st}) at its start: {}", b.name, log.trim()));
                }
            }
            if t.elapsed() > Duration::from_secs(30) {
                return Err("the boxes did not register their devices within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The runs that ended, or ran past their limit, counted by how they ended.
    pub(super) fn reap_runs(&mut self) -> Result<(), String> {
        let mut i = 0;
        while i < self.runs.len() {
            let r = &mut self.runs[i];
            let done = r.child.try_wait().map_err(|e| e.to_string())?;
            let status = match done {
                Some(s) => Some(s),
                None if r.started.elapsed() > RUN_LIMIT => {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                    self.tally
                        .unexplained
                        .push(format!("run {}: no result within {RUN_LIMIT:?} ({:?})", r.id, r.imp));
                    None
                }
                None => {
                    i += 1;
                    continue;
                }
            };
            let r = self.runs.swap_remove(i);
            self.tally.runs += 1;
            let Some(status) = status else { continue };
            let log = std::fs::read_to_string(&r.log).unwrap_or_default();
            if status.success() && log.contains("workload verified") {
                self.tally.verified += 1;
            } else if r.killed {
                *self.tally.failed.entry("killed by the soak (injected)".into()).or_default() += 1;
            } else if let Some(why) = reason(&log) {
                *self.tally.failed.entry(why).or_default() += 1;
            } else {
                self.tally
                    .unexplained
                    .push(format!("run {}: exited {status} without saying why ({:?})", r.id, r.imp));
            }
        }
        Ok(())
    }

    /// New workload runs, up to `CONCURRENT_RUNS` at once, each on a link of its own
    /// impairment.
    pub(super) fn start_runs(&mut self) -> Result<(), String> {
        while self.runs.len() < CONCURRENT_RUNS {
            self.next_run += 1;
            let imp = Imp::for_run(&mut self.rng);
            if imp.loss >= 0.5 {
                self.tally.fault("loss burst to 50 % on a host's link");
            } else if imp.loss > 0.0 {
                self.tally.fault("loss, delay and reordering on a host's link");
            }
            let host = if self.next_run.is_multiple_of(2) { ("host-a", KEY_A) } else { ("host-b", KEY_B) };
            let config = self.dir.join(format!("run-{}.toml", self.next_run));
            let t = format!(
                "[link]\npoll = \"blocking\"\nidle_timeout_ms = 1000\n[pool]\netcd = {:?}\nhost = \"{}\"\n\
                 key = \"{}\"\nwant = 1\nlease_ttl_s = 5\n{}",
                self.etcd,
                host.0,
                host.1,
                imp.toml()
            );
            std::fs::write(&config, t).map_err(|e| format!("{}: {e}", config.display()))?;
            let log = self.dir.join(format!("run-{}.log", self.next_run));
            let child = self.spawn(&["host", "--workload"], &config, &log)?;
            self.runs.push(WorkloadRun {
                id: self.next_run,
                child,
                log,
                started: Instant::now(),
                killed: false,
                imp,
            });
        }
        Ok(())
    }

    /// What comes back once its time has come: box-b, an etcd member.
    pub(super) fn bring_back(&mut self, now: Instant) -> Result<(), String> {
        if self.box_b_back.is_some_and(|t| now >= t) {
            self.box_b_back = None;
            self.boxes[1].write_config(&self.dir, &self.etcd)?;
            let child = self.spawn(&["gpu"], &self.boxes[1].config, &self.dir.join("box-b.log"))?;
            self.boxes[1].child = Some(child);
        }
        if self.box_b_stopped_until.is_some_and(|t| now >= t) {
            self.box_b_stopped_until = None;
            self.signal_box_b(rustix::process::Signal::CONT);
        }
        if let Some((m, t)) = self.etcd_back
            && now >= t
        {
            self.etcd_back = None;
            self.cluster.restart(m).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn signal_box_b(&self, sig: rustix::process::Signal) {
        if let Some(c) = &self.boxes[1].child {
            let _ = rustix::process::kill_process(rustix::process::Pid::from_child(c), sig);
        }
    }

    /// One fault, picked at random.
    pub(super) fn inject_fault(&mut self, now: Instant) -> Result<(), String> {
        match self.rng.below(8) {
            6 if self.box_b_back.is_none() && self.box_b_stopped_until.is_none() => {
                // An outage within the hosts' ride-through time (10 s): box-b stopped, as a
                // switch reboot or a descheduled box looks from the hosts.
                self.signal_box_b(rustix::process::Signal::STOP);
                self.box_b_stopped_until = Some(now + self.rng.ms(1000, 5000));
                self.tally.fault("box-b stopped (SIGSTOP) for 1-5 s, then continued");
            }
            0 if self.box_b_back.is_none() && self.box_b_stopped_until.is_none() => {
                if let Some(mut c) = self.boxes[1].child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                self.boxes[1].imp = if self.rng.chance(0.5) {
                    Imp { loss: 0.1, delay_us: self.rng.below(300), jitter_us: self.rng.below(300) }
                } else {
                    Imp::default()
                };
                self.box_b_back = Some(now + self.rng.ms(500, 3000));
                self.tally.fault("box-b killed (SIGKILL) and restarted");
            }
            1 if !self.runs.is_empty() => {
                let k = self.rng.below(self.runs.len() as u64) as usize;
                let _ = self.runs[k].child.kill();
                self.runs[k].killed = true;
                self.tally.fault("host killed mid-run (SIGKILL)");
            }
            2 if self.etcd_back.is_none() => {
                let m = self.rng.below(3) as usize;
                self.cluster.kill(m);
                self.etcd_back = Some((m, now + self.rng.ms(2000, 5000)));
                self.tally.fault("etcd member killed and restarted");
            }
            3 => {
                let k = self.rng.below(2) as usize;
                let b = &mut self.boxes[k];
                if let Some(c) = &b.child {
                    b.named_allow = !b.named_allow;
                    b.write_config(&self.dir, &self.etcd)?;
                    let pid = rustix::process::Pid::from_child(c);
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::HUP);
                    self.tally.fault("live reload (allow lists changed)");
                }
            }
            4 => {
                let sock = self.boxes[self.rng.below(2) as usize].socket(&self.dir);
                let hold = self.rng.ms(3000, 10_000);
                let partial = self.rng.chance(0.5);
                self.stallers.push(std::thread::spawn(move || {
                    if let Ok(mut s) = std::os::unix::net::UnixStream::connect(&sock) {
                        if partial {
                            let _ = s.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"meth");
                        }
                        std::thread::sleep(hold);
                    }
                }));
                self.tally.fault("control client that stalls");
            }
            5 => {
                let port = self.boxes[self.rng.below(2) as usize].metrics;
                let bytes = 3 + self.rng.below(8) as usize;
                self.stallers.push(std::thread::spawn(move || {
                    if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                        for b in b"GET /metrics HTTP/1.1\r\n".iter().take(bytes) {
                            if s.write_all(&[*b]).is_err() {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(1000));
                        }
                    }
                }));
                self.tally.fault("metrics client that trickles");
            }
            _ => {
                // Several idle metrics connections at once.
                let port = self.boxes[0].metrics;
                self.stallers.push(std::thread::spawn(move || {
                    let held: Vec<_> = (0..8)
                        .filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).ok())
                        .collect();
                    std::thread::sleep(Duration::from_secs(4));
                    drop(held);
                }));
                self.tally.fault("idle metrics connections");
            }
        }
        Ok(())
    }

    /// box-a's control socket and metrics asked once each, timed.
    pub(super) fn probe(&mut self, start: Instant) {
        self.tally.probes += 1;
        let t = Instant::now();
        let sock = self.boxes[0].socket(&self.dir);
        if let Err(e) = ops::control::call(&sock, "status", Value::Null, PROBE_LIMIT) {
            self.tally.probe_failures.push(format!("control at {:.0} s: {e}", start.elapsed().as_secs_f64()));
        }
        self.tally.probe_max = self.tally.probe_max.max(t.elapsed());
        let t = Instant::now();
        if let Err(e) = scrape(self.boxes[0].metrics) {
            self.tally.probe_failures.push(format!("metrics at {:.0} s: {e}", start.elapsed().as_secs_f64()));
        }
        self.tally.probe_max = self.tally.probe_max.max(t.elapsed());
    }

    /// The stalling clients joined, the boxes stopped (SIGTERM), a killed etcd member back.
    pub(super) fn stop(&mut self) {
        if self.box_b_stopped_until.take().is_some() {
            self.signal_box_b(rustix::process::Signal::CONT);
        }
        for s in self.stallers.drain(..) {
            let _ = s.join();
        }
        for b in &mut self.boxes {
            if let Some(c) = b.child.take() {
                let pid = rustix::process::Pid::from_child(&c);
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                let mut c = c;
                let _ = c.wait();
            }
        }
        if let Some((m, _)) = self.etcd_back.take() {
            let _ = self.cluster.restart(m);
        }
    }
}
