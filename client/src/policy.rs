//! The L3 upload policy: which committed steps go to object storage.
//!
//! A step is wanted when its number is a multiple of `upload_every` and, if
//! `upload_min_interval_secs` is set, at least that long has passed (by this
//! rank's injected clock) since the last step the policy chose. Only rank
//! 0's answer is used: it travels in rank 0's commit vote and every rank
//! follows it ([`crate::coord::commit::Decision`]), so the ranks never drift out of
//! phase and L3 always receives whole steps.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use strata_tiered::Clock;

/// The upload policy of one checkpointer.
pub(crate) struct UploadPolicy {
    /// An L3 is configured.
    enabled: bool,
    every: u64,
    min_interval: Duration,
    last: Mutex<Option<SystemTime>>,
    clock: Arc<dyn Clock>,
}

impl UploadPolicy {
    pub(crate) fn new(
        enabled: bool,
        every: u64,
        min_interval: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        UploadPolicy {
            enabled,
            every,
            min_interval,
            last: Mutex::new(None),
            clock,
        }
    }

    /// True if the policy wants `step` on L3 (and notes the time if so).
    pub(crate) fn wants(&self, step: u64) -> bool {
        if !self.enabled || self.every == 0 || step % self.every != 0 {
            return false;
        }
        let Ok(mut last) = self.last.lock() else {
            return false;
        };
        let now = self.clock.now();
        match last.map(|t| now.duration_since(t)) {
            // A wall clock stepped back (NTP): the interval counts from
            // now (not from a time in the future, which would stall
            // uploads for as long as the step); with no interval, no step
            // is skipped.
            Some(Err(_)) if !self.min_interval.is_zero() => {
                *last = Some(now);
                return false;
            }
            Some(Ok(since)) if since < self.min_interval => return false,
            _ => {}
        }
        *last = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_tiered::ManualClock;

    #[test]
    fn every_kth_step_at_most_once_per_interval_by_the_clock() {
        let clock = ManualClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1000));
        let p = UploadPolicy::new(true, 2, Duration::from_secs(60), Arc::new(clock.clone()));
        assert!(!p.wants(1));
        assert!(p.wants(2));
        clock.advance(Duration::from_secs(59));
        assert!(!p.wants(4), "too soon");
        clock.advance(Duration::from_secs(1));
        assert!(p.wants(6));
        let off = UploadPolicy::new(false, 1, Duration::ZERO, Arc::new(clock));
        assert!(!off.wants(2), "no L3");
    }

    #[test]
    fn a_clock_stepped_back_skips_no_step_without_an_interval() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(100_000);
        let clock = ManualClock::new(start);
        let every = UploadPolicy::new(true, 1, Duration::ZERO, Arc::new(clock.clone()));
        assert!(every.wants(1));
        clock.set(start - Duration::from_millis(5));
        assert!(every.wants(2), "no interval: never too soon");
        // With an interval, the interval counts again from the step back.
        let spaced = UploadPolicy::new(true, 1, Duration::from_secs(60), Arc::new(clock.clone()));
        assert!(spaced.wants(3));
        clock.set(start - Duration::from_secs(3600));
        assert!(
            !spaced.wants(4),
            "an hour back: the interval counts from now"
        );
        clock.set(start - Duration::from_secs(3600 - 59));
        assert!(!spaced.wants(5));
        clock.set(start - Duration::from_secs(3600 - 60));
        assert!(spaced.wants(6), "not an hour later");
    }
}
