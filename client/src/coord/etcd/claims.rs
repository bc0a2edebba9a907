//! Claims of ranks: how a claim reads, and the task that keeps a
//! process's claims alive and notices when they are lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::collections::{BTreeMap, BTreeSet};

use super::api::{EtcdApi, Event, Kv};
use super::{poisoned, EtcdCoordinator, EtcdOptions, State};
use crate::error::{Error, Result};

/// Longest a replay of the claims' history waits for its last change
/// ([`EtcdCoordinator::replay_claims`]).
const REPLAY_WAIT: Duration = Duration::from_millis(500);

/// A rank's claim as read from etcd.
pub(super) struct Claim {
    pub(super) instance: String,
    /// The start of the job that made it (`EtcdOptions::incarnation`).
    pub(super) start: Option<String>,
    pub(super) exited: bool,
    /// When it was last written (for an exited claim: when it ended).
    pub(super) mod_revision: i64,
}

pub(super) fn parse_claim(value: &[u8], mod_revision: i64) -> Claim {
    let text = String::from_utf8_lossy(value);
    Claim {
        mod_revision,
        instance: text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("instance="))
            .unwrap_or("")
            .to_string(),
        exited: text.split_whitespace().any(|w| w == "exited"),
        start: text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("start="))
            .map(str::to_string),
    }
}

/// The rank number at the start of `rest` (`00000003` or `00000003/...`).
pub(super) fn rank_in(rest: &[u8]) -> Option<u32> {
    let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// What the keep-alive task needs to know about this process's claims
/// (of ranks `ranks`, each at `{root}/ranks/{rank:08}`).
pub(super) struct Holder {
    pub(super) leases: [i64; 2],
    pub(super) root: String,
    pub(super) ranks: std::ops::Range<u32>,
    pub(super) instance: String,
    /// The revision of this process's claim of each rank (by rank from
    /// `ranks.start`): a second claim of a rank made later is about this
    /// process.
    pub(super) claimed: Vec<i64>,
    pub(super) job: String,
    /// Requests the task sent (the rounds' cost is the rest).
    pub(super) sent: Arc<std::sync::atomic::AtomicU64>,
}

/// The key range `[{dir}/{first:08}{tail}, {dir}/{end:08}{tail})`: the keys
/// of ranks `first..end` under `dir`.
pub(super) fn rank_range(
    dir: &str,
    ranks: &std::ops::Range<u32>,
    tail: &str,
) -> (Vec<u8>, Vec<u8>) {
    (
        format!("{dir}/{:08}{tail}", ranks.start).into_bytes(),
        format!("{dir}/{:08}{tail}", ranks.end).into_bytes(),
    )
}

/// Keeps the claims' lease alive every third of its TTL (first, before
/// anything else), the rounds' lease too, and checks that the claims are
/// still this process's and that no newer process tried to take one of
/// its ranks; records why a rank was lost, then stops. Four requests per
/// period, however many ranks the process holds.
pub(super) async fn keep_alive(
    api: Arc<EtcdApi>,
    state: Arc<Mutex<State>>,
    opts: EtcdOptions,
    h: Holder,
) {
    let every = opts.lease_ttl / 3;
    // A renewal must not outlast its own period.
    let t = every.max(Duration::from_millis(500));
    let mut next = tokio::time::Instant::now() + every;
    loop {
        tokio::time::sleep_until(next).await;
        next += every;
        let sent = |n: u64| h.sent.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        sent(1);
        let asked = std::time::Instant::now();
        let lost = match api.keepalive(h.leases[0], t).await {
            Ok(0) => Some(Error::Coordination(format!(
                "rank {}: this process's etcd lease expired (unreachable for over {:?}); its rank may be taken by another process",
                h.ranks.start, opts.lease_ttl
            ))),
            Ok(ttl) => {
                if let (true, Ok(mut st)) = (ttl > 0, state.lock()) {
                    let until = asked + Duration::from_secs(ttl.unsigned_abs());
                    st.lease_until = st.lease_until.max(Some(until));
                }
                // The second renewal, and the two reads of the claims.
                sent(3);
                let _ = api.keepalive(h.leases[1], t).await;
                check_claims(&api, &h, t).await
            }
            Err(e) => {
                tracing::warn!(error = %e, "etcd keep-alive failed; retrying");
                None
            }
        };
        if let Some(e) = lost {
            tracing::error!(error = %e, "lost the rank");
            if let Ok(mut st) = state.lock() {
                // An earlier reason (the node gave up) stays the reason.
                st.lost.get_or_insert(e);
            }
            return;
        }
    }
}

/// Whether the claims are still this process's, and no process tried to
/// take one of its ranks since it claimed them (an older attempt's marker,
/// from before these claims, is not about this process).
async fn check_claims(api: &EtcdApi, h: &Holder, t: Duration) -> Option<Error> {
    let dir = format!("{}/ranks", h.root);
    let (from, to) = rank_range(&dir, &h.ranks, "");
    let (held, _) = api.range(&from, &to, t).await.ok()?;
    for rank in h.ranks.clone() {
        let key = format!("{dir}/{rank:08}");
        let mine = held
            .iter()
            .find(|kv| kv.key == key.as_bytes())
            .is_some_and(|kv| parse_claim(&kv.value, kv.mod_revision).instance == h.instance);
        if !mine {
            return Some(Error::RankClaimed {
                job: h.job.clone(),
                rank,
                other: "another process holds it now (this process's claim was lost)".into(),
            });
        }
    }
    let dir = format!("{}/claims", h.root);
    let (from, to) = rank_range(&dir, &h.ranks, "/");
    let (tried, _) = api.range(&from, &to, t).await.ok()?;
    let prefix = format!("{dir}/");
    let rank_of = |kv: &super::api::Kv| kv.key.strip_prefix(prefix.as_bytes()).and_then(rank_in);
    tried
        .into_iter()
        .find(|kv| {
            rank_of(kv)
                .and_then(|r| r.checked_sub(h.ranks.start))
                .and_then(|i| h.claimed.get(i as usize))
                .is_some_and(|&at| kv.create_revision > at)
        })
        .map(|kv| Error::RankClaimed {
            job: h.job.clone(),
            rank: rank_of(&kv).unwrap_or(h.ranks.start),
            other: format!(
                "another process tried to claim it: {}",
                String::from_utf8_lossy(&kv.value)
            ),
        })
}

/// Which rank a process claims, and as whom.
pub(super) struct ClaimOf<'a> {
    pub(super) root: &'a str,
    pub(super) job: &'a str,
    pub(super) rank: u32,
    /// The claim's value (host, pid, instance, start).
    pub(super) me: &'a str,
    pub(super) instance: &'a str,
    /// The claim's lease, and the rounds' lease.
    pub(super) leases: [i64; 2],
}

