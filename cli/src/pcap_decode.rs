//! `dxpu tlp decode --pcap FILE`: the link frames of a capture (`--capture`, or `tcpdump -w`
//! of the link's port) and the TLPs they carry, in `tlp decode`'s JSON Lines or trace
//! format, each with its packet number, time, direction and the frame's sequence number.
//!
//! Which side is the box is learned from the handshake (INIT goes to it; COOKIE, CHALLENGE
//! and REFUSE come from it); before any handshake is seen, from `--box-port`. A DATA frame
//! sent again (same direction, session and sequence number) is marked `"replay": true`; a
//! session that negotiated encryption has its DATA bodies reported as encrypted. The file is
//! read as it is decoded, one packet at a time: memory stays the same on a 1 GiB capture.

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::Path;

use link::wire::{Frame, FrameType, TlpRecords};
use serde_json::{Value, json};
use tlp::{ParseConfig, TlpRepr};

use crate::tlp_json::{Format, TlpJson};
use ops::capture::{Datagram, each_datagram};

/// The frame type's name, as the dissector shows it.
pub(crate) fn frame_name(t: FrameType) -> String {
    match t {
        FrameType::Init => "INIT".into(),
        FrameType::Challenge => "CHALLENGE".into(),
        FrameType::Response => "RESPONSE".into(),
        FrameType::Established => "ESTABLISHED".into(),
        FrameType::Data => "DATA".into(),
        FrameType::Ack => "ACK".into(),
        FrameType::Keepalive => "KEEPALIVE".into(),
        FrameType::Close => "CLOSE".into(),
        FrameType::Cookie => "COOKIE".into(),
        FrameType::Refuse => "REFUSE".into(),
        FrameType::Unknown(b) => format!("UNKNOWN({b})"),
    }
}

/// What a decode counted.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DecodeCount {
    pub(crate) frames: u64,
    pub(crate) tlps: u64,
    pub(crate) not_frames: u64,
    pub(crate) bad_tlps: u64,
}

struct Roles {
    boxes: HashSet<SocketAddr>,
    box_port: u16,
}

impl Roles {
    fn learn(&mut self, d: &Datagram, ty: FrameType) {
        match ty {
            FrameType::Init | FrameType::Response => {
                self.boxes.insert(d.dst);
            }
            FrameType::Cookie | FrameType::Challenge | FrameType::Refuse => {
                self.boxes.insert(d.src);
            }
            _ => {}
        }
    }

    fn direction(&self, d: &Datagram) -> &'static str {
        if self.boxes.contains(&d.dst) || (!self.boxes.contains(&d.src) && d.dst.port() == self.box_port) {
            "host->box"
        } else if self.boxes.contains(&d.src) || d.src.port() == self.box_port {
            "box->host"
        } else {
            "unknown"
        }
    }
}

/// Sequence numbers a link may still send again, behind the highest seen: far more than a
/// window (at most 4096 frames).
const REPLAY_SPAN: u32 = 1 << 16;

/// The DATA sequence numbers seen in one direction of one session, back to
/// [`REPLAY_SPAN`] behind the highest: a bounded set however long the capture.
#[derive(Default)]
struct SeenSeqs {
    highest: Option<u32>,
    seqs: HashSet<u32>,
}

impl SeenSeqs {
    /// Whether `seq` was seen before (a retransmission); remembers it.
    fn replay(&mut self, seq: u32) -> bool {
        let newer = |a: u32, b: u32| a.wrapping_sub(b) as i32 > 0;
        if self.highest.is_none_or(|h| newer(seq, h)) {
            self.highest = Some(seq);
        }
        let again = !self.seqs.insert(seq);
        if self.seqs.len() > 2 * REPLAY_SPAN as usize
            && let Some(h) = self.highest
        {
            self.seqs.retain(|&s| h.wrapping_sub(s) < REPLAY_SPAN);
        }
        again
    }
}

