//! `dxpu ctl`: calls a running endpoint's control socket and prints the answer as a table,
//! or as JSON with `--json` (the result alone; an error as its error object).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::{Map, Value};

/// Options of `dxpu ctl`.
#[derive(Args, Debug)]
pub(crate) struct CtlArgs {
    /// The endpoint's control socket (its `[control] socket`). Default: /run/dxpu/gpu/control.sock if
    /// it exists, else /run/dxpu/host/control.sock.
    #[arg(long, short)]
    socket: Option<PathBuf>,
    /// Print the result as JSON (an error as `{"error": {"code", "message"}}`, exit status 1).
    #[arg(long)]
    json: bool,
    /// Seconds to wait for the answer (an attach may take the link's handshake timeout).
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// The method: status, devices, sessions, stats, reload, rpc_get_methods; on a box export
    /// NAME and unexport NAME; on a host attach NAME and detach NAME.
    #[arg(value_parser = MethodParser)]
    method: String,
    /// The method's arguments: a device name, or KEY=VALUE parameters.
    args: Vec<String>,
}

/// The control methods of the box and the host (`rpc_get_methods` lists an endpoint's
/// own), in the order they are offered.
fn methods() -> Vec<&'static str> {
    let mut all: Vec<&'static str> = Vec::new();
    for m in ops::gpu::METHODS.iter().chain(ops::host::METHODS.iter()) {
        if !all.contains(m) {
            all.push(m);
        }
    }
    all
}

/// A method name: any (an endpoint newer than this binary may serve more), the known ones
/// offered to the shell's completion.
#[derive(Clone, Copy, Debug)]
struct MethodParser;

impl clap::builder::TypedValueParser for MethodParser {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        clap::builder::StringValueParser::new().parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(methods().into_iter().map(clap::builder::PossibleValue::new)))
    }
}

fn params(method: &str, args: &[String]) -> Result<Value, String> {
    let mut m = Map::new();
    for (i, a) in args.iter().enumerate() {
        match a.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                m.insert(
                    k.to_string(),
                    serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string())),
                );
            }
            _ if i == 0 => {
                m.insert("name".into(), Value::String(a.clone()));
            }
            _ => {
                return Err(format!(
                    "{method}: argument '{a}': give KEY=VALUE (only the first may be a bare name)"
                ));
            }
        }
    }
    Ok(if m.is_empty() { Value::Null } else { Value::Object(m) })
}

pub(crate) fn run(args: CtlArgs) -> ExitCode {
    let socket = args.socket.clone().unwrap_or_else(|| {
        let gpu = PathBuf::from("/run/dxpu/gpu/control.sock");
        if gpu.exists() { gpu } else { PathBuf::from("/run/dxpu/host/control.sock") }
    });
    let p = match params(&args.method, &args.args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("dxpu ctl: {e}");
            return ExitCode::from(2);
        }
    };
    let resp = match ops::control::call(&socket, &args.method, p, Duration::from_secs(args.timeout)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dxpu ctl: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(err) = resp.get("error") {
        let code = err.get("code").and_then(Value::as_i64).unwrap_or(0);
        let msg = err.get("message").and_then(Value::as_str).unwrap_or("?");
        if args.json {
            // For a script: the error object, on standard output, and the exit status.
            outln!("{}", serde_json::json!({ "error": err }));
        } else {
            eprintln!("dxpu ctl: {}: {msg} (JSON-RPC error {code})", args.method);
        }
        return ExitCode::FAILURE;
    }
    let result = resp.get("result").unwrap_or(&Value::Null);
    if args.json {
        outln!("{}", crate::out::json(result.clone()));
    } else {
        out!("{}", ops::control::answer::text(&args.method, result));
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_become_params() {
        assert_eq!(params("detach", &[]).unwrap(), Value::Null);
        assert_eq!(params("detach", &["gpu0".into()]).unwrap(), json!({"name": "gpu0"}));
        assert_eq!(params("x", &["gpu0".into(), "n=3".into()]).unwrap(), json!({"name": "gpu0", "n": 3}));
        assert!(params("x", &["a".into(), "b".into()]).is_err());
    }
}
