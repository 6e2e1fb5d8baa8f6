//! A JSON document's top level, split as it streams: each member of the top-level object
//! with its value's bytes, and the elements of one array member (`traceEvents`) one at a
//! time, so that a trace of several gigabytes is read in memory bounded by its largest
//! event. Each piece is then parsed whole by `serde_json` from its bytes (fast, borrowing);
//! this scanner only finds where values end: strings with their escapes, and the nesting
//! of objects and arrays. A document that is a bare array (Chrome's JSON Array Format) is
//! read as that array.

use std::io::{self, BufRead};

/// The largest single value kept (an event, or a top-level member other than the array).
pub(crate) const MAX_VALUE: usize = 64 << 20;

/// Why the document's structure is not what is expected.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScanError {
    /// Reading failed (or the input's limit was reached: the reader's own error).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The structure is not JSON as expected.
    #[error("not JSON at byte {offset}: {why}")]
    Syntax {
        /// Bytes read before it.
        offset: u64,
        /// What was expected.
        why: &'static str,
    },
    /// One value is larger than [`MAX_VALUE`].
    #[error("a value at byte {offset} is larger than {} MiB", MAX_VALUE >> 20)]
    TooLarge {
        /// Where it starts.
        offset: u64,
    },
    /// The consumer refused a piece (its own error, kept by the caller).
    #[error("stopped")]
    Stopped,
}

/// What the scanner found.
pub(crate) enum Piece<'a> {
    /// A member of the top-level object other than the array: its key and its value.
    Member(&'a str, &'a [u8]),
    /// The next element of the array member.
    Element(&'a [u8]),
}

