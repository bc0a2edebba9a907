//! Which rank of a node sends a chunk that several of its ranks hold
//! (identical tensors of data-parallel ranks): the ranks of a node share
//! its L1 directory, and a rank about to push chunk X to peer P first
//! takes an exclusive lock on one byte of a lock file of P's under
//! `tmp/push-locks/` there: an open file description lock
//! (`F_OFD_SETLK`), at an offset drawn from X's id, in one of
//! [`LOCK_FILES`] files chosen by the id too. The rank that took it sends
//! X and releases it once sent; a sibling that finds it held leaves X to
//! it (the eager push skips it; the push after the commit waits until the
//! peer holds X, and sends it itself if the lock is released first). So
//! identical chunks cross the network once per peer.
//!
//! The kernel releases every lock of a process when it dies (SIGKILL
//! included): a killed rank's claims end at once, with nothing left on
//! disk to clean up, age or take over. A claim costs a system call on a
//! file already open: no file is created or removed per chunk. (Until
//! 2026-11-29 a claim was a file, created, linked and removed per chunk
//! and peer; on the ext4 without a journal of our test machines each
//! creation also scans the inodes deleted in the last minutes, and a
//! push of 302 chunks spent 0.2 s of CPU there: `docs/performance.md`.)
//!
//! The locks of one claim set share one open file description per file,
//! which the kernel treats as one owner: a second claim of one chunk by
//! the same set would be granted, so the set also keeps what it holds and
//! refuses that one itself. Different sets (two checkpointers of one
//! process, or of two processes) exclude each other as processes do. Two
//! chunks whose ids give the same lock (one pair in 2^66) only wait for
//! each other: a rank that finds its chunk held waits until the peer holds
//! it or the lock is released, then sends it itself. A child forked
//! without exec shares the open files, so a killed rank's claims stay
//! held while such a child lives. The locks need a file system with POSIX
//! locks (a local disk; NFS maps them to its own); where a lock cannot be
//! taken or asked about, each rank sends the chunk itself.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use strata_format::ChunkId;

use crate::tiers::copy::PushCoordination;

/// Lock files per peer: the kernel keeps a file's locks in one list and
/// walks it for every request, so a node's claims in flight are spread
/// over several.
const LOCK_FILES: u8 = 16;

/// The claims of one node's L1 directory for one job. Clones are the same
/// claimant (they share its open files and what it holds).
#[derive(Clone, Debug)]
pub(crate) struct PushClaims {
    dir: PathBuf,
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The lock files opened so far, by peer segment and file index.
    files: Mutex<HashMap<(String, u8), Arc<File>>>,
    /// The locks this set holds. Taken and released under this mutex, so
    /// that a release never drops a lock another claim of this set has
    /// just been given (the kernel would grant both: one owner).
    held: Mutex<HashSet<Slot>>,
}

/// Where the lock of one chunk for one peer is: the file (peer segment
/// and index) and the byte in it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Slot {
    peer: String,
    file: u8,
    offset: i64,
}

/// A claim held by this process, released when dropped (or when the
/// process ends).
#[derive(Debug)]
pub(crate) struct Claim {
    /// Held for its `Drop` (None: no lock could be taken).
    _held: Option<Held>,
}

#[derive(Debug)]
struct Held {
    slot: Slot,
    file: Arc<File>,
    inner: Arc<Inner>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = lock(&self.inner.held);
        // A failed release is released with the file, when the set goes.
        let _ = ofd_lock(
            &self.file,
            libc::F_OFD_SETLK,
            libc::F_UNLCK,
            self.slot.offset,
        );
        held.remove(&self.slot);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One `fcntl` open file description lock request on the byte at
/// `offset` of `f`: `cmd` `F_OFD_SETLK` (`ty` `F_WRLCK` or `F_UNLCK`) or
/// `F_OFD_GETLK`. Returns what the kernel wrote back (for `F_OFD_GETLK`,
/// the conflicting lock, or `F_UNLCK` where none conflicts).
fn ofd_lock(
    f: &File,
    cmd: libc::c_int,
    ty: libc::c_int,
    offset: i64,
) -> std::io::Result<libc::flock> {
    use std::os::fd::AsRawFd as _;
    let mut fl = libc::flock {
        l_type: ty as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: offset,
        l_len: 1,
        // Must be 0 for open file description locks.
        l_pid: 0,
    };
    // SAFETY: `f` is an open file for the whole call, and `fl` is a valid
    // `struct flock` that outlives it; the kernel reads it and, for
    // F_OFD_GETLK, writes into it, nothing else.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl) };
    if rc == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(fl)
    }
}

