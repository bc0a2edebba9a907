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
mod claims;
mod decide;
mod decided;
mod gather;
mod grpc;
mod members;
mod node;
mod node_leader;
#[cfg(test)]
mod node_link_tests;
mod node_member;
mod proto;
mod security;
mod watch;
mod wire;

pub use node::EtcdRank;
pub use node_member::{NodeCoordinator, NodePlace};

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::Config;
use crate::coord::coordinator::{Coordinator, Reduce};
use crate::error::{Error, Result};
use api::EtcdApi;
use claims::{claim_rank, keep_alive, ClaimOf, Holder};
use security::Security;

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
    /// The claims' history is replayed up to this revision (see
    /// `EtcdCoordinator::replay_claims`; 0: not yet).
    replayed_to: i64,
    /// This rank's key of the last complete round (deleted after the next).
    last_round: Option<Vec<u8>>,
    /// Calls of each all-gather key so far: a key used again (a step
    /// saved again after a failed commit) is a new round, never mixed with
    /// the failed one's values.
    attempts: std::collections::HashMap<String, u32>,
    /// This process decides (holds rank 0): the prefix of its last
    /// decided round, cleared with the next decision.
    last_decided: Option<String>,
    /// Until when the claims' lease surely lives: the send time of the
    /// grant or of the last renewal etcd answered, plus the TTL it gave
    /// (etcd counts the TTL from when it got the request, later).
    lease_until: Option<std::time::Instant>,
}

