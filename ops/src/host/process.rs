//! `dxpu host`'s process: the main loop, `--check`, and the run that reads the file and picks
//! the loop (static `[[attach]]`, the pool, a workload).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;

use super::runtime::{HostConfig, HostRuntime, entries, read_host_file};
use crate::Workload;
use crate::config::{self, HostFile, LinkOverride};
use crate::control::{Calls, ControlServer, RpcError};
use crate::error::RunError;
use crate::metrics::MetricsServer;
use crate::reload::{PendingRead, READ_DEADLINE, ReadState};

/// The main loop of `dxpu host` with `[[attach]]` and no `--workload`: moves the devices'
/// attaches on, answers control calls and scrapes, reloads on SIGHUP (the file read off the
/// loop), until a signal stops it. Tells the service manager it is ready once every device's
/// first attach has ended, and which are up whenever that changes.
pub fn serve(rt: &mut HostRuntime, hup: &AtomicBool) -> Result<(), RunError> {
    let calls = Calls::new();
    let _control =
        rt.file.control.socket.as_deref().map(|p| ControlServer::bind(p, calls.sender())).transpose()?;
    let _metrics = match rt.file.metrics.listen()? {
        Some(a) => Some(MetricsServer::bind(a, calls.sender())?),
        None => None,
    };
    let mut ready = false;
    let mut status = String::new();
    let mut reload: Option<PendingRead<HostConfig, RunError>> = None;
    let mut reload_again = false;
    let mut watchdog = crate::notify::Watchdog::from_env();
    while !rt.stop.load(Ordering::Relaxed) {
        watchdog.tick();
        if let Some(c) = calls.next_within(Duration::from_millis(20)) {
            match c.method.as_str() {
                "attach" => rt.attach_call(c),
                "reload" => match c.only_params(&[]) {
                    Err(e) => c.answer(Err(e)),
                    Ok(()) => {
                        if reload.is_none() {
                            reload = start_reload(rt);
                        }
                        match reload.as_mut() {
                            Some(r) => r.wait_with(c),
                            None => {
                                c.answer(Err(RpcError::failed("reload: could not start reading the file")))
                            }
                        }
                    }
                },
                _ => {
                    let r = rt.answer(&c);
                    c.answer(r);
                }
            }
        }
        rt.step();
        if !ready && rt.settled() {
            ready = true;
            log::info!(
                "{} of {} device(s) attached, {} served over vfio-user; SIGINT or SIGTERM detaches and exits",
                rt.attached(),
                rt.entries.len(),
                rt.served()
            );
        }
        if ready {
            let now = rt.status_line();
            if now != status {
                crate::notify::ready(&now);
                status = now;
            }
        }
        if hup.swap(false, Ordering::Relaxed) {
            if reload.is_some() {
                reload_again = true;
            } else {
                reload = start_reload(rt);
            }
        }
        if let Some(mut r) = reload.take() {
            match r.poll() {
                ReadState::Reading => reload = Some(r),
                ReadState::Done(read) => {
                    let applied = read.and_then(|(file, all)| rt.apply(file, all));
                    match &applied {
                        Ok(v) => log::info!("reloaded {}: {v}", rt.path.display()),
                        Err(e) => log::error!("reload refused, still running on the old configuration: {e}"),
                    }
                    r.answer(&applied);
                    // Ready again, with what is up now.
                    status.clear();
                    if reload_again {
                        reload_again = false;
                        reload = start_reload(rt);
                    }
                }
            }
        }
    }
    crate::notify::notify("STOPPING=1");
    rt.stop.store(true, Ordering::Relaxed);
    if let Some(r) = reload {
        r.answer(&Err::<Value, _>(RunError::Stopping));
    }
    rt.detach_all();
    Ok(())
}

/// Starts reading the file again off the loop (said to the service manager).
fn start_reload(rt: &HostRuntime) -> Option<PendingRead<HostConfig, RunError>> {
    crate::notify::reloading();
    let (path, overrides) = (rt.path.clone(), rt.overrides.clone());
    match PendingRead::start(rt.path.display().to_string(), READ_DEADLINE, move || {
        read_host_file(&path, &overrides)
    }) {
        Ok(r) => Some(r),
        Err(e) => {
            log::error!("{e}");
            None
        }
    }
}

/// How `dxpu host` was started: the file and the command line's overrides.
#[derive(Clone, Debug, Default)]
pub struct HostStart {
    /// The configuration file.
    pub config: PathBuf,
    /// `--server`: the box for every `[[attach]]`.
    pub server: Option<String>,
    /// `--driver` and `--poll`.
    pub link: LinkOverride,
    /// `--capture FILE` and its size bound.
    pub capture: Option<(PathBuf, u64)>,
}

