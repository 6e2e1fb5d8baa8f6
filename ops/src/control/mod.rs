//! The control socket: JSON-RPC 2.0 on a UNIX socket, one request object per line and one
//! response per line (as SPDK's `rpc.py` speaks to its target, newline-framed).
//!
//! The socket's own thread accepts; each client gets a thread that reads its requests and
//! writes the answers, with timeouts, so a client that stalls, never reads or disconnects
//! mid-line costs its own thread only. Requests reach the endpoint's loop through a channel
//! it looks at between polls ([`Calls::try_next`], one atomic load when empty): the
//! datapath never waits on a client.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Value, json};

pub use crate::caller::Caller;

pub mod answer;

/// JSON-RPC 2.0's error codes: a request that does not parse.
pub const PARSE_ERROR: i64 = -32700;
/// Not a valid request object.
pub const INVALID_REQUEST: i64 = -32600;
/// No such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// The method's parameters are wrong.
pub const INVALID_PARAMS: i64 = -32602;
/// The endpoint refused or failed what was asked (the message says why).
pub const FAILED: i64 = -32000;

/// Clients served at once; one more is answered with an error and closed.
const MAX_CLIENTS: usize = 16;
/// A request line longer than this is refused (and the client closed): a control request is
/// a method and a few parameters (a reload's, an attach's), far below it.
pub const MAX_LINE: usize = 64 << 10;
/// Requests in one batch; a longer batch is refused whole. With [`MAX_LINE`] and
/// the most clients (16) it bounds what the clients hold at once: 16 lines of 64 KiB, parsed, and
/// 16 batches of answers — a few MiB, where a batch of a megabyte's requests each asking
/// for `stats` held hundreds.
pub const MAX_BATCH: usize = 32;
/// The answers to one line, in bytes; past it, the rest of a batch is answered with an
/// error instead.
const MAX_LINE_ANSWER: usize = 4 << 20;
/// How long a client's thread waits for the endpoint's answer: longer than a reload may take
/// to read its files (`reload::READ_DEADLINE`, 10 s), so that a `ctl reload` of a file that
/// blocks gets the reload's own answer (its deadline passed), not this one.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a write to a client may block before the client is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// A JSON-RPC error: code and message.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub(crate) code: i64,
    pub(crate) message: String,
}

impl RpcError {
    /// An error with `code` saying `message`.
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into() }
    }
    /// Wrong parameters.
    pub fn params(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }
    /// The endpoint refused or failed.
    pub fn failed(message: impl std::fmt::Display) -> RpcError {
        RpcError::new(FAILED, message.to_string())
    }
}

/// A method call for the endpoint to answer.
pub struct Call {
    pub(crate) method: String,
    pub(crate) params: Value,
    /// Who called, where the socket says (`SO_PEERCRED`).
    pub(crate) caller: Option<Arc<Caller>>,
    reply: mpsc::Sender<Result<Value, RpcError>>,
}

/// The methods that change what an endpoint does: logged with their caller and outcome.
const CHANGES: [&str; 5] = ["attach", "detach", "export", "unexport", "reload"];

impl Call {
    /// A call and where its answer arrives (for the endpoint's own servers: metrics).
    pub fn new(method: &str, params: Value) -> (Call, mpsc::Receiver<Result<Value, RpcError>>) {
        let (reply, answer) = mpsc::channel();
        (Call { method: method.to_string(), params, caller: None, reply }, answer)
    }

    /// Sends the answer back to the client's thread (gone if the client went).
    pub fn answer(self, r: Result<Value, RpcError>) {
        let _ = self.reply.send(r);
    }

