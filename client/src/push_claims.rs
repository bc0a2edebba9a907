//! Which rank of a node sends a chunk that several of its ranks hold
//! (identical tensors of data-parallel ranks): the ranks of a node share
//! its L1 directory, and a rank about to push chunk X to peer P first
//! creates `tmp/push-claims/<P>/<X>` there, create-only. The rank that
//! created it sends X and removes the claim once sent; a sibling that finds
//! the claim leaves X to it (the eager push skips it; the push after the
//! commit waits until the peer holds X, and sends it itself if the claim
//! goes away first or grows stale). So identical chunks cross the network
//! once per peer.
//!
//! A claim names its owner: each process holds an exclusive `flock` on its
//! own file under `tmp/push-claims/owners%/` for as long as it lives, and
//! writes that file's name into each claim it makes. The kernel drops the
//! lock when the process dies (SIGKILL included), so a sibling finds a
//! killed rank's claims stale at once and sends those chunks itself, where
//! it waited for them until its deadline before. A claim without an owner
//! (an older build's, or one whose owner file could not be made) is stale
//! by its age alone. A claim appears with its owner's name in it (made
//! under a name of its own, then hard-linked into place), so a rank killed
//! while it claims leaves no empty claim behind. The lock needs a local
//! file system's `flock` and hard links (L1 is the node's own disk). A
//! child forked without exec shares the locked owner file, so a killed
//! rank's claims stay live while such a child lives.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use strata_format::ChunkId;

use crate::tiers::copy::PushCoordination;

/// A claim older than this is a crashed sibling's: taken over (and removed
/// when a checkpointer opens the directory).
const STALE: Duration = Duration::from_secs(600);

/// The directory of the owner files, under the claims' directory (its
/// name holds a character no peer segment holds).
const OWNERS: &str = "owners%";

/// The claims of one node's L1 directory for one job.
#[derive(Clone, Debug)]
pub(crate) struct PushClaims {
    dir: PathBuf,
    /// This process's owner file (its name, and the open file whose lock
    /// says this process lives); None when it could not be made (the
    /// claims then carry no owner and go stale by age only).
    owner: Option<Arc<Owner>>,
}

/// This process's owner file: locked while open, removed when the last
/// claim set of the process is dropped.
#[derive(Debug)]
struct Owner {
    name: String,
    path: PathBuf,
    /// Held open for the lock.
    _file: File,
}

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        ours().remove(&self.name);
    }
}

/// The owner names of this process's claim sets: never probed (a second
/// open of one's own file conflicts with its lock on a local file system,
/// but where `flock` is emulated, the probe would take the lock and remove
/// the file). Removed when the set's owner is dropped.
fn ours() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<String>> {
    static OURS: std::sync::OnceLock<std::sync::Mutex<std::collections::BTreeSet<String>>> =
        std::sync::OnceLock::new();
    let m = OURS.get_or_init(Default::default);
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Makes this process's owner file and locks it. The file is made and
/// locked under a name the clean-up skips (a sibling opening the
/// directory meanwhile would find it unlocked and remove it), then
/// renamed into place, locked.
fn own(owners: &Path) -> Option<Arc<Owner>> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    std::fs::create_dir_all(owners).ok()?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("{}-{nanos:x}-{n}", std::process::id());
    let new = owners.join(format!(".new-{name}"));
    let path = owners.join(&name);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&new)
        .ok()?;
    if !try_lock(&f) || std::fs::rename(&new, &path).is_err() {
        let _ = std::fs::remove_file(&new);
        return None;
    }
    ours().insert(name.clone());
    Some(Arc::new(Owner {
        name,
        path,
        _file: f,
    }))
}

