//! The demo's restores beside background work and its priority restore:
//! the latest step restored while its push and upload still run, and the
//! model's weights restored before the optimizer state.

use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use strata::{Checkpointer, L2State, L3State, RestoredEntry, StepSelector};

use crate::out::say;
use crate::size::human;
use crate::CliError;

/// The background copies running now, as the demo's lines name them:
/// the push to the peers, the upload to L3, both, or none.
pub(crate) fn background_now(ck: &Checkpointer) -> Option<&'static str> {
    let push = ck
        .replication()
        .values()
        .any(|s| matches!(s, L2State::Pending));
    let upload = ck
        .uploads()
        .values()
        .any(|s| matches!(s, L3State::Queued | L3State::Uploading { .. }));
    match (push, upload) {
        (true, true) => Some("the push and the upload"),
        (true, false) => Some("the push"),
        (false, true) => Some("the upload"),
        (false, false) => None,
    }
}

/// A restore taken while background copies ran.
pub(crate) struct Busy {
    /// The restore's time.
    pub(crate) took: Duration,
    /// The copies running when it started.
    pub(crate) beside: &'static str,
    /// Whether some still ran when it ended.
    pub(crate) through: bool,
}

/// Checks restored entries against the saved bytes, by name.
fn check(
    step: u64,
    got: &[RestoredEntry],
    names: &[&str],
    data: &[Vec<u8>],
) -> Result<(), CliError> {
    for e in got {
        let ok = names
            .iter()
            .position(|n| *n == e.name)
            .is_some_and(|i| data[i] == e.bytes);
        if !ok {
            return Err(CliError::Verify(format!(
                "step {step}: entry {} differs from the bytes saved",
                e.name
            )));
        }
    }
    Ok(())
}

/// A priority restore of `step`: the entries under `model` first, checked,
/// then the rest, checked; prints the time to each.
pub(crate) fn priority_restore(
    ck: &Arc<Checkpointer>,
    step: u64,
    names: &[&str],
    data: &[Vec<u8>],
) -> Result<(), CliError> {
    let verify = |e: strata::Error| CliError::Verify(e.to_string());
    let t = Instant::now();
    let p = ck
        .restore_first(StepSelector::Step(step), &["model"])
        .map_err(verify)?;
    let first = t.elapsed();
    check(step, &p.first.entries, names, data)?;
    let first_bytes: u64 = p.first.entries.iter().map(|e| e.bytes.len() as u64).sum();
    let first_n = p.first.entries.len();
    let rest = p.wait().map_err(verify)?;
    let all = t.elapsed();
    check(step, &rest.entries, names, data)?;
    if first_n + rest.entries.len() != names.len() {
        return Err(CliError::Verify(format!(
            "step {step}: {} entries restored, {} expected",
            first_n + rest.entries.len(),
            names.len()
        )));
    }
    let total: u64 = data.iter().map(|d| d.len() as u64).sum();
    say!(
        "priority restore of step {step}: the model's weights ({} of {}) usable after {:.2} s, everything after {:.2} s ({:.0}%)",
        human(first_bytes),
        human(total),
        first.as_secs_f64(),
        all.as_secs_f64(),
        100.0 * first.as_secs_f64() / all.as_secs_f64().max(1e-9)
    );
    Ok(())
}

/// A restore into the buffers the job already holds (a resuming job reads
/// into its model's tensors): the demo's own state, zeroed first and
/// checked against its hashes after. The restore beside the background
/// copies and the idle one it is compared with both read this way, so
/// that neither pays for memory the process never touched: on a VM the
/// first touch of fresh pages (zeroed by the kernel, backed by the host)
/// took most of a first restore into new buffers (`docs/performance.md`),
/// which is not what background work costs. No second copy of the state
/// is held for it either.
pub(crate) struct InPlace {
    hashes: Vec<blake3::Hash>,
}

impl InPlace {
    /// Hashes the state as saved at the step to be restored.
    pub(crate) fn new(data: &[Vec<u8>]) -> Self {
        InPlace {
            hashes: data.iter().map(|d| blake3::hash(d)).collect(),
        }
    }

