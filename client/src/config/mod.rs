//! [`Config`]: settings for a [`Checkpointer`](crate::Checkpointer), from a
//! builder, a TOML file, and `STRATA_*` environment variables.
//!
//! ```toml
//! job = "llama-405b"
//! rank = 0
//! world_size = 8
//! l1_dir = "/nvme/strata"
//! chunk_size = 16777216
//! io_engine = "auto"          # auto | io_uring | psync
//! keep_last = 3
//! busy_policy = "wait"        # wait | skip | error
//! on_background_error = "raise"  # raise | log: a failed background save is raised by the next save, flush or close
//! hash_threads = 0                 # 0: this rank's share of the cores (cores / ranks on the node)
//! background_nice = 10             # nice value of the background threads (0: as training's)
//! persist_during_snapshot = false  # default: true with 4+ cores
//! coordination_timeout_secs = 600
//! skip_unreadable_tiers = false     # restore without a tier that cannot be listed (default: error)
//! gc_grace_secs = 600
//! l3_url = "s3://bucket/checkpoints"   # also gs://, az://, file:///dir, memory://
//! upload_every = 10                     # every 10th committed step goes to L3 (0: only on request)
//! upload_min_interval_secs = 0          # and at most one per this many seconds
//! upload_bytes_per_sec = 0              # bandwidth cap of uploads (0: none)
//! max_pending_uploads = 4               # steps held on L1 waiting for an upload (0: no bound)
//! max_pending_pushes = 4                # steps held on L1 waiting for their push to the peers
//! upload_backlog = "drop"               # past either: drop the oldest waiting (reported) | wait (back-pressure)
//! l3_keep_last = 4                      # L3 retention after each upload (0: never collect L3)
//! l3_keep_every = 0                     # and every K-th step on L3
//! l3_gc_grace_secs = 3600               # unreferenced L3 chunks older than this are deleted
//! rehydrate_l1 = true                   # a restore from L3 also writes the step to L1
//! node = "node-a"                       # this node's name among the peers
//! peers = ["node-a=10.0.0.1:7070", "node-b=10.0.0.2:7070"]   # L2 peer services ("slurm:7070": every node of the Slurm allocation)
//! replicas = 1                          # replicas of each step on other nodes
//! replication_retry_secs = 30           # degraded steps are pushed again this often
//! eager_push = true                     # push new chunks to the peers during the L1 write
//! peer_certs = "/etc/strata/certs"      # ca.pem, client-<job>.pem, client-<job>.key
//! etcd_endpoints = ["https://10.0.0.5:2379"]   # ranks in separate processes agree through etcd
//! metrics_listen = "0.0.0.0:9400"       # Prometheus metrics of this process at /metrics
//! etcd_user = "strata"                  # with etcd_password_file; sent to https:// endpoints only
//! etcd_password_file = "/etc/strata/etcd-password"
//! etcd_allow_plaintext_auth = false     # true: also send it to http:// endpoints, in clear
//! etcd_node_rounds = true               # a node's rank processes meet locally: etcd sees one per node
//!
//! [l3_options]                          # object_store options (win over the environment)
//! endpoint = "http://127.0.0.1:9000"
//! allow_http = "true"
//! ```
//!
//! Every key can be overridden by an environment variable of the same name in
//! upper case with a `STRATA_` prefix (`STRATA_L1_DIR=/nvme/strata`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use strata_format::layout::{validate_chunk_size, DEFAULT_CHUNK_SIZE};
use strata_format::names::validate_job_id;
use strata_tiered::EngineChoice;

use crate::error::{Error, Result};

/// What `save` does when the previous save is still persisting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BusyPolicy {
    /// Block until the previous save is durable, then snapshot.
    #[default]
    Wait,
    /// Skip this step (counted); training goes on.
    Skip,
    /// Return [`Error::Busy`].
    Error,
}

impl std::str::FromStr for BusyPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "wait" => Ok(BusyPolicy::Wait),
            "skip" => Ok(BusyPolicy::Skip),
            "error" => Ok(BusyPolicy::Error),
            o => Err(format!("unknown busy policy {o:?} (wait, skip, error)")),
        }
    }
}

