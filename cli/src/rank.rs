//! `strata rank`: one rank of a synthetic data-parallel training job, as a
//! process of its own (the multi-node demo starts these; under torchrun or
//! srun it is a smoke test of Strata across the cluster's nodes).
//!
//! The rank's state is deterministic in (seed, rank, step): weights every
//! rank shares (data-parallel replicas: identical chunks, stored once per
//! node and pushed once) and an optimizer shard of its own; each step
//! changes one tensor of each. With `--resume` it first restores the
//! newest step every rank can serve and checks every byte; it then saves
//! `--steps` more, and with `--verify` restores each step it saved and
//! checks it. It prints one JSON object per line (`event`: `resumed`,
//! `saved`, `verified`, `failed`, `done`), and exits 1 on a failure.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use strata::format::DType;
use strata::{Checkpointer, Config, Entry, StepSelector};

use crate::out::say;
use crate::size::parse_size;
use crate::CliError;

/// `strata rank`.
#[derive(Args, Debug)]
#[command(
    after_help = "Rank, world size and node come from the launcher (RANK/WORLD_SIZE from torchrun, SLURM_PROCID/SLURM_NTASKS from srun) or STRATA_RANK/STRATA_WORLD_SIZE/STRATA_NODE; ranks agree through etcd (STRATA_ETCD_ENDPOINTS).\n\nExample:\n  torchrun --nnodes 4 --nproc-per-node 8 ... strata rank --config strata.toml --steps 20 --verify"
)]
pub(crate) struct RankArgs {
    /// A TOML configuration (then STRATA_* and the launcher's variables).
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Steps to save.
    #[arg(long, default_value_t = 10)]
    steps: u64,
    /// Bytes of state per rank (half shared weights, half its own).
    #[arg(long, default_value = "32MiB", value_parser = parse_size)]
    state_size: u64,
    /// Seed of the synthetic values.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Restore the newest step every rank can serve first (checked byte
    /// for byte) and continue after it.
    #[arg(long)]
    resume: bool,
    /// After saving, restore every step saved in this run and check it.
    #[arg(long)]
    verify: bool,
    /// Wait for every step's replication and upload before the next one.
    #[arg(long)]
    wait_tiers: bool,
    /// Sleep this long before saving step N (`N:SECONDS`): for tests that
    /// kill a node while the other ranks wait for it.
    #[arg(long, value_parser = parse_pause)]
    pause_before: Option<(u64, f64)>,
    /// Wait before saving step N until a file exists (`N:PATH`): for tests
    /// that hold a rank until an event they watch for has happened.
    #[arg(long, value_parser = parse_hold)]
    hold_before: Option<(u64, std::path::PathBuf)>,
}

fn parse_hold(s: &str) -> Result<(u64, std::path::PathBuf), String> {
    let (a, b) = s.split_once(':').ok_or("expected STEP:PATH")?;
    Ok((a.parse().map_err(|e| format!("{a}: {e}"))?, b.into()))
}

fn parse_pause(s: &str) -> Result<(u64, f64), String> {
    let (a, b) = s.split_once(':').ok_or("expected STEP:SECONDS")?;
    Ok((
        a.parse().map_err(|e| format!("{a}: {e}"))?,
        b.parse().map_err(|e| format!("{b}: {e}"))?,
    ))
}

/// Tensors of each half of the state.
const TENSORS: usize = 8;