/// A peer name as a path segment (anything but `[A-Za-z0-9._-]` escaped).
fn segment(peer: &str) -> String {
    peer.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02x}"),
        })
        .collect()
}

impl PushClaims {
    /// The claims under `l1_dir` for `job`.
    pub(crate) fn new(l1_dir: &Path, job: &str) -> Self {
        let tmp = l1_dir.join(job).join("tmp");
        // What builds before 2026-11-29 left: a claim file per chunk, and
        // owner files. Nothing reads them any more.
        let _ = std::fs::remove_dir_all(tmp.join("push-claims"));
        PushClaims {
            dir: tmp.join("push-locks"),
            inner: Arc::default(),
        }
    }

    /// The lock of `id` for `peer`: the id is a BLAKE3 hash, so its bytes
    /// pick the file and the offset (62 bits: any offset the kernel takes).
    fn slot(peer: &str, id: &ChunkId) -> Slot {
        let b = id.as_bytes();
        let mut word = [0u8; 8];
        word.copy_from_slice(&b[..8]);
        let offset = i64::try_from(u64::from_le_bytes(word) >> 2).unwrap_or(0);
        Slot {
            peer: segment(peer),
            file: b[8] % LOCK_FILES,
            offset,
        }
    }

    /// The open lock file of `slot`, opened (and made) on first use.
    fn file(&self, slot: &Slot) -> std::io::Result<Arc<File>> {
        let mut files = lock(&self.inner.files);
        let key = (slot.peer.clone(), slot.file);
        if let Some(f) = files.get(&key) {
            return Ok(f.clone());
        }
        std::fs::create_dir_all(&self.dir)?;
        // Write access: the kernel grants write locks only on it.
        let f = Arc::new(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(self.dir.join(format!("{}.{:x}", slot.peer, slot.file)))?,
        );
        files.insert(key, f.clone());
        Ok(f)
    }

    /// Claims `id` for the push to `peer`: a guard if this process is to
    /// send it, None if a sibling (or this set) holds it. Any trouble with
    /// the lock means "send it yourself" (at worst, sent twice).
    pub(crate) fn claim(&self, peer: &str, id: &ChunkId) -> Option<Claim> {
        let slot = Self::slot(peer, id);
        let Ok(file) = self.file(&slot) else {
            return Some(Claim { _held: None });
        };
        let mut held = lock(&self.inner.held);
        if held.contains(&slot) {
            return None;
        }
        match ofd_lock(&file, libc::F_OFD_SETLK, libc::F_WRLCK, slot.offset) {
            Ok(_) => {
                held.insert(slot.clone());
                Some(Claim {
                    _held: Some(Held {
                        slot,
                        file,
                        inner: self.inner.clone(),
                    }),
                })
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => None,
            Err(e) => {
                tracing::debug!(error = %e, "push claim: cannot lock; sending the chunk here");
                Some(Claim { _held: None })
            }
        }
    }

    /// Whether a claim of `id` for `peer` is held (by a live sibling, or
    /// by this set).
    pub(crate) fn held(&self, peer: &str, id: &ChunkId) -> bool {
        let slot = Self::slot(peer, id);
        let Ok(file) = self.file(&slot) else {
            return false;
        };
        if lock(&self.inner.held).contains(&slot) {
            return true;
        }
        ofd_lock(&file, libc::F_OFD_GETLK, libc::F_WRLCK, slot.offset)
            .is_ok_and(|fl| i32::from(fl.l_type) != libc::F_UNLCK)
    }

    /// These claims for the push to one peer.
    pub(crate) fn for_peer<'a>(&'a self, peer: &'a str) -> PeerClaims<'a> {
        PeerClaims { claims: self, peer }
    }
}

/// The claims of a node for the pushes to one peer.
#[derive(Debug)]
pub(crate) struct PeerClaims<'a> {
    claims: &'a PushClaims,
    peer: &'a str,
}