/// What happens when more committed steps wait for an upload to L3 than
/// `max_pending_uploads` (L3 slow or down): each one is held on L1 until
/// it is uploaded, so an unbounded backlog would fill the node's disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UploadBacklog {
    /// The oldest step still waiting is dropped from the queue (reported:
    /// its upload state says why, and a warning is logged); L1 retention
    /// may then retire it.
    #[default]
    Drop,
    /// The commit of the next step waits until the backlog shrinks, so
    /// saves slow down to L3's pace (back-pressure through the busy
    /// policy).
    Wait,
}

impl std::str::FromStr for UploadBacklog {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "drop" => Ok(UploadBacklog::Drop),
            "wait" => Ok(UploadBacklog::Wait),
            o => Err(format!("unknown upload backlog policy {o:?} (drop, wait)")),
        }
    }
}

/// This host's name (the kernel's), else `HOSTNAME`, else "unknown": the
/// default node name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Settings of a checkpointer. Its `Debug` output hides secrets (see
/// [`Config::redacted`]).
#[derive(Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Job namespace.
    pub job: String,
    /// This process's rank.
    pub rank: u32,
    /// Number of ranks.
    pub world_size: u32,
    /// This process's rank among its node's (`LOCAL_RANK`,
    /// `SLURM_LOCALID`), when the launcher says.
    pub local_rank: Option<u32>,
    /// Ranks on this node (`LOCAL_WORLD_SIZE`), when the launcher says.
    pub local_world_size: Option<u32>,
    /// This node's index among the job's nodes (`GROUP_RANK`,
    /// `SLURM_NODEID`), when the launcher says. The node's name for the
    /// peers stays `node` (the host name by default).
    pub node_rank: Option<u32>,
    /// L1 directory on local NVMe.
    pub l1_dir: PathBuf,
    /// Chunk size in bytes (a multiple of 64; default 16 MiB).
    pub chunk_size: u32,
    /// Disk I/O engine: `auto`, `io_uring` or `psync`.
    pub io_engine: String,
    /// Committed steps kept on L1.
    pub keep_last: usize,
    /// What `save` does while the previous save persists.
    pub busy_policy: BusyPolicy,
    /// A save that failed in the background: raised by the next call, or logged.
    pub on_background_error: crate::stats::OnBackgroundError,
    /// Threads hashing chunks in the background (and copying the
    /// snapshot). 0 (the default): this rank's share of the node's cores,
    /// the cores it may use divided among `local_world_size` ranks unless
    /// the launcher bound it to fewer CPUs already
    /// ([`Config::effective_hash_threads`]).
    pub hash_threads: usize,
    /// The nice value of this process's background threads (the persist
    /// worker and its hashing, the replicator, the uploader, the runtime
    /// that moves their bytes), 0..=19: where the cores are busy, the
    /// training threads (and a save's snapshot, which runs on them) get
    /// them first. 0: the same priority as training.
    pub background_nice: u8,
    /// Start hashing and writing a save's first batches while `save` still
    /// copies the later ones: the step is durable sooner, but the copy
    /// shares the cores with hashing and the memory bus with disk DMA, so
    /// the stall grows where cores are few (on 2 cores, measured: stall
    /// 0.20 → 0.27 s and durable 1.6 → 1.1 s on a 1.84 GiB full save; on
    /// an incremental save, stall 0.17 → 0.39 s). Default: on with 4 or
    /// more cores, off below.
    pub persist_during_snapshot: bool,
    /// How long ranks wait for each other at a commit or restore.
    pub coordination_timeout_secs: u64,
    /// Restore (and `latest_step`) without a tier that cannot be listed.
    /// Off by default: an L3 or a peer that cannot be listed may hold a
    /// newer step than the readable tiers (when this rank's L1 holds none,
    /// or another rank holds a newer one), and restoring without it would
    /// silently go back to an older step (or to none, and a resuming loop
    /// would start over). The restore then fails with
    /// `Error::TierUnavailable` instead.
    pub skip_unreadable_tiers: bool,
    /// Object storage for L3, as a URL (none: no L3). Credentials inside
    /// it (a userinfo password, query values such as an Azure SAS) are
    /// printed as `<redacted>` wherever the URL is shown.
    pub l3_url: Option<String>,
    /// `object_store` options for L3 (`endpoint`, `region`, `allow_http`,
    /// credentials, ...); they win over the provider's environment variables.
    pub l3_options: std::collections::BTreeMap<String, String>,
    /// Upload every K-th committed step to L3 (steps divisible by K);
    /// 0 uploads only what `Checkpointer::upload` asks for.
    pub upload_every: u64,
    /// At most one policy upload per this many seconds (0: no limit).
    pub upload_min_interval_secs: u64,
    /// Bandwidth cap of uploads in bytes per second (0: none).
    pub upload_bytes_per_sec: u64,
    /// Most committed steps waiting for an upload (queued, not yet being
    /// uploaded); each is held on L1 meanwhile (0: no bound).
    pub max_pending_uploads: usize,
    /// What happens past `max_pending_uploads` and `max_pending_pushes`.
    pub upload_backlog: UploadBacklog,
    /// Most committed steps waiting for their push to the peers (not yet
    /// being pushed); each is held on L1 meanwhile (0: no bound). Past it,
    /// `upload_backlog` applies (a dropped push leaves the step degraded).
    pub max_pending_pushes: usize,
    /// L3 retention, run by rank 0's uploader after an upload for the
    /// whole job (every rank's shards; chunks no manifest references): the
    /// newest this many steps complete on L3 are kept (0: L3 is never
    /// collected).
    pub l3_keep_last: usize,
    /// Also keep every L3 step divisible by this (0: none).
    pub l3_keep_every: u64,
    /// An unreferenced chunk on L3 is deleted only once L3 has not written
    /// it for this long; an upload rewrites a chunk it reuses that is older
    /// than half of it (so a reused chunk is never deleted under an upload
    /// that takes less than half of it). Also how long a step may stay
    /// incomplete on L3, its missing ranks' uploads standing still, before
    /// all but the newest `l3_keep_last` such steps go. 0 is safe only
    /// with one uploading rank (no reuse is protected then).
    pub l3_gc_grace_secs: u64,
    /// This node's name in `peers` (replicas go to other nodes; default:
    /// the host name).
    pub node: String,
    /// The peer services of the cluster, `name=host:port` each (L2; empty:
    /// no replication). Every node lists the same set. Under Slurm, the one
    /// entry `slurm:PORT` stands for every node of the allocation
    /// (`SLURM_JOB_NODELIST`, expanded by [`Config::with_env`]).
    pub peers: Vec<String>,
    /// Replicas of each committed step on other nodes.
    pub replicas: usize,
    /// Spread the ranks of one node over different peers (the ring
    /// rotated by rank). Off (the default), every rank of a node
    /// replicates to the same peers, so tensors that data-parallel ranks
    /// hold identically are stored once per peer, and a rank finding them
    /// already pushed by its neighbour does not send them again.
    pub spread_replicas: bool,
    /// While a step still on L1 is degraded (a peer was down or cut off),
    /// it is pushed again this often (and at once after a later step
    /// replicates fully), so a returning peer gets it without a new save.
    pub replication_retry_secs: u64,
    /// Push a save's new chunks to its peers while they are written to L1,
    /// from the staging memory (the step is then mostly replicated when it
    /// commits); off: the whole push runs after the L1 commit, from L1.
    pub eager_push: bool,
    /// Directory with the cluster CA (`ca.pem`) and this job's client
    /// certificate (`client-<job>.pem`, `client-<job>.key`).
    pub peer_certs: Option<PathBuf>,
    /// A full restore of a step L1 does not hold (read from L3) also writes
    /// it to L1 and commits it there, overlapped with the restore, so the
    /// next save deduplicates against it and the next restore is local.
    pub rehydrate_l1: bool,
    /// Retention deletes an unreferenced chunk only if it was not written or
    /// deduplicated against for this long, so a save in flight (of any rank
    /// sharing the directory) never loses a chunk it relies on. 0 is safe
    /// only where one rank uses the directory: another rank's retention
    /// would delete the chunks a save wrote before its manifest.
    pub gc_grace_secs: u64,
    /// etcd client URLs (`http://10.0.0.5:2379`, ...): ranks in separate
    /// processes agree through etcd ([`crate::EtcdCoordinator`]). Empty:
    /// a world of one, or a coordinator handed to the builder.
    pub etcd_endpoints: Vec<String>,
    /// Key prefix in etcd (every job lives under `<prefix>/<job>/`).
    pub etcd_prefix: String,
    /// Lease of a rank in etcd: a dead rank is seen within this time.
    pub etcd_lease_secs: u64,
    /// PEM of the CA that signed etcd's certificates (https endpoints).
    pub etcd_ca: Option<PathBuf>,
    /// PEM client certificate and key for etcd (mutual TLS).
    pub etcd_cert: Option<PathBuf>,
    /// The key of `etcd_cert`.
    pub etcd_key: Option<PathBuf>,
    /// Which start of the job this is (`TORCHELASTIC_RESTART_COUNT`,
    /// `SLURM_RESTART_COUNT`, or `STRATA_INCARNATION`): the etcd rounds of
    /// different starts never meet.
    pub incarnation: Option<String>,
    /// etcd user (with `etcd_password_file`).
    pub etcd_user: Option<String>,
    /// A file holding the etcd user's password (kept out of the config).
    pub etcd_password_file: Option<PathBuf>,
    /// Send the etcd user's password to `http://` endpoints (in clear, to
    /// anyone on the path): off by default, and a user with an `http://`
    /// endpoint is then a configuration error. For a network you trust.
    pub etcd_allow_plaintext_auth: bool,
    /// When the launcher says where this rank sits on its node
    /// (`local_rank`, `local_world_size` > 1), the node's rank processes
    /// meet over a local socket and local rank 0 takes part in etcd's
    /// rounds for all of them: a round costs etcd a few requests per node,
    /// not per rank. Needs each node's ranks consecutive (torchrun; Slurm's
    /// block distribution); off: every process is its own etcd client.
    /// The Python package's rounds over torch.distributed's store follow
    /// it too (a node's ranks meet on a store of the node's own).
    pub etcd_node_rounds: bool,
    /// Serve this process's metrics to Prometheus at
    /// `http://<metrics_listen>/metrics` (`"0.0.0.0:9400"`; port 0 picks
    /// one, [`crate::Checkpointer::metrics_addr`] says which). None: not
    /// served ([`crate::Checkpointer::metrics_text`] still renders them).
    pub metrics_listen: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            job: "default".into(),
            rank: 0,
            world_size: 1,
            local_rank: None,
            local_world_size: None,
            node_rank: None,
            l1_dir: PathBuf::from("strata-l1"),
            chunk_size: DEFAULT_CHUNK_SIZE,
            io_engine: "auto".into(),
            keep_last: 3,
            busy_policy: BusyPolicy::Wait,
            on_background_error: crate::stats::OnBackgroundError::Raise,
            hash_threads: 0,
            background_nice: 10,
            persist_during_snapshot: std::thread::available_parallelism().map_or(1, |n| n.get())
                >= 4,
            coordination_timeout_secs: 600,
            skip_unreadable_tiers: false,
            l3_url: None,
            l3_options: std::collections::BTreeMap::new(),
            upload_every: 0,
            upload_min_interval_secs: 0,
            upload_bytes_per_sec: 0,
            max_pending_uploads: 4,
            upload_backlog: UploadBacklog::Drop,
            max_pending_pushes: 4,
            l3_keep_last: 4,
            l3_keep_every: 0,
            l3_gc_grace_secs: 3600,
            rehydrate_l1: true,
            node: hostname(),
            peers: Vec::new(),
            replicas: 1,
            spread_replicas: false,
            replication_retry_secs: 30,
            eager_push: true,
            peer_certs: None,
            gc_grace_secs: 600,
            etcd_endpoints: Vec::new(),
            etcd_prefix: "/strata".into(),
            etcd_lease_secs: 5,
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
            etcd_user: None,
            etcd_password_file: None,
            etcd_allow_plaintext_auth: false,
            etcd_node_rounds: true,
            metrics_listen: None,
            incarnation: None,
        }
    }
}

