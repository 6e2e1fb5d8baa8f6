//! A capture's lines, as `dxpu tlp decode --pcap FILE` prints them: the link frames of a
//! capture (`--capture`, or `tcpdump -w` of the link's port) and the TLPs they carry, in
//! `tlp decode`'s JSON Lines or trace format, each with its packet number, time, direction
//! and the frame's sequence number.
//!
//! Which side is the box, a DATA frame sent again (`"replay": true`) and the sessions whose
//! DATA bodies are encrypted are [`super::decode`]'s to find; this writes them. The file is
//! read as it is decoded, one packet at a time: memory stays the same on a 1 GiB capture.

use std::io::{self, Write};
use std::path::Path;

use link::wire::{Frame, FrameType, TlpRecords};
use serde_json::{Value, json};
use tlp::{ParseConfig, TlpRepr};

use tlp::json::TlpJson;

use super::decode::{Decoded, Decoder, frame_name};
use super::{ReadError, Skipped, each_datagram};

/// How the lines are written: JSON Lines, or trace lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JSON Lines, an object per TLP (and per frame).
    Json,
    /// Human trace lines.
    Text,
}

/// What a decode counted.
#[derive(Debug, Default, Clone, Copy)]
pub struct DecodeCount {
    /// dxpu frames.
    pub frames: u64,
    /// TLPs decoded.
    pub tlps: u64,
    /// UDP datagrams that were not dxpu frames.
    pub not_frames: u64,
    /// TLP records that did not parse (each written as an error line).
    pub bad_tlps: u64,
    /// What the file held that was not read as a datagram.
    pub skipped: Skipped,
}

/// Decodes `path`, writing one line per TLP (and per frame with `frames`) to `out`; stops at
/// the first write that fails.
pub fn decode(
    path: &Path,
    format: Format,
    cfg: &ParseConfig,
    box_port: u16,
    frames: bool,
    out: &mut dyn Write,
) -> Result<DecodeCount, ReadError<io::Error>> {
    let mut decoder = Decoder::new(box_port);
    let mut count = DecodeCount::default();
    let skipped = each_datagram::<io::Error>(path, &mut |d| {
        let d = &d;
        let Some(Decoded { frame: f, direction: dir, replay, encrypted: enc }) = decoder.frame(d) else {
            count.not_frames += 1;
            return Ok(());
        };
        count.frames += 1;
        let h = f.header();
        let unix_us = (d.time * 1e6).round() as i64;
        // The text's time, made only for text (a 1 GiB capture's JSON needs none).
        let when = if format == Format::Text { utc_us(unix_us) } else { String::new() };
        let capture = json!({
            "packet": d.number,
            "time_unix_us": unix_us,
            "direction": dir,
            "src": d.src.to_string(),
            "dst": d.dst.to_string(),
            "frame": frame_name(h.ty),
            "session": format!("{:#010x}", h.session),
            "pn": h.pn,
            "seq": h.seq,
            "ack": h.ack,
            "nak": h.nak,
            "replay": replay,
        });
        if frames {
            writeln!(out, "{}", frame_line(format, &capture, &f, (d.number, &when), dir, enc))?;
        }
        if h.ty != FrameType::Data {
            return Ok(());
        }
        if enc {
            if !frames {
                writeln!(out, "{}", encrypted_line(format, &capture, (d.number, &when), dir, h.seq))?;
            }
            return Ok(());
        }
        for (i, rec) in TlpRecords::new(f.body()).enumerate() {
            let line = match rec
                .map_err(|e| e.to_string())
                .and_then(|b| TlpRepr::parse_bytes(b, cfg).map_err(|e| e.to_string()))
            {
                Ok(t) => {
                    count.tlps += 1;
                    match format {
                        Format::Json => {
                            let mut v =
                                serde_json::to_value(TlpJson::from_repr(&t)).map_err(io::Error::other)?;
                            let mut c = capture.clone();
                            c["record"] = json!(i);
                            v["capture"] = c;
                            v["line"] = json!("tlp");
                            v.to_string()
                        }
                        Format::Text => format!(
                            "{:>6} {when} {dir} seq {}{}: {t}",
                            d.number,
                            h.seq,
                            if replay { " (replay)" } else { "" }
                        ),
                    }
                }
                Err(e) => {
                    count.bad_tlps += 1;
                    match format {
                        Format::Json => {
                            let mut c = capture.clone();
                            c["record"] = json!(i);
                            json!({"line": "tlp", "error": e, "capture": c}).to_string()
                        }
                        Format::Text => format!("{:>6} {when} {dir} seq {}: error: {e}", d.number, h.seq),
                    }
                }
            };
            writeln!(out, "{line}")?;
        }
        Ok(())
    })?;
    Ok(DecodeCount { skipped, ..count })
}

