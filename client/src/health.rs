//! Failures of work that runs after `save` returned, made visible: a save
//! that fails in the background is logged, counted, kept as the last
//! error, and (by default, [`OnBackgroundError::Raise`]) returned by the
//! next `save`, `flush` or `close` unless its own handle already reported
//! it. A training loop that drops its handles (the README's) still learns
//! that a step it thinks it has is not committed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::handle::Completion;
use crate::stats::OnBackgroundError;

impl Config {
    /// What happens to a save that fails in the background.
    pub fn on_background_error(mut self, p: OnBackgroundError) -> Self {
        self.on_background_error = p;
        self
    }
}

/// The background failures of one checkpointer.
pub(crate) struct Background {
    policy: OnBackgroundError,
    failed_saves: AtomicU64,
    /// The newest failure, as [`Error::Background`].
    last: Mutex<Option<Error>>,
    /// Failures nobody reported yet, oldest first, with the completion
    /// their handles read (a handle that returned the error marks it).
    unreported: Mutex<Vec<(u64, Error, Arc<Completion>)>>,
}

impl Background {
    pub(crate) fn new(policy: OnBackgroundError) -> Self {
        Background {
            policy,
            failed_saves: AtomicU64::new(0),
            last: Mutex::new(None),
            unreported: Mutex::new(Vec::new()),
        }
    }

    /// Records that the save of `step` failed with `e`; called by the
    /// persist worker before it completes the save's handle, so a caller
    /// woken by the completion always finds the failure recorded.
    pub(crate) fn save_failed(&self, step: u64, e: &Error, done: &Arc<Completion>) {
        self.failed_saves.fetch_add(1, Ordering::Relaxed);
        tracing::error!(step, error = %e, kind = %e.kind(), "save failed in the background: the step is not committed");
        if let Ok(mut last) = self.last.lock() {
            *last = Some(Error::Background {
                step,
                more: 0,
                source: Box::new(e.clone()),
            });
        }
        if self.policy == OnBackgroundError::Raise {
            if let Ok(mut u) = self.unreported.lock() {
                u.push((step, e.clone(), done.clone()));
            }
        }
    }

    /// The failures not reported yet, as one error (the oldest, counting
    /// the others), and forgets them: each is returned once. Failures a
    /// handle already returned are left out. Always `Ok` with
    /// [`OnBackgroundError::Log`].
    pub(crate) fn check(&self) -> Result<()> {
        let pending: Vec<(u64, Error)> = match self.unreported.lock() {
            Ok(mut u) => u
                .drain(..)
                .filter(|(_, _, done)| !done.reported())
                .map(|(step, e, _)| (step, e))
                .collect(),
            Err(_) => return Err(Error::Pipeline("poisoned".into())),
        };
        let more = pending.len().saturating_sub(1) as u64;
        match pending.into_iter().next() {
            Some((step, e)) => Err(Error::Background {
                step,
                more,
                source: Box::new(e),
            }),
            None => Ok(()),
        }
    }

    pub(crate) fn failed_saves(&self) -> u64 {
        self.failed_saves.load(Ordering::Relaxed)
    }

    pub(crate) fn last_error(&self) -> Option<Error> {
        self.last.lock().ok().and_then(|l| l.clone())
    }
}
