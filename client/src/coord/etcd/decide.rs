//! The reducing round ([`Coordinator::all_reduce`]): every process puts one
//! value (its ranks' values together), the process holding rank 0 (the
//! decider) gathers them as etcd streams them, runs the reduction once and
//! creates one decision key; every other process waits on that one key.
//! A round costs etcd one request per waiting process (its values; the
//! process's one watch of the job's decisions, kept across rounds, brings
//! the decision) and three for the decider's, and only the decider reads
//! O(world) bytes.
//!
//! Keys, under `<prefix>/<job>/decide/[<start>/]<key>@<attempt>/`:
//! - `v/<first rank>/<instance>`: a process's values (on the rounds'
//!   lease). Only values whose instance holds the ranks they name count.
//!
//! and under `<prefix>/<job>/decided/[<start>/]<key>@<attempt>/` (apart,
//! so that each process's one watch of every decision,
//! [`super::decided`], brings no values):
//! - `<instance>`: the outcome, created once (`[1, payload…]`, or `[0,
//!   message…]` when the round failed: a rank died, the time ran out).
//!   The decider creates it only while no claim and no value changed since
//!   it counted (in the same transaction), and clears its previous round
//!   then: every process had put a value here, so that round's decision
//!   was in etcd before (the watch of each process keeps what it brought
//!   after the deletion: a process in two rounds at once may look later).
//! - `stale-<instance>` (or `stale-*`): put ahead of the
//!   decision in its transaction, for a process whose values did not
//!   count (it lost its claim): that process must not take the decision
//!   its watch brings, and reads it with its own claims instead.
//!
//! [`Coordinator::all_reduce`]: crate::coord::coordinator::Coordinator::all_reduce

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::api::{prefix_end, Event, Kv};
use super::claims::{parse_claim, rank_range, Claim};
use super::decided::Found;
use super::{escape, poisoned, EtcdCoordinator};
use crate::coord::coordinator::Reduce;
use crate::coord::verdict;
use crate::error::{Error, Result};

/// One process's values, by rank.
fn encode_values(values: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut out = (values.len() as u32).to_le_bytes().to_vec();
    for (rank, v) in values {
        out.extend_from_slice(&rank.to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
    }
    out
}

fn decode_values(mut b: &[u8]) -> Option<Vec<(u32, Vec<u8>)>> {
    let mut take = |n: usize| -> Option<&[u8]> {
        let (a, rest) = (b.get(..n)?, b.get(n..)?);
        b = rest;
        Some(a)
    };
    let n = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
    let mut out = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        let rank = u32::from_le_bytes(take(4)?.try_into().ok()?);
        let len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        out.push((rank, take(len)?.to_vec()));
    }
    take(0)?;
    b.is_empty().then_some(out)
}

/// The newest revision a read showed (where a watch starts after).
fn got_rev(a: &[Kv], b: &[Kv]) -> i64 {
    a.iter()
        .chain(b)
        .map(|kv| kv.mod_revision)
        .max()
        .unwrap_or(0)
}

/// Adds the values of a process (`kv`, under `vdir`) that count: those of
/// ranks its instance holds (not an earlier incarnation's under the same
/// key, nor a process's that lost its claim). A process with a value that
/// does not count goes into `stale`. Returns false when the value is
/// malformed.
fn count_values(
    holder: &BTreeMap<u32, Claim>,
    vdir: &[u8],
    kv: &Kv,
    by_rank: &mut BTreeMap<u32, Vec<u8>>,
    stale: &mut BTreeSet<Vec<u8>>,
) -> bool {
    let Some(rest) = kv.key.strip_prefix(vdir) else {
        return true;
    };
    let instance = rest.rsplit(|&b| b == b'/').next().unwrap_or_default();
    let Some(values) = decode_values(&kv.value) else {
        return false;
    };
    for (r, v) in values {
        if holder
            .get(&r)
            .is_some_and(|h| h.instance.as_bytes() == instance)
        {
            by_rank.insert(r, v);
        } else {
            stale.insert(instance.to_vec());
        }
    }
    true
}

