//! A process's one watch of its job's decisions (`<root>/decided/`), kept
//! from its connect on (a process other than the decider's): a process that waits for a decision
//! looks at what this watch brought instead of starting a watch of its own
//! each round. A round then costs a waiting process one request (its
//! values, which read the decisions so far in the same transaction), and
//! etcd neither starts nor cancels a watch per process per round, nor
//! accepts a new connection for it (a watch that ends closes its HTTP
//! connection). The decisions' prefix holds only decisions and the marks
//! put ahead of them (a round's values are under `decide/`), so the watch
//! brings a few keys per round, whatever the world.
//!
//! What the watch brought stays after the decider deletes it (up to a
//! bound, oldest out), as a watch of the round's own from its revision
//! would still report it: a process in two rounds at once (a refused
//! save's barrier beside the next save's) may look for its decision only
//! after the decider cleared that round, and still finds it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::api::{EtcdApi, Event, Kv};
use super::decide::Waiting;
use super::{poisoned, EtcdCoordinator};
use crate::error::Result;

/// At most this many keys are kept, deleted ones included (a round's
/// decision and at most 33 marks): the newest rounds', oldest out.
const MAX_KEPT: usize = 256;

/// After the watch's requests have failed for this long in a row, rounds
/// stop counting on it (each watches its own round and reads, as before
/// it) until a request succeeds again; an etcd restart takes less.
const FAILING_AFTER: Duration = Duration::from_secs(5);

/// How long one watch request lasts before it is renewed from where it
/// was (a request that never ends would hold a dead connection unseen).
const RENEW_EVERY: Duration = Duration::from_secs(60);

/// What the watch brought.
#[derive(Default)]
struct Seen {
    /// Every change after this revision is in `kvs` or on its way (None:
    /// not following).
    from: Option<i64>,
    /// The keys under the prefix as the watch brought them (deleted ones
    /// kept: see the module's doc), at most [`MAX_KEPT`].
    kvs: BTreeMap<Vec<u8>, Kv>,
    /// Since when the watch's requests have failed, all of them.
    failing_since: Option<std::time::Instant>,
    /// The failures were reported (once per streak).
    warned: bool,
}

impl Seen {
    fn keep(&mut self, kv: Kv) {
        self.kvs.insert(kv.key.clone(), kv);
        while self.kvs.len() > MAX_KEPT {
            let oldest = self.kvs.iter().min_by_key(|(_, kv)| kv.mod_revision);
            let Some(k) = oldest.map(|(k, _)| k.clone()) else {
                break;
            };
            self.kvs.remove(&k);
        }
    }
}

/// The decisions as one watch brings them, shared by the rounds of a
/// process.
pub(super) struct Decisions {
    seen: Mutex<Seen>,
    changed: tokio::sync::watch::Sender<u64>,
    /// Requests the watch sent (its renewals, and a read after a cancel).
    requests: AtomicU64,
}

impl Default for Decisions {
    fn default() -> Self {
        Self {
            seen: Mutex::default(),
            changed: tokio::sync::watch::Sender::new(0),
            requests: AtomicU64::new(0),
        }
    }
}

/// What a waiting process looks for under its round's decisions' prefix.
pub(super) enum Found {
    /// Nothing after the revision yet.
    Nothing,
    /// A mark that says this process must read the decision with its
    /// claims (its values did not count, or every process must).
    Marked,
    /// The decision of the process named.
    Decision(Kv),
}

impl Decisions {
    /// Requests the watch sent so far.
    pub(super) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Starts following `prefix` from after `at` on the current runtime,
    /// unless the watch runs already (`t`: the timeout of a read).
    pub(super) fn follow(
        self: &Arc<Self>,
        api: &Arc<EtcdApi>,
        prefix: Vec<u8>,
        at: i64,
        t: Duration,
    ) -> Result<()> {
        {
            let mut s = self.seen.lock().map_err(poisoned)?;
            if s.from.is_some() {
                return Ok(());
            }
            s.from = Some(at);
        }
        let (me, api) = (self.clone(), api.clone());
        tokio::spawn(async move { me.run(&api, &prefix, at, t).await });
        Ok(())
    }

