//! Restore agreement: what each rank can restore, exchanged in one round,
//! and the steps every rank can restore.
//!
//! A rank tells the others ([`Holdings`]): the steps it committed in some
//! tier, the steps whose manifest it holds on L1 without a commit record
//! (it voted, then failed or died before its record), the newest step it
//! saw committed by a world of another size, and a tier it could not list.
//! Any rank's record proves that every rank voted the step durable (no
//! record is written before a unanimous vote), so a step some rank
//! committed is *decided*: a rank holding only its manifest of a decided
//! step rolls it forward (writes its record) and restores it like the
//! others ([`Agreement::common`]). A step committed on some ranks and not
//! others never makes the job go back to an older one.

use std::collections::BTreeSet;

use strata_tiered::StepInfo;

use crate::config::Config;
use crate::coord::coordinator::Coordinator;
use crate::coord::verdict;
use crate::error::{Error, Result};
use crate::restore::payload::Reader;
use crate::restore::shared_l3::{L3View, LISTER};

/// Tag of the current payload. An older build sends a bare list of
/// little-endian `u64` steps (a multiple of 8 bytes); this one's length is
/// padded to 1 modulo 8, so the two never read as each other.
const TAG: u8 = 0xA1;
/// Tag of a payload that carries only the newest steps
/// ([`Holdings::compact`]): older steps the rank may hold are not in it.
const TAG_COMPACT: u8 = 0xA2;
/// [`TAG`] and [`TAG_COMPACT`] of a payload that also says how this rank
/// saw L3: it left the listing to [`LISTER`], or it is the lister and
/// carries its [`L3View`] (`shared_l3`). Without either (no L3, or a
/// world of one), a payload keeps the older tags, which an older build
/// reads; with L3 and several ranks, every rank must run a build that
/// shares the listing (an older one refuses these tags).
const TAG_L3: u8 = 0xA3;
const TAG_L3_COMPACT: u8 = 0xA4;
/// Steps of each kind a compact payload carries (the newest): a round's
/// size no longer grows with the job's history.
pub(crate) const WINDOW: usize = 64;
/// Tiers some rank could not list that a decision names (the first of
/// those whose L1 is empty, and the first of the others).
const MAX_BLIND: usize = 32;
/// Longest tier description carried (a tier's error message is cut).
const MAX_NOTE: usize = 512;
/// Marks [`Holdings::checked`] after the rest of a payload (its padding
/// is zeros, so the two never read as each other).
const CHECKED: u8 = 0xC1;
/// Bit of a decision's first byte saying [`Agreement::ready`] follows.
const READY: u8 = 2;

/// What one rank can restore, as it tells the others.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Holdings {
    /// Steps this rank committed in some tier (for this world size).
    pub(crate) committed: BTreeSet<u64>,
    /// Steps whose manifest this rank holds on L1 without its commit record.
    pub(crate) partial: BTreeSet<u64>,
    /// The newest step committed by a world of another size: (step, world).
    pub(crate) foreign: Option<(u64, u32)>,
    /// A tier this rank could not list (`"tier: why"`).
    pub(crate) unreadable: Option<String>,
    /// This rank's L1 holds no committed step: then an unreadable tier may
    /// hold its newest one (L1 is written first, and its retention keeps
    /// the newest steps; only a lost or replaced disk lacks them).
    pub(crate) l1_empty: bool,
    /// Only the newest steps are listed ([`Holdings::compact`]).
    pub(crate) compact: bool,
    /// This rank did not list L3: [`LISTER`]'s view stands for it.
    pub(crate) l3_deferred: bool,
    /// The lister's view of L3, for every rank that left L3 to it.
    pub(crate) l3: Option<L3View>,
    /// The step whose manifest this rank already read and checked against
    /// its record, before the round: the one it expects every rank to
    /// restore. When every rank checked the step the decision selects,
    /// no second round asks whether each can use it ([`Agreement::ready`]).
    pub(crate) checked: Option<u64>,
}