/// Under a round's decisions' prefix, the key that tells the process
/// `instance` its values did not count (it no longer holds its ranks): it
/// must not take the decision (`STALE` + instance).
const STALE: &[u8] = b"stale-";

/// Beyond this many processes to mark (a restarted job finds the values
/// its earlier start left under the same keys), one mark, `STALE` + `*`,
/// tells every waiting process to read the decision with its claims
/// instead (a transaction holds at most 128 operations in etcd's default
/// configuration).
const MAX_MARKS: usize = 32;

/// What the decider counted a decision by.
struct Counted<'a> {
    /// The revision of the claims and values it counted by (None: the
    /// round timed out; written whatever they are).
    read_at: Option<i64>,
    /// The round's values (from, to).
    values: (&'a [u8], &'a [u8]),
    /// The processes whose values did not count.
    stale: &'a BTreeSet<Vec<u8>>,
}

/// What a process other than the decider waits on.
pub(super) struct Waiting<'a> {
    /// The round's decisions' prefix (`<root>/decided/…@n/`; each under the
    /// instance of the process that decided).
    pub(super) dprefix: &'a [u8],
    /// The decider's claim.
    pub(super) decider: &'a [u8],
    /// The revision of this process's values.
    pub(super) put_rev: i64,
    /// The mark that says this process's values did not count.
    pub(super) stale: &'a [u8],
    /// The prefix of every process's mark (`{dprefix}stale-`).
    pub(super) marks: &'a [u8],
    /// The mark that says no waiting process may take the decision from
    /// its watch (`{dprefix}stale-*`).
    pub(super) every: &'a [u8],
}

/// What a read shows of the decider and its decision.
enum Decider {
    /// Not there, or a claim of an earlier start or incarnation.
    Absent,
    /// Held (or held until it exited, in this incarnation) by `instance`.
    Held { instance: String, exited: bool },
}

impl EtcdCoordinator {
    /// The etcd client, for one request of a round (counted).
    pub(super) fn round_api(&self) -> &super::api::EtcdApi {
        self.rounds_sent
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.api
    }

    /// One reducing round for this process's ranks (`values`, by rank).
    pub(super) async fn decide(
        &self,
        key: &str,
        values: Vec<(u32, Vec<u8>)>,
        timeout: Duration,
        reduce: &Reduce<'_>,
    ) -> Result<Vec<u8>> {
        let attempt = {
            let mut st = self.state.lock().map_err(poisoned)?;
            let n = st.attempts.entry(format!("decide {key}")).or_insert(0);
            *n += 1;
            *n
        };
        let round = match &self.opts.incarnation {
            Some(i) => format!(
                "{}/decide/{}/{}@{attempt}/",
                self.root,
                escape(i),
                escape(key)
            ),
            None => format!("{}/decide/{}@{attempt}/", self.root, escape(key)),
        };
        if self.rank == 0 {
            self.decide_here(key, &round, values, timeout, reduce).await
        } else {
            self.await_decision(key, &round, values, timeout).await
        }
    }

