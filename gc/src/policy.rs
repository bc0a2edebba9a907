//! [`Retention`]: what a tier keeps.

use std::time::Duration;

use crate::error::{GcError, Result};

/// What a tier keeps. A committed step is kept if any rule keeps it; the
/// newest committed step is always kept (it may be the newest one every
/// rank can restore), and so are pinned steps and the steps the caller
/// holds (a pending upload or push).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention {
    /// The newest this many committed steps (at least 1).
    pub keep_last: usize,
    /// Every step divisible by this (0: none).
    pub keep_every: u64,
    /// Steps committed within this long before the tier's time, by their
    /// commit records' time (None: no such rule).
    pub keep_within: Option<Duration>,
    /// An unreferenced chunk is deleted only if the tier has not written it
    /// (or deduplicated against it) for this long: a save in flight that
    /// reuses it keeps it.
    pub grace: Duration,
}

impl Retention {
    /// The node's NVMe: fills in hours; a few steps.
    pub fn l1() -> Self {
        Retention {
            keep_last: 3,
            keep_every: 0,
            keep_within: None,
            grace: Duration::from_secs(600),
        }
    }

    /// Peer memory: fills in minutes; the newest one or two.
    pub fn l2() -> Self {
        Retention {
            keep_last: 2,
            ..Self::l1()
        }
    }

    /// Object storage: the newest, plus every 1,000th step for the long run.
    pub fn l3() -> Self {
        Retention {
            keep_last: 2,
            keep_every: 1000,
            keep_within: None,
            grace: Duration::from_secs(3600),
        }
    }

    /// Checks the policy.
    pub fn validate(&self) -> Result<()> {
        if self.keep_last == 0 {
            return Err(GcError::Policy("keep_last must be at least 1".into()));
        }
        Ok(())
    }
}
