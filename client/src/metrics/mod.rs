//! What the training process exports to Prometheus: a checkpointer's own
//! series (saves, their stall and time to durable, bytes written and
//! deduplicated, restores and the bytes each tier served, errors by kind)
//! and, read at each scrape, its copiers' backlogs (uploads waiting or
//! failed, steps waiting for or short of their replicas, what was
//! dropped). Every series carries the job, rank and node, so one query
//! covers a job's ranks. Served over HTTP by `serve.rs` where
//! `metrics_listen` is set ([`crate::Checkpointer::metrics_text`] renders
//! the same text without it).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use strata_peer::prom::{quoted, Histogram};

use crate::error::{Error, ErrorKind};
use crate::stats::{RestoreStats, SaveStats};
use crate::tier_states::{L2State, L3State};

pub(crate) mod serve;

/// Every error kind, with its label.
const KINDS: [(ErrorKind, &str); 8] = [
    (ErrorKind::NotFound, "not_found"),
    (ErrorKind::Corrupt, "corrupt"),
    (ErrorKind::Unavailable, "unavailable"),
    (ErrorKind::Invalid, "invalid"),
    (ErrorKind::Conflict, "conflict"),
    (ErrorKind::Unauthorized, "unauthorized"),
    (ErrorKind::NoSpace, "no_space"),
    (ErrorKind::Internal, "internal"),
];

/// The operations errors are counted under.
#[derive(Clone, Copy)]
pub(crate) enum Op {
    Save,
    Restore,
}

/// One checkpointer's counters and histograms.
pub(crate) struct Metrics {
    /// `job="..",rank="..",node=".."`.
    labels: String,
    saves: AtomicU64,
    saves_failed: AtomicU64,
    saves_skipped: AtomicU64,
    stall: Histogram,
    durable: Histogram,
    barrier: Histogram,
    bytes_written: AtomicU64,
    bytes_deduped: AtomicU64,
    /// The newest step committed on L1 by this process, plus one (0: none).
    last_committed: AtomicU64,
    restores: AtomicU64,
    restores_failed: AtomicU64,
    restore_time: Histogram,
    /// Chunk bytes restores read from L1, the peers and L3.
    restore_bytes: [AtomicU64; 3],
    /// By [`Op`], then by kind ([`KINDS`]).
    errors: [[AtomicU64; KINDS.len()]; 2],
}

impl Metrics {
    pub(crate) fn new(job: &str, rank: u32, node: &str) -> Metrics {
        Metrics {
            labels: format!(
                "job=\"{}\",rank=\"{rank}\",node=\"{}\"",
                quoted(job),
                quoted(node)
            ),
            saves: AtomicU64::new(0),
            saves_failed: AtomicU64::new(0),
            saves_skipped: AtomicU64::new(0),
            stall: Histogram::default(),
            durable: Histogram::default(),
            barrier: Histogram::default(),
            bytes_written: AtomicU64::new(0),
            bytes_deduped: AtomicU64::new(0),
            last_committed: AtomicU64::new(0),
            restores: AtomicU64::new(0),
            restores_failed: AtomicU64::new(0),
            restore_time: Histogram::default(),
            restore_bytes: Default::default(),
            errors: Default::default(),
        }
    }

    /// A save's outcome, as its handle reports it.
    pub(crate) fn save_done(&self, r: Result<&SaveStats, &Error>) {
        match r {
            Ok(st) if st.skipped => {
                self.saves_skipped.fetch_add(1, Ordering::Relaxed);
            }
            Ok(st) => {
                self.saves.fetch_add(1, Ordering::Relaxed);
                self.stall.observe(st.stall);
                self.durable.observe(st.to_durable);
                self.barrier.observe(st.barrier_time);
                self.bytes_written
                    .fetch_add(st.bytes_written, Ordering::Relaxed);
                self.bytes_deduped
                    .fetch_add(st.bytes_deduped, Ordering::Relaxed);
                self.last_committed
                    .fetch_max(st.step.saturating_add(1), Ordering::Relaxed);
            }
            Err(e) => {
                self.saves_failed.fetch_add(1, Ordering::Relaxed);
                self.error(Op::Save, e);
            }
        }
    }

    /// A restore the ranks agreed on (its reads follow).
    pub(crate) fn restore_agreed(&self) {
        self.restores.fetch_add(1, Ordering::Relaxed);
    }

    /// A restore that failed, agreeing or reading.
    pub(crate) fn restore_failed(&self, e: &Error) {
        self.restores_failed.fetch_add(1, Ordering::Relaxed);
        self.error(Op::Restore, e);
    }

