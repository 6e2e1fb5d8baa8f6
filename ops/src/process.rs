//! What a daemon process needs besides its endpoint: logging (text, or one JSON object a line
//! for log shippers), and the flags signals raise (stop on SIGINT / SIGTERM, reload on
//! SIGHUP).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Why the process could not set itself up.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// A log level that is not one.
    #[error("--log-level {0}: must be error, warn, info, debug, trace or off")]
    LogLevel(String),
    /// A signal's handler could not be installed.
    #[error("signal handler: {0}")]
    Signal(#[source] std::io::Error),
}

/// For the run times' errors, which are text.
impl From<ProcessError> for String {
    fn from(e: ProcessError) -> String {
        e.to_string()
    }
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// `[time LEVEL] message`.
    Text,
    /// One JSON object a line.
    Json,
}

/// Starts logging at `level` unless `RUST_LOG` says otherwise.
pub fn init_logging(level: &str) -> Result<(), ProcessError> {
    init_logging_as(level, LogFormat::Text)
}

/// [`init_logging`] in `format`.
pub fn init_logging_as(level: &str, format: LogFormat) -> Result<(), ProcessError> {
    if !["error", "warn", "info", "debug", "trace", "off"].contains(&level) {
        return Err(ProcessError::LogLevel(level.to_string()));
    }
    let env = env_logger::Env::default().default_filter_or(level);
    let mut b = env_logger::Builder::from_env(env);
    b.format_target(false);
    // Under systemd, standard error goes to the journal (JOURNAL_STREAM names it): each line
    // starts with its sd-daemon priority (`<3>` error … `<7>` debug) so that `journalctl -p
    // err` finds the errors, and without a time stamp (the journal keeps its own).
    if format == LogFormat::Text && stderr_is_the_journal() {
        b.format(|buf, r| {
            use std::io::Write;
            writeln!(buf, "<{}>{}", priority(r.level()), r.args())
        });
    }
    if format == LogFormat::Json {
        b.format(|buf, r| {
            use std::io::Write;
            let mut m = serde_json::Map::new();
            m.insert("ts".into(), buf.timestamp_micros().to_string().into());
            m.insert("level".into(), r.level().as_str().into());
            m.insert("target".into(), r.target().into());
            m.insert("msg".into(), r.args().to_string().into());
            let _ = r.key_values().visit(&mut JsonFields(&mut m));
            writeln!(buf, "{}", serde_json::Value::Object(m))
        });
    }
    let _ = b.try_init();
    Ok(())
}

/// Whether standard error is the journal's stream: `JOURNAL_STREAM` names its device and
/// inode (a child of a service inherits the variable with another standard error).
fn stderr_is_the_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = v.to_str().and_then(|v| v.split_once(':')) else { return false };
    let Ok(st) = rustix::fs::fstat(std::io::stderr()) else { return false };
    dev.parse::<u64>().is_ok_and(|d| d == st.st_dev) && ino.parse::<u64>().is_ok_and(|i| i == st.st_ino)
}

/// sd-daemon(3)'s priority of a log level: error 3, warning 4, info 6, debug and trace 7.
pub fn priority(level: log::Level) -> u8 {
    match level {
        log::Level::Error => 3,
        log::Level::Warn => 4,
        log::Level::Info => 6,
        log::Level::Debug | log::Level::Trace => 7,
    }
}

/// A log record's key-value fields (session, host, device, peer, token) into its JSON line.
struct JsonFields<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl<'kvs> log::kv::VisitSource<'kvs> for JsonFields<'_> {
    fn visit_pair(
        &mut self,
        key: log::kv::Key<'kvs>,
        value: log::kv::Value<'kvs>,
    ) -> Result<(), log::kv::Error> {
        let v = match value.to_u64() {
            Some(n) => serde_json::Value::from(n),
            None => serde_json::Value::from(value.to_string()),
        };
        self.0.insert(key.as_str().to_string(), v);
        Ok(())
    }
}

/// A flag SIGHUP sets: the endpoint reads its configuration again.
pub fn hup_flag() -> Result<Arc<AtomicBool>, ProcessError> {
    let hup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone()).map_err(ProcessError::Signal)?;
    Ok(hup)
}

/// A flag that SIGINT and SIGTERM set; a second one while it is set ends the process at once
/// (exit status 1), for a stop that takes too long.
pub fn stop_flag() -> Result<Arc<AtomicBool>, ProcessError> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // The conditional shutdown is registered first, so that it sees the flag as the first
        // signal left it.
        signal_hook::flag::register_conditional_shutdown(sig, 1, stop.clone())
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()))
            .map_err(ProcessError::Signal)?;
    }
    Ok(stop)
}