    /// Parameter `name` as a string, required.
    pub fn str_param(&self, name: &str) -> Result<String, RpcError> {
        match self.params.get(name) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v) => Err(RpcError::params(format!(
                "{}: parameter '{name}' must be a string, not {v}",
                self.method
            ))),
            None => Err(RpcError::params(format!("{}: parameter '{name}' is required", self.method))),
        }
    }

    /// Refuses parameters the method does not take.
    pub fn only_params(&self, names: &[&str]) -> Result<(), RpcError> {
        match &self.params {
            Value::Null => Ok(()),
            Value::Object(m) => match m.keys().find(|k| !names.contains(&k.as_str())) {
                Some(k) => Err(RpcError::params(format!(
                    "{}: unknown parameter '{k}' (takes: {})",
                    self.method,
                    if names.is_empty() { "none".to_string() } else { names.join(", ") }
                ))),
                None => Ok(()),
            },
            v => Err(RpcError::params(format!("{}: params must be an object, not {v}", self.method))),
        }
    }
}

/// Where the endpoint's loop finds the calls of the control socket and the metrics server.
pub struct Calls {
    rx: mpsc::Receiver<Call>,
    tx: mpsc::Sender<Call>,
}

impl Default for Calls {
    fn default() -> Calls {
        Calls::new()
    }
}

impl Calls {
    /// An empty queue.
    pub fn new() -> Calls {
        let (tx, rx) = mpsc::channel();
        Calls { rx, tx }
    }

    /// A sender for a server.
    pub fn sender(&self) -> mpsc::Sender<Call> {
        self.tx.clone()
    }

    /// The next call waiting, if any (does not block: one atomic load when there is none).
    pub fn try_next(&self) -> Option<Call> {
        self.rx.try_recv().ok()
    }

    /// Waits up to `d` for a call.
    pub fn next_within(&self, d: Duration) -> Option<Call> {
        self.rx.recv_timeout(d).ok()
    }
}

/// A server of the run time (the control socket, the metrics endpoint) that could not start:
/// what it was doing, and the system's error.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct StartError {
    /// What failed (`control socket /run/dxpu/gpu/control.sock`, `metrics.listen 127.0.0.1:9100`).
    pub what: String,
    /// The system's error.
    #[source]
    pub source: std::io::Error,
}

