//! The conformance suite on L2 as one tier: a `PeerGroup` of three members
//! keeping two copies, whole, and with its first member down (the group
//! must hold the whole contract on the members it can reach). The damage
//! checks damage every member's copy: the group reports a chunk damaged
//! only when no member has a good one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use async_trait::async_trait;
use strata_format::ChunkId;
use strata_peer::{Member, PeerGroup};
use strata_tiered::conformance::{Damage, MemoryDamage};
use strata_tiered::{ChunkStore, FaultPlan, FaultStore, MemoryStore};

/// Damages each member's copy; fine where at least one member held it.
struct GroupDamage(Vec<MemoryDamage>);

#[async_trait]
impl Damage for GroupDamage {
    async fn damage_chunk(&self, job: &str, id: &ChunkId) -> Result<(), String> {
        let mut done = 0;
        let mut last = String::new();
        for d in &self.0 {
            match d.damage_chunk(job, id).await {
                Ok(()) => done += 1,
                Err(e) => last = e,
            }
        }
        if done > 0 {
            Ok(())
        } else {
            Err(last)
        }
    }

    async fn damage_record(
        &self,
        job: &str,
        step: u64,
        slot: u32,
        bytes: &[u8],
    ) -> Result<(), String> {
        for d in &self.0 {
            d.damage_record(job, step, slot, bytes).await?;
        }
        Ok(())
    }
}

fn group(down_first: bool) -> (PeerGroup, (), GroupDamage) {
    let mems: Vec<Arc<MemoryStore>> = (0..3).map(|_| Arc::new(MemoryStore::new())).collect();
    let members = mems
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let store: Arc<dyn ChunkStore> = if down_first && i == 0 {
                Arc::new(FaultStore::new(
                    m.clone(),
                    FaultPlan {
                        outage_after: Some(0),
                        ..FaultPlan::default()
                    },
                ))
            } else {
                m.clone()
            };
            Member {
                node: format!("node-{i}"),
                store,
            }
        })
        .collect();
    let damage = GroupDamage(mems.iter().cloned().map(MemoryDamage).collect());
    (PeerGroup::new(members, 2), (), damage)
}

mod whole {
    strata_tiered::conformance_tests!(damage super::group(false));
}

mod first_member_down {
    strata_tiered::conformance_tests!(damage super::group(true));
}
