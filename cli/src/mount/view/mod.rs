//! What the mount shows: the tree of steps, ranks and entries, listed
//! from the catalog (refreshed every interval), and the bytes of each
//! file, read through the client's [`ShardReader`] (the fastest tier with
//! a verified copy, chunk by chunk fallback) with one chunk cache shared
//! by every reader.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use strata::tiers::{Catalog, RangeStats, ShardReader, SharedChunkCache, Tiers};

mod readahead;

use readahead::Sequential;

use super::counters::Counters;
use super::layout::{has_places, ModelFile, Part, ShardFile};
use super::names::escape;
use crate::show::{kind_dtype_shape, places, Place};

/// Shards whose manifests and readers are kept at once.
const SHARDS_KEPT: usize = 1024;

/// A node of the tree. Inode numbers are handed out per node on first
/// sight and never reused while mounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Node {
    Root,
    /// `latest`, a symbolic link to the newest step's directory.
    Latest,
    /// `.stats.json`: the mount's counters.
    Stats,
    Step(u64),
    Manifest(u64),
    Model(u64),
    RankFile(u64, u32),
    RankDir(u64, u32),
    /// Entry `.2` (its index in the manifest) of rank `.1`'s shard.
    Entry(u64, u32, u32),
}

impl Node {
    /// The step the node belongs to, if any.
    pub(crate) fn step(&self) -> Option<u64> {
        match *self {
            Node::Root | Node::Latest | Node::Stats => None,
            Node::Step(s)
            | Node::Manifest(s)
            | Node::Model(s)
            | Node::RankFile(s, _)
            | Node::RankDir(s, _)
            | Node::Entry(s, _, _) => Some(s),
        }
    }
}

/// The inode tables.
struct Inodes {
    by_node: HashMap<Node, u64>,
    by_ino: HashMap<u64, Node>,
    next: u64,
}

/// What a node is, for `stat`.
pub(crate) enum Kind {
    Dir,
    Link(String),
    File { size: u64, immutable: bool },
}

/// Why a node could not be served.
#[derive(Debug)]
pub(crate) enum Fail {
    /// Not there (any more).
    Gone,
    /// A read or check failed: EIO, with the reason logged.
    Io(String),
}

/// A shard: its manifest (in the reader), its file layout, its entries'
/// file names.
pub(crate) struct Shard {
    pub(crate) reader: ShardReader,
    pub(crate) file: ShardFile,
    pub(crate) names: Vec<String>,
}

/// What a step directory holds beyond its ranks, built on first need.
struct StepFiles {
    manifest_json: Vec<u8>,
    model: Option<ModelFile>,
}

/// The shards kept, by (step, rank), and their order of loading (the
/// oldest is dropped first).
type Shards = (HashMap<(u64, u32), Arc<Shard>>, VecDeque<(u64, u32)>);

/// The mount's state.
pub(crate) struct View {
    tiers: Tiers,
    refresh: Duration,
    catalog: Mutex<(Instant, Arc<Catalog>)>,
    shards: Mutex<Shards>,
    steps: Mutex<HashMap<u64, Arc<StepFiles>>>,
    cache: SharedChunkCache,
    pub(crate) counters: Arc<Counters>,
    inodes: Mutex<Inodes>,
    /// Per file: where its last read ended, and how far its readahead
    /// has reached.
    sequential: Mutex<HashMap<Node, Sequential>>,
    prefetching: Arc<std::sync::atomic::AtomicUsize>,
}

impl View {
    /// A view of `tiers`' job, listing again every `refresh`, with a
    /// chunk cache of `cache_bytes`.
    pub(crate) fn new(tiers: Tiers, refresh: Duration, cache_bytes: usize) -> Self {
        let cat = list(&tiers);
        View {
            tiers,
            refresh,
            catalog: Mutex::new((Instant::now(), Arc::new(cat))),
            shards: Mutex::new((HashMap::new(), VecDeque::new())),
            steps: Mutex::new(HashMap::new()),
            cache: SharedChunkCache::new(cache_bytes),
            counters: Arc::new(Counters::default()),
            inodes: Mutex::new(Inodes {
                by_node: HashMap::from([(Node::Root, 1)]),
                by_ino: HashMap::from([(1, Node::Root)]),
                next: 2,
            }),
            sequential: Mutex::new(HashMap::new()),
            prefetching: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        }
    }

