//! Background threads at a lower CPU priority (`background_nice`): where
//! the cores are busy, training, and a save's snapshot that runs on its
//! thread, get them first; the persist worker, the copiers to the peers
//! and L3, and the runtime moving their bytes take what is left. Where the
//! cores are idle nothing changes (a nice value only weighs contention).
//! That runtime also serves a restore's L1 reads and its peer and L3
//! transfers, which therefore run at the background priority too; only a
//! restore's placing lanes and the caller's own thread keep training's.
//! `strata peer serve` lowers itself the same way (`--nice`): on a node
//! that trains, the service receiving other nodes' replicas is background
//! work too.

/// Lowers the calling thread's priority to `nice` (0..=19; 0: nothing;
/// a thread already at that nice value or lower keeps its own). Threads
/// it creates afterwards inherit it. Raising it back would need
/// privileges, so it is only ever lowered; a failure is logged, not fatal.
pub fn lower_this_thread(nice: u8) {
    let nice = i32::from(nice.min(19));
    if nice == 0 {
        return;
    }
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    // SAFETY: getpriority reads its two integer arguments only.
    let now = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
    if now >= nice {
        return; // already as low (a process started under `nice`)
    }
    // SAFETY: setpriority reads its three integer arguments only; on Linux
    // a thread id as `who` with PRIO_PROCESS changes that one thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc != 0 {
        tracing::debug!(
            nice,
            error = %std::io::Error::last_os_error(),
            "cannot lower a background thread's priority"
        );
    }
}

/// The calling thread's nice value.
#[cfg(test)]
pub(crate) fn this_thread_nice() -> i32 {
    // SAFETY: as above.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    // SAFETY: as above (getpriority only reads its arguments).
    unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_calling_thread_and_its_children_are_lowered() {
        let before = this_thread_nice();
        let (mine, child) = std::thread::spawn(|| {
            lower_this_thread(7);
            let child = std::thread::spawn(this_thread_nice).join().unwrap_or(-100);
            (this_thread_nice(), child)
        })
        .join()
        .unwrap_or((-100, -100));
        assert_eq!(mine, before.max(7));
        assert_eq!(child, mine, "inherited");
        assert_eq!(this_thread_nice(), before, "other threads keep theirs");
    }
}