/// Reads `r` to its end, handing each piece to `each` (which returns `false` to stop).
/// `array_key` names the member whose array is split into elements; whether the document
/// had that array (or was a bare array) is returned.
pub(crate) fn scan(
    r: impl BufRead,
    array_key: &str,
    mut each: impl FnMut(Piece<'_>) -> bool,
) -> Result<bool, ScanError> {
    let mut s = Scanner { r, offset: 0, buf: Vec::new() };
    let mut found = false;
    match s.skip_ws()? {
        Some(b'[') => return s.elements(&mut each).map(|()| true),
        Some(b'{') => s.bump(),
        _ => return Err(s.syntax("a JSON object or array at the start")),
    }
    let mut key = Vec::new();
    loop {
        match s.skip_ws()? {
            Some(b'}') => {
                s.bump();
                break;
            }
            Some(b'"') => {}
            _ => return Err(s.syntax("a member's key")),
        }
        key.clear();
        s.value(Some(&mut key))?;
        let key: String =
            serde_json::from_slice(&key).map_err(|_| s.syntax("a key that is a JSON string"))?;
        if s.skip_ws()? != Some(b':') {
            return Err(s.syntax("':' after a key"));
        }
        s.bump();
        if key == array_key && s.skip_ws()? == Some(b'[') {
            found = true;
            s.elements(&mut each)?;
        } else {
            let mut v = std::mem::take(&mut s.buf);
            v.clear();
            s.value(Some(&mut v))?;
            let go = each(Piece::Member(&key, &v));
            s.buf = v;
            if !go {
                return Err(ScanError::Stopped);
            }
        }
        match s.skip_ws()? {
            Some(b',') => s.bump(),
            Some(b'}') => {
                s.bump();
                break;
            }
            _ => return Err(s.syntax("',' or '}' after a member")),
        }
    }
    match s.skip_ws()? {
        None => Ok(found),
        Some(_) => Err(s.syntax("nothing after the top-level object")),
    }
}

struct Scanner<R> {
    r: R,
    offset: u64,
    /// The value being kept.
    buf: Vec<u8>,
}

impl<R: BufRead> Scanner<R> {
    fn syntax(&self, why: &'static str) -> ScanError {
        ScanError::Syntax { offset: self.offset, why }
    }

    fn bump(&mut self) {
        self.r.consume(1);
        self.offset += 1;
    }

    /// Skips whitespace; the next byte, not consumed.
    fn skip_ws(&mut self) -> io::Result<Option<u8>> {
        loop {
            let b = self.r.fill_buf()?;
            if b.is_empty() {
                return Ok(None);
            }
            let n = b.iter().position(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r')).unwrap_or(b.len());
            let next = b.get(n).copied();
            self.r.consume(n);
            self.offset += n as u64;
            if next.is_some() {
                return Ok(next);
            }
        }
    }

    /// The elements of the array at hand (its '[' next), each handed to `each`.
    fn elements(&mut self, each: &mut impl FnMut(Piece<'_>) -> bool) -> Result<(), ScanError> {
        self.bump();
        if self.skip_ws()? == Some(b']') {
            self.bump();
            return Ok(());
        }
        loop {
            let mut v = std::mem::take(&mut self.buf);
            v.clear();
            self.value(Some(&mut v))?;
            let go = each(Piece::Element(&v));
            self.buf = v;
            if !go {
                return Err(ScanError::Stopped);
            }
            match self.skip_ws()? {
                Some(b',') => self.bump(),
                Some(b']') => {
                    self.bump();
                    return Ok(());
                }
                _ => return Err(self.syntax("',' or ']' after an array element")),
            }
            self.skip_ws()?;
        }
    }

    /// One value (after whitespace): its bytes appended to `out` (or skipped with `None`).
    fn value(&mut self, mut out: Option<&mut Vec<u8>>) -> Result<(), ScanError> {
        let start = self.offset;
        let first = self.skip_ws()?.ok_or_else(|| self.syntax("a value"))?;
        let mut depth = 0usize;
        let mut in_string = false;
        let mut escaped = false;
        let scalar = !matches!(first, b'{' | b'[' | b'"');
        loop {
            let b = self.r.fill_buf()?;
            if b.is_empty() {
                return match scalar && depth == 0 {
                    true => Ok(()),
                    false => Err(self.syntax("the rest of a value: the input ends inside it")),
                };
            }
            let mut end = None;
            for (i, &c) in b.iter().enumerate() {
                if in_string {
                    if escaped {
                        escaped = false;
                    } else if c == b'\\' {
                        escaped = true;
                    } else if c == b'"' {
                        in_string = false;
                        if depth == 0 {
                            end = Some(i + 1);
                            break;
                        }
                    }
                    continue;
                }
                match c {
                    b'"' if !scalar => in_string = true,
                    b'{' | b'[' if !scalar => depth += 1,
                    b'}' | b']' if !scalar => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            end = Some(i + 1);
                            break;
                        }
                    }
                    b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r' if scalar => {
                        end = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            let n = end.unwrap_or(b.len());
            if let Some(o) = out.as_deref_mut() {
                if o.len() + n > MAX_VALUE {
                    return Err(ScanError::TooLarge { offset: start });
                }
                o.extend_from_slice(&b[..n]);
            }
            self.r.consume(n);
            self.offset += n as u64;
            if end.is_some() {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pieces(doc: &str) -> Result<Vec<String>, ScanError> {
        let mut got = Vec::new();
        // A tiny buffer: values cross the reader's refills.
        let r = io::BufReader::with_capacity(3, doc.as_bytes());
        scan(r, "traceEvents", |p| {
            got.push(match p {
                Piece::Member(k, v) => format!("{k}={}", String::from_utf8_lossy(v)),
                Piece::Element(v) => format!("[{}]", String::from_utf8_lossy(v)),
            });
            true
        })?;
        Ok(got)
    }

    #[test]
    fn members_and_elements_come_out_whole_with_strings_escapes_and_nesting() {
        let doc = r#" { "a" : 1, "traceEvents": [ {"name": "x}\"]", "args": {"k": [1, {"j": 2}]}}, 7 ,"s"],
            "deviceProperties": [{"id": 0}], "t\"k": true , "n": null } "#;
        assert_eq!(
            pieces(doc).unwrap(),
            [
                "a=1",
                r#"[{"name": "x}\"]", "args": {"k": [1, {"j": 2}]}}]"#,
                "[7]",
                r#"["s"]"#,
                r#"deviceProperties=[{"id": 0}]"#,
                "t\"k=true",
                "n=null"
            ]
        );
        assert_eq!(pieces("[1, [2], {\"a\": 3}]").unwrap(), ["[1]", "[[2]]", "[{\"a\": 3}]"], "a bare array");
        assert_eq!(pieces("{\"traceEvents\": []}").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn broken_structure_is_an_error_with_its_offset() {
        for (doc, why) in [
            ("", "a JSON object or array at the start"),
            ("\0\0\0", "a JSON object or array at the start"),
            ("   ", "a JSON object or array at the start"),
            ("{\"traceEvents\": [{\"a\": 1}", "',' or ']' after an array element"),
            ("{\"traceEvents\": [{\"a\": 1", "the rest of a value: the input ends inside it"),
            ("{\"a\" 1}", "':' after a key"),
            ("{\"a\": 1 \"b\": 2}", "',' or '}' after a member"),
            ("{\"a\": 1} x", "nothing after the top-level object"),
            ("{1: 2}", "a member's key"),
        ] {
            match pieces(doc) {
                Err(ScanError::Syntax { why: w, .. }) => assert_eq!(w, why, "{doc:?}"),
                other => panic!("{doc:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_consumer_stops_the_scan() {
        let r = io::BufReader::new("[1, 2, 3]".as_bytes());
        let mut n = 0;
        let e = scan(r, "traceEvents", |_| {
            n += 1;
            n < 2
        });
        assert!(matches!(e, Err(ScanError::Stopped)) && n == 2);
    }
}
