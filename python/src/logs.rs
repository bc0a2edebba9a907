//! `tracing` events into Python `logging`. The thread that emits an event
//! never takes the GIL: a subscriber queues the event (bounded; what
//! overflows is counted) with the time it fired, and a delivery thread of
//! the module's own hands the queue to the `strata` logger as soon as it
//! can take the GIL, so records reach `logging` without waiting for the
//! next call into the package. Each record's `created` is the event's
//! time, not the time Python received it, and its `threadName` the Rust
//! thread's. Calls into the module also drain the queue on the caller's
//! thread before they return, after any drain running on another thread
//! (waited for at most two seconds), so a call's own records come before
//! its result or exception. A call made from inside a handler returns at
//! once and leaves the queue to the drain it runs in.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// Events kept until the next drain; older ones are dropped beyond it.
const QUEUE_CAP: usize = 4096;

/// One event: Python level, text, seconds since the epoch, thread name.
struct Line {
    level: u8,
    text: String,
    at: f64,
    thread: Option<String>,
}

static QUEUE: Mutex<VecDeque<Line>> = Mutex::new(VecDeque::new());
/// Signalled when an event is queued (the delivery thread waits on it).
static QUEUED: Condvar = Condvar::new();
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The most verbose Python level forwarded (Python's numbers: 10 debug,
/// 20 info, 30 warning, 40 error, 5 trace); follows the `strata` logger.
static MIN_LEVEL: AtomicU8 = AtomicU8::new(20);
/// Whether the delivery thread was started (once per process).
static DELIVERING: AtomicBool = AtomicBool::new(false);
/// Asks the delivery thread to end (before the interpreter finalizes).
static STOPPING: AtomicBool = AtomicBool::new(false);
/// The delivery thread, joined by [`stop_log_delivery`].
static DELIVERY: Mutex<Option<std::thread::JoinHandle<()>>> = Mutex::new(None);

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
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut f = Fields(String::new());
        e.record(&mut f);
        let line = Line {
            level: py_level(e.metadata().level()),
            text: format!("{}: {}", e.metadata().target(), f.0.trim_start()),
            at,
            thread: std::thread::current().name().map(str::to_string),
        };
        if let Ok(mut q) = QUEUE.lock() {
            if q.len() >= QUEUE_CAP {
                q.pop_front();
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
            q.push_back(line);
        }
        QUEUED.notify_one();
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Installs the forwarding subscriber, unless the process already has one,
/// and starts the delivery thread.
pub(crate) fn install() {
    let _ = tracing::subscriber::set_global_default(Forward);
    if DELIVERING.swap(true, Ordering::SeqCst) {
        return;
    }
    match std::thread::Builder::new()
        .name("strata-logs".into())
        .spawn(deliver)
    {
        Ok(h) => {
            if let Ok(mut slot) = DELIVERY.lock() {
                *slot = Some(h);
            }
        }
        // Records still reach `logging` at the next call into the module.
        Err(_) => DELIVERING.store(false, Ordering::SeqCst),
    }
}

/// Ends the delivery thread and waits for it (called at interpreter exit,
/// after the checkpointers closed, while a thread may still take the GIL);
/// records queued later reach `logging` at the next call into the module.
#[pyfunction]
pub(crate) fn stop_log_delivery(py: Python<'_>) {
    STOPPING.store(true, Ordering::SeqCst);
    QUEUED.notify_all();
    let handle = DELIVERY.lock().ok().and_then(|mut h| h.take());
    if let Some(h) = handle {
        // Without the GIL: the thread may be waiting for it.
        py.detach(move || {
            let _ = h.join();
        });
    }
    drain(py);
}

/// The delivery thread: waits for queued events, then takes the GIL and
/// hands them to `logging`. Ends when asked ([`stop_log_delivery`], at
/// interpreter exit: a thread that takes the GIL once the interpreter
/// finalizes is ended by Python under its feet) or when it finds the
/// interpreter finalizing.
fn deliver() {
    loop {
        if STOPPING.load(Ordering::SeqCst) {
            return;
        }
        let pending = match QUEUE.lock() {
            Ok(q) => {
                let waited = QUEUED.wait_timeout_while(q, Duration::from_secs(1), |q| {
                    q.is_empty()
                        && DROPPED.load(Ordering::Relaxed) == 0
                        && !STOPPING.load(Ordering::SeqCst)
                });
                match waited {
                    Ok((q, _)) => !q.is_empty() || DROPPED.load(Ordering::Relaxed) > 0,
                    Err(_) => return,
                }
            }
            Err(_) => return,
        };
        if !pending || STOPPING.load(Ordering::SeqCst) {
            continue;
        }
        // Never blocks interpreter shutdown: past it, the thread ends (the
        // queue's records are lost with the interpreter's logging).
        if Python::try_attach(drain).is_none() {
            return;
        }
    }
}

/// Hands the queued events to the `strata` logger on the calling thread
/// and follows its level, as the only drain running (it first waits, at
/// most [`MAX_WAIT`] and without the GIL, for another thread's drain to
/// end). Each record carries the time its event fired and the Rust
/// thread's name.
#[pyfunction]
pub(crate) fn drain_logs(py: Python<'_>) -> PyResult<()> {
    exclusively(py, || hand_over(py))
}

/// [`drain_logs`]'s body, run as the only drain.
fn hand_over(py: Python<'_>) -> PyResult<()> {
    let logger = py
        .import("logging")?
        .call_method1("getLogger", ("strata",))?;
    let level: i64 = logger.call_method0("getEffectiveLevel")?.extract()?;
    MIN_LEVEL.store(level.clamp(1, 50) as u8, Ordering::Relaxed);
    // Taken inside the drain: two drains (the delivery thread's and a
    // caller's) never interleave, so records keep their order, and a
    // caller's drain ends only after the records it could not take.
    let lines: Vec<Line> = match QUEUE.lock() {
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
                    "{dropped} log records were dropped (more than {QUEUE_CAP} before Python could take them)"
                ),
            ),
        )?;
    }
    if lines.is_empty() {
        return Ok(());
    }
    let logging = py.import("logging")?;
    let start: f64 = logging
        .getattr("_startTime")
        .and_then(|s| s.extract())
        .unwrap_or(0.0);
    for line in lines {
        if !logger
            .call_method1("isEnabledFor", (line.level,))?
            .extract::<bool>()?
        {
            continue;
        }
        let record = logger.call_method1(
            "makeRecord",
            (
                logger.getattr("name")?,
                line.level,
                "(rust)",
                0,
                "%s",
                (line.text,),
                py.None(),
            ),
        )?;
        record.setattr("created", line.at)?;
        record.setattr("msecs", (line.at.fract() * 1000.0).floor())?;
        record.setattr("relativeCreated", (line.at - start) * 1000.0)?;
        if let Some(t) = line.thread {
            record.setattr("threadName", t)?;
        }
        logger.call_method1("handle", (record,))?;
    }
    Ok(())
}