impl PushCoordination for PeerClaims<'_> {
    fn claim(&self, id: &ChunkId) -> Option<Box<dyn Send>> {
        self.claims
            .claim(self.peer, id)
            .map(|c| Box::new(c) as Box<dyn Send>)
    }

    fn sibling_sending(&self, id: &ChunkId) -> bool {
        self.claims.held(self.peer, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_claimant_per_chunk_and_peer_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let c = PushClaims::new(dir.path(), "j");
        let id = ChunkId::of(b"x");
        let first = c.claim("node-b", &id).expect("first claims");
        assert!(
            c.claim("node-b", &id).is_none(),
            "the same set asking again finds it claimed"
        );
        assert!(c.clone().claim("node-b", &id).is_none(), "a clone too");
        assert!(c.held("node-b", &id));
        // Another set (another rank) finds it held, and cannot take it.
        let sibling = PushClaims::new(dir.path(), "j");
        assert!(sibling.held("node-b", &id));
        assert!(sibling.claim("node-b", &id).is_none());
        assert!(
            sibling.claim("node/c", &id).is_some(),
            "another peer is another claim"
        );
        drop(first);
        assert!(!c.held("node-b", &id));
        assert!(!sibling.held("node-b", &id));
        let again = sibling.claim("node-b", &id).expect("released: claimable");
        assert!(c.held("node-b", &id) && c.claim("node-b", &id).is_none());
        drop(again);
        assert!(c.claim("node-b", &id).is_some());
        assert_eq!(segment("a/b c"), "a%2fb%20c");
    }

    /// Releasing one claim leaves the set's others held (one owner holds
    /// all the locks of a file: a release must drop that one byte only).
    #[test]
    fn a_release_leaves_the_other_claims_of_the_set_held() {
        let dir = tempfile::tempdir().unwrap();
        let c = PushClaims::new(dir.path(), "j");
        let sibling = PushClaims::new(dir.path(), "j");
        let ids: Vec<ChunkId> = (0..200u32).map(|i| ChunkId::of(&i.to_le_bytes())).collect();
        let mut claims: Vec<Option<Claim>> = ids.iter().map(|id| c.claim("p", id)).collect();
        assert!(claims.iter().all(Option::is_some));
        for (k, id) in ids.iter().enumerate().filter(|(k, _)| k % 2 == 0) {
            claims[k] = None; // released
            assert!(!sibling.held("p", id));
        }
        for (k, id) in ids.iter().enumerate() {
            assert_eq!(sibling.claim("p", id).is_none(), k % 2 == 1, "chunk {k}");
        }
    }

    /// This test binary run as a child process for one of its tests: it
    /// is killed (SIGKILL) and reaped however the test that started it
    /// ends.
    struct Child(std::process::Child);

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    impl Child {
        /// Runs the test `name` of this module with `var` naming `dir`,
        /// and waits (at most a minute) until it writes `dir/marker`.
        fn at(name: &str, var: &str, dir: &Path, marker: &str) -> Child {
            let child = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    &format!("push_claims::tests::{name}"),
                    "--nocapture",
                ])
                .env(var, dir)
                .spawn()
                .unwrap();
            let child = Child(child);
            let t = std::time::Instant::now();
            while !dir.join(marker).exists() {
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "the child {name} never wrote {marker}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            child
        }

        /// SIGKILL, then reaped: it ends where it stands.
        fn kill(mut self) {
            self.0.kill().unwrap();
            self.0.wait().unwrap();
        }
    }

    /// The child side of the test below: claims chunks for a peer, says
    /// so, then waits to be killed.
    #[test]
    fn child_holding_a_claim() {
        let Ok(dir) = std::env::var("STRATA_TEST_PUSH_CLAIM_CHILD") else {
            return; // only runs as the child of the test below
        };
        let dir = PathBuf::from(dir);
        let c = PushClaims::new(&dir, "j");
        let claims: Vec<_> = (0..100u32)
            .map(|i| c.claim("node-b", &ChunkId::of(&i.to_le_bytes())))
            .collect();
        assert!(claims.iter().all(Option::is_some));
        std::fs::write(dir.join("claimed"), b"").unwrap();
        std::thread::sleep(Duration::from_secs(120));
        drop(claims);
    }

    /// A rank killed (SIGKILL) while it sends chunks it claimed: its
    /// siblings find them held while it lives and free the moment it is
    /// dead, and send them themselves. Nothing of its claims is left on
    /// disk but the lock files every rank shares.
    #[test]
    fn the_claims_of_a_process_killed_with_sigkill_end_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let child = Child::at(
            "child_holding_a_claim",
            "STRATA_TEST_PUSH_CLAIM_CHILD",
            dir.path(),
            "claimed",
        );
        let me = PushClaims::new(dir.path(), "j");
        let ids: Vec<ChunkId> = (0..100u32).map(|i| ChunkId::of(&i.to_le_bytes())).collect();
        for id in &ids {
            assert!(me.held("node-b", id), "a live sibling's claim is held");
            assert!(me.claim("node-b", id).is_none());
        }
        child.kill(); // no clean-up of its own
        let taken: Vec<_> = ids
            .iter()
            .map(|id| {
                assert!(!me.held("node-b", id), "a killed sibling's claim ended");
                me.claim("node-b", id).expect("claimed at once")
            })
            .collect();
        // Now this process's: held for a sibling, released when dropped.
        let other = PushClaims::new(dir.path(), "j");
        assert!(ids.iter().all(|id| other.held("node-b", id)));
        drop(taken);
        assert!(ids.iter().all(|id| !other.held("node-b", id)));
        let files = std::fs::read_dir(dir.path().join("j/tmp/push-locks"))
            .unwrap()
            .count();
        assert!(files <= usize::from(LOCK_FILES), "{files} lock files");
    }

    /// Siblings claiming one chunk at once: exactly one gets it, every
    /// time.
    #[test]
    fn of_siblings_claiming_a_chunk_at_once_one_gets_it() {
        let dir = tempfile::tempdir().unwrap();
        let siblings: Vec<PushClaims> = (0..6).map(|_| PushClaims::new(dir.path(), "j")).collect();
        let barrier = std::sync::Barrier::new(siblings.len());
        let mut wrong = Vec::new();
        for trial in 0..300u32 {
            let id = ChunkId::of(&trial.to_le_bytes());
            let taken: usize = std::thread::scope(|s| {
                let hands: Vec<_> = siblings
                    .iter()
                    .map(|c| {
                        let (b, id) = (&barrier, &id);
                        s.spawn(move || {
                            b.wait();
                            let got = c.claim("node-b", id);
                            // Held until every sibling has tried.
                            b.wait();
                            got.is_some()
                        })
                    })
                    .collect();
                hands
                    .into_iter()
                    .map(|h| usize::from(h.join().unwrap()))
                    .sum()
            });
            if taken != 1 {
                wrong.push((trial, taken));
            }
            // Every claim was released.
            assert!(!siblings[0].held("node-b", &id), "trial {trial}");
        }
        assert!(wrong.is_empty(), "(trial, siblings that got it): {wrong:?}");
    }

    /// Where the claims cannot be made (the directory is a file), each
    /// rank sends the chunk itself; the files of an older build's claims
    /// are removed when a set opens the directory.
    #[test]
    fn trouble_means_send_it_yourself_and_old_claim_files_go() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("j/tmp/push-claims/node-b");
        std::fs::create_dir_all(&old).unwrap();
        std::fs::write(old.join("ab"), b"123-owner").unwrap();
        let c = PushClaims::new(dir.path(), "j");
        assert!(!dir.path().join("j/tmp/push-claims").exists());
        std::fs::write(dir.path().join("j/tmp/push-locks"), b"not a directory").unwrap();
        let id = ChunkId::of(b"z");
        assert!(c.claim("node-b", &id).is_some());
        assert!(c.claim("node-b", &id).is_some(), "no lock: each sends");
        assert!(!c.held("node-b", &id));
    }
}
