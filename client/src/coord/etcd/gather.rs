//! The all-gather round: every rank puts its value and reads every
//! rank's (only the value of the process holding each rank counts).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::api::until_answered;
use super::claims::rank_in;
use super::{escape, poisoned, EtcdCoordinator};
use crate::error::{Error, Result};

impl EtcdCoordinator {
    pub(super) async fn gather(
        &self,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        let t = self.opts.request_timeout;
        let attempt = {
            let mut st = self.state.lock().map_err(poisoned)?;
            let n = st.attempts.entry(key.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        let round = match &self.opts.incarnation {
            Some(i) => format!(
                "{}/rounds/{}/{}@{attempt}/",
                self.root,
                escape(i),
                escape(key)
            ),
            None => format!("{}/rounds/{}@{attempt}/", self.root, escape(key)),
        };
        let mine = format!("{round}{:08}/{}", self.rank, self.instance).into_bytes();
        if let Err(e) = self.api.put(&mine, &value, self.rounds_lease, t).await {
            // The put may have reached etcd though this client saw an
            // error: take the value back, so no rank counts a vote this
            // rank reports as failed.
            if let Err(d) = self.api.delete(&mine, t).await {
                tracing::warn!(error = %d, "could not take back a round's value after a failed put");
            }
            return Err(e);
        }
        let r = self.gather_round(key, &round, &mine, timeout).await;
        if r.is_err() {
            // A failed round's value goes at once: no late rank counts it.
            let _ = self.api.delete(&mine, t).await;
        }
        r
    }

    async fn gather_round(
        &self,
        key: &str,
        round: &str,
        mine: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        let t = self.opts.request_timeout;
        let members = format!("{}/ranks/", self.root);
        let deadline = Instant::now() + timeout;
        loop {
            // The round and the claims at one revision (a transient etcd
            // error is retried until the deadline).
            let (values, claims, rev) = until_answered(
                deadline,
                || self.check_lost(),
                || async {
                    self.api
                        .range_two(round.as_bytes(), members.as_bytes(), t)
                        .await
                },
            )
            .await?;
            let holder = self.holders(&claims);
            // Seen live whether or not every value is there now: if its claim
            // goes before a later round, that rank left.
            self.note_live(&holder)?;
            // Fencing: only the current holder of this rank completes a
            // round. A process whose lease lapsed (a partition, SIGSTOP)
            // and whose rank another process took would otherwise count
            // its replacement's value as its own and go on to commit.
            let held = holder
                .get(&self.rank)
                .is_some_and(|c| c.instance == self.instance && c.mod_revision == self.claimed_at);
            if !held {
                let e = Error::RankClaimed {
                    job: self.root.rsplit('/').next().unwrap_or_default().to_string(),
                    rank: self.rank,
                    other: format!(
                        "this process no longer holds its claim (its lease lapsed or another process took the rank): {}",
                        holder
                            .get(&self.rank)
                            .map_or("nobody holds it now".to_string(), |c| format!("held by instance {}", c.instance))
                    ),
                };
                if let Ok(mut st) = self.state.lock() {
                    st.lost.get_or_insert(e.clone());
                }
                return Err(e);
            }
            let mut got: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
            for kv in values {
                let Some(rest) = kv.key.strip_prefix(round.as_bytes()) else {
                    continue;
                };
                let Some(r) = rank_in(rest) else { continue };
                if r >= self.world {
                    return Err(Error::Coordination(format!(
                        "{key}: a value of rank {r} in a world of {} (another job with the same id and another world size?)",
                        self.world
                    )));
                }
                let instance = rest.rsplit(|&b| b == b'/').next().unwrap_or_default();
                // Only the holder's value counts (not an earlier
                // incarnation's under the same key).
                if holder
                    .get(&r)
                    .is_some_and(|h| h.instance.as_bytes() == instance)
                {
                    got.insert(r, kv.value);
                }
            }
            if got.len() == self.world as usize {
                let last = {
                    let mut st = self.state.lock().map_err(poisoned)?;
                    st.last_round.replace(mine.to_vec())
                };
                // Every rank has put this round, so every rank is done
                // reading the previous one: this rank's value of it goes.
                if let Some(old) = last.filter(|o| o.as_slice() != mine) {
                    if let Err(e) = self.api.delete(&old, t).await {
                        tracing::warn!(error = %e, "could not delete an old round's key");
                    }
                }
                return Ok(got.into_values().collect());
            }
            let missing: Vec<u32> = (0..self.world).filter(|r| !got.contains_key(r)).collect();
            if missing.iter().any(|r| !holder.contains_key(r)) {
                // Gone already, or never came: the history tells.
                self.replay_claims(rev, deadline).await?;
            }
            if let Some(e) = self.left(key, &holder, &missing, got.len())? {
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                let never: Vec<u32> = missing
                    .iter()
                    .copied()
                    .filter(|r| !holder.contains_key(r))
                    .collect();
                return Err(Error::Coordination(format!(
                    "{key}: only {} of {} ranks reported within {timeout:?}; missing {missing:?} (of which never connected or gone: {never:?})",
                    got.len(),
                    self.world
                )));
            }
            // Wait for the round to change (or re-check the claims).
            let wait = (deadline - now).min(self.opts.lease_ttl / 2);
            if let Err(e) = self.api.watch_prefix(round.as_bytes(), rev, wait).await {
                tracing::warn!(error = %e, "etcd watch failed; reading again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
