//! A parallel map over indices with per-thread state, on scoped threads.
//!
//! Chunk work (hashing, compression) is independent per chunk, so the unit of
//! parallelism is the chunk; each worker keeps its own codec contexts.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The number of worker threads to use by default: the cores available.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `f(state, i)` for every `i` in `0..n` on `threads` threads (each with
/// its own `init()` state) and returns the results in index order.
pub fn par_map<S, T, I, F>(n: usize, threads: usize, init: I, f: F) -> Vec<T>
where
    T: Send,
    I: Fn() -> S + Sync,
    F: Fn(&mut S, usize) -> T + Sync,
{
    let next = AtomicUsize::new(0);
    let threads = threads.clamp(1, n.max(1));
    if threads == 1 {
        // One worker (a save of one chunk, a one-core machine): on this
        // thread, without the cost of starting one.
        let mut state = init();
        return (0..n).map(|i| f(&mut state, i)).collect();
    }
    let mut parts: Vec<Vec<(usize, T)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut state = init();
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        out.push((i, f(&mut state, i)));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut all: Vec<(usize, T)> = parts.iter_mut().flat_map(std::mem::take).collect();
    all.sort_unstable_by_key(|(i, _)| *i);
    all.into_iter().map(|(_, t)| t).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_in_order_on_any_thread_count() {
        for threads in [1, 2, 7] {
            let out = par_map(
                100,
                threads,
                || 0usize,
                |calls, i| {
                    *calls += 1;
                    i * 2
                },
            );
            assert_eq!(out, (0..100).map(|i| i * 2).collect::<Vec<_>>());
        }
        assert!(par_map(0, 4, || (), |_, i| i).is_empty());
    }
}