/// A frame's FC block as a JSON array (posted, non-posted, completion; header and data
/// each), if it has one.
/// One frame's line with `--frames`: its header's fields (`capture`), its credit block, its
/// body's length and, in an ACK or KEEPALIVE, the frames the receiver holds beyond its gap.
fn frame_line(
    format: Format,
    capture: &Value,
    f: &Frame<'_>,
    (number, when): (u64, &str),
    dir: &str,
    enc: bool,
) -> String {
    let h = f.header();
    let fc = fc_json(f);
    let sack: Vec<(u32, u32)> = match h.ty {
        FrameType::Ack | FrameType::Keepalive => {
            link::wire::SackRanges::new_checked(f.body()).map(|r| r.iter().collect()).unwrap_or_default()
        }
        _ => Vec::new(),
    };
    match format {
        Format::Json => {
            let mut v = capture.clone();
            v["line"] = json!("frame");
            v["fc"] = fc.unwrap_or(Value::Null);
            v["body_len"] = json!(f.body().len());
            if !sack.is_empty() {
                v["sack"] =
                    json!(sack.iter().map(|(a, b)| json!({"start": a, "end": b})).collect::<Vec<_>>());
            }
            if enc {
                v["encrypted"] = json!(true);
            }
            v.to_string()
        }
        Format::Text => {
            let ranges: Vec<String> = sack.iter().map(|(a, b)| format!("{a}..{b}")).collect();
            format!(
                "{number:>6} {when} {dir} {} seq {} ack {}{}{}{}",
                frame_name(h.ty),
                h.seq,
                h.ack,
                if h.nak { " NAK" } else { "" },
                if ranges.is_empty() { String::new() } else { format!(" SACK {}", ranges.join(",")) },
                fc.as_ref().map(|c| format!(" fc {c}")).unwrap_or_default()
            )
        }
    }
}

fn fc_json(f: &Frame<'_>) -> Option<Value> {
    f.fc().map(|c| {
        json!([c.posted.0, c.posted.1, c.non_posted.0, c.non_posted.1, c.completion.0, c.completion.1])
    })
}

/// The line of an encrypted DATA frame, whose TLPs cannot be read.
fn encrypted_line(
    format: Format,
    capture: &Value,
    (number, when): (u64, &str),
    dir: &str,
    seq: u32,
) -> String {
    match format {
        Format::Json => {
            let mut v = capture.clone();
            v["line"] = json!("frame");
            v["encrypted"] = json!(true);
            v.to_string()
        }
        Format::Text => format!("{number:>6} {when} {dir} DATA seq {seq}: encrypted"),
    }
}

impl DecodeCount {
    /// What the file held that is not dxpu's, and a file cut short, in words (none where
    /// everything was read).
    pub fn notes(&self, path: &Path) -> Vec<String> {
        let (skipped, mut notes) = (&self.skipped, Vec::new());
        if skipped.cut_short {
            notes.push(format!(
                "{}: the file ends inside a packet (its writer stopped?): read up to there",
                path.display()
            ));
        }
        if skipped.not_udp + skipped.truncated + self.not_frames > 0 {
            notes.push(format!(
                "{}: {} packets not UDP, {} cut short by the capture's snap length, {} UDP datagrams not dxpu frames",
                path.display(),
                skipped.not_udp,
                skipped.truncated,
                self.not_frames
            ));
        }
        notes
    }
}

/// A time since the Unix epoch to the microsecond, as text prints a packet's:
/// RFC 3339, UTC (`2026-12-06T02:00:00.123456Z`).
pub fn utc_us(unix_us: i64) -> String {
    let (s, us) = (unix_us.div_euclid(1_000_000), unix_us.rem_euclid(1_000_000));
    match jiff::Timestamp::from_second(s) {
        Ok(t) => format!("{}.{us:06}Z", t.strftime("%Y-%m-%dT%H:%M:%S")),
        Err(_) => format!("{unix_us} µs after the epoch"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packets_time_prints_as_rfc_3339_to_the_microsecond() {
        assert_eq!(utc_us(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(utc_us(1_796_522_400_123_456), "2026-12-06T02:00:00.123456Z");
        // Before the epoch: the microseconds count up from the second below.
        assert_eq!(utc_us(-1), "1969-12-31T23:59:59.999999Z");
        // Beyond what a timestamp holds: said, not a panic.
        assert!(utc_us(i64::MAX).contains("after the epoch"));
    }
}