    /// A restore's read: a whole restore reads once, the Python package's
    /// `load` twice (its tree, then its values). DCP loads read through
    /// the catalog and are not counted here.
    pub(crate) fn read_done(&self, r: Result<&RestoreStats, &Error>) {
        match r {
            Ok(st) => {
                self.restore_time.observe(st.duration);
                let l1 = st
                    .bytes_read
                    .saturating_sub(st.bytes_from_l2 + st.bytes_from_l3);
                for (c, n) in
                    self.restore_bytes
                        .iter()
                        .zip([l1, st.bytes_from_l2, st.bytes_from_l3])
                {
                    c.fetch_add(n, Ordering::Relaxed);
                }
            }
            Err(e) => self.restore_failed(e),
        }
    }

    fn error(&self, op: Op, e: &Error) {
        let kind = e.kind();
        if let Some(i) = KINDS.iter().position(|(k, _)| *k == kind) {
            self.errors[op as usize][i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Prometheus' text format: this checkpointer's series, then its
    /// copiers' state read now (`uploads`, `replication`: every step's
    /// state; `dropped`: uploads and pushes dropped from their backlogs).
    pub(crate) fn render(
        &self,
        uploads: &BTreeMap<u64, L3State>,
        replication: &BTreeMap<u64, L2State>,
        (dropped_uploads, dropped_pushes): (u64, u64),
    ) -> String {
        let l = &self.labels;
        let mut out = String::with_capacity(8192);
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let counters = [
            ("strata_saves_total", "Saves committed.", n(&self.saves)),
            (
                "strata_saves_failed_total",
                "Saves that failed (their step is not committed).",
                n(&self.saves_failed),
            ),
            (
                "strata_saves_skipped_total",
                "Saves skipped by busy_policy = \"skip\".",
                n(&self.saves_skipped),
            ),
            (
                "strata_save_bytes_written_total",
                "Chunk bytes saves wrote to L1.",
                n(&self.bytes_written),
            ),
            (
                "strata_save_bytes_deduplicated_total",
                "Chunk bytes saves found on L1 already (not written).",
                n(&self.bytes_deduped),
            ),
            (
                "strata_restores_total",
                "Restores the ranks agreed on.",
                n(&self.restores),
            ),
            (
                "strata_restores_failed_total",
                "Restores that failed.",
                n(&self.restores_failed),
            ),
            (
                "strata_dropped_uploads_total",
                "Uploads dropped from a backlog past max_pending_uploads.",
                dropped_uploads,
            ),
            (
                "strata_dropped_pushes_total",
                "Pushes to the peers dropped from a backlog past max_pending_pushes.",
                dropped_pushes,
            ),
        ];
        for (name, help, v) in counters {
            family(&mut out, l, name, "counter", help, &[(String::new(), v)]);
        }
        for (h, name, help) in [
            (
                &self.stall,
                "strata_save_stall_seconds",
                "Time a save blocked training (the snapshot).",
            ),
            (
                &self.durable,
                "strata_save_durable_seconds",
                "Time from a save's call until its step was committed on L1.",
            ),
            (
                &self.barrier,
                "strata_save_barrier_seconds",
                "Time a save waited at the commit barrier for every rank.",
            ),
            (
                &self.restore_time,
                "strata_restore_read_seconds",
                "Time a restore's read took to read, verify and place its chunks.",
            ),
        ] {
            h.render(&mut out, name, help, l);
        }
        let by_tier: Vec<(String, u64)> = ["l1", "l2", "l3"]
            .iter()
            .zip(&self.restore_bytes)
            .map(|(tier, c)| (format!("tier=\"{tier}\""), n(c)))
            .collect();
        family(
            &mut out,
            l,
            "strata_restore_bytes_total",
            "counter",
            "Chunk bytes restores read, by tier.",
            &by_tier,
        );
        let errors: Vec<(String, u64)> = ["save", "restore"]
            .iter()
            .zip(&self.errors)
            .flat_map(|(op, row)| {
                KINDS
                    .iter()
                    .zip(row)
                    .map(move |((_, kind), c)| (format!("op=\"{op}\",kind=\"{kind}\""), n(c)))
            })
            .collect();
        family(
            &mut out,
            l,
            "strata_errors_total",
            "counter",
            "Failed saves and restores, by the kind of error (what to do about it).",
            &errors,
        );
        let states = |pairs: &[(&str, usize)]| -> Vec<(String, u64)> {
            pairs
                .iter()
                .map(|(st, v)| (format!("state=\"{st}\""), *v as u64))
                .collect()
        };
        let count3 = |f: fn(&L3State) -> bool| uploads.values().filter(|s| f(s)).count();
        let count2 = |f: fn(&L2State) -> bool| replication.values().filter(|s| f(s)).count();
        family(
            &mut out,
            l,
            "strata_upload_steps",
            "gauge",
            "Steps of this rank by their state on L3 (of those this process queued).",
            &states(&[
                ("queued", count3(|s| matches!(s, L3State::Queued))),
                (
                    "uploading",
                    count3(|s| matches!(s, L3State::Uploading { .. })),
                ),
                ("failed", count3(|s| matches!(s, L3State::Failed(_)))),
            ]),
        );
        family(
            &mut out,
            l,
            "strata_replication_steps",
            "gauge",
            "Steps of this rank waiting for, or short of, their replicas on the peers.",
            &states(&[
                ("pending", count2(|s| matches!(s, L2State::Pending))),
                (
                    "degraded",
                    count2(|s| matches!(s, L2State::Degraded { .. })),
                ),
            ]),
        );
        // The newest steps: their differences are the L3 and L2 lag.
        let newest = [
            (
                "strata_last_committed_step",
                "The newest step this process committed.",
                n(&self.last_committed).checked_sub(1),
            ),
            (
                "strata_last_uploaded_step",
                "The newest step this process committed on L3.",
                newest(uploads, |s| matches!(s, L3State::Committed { .. })),
            ),
            (
                "strata_last_replicated_step",
                "The newest step this process replicated to every peer wanted.",
                newest(replication, |s| matches!(s, L2State::Replicated { .. })),
            ),
        ];
        for (name, help, step) in newest {
            if let Some(v) = step {
                family(&mut out, l, name, "gauge", help, &[(String::new(), v)]);
            }
        }
        out
    }
}

/// The newest step whose state passes `done`.
fn newest<S>(states: &BTreeMap<u64, S>, done: fn(&S) -> bool) -> Option<u64> {
    states.iter().rev().find(|(_, s)| done(s)).map(|(s, _)| *s)
}

impl Metrics {
    /// The start of a line of `name`'s series with this process's labels
    /// and no other (its value follows).
    pub(crate) fn series_prefix(&self, name: &str) -> String {
        format!("{name}{{{}}} ", self.labels)
    }

    /// Appends a counter of bytes with this process's labels.
    pub(crate) fn bytes_counter(&self, out: &mut String, name: &str, help: &str, bytes: u64) {
        family(
            out,
            &self.labels,
            name,
            "counter",
            help,
            &[(String::new(), bytes)],
        );
    }

    /// Appends a counter of seconds (a float) with this process's labels.
    pub(crate) fn seconds_counter(&self, out: &mut String, name: &str, help: &str, secs: f64) {
        let l = &self.labels;
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{l}}} {secs:.6}"
        );
    }
}

