//! Which rank of a node sends a chunk that several of its ranks hold
//! (identical tensors of data-parallel ranks): the ranks of a node share
//! its L1 directory, and a rank about to push chunk X to peer P first
//! creates `tmp/push-claims/<P>/<X>` there, create-only. The rank that
//! created it sends X and removes the claim once sent; a sibling that finds
//! the claim leaves X to it (the eager push skips it; the push after the
//! commit waits until the peer holds X, and sends it itself if the claim
//! goes away first or grows stale). So identical chunks cross the network
//! once per peer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use strata_format::ChunkId;

use crate::tiers::copy::PushCoordination;

/// A claim older than this is a crashed sibling's: taken over (and removed
/// when a checkpointer opens the directory).
const STALE: Duration = Duration::from_secs(600);

/// The claims of one node's L1 directory for one job.
#[derive(Clone, Debug)]
pub(crate) struct PushClaims {
    dir: PathBuf,
}

/// A claim held by this process, removed when dropped.
#[derive(Debug)]
pub(crate) struct Claim(Option<PathBuf>);

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
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
        let c = PushClaims {
            dir: l1_dir.join(job).join("tmp").join("push-claims"),
        };
        c.clear_stale();
        c
    }

    /// Removes claims crashed ranks left behind.
    fn clear_stale(&self) {
        let Ok(peers) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for p in peers.flatten() {
            for f in std::fs::read_dir(p.path()).into_iter().flatten().flatten() {
                if self.is_stale(&f.path()) {
                    let _ = std::fs::remove_file(f.path());
                }
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
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(_) => return Some(Claim(Some(path))),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if !self.is_stale(&path) {
                        return None;
                    }
                    // A crashed sibling's: take it over.
                    let _ = std::fs::remove_file(&path);
                }
                Err(_) => return Some(Claim(None)),
            }
        }
        Some(Claim(None))
    }

    fn is_stale(&self, path: &Path) -> bool {
        std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE)
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
}