/// Decodes `path`, writing one line per TLP (and per frame with `frames`) to `out`.
pub(crate) fn decode(
    path: &Path,
    format: Format,
    cfg: &ParseConfig,
    box_port: u16,
    frames: bool,
    out: &mut dyn Write,
) -> Result<DecodeCount, String> {
    let mut roles = Roles { boxes: HashSet::new(), box_port };
    let mut encrypted: HashSet<u32> = HashSet::new();
    let mut seen: HashMap<(&'static str, u32), SeenSeqs> = HashMap::new();
    let mut count = DecodeCount::default();
    let io = |e: io::Error| format!("writing: {e}");
    let skipped = each_datagram::<String>(path, &mut |d| {
        let d = &d;
        let Ok(f) = Frame::new_checked(&d.payload) else {
            count.not_frames += 1;
            return Ok(());
        };
        count.frames += 1;
        let h = f.header();
        roles.learn(d, h.ty);
        learn_encryption(&f, &mut encrypted);
        let dir = roles.direction(d);
        let replay = h.ty == FrameType::Data && seen.entry((dir, h.session)).or_default().replay(h.seq);
        let unix_us = (d.time * 1e6).round() as i64;
        // The text's time, made only for text (a 1 GiB capture's JSON needs none).
        let when = if format == Format::Text { crate::out::utc_us(unix_us) } else { String::new() };
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
        let enc = h.ty == FrameType::Data && encrypted.contains(&h.session);
        if frames {
            writeln!(out, "{}", frame_line(format, &capture, &f, (d.number, &when), dir, enc)).map_err(io)?;
        }
        if h.ty != FrameType::Data {
            return Ok(());
        }
        if enc {
            if !frames {
                writeln!(out, "{}", encrypted_line(format, &capture, (d.number, &when), dir, h.seq))
                    .map_err(io)?;
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
                                serde_json::to_value(TlpJson::from_repr(&t)).map_err(|e| e.to_string())?;
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
            writeln!(out, "{line}").map_err(io)?;
        }
        Ok(())
    })?;
    report_skipped(path, &skipped, &count);
    Ok(count)
}

/// A CHALLENGE that negotiated encryption makes both its sessions' DATA frames opaque:
/// the options at body offset 24 (bit 1 ENCRYPT), the client's session ID at 0.
fn learn_encryption(f: &Frame<'_>, encrypted: &mut HashSet<u32>) {
    let h = f.header();
    if h.ty != FrameType::Challenge {
        return;
    }
    let b = f.body();
    if b.get(24).is_some_and(|o| o & 2 != 0) {
        encrypted.insert(h.session);
        if let Some(id) = b.get(..4) {
            encrypted.insert(u32::from_be_bytes([id[0], id[1], id[2], id[3]]));
        }
    }
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

/// What the file held that is not dxpu's, and a file cut short, said on standard error.
fn report_skipped(path: &Path, skipped: &ops::capture::Skipped, count: &DecodeCount) {
    if skipped.cut_short {
        eprintln!(
            "dxpu tlp decode: {}: the file ends inside a packet (its writer stopped?): read up to there",
            path.display()
        );
    }
    if skipped.not_udp + skipped.truncated + count.not_frames > 0 {
        eprintln!(
            "dxpu tlp decode: {}: {} packets not UDP, {} cut short by the capture's snap length, {} UDP datagrams not dxpu frames",
            path.display(),
            skipped.not_udp,
            skipped.truncated,
            count.not_frames
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequence_number_seen_again_is_a_replay_and_the_set_stays_bounded() {
        let mut s = SeenSeqs::default();
        assert!(!s.replay(7));
        assert!(s.replay(7));
        assert!(!s.replay(8));
        // Across the wrap of the 32-bit sequence space.
        let mut w = SeenSeqs::default();
        for seq in (u32::MAX - 5)..=u32::MAX {
            assert!(!w.replay(seq));
        }
        assert!(!w.replay(0));
        assert!(w.replay(u32::MAX - 1));
        // A long capture: the set keeps what may still come again, no more.
        let mut long = SeenSeqs::default();
        for seq in 0..10 * REPLAY_SPAN {
            assert!(!long.replay(seq), "{seq}");
            assert!(long.seqs.len() <= 2 * REPLAY_SPAN as usize + 1);
        }
        // A retransmission within a window of the newest is still recognised.
        assert!(long.replay(10 * REPLAY_SPAN - 4096));
    }
}
