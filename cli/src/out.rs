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

/// What a long command is doing, on standard error, in one style for every command
/// (`loopback`, `replay`, `bench …`): on a terminal a bar with the time so far and an ETA
/// (a spinner where the command cannot count its work), cleared at the end; elsewhere (a log,
/// a pipe) plain lines with the seconds since the start and the time left where it is known.
///
/// The work is counted in units (`counted`): each [`Steps::step`] begins the next one, and a
/// [`Steps::detail`] within it that says `N of M` (`replay 3 of 5`, `bridged (2 of 3)`) places
/// the bar within it, so that the ETA moves between the units too.
pub(crate) struct Steps {
    bar: Option<indicatif::ProgressBar>,
    what: &'static str,
    start: std::time::Instant,
    /// The units of work, where known.
    units: Option<u32>,
    /// Units begun.
    begun: std::cell::Cell<u32>,
    /// The fraction of the work done, 0..=1.
    done: std::cell::Cell<f64>,
    /// A line for every detail too, not only for the steps (`--verbose`, or a command whose
    /// details are few).
    every_detail: bool,
    /// When the last periodic line was said (seconds since the start), for [`Steps::at`].
    said: std::cell::Cell<f64>,
}

/// Positions of a bar: the fraction done in thousandths.
const BAR_LENGTH: u64 = 1000;

impl Steps {
    /// Steps that cannot be counted: a spinner on a terminal.
    pub(crate) fn new(what: &'static str) -> Steps {
        Steps::make(what, None)
    }

    /// `units` units of work: a bar with an ETA on a terminal, the time left in the lines.
    pub(crate) fn counted(what: &'static str, units: u32) -> Steps {
        Steps::make(what, Some(units.max(1)))
    }

    fn make(what: &'static str, units: Option<u32>) -> Steps {
        use std::io::IsTerminal;
        let bar = io::stderr().is_terminal().then(|| {
            let (b, template) = match units {
                Some(_) => (
                    indicatif::ProgressBar::new(BAR_LENGTH),
                    "{prefix} [{elapsed_precise}] {bar:30} {percent:>3}% ETA {eta} {wide_msg}",
                ),
                None => (
                    indicatif::ProgressBar::new_spinner(),
                    "{spinner} [{elapsed_precise}] {prefix}: {wide_msg}",
                ),
            };
            b.set_style(
                indicatif::ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            b.set_prefix(what);
            b.enable_steady_tick(std::time::Duration::from_millis(120));
            b
        });
        Steps {
            bar,
            what,
            start: std::time::Instant::now(),
            units,
            begun: std::cell::Cell::new(0),
            done: std::cell::Cell::new(0.0),
            every_detail: false,
            said: std::cell::Cell::new(0.0),
        }
    }

    /// A line for every detail as well (`--verbose`).
    pub(crate) fn with_every_detail(mut self, on: bool) -> Steps {
        self.every_detail = on;
        self
    }

    /// The next unit begins: the bar's message, or a line with the time left.
    pub(crate) fn step(&self, msg: &str) {
        let begun = self.begun.get();
        self.begun.set(begun + 1);
        if let Some(n) = self.units {
            self.set_done(f64::from(begun) / f64::from(n));
        }
        self.say(msg);
    }

    /// Detail within a unit: the bar's message (placed within the unit where it says
    /// `N of M`); a line only with [`Steps::with_every_detail`].
    pub(crate) fn detail(&self, msg: &str) {
        if let (Some(n), Some(within)) = (self.units, fraction_in(msg)) {
            let unit = f64::from(self.begun.get().saturating_sub(1));
            self.set_done((unit + within) / f64::from(n));
        }
        match &self.bar {
            Some(b) => b.set_message(msg.to_string()),
            None if self.every_detail => self.line(msg),
            None => {}
        }
    }

    /// A message that is not a unit of work (a result, a warning): the bar's, or a line.
    pub(crate) fn say(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.set_message(msg.to_string()),
            None => self.line(msg),
        }
    }

    /// Now `done` (0..=1) of the work, for work measured in time (`bench chaos`): the bar, or
    /// a line every 30 s.
    pub(crate) fn at(&self, done: f64, msg: &str) {
        self.set_done(done);
        match &self.bar {
            Some(b) => b.set_message(msg.to_string()),
            None => {
                let t = self.start.elapsed().as_secs_f64();
                if t - self.said.get() >= 30.0 {
                    self.said.set(t);
                    self.line(msg);
                }
            }
        }
    }

    fn set_done(&self, f: f64) {
        let f = f.clamp(0.0, 1.0).max(self.done.get());
        self.done.set(f);
        if let Some(b) = &self.bar {
            b.set_position((f * BAR_LENGTH as f64).round() as u64);
        }
    }

    /// The time left, from the time so far and the fraction done (none before 1 % is done).
    fn left(&self) -> Option<std::time::Duration> {
        let f = self.done.get();
        (self.units.is_some() && (0.01..1.0).contains(&f))
            .then(|| self.start.elapsed().mul_f64((1.0 - f) / f))
    }

    fn line(&self, msg: &str) {
        let left = self.left().map_or(String::new(), |d| format!(", about {} left", rough(d)));
        eprintln!("dxpu {} [{:6.1} s{left}] {msg}", self.what, self.start.elapsed().as_secs_f64());
    }

    /// Runs `f` (which prints rows) with the bar off the screen.
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

/// Where the first `N of M` in a message (the outermost) puts the work within its unit:
/// `(N - 1) / M`.
fn fraction_in(msg: &str) -> Option<f64> {
    let words: Vec<&str> =
        msg.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).collect();
    words.windows(3).find_map(|w| {
        let (n, m) = (w[0].parse::<u32>().ok()?, w[2].parse::<u32>().ok()?);
        (w[1] == "of" && (1..=m).contains(&n)).then(|| f64::from(n - 1) / f64::from(m))
    })
}

/// A duration as a person reads a wait: `40 s`, `3 min`, `2 h 5 min`.
fn rough(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=99 => format!("{s} s"),
        100..=5999 => format!("{} min", (s + 30) / 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_of_m_places_the_work_within_its_unit_and_a_wait_reads_roughly() {
        assert_eq!(fraction_in("replay 3 of 5"), Some(0.4));
        assert_eq!(fraction_in("inference: bridged (2 of 4): step 7 of 10"), Some(0.25));
        assert_eq!(fraction_in("warm-up"), None);
        assert_eq!(fraction_in("0 of 5"), None);
        assert_eq!(fraction_in("6 of 5"), None);
        assert_eq!(rough(std::time::Duration::from_secs(42)), "42 s");
        assert_eq!(rough(std::time::Duration::from_secs(190)), "3 min");
        assert_eq!(rough(std::time::Duration::from_secs(7500)), "2 h 5 min");
        // Counted work: the time left appears once some is done, and never goes back.
        let s = Steps::counted("test", 4);
        assert!(s.left().is_none());
        s.step("one");
        s.step("two");
        s.detail("half 2 of 2");
        assert!((s.done.get() - 0.375).abs() < 1e-9);
        s.detail("1 of 2");
        assert!((s.done.get() - 0.375).abs() < 1e-9);
        assert!(s.left().is_some());
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
