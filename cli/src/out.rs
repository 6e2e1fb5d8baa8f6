//! Standard output that a closed pipe does not turn into a panic.
//!
//! `println!` panics when its write fails, and a reader that stops early (`dxpu model | head
//! -1`) makes every later write fail with `EPIPE` (Rust ignores SIGPIPE). A command's output
//! goes through `outln!` and `out!` (below) instead: a write to a closed pipe ends the process with
//! status 0, as the default SIGPIPE action would end it quietly; any other write error ends it
//! with status 2 and says what failed.

use std::fmt;
use std::io::{self, Write};

/// Writes `args` to standard output; on a closed pipe the process exits quietly.
pub(crate) fn write(args: fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        finish(&e)
    }
}

/// What a failed write to standard output does: exit 0 when the reader went away, else 2.
pub(crate) fn finish(e: &io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(0)
    }
    eprintln!("dxpu: writing to standard output: {e}");
    std::process::exit(2)
}

/// `println!` that a closed standard output ends quietly (see the module docs).
macro_rules! outln {
    () => { $crate::out::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::write(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` that a closed standard output ends quietly (see the module docs).
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::write(format_args!($($arg)*)) };
}

/// A table as every dxpu command prints one (docs/cli.md, *Output conventions*): the header in
/// capitals, columns two spaces apart and as wide as their widest cell, numbers aligned right
/// and text left, `-` for a value that is absent.
/// A spread over runs into the object `v`, as every command gives one (docs/cli.md): the
/// median under `key`, its bounds under `key_min` and `key_max`. Nothing where `v` is not an
/// object.
pub(crate) fn spread(v: &mut serde_json::Value, key: &str, s: lab::harness::Spread) {
    if let Some(m) = v.as_object_mut() {
        m.insert(key.to_string(), s.median.into());
        m.insert(format!("{key}_min"), s.min.into());
        m.insert(format!("{key}_max"), s.max.into());
    }
}

pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    // A column is numeric when it holds a number and nothing else but `-`.
    let mut numeric = vec![true; header.len()];
    let mut a_number = vec![false; header.len()];
    for r in rows {
        for (i, c) in r.iter().enumerate().take(header.len()) {
            width[i] = width[i].max(c.chars().count());
            let number = c.parse::<f64>().is_ok();
            numeric[i] &= c == "-" || number;
            a_number[i] |= number;
        }
    }
    for (n, a) in numeric.iter_mut().zip(&a_number) {
        *n &= *a;
    }
    let line = |cells: &mut dyn Iterator<Item = String>| {
        let mut s = String::new();
        for (i, c) in cells.enumerate().take(header.len()) {
            let pad = width[i].saturating_sub(c.chars().count());
            if numeric[i] {
                s.push_str(&" ".repeat(pad));
                s.push_str(&c);
            } else {
                s.push_str(&c);
                s.push_str(&" ".repeat(pad));
            }
            s.push_str("  ");
        }
        s.trim_end().to_string() + "\n"
    };
    // One word per column, so that a header splits as its rows do (`awk`, `column -t`).
    let mut out = line(&mut header.iter().map(|h| h.to_uppercase().replace(' ', "-")));
    for r in rows {
        out.push_str(&line(&mut r.iter().cloned()));
    }
    out
}

/// One line of a table printed a row at a time, as a long measurement produces its rows (the
/// benches' reports): the first cell, text, left-aligned in its width, the others aligned
/// right in theirs, one space apart; a row may have fewer cells than the widths.
pub(crate) fn row(widths: &[usize], cells: &[String]) -> String {
    let mut s = String::new();
    for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
        let pad = w.saturating_sub(c.chars().count());
        if i == 0 {
            s.push_str(c);
            s.push_str(&" ".repeat(pad));
        } else {
            s.push(' ');
            s.push_str(&" ".repeat(pad));
            s.push_str(c);
        }
    }
    s.trim_end().to_string()
}

/// A `--json` answer as one line, its fractions rounded to the digits that mean something
/// (`ops::control::tidy`: `2.333`, not `2.3329999999999997`).
pub(crate) fn json(v: serde_json::Value) -> String {
    ops::control::tidy(v).to_string()
}

/// As [`json`], indented (`pool ls --json`, `bench pool --json`).
pub(crate) fn json_pretty<T: serde::Serialize>(v: &T) -> String {
    let v = serde_json::to_value(v).map(ops::control::tidy).unwrap_or_default();
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

/// A time since the Unix epoch as tables and text print it: RFC 3339, UTC, whole seconds.
pub(crate) fn utc(unix_seconds: f64) -> String {
    match jiff::Timestamp::from_second(unix_seconds.floor() as i64) {
        Ok(t) => t.to_string(),
        Err(_) => format!("{unix_seconds} s after the epoch"),
    }
}

/// A time since the Unix epoch to the microsecond, as text prints a packet's:
/// RFC 3339, UTC (`2026-12-06T02:00:00.123456Z`).
pub(crate) fn utc_us(unix_us: i64) -> String {
    let (s, us) = (unix_us.div_euclid(1_000_000), unix_us.rem_euclid(1_000_000));
    match jiff::Timestamp::from_second(s) {
        Ok(t) => format!("{}.{us:06}Z", t.strftime("%Y-%m-%dT%H:%M:%S")),
        Err(_) => format!("{unix_us} µs after the epoch"),
    }
}

/// Progress of a long command on standard error: a bar (indicatif) where standard error is a
/// terminal, else a line now and then (every 30 s) so that a log shows it is alive, and
/// nothing more.
pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    what: &'static str,
    total: f64,
    said: std::cell::Cell<f64>,
}

impl Progress {
    /// Progress of `what` over `total` (seconds, or any unit `at` is given in).
    pub(crate) fn new(what: &'static str, total: f64) -> Progress {
        use std::io::IsTerminal;
        let bar = io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(total.max(1.0).round() as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b.set_prefix(what);
            b
        });
        Progress { bar, what, total, said: std::cell::Cell::new(0.0) }
    }

    /// Now at `done` of the total, with a short message.
    pub(crate) fn at(&self, done: f64, msg: &str) {
        match &self.bar {
            Some(b) => {
                b.set_position(done.min(self.total).max(0.0).round() as u64);
                b.set_message(msg.to_string());
            }
            None if done - self.said.get() >= 30.0 => {
                self.said.set(done);
                eprintln!("dxpu {}: {:.0} of {:.0}: {msg}", self.what, done, self.total);
            }
            None => {}
        }
    }

    /// Done: the bar is cleared.
    pub(crate) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// What a long command is doing, on standard error: on a terminal a spinner with the step
/// and the time so far, cleared at the end; elsewhere (a log, a pipe) a line per step with
/// the seconds since the start. For commands made of a few long steps (`bench model`'s
/// points, `bench pool`'s storms) whose rows arrive only as each step ends.
pub(crate) struct Steps {
    bar: Option<indicatif::ProgressBar>,
    what: &'static str,
    start: std::time::Instant,
}

impl Steps {
    pub(crate) fn new(what: &'static str) -> Steps {
        use std::io::IsTerminal;
        let bar = io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new_spinner();
            b.set_style(
                indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {prefix}: {wide_msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            b.set_prefix(what);
            b.enable_steady_tick(std::time::Duration::from_millis(120));
            b
        });
        Steps { bar, what, start: std::time::Instant::now() }
    }

    /// A new step: the spinner's message, or a line.
    pub(crate) fn step(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.set_message(msg.to_string()),
            None => eprintln!("dxpu {} [{:6.1} s] {msg}", self.what, self.start.elapsed().as_secs_f64()),
        }
    }

    /// Detail within a step: the spinner's message only (a log gets the steps alone).
    pub(crate) fn detail(&self, msg: &str) {
        if let Some(b) = &self.bar {
            b.set_message(msg.to_string());
        }
    }

    /// Runs `f` (which prints rows) with the spinner off the screen.
    pub(crate) fn print<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(b) => b.suspend(f),
            None => f(),
        }
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_has_a_capital_header_and_aligns_numbers_right_and_text_left() {
        let rows = vec![
            vec!["box-a".to_string(), "12".to_string(), "-".to_string()],
            vec!["b".to_string(), "3.5".to_string(), "gpu0".to_string()],
        ];
        let t = table(&["box", "claims/s", "device"], &rows);
        assert_eq!(t, "BOX    CLAIMS/S  DEVICE\nbox-a        12  -\nb           3.5  gpu0\n", "{t}");
        // A column of nothing but `-` is text.
        assert_eq!(table(&["owner", "n"], &[vec!["-".into(), "1".into()]]), "OWNER  N\n-      1\n");
        // A header alone, and a row shorter or longer than the header.
        assert_eq!(table(&["a", "b"], &[]), "A  B\n");
        assert_eq!(table(&["p50 ms", "n"], &[]), "P50-MS  N\n");
        let t = table(&["a", "b"], &[vec!["x".into()], vec!["y".into(), "z".into(), "extra".into()]]);
        assert_eq!(t, "A  B\nx\ny  z\n", "{t}");
    }

    #[test]
    fn a_streamed_row_pads_its_label_left_and_its_figures_right() {
        let w = [12, 6, 6];
        assert_eq!(row(&w, &["bare".into(), "7.5".into(), "1.00".into()]), "bare            7.5   1.00");
        assert_eq!(row(&w, &["a label too long".into(), "1".into()]), "a label too long      1");
        assert_eq!(row(&w, &["x".into()]), "x");
    }

    #[test]
    fn times_print_as_rfc_3339_utc() {
        assert_eq!(utc(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_796_522_400.9), "2026-12-06T02:00:00Z");
        // Beyond what a timestamp holds: said, not a panic.
        assert!(utc(1e300).contains("after the epoch"));
        assert_eq!(utc(f64::NAN), "1970-01-01T00:00:00Z");
    }
}
