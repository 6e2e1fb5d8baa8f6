//! Prometheus metrics: the endpoint's counters in the text exposition format 0.0.4 (through
//! the `prometheus` crate's data model and encoder), served over HTTP on `[metrics] listen`.
//!
//! A scrape asks the endpoint's loop for a snapshot of its counters (the same channel the
//! control socket uses: the datapath never waits on a scraper) and encodes it; a counter
//! here is always one the endpoint already keeps, so what a scrape reports is what
//! `dxpu ctl stats` says.

use std::net::SocketAddr;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus::proto::{self, MetricType};

use crate::control::{Call, StartError};

/// Label pairs of one sample.
pub type Labels = Vec<(String, String)>;

/// Builds label pairs from `(name, value)`s.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[derive(Debug, Clone)]
enum Value {
    Counter(f64),
    Gauge(f64),
    /// Sum, count, and per bucket its upper bound and (not cumulative) count.
    Histogram(f64, u64, Vec<(f64, u64)>),
}

#[derive(Debug, Clone)]
struct Family {
    name: String,
    help: String,
    kind: MetricType,
    samples: Vec<(Labels, Value)>,
}

/// One scrape's metrics, families in the order first added.
#[derive(Debug, Default, Clone)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    fn add(&mut self, name: &str, help: &str, kind: MetricType, mut labels: Labels, v: Value) {
        labels.sort();
        let name = format!("dxpu_{name}");
        match self.families.iter_mut().find(|f| f.name == name) {
            Some(f) => f.samples.push((labels, v)),
            None => {
                self.families.push(Family { name, help: help.to_string(), kind, samples: vec![(labels, v)] })
            }
        }
    }

    /// A counter, `dxpu_{name}_total` on the wire.
    pub fn counter(&mut self, name: &str, help: &str, labels: Labels, v: u64) {
        self.add(&format!("{name}_total"), help, MetricType::COUNTER, labels, Value::Counter(v as f64));
    }

    /// A counter of seconds (or another unit that comes in fractions), `dxpu_{name}_total`.
    pub fn counter_f64(&mut self, name: &str, help: &str, labels: Labels, v: f64) {
        self.add(&format!("{name}_total"), help, MetricType::COUNTER, labels, Value::Counter(v));
    }

    /// A gauge, `dxpu_{name}`.
    pub fn gauge(&mut self, name: &str, help: &str, labels: Labels, v: f64) {
        self.add(name, help, MetricType::GAUGE, labels, Value::Gauge(v));
    }

    /// A histogram from power-of-two buckets: `buckets[i]` counts values in
    /// `[2^i, 2^(i+1))` of `unit` (seconds per unit), the last open-ended; `sum` in seconds.
    pub fn log2_histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: Labels,
        buckets: &[u64],
        unit: f64,
        sum: f64,
    ) {
        let n = buckets.len();
        let mut out: Vec<(f64, u64)> = buckets
            .iter()
            .enumerate()
            .map(|(i, c)| (if i + 1 == n { f64::MAX } else { (1u64 << (i + 1)) as f64 * unit }, *c))
            .collect();
        if out.last().is_none_or(|(b, _)| *b != f64::MAX) {
            out.push((f64::MAX, 0));
        }
        let count = buckets.iter().sum();
        self.add(name, help, MetricType::HISTOGRAM, labels, Value::Histogram(sum, count, out));
    }

    /// The text exposition format 0.0.4, with the process's own series after dxpu's
    /// (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`,
    /// `process_start_time_seconds`, … as every Prometheus client library names them).
    pub fn render(self) -> String {
        use prometheus::core::Collector;
        let mut families: Vec<proto::MetricFamily> = self.families.iter().map(family).collect();
        families.extend(prometheus::process_collector::ProcessCollector::for_self().collect());
        prometheus::TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_else(|e| format!("# the metrics could not be encoded: {e}\n"))
    }

    /// The value of counter `name` (without `dxpu_` and `_total`) with `labels`, for tests.
    #[cfg(test)]
    pub fn counter_value(&self, name: &str, labels: &Labels) -> Option<u64> {
        let f = self.families.iter().find(|f| f.name == format!("dxpu_{name}_total"))?;
        f.samples.iter().find(|(l, _)| l == labels).and_then(|(_, v)| match v {
            Value::Counter(c) => Some(*c as u64),
            _ => None,
        })
    }
}