/// Takes an exclusive `flock` on `f` without waiting: true when taken
/// (held until `f` is closed, or its process ends).
fn try_lock(f: &File) -> bool {
    use std::os::fd::AsRawFd as _;
    // SAFETY: `f` is an open file for the whole call; flock reads nothing
    // but the descriptor and the flags.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Whether the owner file `name` under `owners` is gone or unlocked: its
/// process ended. An owner file found so is removed. This process's own
/// owners are live without a look.
fn owner_dead(owners: &Path, name: &str) -> bool {
    if ours().contains(name) {
        return false;
    }
    let path = owners.join(name);
    let f = match File::open(&path) {
        Ok(f) => f,
        Err(e) => return e.kind() == std::io::ErrorKind::NotFound,
    };
    // Held: its process lives. Any other trouble: not known dead.
    let dead = try_lock(&f);
    if dead {
        let _ = std::fs::remove_file(&path);
    }
    dead
}

/// Whether a file of metadata `meta` was last written more than [`STALE`] ago.
fn old(meta: std::io::Result<std::fs::Metadata>) -> bool {
    meta.and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > STALE)
}

/// An owner's name as a claim file holds it (a file name, nothing else).
fn owner_of(content: &[u8]) -> Option<&str> {
    let name = std::str::from_utf8(content).ok()?;
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    ok.then_some(name)
}

/// What [`PushClaims::if_stale`] found.
enum Locked<R> {
    /// Stale, and acted on: what the action returned.
    Stale(R),
    /// Live (or not known to be dead, or a sibling is acting on it).
    Live,
    /// No claim is there any more (or another one is).
    Gone,
}

/// A claim held by this process, removed when dropped.
#[derive(Debug)]
pub(crate) struct Claim(Option<(PathBuf, FileId)>);

/// A file's device and inode: which file a path names now.
type FileId = (u64, u64);

fn file_id(m: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt as _;
    (m.dev(), m.ino())
}

impl Drop for Claim {
    fn drop(&mut self) {
        // Only the claim this process made or took: one a sibling took
        // over since (stale by age, its owner alive) is the sibling's.
        if let Some((p, id)) = self.0.take() {
            if std::fs::metadata(&p).is_ok_and(|m| file_id(&m) == id) {
                let _ = std::fs::remove_file(p);
            }
        }
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
        let dir = l1_dir.join(job).join("tmp").join("push-claims");
        let owner = own(&dir.join(OWNERS));
        let c = PushClaims { dir, owner };
        c.clear_stale();
        c
    }

    /// Removes the claims and owner files crashed ranks left behind.
    fn clear_stale(&self) {
        let Ok(peers) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for p in peers.flatten() {
            if p.file_name() == OWNERS {
                continue;
            }
            for f in std::fs::read_dir(p.path()).into_iter().flatten().flatten() {
                let path = f.path();
                // Removed under its lock: never a claim a sibling just took over.
                self.if_stale(&path, |_| {
                    let _ = std::fs::remove_file(&path);
                });
            }
        }
        let owners = self.dir.join(OWNERS);
        for f in std::fs::read_dir(&owners).into_iter().flatten().flatten() {
            let Some(name) = f.file_name().to_str().map(String::from) else {
                continue;
            };
            if !name.starts_with(".new-") {
                owner_dead(&owners, &name);
            } else if old(f.metadata()) {
                // Its maker died before the rename (a live one renames it
                // within microseconds).
                let _ = std::fs::remove_file(f.path());
            }
        }
    }

    fn path(&self, peer: &str, id: &ChunkId) -> PathBuf {
        self.dir.join(segment(peer)).join(id.to_hex())
    }

    /// Claims `id` for the push to `peer`: a guard if this process is to
    /// send it, None if a sibling claimed it. Any trouble with the
    /// directory means "send it yourself" (at worst, sent twice).
    pub(crate) fn claim(&self, peer: &str, id: &ChunkId) -> Option<Claim> {
        let path = self.path(peer, id);
        if let Some(d) = path.parent() {
            if std::fs::create_dir_all(d).is_err() {
                return Some(Claim(None));
            }
        }
        for _ in 0..2 {
            match self.create_whole(&path) {
                Ok(f) => {
                    return match f.metadata() {
                        Ok(m) => Some(Claim(Some((path, file_id(&m))))),
                        Err(_) => {
                            let _ = std::fs::remove_file(&path);
                            Some(Claim(None))
                        }
                    };
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // A crashed sibling's: take it over, in place, so that
                    // of siblings finding it stale at once one takes it
                    // (removing it and creating it anew let a second one
                    // remove the first one's new claim, and both sent).
                    let took = |f: &File| {
                        let id = f.metadata().ok().filter(|_| self.name_in(f));
                        if id.is_none() {
                            // Never left half made (live by its new age).
                            let _ = std::fs::remove_file(&path);
                        }
                        id.map(|m| file_id(&m))
                    };
                    match self.if_stale(&path, took) {
                        Locked::Stale(Some(id)) => return Some(Claim(Some((path, id)))),
                        Locked::Stale(None) => return Some(Claim(None)),
                        Locked::Live => return None,
                        // Released meanwhile: create it again.
                        Locked::Gone => {}
                    }
                }
                Err(_) => return Some(Claim(None)),
            }
        }
        Some(Claim(None))
    }

