//! Where a rank's replicas go: a deterministic ring over the node list.
//!
//! Nodes are ordered by name. A rank on node `me` considers the other nodes
//! in ring order starting after `me`, rotated by `rank` (the client passes
//! 0 unless `spread_replicas` is set, so the ranks of a node share their
//! peers; with it, they spread over different peers); the first `R` are
//! its replicas, the rest the fallbacks used in order when one is down.
//! Every process computes the same answer from the same list.

/// The other nodes for `rank` on node `me`, preferred first.
pub fn placement(nodes: &[String], me: &str, rank: u32) -> Vec<String> {
    let mut ring: Vec<&String> = nodes.iter().collect();
    ring.sort();
    ring.dedup();
    let at = ring.iter().position(|n| n.as_str() == me);
    let others: Vec<&String> = match at {
        Some(i) => ring[i + 1..]
            .iter()
            .chain(ring[..i].iter())
            .copied()
            .collect(),
        None => ring.clone(),
    };
    if others.is_empty() {
        return Vec::new();
    }
    let shift = rank as usize % others.len();
    others[shift..]
        .iter()
        .chain(others[..shift].iter())
        .map(|s| s.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    #[test]
    fn placement_skips_me_is_deterministic_and_spreads_ranks() {
        let ns = nodes(4);
        let p = placement(&ns, "node-1", 0);
        assert_eq!(p, vec!["node-2", "node-3", "node-0"]);
        // Any order of the list gives the same answer.
        let mut rev = ns.clone();
        rev.reverse();
        assert_eq!(placement(&rev, "node-1", 0), p);
        // Ranks of one node start at different peers.
        assert_eq!(placement(&ns, "node-1", 1)[0], "node-3");
        assert_eq!(placement(&ns, "node-1", 2)[0], "node-0");
        assert_eq!(placement(&ns, "node-1", 3)[0], "node-2");
        // Never myself; alone, nobody.
        for r in 0..8 {
            assert!(!placement(&ns, "node-2", r).contains(&"node-2".to_string()));
        }
        assert!(placement(&nodes(1), "node-0", 0).is_empty());
        // Every node is some rank-0 replica of another: load spreads.
        let firsts: std::collections::BTreeSet<String> = ns
            .iter()
            .map(|me| placement(&ns, me, 0)[0].clone())
            .collect();
        assert_eq!(firsts.len(), 4);
    }
}
