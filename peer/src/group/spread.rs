//! The R-copy policy of a step's push: the first `R` members at once; each
//! one that fails replaced by the next member of the ring, a round at a
//! time, until `R` hold it or the ring is exhausted.

use super::{Member, PeerGroup};

/// How a push over the group went.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spread {
    /// The members that took it, in the order they were tried, with what
    /// the push to each reported (bytes written).
    pub holders: Vec<(String, u64)>,
    /// Copies wanted.
    pub wanted: usize,
    /// Why each other member tried did not take it (`node: error`), and a
    /// ring too small for `wanted` copies.
    pub errors: Vec<String>,
}

impl Spread {
    /// Fewer members hold it than wanted.
    pub fn is_degraded(&self) -> bool {
        self.holders.len() < self.wanted
    }

    /// The names of the members holding it.
    pub fn nodes(&self) -> Vec<String> {
        self.holders.iter().map(|(n, _)| n.clone()).collect()
    }
}

impl PeerGroup {
    /// Puts one thing (a rank's shard of a step) on `R` members: `push`
    /// copies it to one member and returns what it reports (bytes
    /// written). The first `R` members are pushed to at once, each on a
    /// thread of its own (a push may block); a member that fails is
    /// replaced by the next one of the ring. Never fails: a push that
    /// reaches fewer than `R` members is [`Spread::is_degraded`]. It
    /// blocks until every push ended: call it from a thread of its own,
    /// never from async code (a push typically drives a runtime itself).
    pub fn spread<E: std::fmt::Display>(
        &self,
        push: impl Fn(&Member) -> Result<u64, E> + Sync,
    ) -> Spread {
        let wanted = self.replicas;
        let mut out = Spread {
            wanted,
            ..Spread::default()
        };
        let mut next = 0;
        while out.holders.len() < wanted && next < self.members.len() {
            let round: Vec<&Member> = self.members[next..]
                .iter()
                .take(wanted - out.holders.len())
                .collect();
            next += round.len();
            let push = &push;
            let results: Vec<Result<u64, String>> = std::thread::scope(|sc| {
                let handles: Vec<_> = round
                    .iter()
                    .map(|m| sc.spawn(move || push(m).map_err(|e| e.to_string())))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err("the save pipeline stopped: a push thread panicked".to_string())
                        })
                    })
                    .collect()
            });
            for (m, r) in round.iter().zip(results) {
                match r {
                    Ok(n) => out.holders.push((m.node.clone(), n)),
                    Err(e) => out.errors.push(format!("{}: {e}", m.node)),
                }
            }
        }
        if out.is_degraded() && self.members.len() < wanted {
            out.errors.push(format!(
                "{wanted} replicas wanted but the ring has {} other nodes",
                self.members.len()
            ));
        }
        out
    }
}
