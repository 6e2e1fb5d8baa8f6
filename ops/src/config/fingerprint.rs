//! What runs, as a running daemon can say it without showing a secret: per section a digest
//! of its settings as parsed, each host's key ID (the handshake shows it anyway), each
//! device's digest and allow list, each attachment's digest. `dxpu gpu|host --check
//! --against-running` compares a file's with the daemon's ([`crate::against`]). The digest
//! is FNV-1a over the settings' debug form: stable between two processes of one build; a
//! daemon of another build may show every section changed, which only errs towards "needs a
//! restart".

use serde_json::{Map, Value, json};

use bridge_gpu::GpuOptions;

use super::{GpuFile, HostFile};

fn digest(v: &impl std::fmt::Debug) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{v:?}").bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

impl GpuFile {
    /// The box's fingerprint: the sections only a restart changes, the hosts, the devices.
    pub fn fingerprint(&self, opts: &GpuOptions) -> Value {
        let restart = json!({
            "listen": digest(&opts.listen),
            "[link]": digest(&self.link),
            "[impairment]": digest(&self.impairment),
            "[pool]": digest(&self.pool),
            "[control]": digest(&self.control),
            "[metrics]": digest(&self.metrics),
        });
        let hosts: Map<String, Value> = opts
            .hosts
            .iter()
            .map(|h| {
                (h.name.clone(), Value::String(h.key.key_id().iter().map(|b| format!("{b:02x}")).collect()))
            })
            .collect();
        let devices: Map<String, Value> = opts
            .exports
            .iter()
            .map(|e| (e.name.clone(), json!({"spec": digest(&e.device), "allow": e.allow})))
            .collect();
        json!({"role": "gpu", "restart": restart, "hosts": hosts, "devices": devices})
    }
}

impl HostFile {
    /// The host's fingerprint: the sections only a restart changes, each `[[attach]]` by its
    /// device and server as written.
    pub fn fingerprint(&self) -> Value {
        let restart = json!({
            "[link]": digest(&self.link),
            "[impairment]": digest(&self.impairment),
            "[pool]": digest(&self.pool),
            "[control]": digest(&self.control),
            "[metrics]": digest(&self.metrics),
        });
        let attaches: Map<String, Value> = self
            .attach
            .iter()
            .map(|a| (format!("{}@{}", a.device, a.server), Value::String(digest(a))))
            .collect();
        json!({"role": "host", "restart": restart, "attaches": attaches})
    }
}