/// Ranks in many processes agreeing through etcd. One per process; it
/// claims its rank (or, [`EtcdCoordinator::connect_node`], the ranks of a
/// node it runs) on connect and holds them until dropped.
pub struct EtcdCoordinator {
    rt: Option<tokio::runtime::Runtime>,
    api: Arc<EtcdApi>,
    opts: EtcdOptions,
    root: String,
    /// The first rank this process holds.
    rank: u32,
    /// How many ranks it holds (`rank..rank + count`).
    count: u32,
    world: u32,
    /// The claim's lease (short: a dead process is seen within it).
    lease: i64,
    /// The rounds' lease (longer; also holds the claim once exited).
    rounds_lease: i64,
    instance: String,
    me: String,
    /// The revision at which this process claimed its first rank: a claim
    /// that exited before it belongs to an earlier incarnation of the job.
    claimed_at: i64,
    /// The revision of each of its claims (by rank from `rank`).
    claims: Vec<i64>,
    /// This start of the job, as its claim names it.
    start: Option<String>,
    state: Arc<Mutex<State>>,
    /// The ranks of this process waiting in a reducing round
    /// ([`EtcdRank`]).
    local: node::Local,
    /// Requests the keep-alive task sent.
    kept_alive: Arc<std::sync::atomic::AtomicU64>,
    /// Requests the reducing rounds sent.
    rounds_sent: std::sync::atomic::AtomicU64,
    /// The decider's copy of the claims, from its last round's read.
    members: Mutex<members::Members>,
    /// The job's decisions, as one watch kept across rounds brings them
    /// (a process other than the decider's).
    decisions: Arc<decided::Decisions>,
    /// Held for a replay of the claims' history (one at a time: see
    /// `EtcdCoordinator::replay_claims`).
    replaying: tokio::sync::Mutex<()>,
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
        Self::connect_ranks(opts, job, rank..rank.saturating_add(1), world)
    }

    /// Connects for a process that runs the ranks `ranks` of `job` (one
    /// node's, each on a thread or task): it claims them all on one lease,
    /// and each rank takes part through its [`EtcdRank`]
    /// ([`EtcdCoordinator::rank_handle`]). A reducing round then costs
    /// etcd a few requests per process, not per rank, and its keep-alives
    /// four per lease period for the whole node.
    pub fn connect_node(
        opts: EtcdOptions,
        job: &str,
        ranks: Range<u32>,
        world: u32,
    ) -> Result<Arc<Self>> {
        Self::connect_ranks(opts, job, ranks, world).map(Arc::new)
    }

    fn connect_ranks(opts: EtcdOptions, job: &str, ranks: Range<u32>, world: u32) -> Result<Self> {
        // On a thread of its own: the caller may be inside an async
        // runtime, where blocking on (or dropping) ours would panic.
        std::thread::scope(|sc| {
            sc.spawn(|| Self::connect_here(opts, job, ranks, world))
                .join()
                .unwrap_or_else(|_| Err(Error::Coordination("etcd connect panicked".into())))
        })
    }

    fn connect_here(opts: EtcdOptions, job: &str, ranks: Range<u32>, world: u32) -> Result<Self> {
        strata_format::names::validate_job_id(job).map_err(|e| Error::Config(e.to_string()))?;
        if world == 0 || ranks.is_empty() || ranks.end > world {
            return Err(Error::Config(format!(
                "rank {} of world size {world}",
                if ranks.is_empty() {
                    ranks.start
                } else {
                    ranks.end - 1
                }
            )));
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
        let (api, asked, lease) = first_contact(&rt, &opts, &sec)?;
        let api = Arc::new(api);
        let root = format!("{}/{job}", opts.prefix.trim_end_matches('/'));
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
        let state = Arc::new(Mutex::new(State {
            lease_until: Some(asked + Duration::from_secs(opts.lease_ttl.as_secs().max(1))),
            ..State::default()
        }));
        let mut claims = Vec::with_capacity(ranks.len());
        for rank in ranks.clone() {
            let claimed = rt.block_on(claim_rank(
                &api,
                &opts,
                ClaimOf {
                    root: &root,
                    job,
                    rank,
                    me: &me,
                    instance: &instance,
                    leases: [lease, rounds_lease],
                },
            ));
            match claimed {
                Ok(rev) => claims.push(rev),
                Err(e) => {
                    let _ = rt.block_on(api.revoke(lease, t));
                    let _ = rt.block_on(api.revoke(rounds_lease, t));
                    return Err(e);
                }
            }
        }
        let claimed_at = claims.first().copied().unwrap_or_default();
        let kept_alive = Arc::new(std::sync::atomic::AtomicU64::new(0));
        rt.spawn(keep_alive(
            api.clone(),
            state.clone(),
            opts.clone(),
            Holder {
                leases: [lease, rounds_lease],
                root: root.clone(),
                ranks: ranks.clone(),
                instance: instance.clone(),
                claimed: claims.clone(),
                job: job.to_string(),
                sent: kept_alive.clone(),
            },
        ));
        tracing::info!(first = ranks.start, ranks = ranks.len(), world, %me, "claimed the ranks in etcd");
        let followed_from = claims.iter().copied().max().unwrap_or_default();
        let coord = EtcdCoordinator {
            rt: Some(rt),
            api,
            opts,
            root,
            rank: ranks.start,
            count: ranks.end - ranks.start,
            world,
            lease,
            rounds_lease,
            instance,
            me,
            claimed_at,
            claims,
            start,
            state,
            local: node::Local::default(),
            kept_alive,
            rounds_sent: std::sync::atomic::AtomicU64::new(0),
            members: Mutex::default(),
            decisions: Arc::default(),
            replaying: tokio::sync::Mutex::new(()),
        };
        // A process other than the decider's follows the job's decisions
        // from now on, not from its first round: at a restart every
        // process's first round is the restore, all at once, and etcd
        // then set up every process's watch beside every node's values
        // (where the processes connect one after another).
        if !(coord.rank..coord.rank + coord.count).contains(&0) {
            if let Some(rt) = &coord.rt {
                let _in = rt.enter();
                coord
                    .decisions
                    .follow(&coord.api, coord.every_decision(), followed_from, t)?;
            }
        }
        Ok(coord)
    }

    /// Requests this process has sent to etcd so far (keep-alives and
    /// watches included): what a round costs etcd, for benchmarks and
    /// operators.
    pub fn requests(&self) -> u64 {
        self.api.requests()
    }

    /// Bytes of etcd's answers this process has read so far (all
    /// requests, watches included).
    pub fn received_bytes(&self) -> u64 {
        self.api.received()
    }

    /// Of [`EtcdCoordinator::requests`], those of the process's
    /// background: the keep-alive task (four per third of the lease,
    /// however many ranks the process holds) and the watch that follows
    /// the job's decisions (one a minute, and again after a failure).
    pub fn keepalive_requests(&self) -> u64 {
        self.kept_alive.load(std::sync::atomic::Ordering::Relaxed) + self.decisions.requests()
    }

    /// Of [`EtcdCoordinator::requests`], those of the reducing rounds
    /// (`all_reduce`: the commit barrier, the restore rounds).
    pub fn round_requests(&self) -> u64 {
        self.rounds_sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every key this job has in etcd (for operators and tests): claims,
    /// second claims and round values.
    pub fn keys(&self) -> Result<Vec<String>> {
        let t = self.opts.request_timeout;
        let prefix = format!("{}/", self.root);
        let (kvs, _) = self.block_on(self.api.range_prefix(prefix.as_bytes(), t))?;
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
        let (kvs, _) = self.block_on(self.api.range_prefix(prefix.as_bytes(), t))?;
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

    /// Runs `f` on the coordinator's runtime and waits for it: on the
    /// calling thread, or, where the caller is inside an async runtime
    /// (blocking there would panic), from a thread of its own. Not a
    /// thread per call where none is needed: at 4,096 simulated ranks, a
    /// round's thread exiting and being joined in a process of thousands
    /// of threads took 200 ms at the median node (and the node's ranks
    /// waited for it) after the decision had come.
    fn block_on<T: Send>(
        &self,
        f: impl std::future::Future<Output = Result<T>> + Send,
    ) -> Result<T> {
        let rt = self.rt()?;
        if tokio::runtime::Handle::try_current().is_err() {
            // A panic is this call's error, as from a thread of its own.
            return std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(f)))
                .unwrap_or_else(|_| Err(Error::Coordination("the etcd call panicked".into())));
        }
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

    /// Whether this process surely still holds its claims, without asking
    /// etcd: none was lost, and the lease cannot have run out since its
    /// last renewal (a tenth of the TTL, at least 100 ms, kept in hand).
    /// Nobody else can take a claim while its lease lives.
    fn surely_held(&self) -> Result<bool> {
        let st = self.state.lock().map_err(poisoned)?;
        if let Some(e) = &st.lost {
            return Err(e.clone());
        }
        let margin = (self.opts.lease_ttl / 10).max(Duration::from_millis(100));
        Ok(st
            .lease_until
            .is_some_and(|u| std::time::Instant::now() + margin < u))
    }
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
        if rank != self.rank || self.count != 1 {
            return Err(Error::Config(format!(
                "this coordinator holds rank {}, not {rank}{}",
                self.rank,
                if self.count == 1 {
                    ""
                } else {
                    " (a process of several ranks gathers through EtcdCoordinator::rank_handle)"
                }
            )));
        }
        self.check_lost()?;
        self.block_on(self.gather(key, value, timeout))
    }

    fn all_reduce(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
        reduce: &Reduce<'_>,
    ) -> Result<Vec<u8>> {
        self.reduce_locally(rank, key, value, timeout, Some(reduce))
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
            let keys: Vec<String> = self
                .ranks()
                .map(|r| format!("{}/ranks/{r:08}", self.root))
                .collect();
            let value = format!("{} exited", self.me);
            let (lease, rounds) = (self.lease, self.rounds_lease);
            let _ = std::thread::spawn(move || {
                rt.block_on(async {
                    // Only while a claim is still on this process's lease
                    // (another process may hold the rank by now).
                    for key in keys {
                        let _ = api
                            .put_if_lease(key.as_bytes(), value.as_bytes(), rounds, lease, t)
                            .await;
                    }
                    let _ = api.revoke(lease, t).await;
                });
                rt.shutdown_background();
            })
            .join();
        }
    }
}

/// Connects and takes the process's lease, waiting up to a request's time
/// limit for an etcd that does not answer yet: a job's ranks often start
/// beside etcd, or before their node's network is up, and one rank
/// failing there fails the whole start. Only "unreachable" is waited out;
/// etcd's refusals (a password, a certificate it names) are not.
fn first_contact(
    rt: &tokio::runtime::Runtime,
    opts: &EtcdOptions,
    sec: &Security,
) -> Result<(EtcdApi, std::time::Instant, i64)> {
    let t = opts.request_timeout;
    let deadline = std::time::Instant::now() + t;
    loop {
        let tried = rt.block_on(async {
            let api = EtcdApi::connect(opts.endpoints.clone(), sec, t).await?;
            let asked = std::time::Instant::now();
            let lease = api.grant(opts.lease_ttl, t).await?;
            Ok::<_, Error>((api, asked, lease))
        });
        match tried {
            Err(Error::Coordination(m))
                if m.starts_with(api::NOT_ANSWERING) && std::time::Instant::now() < deadline =>
            {
                tracing::warn!(error = %m, "etcd does not answer yet; trying again");
                std::thread::sleep(Duration::from_millis(250));
            }
            r => return r,
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
