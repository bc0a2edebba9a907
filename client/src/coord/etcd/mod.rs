//! [`EtcdCoordinator`]: ranks in separate processes on many nodes agreeing
//! through etcd (v3 API). See `docs/coordination.md` for the contract.
//!
//! Keys, under `<prefix>/<job>/`:
//! - `ranks/<rank>`: the claim of a rank by one process (host, pid, an
//!   instance id), on a lease the process keeps alive every third of its
//!   TTL. A process that dies loses its lease and its claim within the
//!   TTL; the others see the rank gone. A process that ends cleanly leaves
//!   its claim marked `exited` (on a longer lease): the others can still
//!   use its values of the last round, and a new process may take the rank
//!   over at once. A live claim is waited for up to two TTLs (a dead
//!   predecessor's lease expiring), then it is [`Error::RankClaimed`].
//! - `claims/<rank>/<instance>`: a second process's attempt on a held
//!   rank, on a short lease of its own: the holder's keep-alive sees it
//!   and the holder's next call fails too (`RankClaimed` on both).
//! - `rounds/<key>/<rank>/<instance>`: a rank's value in the all-gather
//!   `key`, on the longer lease. Only the value of the instance that holds
//!   (or held, and exited) the rank counts: a value an earlier incarnation
//!   of the job left under the same key is never read. A rank deletes its
//!   value of a round once the next round is complete.

mod api;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::coord::coordinator::Coordinator;
use crate::error::{Error, Result};
use api::{EtcdApi, Security};

/// How to reach etcd and how long a dead rank may go unnoticed. Its
/// `Debug` shows the user, never the password.
#[derive(Clone)]
pub struct EtcdOptions {
    /// Client URLs of the cluster (`http://10.0.0.5:2379`, `https://…`),
    /// tried in order.
    pub endpoints: Vec<String>,
    /// Key prefix of every job (default `/strata`).
    pub prefix: String,
    /// Lease of a rank's keys: a dead rank is seen within this time.
    pub lease_ttl: Duration,
    /// Time limit of one request to etcd.
    pub request_timeout: Duration,
    /// PEM file of the CA that signed the servers' certificates (https).
    pub ca_file: Option<PathBuf>,
    /// PEM files of a client certificate and its key (mutual TLS).
    pub cert_file: Option<PathBuf>,
    /// The key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// etcd user and password (etcd's own authentication). Sent only to
    /// `https://` endpoints unless `allow_plaintext_auth`.
    pub user: Option<(String, String)>,
    /// Send the user and password over plain `http://` endpoints too (a
    /// network the operator trusts); otherwise connecting with a user and
    /// an `http://` endpoint is a configuration error.
    pub allow_plaintext_auth: bool,
    /// Which start of the job this is (the launcher's restart count:
    /// torchrun's `TORCHELASTIC_RESTART_COUNT`, Slurm's
    /// `SLURM_RESTART_COUNT`): rounds of different starts never meet, even
    /// if a process of an earlier start is still ending.
    pub incarnation: Option<String>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: Vec::new(),
            prefix: "/strata".into(),
            lease_ttl: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            ca_file: None,
            cert_file: None,
            key_file: None,
            user: None,
            allow_plaintext_auth: false,
            incarnation: None,
        }
    }
}

impl EtcdOptions {
    /// The options the `etcd_*` settings of `cfg` give (the password read
    /// from its file).
    pub fn from_config(cfg: &Config) -> Result<EtcdOptions> {
        let user = match (&cfg.etcd_user, &cfg.etcd_password_file) {
            (Some(u), Some(f)) => {
                let pw = std::fs::read_to_string(f).map_err(|e| {
                    Error::Config(format!("etcd_password_file {}: {e}", f.display()))
                })?;
                Some((u.clone(), pw.trim_end_matches(['\n', '\r']).to_string()))
            }
            (Some(_), None) => {
                return Err(Error::Config("etcd_user needs etcd_password_file".into()))
            }
            (None, _) => None,
        };
        Ok(EtcdOptions {
            endpoints: cfg.etcd_endpoints.clone(),
            prefix: cfg.etcd_prefix.clone(),
            lease_ttl: std::time::Duration::from_secs(cfg.etcd_lease_secs),
            ca_file: cfg.etcd_ca.clone(),
            cert_file: cfg.etcd_cert.clone(),
            key_file: cfg.etcd_key.clone(),
            user,
            allow_plaintext_auth: cfg.etcd_allow_plaintext_auth,
            incarnation: cfg.incarnation.clone(),
            ..EtcdOptions::default()
        })
    }

