//! L2 as one tier: a [`PeerGroup`] is the ring of peer services a rank
//! replicates to, seen as one [`ChunkStore`] (`store.rs`), and the policy
//! that puts a step on `R` of them (`spread.rs`).
//!
//! What the group owns, so that no caller writes it again:
//!
//! * **placement** over its members, given in ring order for this rank
//!   (what [`crate::ring::placement`] computes; the client's stack opens
//!   them so): the first `R` are the targets, the rest the fallbacks, tried
//!   in order when a target fails;
//! * **R copies**: a write goes to the first `R` members that take it; a
//!   step's push ([`PeerGroup::spread`]) replaces each failed member by the
//!   next one of the ring, all of a round at once;
//! * **degraded**: a push that reaches fewer than `R` members says so
//!   ([`Spread::is_degraded`]), with each failure, and never fails the
//!   save; the caller pushes a degraded step again later (nothing a member
//!   already holds is sent twice: pushes send what each member lacks);
//! * **reads**: from the first member holding a good copy, chunk by chunk,
//!   so one damaged or missing copy is read from another member.
//!
//! Another implementation of the same idea (erasure-coded L2: `k` data and
//! `m` parity pieces over the ring) would replace `store.rs` and `spread`,
//! and keep this interface.

use std::sync::Arc;

use strata_tiered::ChunkStore;

mod spread;
mod store;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

pub use spread::Spread;

/// One peer of the group: the node's name and its store (a
/// [`crate::PeerStore`] in a job; any [`ChunkStore`] in tests).
#[derive(Clone, Debug)]
pub struct Member {
    /// The node's name, as the ring knows it.
    pub node: String,
    /// Its chunk store.
    pub store: Arc<dyn ChunkStore>,
}

/// The peers of one rank as one tier: members in ring order, `replicas`
/// copies wanted of everything written.
#[derive(Clone, Debug)]
pub struct PeerGroup {
    members: Vec<Member>,
    replicas: usize,
    name: String,
}

impl PeerGroup {
    /// A group over `members`, preferred first (ring order), keeping
    /// `replicas` copies. Members named twice are kept once (the first).
    pub fn new(members: Vec<Member>, replicas: usize) -> Self {
        let mut seen = std::collections::HashSet::new();
        let members: Vec<Member> = members
            .into_iter()
            .filter(|m| seen.insert(m.node.clone()))
            .collect();
        let name = format!("l2 ({} of {} peers)", replicas, members.len());
        PeerGroup {
            members,
            replicas,
            name,
        }
    }

    /// Every member, preferred first.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Copies wanted of everything written.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Where writes go while every member is up: the first `R` members.
    pub fn targets(&self) -> &[Member] {
        &self.members[..self.replicas.min(self.members.len())]
    }

    /// True when the group has no members (a job on one node).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}
