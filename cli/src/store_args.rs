//! How the inspection commands find a store: `--config strata.toml` (the
//! file the training job reads), then `STRATA_*` environment variables,
//! then flags, each overriding the one before.

use std::path::PathBuf;

use clap::Args;
use strata::tiers::{Tier, Tiers};
use strata::Config;

use crate::CliError;

/// Where the job's checkpoints are.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct StoreArgs {
    /// A strata.toml: the configuration the training job reads.
    #[arg(long, value_name = "FILE", global = true)]
    pub(crate) config: Option<PathBuf>,
    /// The job (overrides `job` and STRATA_JOB).
    #[arg(long, value_name = "JOB", global = true)]
    pub(crate) job: Option<String>,
    /// The node-local L1 directory (overrides `l1_dir` and STRATA_L1_DIR).
    #[arg(long, value_name = "DIR", global = true)]
    pub(crate) l1: Option<PathBuf>,
    /// Object storage: file:///dir, s3://bucket/prefix, ... (overrides
    /// `l3_url` and STRATA_L3_URL).
    #[arg(long, value_name = "URL", global = true)]
    pub(crate) l3: Option<String>,
    /// An L3 option such as `endpoint=http://127.0.0.1:9000` or
    /// `access_key_id=...` (repeatable).
    #[arg(long = "l3-option", value_name = "KEY=VALUE", global = true)]
    pub(crate) l3_options: Vec<String>,
    /// Peer services, `name=host:port`, comma-separated (overrides `peers`
    /// and STRATA_PEERS).
    #[arg(long, value_name = "LIST", value_delimiter = ',', global = true)]
    pub(crate) peers: Vec<String>,
    /// Directory with the cluster CA and the job's client certificate
    /// (overrides `peer_certs` and STRATA_PEER_CERTS).
    #[arg(long, value_name = "DIR", global = true)]
    pub(crate) peer_certs: Option<PathBuf>,
    /// Replicas each step should have on peers, for `ls` to call a step
    /// degraded (overrides `replicas` and STRATA_REPLICAS).
    #[arg(long, value_name = "N", global = true)]
    pub(crate) replicas: Option<usize>,
}

impl StoreArgs {
    /// The configuration: file, then environment, then flags.
    pub(crate) fn config(&self) -> Result<Config, CliError> {
        let base = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::builder(),
        };
        let mut cfg = base.with_env(std::env::vars())?;
        if let Some(job) = &self.job {
            cfg.job = job.clone();
        }
        if let Some(dir) = &self.l1 {
            cfg.l1_dir = dir.clone();
        }
        if let Some(url) = &self.l3 {
            cfg.l3_url = Some(url.clone());
        }
        for kv in &self.l3_options {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| CliError::Arg(format!("--l3-option {kv:?}: expected KEY=VALUE")))?;
            cfg.l3_options.insert(k.trim().into(), v.trim().into());
        }
        if !self.peers.is_empty() {
            cfg.peers = self.peers.clone();
        }
        if let Some(dir) = &self.peer_certs {
            cfg.peer_certs = Some(dir.clone());
        }
        if let Some(r) = self.replicas {
            cfg.replicas = r;
        }
        Ok(cfg)
    }

    /// The job's tiers, opened read-only.
    pub(crate) fn open(&self) -> Result<Tiers, CliError> {
        let cfg = self.config()?;
        let explicit_l1 = self.l1.is_some();
        let tiers = Tiers::open(cfg, explicit_l1)?;
        if tiers.tiers().is_empty() {
            return Err(CliError::Store(format!(
                "no tier found: no L1 directory at {}, no L3 URL, no peers (use --l1, --l3, --peers or --config)",
                tiers.config().l1_dir.display()
            )));
        }
        Ok(tiers)
    }
}

/// Which tiers a command looks at: `--tier l1|l2|l3|L2:<peer>` (repeatable),
/// all when none is given.
pub(crate) fn select<'a>(tiers: &'a Tiers, wanted: &[String]) -> Result<Vec<&'a Tier>, CliError> {
    if wanted.is_empty() {
        return Ok(tiers.tiers().iter().collect());
    }
    let mut out = Vec::new();
    for w in wanted {
        let matched: Vec<&Tier> = tiers
            .tiers()
            .iter()
            .filter(|t| {
                t.name.eq_ignore_ascii_case(w)
                    || format!("{:?}", t.kind).eq_ignore_ascii_case(w)
                    || t.name
                        .strip_prefix("L2:")
                        .is_some_and(|p| p.eq_ignore_ascii_case(w))
            })
            .collect();
        if matched.is_empty() {
            let have: Vec<&str> = tiers.tiers().iter().map(|t| t.name.as_str()).collect();
            return Err(CliError::Arg(format!(
                "tier {w:?} is not configured (have: {})",
                have.join(", ")
            )));
        }
        for t in matched {
            if !out.iter().any(|o: &&Tier| o.name == t.name) {
                out.push(t);
            }
        }
    }
    Ok(out)
}
