//! The decider's copy of the job's claims, kept between rounds. Each round
//! the decider reads the claims with the round's values, at one revision;
//! with this copy it asks etcd only for the claims written since the
//! copy's revision, and how many claims there are in all. At 16,384 ranks
//! that is a few keys instead of 16,384 (a claim changes when a process
//! starts, exits or dies, not every round), which etcd no longer reads out,
//! encodes to JSON and sends each round, nor this process decodes.
//!
//! A read of the newer claims brings every claim created or rewritten
//! since; a claim deleted since (its lease ran out) is not brought, but
//! the count shows it: when the copy, plus the claims it lacked, is more
//! than etcd holds, a claim went and the caller reads them all again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::api::{until_answered, KeyRange, Kv};
use super::{poisoned, EtcdCoordinator};
use crate::error::{Error, Result};

impl EtcdCoordinator {
    /// The decider's read of a round: the keys of `values` and every claim
    /// of `members`, at one revision (returned too). Asks only for the
    /// claims written since its last read, and for all of them when one
    /// went since (retried until `deadline`, as every round's read).
    pub(super) async fn values_and_claims(
        &self,
        values: KeyRange<'_>,
        members: KeyRange<'_>,
        deadline: Instant,
    ) -> Result<(Vec<Kv>, Vec<Kv>, i64)> {
        let t = self.opts.request_timeout;
        loop {
            let copy = self.members.lock().map_err(poisoned)?.clone();
            let (got, newer, count, rev) = until_answered(
                deadline,
                || self.check_lost(),
                || async {
                    self.round_api()
                        .ranges_and_newer(&[values], (members, copy.since()), t)
                        .await
                },
            )
            .await?;
            let mut cur = self.members.lock().map_err(poisoned)?;
            match copy.advance(newer, count, rev) {
                Some(now) => {
                    let claims = now.claims();
                    // Two rounds at once: the newer read stays.
                    if now.rev() > cur.rev() {
                        *cur = now;
                    }
                    return Ok((got.into_iter().next().unwrap_or_default(), claims, rev));
                }
                None if copy.since() == 0 => return Err(Error::Coordination(
                    "etcd: a read of the claims does not add up (another build, or not Strata's?)"
                        .into(),
                )),
                // A claim went: read them all (unless a round beside this
                // one has read since).
                None if cur.rev() <= copy.rev() => *cur = Members::default(),
                None => {}
            }
        }
    }
}

/// The claims at one revision (0: none read yet).
#[derive(Clone, Default)]
pub(super) struct Members {
    rev: i64,
    by_key: Arc<BTreeMap<Vec<u8>, Kv>>,
    /// Reads of newer claims since every claim was read.
    since_full: u32,
}

/// Every this many rounds the decider reads every claim again, whatever
/// the count says: an etcd restored from an older snapshot that has since
/// passed the copy's revision could hold claims rewritten at revisions the
/// copy already counts as seen.
const FULL_EVERY: u32 = 64;

impl Members {
    /// The lowest revision of the claims to ask for (`min_mod_revision`):
    /// 0, every claim, while nothing was read.
    pub(super) fn since(&self) -> i64 {
        if self.rev == 0 || self.since_full >= FULL_EVERY {
            0
        } else {
            self.rev + 1
        }
    }

    /// The claims at `rev`, from this copy and a read at `rev` of the
    /// claims written from `self.since()` on (`newer`) and how many claims
    /// there are in all (`count`). `None`: a claim went since (or the
    /// read does not add up): read them all (a copy of `Members::default()`).
    pub(super) fn advance(&self, newer: Vec<Kv>, count: i64, rev: i64) -> Option<Members> {
        if rev < self.rev {
            return None;
        }
        let full = self.since() == 0;
        let mut by_key = if full {
            Arc::new(BTreeMap::new())
        } else {
            self.by_key.clone()
        };
        if !newer.is_empty() {
            let m = Arc::make_mut(&mut by_key);
            for kv in newer {
                m.insert(kv.key.clone(), kv);
            }
        }
        // Every claim of the copy that still exists, and every newer one:
        // anything short of `count` is impossible, anything over it a claim
        // deleted since the copy's revision.
        if i64::try_from(by_key.len()).ok()? != count {
            return None;
        }
        Some(Members {
            rev,
            by_key,
            since_full: if full { 0 } else { self.since_full + 1 },
        })
    }

    /// The claims, in key order (as a range read returns them).
    pub(super) fn claims(&self) -> Vec<Kv> {
        self.by_key.values().cloned().collect()
    }

    /// The revision of the copy.
    pub(super) fn rev(&self) -> i64 {
        self.rev
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(k: &str, v: &str, rev: i64) -> Kv {
        Kv {
            key: k.as_bytes().to_vec(),
            value: v.as_bytes().to_vec(),
            create_revision: rev,
            mod_revision: rev,
        }
    }

    #[test]
    fn newer_claims_replace_and_add_and_a_missing_one_asks_for_all() {
        let m = Members::default();
        assert_eq!(m.since(), 0);
        let m = m
            .advance(vec![kv("a", "1", 5), kv("b", "1", 6)], 2, 10)
            .expect("a first full read");
        assert_eq!(m.since(), 11);
        // b rewritten, c new, a unchanged.
        let n = m
            .advance(vec![kv("b", "2", 12), kv("c", "1", 13)], 3, 14)
            .expect("nothing went");
        let got: Vec<(Vec<u8>, Vec<u8>)> =
            n.claims().into_iter().map(|k| (k.key, k.value)).collect();
        assert_eq!(
            got,
            vec![
                (b"a".to_vec(), b"1".to_vec()),
                (b"b".to_vec(), b"2".to_vec()),
                (b"c".to_vec(), b"1".to_vec())
            ]
        );
        // a deleted since, c new: the count (2) is one short of the copy's 3.
        assert!(n.advance(vec![], 2, 20).is_none());
        assert!(m.advance(vec![kv("c", "1", 13)], 2, 14).is_none());
        // An older read than the copy is not folded in.
        assert!(n.advance(vec![], 3, 13).is_none());
        // The copy itself is unchanged by a failed advance.
        assert_eq!(n.claims().len(), 3);
        assert_eq!(n.rev(), 14);
        // Every FULL_EVERY rounds every claim is read again (`n` is one
        // round past a full read), and what the copy held is not kept: a
        // full read replaces it.
        let mut c = n;
        for r in 1..FULL_EVERY {
            assert_ne!(c.since(), 0, "round {r}");
            c = c
                .advance(vec![], 3, 15 + i64::from(r))
                .expect("nothing went");
        }
        assert_eq!(c.since(), 0);
        let full = c
            .advance(vec![kv("a", "9", 90)], 1, 100)
            .expect("a full read");
        assert_eq!(full.claims().len(), 1);
        assert_eq!(full.claims()[0].value, b"9".to_vec());
        assert_ne!(full.since(), 0);
    }
}
