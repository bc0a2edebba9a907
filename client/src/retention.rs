//! Each tier's retention policy under a [`Config`]: the one definition the
//! library's own collections (L1 after each save, L3 after each upload,
//! the age at which an upload rewrites a reused L3 chunk) and `strata gc`
//! use, so an operator's run never keeps less than the job meant to.

use std::time::Duration;

use strata_gc::Retention;

use crate::config::Config;
use crate::tiers::TierKind;

impl Config {
    /// What `tier` keeps under this configuration, or None where the
    /// configuration says the tier is never collected:
    ///
    /// * L1: the newest `keep_last` committed steps; unreferenced chunks
    ///   after `gc_grace_secs`.
    /// * L2 (a peer, as `strata gc` collects it): the peers' default, the
    ///   newest 2 ([`Retention::l2`], what `strata peer serve` keeps
    ///   unless told otherwise); chunks after `gc_grace_secs`.
    /// * L3: the newest `l3_keep_last` steps and every `l3_keep_every`-th;
    ///   chunks after `l3_gc_grace_secs`. `l3_keep_last = 0` means L3 is
    ///   never collected: None.
    pub fn retention_for(&self, tier: TierKind) -> Option<Retention> {
        match tier {
            TierKind::L1 => Some(Retention {
                keep_last: self.keep_last,
                grace: Duration::from_secs(self.gc_grace_secs),
                ..Retention::l1()
            }),
            TierKind::L2 => Some(Retention {
                grace: Duration::from_secs(self.gc_grace_secs),
                ..Retention::l2()
            }),
            TierKind::L3 => (self.l3_keep_last > 0).then(|| self.l3_rules()),
        }
    }

    /// The rules of `tier` even where the configuration never collects it
    /// (L3 with `l3_keep_last = 0`: `keep_last` is then 0, which no
    /// collection accepts): the base a caller overrides with an explicit
    /// `keep_last` of its own (`strata gc --keep-last N`).
    pub fn retention_rules(&self, tier: TierKind) -> Retention {
        match tier {
            TierKind::L3 => self.l3_rules(),
            other => self.retention_for(other).unwrap_or_else(Retention::l1),
        }
    }

    /// The age at which an upload rewrites an L3 chunk it reuses: half the
    /// L3 grace period, so a chunk an upload relies on is never older than
    /// the grace period while that upload (if shorter than half of it)
    /// runs. None where L3 is never collected, or with a grace of 0 (one
    /// uploading rank: nothing to protect).
    pub fn l3_refresh_after(&self) -> Option<Duration> {
        self.retention_for(TierKind::L3)
            .filter(|p| !p.grace.is_zero())
            .map(|p| p.grace / 2)
    }

    fn l3_rules(&self) -> Retention {
        Retention {
            keep_last: self.l3_keep_last,
            keep_every: self.l3_keep_every,
            keep_within: None,
            grace: Duration::from_secs(self.l3_gc_grace_secs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(toml: &str) -> Config {
        Config::from_toml(toml).unwrap_or_else(|e| panic!("{toml}: {e}"))
    }

    #[test]
    fn keep_last_and_gc_grace_secs_are_l1s_policy() {
        let p = cfg("keep_last = 5\ngc_grace_secs = 42")
            .retention_for(TierKind::L1)
            .unwrap();
        assert_eq!(
            p,
            Retention {
                keep_last: 5,
                keep_every: 0,
                keep_within: None,
                grace: Duration::from_secs(42),
            }
        );
        let d = Config::default().retention_for(TierKind::L1).unwrap();
        assert_eq!((d.keep_last, d.grace.as_secs()), (3, 600), "the defaults");
    }

    #[test]
    fn l3_keep_last_0_means_l3_is_never_collected() {
        let c = cfg("l3_keep_last = 0\nl3_keep_every = 10");
        assert_eq!(c.retention_for(TierKind::L3), None);
        assert_eq!(c.l3_refresh_after(), None, "no collection: no rewrite");
        // An explicit override starts from the configured rules.
        let base = c.retention_rules(TierKind::L3);
        assert_eq!((base.keep_last, base.keep_every), (0, 10));
        assert!(base.validate().is_err(), "never used as is");
    }

    #[test]
    fn l3_keep_last_every_and_grace_are_l3s_policy() {
        let c = cfg("l3_keep_last = 2\nl3_keep_every = 1000\nl3_gc_grace_secs = 60");
        assert_eq!(
            c.retention_for(TierKind::L3),
            Some(Retention {
                keep_last: 2,
                keep_every: 1000,
                keep_within: None,
                grace: Duration::from_secs(60),
            })
        );
        assert_eq!(c.l3_refresh_after(), Some(Duration::from_secs(30)));
        let d = Config::default().retention_for(TierKind::L3).unwrap();
        assert_eq!(
            (d.keep_last, d.keep_every, d.grace.as_secs()),
            (4, 0, 3600),
            "the documented defaults (l3_keep_last 4, l3_keep_every 0)"
        );
        let no_grace = cfg("l3_gc_grace_secs = 0");
        assert_eq!(no_grace.l3_refresh_after(), None);
    }

    #[test]
    fn peers_keep_the_peer_services_default() {
        let c = cfg("gc_grace_secs = 77");
        let p = c.retention_for(TierKind::L2).unwrap();
        let service = strata_peer::replicas::Limits::default();
        assert_eq!(
            (p.keep_last, p.keep_every, p.keep_within),
            (service.keep_last, service.keep_every, service.keep_within),
            "strata gc keeps on a peer what the service itself keeps"
        );
        assert_eq!(p.keep_last, 2);
        assert_eq!(p.grace, Duration::from_secs(77));
    }
}
