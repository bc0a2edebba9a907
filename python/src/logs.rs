//! `tracing` events into Python `logging`, without the GIL in background
//! threads: a subscriber queues each event (bounded; what overflows is
//! counted), and the queue is drained into the `strata` logger by the
//! thread that calls into the module, which holds the GIL anyway.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// Events kept until the next drain; older ones are dropped beyond it.
const QUEUE_CAP: usize = 4096;

static QUEUE: Mutex<VecDeque<(u8, String)>> = Mutex::new(VecDeque::new());
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The most verbose Python level forwarded (Python's numbers: 10 debug,
/// 20 info, 30 warning, 40 error, 5 trace); follows the `strata` logger.
static MIN_LEVEL: AtomicU8 = AtomicU8::new(20);

fn py_level(l: &Level) -> u8 {
    match *l {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

struct Fields(String);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.insert_str(0, value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?}"));
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

struct Forward;

impl Subscriber for Forward {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        // The level follows the Python logger, so it is asked each time.
        Interest::sometimes()
    }

    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.target().starts_with("strata") && py_level(m.level()) >= MIN_LEVEL.load(Ordering::Relaxed)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, e: &Event<'_>) {
        let mut f = Fields(String::new());
        e.record(&mut f);
        let line = format!("{}: {}", e.metadata().target(), f.0.trim_start());
        if let Ok(mut q) = QUEUE.lock() {
            if q.len() >= QUEUE_CAP {
                q.pop_front();
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
            q.push_back((py_level(e.metadata().level()), line));
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Installs the forwarding subscriber, unless the process already has one.
pub(crate) fn install() {
    let _ = tracing::subscriber::set_global_default(Forward);
}

/// Hands the queued events to the `strata` logger (on the calling thread)
/// and follows its level. Called by every method of the module; the Python
/// layer calls it too, after waits.
#[pyfunction]
pub(crate) fn drain_logs(py: Python<'_>) -> PyResult<()> {
    let logger = py
        .import("logging")?
        .call_method1("getLogger", ("strata",))?;
    let level: i64 = logger.call_method0("getEffectiveLevel")?.extract()?;
    MIN_LEVEL.store(level.clamp(1, 50) as u8, Ordering::Relaxed);
    let lines: Vec<(u8, String)> = match QUEUE.lock() {
        Ok(mut q) => q.drain(..).collect(),
        Err(_) => Vec::new(),
    };
    let dropped = DROPPED.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        logger.call_method1(
            "log",
            (
                30,
                format!(
                    "{dropped} log records were dropped (more than {QUEUE_CAP} between two calls)"
                ),
            ),
        )?;
    }
    for (level, line) in lines {
        logger.call_method1("log", (level, "%s", line))?;
    }
    Ok(())
}

/// Drains the logs, ignoring a failure of `logging` itself.
pub(crate) fn drain(py: Python<'_>) {
    let _ = drain_logs(py);
}