/// Drains the logs, ignoring a failure of `logging` itself.
pub(crate) fn drain(py: Python<'_>) {
    let _ = drain_logs(py);
}

/// The process (its id) whose drain runs now: set from taking the queue
/// to the last record's handler. The GIL alone cannot keep two drains
/// apart, since a handler running Python code (I/O, `time.sleep`, a
/// switch interval) lets another thread take it. Without this, a call into
/// the module could return while the delivery thread still held that
/// call's records, unhandled. A process id other than ours is a fork's
/// leftover (the parent drained as it forked) and counts as free.
static DRAINING: Mutex<Option<u32>> = Mutex::new(None);
/// Signalled when a drain ends.
static DRAINED: Condvar = Condvar::new();
/// The longest a call waits for another thread's drain (a handler stuck
/// in I/O, or one waiting on something the caller holds): then it drains
/// beside it, and the order of the two drains' records is not kept.
const MAX_WAIT: Duration = Duration::from_secs(2);

thread_local! {
    /// This thread is inside a drain: a handler that calls into the module
    /// must not wait for the drain it runs in.
    static IN_DRAIN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether `owner` is a drain of this process running now.
fn running(owner: &Option<u32>) -> bool {
    *owner == Some(std::process::id())
}

/// Waits for any other thread's drain to finish (without the GIL, which
/// that thread may need to finish; at most [`MAX_WAIT`]), then runs `f`
/// as the only drain.
fn exclusively(py: Python<'_>, f: impl FnOnce() -> PyResult<()>) -> PyResult<()> {
    if IN_DRAIN.with(|d| d.replace(true)) {
        return Ok(());
    }
    /// Ends the drain, also when a handler's error or a panic leaves early.
    struct Leave(bool);
    impl Drop for Leave {
        fn drop(&mut self) {
            if self.0 {
                *DRAINING.lock().unwrap_or_else(|p| p.into_inner()) = None;
                DRAINED.notify_all();
            }
            IN_DRAIN.with(|d| d.set(false));
        }
    }
    let mut leave = Leave(false);
    // A poisoned lock only means a thread panicked holding it; the value
    // itself is always consistent. The lock is only ever held to read or
    // set the owner, never while waiting for the GIL, so taking it with
    // the GIL held cannot deadlock. Only when another drain runs is the
    // GIL let go, to wait: giving it up on every call would let the
    // process's other Python threads in before each call returns.
    {
        let mut owner = DRAINING.lock().unwrap_or_else(|p| p.into_inner());
        if !running(&owner) {
            *owner = Some(std::process::id());
            leave.0 = true;
        }
    }
    if !leave.0 {
        let took = py.detach(|| {
            let owner = DRAINING.lock().unwrap_or_else(|p| p.into_inner());
            let (mut owner, _) = DRAINED
                .wait_timeout_while(owner, MAX_WAIT, |o| running(o))
                .unwrap_or_else(|p| p.into_inner());
            if running(&owner) {
                return false;
            }
            *owner = Some(std::process::id());
            true
        });
        leave.0 = took;
    }
    f()
}