    /// Creates the claim at `path` with its owner's name in it, or fails
    /// with `AlreadyExists` if a claim is there. The claim appears whole:
    /// the name is written under a name of its own first (`.new-…`, beside
    /// it), which then takes the claim's name as a hard link, made only
    /// where no file has that name. Created empty and named after, a claim
    /// of a rank killed in between was empty (no owner: live by its age
    /// for [`STALE`]), and its siblings waited [`SIBLING_WAIT`] for the
    /// chunk. A `.new-` file a killed rank leaves names its dead owner and
    /// goes at the next clean-up (a checkpointer opening the directory);
    /// one it left before the name was written is empty and goes once
    /// older than [`STALE`].
    ///
    /// [`SIBLING_WAIT`]: crate::tiers::copy
    fn create_whole(&self, path: &Path) -> std::io::Result<File> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let name = self.owner.as_ref().map_or("", |o| o.name.as_str());
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_file_name(format!(".new-{}-{name}-{n}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        let made = {
            use std::io::Write as _;
            f.write_all(name.as_bytes())
        };
        #[cfg(test)]
        tests::stall_if_asked();
        let linked = made.and_then(|()| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        linked.map(|()| f)
    }

    /// Whether the claim at `path` is a dead process's (its owner's lock
    /// is gone) or older than [`STALE`]. A claim that vanished meanwhile is
    /// not stale (there is nothing to take over).
    fn is_stale(&self, path: &Path) -> bool {
        File::open(path).is_ok_and(|f| self.stale(&f))
    }

    /// Whether the open claim `f` is stale (as [`PushClaims::is_stale`]).
    fn stale(&self, f: &File) -> bool {
        if old(f.metadata()) {
            return true;
        }
        // A claim is a few bytes: read it whole, never more than that.
        let mut content = Vec::new();
        let read = {
            use std::io::Read as _;
            f.take(128).read_to_end(&mut content)
        };
        read.is_ok()
            && owner_of(&content).is_some_and(|name| owner_dead(&self.dir.join(OWNERS), name))
    }

    /// Runs `then` on the claim at `path` if it is stale, holding an
    /// exclusive `flock` on the claim file itself, and only while that
    /// file is still the one at `path`: of the siblings that find a claim
    /// stale at once, one acts on it and the others then find it live (or
    /// gone). A claim a sibling is acting on is live.
    fn if_stale<R>(&self, path: &Path, then: impl FnOnce(&File) -> R) -> Locked<R> {
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Locked::Gone,
            Err(_) => return Locked::Live,
        };
        if !try_lock(&f) {
            return Locked::Live;
        }
        let same = match (f.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => file_id(&a) == file_id(&b),
            (_, Err(e)) if e.kind() == std::io::ErrorKind::NotFound => return Locked::Gone,
            _ => return Locked::Live,
        };
        if !same {
            return Locked::Gone;
        }
        if self.stale(&f) {
            Locked::Stale(then(&f))
        } else {
            Locked::Live
        }
        // The lock goes with `f`.
    }

    /// Makes the open claim `f` this process's: its owner's name in place
    /// of the dead one's (and a new age). False when it could not.
    fn name_in(&self, f: &File) -> bool {
        use std::os::unix::fs::FileExt as _;
        let name = self.owner.as_ref().map_or(&b""[..], |o| o.name.as_bytes());
        // The truncation and the write give it a new age; setting it again
        // covers a write of nothing (no owner), and may be refused (a file
        // of another user's) without harm.
        let ok = f.set_len(0).is_ok() && f.write_all_at(name, 0).is_ok();
        let _ = f.set_modified(std::time::SystemTime::now());
        ok
    }

