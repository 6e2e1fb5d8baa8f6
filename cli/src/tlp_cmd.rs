//! `dxpu tlp decode` and `dxpu tlp encode`.

use std::io::{self, BufRead, Write};
use std::process::ExitCode;

use clap::{Subcommand, ValueEnum};
use tlp::{ParseConfig, TlpRepr};

use crate::tlp_json::{TlpJson, from_hex, to_hex};

#[derive(Subcommand, Debug)]
pub(crate) enum TlpCommand {
    /// Decode TLPs given as hex (arguments, or one per line on stdin) into JSON Lines or
    /// trace lines. Exits non-zero if any input did not parse.
    Decode {
        /// Output format: one JSON object per line, or one trace line per TLP.
        #[arg(long, value_enum, default_value_t = Format::Json)]
        format: Format,
        /// Max_Payload_Size in bytes: larger payloads are reported as malformed.
        #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(128..=4096))]
        max_payload: u32,
        /// Accept TLPs whose ECRC digest does not match.
        #[arg(long)]
        no_ecrc_check: bool,
        /// TLPs as hex; `_`, `:` and spaces between bytes are ignored. Read from stdin if none.
        hex: Vec<String>,
    },
    /// Encode TLPs given as JSON objects (arguments, or one per line on stdin) into hex, one
    /// per line. Reads what `decode` prints. Exits non-zero if any input was rejected.
    Encode {
        /// TLPs as JSON objects. Read from stdin if none.
        json: Vec<String>,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// JSON Lines.
    Json,
    /// Human trace lines.
    Text,
}

/// The inputs: arguments if any, else stdin lines. Blank lines and `#` comments are skipped.
fn inputs(args: Vec<String>) -> Box<dyn Iterator<Item = io::Result<String>>> {
    if args.is_empty() { Box::new(io::stdin().lock().lines()) } else { Box::new(args.into_iter().map(Ok)) }
}

fn error_line(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string()
}

pub(crate) fn run(cmd: TlpCommand) -> ExitCode {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let mut failed = false;
    let mut emit = |line: String| writeln!(out, "{line}");
    let result = match cmd {
        TlpCommand::Decode { format, max_payload, no_ecrc_check, hex } => {
            let cfg = ParseConfig { max_payload: max_payload as usize, check_ecrc: !no_ecrc_check };
            inputs(hex).try_for_each(|line| {
                let line = line?;
                let t = line.trim();
                if t.is_empty() || t.starts_with('#') {
                    return Ok(());
                }
                let decoded = from_hex(t, "input").and_then(|bytes| {
                    let repr = TlpRepr::parse_bytes(&bytes, &cfg).map_err(|e| e.to_string())?;
                    Ok(match format {
                        Format::Json => {
                            serde_json::to_string(&TlpJson::from_repr(&repr)).map_err(|e| e.to_string())?
                        }
                        Format::Text => repr.to_string(),
                    })
                });
                match decoded {
                    Ok(s) => emit(s),
                    Err(e) => {
                        failed = true;
                        match format {
                            Format::Json => emit(error_line(&e)),
                            Format::Text => emit(format!("error: {e}")),
                        }
                    }
                }
            })
        }
        TlpCommand::Encode { json } => inputs(json).try_for_each(|line| {
            let line = line?;
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                return Ok(());
            }
            let encoded = serde_json::from_str::<TlpJson>(t)
                .map_err(|e| format!("invalid JSON: {e}"))
                .and_then(|j| j.encode());
            match encoded {
                Ok(bytes) => emit(to_hex(&bytes)),
                Err(e) => {
                    failed = true;
                    emit(error_line(&e))
                }
            }
        }),
    };
    match result {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dxpu tlp: I/O error: {e}");
            ExitCode::from(2)
        }
        Ok(()) if failed => ExitCode::FAILURE,
        Ok(()) => ExitCode::SUCCESS,
    }
}