    /// The job.
    pub(crate) fn job(&self) -> &str {
        self.tiers.job()
    }

    /// The catalog, listed again when older than the refresh interval.
    /// A listing in which a tier that answered before cannot be read is
    /// not taken: the mount keeps the last good view (a dead server never
    /// makes the store look empty) and says so in the log.
    pub(crate) fn catalog(&self) -> Arc<Catalog> {
        let Ok(mut c) = self.catalog.lock() else {
            return Arc::new(list(&self.tiers));
        };
        if c.0.elapsed() < self.refresh {
            return c.1.clone();
        }
        // Listed under the lock: one listing at a time, the others wait
        // for it instead of listing too.
        let fresh = list(&self.tiers);
        self.counters.refreshes.fetch_add(1, Ordering::Relaxed);
        let lost: Vec<String> = fresh
            .unreadable()
            .filter(|(t, _)| c.1.unreadable().all(|(o, _)| o.name != t.name))
            .map(|(t, e)| format!("{}: {e}", t.name))
            .collect();
        if !lost.is_empty() {
            tracing::warn!("cannot list {}; showing the last listing", lost.join("; "));
            c.0 = Instant::now();
            return c.1.clone();
        }
        let fresh = Arc::new(fresh);
        // Steps gone from every tier: forget what was built for them.
        let steps = fresh.committed_steps();
        if let Ok(mut s) = self.steps.lock() {
            s.retain(|k, _| steps.contains(k));
        }
        if let Ok(mut m) = self.shards.lock() {
            m.0.retain(|k, _| steps.contains(&k.0));
            let kept: std::collections::HashSet<(u64, u32)> = m.0.keys().copied().collect();
            m.1.retain(|k| kept.contains(k));
        }
        // The nodes of retired steps: their inodes answer ENOENT from now
        // on (and are never handed out again), so the tables stay as large
        // as the steps that exist.
        if let Ok(mut t) = self.inodes.lock() {
            let live = |n: &Node| n.step().is_none_or(|s| steps.contains(&s));
            t.by_node.retain(|n, _| live(n));
            t.by_ino.retain(|_, n| live(n));
        }
        if let Ok(mut q) = self.sequential.lock() {
            q.retain(|n, _| n.step().is_none_or(|s| steps.contains(&s)));
        }
        *c = (Instant::now(), fresh.clone());
        fresh
    }

    /// The inode of `node`: handed out on first sight, never reused.
    pub(crate) fn ino(&self, node: Node) -> u64 {
        let mut t = self
            .inodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(&i) = t.by_node.get(&node) {
            return i;
        }
        let i = t.next;
        t.next += 1;
        t.by_node.insert(node, i);
        t.by_ino.insert(i, node);
        i
    }

    /// The node of inode `ino` (None once its step is gone).
    pub(crate) fn node(&self, ino: u64) -> Option<Node> {
        self.inodes.lock().ok()?.by_ino.get(&ino).copied()
    }

    /// The steps shown: committed in some tier.
    fn steps(&self) -> Vec<u64> {
        self.catalog().committed_steps().into_iter().collect()
    }

    fn step_exists(&self, step: u64) -> bool {
        self.catalog().committed_steps().contains(&step)
    }

    fn ranks(&self, step: u64) -> Vec<u32> {
        self.catalog().ranks(step).into_iter().collect()
    }

    /// Rank `rank`'s shard of `step` (its manifest read from the fastest
    /// tier with a good copy), kept for later reads.
    pub(crate) fn shard(&self, step: u64, rank: u32) -> Result<Arc<Shard>, Fail> {
        if let Some(s) = self
            .shards
            .lock()
            .ok()
            .and_then(|m| m.0.get(&(step, rank)).cloned())
        {
            return Ok(s);
        }
        let cat = self.catalog();
        if !cat.ranks(step).contains(&rank) {
            return Err(Fail::Gone);
        }
        let reader = self
            .tiers
            .shard_reader(&cat, step, rank, false, 0)
            .map_err(|e| Fail::Io(format!("step {step} rank {rank}: {e}")))?
            .share_cache(&self.cache);
        let m = reader.manifest();
        let file = ShardFile::new(rank, m)
            .map_err(|e| Fail::Io(format!("step {step} rank {rank}: {e}")))?;
        let names = m.entries.iter().map(|e| escape(&e.name)).collect();
        let shard = Arc::new(Shard {
            reader,
            file,
            names,
        });
        if let Ok(mut m) = self.shards.lock() {
            if m.0.insert((step, rank), shard.clone()).is_none() {
                m.1.push_back((step, rank));
            }
            while m.1.len() > SHARDS_KEPT {
                if let Some(old) = m.1.pop_front() {
                    m.0.remove(&old);
                }
            }
        }
        Ok(shard)
    }