fn family(f: &Family) -> proto::MetricFamily {
    let mut out = proto::MetricFamily::default();
    out.set_name(f.name.clone());
    out.set_help(f.help.clone());
    out.set_field_type(f.kind);
    let metrics = f
        .samples
        .iter()
        .map(|(labels, v)| {
            let mut m = proto::Metric::default();
            m.set_label(
                labels
                    .iter()
                    .map(|(k, v)| {
                        let mut p = proto::LabelPair::default();
                        p.set_name(k.clone());
                        p.set_value(v.clone());
                        p
                    })
                    .collect(),
            );
            match v {
                Value::Counter(c) => {
                    let mut c2 = proto::Counter::default();
                    c2.set_value(*c);
                    m.set_counter(c2);
                }
                Value::Gauge(g) => {
                    let mut g2 = proto::Gauge::default();
                    g2.set_value(*g);
                    m.set_gauge(g2);
                }
                Value::Histogram(sum, count, buckets) => {
                    let mut h = proto::Histogram::default();
                    h.set_sample_sum(*sum);
                    h.set_sample_count(*count);
                    let mut cumulative = 0;
                    // The encoder writes the +Inf bucket itself, from the count.
                    h.set_bucket(
                        buckets
                            .iter()
                            .filter(|(le, _)| *le != f64::MAX)
                            .map(|(le, n)| {
                                cumulative += n;
                                let mut b = proto::Bucket::default();
                                b.set_upper_bound(*le);
                                b.set_cumulative_count(cumulative);
                                b
                            })
                            .collect(),
                    );
                    m.set_histogram(h);
                }
            }
            m
        })
        .collect();
    out.set_metric(metrics);
    out
}

