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