    fn step_files(&self, step: u64) -> Result<Arc<StepFiles>, Fail> {
        if let Some(f) = self.steps.lock().ok().and_then(|m| m.get(&step).cloned()) {
            return Ok(f);
        }
        let cat = self.catalog();
        let ranks = self.ranks(step);
        let mut shards = Vec::new();
        for &r in &ranks {
            shards.push((r, self.shard(step, r)?));
        }
        let world = cat.world_size(step);
        let json = StepJson {
            job: self.job().to_string(),
            step,
            world_size: world,
            ranks: shards
                .iter()
                .map(|(r, s)| {
                    let m = s.reader.manifest();
                    let layout = places(&m.metadata);
                    RankJson {
                        rank: *r,
                        file: format!("rank-{r}.safetensors"),
                        logical_bytes: m.logical_bytes(),
                        chunks: m.chunks.len(),
                        metadata: m.metadata.clone(),
                        entries: m
                            .entries
                            .iter()
                            .zip(&s.names)
                            .map(|(e, path)| {
                                let (kind, dtype, shape) = kind_dtype_shape(&e.kind);
                                EntryJson {
                                    name: e.name.clone(),
                                    path: format!("rank-{r}/{path}"),
                                    kind,
                                    dtype,
                                    shape,
                                    bytes: e.len,
                                    global: layout.get(&e.name).cloned(),
                                }
                            })
                            .collect(),
                    }
                })
                .collect(),
        };
        let mut manifest_json =
            serde_json::to_vec_pretty(&json).map_err(|e| Fail::Io(e.to_string()))?;
        manifest_json.push(b'\n');
        let model = if shards.iter().any(|(_, s)| has_places(s.reader.manifest())) {
            let ms: Vec<(u32, &strata_format::ShardManifest)> = shards
                .iter()
                .map(|(r, s)| (*r, s.reader.manifest()))
                .collect();
            // A model that cannot be laid out leaves manifest.json alone.
            let model = ModelFile::new(&ms).unwrap_or_else(|e| {
                tracing::warn!(step, "no model.safetensors: {e}");
                None
            });
            if let Some(m) = &model {
                for (fqn, why) in &m.skipped {
                    tracing::warn!(step, fqn = %fqn, "left out of model.safetensors: {why}");
                }
            }
            model
        } else {
            None
        };
        let files = Arc::new(StepFiles {
            manifest_json,
            model,
        });
        // Kept only once every rank is there: a step committed in a tier
        // that holds some ranks (one rank's upload ahead of the others')
        // is built again at the next look, until it is whole.
        let whole = world.is_some_and(|w| shards.len() as u64 == u64::from(w));
        if whole {
            if let Ok(mut m) = self.steps.lock() {
                m.insert(step, files.clone());
            }
        }
        Ok(files)
    }

    /// Whether `step` gets a `model.safetensors`: some shard has places
    /// (the first rank's manifest is enough to tell a DCP step).
    fn has_model(&self, step: u64) -> bool {
        let Some(&first) = self.ranks(step).first() else {
            return false;
        };
        self.shard(step, first)
            .is_ok_and(|s| has_places(s.reader.manifest()))
    }