/// How long a client may take to send its request's head; then its connection is closed. A
/// scraper sends its head at once; a second is ample on any network that can scrape.
const HEAD_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a connection may stay open in all.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// Connections open at once: far above what a fleet of scrapers opens (one each, a few
/// Prometheus replicas); when full, the oldest connection still without a request head is
/// closed to make room, so idle or trickling clients cannot fill the table.
pub const MAX_CONNECTIONS: usize = 512;
/// How long a scrape waits for the endpoint's loop to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The metrics server: hyper's HTTP/1 on a small tokio runtime of its own, each connection
/// a task, so that scrapes are served concurrently and no slow, idle or hostile client holds
/// up another: a request head must arrive within 1 s, a connection lives at most 30 s, at
/// most [`MAX_CONNECTIONS`] at once, and a new connection finding the table full closes the
/// oldest one that has not sent its head. Each scrape asks the endpoint's loop for the
/// exposition through a call.
pub struct MetricsServer {
    stop: Arc<tokio::sync::Notify>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr`; each scrape sends a `metrics` call to the endpoint through `calls`.
    pub fn bind(addr: SocketAddr, calls: mpsc::Sender<Call>) -> Result<MetricsServer, StartError> {
        let listener =
            std::net::TcpListener::bind(addr).map_err(StartError::of(format!("metrics.listen {addr}")))?;
        let addr = listener.local_addr().map_err(StartError::of(format!("metrics.listen {addr}")))?;
        listener.set_nonblocking(true).map_err(StartError::of(format!("metrics.listen {addr}")))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(StartError::of("metrics: its runtime"))?;
        let stop = Arc::new(tokio::sync::Notify::new());
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("dxpu-metrics".into())
            .spawn(move || rt.block_on(serve(listener, calls, stop2)))
            .map_err(StartError::of("metrics: starting its thread"))?;
        log::info!("metrics on http://{addr}/metrics");
        Ok(MetricsServer { stop, thread: Some(thread) })
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The connections open: when each came, whether its request head has arrived, and how to
/// close it.
#[derive(Default)]
struct Connections {
    open: std::collections::VecDeque<Open>,
    next_id: u64,
}

struct Open {
    id: u64,
    /// Set once its request head was parsed (it is being answered).
    asked: Arc<std::sync::atomic::AtomicBool>,
    abort: tokio::task::AbortHandle,
}

impl Connections {
    /// Closes the oldest connection that has not sent its request head; whether there was one.
    fn evict_idle(&mut self) -> bool {
        let idle = self.open.iter().position(|o| !o.asked.load(std::sync::atomic::Ordering::Relaxed));
        match idle.and_then(|i| self.open.remove(i)) {
            Some(o) => {
                o.abort.abort();
                true
            }
            None => false,
        }
    }
}

async fn serve(listener: std::net::TcpListener, calls: mpsc::Sender<Call>, stop: Arc<tokio::sync::Notify>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return log::error!("metrics: {e}"),
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    // Connections leave the table as they end; aborted ones were removed when aborted.
    let table = Arc::new(std::sync::Mutex::new(Connections::default()));
    loop {
        let stream = tokio::select! {
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    log::warn!("metrics: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.notified() => return,
        };
        // A slot: a free one, or one an idle connection gives up; else wait for one (every
        // connection in the table is being answered, and ends within its lifetime).
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let evicted = table.lock().unwrap_or_else(|p| p.into_inner()).evict_idle();
                if evicted {
                    tokio::task::yield_now().await;
                }
                tokio::select! {
                    p = slots.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                    _ = stop.notified() => return,
                }
            }
        };
        let calls = calls.clone();
        let asked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let id = {
            let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
            t.next_id += 1;
            t.next_id
        };
        let (asked2, table2) = (asked.clone(), table.clone());
        let task = tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| {
                asked2.store(true, std::sync::atomic::Ordering::Relaxed);
                answer(req, calls.clone())
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                // One request a connection (`Connection: close`), as a scraper needs.
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            // A connection kept open past its lifetime is closed, whatever it does.
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
            table2.lock().unwrap_or_else(|p| p.into_inner()).open.retain(|o| o.id != id);
        });
        // An aborted task drops its permit and its stream: the slot is free again. The task
        // cannot end before it is in the table: the runtime has one thread, and this loop does
        // not yield between the spawn and here.
        table.lock().unwrap_or_else(|p| p.into_inner()).open.push_back(Open {
            id,
            asked,
            abort: task.abort_handle(),
        });
    }
}

type Body = http_body_util::Full<hyper::body::Bytes>;

/// One request: `GET` or `HEAD /metrics` answered with the exposition; `/healthz` with 200
/// `ok` when the endpoint's loop answers (its `status`), 503 saying why when it does not
/// (stopping, or stuck past the answer timeout) — a liveness probe that sees the loop, not
/// only the HTTP server's thread; `/readyz` with 200 `ready` when its `status` says it is
/// (a host: its devices attached; a box: a healthy device, in a pool registered), else 503
/// with why not; other paths 404, other methods 405 (with `Allow`).
async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    calls: mpsc::Sender<Call>,
) -> Result<hyper::Response<Body>, std::convert::Infallible> {
    let text = |status: u16, body: &str| {
        let mut r = hyper::Response::new(Body::from(body.to_string()));
        *r.status_mut() =
            hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        r.headers_mut()
            .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
        r
    };
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        let mut r = text(405, "only GET and HEAD\n");
        r.headers_mut().insert(hyper::header::ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    let path = req.uri().path();
    if !["/metrics", "/healthz", "/readyz"].contains(&path) {
        return Ok(text(404, "metrics are at /metrics, liveness at /healthz, readiness at /readyz\n"));
    }
    let probe = path != "/metrics";
    let ready = path == "/readyz";
    let (call, reply) = Call::new(if probe { "status" } else { "metrics" }, serde_json::Value::Null);
    if calls.send(call).is_err() {
        return Ok(text(503, "the endpoint is stopping\n"));
    }
    // The endpoint's loop answers between its polls: wait for it off this runtime's thread.
    let got =
        tokio::task::spawn_blocking(move || reply.recv_timeout(ANSWER_TIMEOUT).ok()).await.ok().flatten();
    if probe {
        return Ok(match got {
            Some(Ok(s)) if ready && s["ready"] != true => {
                text(503, &format!("{}\n", s["not_ready"].as_str().unwrap_or("not ready")))
            }
            Some(Ok(_)) if ready => text(200, "ready\n"),
            Some(Ok(_)) => text(200, "ok\n"),
            Some(Err(e)) => text(503, &format!("{}\n", e.message)),
            None => text(503, &format!("the endpoint's loop did not answer within {ANSWER_TIMEOUT:?}\n")),
        });
    }
    Ok(match got {
        Some(Ok(serde_json::Value::String(t))) => {
            let mut r = hyper::Response::new(Body::from(t));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(prometheus::TEXT_FORMAT),
            );
            r
        }
        _ => text(503, "the endpoint did not answer\n"),
    })
}

/// `dxpu_build_info`: 1, with the version and the platform it was built for.
pub fn build_info(x: &mut Exposition) {
    x.gauge(
        "build_info",
        "dxpu's build (1): its version and target",
        labels(&[
            ("version", env!("CARGO_PKG_VERSION")),
            ("arch", std::env::consts::ARCH),
            ("os", std::env::consts::OS),
        ]),
        1.0,
    );
}

/// This machine's host name (`uname -n`).
pub fn hostname() -> String {
    rustix::system::uname().nodename().to_string_lossy().into_owned()
}

/// A PCI address as dcgm-exporter writes it (`00000000:41:00.0`) from sysfs's
/// (`0000:41:00.0`), upper-case hex, the domain 8 digits wide.
pub fn dcgm_bus_id(addr: &str) -> String {
    let (domain, rest) = match addr.matches(':').count() {
        2 => addr.split_once(':').unwrap_or(("0", addr)),
        _ => ("0", addr),
    };
    let domain = u32::from_str_radix(domain, 16).unwrap_or(0);
    format!("{domain:08X}:{}", rest.to_ascii_uppercase())
}

/// The link counters of one session, labelled `labels` (device, host, peer).
pub fn link_metrics(x: &mut Exposition, l: &Labels, s: &link::Stats) {
    let with = |extra: &[(&str, &str)]| {
        let mut v = l.clone();
        v.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        v
    };
    for (dir, frames, bytes, tlps) in [
        ("sent", s.frames_sent, s.bytes_sent, s.tlps_sent),
        ("received", s.frames_received, s.bytes_received, s.tlps_received),
    ] {
        x.counter("link_frames", "Link frames, by direction", with(&[("direction", dir)]), frames);
        x.counter(
            "link_bytes",
            "Link frame bytes (UDP payloads), by direction",
            with(&[("direction", dir)]),
            bytes,
        );
        x.counter("link_tlps", "TLPs carried by the link, by direction", with(&[("direction", dir)]), tlps);
    }
    let sent = with(&[("direction", "sent")]);
    x.counter("link_data_frames", "DATA frames sent for the first time", sent.clone(), s.data_frames_sent);
    x.counter("link_acks", "Standalone ACK frames sent", sent, s.acks_sent);
    x.counter("link_key_updates", "Key updates of this side's sending key", l.clone(), s.key_updates);
    x.counter("link_retransmits", "DATA frames sent again from the replay buffer", l.clone(), s.retransmits);
    x.counter(
        "link_replay_timeouts",
        "Replay timer expiries (ctl and stats: replay_timeouts)",
        l.clone(),
        s.replay_timeouts,
    );
    x.counter("link_naks", "NAKs, by direction", with(&[("direction", "sent")]), s.naks_sent);
    x.counter("link_naks", "NAKs, by direction", with(&[("direction", "received")]), s.naks_received);
    x.counter(
        "link_credit_stalls",
        "TLPs held back for lack of the peer's credits",
        l.clone(),
        s.credit_stalls,
    );
    for (why, n) in [
        ("malformed", s.dropped_malformed),
        ("bad_mac", s.dropped_bad_mac),
        ("stale_epoch", s.dropped_stale_epoch),
        ("replayed", s.dropped_replayed),
        ("out_of_window", s.dropped_out_of_window),
        ("duplicate", s.duplicate_data),
    ] {
        x.counter("link_frames_dropped", "Received frames dropped, by reason", with(&[("reason", why)]), n);
    }
    x.log2_histogram(
        "link_rtt_seconds",
        "Round trips of DATA frames (first send to its ACK)",
        l.clone(),
        &s.rtt_us_log2,
        1e-6,
        // The buckets' midpoints stand in for the samples' sum (the link keeps buckets only).
        s.rtt_us_log2.iter().enumerate().map(|(i, c)| *c as f64 * 1.5 * (1u64 << i) as f64 * 1e-6).sum(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pci_address_is_written_as_dcgm_exporter_writes_it() {
        assert_eq!(dcgm_bus_id("0000:3b:00.0"), "00000000:3B:00.0");
        assert_eq!(dcgm_bus_id("01:00.0"), "00000000:01:00.0");
    }

    #[test]
    fn exposition_has_help_type_and_labelled_samples() {
        let mut x = Exposition::default();
        x.counter("resets", "Resets", labels(&[("device", "gpu0")]), 3);
        x.counter("resets", "Resets", labels(&[("device", "gpu\"1")]), 4);
        x.gauge("device_info", "Info", labels(&[("device", "gpu0"), ("owner", "")]), 1.0);
        x.log2_histogram("mmio_read_seconds", "MMIO", labels(&[("device", "gpu0")]), &[0, 2, 1], 1e-9, 1e-8);
        assert_eq!(x.counter_value("resets", &labels(&[("device", "gpu0")])), Some(3));
        let t = x.render();
        assert!(t.contains("# TYPE dxpu_resets_total counter"), "{t}");
        assert!(t.contains("dxpu_resets_total{device=\"gpu0\"} 3"), "{t}");
        assert!(t.contains("dxpu_resets_total{device=\"gpu\\\"1\"} 4"), "{t}");
        assert!(t.contains("dxpu_mmio_read_seconds_count{device=\"gpu0\"} 3"), "{t}");
        assert!(t.contains("dxpu_mmio_read_seconds_bucket{device=\"gpu0\",le=\"+Inf\"} 3"), "{t}");
        assert!(t.contains("# HELP dxpu_resets_total Resets"), "{t}");
    }
}