impl Config {
    /// Defaults, for the builder methods below.
    pub fn builder() -> Self {
        Self::default()
    }

    /// Sets the job id.
    pub fn job(mut self, job: impl Into<String>) -> Self {
        self.job = job.into();
        self
    }

    /// Sets rank and world size.
    pub fn rank(mut self, rank: u32, world_size: u32) -> Self {
        self.rank = rank;
        self.world_size = world_size;
        self
    }

    /// Sets the L1 directory.
    pub fn l1_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.l1_dir = dir.into();
        self
    }

    /// Sets the chunk size.
    pub fn chunk_size(mut self, bytes: u32) -> Self {
        self.chunk_size = bytes;
        self
    }

    /// Sets the I/O engine (`auto`, `io_uring`, `psync`).
    pub fn io_engine(mut self, engine: impl Into<String>) -> Self {
        self.io_engine = engine.into();
        self
    }

    /// Sets how many committed steps L1 keeps.
    pub fn keep_last(mut self, n: usize) -> Self {
        self.keep_last = n;
        self
    }

    /// Sets the busy policy.
    pub fn busy_policy(mut self, p: BusyPolicy) -> Self {
        self.busy_policy = p;
        self
    }

    /// Sets the garbage-collection grace period.
    pub fn gc_grace_secs(mut self, secs: u64) -> Self {
        self.gc_grace_secs = secs;
        self
    }

    /// Sets whether persisting starts while the snapshot is being taken.
    pub fn persist_during_snapshot(mut self, on: bool) -> Self {
        self.persist_during_snapshot = on;
        self
    }

    /// Sets the L3 object store URL.
    pub fn l3_url(mut self, url: impl Into<String>) -> Self {
        self.l3_url = Some(url.into());
        self
    }

    /// Sets one L3 `object_store` option.
    pub fn l3_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.l3_options.insert(key.into(), value.into());
        self
    }

    /// Uploads every K-th committed step to L3 (0: only on request).
    pub fn upload_every(mut self, k: u64) -> Self {
        self.upload_every = k;
        self
    }

    /// Sets this node's name and the cluster's peer services
    /// (`name=host:port`), with the directory of the CA and client
    /// certificate.
    pub fn peers(
        mut self,
        node: impl Into<String>,
        peers: impl IntoIterator<Item = String>,
        certs: impl Into<PathBuf>,
    ) -> Self {
        self.node = node.into();
        self.peers = peers.into_iter().collect();
        self.peer_certs = Some(certs.into());
        self
    }

    /// Replicas of each step on other nodes.
    pub fn replicas(mut self, r: usize) -> Self {
        self.replicas = r;
        self
    }

    /// How often degraded steps are pushed again (seconds).
    pub fn replication_retry_secs(mut self, secs: u64) -> Self {
        self.replication_retry_secs = secs;
        self
    }

    /// Whether new chunks go to the peers during the L1 write.
    pub fn eager_push(mut self, on: bool) -> Self {
        self.eager_push = on;
        self
    }

    /// Whether a full restore from L3 also writes the step to L1.
    pub fn rehydrate_l1(mut self, on: bool) -> Self {
        self.rehydrate_l1 = on;
        self
    }

    /// Caps upload bandwidth (bytes per second, 0: none).
    pub fn upload_bytes_per_sec(mut self, bps: u64) -> Self {
        self.upload_bytes_per_sec = bps;
        self
    }

    /// Sets the coordination timeout.
    pub fn coordination_timeout_secs(mut self, secs: u64) -> Self {
        self.coordination_timeout_secs = secs;
        self
    }

    /// Restores without a tier that cannot be listed (see
    /// [`Config::skip_unreadable_tiers`]).
    pub fn skip_unreadable_tiers(mut self, on: bool) -> Self {
        self.skip_unreadable_tiers = on;
        self
    }

    /// Parses TOML (missing keys take defaults).
    pub fn from_toml(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| Error::Config(e.to_string()))
    }

    /// Reads a TOML file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Self::from_toml(&text)
    }

    /// Applies `STRATA_*` overrides from an environment (`std::env::vars()`
    /// in production; injected in tests).
    ///
    /// The launcher's variables come first and `STRATA_*` wins over them:
    /// torchrun's `RANK` and `WORLD_SIZE`, Slurm's `SLURM_PROCID` and
    /// `SLURM_NTASKS` (torchrun's if both are set; Slurm's only inside a
    /// job step, where `SLURM_STEP_ID` is set). The node name stays
    /// the host name unless `STRATA_NODE` (or the file) says otherwise.
    pub fn with_env(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Result<Self> {
        let vars: Vec<(String, String)> = vars.into_iter().collect();
        let get = |name: &str| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        // Slurm's task variables describe a task of a job step (srun); a
        // batch script's own shell has SLURM_PROCID=0 too, and no step.
        let in_step = get("SLURM_STEP_ID").is_some();
        let launcher = |a: &str, b: &str| -> Result<Option<u32>> {
            let slurm = if in_step { get(b) } else { None };
            match get(a).or(slurm) {
                None => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| {
                    Error::Config(format!("{a} or {b}: {v:?} is not a rank or a world size"))
                }),
            }
        };
        if let Some(r) = launcher("RANK", "SLURM_PROCID")? {
            self.rank = r;
        }
        if let Some(w) = launcher("WORLD_SIZE", "SLURM_NTASKS")? {
            self.world_size = w;
        }
        if let Some(l) = launcher("LOCAL_RANK", "SLURM_LOCALID")? {
            self.local_rank = Some(l);
        }
        if let Some(l) = launcher("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE")? {
            self.local_world_size = Some(l);
        }
        if let Some(n) = launcher("GROUP_RANK", "SLURM_NODEID")? {
            self.node_rank = Some(n);
        }
        if let Some(i) = get("TORCHELASTIC_RESTART_COUNT").or_else(|| get("SLURM_RESTART_COUNT")) {
            self.incarnation = Some(i.to_string());
        }
        // What `with_slurm_peers` reads, once the settings are in.
        let slurm: Vec<(String, String)> = vars
            .iter()
            .filter(|(k, _)| k.starts_with("SLURM") || k == "STRATA_NODE")
            .cloned()
            .collect();
        for (k, v) in vars {
            let Some(key) = k.strip_prefix("STRATA_") else {
                continue;
            };
            let bad = |e: String| Error::Config(format!("{k}={v:?}: {e}"));
            let num = |v: &str| v.parse::<u64>().map_err(|e| bad(e.to_string()));
            let flag = |v: &str| match v {
                "1" | "true" | "on" => Ok(true),
                "0" | "false" | "off" => Ok(false),
                _ => Err(bad("expected true or false".into())),
            };
            match key {
                "JOB" => self.job = v.clone(),
                "RANK" => self.rank = num(&v)?.try_into().map_err(|_| bad("too large".into()))?,
                "WORLD_SIZE" => {
                    self.world_size = num(&v)?.try_into().map_err(|_| bad("too large".into()))?
                }
                "L1_DIR" => self.l1_dir = PathBuf::from(&v),
                "CHUNK_SIZE" => {
                    self.chunk_size = num(&v)?.try_into().map_err(|_| bad("too large".into()))?
                }
                "IO_ENGINE" => self.io_engine = v.clone(),
                "KEEP_LAST" => self.keep_last = num(&v)? as usize,
                "BUSY_POLICY" => self.busy_policy = v.parse().map_err(bad)?,
                "ON_BACKGROUND_ERROR" => self.on_background_error = v.parse().map_err(bad)?,
                "HASH_THREADS" => self.hash_threads = num(&v)? as usize,
                "BACKGROUND_NICE" => self.background_nice = num(&v)?.min(19) as u8,
                "PERSIST_DURING_SNAPSHOT" => self.persist_during_snapshot = flag(&v)?,
                "COORDINATION_TIMEOUT_SECS" => self.coordination_timeout_secs = num(&v)?,
                "SKIP_UNREADABLE_TIERS" => self.skip_unreadable_tiers = flag(&v)?,
                "GC_GRACE_SECS" => self.gc_grace_secs = num(&v)?,
                "L3_URL" => self.l3_url = (!v.is_empty()).then(|| v.clone()),
                "UPLOAD_EVERY" => self.upload_every = num(&v)?,
                "UPLOAD_MIN_INTERVAL_SECS" => self.upload_min_interval_secs = num(&v)?,
                "UPLOAD_BYTES_PER_SEC" => self.upload_bytes_per_sec = num(&v)?,
                "MAX_PENDING_UPLOADS" => self.max_pending_uploads = num(&v)? as usize,
                "UPLOAD_BACKLOG" => self.upload_backlog = v.parse().map_err(bad)?,
                "MAX_PENDING_PUSHES" => self.max_pending_pushes = num(&v)? as usize,
                "L3_KEEP_LAST" => self.l3_keep_last = num(&v)? as usize,
                "L3_KEEP_EVERY" => self.l3_keep_every = num(&v)?,
                "L3_GC_GRACE_SECS" => self.l3_gc_grace_secs = num(&v)?,
                "REHYDRATE_L1" => self.rehydrate_l1 = flag(&v)?,
                "NODE" => self.node = v.clone(),
                "LOCAL_RANK" => {
                    self.local_rank =
                        Some(num(&v)?.try_into().map_err(|_| bad("too large".into()))?)
                }
                "LOCAL_WORLD_SIZE" => {
                    self.local_world_size =
                        Some(num(&v)?.try_into().map_err(|_| bad("too large".into()))?)
                }
                "NODE_RANK" => {
                    self.node_rank = Some(num(&v)?.try_into().map_err(|_| bad("too large".into()))?)
                }
                "PEERS" => {
                    self.peers = v
                        .split(',')
                        .map(str::trim)
                        .filter(|p| !p.is_empty())
                        .map(str::to_string)
                        .collect()
                }
                "REPLICAS" => self.replicas = num(&v)? as usize,
                "SPREAD_REPLICAS" => self.spread_replicas = flag(&v)?,
                "REPLICATION_RETRY_SECS" => self.replication_retry_secs = num(&v)?,
                "EAGER_PUSH" => self.eager_push = flag(&v)?,
                "PEER_CERTS" => self.peer_certs = (!v.is_empty()).then(|| PathBuf::from(&v)),
                "ETCD_ENDPOINTS" => {
                    self.etcd_endpoints = v
                        .split(',')
                        .map(str::trim)
                        .filter(|p| !p.is_empty())
                        .map(str::to_string)
                        .collect()
                }
                "ETCD_PREFIX" => self.etcd_prefix = v.clone(),
                "INCARNATION" => self.incarnation = (!v.is_empty()).then(|| v.clone()),
                "ETCD_LEASE_SECS" => self.etcd_lease_secs = num(&v)?,
                "ETCD_CA" => self.etcd_ca = (!v.is_empty()).then(|| PathBuf::from(&v)),
                "ETCD_CERT" => self.etcd_cert = (!v.is_empty()).then(|| PathBuf::from(&v)),
                "ETCD_KEY" => self.etcd_key = (!v.is_empty()).then(|| PathBuf::from(&v)),
                "ETCD_USER" => self.etcd_user = (!v.is_empty()).then(|| v.clone()),
                "ETCD_PASSWORD_FILE" => {
                    self.etcd_password_file = (!v.is_empty()).then(|| PathBuf::from(&v))
                }
                "ETCD_ALLOW_PLAINTEXT_AUTH" => self.etcd_allow_plaintext_auth = flag(&v)?,
                "ETCD_NODE_ROUNDS" => self.etcd_node_rounds = flag(&v)?,
                "METRICS_LISTEN" => self.metrics_listen = (!v.is_empty()).then(|| v.clone()),
                other => {
                    if let Some(setting) = env_names::nearest(other) {
                        return Err(Error::Config(format!(
                            "{k} is not a setting; did you mean STRATA_{setting}?"
                        )));
                    }
                }
            }
        }
        self.with_slurm_peers(slurm)
    }

    /// `peers = ["slurm:PORT"]`: one peer service on every node of the
    /// allocation (Slurm's `SLURM_JOB_NODELIST` in `vars`, expanded), each
    /// named by its host and listening on PORT; this node is then named as
    /// Slurm names it (`SLURMD_NODENAME`) unless `STRATA_NODE` says
    /// otherwise. [`Config::with_env`] does this; call it on a
    /// configuration whose peers were set after that (keyword arguments).
    /// Other peer lists are left as they are.
    pub fn with_slurm_peers(
        mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self> {
        let [only] = self.peers.as_slice() else {
            return Ok(self);
        };
        let Some(port) = only.trim().strip_prefix("slurm:") else {
            return Ok(self);
        };
        let vars: Vec<(String, String)> = vars.into_iter().collect();
        let get = |name: &str| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let nodelist = get("SLURM_JOB_NODELIST").or_else(|| get("SLURM_NODELIST"));
        let node = get("SLURMD_NODENAME").filter(|_| get("STRATA_NODE").is_none());
        let port: u16 = port
            .parse()
            .map_err(|_| Error::Config(format!("peers {only:?}: expected slurm:PORT")))?;
        let list = nodelist.ok_or_else(|| {
            Error::Config(format!(
                "peers {only:?} needs SLURM_JOB_NODELIST (run the ranks under srun or sbatch)"
            ))
        })?;
        let hosts = hostlist::expand(list, hostlist::MAX_HOSTS)
            .map_err(|e| Error::Config(format!("SLURM_JOB_NODELIST: {e}")))?;
        self.peers = hosts.iter().map(|h| format!("{h}={h}:{port}")).collect();
        if let Some(n) = node.filter(|_| self.node == hostname()) {
            self.node = n.to_string();
        }
        Ok(self)
    }

    /// The hashing threads this rank uses: `hash_threads`, or where it is
    /// 0 its share of the node's cores.
    pub fn effective_hash_threads(&self) -> usize {
        match self.hash_threads {
            0 => threads::auto_hash_threads(self.local_world_size),
            n => n,
        }
    }

    /// Checks every setting.
    pub fn validate(&self) -> Result<()> {
        validate_job_id(&self.job).map_err(|e| Error::Config(e.to_string()))?;
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(Error::Config(format!(
                "rank {} of world size {}",
                self.rank, self.world_size
            )));
        }
        if let (Some(l), Some(n)) = (self.local_rank, self.local_world_size) {
            if l >= n || n > self.world_size {
                return Err(Error::Config(format!(
                    "local rank {l} of {n} ranks on the node, in a world of {}",
                    self.world_size
                )));
            }
        }
        validate_chunk_size(self.chunk_size).map_err(|e| Error::Config(e.to_string()))?;
        self.engine()?;
        if self.keep_last == 0 {
            return Err(Error::Config("keep_last must be at least 1".into()));
        }
        let peers = self.peer_list()?;
        if !peers.is_empty() && self.peer_certs.is_none() {
            return Err(Error::Config(
                "peers need peer_certs (the CA and this job's client certificate)".into(),
            ));
        }
        Ok(())
    }

    /// The peers as (name, address), checked.
    pub fn peer_list(&self) -> Result<Vec<(String, std::net::SocketAddr)>> {
        self.peers
            .iter()
            .map(|p| {
                if p.trim().starts_with("slurm:") {
                    return Err(Error::Config(format!(
                        "peers {p:?} is expanded from SLURM_JOB_NODELIST by the environment \
                         (Config::with_env), which this configuration did not read"
                    )));
                }
                let (name, addr) = p
                    .split_once('=')
                    .ok_or_else(|| Error::Config(format!("peer {p:?}: expected name=host:port")))?;
                let addr = std::net::ToSocketAddrs::to_socket_addrs(addr.trim())
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or_else(|| Error::Config(format!("peer {p:?}: cannot resolve {addr:?}")))?;
                Ok((name.trim().to_string(), addr))
            })
            .collect()
    }

    /// The I/O engine choice.
    pub fn engine(&self) -> Result<EngineChoice> {
        self.io_engine.parse().map_err(Error::Config)
    }
}

mod env_names;
mod hostlist;
#[cfg(test)]
mod tests;
mod threads;
