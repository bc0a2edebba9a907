//! The l1-bench phases beyond a plain save and restore: the priority
//! restore, and (`--background`) saves and restores while the previous
//! step's upload to L3 runs beside them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use strata::{Checkpointer, Config, L3State, StepSelector};

/// Time to the entries asked for first, and to everything, of the best run.
pub(crate) struct Priority {
    /// Share of the bytes asked for first.
    pub share: f64,
    pub first: Duration,
    pub all: Duration,
}

/// The entries making up about `share` of the bytes, spread over the
/// whole shard the way weights sit between their optimizer states: each
/// entry is taken while the bytes taken stay within `share` of the bytes
/// seen so far.
pub(crate) fn spread_names(specs: &[strata::format::EntrySpec], share: f64) -> Vec<String> {
    let (mut taken, mut seen) = (0u64, 0u64);
    let mut out = Vec::new();
    for s in specs {
        seen += s.len;
        if (taken + s.len) as f64 <= share * seen as f64 {
            taken += s.len;
            out.push(s.name.clone());
        }
    }
    out
}

/// Priority restores of the latest step, `first` first: the best of
/// `reps` runs, timed from the call (agreement included) to the first
/// entries returned and to the rest.
pub(crate) fn priority(
    ck: &Arc<Checkpointer>,
    first: &[String],
    share: f64,
    reps: usize,
) -> Result<Priority, String> {
    let names: Vec<&str> = first.iter().map(String::as_str).collect();
    let mut best: Option<Priority> = None;
    for _ in 0..reps {
        let t = Instant::now();
        let p = ck
            .restore_first(StepSelector::Latest, &names)
            .map_err(|e| e.to_string())?;
        let to_first = t.elapsed();
        let got = p.first.entries.len();
        let rest = p.wait().map_err(|e| e.to_string())?;
        let all = t.elapsed();
        if got != first.len() {
            return Err(format!(
                "{got} entries came first, {} asked for",
                first.len()
            ));
        }
        std::hint::black_box(&rest);
        drop(rest);
        let run = Priority {
            share,
            first: to_first,
            all,
        };
        if best.as_ref().is_none_or(|b| run.all < b.all) {
            best = Some(run);
        }
    }
    best.ok_or_else(|| "no run".into())
}

/// Saves and restores with the previous step's upload running beside them.
pub(crate) struct Background {
    /// Best stall of a save during which an upload ran throughout (of
    /// every run if none did: then `stall_overlapped` is 0).
    pub stall: Duration,
    /// Best restore (into buffers) during which the upload ran throughout
    /// (of every run if none did: then `restore_overlapped` is 0).
    pub restore_busy: Duration,
    /// Best restore of the same step, once the uploads were done.
    pub restore_idle: Duration,
    /// Runs whose restore ended with the upload still running (of `reps`).
    pub restore_overlapped: usize,
    /// Runs whose save ended with an upload still running (of `reps`).
    pub stall_overlapped: usize,
    pub reps: usize,
    /// Time the uploads held back for the snapshots and restores.
    pub held: f64,
}

fn uploading(ck: &Checkpointer, step: u64) -> bool {
    matches!(
        ck.uploads().get(&step),
        Some(L3State::Queued | L3State::Uploading { .. })
    )
}

/// `--background`: a checkpointer of its own (job `bench-bg`) uploading
/// every step to an L3 directory on the same disk. Each run saves a step
/// (durable on L1; its upload starts), restores it into buffers at once
/// (the upload running), saves the next step (the upload still running),
/// waits for the uploads, and restores again (idle). `BENCH_UPLOAD_EVERY`
/// (default 1) sets the upload policy: a large value runs the same
/// sequence without uploads, the control for what the upload costs.
pub(crate) fn background(
    dir: &std::path::Path,
    cfg: Config,
    state: &mut strata_benches::state::State,
    chunk: usize,
    reps: usize,
) -> Result<Background, String> {
    let l3 = dir.join("l3");
    let _ = std::fs::remove_dir_all(&l3);
    std::fs::create_dir_all(&l3).map_err(|e| format!("{}: {e}", l3.display()))?;
    let cfg = cfg
        .job("bench-bg")
        .l3_url(format!("file://{}", l3.display()))
        .upload_every(
            std::env::var("BENCH_UPLOAD_EVERY")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1),
        )
        // An upload to a local directory runs at the page cache's speed
        // (1 GiB in under the 0.5 s a restore takes here: it ended before
        // the restore it was to run beside); capped, it runs as one over a
        // node's network link would, across the restore and the next save.
        .upload_bytes_per_sec(
            std::env::var("BENCH_UPLOAD_BYTES_PER_SEC")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1_000_000_000),
        )
        .keep_last(2);
    let ck = Checkpointer::new(cfg).map_err(|e| e.to_string())?;
    ck.prepare(&state.entries()).map_err(|e| e.to_string())?;
    let mut step = 0u64;
    let mut save =
        |state: &strata_benches::state::State| -> Result<(u64, strata::SaveStats), String> {
            step += 1;
            let h = ck.save(step, &state.entries()).map_err(|e| e.to_string())?;
            h.wait().map(|s| (step, s)).map_err(|e| e.to_string())
        };
    // Warm-up: both staging buffers used once, the uploads done.
    save(state)?;
    state.touch_all(chunk, 0x61);
    save(state)?;
    ck.wait_uploads();
    let (mut stall, mut busy, mut idle) = (Vec::new(), Vec::new(), Vec::new());
    // The runs in which the upload ran throughout each measured operation.
    let (mut stall_beside, mut busy_beside) = (Vec::new(), Vec::new());
    for r in 0..reps {
        // Salts two apart: `touch_all` XORs `salt | 1`, so 0x70 + r would
        // give run 1 run 0's salt, and undo it (the buffers hold run 0's
        // step again after the idle restore): a step L3 already held.
        state.touch_all(chunk, 0x70 + 2 * r as u8);
        let (st, _) = save(state)?;
        // The upload of `st` runs now: restore the step beside it.
        let mut dests = state.dests();
        let read = ck
            .restore_into(StepSelector::Step(st), &mut dests)
            .map_err(|e| e.to_string())?;
        if uploading(&ck, st) {
            busy_beside.push(read.duration);
        }
        busy.push(read.duration);
        // The next step's snapshot, the upload still running.
        state.touch_all(chunk, 0x90 + 2 * r as u8);
        let (next, s) = save(state)?;
        if uploading(&ck, st) || uploading(&ck, next) {
            stall_beside.push(s.stall);
        }
        stall.push(s.stall);
        ck.wait_uploads();
        // The same step again, nothing beside it (the state's buffers hold
        // `next` now; this overwrites them and the next run touches them).
        let mut dests = state.dests();
        let read = ck
            .restore_into(StepSelector::Step(st), &mut dests)
            .map_err(|e| e.to_string())?;
        idle.push(read.duration);
    }
    let held = ck
        .metric("strata_background_held_seconds_total")
        .unwrap_or(0.0);
    drop(ck);
    let _ = std::fs::remove_dir_all(&l3);
    let beside_or_all = |beside: &[Duration], all: &[Duration]| {
        super::best(if beside.is_empty() { all } else { beside })
    };
    Ok(Background {
        stall: beside_or_all(&stall_beside, &stall),
        restore_busy: beside_or_all(&busy_beside, &busy),
        restore_idle: super::best(&idle),
        restore_overlapped: busy_beside.len(),
        stall_overlapped: stall_beside.len(),
        reps,
        held,
    })
}