    fn security(&self) -> Result<Security> {
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|e| Error::Config(format!("etcd: {}: {e}", p.display())))
        };
        let identity_pem = match (&self.cert_file, &self.key_file) {
            (Some(c), Some(k)) => {
                let mut pem = read(c)?;
                pem.push(b'\n');
                pem.extend(read(k)?);
                Some(pem)
            }
            (None, None) => None,
            _ => {
                return Err(Error::Config(
                    "etcd: a client certificate needs its key (and the key its certificate)".into(),
                ))
            }
        };
        // A CA file must hold a PEM certificate: one that holds none would
        // trust nothing and fail every connection as "unreachable".
        let ca_pem = match &self.ca_file {
            Some(p) => {
                let pem = read(p)?;
                let certs = reqwest::Certificate::from_pem_bundle(&pem).unwrap_or_default();
                if certs.is_empty() || !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----")
                {
                    return Err(Error::Config(format!(
                        "etcd: {}: no PEM certificate in the CA file",
                        p.display()
                    )));
                }
                Some(pem)
            }
            None => None,
        };
        Ok(Security {
            ca_pem,
            identity_pem,
            user: self.user.clone(),
            allow_plaintext_auth: self.allow_plaintext_auth,
        })
    }
}

/// What the keep-alive task and the calls share.
#[derive(Default)]
struct State {
    /// Set once this process lost its rank (lease expired, or another
    /// process claimed it): every later call fails with it.
    lost: Option<Error>,
    /// Ranks seen holding a live claim: one whose claim disappears has
    /// died.
    seen: BTreeSet<u32>,
    /// This rank's key of the last complete round (deleted after the next).
    last_round: Option<Vec<u8>>,
    /// Calls of each all-gather key so far: a key used again (a step
    /// saved again after a failed commit) is a new round, never mixed with
    /// the failed one's values.
    attempts: std::collections::HashMap<String, u32>,
}

/// Ranks in many processes agreeing through etcd. One per process; it
/// claims its rank on connect and holds it until dropped.
pub struct EtcdCoordinator {
    rt: Option<tokio::runtime::Runtime>,
    api: Arc<EtcdApi>,
    opts: EtcdOptions,
    root: String,
    rank: u32,
    world: u32,
    /// The claim's lease (short: a dead process is seen within it).
    lease: i64,
    /// The rounds' lease (longer; also holds the claim once exited).
    rounds_lease: i64,
    instance: String,
    me: String,
    /// The revision at which this process claimed its rank: a claim that
    /// exited before it belongs to an earlier incarnation of the job.
    claimed_at: i64,
    /// This start of the job, as its claim names it.
    start: Option<String>,
    state: Arc<Mutex<State>>,
}

/// A rank's claim as read from etcd.
struct Claim {
    instance: String,
    /// The start of the job that made it (`EtcdOptions::incarnation`).
    start: Option<String>,
    exited: bool,
    /// When it was last written (for an exited claim: when it ended).
    mod_revision: i64,
}

fn parse_claim(value: &[u8], mod_revision: i64) -> Claim {
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
fn rank_in(rest: &[u8]) -> Option<u32> {
    let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// How long the rounds' lease lives at least: a slow rank must still find
/// the values of ranks that finished the round and exited. (At least three
/// claim leases too, so renewals always come in time.)
const ROUNDS_TTL: Duration = Duration::from_secs(120);

impl std::fmt::Debug for EtcdCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "EtcdCoordinator({} rank {}/{})",
            self.root, self.rank, self.world
        )
    }
}