    /// Whether the claims read show this process still holding each of
    /// its ranks (the claims it made, unchanged); if not, the rank is lost
    /// for good.
    fn fence(&self, claims: &[Kv]) -> Result<()> {
        for (i, rank) in self.ranks().enumerate() {
            let key = format!("{}/ranks/{rank:08}", self.root);
            let c = claims.iter().find(|kv| kv.key == key.as_bytes());
            let held = c.is_some_and(|kv| {
                parse_claim(&kv.value, kv.mod_revision).instance == self.instance
                    && Some(&kv.mod_revision) == self.claims.get(i)
            });
            if !held {
                let e = Error::RankClaimed {
                    job: self.root.rsplit('/').next().unwrap_or_default().to_string(),
                    rank,
                    other: format!(
                        "this process no longer holds its claim (its lease lapsed or another process took the rank): {}",
                        c.map_or("nobody holds it now".to_string(), |kv| format!(
                            "held by instance {}",
                            parse_claim(&kv.value, kv.mod_revision).instance
                        ))
                    ),
                };
                if let Ok(mut st) = self.state.lock() {
                    st.lost.get_or_insert(e.clone());
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// The decider as its claim shows it: an exited claim older than this
    /// process, or one of another start of the job, is an earlier
    /// incarnation's (its decisions are not this round's).
    fn decider_of(&self, claim: Option<&Kv>) -> Decider {
        let Some(kv) = claim else {
            return Decider::Absent;
        };
        let c = parse_claim(&kv.value, kv.mod_revision);
        let older = c.exited && c.mod_revision < self.claimed_at;
        let other_start = self.opts.incarnation.is_some() && c.start != self.start;
        if older || other_start {
            return Decider::Absent;
        }
        Decider::Held {
            instance: c.instance,
            exited: c.exited,
        }
    }

    /// A process other than the decider: put the values (reading the
    /// decisions and the decider's claim in the same request: the round
    /// may have failed already), wait for the decision of the process that
    /// holds rank 0, then read it with this process's claims.
    async fn await_decision(
        &self,
        key: &str,
        round: &str,
        values: Vec<(u32, Vec<u8>)>,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let t = self.opts.request_timeout;
        let deadline = Instant::now() + timeout;
        let mine = format!("{round}v/{:08}/{}", self.rank, self.instance).into_bytes();
        let dprefix = self.decisions_of(round);
        let decider = format!("{}/ranks/{:08}", self.root, 0).into_bytes();
        let marks = [dprefix.as_slice(), STALE].concat();
        let stale = [marks.as_slice(), self.instance.as_bytes()].concat();
        let every = [marks.as_slice(), b"*"].concat();
        let w = Waiting {
            dprefix: &dprefix,
            decider: &decider,
            put_rev: 0,
            stale: &stale,
            marks: &marks,
            every: &every,
        };
        let dend = prefix_end(&dprefix);
        let put = self
            .round_api()
            .put_and_get(
                &mine,
                &encode_values(&values),
                self.rounds_lease,
                &[(&dprefix, &dend), (&decider, &[])],
                t,
            )
            .await;
        let (put_rev, got) = match put {
            Ok(v) => v,
            Err(e) => {
                // It may have reached etcd though this client saw an error.
                let _ = self.round_api().delete(&mine, t).await;
                return Err(e);
            }
        };
        let w = Waiting { put_rev, ..w };
        // One watch brings this process every decision of the job, started
        // at its connect (from its claims: nothing after them is missed);
        // this call starts it only where the connect did not.
        self.decisions
            .follow(&self.api, self.every_decision(), put_rev, t)?;
        let r = self.read_decision(key, &w, got, deadline, timeout).await;
        if r.is_err() {
            // A failed round's value goes at once: no late decider counts it.
            let _ = self.round_api().delete(&mine, t).await;
        }
        r
    }

    /// Looks at a read of the decisions and the decider's claim (`got`),
    /// waits for a change, reads again (with this process's claims), until
    /// the decider's decision is there, the decider is gone, or the time
    /// is up.
    async fn read_decision(
        &self,
        key: &str,
        w: &Waiting<'_>,
        mut got: Vec<Vec<Kv>>,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let t = self.opts.request_timeout;
        let (own_from, own_to) = rank_range(&format!("{}/ranks", self.root), &self.ranks(), "");
        let dend = prefix_end(w.dprefix);
        // Seen in an earlier round counts too: a decider that died between
        // rounds is gone, not late.
        let mut decider_seen = self.state.lock().map_err(poisoned)?.seen.contains(&0);
        let mut fenced = false;
        // Past the first half lease (a long round: a rank is slow), the
        // decision and the decider's claim are followed by watch alone.
        let mut long = false;
        // The revision the newest read answered at: watches start after
        // it. Not the newest key it showed: a deletion (the decider's
        // claim going) leaves no key, and a watch from before it would
        // report it again at once, every time.
        let mut read_at = w.put_rev;
        loop {
            self.check_lost()?;
            let mut parts = got.into_iter();
            let (decisions, claim) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            let decider = self.decider_of(claim.first());
            if let Decider::Held { instance, exited } = &decider {
                // Seen live, whatever this read shows beside it: a process
                // that came first sees the decider's claim for the first
                // time beside its decision, and if the decider goes before
                // the next round, it left (not "never came").
                if !decider_seen && !exited {
                    self.state.lock().map_err(poisoned)?.seen.insert(0);
                    decider_seen = true;
                }
                let dkey = [w.dprefix, instance.as_bytes()].concat();
                if let Some(kv) = decisions.iter().find(|kv| kv.key == dkey) {
                    if !fenced {
                        // This process's claims must still be its own.
                        let (own, _) = self.round_api().range(&own_from, &own_to, t).await?;
                        self.fence(&own)?;
                    }
                    let out = verdict::decode(key, &kv.value)?;
                    if kv.mod_revision < w.put_rev {
                        // Decided before this process's values were
                        // there: it counted a predecessor's, not these.
                        return Err(Error::Coordination(format!(
                            "{key}: the round was decided before this process's values arrived"
                        )));
                    }
                    return Ok(out.to_vec());
                }
                if *exited {
                    return Err(Error::Coordination(format!(
                        "{key}: rank [0] left (it decides the round; its process ended)"
                    )));
                }
            } else if decider_seen {
                return Err(Error::Coordination(format!(
                    "{key}: rank [0] left (it decides the round; its process ended or its lease expired: it or its node died)"
                )));
            }
            if Instant::now() >= deadline {
                return Err(Error::Coordination(format!(
                    "{key}: no decision within {timeout:?} (rank 0 decides once every rank reported{})",
                    if decider_seen { "" } else { "; rank 0 never connected" }
                )));
            }
            // Wait for a decision (or for the decider's claim to change),
            // then read the decisions, this process's claims and the
            // decider's, at one revision.
            let rev = got_rev(&decisions, &claim).max(read_at);
            let left = deadline.saturating_duration_since(Instant::now());
            let watched = Instant::now();
            // The decision as the watch brought it (key, value, revision),
            // unless the decider marked this process's values as not
            // counted first (in the same transaction, ahead of it).
            let mut put = None;
            let followed = if long {
                self.follow_decider(w, rev, left).await
            } else {
                // Most rounds are decided within it: the process's watch
                // of the decisions brings it (no request), or, where that
                // watch missed some (etcd compacted its revisions), a
                // watch of the round's own.
                long = true;
                let wait = left.min(self.opts.lease_ttl / 2);
                let want = match &decider {
                    Decider::Held { instance, .. } => {
                        Some([w.dprefix, instance.as_bytes()].concat())
                    }
                    Decider::Absent => None,
                };
                let want = want.as_deref();
                match self.decisions.wait(w, want, rev, wait).await? {
                    Some(Found::Decision(kv)) => {
                        put = Some(kv);
                        Ok(true)
                    }
                    Some(Found::Marked) => Ok(true),
                    Some(Found::Nothing) => Ok(false),
                    None => {
                        self.round_api()
                            .watch(w.dprefix, rev, wait, |ev| match ev {
                                Event::Put(kv) if kv.key == w.stale || kv.key == w.every => true,
                                // Another process's mark: its business.
                                Event::Put(kv) if kv.key.starts_with(w.marks) => false,
                                Event::Put(kv) => {
                                    put = Some(kv);
                                    true
                                }
                                Event::Delete(..) => false,
                            })
                            .await
                    }
                }
            };
            match followed {
                Err(e) => {
                    // This process lost its ranks: no read brings them back.
                    self.check_lost()?;
                    tracing::warn!(error = %e, "etcd watch failed; reading again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                // Ended at once with nothing (etcd closed it): no storm.
                Ok(false) if watched.elapsed() < Duration::from_millis(50) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(_) => {}
            }
            // The decider's own success, brought by the watch, is the
            // round's: no read after it (one request per round: the
            // values). It counted this process's values (every value of
            // the round before the decision is counted or marked, and a
            // value counts only while its process holds its ranks); the
            // lease, surely not run out since its last renewal, is a
            // second check. A failure, or anything else, is read again
            // with this process's claims (as before).
            if let (
                Some(kv),
                Decider::Held {
                    instance,
                    exited: false,
                },
            ) = (put, &decider)
            {
                let dkey = [w.dprefix, instance.as_bytes()].concat();
                if kv.key == dkey && kv.mod_revision > w.put_rev && self.surely_held()? {
                    if let Ok(out) = verdict::decode(key, &kv.value) {
                        return Ok(out.to_vec());
                    }
                }
            }
            let ranges: [(&[u8], &[u8]); 3] =
                [(w.dprefix, &dend), (w.decider, &[]), (&own_from, &own_to)];
            let mut read = match self.round_api().ranges(&ranges, t).await {
                Ok((v, at)) => {
                    read_at = read_at.max(at);
                    v
                }
                Err(e) if Instant::now() < deadline => {
                    tracing::warn!(error = %e, "etcd read failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    got = vec![decisions, claim];
                    continue;
                }
                Err(e) => return Err(e),
            };
            let own = read.pop().unwrap_or_default();
            self.fence(&own)?;
            fenced = true;
            got = read;
        }
    }

    /// The decider: read the values and the claims, follow the job's keys
    /// (values and claims) as etcd streams their changes until every rank's
    /// value is there (or a rank left, or the time ran out), then create
    /// the decision.
    async fn decide_here(
        &self,
        key: &str,
        round: &str,
        values: Vec<(u32, Vec<u8>)>,
        timeout: Duration,
        reduce: &Reduce<'_>,
    ) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let vdir = format!("{round}v/").into_bytes();
        let vend = prefix_end(&vdir);
        let members = format!("{}/ranks/", self.root).into_bytes();
        let mend = prefix_end(&members);
        // The values and the claims, followed by one watch at a time.
        let job_keys = format!("{}/", self.root).into_bytes();
        let own: BTreeMap<u32, Vec<u8>> = values.into_iter().collect();
        // The processes whose values did not count (see `count_values`).
        let mut stale = BTreeSet::new();
        loop {
            // (the outcome, the revision of the claims it counted by; None: the
            // deadline passed, written whatever the claims)
            let (outcome, read_at): (Result<Vec<u8>>, Option<i64>) = loop {
                let (vals, claims, rev) = self
                    .values_and_claims((&vdir, &vend), (&members, &mend), deadline)
                    .await?;
                self.fence(&claims)?;
                let holder = self.holders(&claims);
                // Every live holder is seen, the round complete in this
                // read or not: one whose claim is gone by a later round
                // left (that round fails at once, naming it).
                self.note_live(&holder)?;
                let mut by_rank: BTreeMap<u32, Vec<u8>> = own.clone();
                let mut malformed = None;
                stale.clear();
                for kv in &vals {
                    if !count_values(&holder, &vdir, kv, &mut by_rank, &mut stale) {
                        malformed = Some(String::from_utf8_lossy(&kv.key).into_owned());
                    }
                }
                if let Some(m) = malformed {
                    break (
                        Err(Error::Coordination(format!(
                        "{key}: the values under {m} are malformed (another build, or not Strata's)"
                    ))),
                        Some(rev),
                    );
                }
                if by_rank.len() == self.world as usize {
                    let all: Vec<Vec<u8>> = by_rank.into_values().collect();
                    break (Ok(reduce(&all)), Some(rev));
                }
                let missing: Vec<u32> = (0..self.world)
                    .filter(|r| !by_rank.contains_key(r))
                    .collect();
                if missing.iter().any(|r| !holder.contains_key(r)) {
                    // Gone already, or never came: the history tells.
                    self.replay_claims(rev, deadline).await?;
                }
                if let Some(e) = self.left(key, &holder, &missing, by_rank.len())? {
                    break (Err(e), Some(rev));
                }
                let now = Instant::now();
                if now >= deadline {
                    let never: Vec<u32> = missing
                        .iter()
                        .copied()
                        .filter(|r| !holder.contains_key(r))
                        .collect();
                    break (
                    Err(Error::Coordination(format!(
                        "{key}: only {} of {} ranks reported within {timeout:?}; missing {missing:?} (of which never connected or gone: {never:?})",
                        by_rank.len(),
                        self.world
                    ))),
                    None,
                );
                }
                // Follow the job's keys as they change: count the values of
                // the holders as they come, until every rank's is there
                // (decided without reading again); a rank claimed for the
                // first time is a holder from then on (its values come
                // after its claim); a value taken back, or a claim that
                // goes, exits or changes hands, is read again. Each watch
                // lasts at most half a lease: then this process checks it
                // still holds its ranks and follows on from where it was
                // (one small request, where it read every value and claim
                // again before).
                let world = self.world as usize;
                let mut holder = holder;
                // The claims as the read and the events so far show them:
                // those at the newest event's revision (the watch reports
                // every change of a claim, in order).
                let mut seen = rev;
                let (followed, watched) = loop {
                    let wait = deadline
                        .saturating_duration_since(Instant::now())
                        .min(self.opts.lease_ttl / 2);
                    let watched = Instant::now();
                    let mut joined = Vec::new();
                    let r = self
                        .round_api()
                        .watch(&job_keys, seen, wait, |ev| match ev {
                            Event::Put(kv) if kv.key.starts_with(&vdir) => {
                                seen = seen.max(kv.mod_revision);
                                // A malformed value is named by the next read.
                                !count_values(&holder, &vdir, &kv, &mut by_rank, &mut stale)
                                    || by_rank.len() >= world
                            }
                            Event::Delete(k, _) if k.starts_with(&vdir) => true,
                            Event::Put(kv) if kv.key.starts_with(&members) => {
                                seen = seen.max(kv.mod_revision);
                                let new = self.holders(std::slice::from_ref(&kv));
                                match new.into_iter().next() {
                                    Some((r, c)) if !c.exited && !holder.contains_key(&r) => {
                                        holder.insert(r, c);
                                        joined.push(r);
                                        false
                                    }
                                    _ => true,
                                }
                            }
                            Event::Delete(k, _) => k.starts_with(&members),
                            Event::Put(kv) => {
                                seen = seen.max(kv.mod_revision);
                                false
                            }
                        })
                        .await;
                    if !joined.is_empty() {
                        // Seen live: if it goes later, it left (as a read
                        // would have noted).
                        self.state.lock().map_err(poisoned)?.seen.extend(joined);
                    }
                    let quiet = matches!(r, Ok(false)) && watched.elapsed() >= wait;
                    if quiet && Instant::now() < deadline {
                        self.check_lost()?;
                        continue;
                    }
                    break (r, watched);
                };
                match followed {
                    Ok(true) if by_rank.len() == world => {
                        let all: Vec<Vec<u8>> = by_rank.into_values().collect();
                        break (Ok(reduce(&all)), Some(seen));
                    }
                    // A watch that ended at once with nothing (etcd closed it):
                    // not a storm of reads.
                    Ok(false) if watched.elapsed() < Duration::from_millis(50) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "etcd watch failed; reading again");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            };
            let counted = Counted {
                read_at,
                values: (&vdir, &vend),
                stale: &stale,
            };
            match self.publish(key, round, outcome, counted, deadline).await? {
                Some(done) => return done,
                // A claim changed since the read: count again.
                None => continue,
            }
        }
    }

    /// Creates the decision while no claim and no value changed since the
    /// read it was made from (`counted.read_at`; None: written whatever
    /// the claims, the round having timed out), with a mark for each
    /// process whose values did not count, and, for a decision that
    /// succeeded, clears the previous round (every process put a value in
    /// this one, so it had read that one's decision). Returns the outcome
    /// as every process reads it, or None when a claim or a value changed
    /// (the caller counts again). A failed request is sent again until the
    /// deadline: it may have been applied, and then the decision is read
    /// back.
    async fn publish(
        &self,
        key: &str,
        round: &str,
        outcome: Result<Vec<u8>>,
        counted: Counted<'_>,
        deadline: Instant,
    ) -> Result<Option<Result<Vec<u8>>>> {
        let t = self.opts.request_timeout;
        let dprefix = self.decisions_of(round);
        let dkey = [dprefix.as_slice(), self.instance.as_bytes()].concat();
        let bytes = verdict::encode(outcome.clone());
        let members = format!("{}/ranks/", self.root).into_bytes();
        let mend = prefix_end(&members);
        // For a success, a value that came after the count (a process that
        // lost its claim, putting late) makes the decider count again:
        // every value of the round was counted or marked before the
        // decision. (A failure is read again by every waiting process, and
        // late values would only delay it.)
        let ranges: [(&[u8], &[u8]); 2] = [(&members, &mend), counted.values];
        let checked = if outcome.is_ok() {
            &ranges[..]
        } else {
            &ranges[..1]
        };
        let unchanged = counted.read_at.map(|rev| (checked, rev));
        // The decider's own claim, as it made it: a claim gone since the
        // count (its lease ran out) leaves no key the range check could see.
        // Its claims share one lease and go together: the first tells.
        let first = format!("{}/ranks/{:08}", self.root, self.rank).into_bytes();
        let own = self.claims.first().map(|&at| (first.as_slice(), at));
        let marks: Vec<Vec<u8>> = if counted.stale.len() > MAX_MARKS {
            vec![[dprefix.as_slice(), STALE, b"*"].concat()]
        } else {
            counted
                .stale
                .iter()
                .map(|i| [dprefix.as_slice(), STALE, i].concat())
                .collect()
        };
        let previous = match outcome {
            Ok(_) => self.state.lock().map_err(poisoned)?.last_decided.clone(),
            Err(_) => None,
        };
        // The previous round's values and its decisions.
        let cleared: Vec<(Vec<u8>, Vec<u8>)> = previous
            .iter()
            .flat_map(|p| [p.as_bytes().to_vec(), self.decisions_of(p)])
            .map(|p| {
                let end = prefix_end(&p);
                (p, end)
            })
            .collect();
        let clear: Vec<(&[u8], &[u8])> = cleared
            .iter()
            .map(|(p, e)| (p.as_slice(), e.as_slice()))
            .collect();
        // What every other process reads (a long message is cut alike).
        let read_back = |b: &[u8]| verdict::decode(key, b).map(<[u8]>::to_vec);
        loop {
            let created = self
                .round_api()
                .create_and_clear(
                    &dkey,
                    &bytes,
                    self.rounds_lease,
                    &marks,
                    unchanged,
                    own,
                    &clear,
                    t,
                )
                .await;
            match created {
                Ok(Ok(_)) => {
                    if outcome.is_ok() {
                        self.state.lock().map_err(poisoned)?.last_decided = Some(round.to_string());
                    }
                    return Ok(Some(read_back(&bytes)));
                }
                // Written by this process already (a request whose answer
                // was lost).
                Ok(Err(Some(kv))) => return Ok(Some(read_back(&kv.value))),
                Ok(Err(None)) => {
                    let (claims, _) = self.round_api().range_prefix(&members, t).await?;
                    self.fence(&claims)?;
                    return Ok(None);
                }
                Err(e) if Instant::now() < deadline => {
                    tracing::warn!(error = %e, "could not write the decision; trying again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_bad_ones_are_refused() {
        let v = vec![(3, vec![1, 2]), (4, vec![])];
        let b = encode_values(&v);
        assert_eq!(decode_values(&b), Some(v));
        for cut in 0..b.len() {
            assert_eq!(decode_values(&b[..cut]), None, "cut {cut}");
        }
        let mut trailing = b.clone();
        trailing.push(0);
        assert_eq!(decode_values(&trailing), None);
        assert_eq!(decode_values(&[255, 255, 255, 255]), None);
    }
}