impl Holdings {
    /// The holdings as a restore round carries them: the newest
    /// [`WINDOW`] committed and partial steps, and `wanted` where held.
    /// Unchanged (and not marked compact) when nothing is left out.
    pub(crate) fn compact(&self, wanted: Option<u64>) -> Holdings {
        let view_steps = self.l3.as_ref().map_or(BTreeSet::new(), L3View::steps);
        if self.committed.len() <= WINDOW
            && self.partial.len() <= WINDOW
            && view_steps.len() <= WINDOW
        {
            return self.clone();
        }
        let newest = |set: &BTreeSet<u64>| -> BTreeSet<u64> {
            let mut kept: BTreeSet<u64> = set.iter().rev().take(WINDOW).copied().collect();
            kept.extend(wanted.filter(|w| set.contains(w)));
            kept
        };
        let in_view = newest(&view_steps);
        Holdings {
            committed: newest(&self.committed),
            partial: newest(&self.partial),
            compact: true,
            l3: self.l3.as_ref().map(|v| v.only(|s| in_view.contains(&s))),
            ..self.clone()
        }
    }

    /// Adds what a tier's listing shows: this rank's committed steps, and
    /// the newest step committed by another world size. `partial_too`
    /// (L1): this rank's manifests without a record, not being retired.
    pub(crate) fn add_listing(&mut self, cfg: &Config, steps: &[StepInfo], partial_too: bool) {
        self.committed
            .extend(crate::coord::commit::restorable(cfg, steps));
        for st in steps {
            if let Some(w) = st.world_size().filter(|w| *w != cfg.world_size) {
                if self.foreign.is_none_or(|(s, _)| s < st.step) {
                    self.foreign = Some((st.step, w));
                }
            }
            if partial_too
                && st.manifests.contains(&cfg.rank)
                && !st.committed_ranks().contains(&cfg.rank)
                && !st.retiring.contains(&cfg.rank)
                && !st.unreadable.contains_key(&cfg.rank)
            {
                self.partial.insert(st.step);
            }
        }
    }

    /// Drops partial steps this rank committed in another tier (it holds a
    /// record there; nothing to roll forward).
    pub(crate) fn settle(&mut self) {
        let committed = &self.committed;
        self.partial.retain(|s| !committed.contains(s));
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let shares = self.l3_deferred || self.l3.is_some();
        let mut out = vec![match (shares, self.compact) {
            (false, false) => TAG,
            (false, true) => TAG_COMPACT,
            (true, false) => TAG_L3,
            (true, true) => TAG_L3_COMPACT,
        }];
        for set in [&self.committed, &self.partial] {
            out.extend_from_slice(&(set.len() as u32).to_le_bytes());
            for s in set {
                out.extend_from_slice(&s.to_le_bytes());
            }
        }
        write_foreign(&mut out, self.foreign);
        out.push(u8::from(self.l1_empty));
        let text = self.unreadable.as_deref().unwrap_or("");
        let note = &text.as_bytes()[..floor_char_boundary(text, MAX_NOTE)];
        out.extend_from_slice(&(note.len() as u16).to_le_bytes());
        out.extend_from_slice(note);
        if shares {
            out.push(u8::from(self.l3_deferred));
            match &self.l3 {
                Some(v) => {
                    out.push(1);
                    v.encode(&mut out);
                }
                None => out.push(0),
            }
        }
        if let Some(step) = self.checked {
            out.push(CHECKED);
            out.extend_from_slice(&step.to_le_bytes());
        }
        while out.len() % 8 != 1 {
            out.push(0);
        }
        out
    }

    /// Decodes a rank's payload (this build's, or an older build's bare
    /// step list); `None` when malformed.
    pub(crate) fn decode(b: &[u8]) -> Option<Holdings> {
        if b.len() % 8 == 0 {
            return Some(Holdings {
                committed: b
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                    .collect(),
                ..Holdings::default()
            });
        }
        if b.len() % 8 != 1 {
            return None;
        }
        let mut r = Reader(b);
        let (shares, compact) = match r.take(1)? {
            [TAG] => (false, false),
            [TAG_COMPACT] => (false, true),
            [TAG_L3] => (true, false),
            [TAG_L3_COMPACT] => (true, true),
            _ => return None,
        };
        let sets = [read_steps(&mut r)?, read_steps(&mut r)?];
        let foreign = read_foreign(&mut r)?;
        let l1_empty = flag(r.take(1)?)?;
        let n = u16::from_le_bytes(r.take(2)?.try_into().ok()?) as usize;
        let note = r.take(n)?;
        let (mut l3_deferred, mut l3) = (false, None);
        if shares {
            l3_deferred = flag(r.take(1)?)?;
            if flag(r.take(1)?)? {
                let (view, rest) = L3View::decode(r.0)?;
                l3 = Some(view);
                r.0 = rest;
            }
        }
        let mut checked = None;
        if r.0.first() == Some(&CHECKED) {
            r.take(1)?;
            checked = Some(r.u64()?);
        }
        if r.0.iter().any(|&p| p != 0) {
            return None;
        }
        let [committed, partial] = sets;
        Some(Holdings {
            committed,
            partial,
            foreign,
            unreadable: (!note.is_empty()).then(|| String::from_utf8_lossy(note).into_owned()),
            l1_empty,
            compact,
            l3_deferred,
            l3,
            checked,
        })
    }
}