    /// Whether a sibling's claim of `id` for `peer` is live.
    pub(crate) fn held(&self, peer: &str, id: &ChunkId) -> bool {
        let p = self.path(peer, id);
        p.exists() && !self.is_stale(&p)
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

    #[test]
    fn one_claimant_per_chunk_and_peer_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let c = PushClaims::new(dir.path(), "j");
        let id = ChunkId::of(b"x");
        let first = c.claim("node-b", &id).expect("first claims");
        assert!(
            c.claim("node-b", &id).is_none(),
            "a sibling finds it claimed"
        );
        assert!(c.held("node-b", &id));
        assert!(
            c.claim("node/c", &id).is_some(),
            "another peer is another claim"
        );
        drop(first);
        assert!(!c.held("node-b", &id));
        assert!(c.claim("node-b", &id).is_some());
        assert_eq!(segment("a/b c"), "a%2fb%20c");
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

    /// In a child started by the test below (which names a directory in
    /// `STRATA_TEST_PUSH_CLAIM_STALL`): says it is inside a claim, between
    /// its making and its taking the claim's name (where the code before
    /// had left an empty claim), and waits there to be killed. Elsewhere:
    /// nothing.
    pub(super) fn stall_if_asked() {
        if let Ok(dir) = std::env::var("STRATA_TEST_PUSH_CLAIM_STALL") {
            let _ = std::fs::write(PathBuf::from(dir).join("stalling"), b"");
            std::thread::sleep(Duration::from_secs(120));
        }
    }

    /// The child side of the test below: stalls inside a claim.
    #[test]
    fn child_stalling_in_a_claim() {
        let Ok(dir) = std::env::var("STRATA_TEST_PUSH_CLAIM_STALL") else {
            return; // only runs as the child of the test below
        };
        let c = PushClaims::new(&PathBuf::from(dir), "j");
        let _ = c.claim("node-b", &ChunkId::of(b"y"));
    }

    /// A rank killed while it makes a claim (the claim half made) leaves
    /// nothing its siblings wait on: they claim the chunk at once. A claim
    /// created empty and named after let such a kill leave an empty claim,
    /// live by its age for ten minutes: every sibling waited a minute for
    /// the chunk (`SIBLING_WAIT`) before it sent it itself.
    #[test]
    fn a_rank_killed_while_it_makes_a_claim_leaves_none_its_siblings_wait_on() {
        let dir = tempfile::tempdir().unwrap();
        let child = Child::at(
            "child_stalling_in_a_claim",
            "STRATA_TEST_PUSH_CLAIM_STALL",
            dir.path(),
            "stalling",
        );
        child.kill(); // inside the claim
        let me = PushClaims::new(dir.path(), "j");
        let id = ChunkId::of(b"y");
        assert!(!me.held("node-b", &id), "nothing to wait on");
        assert!(me.claim("node-b", &id).is_some(), "claimed at once");
        // What the killed child left under its own name names its dead
        // owner: the clean-up of `me` removed it.
        let left: Vec<_> = std::fs::read_dir(dir.path().join("j/tmp/push-claims/node-b"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".new-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    /// The child side of the test below: claims a chunk for a peer, says
    /// so, then waits to be killed.
    #[test]
    fn child_holding_a_claim() {
        let Ok(dir) = std::env::var("STRATA_TEST_PUSH_CLAIM_CHILD") else {
            return; // only runs as the child of the test below
        };
        let dir = PathBuf::from(dir);
        let c = PushClaims::new(&dir, "j");
        let claim = c.claim("node-b", &ChunkId::of(b"x"));
        assert!(claim.is_some());
        std::fs::write(dir.join("claimed"), b"").unwrap();
        std::thread::sleep(Duration::from_secs(120));
        drop(claim);
    }

    /// A rank killed while it sends a chunk it claimed leaves the claim
    /// file behind: its siblings find it dead at once (not after
    /// [`STALE`]) and send the chunk themselves; its owner file goes when
    /// the next checkpointer opens the directory.
    #[test]
    fn a_claim_of_a_process_killed_with_sigkill_is_taken_over_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let child = Child::at(
            "child_holding_a_claim",
            "STRATA_TEST_PUSH_CLAIM_CHILD",
            dir.path(),
            "claimed",
        );
        let me = PushClaims::new(dir.path(), "j");
        let id = ChunkId::of(b"x");
        assert!(me.held("node-b", &id), "a live sibling's claim is held");
        assert!(me.claim("node-b", &id).is_none());
        child.kill(); // no clean-up of its own
        assert!(!me.held("node-b", &id), "a killed sibling's claim is stale");
        let taken = me.claim("node-b", &id).expect("taken over");
        // Now this process's: held for a sibling, released when dropped.
        let other = PushClaims::new(dir.path(), "j");
        assert!(other.held("node-b", &id));
        drop(taken);
        assert!(!other.held("node-b", &id));
        // Only the live processes' owner files are left.
        let owners_dir = dir.path().join("j/tmp/push-claims").join(OWNERS);
        let owners = || std::fs::read_dir(&owners_dir).unwrap().count();
        assert_eq!(owners(), 2, "this test's two claim sets");
        // A process whose claims are dropped (it ends cleanly) removes its own.
        drop(other);
        assert_eq!(owners(), 1);
    }

    /// Siblings that find one dead process's claim at once: exactly one
    /// takes it over (and sends the chunk), every time. (Removing the claim
    /// and creating it anew let a second sibling, which had found it stale
    /// too, remove the first one's new claim, and both sent.)
    #[test]
    fn of_siblings_finding_a_stale_claim_at_once_one_takes_it_over() {
        let dir = tempfile::tempdir().unwrap();
        let siblings: Vec<PushClaims> = (0..6).map(|_| PushClaims::new(dir.path(), "j")).collect();
        let barrier = std::sync::Barrier::new(siblings.len());
        let mut twice = Vec::new();
        for trial in 0..300u32 {
            let id = ChunkId::of(&trial.to_le_bytes());
            let path = siblings[0].path("node-b", &id);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            // The claim of a process that died (its owner file is gone).
            std::fs::write(&path, b"123-dead").unwrap();
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
                twice.push((trial, taken));
            }
            // Every claim was released: none is left behind.
            assert!(!path.exists(), "trial {trial}");
        }
        assert!(
            twice.is_empty(),
            "(trial, siblings that took it): {twice:?}"
        );
    }

    #[test]
    fn a_claim_without_an_owner_is_stale_by_age_only_and_bad_owners_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let c = PushClaims::new(dir.path(), "j");
        let id = ChunkId::of(b"y");
        let path = c.path("node-b", &id);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // An older build's empty claim, and hostile contents: live until
        // STALE, never read beyond a few bytes, never a path.
        for content in [&b""[..], b"../../etc/passwd", &[0xff; 4096]] {
            std::fs::write(&path, content).unwrap();
            assert!(c.held("node-b", &id), "{content:?}");
            assert!(c.claim("node-b", &id).is_none());
        }
        // An owner that never existed (its file gone): dead.
        std::fs::write(&path, b"123-abc").unwrap();
        assert!(!c.held("node-b", &id));
        assert!(owner_of(b"a/b").is_none() && owner_of(b"12-ab").is_some());
        // The clean-up on open removes a dead owner's file, never one
        // being made, nor a live one.
        let owners = dir.path().join("j/tmp/push-claims").join(OWNERS);
        std::fs::write(owners.join("1-dead-0"), b"").unwrap();
        std::fs::write(owners.join(".new-2-young-0"), b"").unwrap();
        let _next = PushClaims::new(dir.path(), "j");
        let mut left: Vec<String> = std::fs::read_dir(&owners)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left.len(), 3, "{left:?}");
        assert_eq!(left[0], ".new-2-young-0", "{left:?}");
        assert!(!left.contains(&"1-dead-0".to_string()), "{left:?}");
    }
}