    /// Zeroes `data`, restores `step` into it and checks every entry
    /// against its hash (a restore that left an entry untouched fails,
    /// unless the entry saved was all zeroes: the demo's state has none);
    /// returns the restore's time, not the check's, and the background
    /// copies still running as it ended.
    pub(crate) fn restore(
        &self,
        ck: &Checkpointer,
        step: u64,
        names: &[&str],
        data: &mut [Vec<u8>],
    ) -> Result<(Duration, Option<&'static str>), CliError> {
        for d in data.iter_mut() {
            d.fill(0);
        }
        let mut dests: Vec<(&str, &mut [u8])> = names
            .iter()
            .copied()
            .zip(data.iter_mut().map(Vec::as_mut_slice))
            .collect();
        let t = Instant::now();
        ck.restore_into(StepSelector::Step(step), &mut dests)
            .map_err(|e| CliError::Verify(e.to_string()))?;
        let took = t.elapsed();
        let running = background_now(ck);
        for (i, d) in data.iter().enumerate() {
            if self.hashes.get(i) != Some(&blake3::hash(d)) {
                return Err(CliError::Verify(format!(
                    "step {step}: entry {} restored into its buffer differs from the bytes saved",
                    names.get(i).copied().unwrap_or("?")
                )));
            }
        }
        Ok((took, running))
    }
}

/// The restore into the job's buffers taken while background work ran,
/// against the same restore after it (the median of three).
pub(crate) fn report_busy(ck: &Checkpointer, busy: Option<Busy>, idle: Duration, logical: u64) {
    if let Some(b) = busy {
        let gbps = |d: Duration| logical as f64 / d.as_secs_f64().max(1e-9) / 1e9;
        let held = ck
            .metric("strata_background_held_seconds_total")
            .unwrap_or(0.0);
        let lent = ck
            .metric("strata_restore_lent_buffer_bytes_total")
            .unwrap_or(0.0)
            / f64::from(1u32 << 20);
        say!(
            "  into the job's buffers: {:.2} GB/s while {}{} ran, {:.2} GB/s after (median of 3): {:.2} of the idle one (the copies held back {held:.2} s in all for snapshots and restores, and lent the restores {lent:.0} MiB of read buffers)",
            gbps(b.took),
            if b.through { "" } else { "(part of the time) " },
            b.beside,
            gbps(idle),
            idle.as_secs_f64() / b.took.as_secs_f64().max(1e-9)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::InPlace;
    use strata::{Checkpointer, Config, Entry};

    #[test]
    fn a_restore_in_place_is_checked_against_the_step_it_was_hashed_at() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config::builder()
            .job("in-place")
            .l1_dir(d.path())
            .chunk_size(1 << 20);
        let ck = Checkpointer::new(cfg).unwrap();
        let names = ["a", "b"];
        let step1: Vec<Vec<u8>> = vec![vec![1; 3 << 20], vec![2; 1000]];
        let mut step2 = step1.clone();
        step2[1][999] = 9;
        for (step, data) in [(1, &step1), (2, &step2)] {
            let entries: Vec<Entry<'_>> = names
                .iter()
                .zip(data.iter())
                .map(|(n, d)| Entry::blob(n, d))
                .collect();
            ck.save(step, &entries).unwrap().wait().unwrap();
        }
        let hashed = InPlace::new(&step2);
        let mut state = step2.clone();
        let (_, running) = hashed.restore(&ck, 2, &names, &mut state).unwrap();
        assert_eq!(state, step2);
        assert_eq!(running, None, "no L2 or L3 here: nothing runs beside");
        // Step 1 differs from step 2 in one byte of the last entry: the
        // check names it.
        let err = hashed.restore(&ck, 1, &names, &mut state).unwrap_err();
        assert!(err.to_string().contains("entry b"), "{err}");
        // An entry the restore did not write (only "a" is asked for) is
        // left zeroed, and the check fails.
        let err = hashed.restore(&ck, 2, &names[..1], &mut state).unwrap_err();
        assert!(err.to_string().contains("differs"), "{err}");
        assert!(state[1].iter().all(|&b| b == 0));
        // A restore of a missing step fails before any check.
        assert!(hashed.restore(&ck, 7, &names, &mut state).is_err());
    }
}