/// The bytes of tensor `i` (of `n` bytes) in the shared half (`own` =
/// None) or rank `own`'s half, at `step`: each step changes tensor
/// `step % TENSORS` of each half.
fn tensor(seed: u64, own: Option<u32>, i: usize, n: usize, step: u64) -> Vec<u8> {
    // The last step at which this tensor changed (steps s with
    // s % TENSORS == i; 0: never, the initial value).
    let (k, i64_) = (TENSORS as u64, i as u64);
    let version = if step >= i64_ {
        step - (step - i64_) % k
    } else {
        0
    };
    let owner = own.map_or(0xffff_ffff, u64::from);
    let mut x = seed ^ (owner << 32) ^ ((i as u64) << 20) ^ (version << 40);
    (0..n)
        .map(|_| {
            // xorshift64*: fast, deterministic, not compressible to nothing.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// The rank's whole state at `step`, by entry name.
fn state(a: &RankArgs, rank: u32, step: u64) -> Vec<(String, Vec<u8>)> {
    let n = (a.state_size as usize / (2 * TENSORS)).max(64) & !1;
    let mut out = Vec::with_capacity(2 * TENSORS + 1);
    for i in 0..TENSORS {
        out.push((format!("model.w{i}"), tensor(a.seed, None, i, n, step)));
    }
    for i in 0..TENSORS {
        out.push((
            format!("optim.m{i}"),
            tensor(a.seed, Some(rank), i, n, step),
        ));
    }
    out.push(("step".into(), step.to_le_bytes().to_vec()));
    out
}

fn entries<'a>(s: &'a [(String, Vec<u8>)], shape: &'a [u64; 1]) -> Vec<Entry<'a>> {
    s.iter()
        .map(|(name, d)| {
            if name == "step" {
                Entry::blob(name, d)
            } else {
                Entry::tensor(name, DType::BF16, shape, d)
            }
        })
        .collect()
}

/// Whether a restored state is exactly `want`, entry by entry.
fn same(want: &[(String, Vec<u8>)], got: &[strata::RestoredEntry]) -> bool {
    want.len() == got.len()
        && want
            .iter()
            .zip(got)
            .all(|((n, d), e)| *n == e.name && *d == e.bytes)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

pub(crate) fn run(a: &RankArgs) -> Result<(), CliError> {
    let r = run_rank(a);
    if let Err(e) = &r {
        // Every failure is an event too (a launcher collects stdout).
        say!("{}", json!({"event": "error", "error": e.to_string()}));
    }
    r
}

fn run_rank(a: &RankArgs) -> Result<(), CliError> {
    let file = match &a.config {
        Some(p) => Config::from_file(p)?,
        None => Config::default(),
    };
    let cfg = file.with_env(std::env::vars())?;
    let rank = cfg.rank;
    let started = Instant::now();
    let ck = Checkpointer::new(cfg.clone())?;
    let line = |v: serde_json::Value| say!("{v}");
    let mut first = 1;
    if a.resume {
        match ck.restore(StepSelector::Latest) {
            Ok(got) => {
                let ok = same(&state(a, rank, got.step), &got.entries);
                line(json!({"event": "resumed", "rank": rank, "node": cfg.node,
                    "local_rank": cfg.local_rank, "node_rank": cfg.node_rank, "step": got.step,
                    "ok": ok, "ms": ms(got.stats.duration), "bytes": got.stats.bytes_read,
                    "from_l2": got.stats.bytes_from_l2, "from_l3": got.stats.bytes_from_l3,
                    "since_start_ms": ms(started.elapsed())}));
                if !ok {
                    return Err(CliError::Verify(format!(
                        "step {} restored different bytes",
                        got.step
                    )));
                }
                first = got.step + 1;
            }
            Err(strata::Error::NothingToRestore(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let last = first + a.steps.saturating_sub(1);
    for step in first..=last {
        if let Some((at, secs)) = a.pause_before {
            if at == step {
                std::thread::sleep(Duration::from_secs_f64(secs));
            }
        }
        if let Some((at, gate)) = &a.hold_before {
            if *at == step {
                while !gate.exists() {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        let s = state(a, rank, step);
        let shape = [s[0].1.len() as u64 / 2];
        let t = Instant::now();
        let saved = ck.save(step, &entries(&s, &shape)).and_then(|h| h.wait());
        match saved {
            Ok(st) => line(
                json!({"event": "saved", "rank": rank, "node": cfg.node, "step": step,
                "stall_ms": ms(st.stall), "durable_ms": ms(st.to_durable),
                "barrier_ms": ms(st.barrier_time), "commit_ms": ms(st.commit_time),
                "written": st.bytes_written, "deduped": st.bytes_deduped}),
            ),
            Err(e) => {
                line(
                    json!({"event": "failed", "rank": rank, "node": cfg.node, "step": step,
                    "after_ms": ms(t.elapsed()), "kind": format!("{:?}", e.kind()),
                    "error": e.to_string()}),
                );
                return Err(e.into());
            }
        }
        if a.wait_tiers {
            ck.wait_replication();
            ck.wait_uploads();
        }
    }
    ck.wait_replication();
    ck.wait_uploads();
    // A step whose upload failed is on L3 for no rank of this process:
    // said here, so a restore that cannot find it later has its cause.
    for (step, st) in ck.uploads() {
        if let strata::L3State::Failed(why) = st {
            line(json!({"event": "upload_failed", "rank": rank, "step": step, "error": why}));
        }
    }
    if a.verify {
        for step in first..=last {
            let got = ck.restore(StepSelector::Step(step))?;
            let ok = same(&state(a, rank, step), &got.entries);
            line(
                json!({"event": "verified", "rank": rank, "step": step, "ok": ok,
                "from_l2": got.stats.bytes_from_l2, "from_l3": got.stats.bytes_from_l3}),
            );
            if !ok {
                return Err(CliError::Verify(format!(
                    "step {step} restored different bytes"
                )));
            }
        }
    }
    line(
        json!({"event": "done", "rank": rank, "node": cfg.node, "first": first, "last": last,
        "ms": ms(started.elapsed())}),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_changes_one_tensor_of_each_half() {
        let n = 256;
        for step in 1..20u64 {
            let changed: Vec<usize> = (0..TENSORS)
                .filter(|&i| tensor(1, None, i, n, step) != tensor(1, None, i, n, step - 1))
                .collect();
            assert_eq!(changed, [(step % TENSORS as u64) as usize], "step {step}");
        }
        // Shared weights are the same on every rank; the own half is not
        // (through `state`, which picks the half for each entry by rank).
        let a = RankArgs {
            config: None,
            steps: 1,
            state_size: 4096,
            seed: 1,
            resume: false,
            verify: false,
            wait_tiers: false,
            pause_before: None,
            hold_before: None,
        };
        let (r0, r1) = (state(&a, 0, 5), state(&a, 1, 5));
        assert_eq!(r0.len(), 2 * TENSORS + 1);
        for ((name, b0), (name1, b1)) in r0.iter().zip(&r1) {
            assert_eq!(name, name1);
            if name.starts_with("model.") || name == "step" {
                assert_eq!(b0, b1, "{name}: shared by every rank");
            } else {
                assert_ne!(b0, b1, "{name}: each rank's own");
            }
        }
        assert_ne!(tensor(1, Some(0), 3, n, 5), tensor(1, Some(1), 3, n, 5));
        assert!(parse_pause("3:1.5").is_ok() && parse_pause("3").is_err());
        assert_eq!(parse_hold("5:/a/b").unwrap(), (5, "/a/b".into()));
        assert!(parse_hold("5").is_err());
    }
}