/// A byte that must be 0 or 1.
fn flag(v: &[u8]) -> Option<bool> {
    match v {
        [0] => Some(false),
        [1] => Some(true),
        _ => None,
    }
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    let mut n = s.len().min(max);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// The newest step of another world size, as a payload carries it.
fn write_foreign(out: &mut Vec<u8>, foreign: Option<(u64, u32)>) {
    match foreign {
        Some((step, world)) => {
            out.push(1);
            out.extend_from_slice(&step.to_le_bytes());
            out.extend_from_slice(&world.to_le_bytes());
        }
        None => out.push(0),
    }
}

/// A count, then that many steps (bounded by the payload itself: no
/// allocation past its length).
fn read_steps(r: &mut Reader<'_>) -> Option<BTreeSet<u64>> {
    let n = r.u32()? as usize;
    if n > r.left() / 8 {
        return None;
    }
    (0..n).map(|_| r.u64()).collect()
}

/// What [`write_foreign`] wrote.
fn read_foreign(r: &mut Reader<'_>) -> Option<Option<(u64, u32)>> {
    match r.take(1)? {
        [0] => Some(None),
        [1] => Some(Some((r.u64()?, r.u32()?))),
        _ => None,
    }
}

/// What the ranks agreed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Agreement {
    /// Steps every rank can restore: each committed it, or holds its
    /// manifest of it and some rank committed it (it rolls it forward).
    pub(crate) common: BTreeSet<u64>,
    /// Steps some rank committed: every rank voted them durable.
    pub(crate) decided: BTreeSet<u64>,
    /// The newest step committed by a world of another size, any rank saw.
    pub(crate) foreign: Option<(u64, u32)>,
    /// Tiers some rank could not list: (rank, `"tier: why"`, its L1 held
    /// no committed step).
    pub(crate) blind: Vec<(u32, String, bool)>,
    /// No step is common and some rank sent only its newest steps: the
    /// ranks must exchange everything they hold ([`agree`] does).
    pub(crate) widen: bool,
    /// The lister's view of L3 (its steps among the decision's), for the
    /// ranks that left L3 to it.
    pub(crate) l3: Option<L3View>,
    /// The step asked for: a decision carries it beside the newest ones
    /// (not sent itself: every rank asks for the same).
    pub(crate) wanted: Option<u64>,
    /// The step the selection picks ([`Agreement::target`]) when every
    /// rank already read and checked its manifest of it
    /// ([`Holdings::checked`]): every rank can use it, and the round that
    /// would ask them is skipped. `None` sends the ranks to that round.
    pub(crate) ready: Option<u64>,
}

impl Agreement {
    /// Combines every rank's holdings (by rank).
    pub(crate) fn of(all: &[Holdings]) -> Result<Agreement> {
        let mut blind: Vec<(u32, String, bool)> = all
            .iter()
            .enumerate()
            .filter_map(|(r, h)| h.unreadable.clone().map(|t| (r as u32, t, h.l1_empty)))
            .collect();
        // L3 as the lister saw it stands for every rank that did not list
        // it: the steps it names a rank committed are that rank's too.
        let view = all.get(LISTER as usize).and_then(|h| h.l3.clone());
        let deferred = all.iter().position(|h| h.l3_deferred);
        if let Some(first) = deferred {
            // Whether L3 may hide a rank's newest step: any rank's L1 empty.
            let any_empty = all.iter().any(|h| h.l1_empty);
            match &view {
                Some(L3View::Listed(_)) => {}
                Some(L3View::Unreadable(why)) => blind.push((LISTER, why.clone(), any_empty)),
                None => blind.push((
                    first as u32,
                    format!("L3: rank {LISTER} sent no listing of it"),
                    any_empty,
                )),
            }
            blind.sort_by_key(|b| b.0);
        }
        let from_view = |rank: usize, h: &Holdings| match (&view, h.l3_deferred) {
            (Some(v), true) => v.steps_of(rank as u32),
            _ => BTreeSet::new(),
        };
        let decided: BTreeSet<u64> = all
            .iter()
            .flat_map(|h| h.committed.iter().copied())
            .chain(view.iter().flat_map(L3View::steps))
            .collect();
        let mut common: Option<BTreeSet<u64>> = None;
        for (rank, h) in all.iter().enumerate() {
            let can: BTreeSet<u64> = h
                .committed
                .iter()
                .copied()
                .chain(h.partial.intersection(&decided).copied())
                .chain(from_view(rank, h))
                .collect();
            common = Some(match common {
                None => can,
                Some(c) => c.intersection(&can).copied().collect(),
            });
        }
        let foreign = all.iter().filter_map(|h| h.foreign).max();
        let common = common.unwrap_or_default();
        let checked = all.first().and_then(|h| h.checked);
        let ready = checked.filter(|c| all.iter().all(|h| h.checked == Some(*c)));
        Ok(Agreement {
            widen: common.is_empty() && all.iter().any(|h| h.compact),
            common,
            decided,
            foreign,
            blind,
            l3: deferred.and(view),
            wanted: None,
            ready,
        })
    }