/// A key segment with `/` and `%` escaped (an all-gather key such as
/// `restore/j/1` must not be a prefix of another round's keys).
fn escape(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

fn poisoned<T>(_: T) -> Error {
    Error::Coordination("coordinator state poisoned".into())
}

impl EtcdCoordinator {
    /// Connects to etcd and claims `rank` of `job` in a world of `world`.
    /// A rank another live process holds is [`Error::RankClaimed`] (and
    /// that process's next call fails the same way).
    pub fn connect(opts: EtcdOptions, job: &str, rank: u32, world: u32) -> Result<Self> {
        // On a thread of its own: the caller may be inside an async
        // runtime, where blocking on (or dropping) ours would panic.
        std::thread::scope(|sc| {
            sc.spawn(|| Self::connect_here(opts, job, rank, world))
                .join()
                .unwrap_or_else(|_| Err(Error::Coordination("etcd connect panicked".into())))
        })
    }

    fn connect_here(opts: EtcdOptions, job: &str, rank: u32, world: u32) -> Result<Self> {
        strata_format::names::validate_job_id(job).map_err(|e| Error::Config(e.to_string()))?;
        if world == 0 || rank >= world {
            return Err(Error::Config(format!("rank {rank} of world size {world}")));
        }
        if opts.lease_ttl < Duration::from_secs(1) {
            return Err(Error::Config("etcd lease_ttl must be at least 1 s".into()));
        }
        let sec = opts.security()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("strata-etcd")
            .enable_all()
            .build()
            .map_err(|e| Error::Config(format!("cannot start the etcd runtime: {e}")))?;
        let t = opts.request_timeout;
        let api = Arc::new(rt.block_on(EtcdApi::connect(opts.endpoints.clone(), &sec, t))?);
        let root = format!("{}/{job}", opts.prefix.trim_end_matches('/'));
        let lease = rt.block_on(api.grant(opts.lease_ttl, t))?;
        let since = strata_tiered::clock::unix_ms(&strata_tiered::SystemClock);
        let instance = format!(
            "{:016x}",
            std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                (std::process::id(), since, lease)
            )
        );
        let start = opts
            .incarnation
            .as_deref()
            .map(|i| escape(&i.split_whitespace().collect::<Vec<_>>().join("_")));
        let me = format!(
            "host={} pid={} instance={instance} since_unix_ms={since}{}",
            crate::config::hostname(),
            std::process::id(),
            start
                .as_ref()
                .map_or(String::new(), |s| format!(" start={s}")),
        );
        let rounds_lease = rt.block_on(api.grant(ROUNDS_TTL.max(opts.lease_ttl * 3), t))?;
        let claim = format!("{root}/ranks/{rank:08}");
        let state = Arc::new(Mutex::new(State::default()));
        // A live holder is waited for up to two lease TTLs (plus a
        // margin): a predecessor that died is gone by then, even where
        // etcd runs late on a loaded machine.
        let deadline = Instant::now() + opts.lease_ttl * 2 + Duration::from_secs(2);
        let claimed_at = loop {
            let held = match rt.block_on(api.create(claim.as_bytes(), me.as_bytes(), lease, t)) {
                Ok(Ok(rev)) => break rev,
                Ok(Err(held)) => held,
                // Gone between the compare and the read: try again.
                Err(Error::Coordination(m)) if m.contains("contended") => continue,
                Err(e) => return Err(e),
            };
            if parse_claim(&held.value, held.mod_revision).exited {
                // The previous holder ended cleanly: take the rank over.
                match rt.block_on(api.replace(
                    claim.as_bytes(),
                    me.as_bytes(),
                    lease,
                    held.mod_revision,
                    t,
                ))? {
                    Some(rev) => break rev,
                    None => continue,
                }
            }
            if Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
                // This process's own lease must outlive the wait.
                rt.block_on(api.keepalive(lease, t))?;
                continue;
            }
            // Tell the holder on a short lease of its own, then fail.
            let short = rt.block_on(api.grant(opts.lease_ttl * 3, t))?;
            let key = format!("{root}/claims/{rank:08}/{instance}");
            let told = rt.block_on(api.put(key.as_bytes(), me.as_bytes(), short, t));
            let _ = rt.block_on(api.revoke(lease, t));
            let _ = rt.block_on(api.revoke(rounds_lease, t));
            if let Err(e) = told {
                tracing::warn!(error = %e, "could not tell the holder of the rank");
            }
            return Err(Error::RankClaimed {
                job: job.to_string(),
                rank,
                other: format!(
                    "held by {}; this process is {me}",
                    String::from_utf8_lossy(&held.value)
                ),
            });
        };
        rt.spawn(keep_alive(
            api.clone(),
            state.clone(),
            opts.clone(),
            Holder {
                leases: [lease, rounds_lease],
                claim: claim.clone(),
                claims: format!("{root}/claims/{rank:08}/"),
                instance: instance.clone(),
                claimed_at,
                job: job.to_string(),
                rank,
            },
        ));
        tracing::info!(rank, world, %me, "claimed the rank in etcd");
        Ok(EtcdCoordinator {
            rt: Some(rt),
            api,
            opts,
            root,
            rank,
            world,
            lease,
            rounds_lease,
            instance,
            me,
            claimed_at,
            start,
            state,
        })
    }

    /// Every key this job has in etcd (for operators and tests): claims,
    /// second claims and round values.
    pub fn keys(&self) -> Result<Vec<String>> {
        let t = self.opts.request_timeout;
        let prefix = format!("{}/", self.root);
        let (kvs, _) = self.on_own_thread(self.api.range_prefix(prefix.as_bytes(), t))?;
        Ok(kvs
            .into_iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect())
    }

    /// Which process holds each rank that is held now (host, pid,
    /// instance).
    pub fn members(&self) -> Result<BTreeMap<u32, String>> {
        let t = self.opts.request_timeout;
        let prefix = format!("{}/ranks/", self.root);
        let (kvs, _) = self.on_own_thread(self.api.range_prefix(prefix.as_bytes(), t))?;
        Ok(kvs
            .into_iter()
            .filter_map(|kv| {
                let r = std::str::from_utf8(kv.key.strip_prefix(prefix.as_bytes())?)
                    .ok()?
                    .parse()
                    .ok()?;
                Some((r, String::from_utf8_lossy(&kv.value).into_owned()))
            })
            .collect())
    }

    /// Runs `f` on the coordinator's runtime from a thread of its own (the
    /// caller may be inside an async runtime, where blocking would panic).
    fn on_own_thread<T: Send>(
        &self,
        f: impl std::future::Future<Output = Result<T>> + Send,
    ) -> Result<T> {
        let rt = self.rt()?;
        std::thread::scope(|sc| {
            sc.spawn(|| rt.block_on(f))
                .join()
                .unwrap_or_else(|_| Err(Error::Coordination("the etcd call panicked".into())))
        })
    }

    fn rt(&self) -> Result<&tokio::runtime::Runtime> {
        self.rt
            .as_ref()
            .ok_or_else(|| Error::Coordination("etcd coordinator closed".into()))
    }

    fn check_lost(&self) -> Result<()> {
        match &self.state.lock().map_err(poisoned)?.lost {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    async fn gather(&self, key: &str, value: Vec<u8>, timeout: Duration) -> Result<Vec<Vec<u8>>> {
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
            self.check_lost()?;
            // The round and the claims at one revision (a transient etcd
            // error is retried until the deadline).
            let (values, claims, rev) = match self
                .api
                .range_two(round.as_bytes(), members.as_bytes(), t)
                .await
            {
                Ok(v) => v,
                Err(e) if Instant::now() < deadline => {
                    tracing::warn!(error = %e, "etcd read failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut holder: BTreeMap<u32, Claim> = BTreeMap::new();
            for kv in &claims {
                if let Some(r) = kv.key.strip_prefix(members.as_bytes()).and_then(rank_in) {
                    let c = parse_claim(&kv.value, kv.mod_revision);
                    // An exited claim older than this process is an earlier
                    // incarnation's: as if the rank had not come yet. So is
                    // a live claim of another start of the job (a process
                    // of the previous start that was killed holds its claim
                    // until its lease expires): its disappearing is not
                    // this start's rank dying.
                    let older = c.exited && c.mod_revision < self.claimed_at;
                    let other_start = self.opts.incarnation.is_some() && c.start != self.start;
                    if !older && !other_start {
                        holder.insert(r, c);
                    }
                }
            }
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
            {
                // A rank whose live claim was seen and is gone has died; one
                // that exited without a value here will never give one.
                let mut st = self.state.lock().map_err(poisoned)?;
                st.seen
                    .extend(holder.iter().filter(|(_, c)| !c.exited).map(|(r, _)| *r));
                let dead: Vec<u32> = missing
                    .iter()
                    .copied()
                    .filter(|r| match holder.get(r) {
                        None => st.seen.contains(r),
                        Some(c) => c.exited,
                    })
                    .collect();
                if !dead.is_empty() {
                    return Err(Error::Coordination(format!(
                        "{key}: rank{} {dead:?} left (the process ended or its lease expired: it or its node died); {} of {} ranks reported",
                        if dead.len() == 1 { "" } else { "s" },
                        got.len(),
                        self.world
                    )));
                }
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

/// What the keep-alive task needs to know about this process's claim.
struct Holder {
    leases: [i64; 2],
    claim: String,
    claims: String,
    instance: String,
    claimed_at: i64,
    job: String,
    rank: u32,
}

/// Keeps the claim's lease alive every third of its TTL (first, before
/// anything else), the rounds' lease too, and checks that the claim is
/// still this process's and that no newer process tried to take the rank;
/// records why the rank was lost, then stops.
async fn keep_alive(api: Arc<EtcdApi>, state: Arc<Mutex<State>>, opts: EtcdOptions, h: Holder) {
    let every = opts.lease_ttl / 3;
    // A renewal must not outlast its own period.
    let t = every.max(Duration::from_millis(500));
    let mut next = tokio::time::Instant::now() + every;
    loop {
        tokio::time::sleep_until(next).await;
        next += every;
        let lost = match api.keepalive(h.leases[0], t).await {
            Ok(0) => Some(Error::Coordination(format!(
                "rank {}: this process's etcd lease expired (unreachable for over {:?}); its rank may be taken by another process",
                h.rank, opts.lease_ttl
            ))),
            Ok(_) => {
                let _ = api.keepalive(h.leases[1], t).await;
                check_claim(&api, &h, t).await
            }
            Err(e) => {
                tracing::warn!(error = %e, "etcd keep-alive failed; retrying");
                None
            }
        };
        if let Some(e) = lost {
            tracing::error!(error = %e, "lost the rank");
            if let Ok(mut st) = state.lock() {
                st.lost = Some(e);
            }
            return;
        }
    }
}

/// Whether the claim is still this process's, and no process tried to
/// take the rank since it was claimed (an older attempt's marker, from
/// before this claim, is not about this process).
async fn check_claim(api: &EtcdApi, h: &Holder, t: Duration) -> Option<Error> {
    let (held, _) = api.range_prefix(h.claim.as_bytes(), t).await.ok()?;
    let mine = held
        .iter()
        .find(|kv| kv.key == h.claim.as_bytes())
        .is_some_and(|kv| parse_claim(&kv.value, kv.mod_revision).instance == h.instance);
    if !mine {
        return Some(Error::RankClaimed {
            job: h.job.clone(),
            rank: h.rank,
            other: "another process holds it now (this process's claim was lost)".into(),
        });
    }
    let (tried, _) = api.range_prefix(h.claims.as_bytes(), t).await.ok()?;
    tried
        .into_iter()
        .find(|kv| kv.create_revision > h.claimed_at)
        .map(|kv| Error::RankClaimed {
            job: h.job.clone(),
            rank: h.rank,
            other: format!(
                "another process tried to claim it: {}",
                String::from_utf8_lossy(&kv.value)
            ),
        })
}

impl Coordinator for EtcdCoordinator {
    fn world_size(&self) -> u32 {
        self.world
    }

    fn all_gather(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        if rank != self.rank {
            return Err(Error::Config(format!(
                "this coordinator holds rank {}, not {rank}",
                self.rank
            )));
        }
        self.check_lost()?;
        self.on_own_thread(self.gather(key, value, timeout))
    }
}

impl Drop for EtcdCoordinator {
    fn drop(&mut self) {
        let lost = self.state.lock().map_or(true, |st| st.lost.is_some());
        if let Some(rt) = self.rt.take() {
            if lost {
                // Another process may hold the rank now: touch nothing.
                rt.shutdown_background();
                return;
            }
            // Leave the claim marked exited, on the rounds' lease: a slower
            // rank still uses this process's last values, and a new process
            // may take the rank at once. Then the claim's own lease goes.
            let (api, t) = (
                self.api.clone(),
                self.opts.request_timeout.min(Duration::from_secs(2)),
            );
            let key = format!("{}/ranks/{:08}", self.root, self.rank);
            let value = format!("{} exited", self.me);
            let (lease, rounds) = (self.lease, self.rounds_lease);
            let _ = std::thread::spawn(move || {
                rt.block_on(async {
                    // Only while the claim is still on this process's
                    // lease (another process may hold the rank by now).
                    let _ = api
                        .put_if_lease(key.as_bytes(), value.as_bytes(), rounds, lease, t)
                        .await;
                    let _ = api.revoke(lease, t).await;
                });
                rt.shutdown_background();
            })
            .join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_escape_so_no_round_is_a_prefix_of_another() {
        assert_eq!(escape("restore/j/1"), "restore%2Fj%2F1");
        assert!(!escape("restore/j/1/ready/5").starts_with(&format!("{}/", escape("restore/j/1"))));
        assert_eq!(escape("a%2Fb"), "a%252Fb");
    }

    #[test]
    fn bad_options_are_config_errors() {
        let e = EtcdCoordinator::connect(EtcdOptions::default(), "j", 0, 1).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        let e = EtcdCoordinator::connect(EtcdOptions::default(), "j", 2, 2).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        let opts = EtcdOptions {
            endpoints: vec!["http://127.0.0.1:1".into()],
            cert_file: Some("/x".into()),
            ..EtcdOptions::default()
        };
        let e = EtcdCoordinator::connect(opts, "j", 0, 1).unwrap_err();
        assert!(e.to_string().contains("needs its key"), "{e}");
    }
}