impl StartError {
    /// A `map_err` for an `io::Error` while doing `what`.
    pub fn of(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StartError {
        let what = what.into();
        move |source| StartError { what, source }
    }
}

/// For the run times' errors, which are text.
impl From<StartError> for String {
    fn from(e: StartError) -> String {
        e.to_string()
    }
}

/// The control socket, serving until dropped.
pub struct ControlServer {
    socket: bridge_host::socket_path::SocketPath,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Binds `path` (mode 0600; a stale socket there that nobody serves is replaced; a live
    /// one, or anything that is not a socket — a file, a symlink — is an error and is left
    /// alone) and starts accepting.
    pub fn bind(path: &Path, tx: mpsc::Sender<Call>) -> Result<ControlServer, StartError> {
        let at = path.display();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(StartError::of(format!("control socket {at}: creating {}", dir.display())))?;
        }
        let (listener, socket) = bridge_host::socket_path::bind(path, bridge_host::SocketAccess::default())
            .map_err(StartError::of("control socket"))?;
        listener.set_nonblocking(true).map_err(StartError::of(format!("control socket {at}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let accept = std::thread::Builder::new()
            .name("dxpu-control".into())
            .spawn(move || accept_loop(listener, tx, stop2))
            .map_err(StartError::of(format!("control socket {at}: starting its thread")))?;
        log::info!("control socket on {at}");
        Ok(ControlServer { socket, stop, accept: Some(accept) })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.socket.remove();
    }
}

fn accept_loop(listener: UnixListener, calls: mpsc::Sender<Call>, stop: Arc<AtomicBool>) {
    let clients = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
                if clients.load(Ordering::Relaxed) >= MAX_CLIENTS {
                    let e = RpcError::failed(format!("too many control clients (at most {MAX_CLIENTS})"));
                    let _ = writeln!(stream, "{}", response(Value::Null, Err(e)));
                    continue;
                }
                clients.fetch_add(1, Ordering::Relaxed);
                let (calls, clients2, stop) = (calls.clone(), clients.clone(), stop.clone());
                let spawned =
                    std::thread::Builder::new().name("dxpu-control-client".into()).spawn(move || {
                        serve_client(stream, &calls, &stop);
                        clients2.fetch_sub(1, Ordering::Relaxed);
                    });
                if spawned.is_err() {
                    clients.fetch_sub(1, Ordering::Relaxed);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => {
                log::warn!("control socket: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Reads request lines until the client closes (or stalls past the stop), answering each.
fn serve_client(stream: UnixStream, calls: &mpsc::Sender<Call>, stop: &AtomicBool) {
    let caller = Caller::of(&stream).map(Arc::new);
    // The read wakes now and then to see whether the endpoint is stopping.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let Ok(mut out) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        // At most one byte past the limit is read, however long the client streams without a
        // newline (`read_until` alone would keep growing the line until it paused).
        let room = (MAX_LINE + 1).saturating_sub(line.len()) as u64;
        match (&mut reader).take(room).read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) if !line.ends_with(b"\n") && line.len() <= MAX_LINE => continue,
            Ok(_) => {}
            // What was read so far stays in `line`; the read goes on.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                continue;
            }
            Err(_) => return,
        }
        if line.len() > MAX_LINE {
            let e = RpcError::new(INVALID_REQUEST, format!("request longer than {MAX_LINE} bytes"));
            let _ = writeln!(out, "{}", response(Value::Null, Err(e)));
            return;
        }
        let text = std::mem::take(&mut line);
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let Some(answer) = handle_line(&text, calls, caller.as_ref()) else { continue };
        if writeln!(out, "{answer}").and_then(|_| out.flush()).is_err() {
            // The client does not read (the write timed out) or went away.
            return;
        }
    }
}

/// JSON in which no object names a key twice: `{"method":"status","method":"reload"}` is
/// refused rather than read as its last key (RFC 8259 §4 leaves duplicates' meaning to the
/// reader; a control socket must not guess which of two methods was meant).
struct Strict(Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(Strict(e)) = a.next_element()? {
            v.push(e);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut m = serde_json::Map::new();
        while let Some(k) = a.next_key::<String>()? {
            let Strict(v) = a.next_value()?;
            if m.insert(k.clone(), v).is_some() {
                return Err(serde::de::Error::custom(format!("the key {k:?} appears twice in one object")));
            }
        }
        Ok(Value::Object(m))
    }
}

/// One request line: parsed, checked, handed to the endpoint, answered — as JSON-RPC 2.0
/// says: a request without `id` is a notification (done, not answered), an array is a batch
/// (answered with an array of the answers to its requests, nothing if all were
/// notifications; an empty one is an Invalid Request).
fn handle_line(text: &[u8], calls: &mpsc::Sender<Call>, caller: Option<&Arc<Caller>>) -> Option<Value> {
    let req: Value = match serde_json::from_slice::<Strict>(text) {
        Ok(v) => v.0,
        Err(e) => {
            return Some(response(Value::Null, Err(RpcError::new(PARSE_ERROR, format!("not JSON: {e}")))));
        }
    };
    match req {
        Value::Array(batch) if batch.is_empty() => {
            Some(response(Value::Null, Err(RpcError::new(INVALID_REQUEST, "an empty batch"))))
        }
        Value::Array(batch) if batch.len() > MAX_BATCH => Some(response(
            Value::Null,
            Err(RpcError::new(
                INVALID_REQUEST,
                format!(
                    "a batch of {} requests: at most {MAX_BATCH} (send the rest in another)",
                    batch.len()
                ),
            )),
        )),
        Value::Array(batch) => {
            let mut answers = Vec::new();
            let mut bytes = 0;
            for r in &batch {
                let a = match bytes > MAX_LINE_ANSWER {
                    false => handle_request(r, calls, caller),
                    true => Some(response(
                        r.get("id").cloned().unwrap_or(Value::Null),
                        Err(RpcError::failed(format!(
                            "not run: this batch's answers passed {MAX_LINE_ANSWER} bytes; ask again in a batch of its own"
                        ))),
                    )),
                };
                if let Some(a) = a {
                    bytes += a.to_string().len();
                    answers.push(a);
                }
            }
            (!answers.is_empty()).then_some(Value::Array(answers))
        }
        req => handle_request(&req, calls, caller),
    }
}

/// One request object; `None` for a notification.
fn handle_request(req: &Value, calls: &mpsc::Sender<Call>, caller: Option<&Arc<Caller>>) -> Option<Value> {
    if !req.is_object() {
        return Some(response(Value::Null, Err(RpcError::new(INVALID_REQUEST, "a request is an object"))));
    }
    let notification = req.get("id").is_none();
    let id = req.get("id").cloned().unwrap_or(Value::Null);
    if !matches!(id, Value::Null | Value::String(_) | Value::Number(_)) {
        return Some(response(
            Value::Null,
            Err(RpcError::new(INVALID_REQUEST, "id must be a string, number or null")),
        ));
    }
    if req.get("jsonrpc") != Some(&json!("2.0")) {
        return Some(response(id, Err(RpcError::new(INVALID_REQUEST, "\"jsonrpc\": \"2.0\" is required"))));
    }
    let Some(method) = req.get("method").and_then(Value::as_str) else {
        return Some(response(id, Err(RpcError::new(INVALID_REQUEST, "\"method\" must be a string"))));
    };
    let params = req.get("params").cloned().unwrap_or(Value::Null);
    // What a change was called with, kept for the audit line (a read keeps nothing).
    let audited = CHANGES.contains(&method).then(|| params.clone());
    let (mut call, answer) = Call::new(method, params);
    call.caller = caller.cloned();
    if calls.send(call).is_err() {
        return (!notification).then(|| response(id, Err(RpcError::failed("the endpoint is stopping"))));
    }
    let r = answer.recv_timeout(ANSWER_TIMEOUT).unwrap_or_else(|_| {
        Err(RpcError::failed(format!("the endpoint did not answer within {ANSWER_TIMEOUT:?}")))
    });
    if let Some(params) = audited {
        // Who changed what, and what came of it: the audit trail.
        let who = caller.map_or("a caller the kernel did not name".to_string(), |c| c.to_string());
        let params = if params.is_null() { String::new() } else { format!(" {params}") };
        match &r {
            Ok(_) => log::info!("control: {method}{params} by {who}: done"),
            Err(e) => log::warn!("control: {method}{params} by {who}: refused: {}", e.message),
        }
    }
    (!notification).then(|| response(id, r))
}

fn response(id: Value, r: Result<Value, RpcError>) -> Value {
    match r {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": tidy(result)}),
        Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": e.message}}),
    }
}

/// The longest answer `dxpu ctl` reads (a devices list of thousands fits many times over).
pub const MAX_ANSWER: usize = 16 << 20;

/// Calls `method` on the control socket at `path` (the `dxpu ctl` side). `timeout` is a
/// deadline for the whole exchange, not per read, and an answer longer than
/// [`MAX_ANSWER`] is refused: a server that trickles or streams without end costs the
/// caller that long and that much, no more.
pub fn call(path: &Path, method: &str, params: Value, timeout: Duration) -> Result<Value, CallError> {
    let at = path.display().to_string();
    let io = |doing: &'static str| {
        let at = at.clone();
        move |source| CallError::Io { socket: at, doing, source }
    };
    let deadline = std::time::Instant::now() + timeout;
    let mut s =
        UnixStream::connect(path).map_err(|source| CallError::Connect { socket: at.clone(), source })?;
    s.set_write_timeout(Some(timeout)).map_err(io("setting its timeout"))?;
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    writeln!(s, "{req}").map_err(io("sending"))?;
    let mut line = Vec::new();
    let mut buf = [0u8; 64 << 10];
    let no_answer = || CallError::NoAnswer { socket: at.clone(), within: timeout };
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(no_answer());
        }
        s.set_read_timeout(Some(left)).map_err(io("setting its timeout"))?;
        let n = match s.read(&mut buf) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(no_answer());
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io("reading")(e)),
        };
        if n == 0 {
            break;
        }
        match buf[..n].iter().position(|b| *b == b'\n') {
            Some(i) => {
                line.extend_from_slice(&buf[..i]);
                break;
            }
            None => line.extend_from_slice(&buf[..n]),
        }
        if line.len() > MAX_ANSWER {
            return Err(CallError::TooLong { socket: at, limit: MAX_ANSWER });
        }
    }
    if line.is_empty() {
        return Err(CallError::Closed { socket: at });
    }
    serde_json::from_slice(&line).map_err(|e| CallError::NotJson { socket: at, why: e.to_string() })
}