/// Claims one rank: creates its key, or takes over the claim of a process
/// that exited cleanly, or waits up to two lease TTLs for a live holder's
/// lease to lapse (a predecessor that died); then tells the holder (a
/// marker on a short lease of its own) and fails with
/// [`Error::RankClaimed`]. Returns the revision of the claim.
pub(super) async fn claim_rank(
    api: &EtcdApi,
    opts: &EtcdOptions,
    c: ClaimOf<'_>,
) -> crate::error::Result<i64> {
    let t = opts.request_timeout;
    let claim = format!("{}/ranks/{:08}", c.root, c.rank);
    let lease = c.leases[0];
    // A live holder is waited for up to two lease TTLs (plus a margin): a
    // predecessor that died is gone by then, even where etcd runs late on
    // a loaded machine.
    let deadline = std::time::Instant::now() + opts.lease_ttl * 2 + Duration::from_secs(2);
    loop {
        let held = match api
            .create(claim.as_bytes(), c.me.as_bytes(), lease, t)
            .await
        {
            Ok(Ok(rev)) => return Ok(rev),
            Ok(Err(held)) => held,
            // Gone between the compare and the read: try again.
            Err(Error::Coordination(m)) if m.contains("contended") => continue,
            Err(e) => return Err(e),
        };
        if parse_claim(&held.value, held.mod_revision).exited {
            // The previous holder ended cleanly: take the rank over.
            match api
                .replace(
                    claim.as_bytes(),
                    c.me.as_bytes(),
                    lease,
                    held.mod_revision,
                    t,
                )
                .await?
            {
                Some(rev) => return Ok(rev),
                None => continue,
            }
        }
        if std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            // This process's own lease must outlive the wait.
            api.keepalive(lease, t).await?;
            continue;
        }
        // Tell the holder on a short lease of its own, then fail.
        let short = api.grant(opts.lease_ttl * 3, t).await?;
        let key = format!("{}/claims/{:08}/{}", c.root, c.rank, c.instance);
        if let Err(e) = api.put(key.as_bytes(), c.me.as_bytes(), short, t).await {
            tracing::warn!(error = %e, "could not tell the holder of the rank");
        }
        return Err(Error::RankClaimed {
            job: c.job.to_string(),
            rank: c.rank,
            other: format!(
                "held by {}; this process is {}",
                String::from_utf8_lossy(&held.value),
                c.me
            ),
        });
    }
}