    /// Sets the step asked for, and keeps [`Agreement::ready`] only when
    /// it is the step the selection picks.
    pub(crate) fn asked(self, wanted: Option<u64>) -> Agreement {
        let a = Agreement { wanted, ..self };
        let target = a.target();
        Agreement {
            ready: a.ready.filter(|r| target == Some(*r)),
            ..a
        }
    }

    /// The step a restore tries first: the one asked for if every rank
    /// can restore it, else (none asked for) the newest common one.
    pub(crate) fn target(&self) -> Option<u64> {
        match self.wanted {
            Some(w) => self.common.contains(&w).then_some(w),
            None => self.common.last().copied(),
        }
    }

    /// The steps of `set` a decision carries: the newest [`WINDOW`], and
    /// the one asked for.
    fn sent(&self, set: &BTreeSet<u64>) -> BTreeSet<u64> {
        let mut kept: BTreeSet<u64> = set.iter().rev().take(WINDOW).copied().collect();
        kept.extend(self.wanted.filter(|w| set.contains(w)));
        kept
    }

    /// The decision as the reducing rank sends it: bounded whatever the
    /// world (the newest [`WINDOW`] decided steps, at most 2 × [`MAX_BLIND`]
    /// blind tiers, keeping the first one [`Agreement::check_blind`] can
    /// pick).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![u8::from(self.widen)];
        if let Some(step) = self.ready {
            out[0] |= READY;
            out.extend_from_slice(&step.to_le_bytes());
        }
        let steps = |out: &mut Vec<u8>, kept: &BTreeSet<u64>| {
            out.extend_from_slice(&(kept.len() as u32).to_le_bytes());
            for s in kept {
                out.extend_from_slice(&s.to_le_bytes());
            }
        };
        let (common, decided) = (self.sent(&self.common), self.sent(&self.decided));
        steps(&mut out, &common);
        steps(&mut out, &decided);
        write_foreign(&mut out, self.foreign);
        let empty = self.blind.iter().filter(|b| b.2).take(MAX_BLIND);
        let other = self.blind.iter().filter(|b| !b.2).take(MAX_BLIND);
        let mut blind: Vec<&(u32, String, bool)> = empty.chain(other).collect();
        blind.sort_by_key(|b| b.0);
        out.extend_from_slice(&(blind.len() as u32).to_le_bytes());
        for (rank, text, l1_empty) in blind {
            let note = &text.as_bytes()[..floor_char_boundary(text, MAX_NOTE)];
            out.extend_from_slice(&rank.to_le_bytes());
            out.push(u8::from(*l1_empty));
            out.extend_from_slice(&(note.len() as u16).to_le_bytes());
            out.extend_from_slice(note);
        }
        // Only when there is a view, so a build without shared listings
        // reads every other decision.
        // The view's steps the decision names, no more: bounded like them.
        if let Some(v) = &self.l3 {
            v.only(|s| common.contains(&s) || decided.contains(&s))
                .encode(&mut out);
        }
        out
    }

    /// Decodes a decision; `None` when malformed (never allocating past
    /// the payload's length).
    pub(crate) fn decode(b: &[u8]) -> Option<Agreement> {
        let mut r = Reader(b);
        let &[first] = r.take(1)? else {
            return None;
        };
        if first & !(READY | 1) != 0 {
            return None;
        }
        let widen = first & 1 == 1;
        let ready = if first & READY != 0 {
            Some(r.u64()?)
        } else {
            None
        };
        let sets = [read_steps(&mut r)?, read_steps(&mut r)?];
        let foreign = read_foreign(&mut r)?;
        let n = u32::from_le_bytes(r.take(4)?.try_into().ok()?) as usize;
        if n > r.0.len() / 7 {
            return None;
        }
        let mut blind = Vec::with_capacity(n);
        for _ in 0..n {
            let rank = u32::from_le_bytes(r.take(4)?.try_into().ok()?);
            let l1_empty = flag(r.take(1)?)?;
            let len = u16::from_le_bytes(r.take(2)?.try_into().ok()?) as usize;
            let note = String::from_utf8_lossy(r.take(len)?).into_owned();
            blind.push((rank, note, l1_empty));
        }
        let l3 = if r.0.is_empty() {
            None
        } else {
            let (view, rest) = L3View::decode(r.0)?;
            if !rest.is_empty() {
                return None;
            }
            Some(view)
        };
        let [common, decided] = sets;
        Some(Agreement {
            common,
            decided,
            foreign,
            blind,
            widen,
            l3,
            wanted: None,
            ready,
        })
    }

    /// The error for a tier some rank could not list, when it may hide a
    /// newer step than the selection would restore: the rank's L1 holds no
    /// committed step (a lost disk: the step may be only there), or another
    /// rank holds a decided step newer than the newest common one (this
    /// rank's copy may be only there). An explicit step every rank can
    /// restore is never blocked. The same on every rank.
    pub(crate) fn check_blind(&self, wanted: Option<u64>) -> Result<()> {
        if wanted.is_some_and(|w| self.common.contains(&w)) {
            return Ok(());
        }
        let behind = match (self.decided.last(), self.common.last()) {
            (Some(d), Some(c)) => d > c,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let Some((r, t, _)) = self
            .blind
            .iter()
            .find(|(_, _, l1_empty)| *l1_empty || behind || wanted.is_some())
        else {
            return Ok(());
        };
        let (tier, reason) = t.split_once(": ").unwrap_or((t.as_str(), ""));
        Err(Error::TierUnavailable {
            tier: format!("{tier} (seen by rank {r})"),
            reason: reason.to_string(),
        })
    }

    /// The error for a step selection the agreement cannot serve: another
    /// world size's newer step, or nothing common.
    pub(crate) fn check_world(&self, cfg: &Config, wanted: Option<u64>) -> Result<()> {
        let Some((step, saved_world)) = self.foreign else {
            return Ok(());
        };
        let hidden = match wanted {
            None => self.common.last().is_none_or(|&newest| step > newest),
            Some(w) => !self.common.contains(&w) && step >= w,
        };
        if hidden {
            return Err(Error::WorldSizeMismatch {
                step,
                saved_world,
                world: cfg.world_size,
            });
        }
        Ok(())
    }
}