    /// The watch, renewed from where it was while the process lives (the
    /// runtime's end ends it).
    async fn run(&self, api: &EtcdApi, prefix: &[u8], mut at: i64, t: Duration) {
        let count = || self.requests.fetch_add(1, Ordering::Relaxed);
        loop {
            count();
            let started = std::time::Instant::now();
            let r = api
                .watch(prefix, at, RENEW_EVERY, |ev| {
                    self.apply(ev, &mut at);
                    false
                })
                .await;
            match r {
                // Its time passed: on from where it was. One that ended at
                // once with nothing (etcd closed it) waits a little: no
                // storm of requests.
                Ok(false) => {
                    self.failed(false);
                    if started.elapsed() < Duration::from_millis(50) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                // etcd cancelled it (the revisions after `at` were
                // compacted): what came meanwhile is read, and rounds
                // waiting from before the read watch their own.
                Ok(true) => {
                    count();
                    match api.range_prefix(prefix, t).await {
                        Ok((kvs, rev)) => {
                            if let Ok(mut s) = self.seen.lock() {
                                s.kvs.clear();
                                for kv in kvs {
                                    s.keep(kv);
                                }
                                s.from = Some(rev);
                                s.failing_since = None;
                                s.warned = false;
                            }
                            at = rev;
                            self.changed.send_modify(|n| *n += 1);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot read the job's decisions; trying again");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
                // etcd unreachable or restarting: the next watch starts
                // from where this one was. An expired token is renewed.
                Err(e) => {
                    if self.failed(true) {
                        tracing::warn!(error = %e, "the watch of the job's decisions keeps failing; rounds read their decisions themselves meanwhile");
                    }
                    count();
                    let _ = api.authenticate().await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Notes a watch request that failed or succeeded; true when the
    /// failures in a row just passed [`FAILING_AFTER`] (waiting rounds are
    /// woken: they go to their own watches).
    fn failed(&self, failed: bool) -> bool {
        let Ok(mut s) = self.seen.lock() else {
            return false;
        };
        if !failed {
            s.failing_since = None;
            s.warned = false;
            return false;
        }
        let since = *s.failing_since.get_or_insert_with(std::time::Instant::now);
        if s.warned || since.elapsed() < FAILING_AFTER {
            return false;
        }
        s.warned = true;
        drop(s);
        self.changed.send_modify(|n| *n += 1);
        true
    }

    fn apply(&self, ev: Event, at: &mut i64) {
        let Ok(mut s) = self.seen.lock() else {
            return;
        };
        s.failing_since = None;
        s.warned = false;
        match ev {
            Event::Put(kv) => {
                *at = (*at).max(kv.mod_revision);
                s.keep(kv);
            }
            // Kept (see the module's doc); the watch moves on past it.
            Event::Delete(_, rev) => *at = (*at).max(rev),
        }
        drop(s);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Waits up to `wait` for what a process that put its values at or
    /// before `after` looks for under `dprefix` (its mark `stale`, the mark
    /// `every`, or a decision, marks first: they are put ahead of the
    /// decision in its transaction; the decision `want`, the decider's as
    /// the caller last read its claim, before any other). None: the watch
    /// does not cover every change after `after`, or keeps failing (the
    /// caller watches itself).
    pub(super) async fn wait(
        &self,
        w: &Waiting<'_>,
        want: Option<&[u8]>,
        after: i64,
        wait: Duration,
    ) -> Result<Option<Found>> {
        let dprefix = w.dprefix;
        let mut rx = self.changed.subscribe();
        let until = tokio::time::Instant::now() + wait;
        loop {
            {
                let s = self.seen.lock().map_err(poisoned)?;
                let failing = s
                    .failing_since
                    .is_some_and(|t| t.elapsed() >= FAILING_AFTER);
                if s.from.is_none_or(|f| f > after) || failing {
                    return Ok(None);
                }
                let mut decision = None;
                for (k, kv) in s.kvs.range(dprefix.to_vec()..) {
                    if !k.starts_with(dprefix) {
                        break;
                    }
                    if kv.mod_revision <= after {
                        continue;
                    }
                    if k == w.stale || k == w.every {
                        return Ok(Some(Found::Marked));
                    }
                    let wanted = want == Some(k.as_slice());
                    if !k.starts_with(w.marks) && (decision.is_none() || wanted) {
                        decision = Some(kv.clone());
                    }
                }
                if let Some(kv) = decision {
                    return Ok(Some(Found::Decision(kv)));
                }
            }
            match tokio::time::timeout_at(until, rx.changed()).await {
                Ok(Ok(())) => {}
                // The sender lives as long as `self`.
                Ok(Err(_)) => return Ok(None),
                Err(_) => return Ok(Some(Found::Nothing)),
            }
        }
    }
}

impl EtcdCoordinator {
    /// A round's decisions' prefix: under `<root>/decided/`, apart from
    /// its values (`round`, under `<root>/decide/`), so that one watch of
    /// every decision brings no values.
    pub(super) fn decisions_of(&self, round: &str) -> Vec<u8> {
        let own = round
            .strip_prefix(&format!("{}/decide/", self.root))
            .unwrap_or(round);
        [self.every_decision().as_slice(), own.as_bytes()].concat()
    }

    /// The prefix of every decision of the job (what the watch follows).
    pub(super) fn every_decision(&self) -> Vec<u8> {
        format!("{}/decided/", self.root).into_bytes()
    }

    /// A long round's wait of a process other than the decider: until a
    /// decision is put, the decider's claim changes (it exited, or its
    /// lease ran out), or `wait` passes, reading nothing meanwhile (two
    /// watches, where it read the decisions and the claims again each half
    /// lease: O(nodes) requests per half lease of a slow rank). This
    /// process's own lease is the keep-alive task's to watch: it is looked
    /// at here each half lease, without a request, and the read after the
    /// decision fences this process's claims.
    pub(super) async fn follow_decider(
        &self,
        w: &Waiting<'_>,
        rev: i64,
        wait: Duration,
    ) -> Result<bool> {
        let decision = self
            .round_api()
            .watch(w.dprefix, rev, wait, |ev| matches!(ev, Event::Put(_)));
        let decider = self.round_api().watch(w.decider, rev, wait, |_| true);
        let lost = async {
            loop {
                tokio::time::sleep(self.opts.lease_ttl / 2).await;
                self.check_lost()?;
            }
        };
        tokio::select! {
            r = decision => r,
            r = decider => r,
            r = lost => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(d: &Decisions, key: &str, rev: i64, at: &mut i64) {
        d.apply(
            Event::Put(Kv {
                key: key.as_bytes().to_vec(),
                value: vec![1],
                create_revision: rev,
                mod_revision: rev,
            }),
            at,
        );
    }

    /// What a process of round `/d/r@1/` waits on.
    const W: Waiting<'static> = Waiting {
        dprefix: b"/d/r@1/",
        decider: b"/ranks/00000000",
        put_rev: 0,
        stale: b"/d/r@1/stale-me",
        marks: b"/d/r@1/stale-",
        every: b"/d/r@1/stale-*",
    };

    fn wait(d: &Decisions, after: i64) -> Option<Found> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(d.wait(&W, None, after, Duration::from_millis(20)))
            .unwrap()
    }

    fn found(f: Option<Found>) -> String {
        match f {
            None => "not covered".into(),
            Some(Found::Nothing) => "nothing".into(),
            Some(Found::Marked) => "marked".into(),
            Some(Found::Decision(kv)) => String::from_utf8_lossy(&kv.key).into_owned(),
        }
    }

    #[test]
    fn a_round_takes_its_own_decision_after_its_values_marks_first() {
        let d = Decisions::default();
        // Not following yet: the round watches itself.
        assert_eq!(found(wait(&d, 10)), "not covered");
        d.seen.lock().unwrap().from = Some(10);
        let mut at = 10;
        assert_eq!(found(wait(&d, 10)), "nothing");
        // Another round's decision, and this round's from before its values.
        put(&d, "/d/r@2/dec", 11, &mut at);
        put(&d, "/d/r@1/old", 9, &mut at);
        assert_eq!(found(wait(&d, 10)), "nothing");
        // Another process's mark is not this one's.
        put(&d, "/d/r@1/stale-other", 12, &mut at);
        assert_eq!(found(wait(&d, 10)), "nothing");
        put(&d, "/d/r@1/dec", 12, &mut at);
        assert_eq!(found(wait(&d, 10)), "/d/r@1/dec");
        assert_eq!(at, 12);
        // Marked in the same transaction: the mark wins.
        put(&d, "/d/r@1/stale-me", 12, &mut at);
        assert_eq!(found(wait(&d, 10)), "marked");
        // A round whose values came before the watch's start is not covered.
        assert_eq!(found(wait(&d, 9)), "not covered");
        // Deleted (the decider cleared the round after the next one)
        // before this round looked: still there, as a watch of the round
        // from its revision would report it; the watch moves past it.
        d.apply(Event::Delete(b"/d/r@1/stale-me".to_vec(), 20), &mut at);
        d.apply(Event::Delete(b"/d/r@1/dec".to_vec(), 20), &mut at);
        assert_eq!(at, 20);
        assert_eq!(found(wait(&d, 10)), "marked");
        // The mark for every process.
        let d = Decisions::default();
        d.seen.lock().unwrap().from = Some(10);
        put(&d, "/d/r@1/dec", 12, &mut at);
        put(&d, "/d/r@1/stale-*", 12, &mut at);
        assert_eq!(found(wait(&d, 10)), "marked");
    }

    #[test]
    fn the_deciders_decision_is_taken_before_another_instances() {
        let d = Decisions::default();
        d.seen.lock().unwrap().from = Some(10);
        let mut at = 10;
        put(&d, "/d/r@1/aaa-earlier", 11, &mut at);
        put(&d, "/d/r@1/zzz-decider", 12, &mut at);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let want = b"/d/r@1/zzz-decider".as_slice();
        let got = rt
            .block_on(d.wait(&W, Some(want), 10, Duration::from_millis(20)))
            .unwrap();
        assert_eq!(found(got), "/d/r@1/zzz-decider");
        assert_eq!(found(wait(&d, 10)), "/d/r@1/aaa-earlier");
    }

    #[test]
    fn a_watch_that_keeps_failing_hands_the_rounds_back() {
        let d = Decisions::default();
        d.seen.lock().unwrap().from = Some(10);
        // Failing for a short while (an etcd restart): still counted on.
        assert!(!d.failed(true));
        assert!(!d.failed(true));
        assert_eq!(found(wait(&d, 10)), "nothing");
        // For longer: handed back, reported once.
        d.seen.lock().unwrap().failing_since =
            Some(std::time::Instant::now() - FAILING_AFTER - Duration::from_secs(1));
        assert!(d.failed(true));
        assert!(!d.failed(true));
        assert_eq!(found(wait(&d, 10)), "not covered");
        // A request that succeeds again: covered again.
        d.failed(false);
        assert_eq!(found(wait(&d, 10)), "nothing");
    }

    #[test]
    fn a_waiting_round_wakes_when_its_decision_comes() {
        let d = Arc::new(Decisions::default());
        d.seen.lock().unwrap().from = Some(1);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let d2 = d.clone();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let mut at = 1;
            put(&d2, "/d/r@1/dec", 5, &mut at);
        });
        let t = std::time::Instant::now();
        let got = rt
            .block_on(d.wait(&W, None, 1, Duration::from_secs(20)))
            .unwrap();
        late.join().unwrap();
        assert_eq!(found(got), "/d/r@1/dec");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }

    #[test]
    fn a_flood_of_keys_is_bounded_oldest_out() {
        let d = Decisions::default();
        d.seen.lock().unwrap().from = Some(0);
        let mut at = 0;
        for i in 0..(MAX_KEPT as i64 + 100) {
            put(&d, &format!("/d/x/{i:06}"), i + 1, &mut at);
        }
        let s = d.seen.lock().unwrap();
        assert_eq!(s.kvs.len(), MAX_KEPT);
        assert!(!s.kvs.contains_key(b"/d/x/000000".as_slice()));
        assert!(s
            .kvs
            .contains_key(format!("/d/x/{:06}", MAX_KEPT + 99).as_bytes()));
    }
}
