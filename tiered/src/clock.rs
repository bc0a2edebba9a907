//! Time, injected: every decision that depends on the time (grace periods,
//! retention by age, the upload policy) asks a [`Clock`], so tests move
//! time forward instead of sleeping, and a failing case replays.
//!
//! A clock is this node's own: no decision compares it with another node's.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, by this clock.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to (tests and simulations).
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<SystemTime>>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: SystemTime) -> Self {
        ManualClock {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// Moves the clock forward by `by` (every clone sees it).
    pub fn advance(&self, by: Duration) {
        if let Ok(mut t) = self.now.lock() {
            *t += by;
        }
    }

    /// Sets the clock to `to`, earlier or later (a wall clock that NTP
    /// steps back; every clone sees it).
    pub fn set(&self, to: SystemTime) {
        if let Ok(mut t) = self.now.lock() {
            *t = to;
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        self.now.lock().map_or(SystemTime::UNIX_EPOCH, |t| *t)
    }
}

/// Milliseconds since the Unix epoch by `clock` (0 before it).
pub fn unix_ms(clock: &dyn Clock) -> u64 {
    clock
        .now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(10));
        let c2 = c.clone();
        assert_eq!(unix_ms(&c), 10_000);
        c2.advance(Duration::from_millis(5));
        assert_eq!(unix_ms(&c), 10_005);
    }
}
