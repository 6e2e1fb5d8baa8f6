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
