//! The tiers of a job, as one thing: the ordered [`TierStack`] (fastest
//! first: the node's L1, the peers in ring order, object storage), how it
//! is opened from a [`Config`](crate::Config) ([`open`]), what every tier
//! holds ([`catalog`]: steps, what is committed where, the manifest of a
//! (step, rank) from the fastest good copy), reading any rank's bytes with
//! per-chunk fallback, verification and repair ([`reader`]), and copying a
//! committed shard between tiers ([`copy`]).
//!
//! Restore, the `strata` CLI and the Python package use these and nothing
//! else to list tiers or pick a manifest. This module imports no pipeline
//! of the checkpointer: the save and restore paths import it, not the
//! other way round.

pub mod catalog;
pub mod copy;
pub mod open;
pub mod reader;
pub(crate) mod recycle;

use std::sync::Arc;

use strata_tiered::ChunkStore;

pub use catalog::{Catalog, Held, LoadedShard, ShardFound};
pub use open::Tiers;
pub use reader::{RangeStats, ReadTier, ShardReader, SharedChunkCache, TieredReader};

/// Which kind of tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TierKind {
    /// The node's local disk.
    L1,
    /// A peer service.
    L2,
    /// Object storage.
    L3,
}

/// One tier: a store with the name reports use and its kind.
#[derive(Clone)]
pub struct Tier {
    /// `L1`, `L3`, or `L2:<peer name>`.
    pub name: String,
    /// The kind.
    pub kind: TierKind,
    /// The store.
    pub store: Arc<dyn ChunkStore>,
}

impl Tier {
    /// The node's local tier.
    pub fn l1(store: Arc<dyn ChunkStore>) -> Self {
        Tier {
            name: "L1".into(),
            kind: TierKind::L1,
            store,
        }
    }

    /// The peer service of node `node`.
    pub fn peer(node: &str, store: Arc<dyn ChunkStore>) -> Self {
        Tier {
            name: format!("L2:{node}"),
            kind: TierKind::L2,
            store,
        }
    }

    /// Object storage.
    pub fn l3(store: Arc<dyn ChunkStore>) -> Self {
        Tier {
            name: "L3".into(),
            kind: TierKind::L3,
            store,
        }
    }

    /// The peer's node name (`L2:<node>`), or the tier's name.
    pub fn node(&self) -> &str {
        self.name.strip_prefix("L2:").unwrap_or(&self.name)
    }
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tier({})", self.name)
    }
}

/// The ordered tiers of a job, fastest first: at most one L1, the peers
/// in the order given (a checkpointer's: ring order for its node and rank;
/// the tools' [`Tiers`]: the configured order), at most one L3. The
/// constructors keep that order.
#[derive(Clone, Debug, Default)]
pub struct TierStack {
    tiers: Vec<Tier>,
}

impl TierStack {
    /// A stack of one local store.
    pub fn local(store: Arc<dyn ChunkStore>) -> Self {
        TierStack {
            tiers: vec![Tier::l1(store)],
        }
    }

    /// A stack of these tiers, in their kinds' order (L1, peers in the
    /// order given, L3). Two L1s or two L3s are an error.
    pub fn new(tiers: Vec<Tier>) -> crate::Result<Self> {
        for kind in [TierKind::L1, TierKind::L3] {
            if tiers.iter().filter(|t| t.kind == kind).count() > 1 {
                return Err(crate::Error::Config(format!(
                    "a tier stack holds one {kind:?} at most"
                )));
            }
        }
        let mut tiers = tiers;
        // Stable: the peers keep the order given.
        tiers.sort_by_key(|t| t.kind);
        Ok(TierStack { tiers })
    }

    /// This stack with `peers` (in the order to try them: a checkpointer's
    /// ring order) in place of its peers.
    pub fn with_peers(mut self, peers: Vec<Tier>) -> Self {
        self.tiers.retain(|t| t.kind != TierKind::L2);
        let at = self
            .tiers
            .iter()
            .take_while(|t| t.kind == TierKind::L1)
            .count();
        let peers = peers.into_iter().map(|mut p| {
            p.kind = TierKind::L2;
            p
        });
        self.tiers.splice(at..at, peers);
        self
    }

    /// This stack with `store` (or none) as its object storage.
    pub fn with_remote(mut self, store: Option<Arc<dyn ChunkStore>>) -> Self {
        self.tiers.retain(|t| t.kind != TierKind::L3);
        self.tiers.extend(store.map(Tier::l3));
        self
    }

    /// Every tier, fastest first.
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// The node's local tier, if the stack has one.
    pub fn l1(&self) -> Option<&Tier> {
        self.tiers.first().filter(|t| t.kind == TierKind::L1)
    }

    /// The peers, in the order given.
    pub fn peers(&self) -> &[Tier] {
        let start = self
            .tiers
            .iter()
            .take_while(|t| t.kind == TierKind::L1)
            .count();
        let end = self.tiers.len() - usize::from(self.remote().is_some());
        &self.tiers[start..end]
    }

    /// Object storage, if the stack has it.
    pub fn remote(&self) -> Option<&Tier> {
        self.tiers.last().filter(|t| t.kind == TierKind::L3)
    }

    /// Whether the stack has no tier.
    pub fn is_empty(&self) -> bool {
        self.tiers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_tiered::MemoryStore;

    fn mem() -> Arc<dyn ChunkStore> {
        Arc::new(MemoryStore::new())
    }

    #[test]
    fn the_stack_keeps_fastest_first() {
        let s = TierStack::new(vec![
            Tier::l3(mem()),
            Tier::peer("b", mem()),
            Tier::l1(mem()),
            Tier::peer("a", mem()),
        ])
        .unwrap();
        let names: Vec<&str> = s.tiers().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["L1", "L2:b", "L2:a", "L3"]);
        assert_eq!(s.peers().len(), 2);
        assert_eq!(s.l1().map(|t| t.name.as_str()), Some("L1"));
        assert_eq!(s.remote().map(|t| t.name.as_str()), Some("L3"));
        assert!(TierStack::new(vec![Tier::l1(mem()), Tier::l1(mem())]).is_err());

        let s = TierStack::local(mem())
            .with_remote(Some(mem()))
            .with_peers(vec![Tier::peer("c", mem())]);
        let names: Vec<&str> = s.tiers().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["L1", "L2:c", "L3"]);
        let s = s.with_remote(None).with_peers(Vec::new());
        assert_eq!(s.tiers().len(), 1);
        assert!(s.peers().is_empty() && s.remote().is_none());
        let none = TierStack::default();
        assert!(none.peers().is_empty() && none.l1().is_none());
    }
}
