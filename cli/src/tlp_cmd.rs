//! `dxpu tlp decode` and `dxpu tlp encode`.

use std::io::{self, BufRead, Write};
use std::process::ExitCode;

use clap::Subcommand;
use ops::capture::{ReadError, lines};
use tlp::{ParseConfig, TlpRepr};

use tlp::json::{TlpJson, from_hex, to_hex};

use crate::args::Format;

#[derive(Subcommand, Debug)]
pub(crate) enum TlpCommand {
    /// Decode TLPs given as hex (arguments, or one per line on stdin), or those of a packet
    /// capture (--pcap), into JSON Lines or trace lines. Exits non-zero if any input did not
    /// parse.
    Decode {
        /// A capture of the link (pcapng from --capture, or pcap/pcapng from tcpdump -w):
        /// each TLP with its packet, time, direction and frame sequence number.
        #[arg(long, value_name = "FILE", conflicts_with = "hex")]
        pcap: Option<std::path::PathBuf>,
        /// With --pcap: also a line for every frame (type, sequence, ACK, credits), TLPs or not.
        #[arg(long, requires = "pcap")]
        frames: bool,
        /// With --pcap: the box's UDP port, for telling directions apart in a capture that
        /// holds no handshake.
        #[arg(long, default_value_t = ops::config::DEFAULT_PORT, requires = "pcap")]
        box_port: u16,
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

/// Longest input line taken (a 4 KiB payload is about 8 KiB of hex, 20 KiB of JSON).
pub(crate) const MAX_LINE: usize = 64 << 10;

/// One input: its text, or why this line cannot be used (the lines after it still are).
type Input = Result<String, String>;

/// Lines of `r`, each at most `max` bytes: a longer line is skipped as it arrives (memory
/// stays bounded whatever the input, `/dev/zero` included) and reported, as is a line that
/// is not UTF-8; reading goes on with the next line.
pub(crate) struct BoundedLines<R> {
    r: R,
    max: usize,
    number: usize,
    done: bool,
}

impl<R: BufRead> BoundedLines<R> {
    pub(crate) fn new(r: R, max: usize) -> Self {
        BoundedLines { r, max, number: 0, done: false }
    }
}

impl<R: BufRead> Iterator for BoundedLines<R> {
    type Item = io::Result<Input>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut line = Vec::new();
        let mut skipped = 0usize;
        loop {
            let buf = match self.r.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Some(Err(e)),
            };
            if buf.is_empty() {
                self.done = true;
                if line.is_empty() && skipped == 0 {
                    return None;
                }
                break;
            }
            let (piece, end) = match buf.iter().position(|b| *b == b'\n') {
                Some(i) => (&buf[..i], Some(i + 1)),
                None => (buf, None),
            };
            if skipped > 0 || line.len() + piece.len() > self.max {
                skipped += line.len() + piece.len();
                line.clear();
            } else {
                line.extend_from_slice(piece);
            }
            let used = end.unwrap_or(buf.len());
            self.r.consume(used);
            if end.is_some() {
                break;
            }
        }
        self.number += 1;
        let n = self.number;
        if skipped > 0 {
            return Some(Ok(Err(format!(
                "line {n}: longer than {} bytes ({skipped} or more): skipped",
                self.max
            ))));
        }
        Some(Ok(String::from_utf8(line).map_err(|e| format!("line {n}: not UTF-8 ({e})"))))
    }
}

/// The inputs: arguments if any, else stdin lines. Blank lines and `#` comments are skipped.
fn inputs(args: Vec<String>) -> Box<dyn Iterator<Item = io::Result<Input>>> {
    if args.is_empty() {
        Box::new(BoundedLines::new(io::stdin().lock(), MAX_LINE))
    } else {
        Box::new(args.into_iter().map(|a| Ok(Ok(a))))
    }
}

fn error_line(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string()
}

pub(crate) fn run(cmd: TlpCommand) -> ExitCode {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let mut failed = false;
    if let TlpCommand::Decode {
        pcap: Some(path), frames, box_port, format, max_payload, no_ecrc_check, ..
    } = &cmd
    {
        let cfg = ParseConfig { max_payload: *max_payload as usize, check_ecrc: !no_ecrc_check };
        let format = match format {
            Format::Json => lines::Format::Json,
            Format::Text => lines::Format::Text,
        };
        return match lines::decode(path, format, &cfg, *box_port, *frames, &mut out) {
            Ok(c) => {
                c.notes(path).iter().for_each(|n| eprintln!("dxpu tlp decode: {n}"));
                if c.bad_tlps > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
            }
            Err(ReadError::Stopped(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(ReadError::Stopped(e)) => {
                eprintln!("dxpu tlp decode: writing: {e}");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("dxpu tlp decode: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut emit = |line: String| writeln!(out, "{line}");
    let result = match cmd {
        TlpCommand::Decode { format, max_payload, no_ecrc_check, hex, .. } => {
            let cfg = ParseConfig { max_payload: max_payload as usize, check_ecrc: !no_ecrc_check };
            inputs(hex).try_for_each(|line| {
                let line = match line? {
                    Ok(l) => l,
                    Err(e) => {
                        failed = true;
                        return match format {
                            Format::Json => emit(error_line(&e)),
                            Format::Text => emit(format!("error: {e}")),
                        };
                    }
                };
                let t = line.trim();
                if t.is_empty() || t.starts_with('#') {
                    return Ok(());
                }
                let decoded = from_hex(t, "input").map_err(|e| e.to_string()).and_then(|bytes| {
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
            let line = match line? {
                Ok(l) => l,
                Err(e) => {
                    failed = true;
                    return emit(error_line(&e));
                }
            };
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                return Ok(());
            }
            let encoded = serde_json::from_str::<TlpJson>(t)
                .map_err(|e| format!("invalid JSON: {e}"))
                .and_then(|j| j.encode().map_err(|e| e.to_string()));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<Input> {
        BoundedLines::new(io::BufReader::with_capacity(7, input), max).map(|l| l.unwrap()).collect()
    }

    #[test]
    fn long_and_non_utf8_lines_are_reported_and_the_rest_still_read() {
        let mut input = b"first\n".to_vec();
        input.extend_from_slice(&[b'x'; 40]);
        input.extend_from_slice(b"\nsec\xffond\nthird\nend, no newline");
        let got = lines(&input, 16);
        assert_eq!(got.len(), 5, "{got:?}");
        assert_eq!(got[0], Ok("first".into()));
        assert!(got[1].as_ref().unwrap_err().contains("line 2: longer than 16 bytes"), "{:?}", got[1]);
        assert!(got[2].as_ref().unwrap_err().contains("line 3: not UTF-8"), "{:?}", got[2]);
        assert_eq!(got[3], Ok("third".into()));
        assert_eq!(got[4], Ok("end, no newline".into()));
        assert_eq!(lines(b"", 16), Vec::<Input>::new());
        assert_eq!(lines(b"exactly sixteen!\n", 16), vec![Ok("exactly sixteen!".to_string())]);
    }

    #[test]
    fn an_endless_line_is_read_in_bounded_memory() {
        // 64 MiB of zeros without a newline: one error, and no line buffer beyond the limit.
        let endless = io::Read::take(io::repeat(0), 64 << 20);
        let mut it = BoundedLines::new(io::BufReader::new(endless), 1024);
        let first = it.next().unwrap().unwrap();
        assert!(first.unwrap_err().contains("longer than 1024 bytes"));
        assert!(it.next().is_none());
    }
}
