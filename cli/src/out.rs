//! Printing to stdout without panicking when the reader goes away
//! (`strata demo | head`): a closed pipe ends the program quietly.

use std::io::Write;

/// Writes one line to stdout; exits with status 0 if stdout is a closed pipe,
/// and ignores other write errors (a full disk behind a redirect is reported
/// by the shell, not by a panic).
pub(crate) fn line(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
    }
}

/// `println!` that never panics; see [`line`].
macro_rules! say {
    ($($t:tt)*) => { $crate::out::line(format_args!($($t)*)) };
}
pub(crate) use say;