impl EtcdCoordinator {
    /// The live holders of ranks, from the claims read: an exited claim
    /// older than this process, or a claim of another start of the job,
    /// is as if the rank had not come yet.
    pub(super) fn holders(&self, claims: &[Kv]) -> BTreeMap<u32, Claim> {
        let members = format!("{}/ranks/", self.root);
        let mut holder = BTreeMap::new();
        for kv in claims {
            if let Some(r) = kv
                .key
                .strip_prefix(members.as_bytes())
                .and_then(rank_in)
                .filter(|&r| r < self.world)
            {
                let c = parse_claim(&kv.value, kv.mod_revision);
                let older = c.exited && c.mod_revision < self.claimed_at;
                let other_start = self.opts.incarnation.is_some() && c.start != self.start;
                if !older && !other_start {
                    holder.insert(r, c);
                }
            }
        }
        holder
    }

    /// Notes the live holders (not exited) as seen: if one's claim goes
    /// later, its rank left.
    pub(super) fn note_live(&self, holder: &BTreeMap<u32, Claim>) -> Result<()> {
        let mut st = self.state.lock().map_err(poisoned)?;
        st.seen
            .extend(holder.iter().filter(|(_, c)| !c.exited).map(|(r, _)| *r));
        Ok(())
    }

    /// Notes as seen the ranks that etcd's history shows holding a live
    /// claim made after this process's own claim (or after the last
    /// replay) and at or before revision `upto`: a rank that claimed and
    /// died before any read of the claims saw it live left all the same,
    /// and is not waited for as one that never came. Called only when a
    /// missing rank has no claim, i.e. while the round cannot complete
    /// anyway. One watch from that revision, at most [`REPLAY_WAIT`] and
    /// never past `deadline`; it ends at the first change at or past
    /// `upto` (a claim arriving ends it at once). What etcd did not deliver
    /// within the wait is not asked again; a failed watch is (at the next
    /// read). Replays of one process run one at a time, so a round that
    /// finds another's replay in progress waits for its result instead of
    /// skipping it.
    ///
    /// Not covered, so still named at the round's timeout: a rank that
    /// claimed before this process did (its claim cannot be told from a
    /// previous launch's that lingers, where the restart count starts
    /// again at 0), and history etcd compacted.
    pub(super) async fn replay_claims(
        &self,
        upto: i64,
        deadline: std::time::Instant,
    ) -> Result<()> {
        let _one = self.replaying.lock().await;
        let from = self
            .state
            .lock()
            .map_err(poisoned)?
            .replayed_to
            .max(self.claimed_at);
        let wait = REPLAY_WAIT.min(deadline.saturating_duration_since(std::time::Instant::now()));
        if from >= upto || wait.is_zero() {
            return Ok(());
        }
        let members = format!("{}/ranks/", self.root).into_bytes();
        let mut live = BTreeSet::new();
        let replayed = self
            .round_api()
            .watch(&members, from, wait, |ev| match ev {
                Event::Put(kv) => {
                    let at = kv.mod_revision;
                    // A claim made after the read is not one that came
                    // and went before it (the read's caller sees it next).
                    if at <= upto {
                        let h = self.holders(std::slice::from_ref(&kv));
                        live.extend(h.into_iter().filter(|(_, c)| !c.exited).map(|(r, _)| r));
                    }
                    at >= upto
                }
                Event::Delete(_, at) => at >= upto,
            })
            .await;
        if let Err(e) = replayed {
            tracing::debug!(error = %e, "cannot replay the job's claims; again at the next read");
            return Ok(());
        }
        let mut st = self.state.lock().map_err(poisoned)?;
        st.seen.extend(live);
        st.replayed_to = st.replayed_to.max(upto);
        Ok(())
    }

    /// The failure for ranks that left: of `missing`, those whose live
    /// claim this process saw before (see [`Self::note_live`]) and that
    /// are gone now, or that exited without a value.
    pub(super) fn left(
        &self,
        key: &str,
        holder: &BTreeMap<u32, Claim>,
        missing: &[u32],
        reported: usize,
    ) -> Result<Option<Error>> {
        let st = self.state.lock().map_err(poisoned)?;
        let dead: Vec<u32> = missing
            .iter()
            .copied()
            .filter(|r| match holder.get(r) {
                None => st.seen.contains(r),
                Some(c) => c.exited,
            })
            .collect();
        Ok((!dead.is_empty()).then(|| {
            Error::Coordination(format!(
                "{key}: rank{} {dead:?} left (the process ended or its lease expired: it or its node died); {reported} of {} ranks reported",
                if dead.len() == 1 { "" } else { "s" },
                self.world
            ))
        }))
    }
}