/// Step agreement: sends this rank's holdings (the newest steps only,
/// [`Holdings::compact`]) and gets back what one rank decided from every
/// rank's ([`Agreement::of`]), the same on every rank (`key` names the
/// round). When no step is common among the newest ones, a second round
/// exchanges everything each rank holds.
pub(crate) fn agree(
    coord: &dyn Coordinator,
    cfg: &Config,
    key: &str,
    mine: &Holdings,
    wanted: Option<u64>,
) -> Result<Agreement> {
    let first = round(coord, cfg, key, &mine.compact(wanted), wanted)?;
    if !first.widen {
        return Ok(first);
    }
    round(coord, cfg, &format!("{key}/all"), mine, wanted)
}

fn round(
    coord: &dyn Coordinator,
    cfg: &Config,
    key: &str,
    mine: &Holdings,
    wanted: Option<u64>,
) -> Result<Agreement> {
    let name = key.to_string();
    let decided = coord.all_reduce(
        cfg.rank,
        key,
        mine.encode(),
        std::time::Duration::from_secs(cfg.coordination_timeout_secs),
        &move |all| {
            let combined = all
                .iter()
                .enumerate()
                .map(|(r, v)| {
                    Holdings::decode(v).ok_or_else(|| {
                        Error::Coordination(format!("{name}: rank {r} sent a malformed step list"))
                    })
                })
                .collect::<Result<Vec<_>>>()
                .and_then(|all| Agreement::of(&all))
                .map(|a| a.asked(wanted));
            verdict::encode(combined.map(|a| a.encode()))
        },
    )?;
    Agreement::decode(verdict::decode(key, &decided)?).ok_or_else(|| {
        Error::Coordination(format!(
            "{key}: the coordinator returned a malformed agreement"
        ))
    })
}

#[cfg(test)]
mod tests;
