//! Reads run as tasks of the runtime rather than in the caller's future.
//!
//! A restore lane polls its batch of reads from a thread of its own
//! (`Handle::block_on`), while the connection's I/O (QUIC's driver,
//! hyper's connection task) runs on the runtime's workers. Read in the
//! lane's future, every packet the worker takes in wakes the lane: a
//! futex wake, a context switch and a lock fought over, per packet. Read
//! in a task, the bytes are taken on the worker that received them and
//! the lane is woken once, when the read is done (`l2-bench`: a restore
//! from a peer went from 0.67–0.79 to 0.82–1.01 of raw quinn).

use std::future::Future;

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
/// Needs a runtime context. On a multi-thread runtime the task runs on
/// its workers; on a current-thread runtime it runs only while that
/// runtime's own `block_on` drives it (as in `#[tokio::test]`), never
/// under a `Handle::block_on` from another thread, which would wait for
/// it forever.
pub async fn read_as_task<T, F>(what: impl std::fmt::Display, read: F) -> Result<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
{
    let mut handle = AbortOnDrop(tokio::spawn(read));
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
