//! What a simulated run measured, and its one-line summary.

use crate::faults::Injected;

/// The figures of one run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Ranks simulated.
    pub ranks: u32,
    /// Nodes (processes) they ran in.
    pub nodes: u32,
    /// Starts of the job (one more after each death).
    pub epochs: u32,
    /// Steps committed on every rank.
    pub committed: u64,
    /// Steps that failed on every rank (all faults included).
    pub failed: u64,
    /// Of those, steps that failed with no fault injected at them.
    pub failed_unfaulted: u64,
    /// Barrier + commit of each step without a fault: from the last rank
    /// reaching the commit barrier to the last rank leaving it, decided
    /// (ms): the protocol's own cost.
    pub step_ms: Vec<f64>,
    /// The whole save phase of those steps: from every rank starting its
    /// save to the last one committed (ms; on one machine this is mostly
    /// every rank's own work sharing its cores).
    pub save_phase_ms: Vec<f64>,
    /// etcd requests of the rounds in each such step (keep-alives apart).
    pub round_requests: Vec<f64>,
    /// Bytes etcd sent back in each such step (every request's answer,
    /// keep-alives included).
    pub round_bytes: Vec<f64>,
    /// Keep-alive requests per node and second, over the run.
    pub keepalives_per_node_s: f64,
    /// Each successful restore's agreement: its rounds, from the last rank
    /// in to the last rank out of each (ms).
    pub restore_ms: Vec<f64>,
    /// Each successful restore phase as a whole: listing, rounds, reading
    /// and verifying (ms).
    pub restore_phase_ms: Vec<f64>,
    /// L3 listings (`list_steps` and friends) each of those restores made.
    pub restore_lists: Vec<u64>,
    /// The agreement of each successful restore of a job that had
    /// committed a step (a restart's: after a death, and the start after
    /// the last step), ms. A job's first restore, with nothing held, is a
    /// single round of empty values: the restarts are what a job waits
    /// for after it loses a node.
    pub restart_restore_ms: Vec<f64>,
    /// The etcd requests of each of those restores' rounds (keep-alives
    /// apart).
    pub restart_restore_requests: Vec<f64>,
    /// The faults injected.
    pub faults: Vec<Injected>,
}

/// The `q` quantile (0..=1) of `v` (nearest rank); 0 when empty.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
    s[i]
}

impl Report {
    /// The summary the scale benchmark prints as its last line.
    pub fn line(&self) -> String {
        let lists: Vec<f64> = self.restore_lists.iter().map(|&n| n as f64).collect();
        format!(
            "ranks={} nodes={} barrier_commit_median_ms={:.1} barrier_commit_p99_ms={:.1} etcd_requests_per_round={:.0} restore_agreement_ms={:.1} l3_lists_per_restore={:.0} restart_restore_agreement_ms={:.1} restart_restore_requests={:.0}",
            self.ranks,
            self.nodes,
            quantile(&self.step_ms, 0.5),
            quantile(&self.step_ms, 0.99),
            quantile(&self.round_requests, 0.5),
            quantile(&self.restore_ms, 0.5),
            quantile(&lists, 0.5),
            quantile(&self.restart_restore_ms, 0.5),
            quantile(&self.restart_restore_requests, 0.5),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_pick_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        let r = Report {
            ranks: 8,
            nodes: 1,
            step_ms: vec![2.0, 4.0],
            ..Report::default()
        };
        assert!(
            r.line().starts_with(
                "ranks=8 nodes=1 barrier_commit_median_ms=2.0 barrier_commit_p99_ms=4.0"
            ),
            "{}",
            r.line()
        );
    }
}
