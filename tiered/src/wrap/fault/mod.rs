//! [`FaultStore`]: seeded, replayable fault injection, the one fault
//! injector of the workspace. It wraps either layer a tier is built on:
//!
//! * a [`ChunkStore`](crate::ChunkStore) (`chunk_store.rs`), so L1, the
//!   peers, L3 and user stores are tested under the same faults;
//! * an `ObjectStore` under [`L3Store`](crate::L3Store)
//!   (`object_store.rs`), for what only a real object store does: 503s
//!   and dropped connections inside one L3 call, create-only puts that are
//!   not implemented, multipart uploads whose parts fail.
//!
//! What to inject is a [`FaultPlan`] (`plan.rs`). Every call advances one
//! seeded [`SplitMix64`] under a mutex and takes its own sub-generator from
//! it, and draws from that one in a fixed order whatever the rates, so the
//! same seed and the same sequence of calls give the same faults.

use std::sync::Mutex;
use std::time::Duration;

use crate::rng::SplitMix64;

mod chunk_store;
mod object_store;
mod plan;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

use plan::{bump, Counters};
pub use plan::{FaultCounts, FaultPlan, FaultTargets};

/// The family of a call, for [`FaultTargets`] and `writes_before_outage`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Read,
    Write,
    List,
    Commit,
}

/// Why a call failed on purpose; each layer words it as its errors do.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Outage,
    Error,
    Timeout,
    Drop,
}

/// What to do to one chunk read.
enum Damage {
    None,
    Flip(u64),
    Cut(u64),
}

#[derive(Debug)]
struct State {
    rng: SplitMix64,
    ops: u64,
    healed: bool,
}

/// One call's own generator, whether the plan targets it, and its delay.
struct Call {
    rng: SplitMix64,
    hit: bool,
    delay: Duration,
    class: Class,
}

/// Injects the faults of a [`FaultPlan`] into calls to the inner store (a
/// [`ChunkStore`](crate::ChunkStore) or an `ObjectStore`). Errors, timeouts
/// and outages are injected before the call reaches the store (so nothing
/// happened, and a retry sees the same state); dropped connections after it.
#[derive(Debug)]
pub struct FaultStore<S> {
    inner: S,
    plan: FaultPlan,
    state: Mutex<State>,
    counts: Counters,
}

impl<S> FaultStore<S> {
    /// Wraps `inner` with `plan`.
    pub fn new(inner: S, plan: FaultPlan) -> Self {
        FaultStore {
            inner,
            state: Mutex::new(State {
                rng: SplitMix64::new(plan.seed),
                ops: 0,
                healed: false,
            }),
            plan,
            counts: Counters::default(),
        }
    }

    /// Ends the outages of [`FaultPlan::outage_after`] and
    /// [`FaultPlan::writes_before_outage`] for good.
    pub fn heal(&self) {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .healed = true;
    }

    /// The faults injected so far.
    pub fn counts(&self) -> FaultCounts {
        self.counts.snapshot()
    }

    /// The plan.
    pub fn plan(&self) -> &FaultPlan {
        &self.plan
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Counts a call, takes its generator and draws its delay; the outages.
    /// Does not wait.
    fn open(&self, class: Class) -> Result<Call, Fault> {
        let (seed, down) = {
            // A poisoned lock holds a generator and two counters, all valid.
            let mut st = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            st.ops += 1;
            let calls_down = self.plan.outage_after.is_some_and(|n| st.ops > n);
            let writes_down = class == Class::Write
                && self.plan.writes_before_outage.is_some_and(|n| {
                    self.counts
                        .writes
                        .load(std::sync::atomic::Ordering::Relaxed)
                        >= n
                });
            (st.rng.next_u64(), (calls_down || writes_down) && !st.healed)
        };
        bump(&self.counts.ops);
        if down {
            bump(&self.counts.outage_failures);
            return Err(Fault::Outage);
        }
        let t = self.plan.targets;
        let hit = match class {
            Class::Read => t.reads,
            Class::Write => t.writes,
            Class::List => t.listing,
            Class::Commit => t.commit,
        };
        let mut rng = SplitMix64::new(seed);
        let jitter = u64::try_from(self.plan.latency_jitter.as_nanos()).unwrap_or(u64::MAX);
        let mut delay = self.plan.latency + Duration::from_nanos(rng.up_to(jitter));
        if hit && !delay.is_zero() {
            bump(&self.counts.delays);
        } else {
            delay = Duration::ZERO;
        }
        Ok(Call {
            rng,
            hit,
            delay,
            class,
        })
    }

    /// One draw: the call (or one entry of a batch) fails, times out, or
    /// goes on. The timeout's wait is the caller's.
    fn draw_failure(&self, call: &mut Call) -> Option<Fault> {
        let x = call.rng.unit();
        if !call.hit {
            return None;
        }
        if x < self.plan.error_rate {
            bump(&self.counts.errors);
            return Some(Fault::Error);
        }
        if x < self.plan.error_rate + self.plan.timeout_rate {
            bump(&self.counts.timeouts);
            return Some(Fault::Timeout);
        }
        None
    }

    /// [`Self::open`], the delay, then [`Self::draw_failure`] of a single call.
    async fn gate(&self, class: Class) -> Result<Call, Fault> {
        let mut call = self.open(class)?;
        if !call.delay.is_zero() {
            tokio::time::sleep(call.delay).await;
        }
        match self.draw_failure(&mut call) {
            None => Ok(call),
            Some(Fault::Timeout) => {
                tokio::time::sleep(self.plan.timeout).await;
                Err(Fault::Timeout)
            }
            Some(f) => Err(f),
        }
    }

    /// After the inner call (`ok`: it succeeded): counts a write, and draws
    /// whether the connection drops now (the call's effect stands).
    fn close(&self, call: &mut Call, ok: bool) -> Result<(), Fault> {
        let drop = call.rng.chance(self.plan.drop_rate);
        if ok && call.class == Class::Write {
            bump(&self.counts.writes);
        }
        if ok && drop && call.hit {
            bump(&self.counts.drops);
            return Err(Fault::Drop);
        }
        Ok(())
    }

    /// Draws what happens to one chunk read (always the same draws, so the
    /// sequence does not depend on the data).
    fn draw_damage(&self, call: &mut Call) -> Damage {
        let corrupt = call.rng.chance(self.plan.corrupt_rate);
        let cut = call.rng.chance(self.plan.truncate_rate);
        let at = call.rng.next_u64();
        match (call.hit, corrupt, cut) {
            (true, true, _) => Damage::Flip(at),
            (true, false, true) => Damage::Cut(at),
            _ => Damage::None,
        }
    }

    /// Damages bytes in place: a flipped bit, or a shorter length.
    fn damage_bytes(&self, d: &Damage, bytes: &mut Vec<u8>) {
        let n = bytes.len() as u64;
        if n == 0 {
            return;
        }
        match *d {
            Damage::None => {}
            Damage::Flip(at) => {
                bump(&self.counts.corruptions);
                if let Some(b) = bytes.get_mut((at % n) as usize) {
                    *b ^= 1 << (at >> 61);
                }
            }
            Damage::Cut(at) => {
                bump(&self.counts.truncations);
                let cut = 1 + at % n.min(64);
                bytes.truncate((n - cut) as usize);
            }
        }
    }
}

impl<S: std::fmt::Display> std::fmt::Display for FaultStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultStore({})", self.inner)
    }
}
