//! Progress bars on stderr for work that takes longer than a second:
//! hidden under `--json`, when stderr is not a terminal, and for the first
//! second (so quick commands print nothing extra).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A byte-counting progress bar.
pub(crate) struct Progress {
    bar: ProgressBar,
    started: Instant,
    shown: std::cell::Cell<bool>,
    enabled: bool,
}

impl Progress {
    /// A bar over `total` bytes labelled `what`; never drawn when `quiet`.
    pub(crate) fn bytes(total: u64, what: &str, quiet: bool) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(what.to_string());
        Progress {
            bar,
            started: Instant::now(),
            shown: std::cell::Cell::new(false),
            enabled: !quiet && std::io::stderr().is_terminal(),
        }
    }

    /// Counts `n` more bytes done.
    pub(crate) fn inc(&self, n: u64) {
        if self.enabled && !self.shown.get() && self.started.elapsed() > Duration::from_secs(1) {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.shown.set(true);
        }
        self.bar.inc(n);
    }

    /// Removes the bar.
    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// A spinner with the elapsed time, for work whose size is not known as it
/// runs (an import's save): drawn from its first second on, on a terminal,
/// unless `quiet`.
pub(crate) struct Spinner {
    bar: ProgressBar,
}

impl Spinner {
    /// Starts a spinner labelled `what`.
    pub(crate) fn start(what: &str, quiet: bool) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
            bar.set_style(style);
        }
        bar.set_message(what.to_string());
        if !quiet && std::io::stderr().is_terminal() {
            bar.enable_steady_tick(Duration::from_millis(120));
            let shown = bar.clone();
            // Quick work prints nothing: the bar appears after a second.
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(1));
                if !shown.is_finished() {
                    shown.set_draw_target(ProgressDrawTarget::stderr());
                }
            });
        }
        Spinner { bar }
    }

    /// Changes the label.
    pub(crate) fn set(&self, what: &str) {
        self.bar.set_message(what.to_string());
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