/// One metric family: its HELP and TYPE lines, then a sample for each
/// (labels beyond the rank's own, value).
fn family(
    out: &mut String,
    l: &str,
    name: &str,
    kind: &str,
    help: &str,
    samples: &[(String, u64)],
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (extra, v) in samples {
        let sep = if extra.is_empty() { "" } else { "," };
        let _ = writeln!(out, "{name}{{{l}{sep}{extra}}} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn histograms_are_cumulative_and_labels_are_quoted() {
        let m = Metrics::new("j\"1", 3, "n\\a");
        for ms in [0, 3, 3, 700, 2_000_000] {
            m.save_done(Ok(&SaveStats {
                step: ms,
                stall: Duration::from_millis(ms),
                ..SaveStats::default()
            }));
        }
        m.save_done(Err(&Error::NothingToRestore(None)));
        let text = m.render(&Default::default(), &Default::default(), (1, 2));
        let l = "job=\"j\\\"1\",rank=\"3\",node=\"n\\\\a\"";
        for line in [
            format!("strata_saves_total{{{l}}} 5"),
            format!("strata_saves_failed_total{{{l}}} 1"),
            format!("strata_save_stall_seconds_bucket{{{l},le=\"0.001\"}} 1"),
            format!("strata_save_stall_seconds_bucket{{{l},le=\"0.005\"}} 3"),
            format!("strata_save_stall_seconds_bucket{{{l},le=\"1\"}} 4"),
            format!("strata_save_stall_seconds_bucket{{{l},le=\"600\"}} 4"),
            format!("strata_save_stall_seconds_bucket{{{l},le=\"+Inf\"}} 5"),
            format!("strata_save_stall_seconds_count{{{l}}} 5"),
            format!("strata_last_committed_step{{{l}}} 2000000"),
            format!("strata_errors_total{{{l},op=\"save\",kind=\"not_found\"}} 1"),
            format!("strata_dropped_uploads_total{{{l}}} 1"),
            format!("strata_dropped_pushes_total{{{l}}} 2"),
        ] {
            assert!(text.lines().any(|x| x == line), "{line} not in\n{text}");
        }
        let sum: f64 = text
            .lines()
            .find_map(|x| x.strip_prefix(&format!("strata_save_stall_seconds_sum{{{l}}} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        assert!((sum - 2000.706).abs() < 1e-6, "{sum}");
    }
}
