//! Reads run as tasks of the runtime rather than in the caller's future.
//!
//! A restore lane polls its batch of reads from a thread of its own
//! (`Handle::block_on`), while the connection's I/O (QUIC's driver,
//! hyper's connection task) runs on the runtime's workers. Read in the
//! lane's future, every packet the worker takes in wakes the lane: a
//! futex wake, a context switch and a lock fought over, per packet. Read
//! in a task, the bytes are taken on the worker that received them and
//! the lane is woken once, when the read is done (`l2-bench`, alternated
//! builds: a restore from a peer went from 0.67–0.79 to 0.81–0.96 of raw
//! quinn).

use std::future::Future;

use tracing::Instrument;

use crate::error::{Result, StoreError};

/// A spawned task, aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `read` as a task of the current runtime and waits for it. The
/// task is aborted when the returned future is dropped (a prefetched batch
/// aborted, a caller that gave up), so it frees what it holds. A panic in
/// it becomes an `Internal` error, logged at error level with `what`: the
/// readers answer a failed read from another tier without a word, so
/// without the log a bug would pass as a slow tier.
///
/// The task carries the caller's tracing span. Its blocking parts
/// should go through [`blocking`], so that a panic there is this task's
/// panic (and logged), not a quiet error.
///
/// Needs a runtime context. On a multi-thread runtime the task runs on
/// its workers; on a current-thread runtime only while some thread is in
/// that runtime's own `Runtime::block_on` (as in `#[tokio::test]`): a
/// caller that polls through `Handle::block_on` alone waits for ever.
pub async fn read_as_task<T, F>(what: impl std::fmt::Display, read: F) -> Result<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
{
    let mut handle = AbortOnDrop(tokio::spawn(read.in_current_span()));
    match (&mut handle.0).await {
        Ok(r) => r,
        Err(e) => {
            if e.is_panic() {
                tracing::error!(read = %what, error = %e, "a read panicked");
            }
            Err(StoreError::Internal(format!("{what}: read task: {e}")))
        }
    }
}

/// Runs `f` on the runtime's blocking pool (hashing, decoding: CPU work
/// kept off the async workers) and waits for it. A panic in `f` is
/// resumed here, so inside [`read_as_task`] it becomes the read's panic,
/// logged there; a cancelled job (the runtime shutting down) is
/// `Internal`.
pub async fn blocking<T, F>(what: &str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(StoreError::Internal(format!("{what} task: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .expect("runtime")
    }

    #[test]
    fn the_read_runs_on_a_worker_and_its_result_comes_back() {
        let rt = rt();
        let caller = std::thread::current().id();
        let (value, ran_on) = rt
            .block_on(read_as_task("x", async move {
                Ok((7, std::thread::current().id()))
            }))
            .expect("read");
        assert_eq!(value, 7);
        assert_ne!(ran_on, caller, "the read ran in the caller's thread");
    }

    #[test]
    fn a_panicking_read_is_an_internal_error() {
        let rt = rt();
        let e = rt
            .block_on(read_as_task("chunk x", async {
                if std::hint::black_box(true) {
                    panic!("boom");
                }
                Ok(())
            }))
            .unwrap_err();
        assert!(
            matches!(e, StoreError::Internal(ref m) if m.contains("chunk x")),
            "{e}"
        );
    }

    #[test]
    fn a_panic_in_the_blocking_part_is_the_reads_panic() {
        let rt = rt();
        let e = rt
            .block_on(read_as_task("chunk y", async {
                blocking("decoder", || -> Result<()> {
                    if std::hint::black_box(true) {
                        panic!("decoder bug");
                    }
                    Ok(())
                })
                .await
            }))
            .unwrap_err();
        // The read task's panic: `read_as_task` names it as such (and logs
        // it), where a mapped join error would read "decoder task".
        assert!(
            matches!(e, StoreError::Internal(ref m) if m.contains("chunk y: read task") && m.contains("panic")),
            "{e}"
        );
    }

    #[test]
    fn dropping_the_wait_aborts_the_read() {
        let rt = rt();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        // The task holds `tx` until it ends: aborted, it drops it.
        let read = read_as_task("slow", async move {
            let _tx = tx;
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
            Ok(())
        });
        rt.block_on(async {
            // Polled once (the task is spawned), then dropped.
            let _ = tokio::time::timeout(std::time::Duration::from_millis(20), read).await;
        });
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(5)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected),
            "the read kept running after its caller dropped it"
        );
    }
}