/// What to check where a control socket could not be reached.
fn connect_hint(e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::PermissionDenied => format!(
            " (this process runs as {}; the socket is its service's, mode 0600, and the packaged services run as user {}: run this as root or as that user)",
            crate::config::running_as(),
            crate::config::SERVICE_USER
        ),
        ErrorKind::NotFound => {
            " (no such socket: is the service running, with `[control] socket` set to this path?)".to_string()
        }
        ErrorKind::ConnectionRefused => " (nothing serves it: the service has stopped)".to_string(),
        _ => String::new(),
    }
}

/// Why a control call got no answer to read.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The socket could not be reached (the error says what to check).
    #[error("control socket {socket}: {source}{}", connect_hint(.source))]
    Connect {
        /// The socket's path.
        socket: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The socket could not be written or read.
    #[error("control socket {socket}: {doing}: {source}")]
    Io {
        /// The socket's path.
        socket: String,
        /// What the call was doing.
        doing: &'static str,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// No whole answer within the call's time.
    #[error("control socket {socket}: no complete answer within {within:?}")]
    NoAnswer {
        /// The socket's path.
        socket: String,
        /// The time the call allowed.
        within: Duration,
    },
    /// An answer longer than any the endpoint sends.
    #[error("control socket {socket}: the answer is longer than {limit} bytes")]
    TooLong {
        /// The socket's path.
        socket: String,
        /// The most read.
        limit: usize,
    },
    /// The endpoint closed the connection without answering.
    #[error("control socket {socket}: closed without an answer")]
    Closed {
        /// The socket's path.
        socket: String,
    },
    /// The answer is not JSON.
    #[error("control socket {socket}: the answer is not JSON: {why}")]
    NotJson {
        /// The socket's path.
        socket: String,
        /// The parser's complaint.
        why: String,
    },
}

/// Significant digits a fractional number keeps in JSON output: more than any figure here is
/// measured to, fewer than binary floating point's noise (`2.3329999999999997`).
pub const SIGNIFICANT_DIGITS: usize = 9;

/// `v` with every fractional number rounded to [`SIGNIFICANT_DIGITS`], so that a figure
/// computed in binary floating point prints as it was meant (`2.333`). Integers, and times of
/// day (integers too: [`unix_seconds`]), are left as they are.
pub fn tidy(v: Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(0.0);
            // Printed to the digits kept and read back: the nearest double to that decimal,
            // which serde_json prints in its shortest form.
            let rounded: f64 = format!("{x:.*e}", SIGNIFICANT_DIGITS - 1).parse().unwrap_or(x);
            serde_json::Number::from_f64(rounded).map_or(Value::Null, Value::Number)
        }
        Value::Array(a) => Value::Array(a.into_iter().map(tidy).collect()),
        Value::Object(m) => Value::Object(m.into_iter().map(|(k, v)| (k, tidy(v))).collect()),
        v => v,
    }
}

/// A time of day as answers give it: whole seconds since the Unix epoch (docs/cli.md), so
/// that `since_unix_seconds` is an integer from every command.
pub fn unix_seconds(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Seconds since `started`, to the millisecond.
pub fn uptime_since(started: std::time::Instant) -> f64 {
    (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests;