    /// The children of directory `node`, in order.
    pub(crate) fn children(&self, node: Node) -> Result<Vec<(String, Node)>, Fail> {
        match node {
            Node::Root => {
                let steps = self.steps();
                let mut out = Vec::with_capacity(steps.len() + 2);
                if !steps.is_empty() {
                    out.push(("latest".to_string(), Node::Latest));
                }
                out.push((".stats.json".to_string(), Node::Stats));
                out.extend(steps.into_iter().map(|s| (step_name(s), Node::Step(s))));
                Ok(out)
            }
            Node::Step(step) => {
                if !self.step_exists(step) {
                    return Err(Fail::Gone);
                }
                let mut out = vec![("manifest.json".to_string(), Node::Manifest(step))];
                if self.has_model(step) {
                    out.push(("model.safetensors".to_string(), Node::Model(step)));
                }
                for r in self.ranks(step) {
                    out.push((format!("rank-{r}.safetensors"), Node::RankFile(step, r)));
                    out.push((format!("rank-{r}"), Node::RankDir(step, r)));
                }
                Ok(out)
            }
            Node::RankDir(step, rank) => {
                let s = self.shard(step, rank)?;
                Ok(s.names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (n.clone(), Node::Entry(step, rank, i as u32)))
                    .collect())
            }
            _ => Err(Fail::Io("not a directory".into())),
        }
    }

    /// The child `name` of directory `parent`.
    pub(crate) fn lookup(&self, parent: Node, name: &str) -> Result<Node, Fail> {
        let found = match parent {
            Node::Root => match name {
                "latest" => self.steps().last().map(|_| Node::Latest),
                ".stats.json" => Some(Node::Stats),
                _ => parse_step(name)
                    .filter(|&s| self.step_exists(s))
                    .map(Node::Step),
            },
            Node::Step(step) => {
                if !self.step_exists(step) {
                    return Err(Fail::Gone);
                }
                match name {
                    "manifest.json" => Some(Node::Manifest(step)),
                    "model.safetensors" => self.has_model(step).then_some(Node::Model(step)),
                    _ => {
                        let rank = |s: &str| {
                            s.parse::<u32>()
                                .ok()
                                .filter(|r| self.ranks(step).contains(r))
                        };
                        if let Some(r) = name
                            .strip_prefix("rank-")
                            .and_then(|n| n.strip_suffix(".safetensors"))
                        {
                            rank(r).map(|r| Node::RankFile(step, r))
                        } else {
                            name.strip_prefix("rank-")
                                .and_then(rank)
                                .map(|r| Node::RankDir(step, r))
                        }
                    }
                }
            }
            Node::RankDir(step, rank) => {
                let s = self.shard(step, rank)?;
                s.names
                    .iter()
                    .position(|n| n == name)
                    .map(|i| Node::Entry(step, rank, i as u32))
            }
            _ => None,
        };
        found.ok_or(Fail::Gone)
    }

    /// What `node` is.
    pub(crate) fn kind(&self, node: Node) -> Result<Kind, Fail> {
        let file = |size: u64| Kind::File {
            size,
            immutable: true,
        };
        Ok(match node {
            Node::Root | Node::RankDir(..) => Kind::Dir,
            Node::Step(s) => {
                if !self.step_exists(s) {
                    return Err(Fail::Gone);
                }
                Kind::Dir
            }
            Node::Latest => Kind::Link(
                self.steps()
                    .last()
                    .map(|&s| step_name(s))
                    .ok_or(Fail::Gone)?,
            ),
            Node::Stats => Kind::File {
                size: self.stats_json().len() as u64,
                immutable: false,
            },
            Node::Manifest(s) => file(self.step_files(s)?.manifest_json.len() as u64),
            Node::Model(s) => file(
                self.step_files(s)?
                    .model
                    .as_ref()
                    .map(ModelFile::size)
                    .ok_or(Fail::Gone)?,
            ),
            Node::RankFile(s, r) => file(self.shard(s, r)?.file.size()),
            Node::Entry(s, r, i) => {
                let sh = self.shard(s, r)?;
                file(
                    sh.reader
                        .manifest()
                        .entries
                        .get(i as usize)
                        .ok_or(Fail::Gone)?
                        .len,
                )
            }
        })
    }

    /// `.stats.json`.
    pub(crate) fn stats_json(&self) -> Vec<u8> {
        self.counters.json(self.cache.held())
    }

    /// Up to `size` bytes of file `node` from `off` (fewer only at its end).
    pub(crate) fn read(&self, node: Node, off: u64, size: u32) -> Result<Vec<u8>, Fail> {
        tracing::debug!(?node, off, size, "read");
        let in_memory = |bytes: &[u8]| {
            let from = (off as usize).min(bytes.len());
            let to = from.saturating_add(size as usize).min(bytes.len());
            bytes[from..to].to_vec()
        };
        let (total, header, parts, step): (u64, Arc<[u8]>, Vec<Part>, u64) = match node {
            Node::Stats => return Ok(in_memory(&self.stats_json())),
            Node::Manifest(s) => return Ok(in_memory(&self.step_files(s)?.manifest_json)),
            Node::RankFile(s, r) => {
                let sh = self.shard(s, r)?;
                let len = clamp(off, size, sh.file.size());
                (len, sh.file.header(), sh.file.plan(off, len), s)
            }
            Node::Entry(s, r, i) => {
                let sh = self.shard(s, r)?;
                let e = sh
                    .reader
                    .manifest()
                    .entries
                    .get(i as usize)
                    .ok_or(Fail::Gone)?;
                let len = clamp(off, size, e.len);
                let part = Part::Entry {
                    rank: r,
                    entry: e.name.clone(),
                    at: off,
                    dst: 0,
                    len: len as usize,
                };
                (
                    len,
                    Arc::from(Vec::new()),
                    if len > 0 { vec![part] } else { Vec::new() },
                    s,
                )
            }
            Node::Model(s) => {
                let files = self.step_files(s)?;
                let m = files.model.as_ref().ok_or(Fail::Gone)?;
                let len = clamp(off, size, m.size());
                (len, m.header(), m.plan(off, len), s)
            }
            _ => return Err(Fail::Io("not a file".into())),
        };
        let mut buf = vec![0u8; total as usize];
        let mut filled = 0usize;
        let last_entry = match node {
            Node::RankFile(..) | Node::Entry(..) => parts
                .iter()
                .rev()
                .find(|p| matches!(p, Part::Entry { .. }))
                .cloned(),
            _ => None,
        };
        // Readahead first: what follows this read is fetched beside it, not
        // after it (the first read of a tensor from L3 asks for its first
        // chunk while the next ones are already on their way). A chunk
        // both ask for is read once (the reader's chunks in flight).
        if let Some(Part::Entry {
            rank,
            entry,
            at,
            len,
            ..
        }) = last_entry
        {
            self.read_ahead(node, step, rank, &entry, off, total, at + len as u64);
        }
        for p in parts {
            match p {
                Part::Header { dst, from, len } => {
                    let src = header
                        .get(from..from + len)
                        .ok_or_else(|| Fail::Io("header range".into()))?;
                    buf[dst..dst + len].copy_from_slice(src);
                    filled += len;
                }
                Part::Entry {
                    rank,
                    entry,
                    at,
                    dst,
                    len,
                } => {
                    let sh = self.shard(step, rank)?;
                    let to = buf
                        .get_mut(dst..dst + len)
                        .ok_or_else(|| Fail::Io("plan outside the read".into()))?;
                    let st = self
                        .tiers
                        .block_on(sh.reader.read_range_into(&entry, at, to))
                        .map_err(|e| {
                            self.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                            Fail::Io(format!("step {step} rank {rank} {entry:?}: {e}"))
                        })?;
                    self.count(&st);
                    filled += len;
                }
            }
        }
        // Every byte comes from somewhere: a plan that leaves a gap is a
        // bug, never zeros handed to a reader.
        if filled != buf.len() {
            return Err(Fail::Io(format!("{filled} of {} bytes planned", buf.len())));
        }
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes.fetch_add(total, Ordering::Relaxed);
        Ok(buf)
    }

    fn count(&self, st: &RangeStats) {
        self.counters.add(st);
    }
}

/// Bytes of a read of `size` at `off` in a file of `total`.
fn clamp(off: u64, size: u32, total: u64) -> u64 {
    total.saturating_sub(off).min(u64::from(size))
}

fn list(tiers: &Tiers) -> Catalog {
    let all: Vec<_> = tiers.tiers().iter().collect();
    tiers.catalog(&all)
}

/// A step's directory name (`step-000120`; wider steps keep every digit).
pub(crate) fn step_name(step: u64) -> String {
    format!("step-{step:06}")
}

fn parse_step(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    let step: u64 = digits.parse().ok()?;
    (step_name(step) == name).then_some(step)
}

#[derive(Serialize)]
struct StepJson {
    job: String,
    step: u64,
    world_size: Option<u32>,
    ranks: Vec<RankJson>,
}

#[derive(Serialize)]
struct RankJson {
    rank: u32,
    file: String,
    logical_bytes: u64,
    chunks: usize,
    metadata: BTreeMap<String, String>,
    entries: Vec<EntryJson>,
}

#[derive(Serialize)]
struct EntryJson {
    name: String,
    /// The entry's file, relative to the step's directory.
    path: String,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    dtype: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shape: Option<Vec<u64>>,
    bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    global: Option<Place>,
}