/// `dxpu host --check`: the file read and validated as a start would (key files, sockets'
/// directories, the pool section), nothing attached; what it would do.
pub fn check(start: &HostStart) -> Result<String, RunError> {
    let at = || start.config.display().to_string();
    let mut file: HostFile = config::read(&start.config)?;
    file.override_link(start.link);
    let in_file = |source| RunError::InFile { path: at(), source };
    let all = file.attachments(start.server.as_deref()).map_err(in_file)?;
    file.metrics.listen()?;
    file.control.check().map_err(in_file)?;
    match file.pool().map_err(in_file)? {
        Some(_) if !all.is_empty() => Err(RunError::AttachAndPool { path: at() }),
        Some(p) => Ok(format!("a pool host wanting {} device(s)", p.agent.want)),
        None => Ok(format!(
            "{} device(s), {} served over vfio-user",
            all.len(),
            all.iter().filter(|(_, s)| s.is_some()).count()
        )),
    }
}

/// `dxpu host --check --against-running`: the file validated as `--check` does, then compared
/// with what the daemon on its `[control]` socket runs.
pub fn check_against_running(start: &HostStart) -> Result<crate::against::Comparison, RunError> {
    check(start)?;
    let mut file: HostFile = config::read(&start.config)?;
    file.override_link(start.link);
    crate::against::against_running(&start.config, file.control.socket.as_deref(), &file.fingerprint())
}

/// `dxpu host`: reads the file; with `[[attach]]`, attaches each device (each on its own
/// thread) and serves until SIGINT / SIGTERM, reloading on SIGHUP; with `[pool]`, claims
/// from the pool (`pool_host`). With `workload`, runs it on every device once attached,
/// detaches and returns instead. `Ok(false)`: a workload did not verify, or a device could
/// not be had for it.
pub fn run(start: HostStart, workload: Option<Workload<'_>>) -> Result<bool, RunError> {
    let at = || start.config.display().to_string();
    let in_file = |source| RunError::InFile { path: at(), source };
    let mut file: HostFile = config::read(&start.config)?;
    file.override_link(start.link);
    let all = file.attachments(start.server.as_deref()).map_err(in_file)?;
    let pool = file.pool().map_err(in_file)?;
    let stop = crate::process::stop_flag()?;
    // SIGHUP is taken in every mode: its default would end the process.
    let hup = crate::process::hup_flag()?;
    if let Some(hp) = pool {
        if start.capture.is_some() {
            return Err(RunError::CaptureInPool);
        }
        if !all.is_empty() {
            return Err(RunError::AttachAndPool { path: at() });
        }
        let ops = (file.control.clone(), file.metrics.clone());
        let reload =
            crate::pool_host::PoolReload { path: start.config.clone(), link: start.link, running: file, hup };
        let ok = crate::pool_host::run_host(hp, stop, workload, ops, reload);
        log::info!("stopped");
        return Ok(ok);
    }
    let overrides = (start.server.clone(), start.link);
    let capture = match &start.capture {
        Some((f, limit)) => Some(crate::capture::Capture::create(f, *limit)?),
        None => None,
    };
    let mut rt = HostRuntime::new(start.config.clone(), file, overrides, entries(all), stop.clone());
    rt.tap = capture.as_ref().and_then(|c| c.tap());
    rt.retries = workload.is_none();
    // Every device attaches on a thread of its own: one box that does not answer costs its
    // device, not the others.
    rt.attach_all();
    let mut ok = true;
    match workload {
        Some(run_on) => {
            while !rt.settled() {
                rt.step();
                std::thread::sleep(Duration::from_millis(10));
            }
            rt.step();
            for (name, why) in rt.down() {
                log::error!("{name}: not attached, no workload: {why}");
                ok = false;
            }
            if rt.served() > 0 {
                log::warn!("--workload runs on the devices not served over vfio-user only");
            }
            for (name, d) in rt.take_direct() {
                ok &= run_on(&name, d, &stop);
            }
            stop.store(true, Ordering::Relaxed);
            rt.detach_all();
        }
        None => {
            if let Err(e) = serve(&mut rt, &hup) {
                rt.detach_all();
                return Err(e);
            }
        }
    }
    drop(rt);
    if let Some(c) = capture
        && let Err(e) = c.finish()
    {
        log::error!("{e}");
    }
    log::info!("stopped");
    Ok(ok)
}
