//! What survives a restart of the service: the spill directory's layout,
//! keeping what is in memory on a graceful stop, and reloading (and
//! verifying) everything at start.
//!
//! ```text
//! <spill>/FORMAT                              "strata-peer-spill 1"
//! <spill>/chunks/<job>/<64 hex>.<seq>         a chunk's frame, as the client sent it
//! <spill>/chunks/<job>/.tmp-<seq>             a frame being written
//! <spill>/steps/...                           manifests, commit records, pins (L1's layout)
//! ```
//!
//! Manifests, records and pins are written through to disk as they come
//! (an [`L1Store`] under `steps/`, so their semantics are L1's, already
//! held to the conformance suite). Chunk frames are kept in memory up to
//! the memory budget and spilled beyond it; a graceful stop
//! ([`Replicas::keep_memory_on_disk`]) writes the ones in memory to the
//! spill too. At start every spilled frame is read and verified against
//! its name (a damaged one is deleted and counted), then every manifest is
//! checked against the chunks held: a shard whose manifest is unreadable or
//! names a chunk not held (the service was killed before it could keep
//! its memory) is retired, so the service never lists a step it cannot
//! serve whole.
//!
//! A spill directory without the `FORMAT` marker (a service older than
//! this layout, which cleared it at start anyway) is cleared; one marked
//! with a layout this version does not know is refused. `LOCK` keeps a
//! second service off a directory in use.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use strata_format::manifest::ShardManifest;
use strata_format::names::validate_job_id;
use strata_format::ChunkId;
use strata_tiered::{ChunkStore, EngineChoice, L1Store, Result, StoreError, StoreErrorKind};

use super::ledger::Kind;
use super::{poisoned, verify_frame, Place, Replicas, Slot};

/// The marker of this layout.
const FORMAT: &str = "strata-peer-spill 1\n";

/// What a start found in the spill directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Chunks reloaded, verified.
    pub chunks: u64,
    /// Their stored bytes.
    pub bytes: u64,
    /// Spilled frames that did not match their name (or could not be
    /// read), deleted.
    pub damaged: u64,
    /// Shards retired because their manifest was unreadable or named a
    /// chunk not held.
    pub shards_dropped: u64,
    /// Steps listed after the check, all jobs.
    pub steps: u64,
    /// Jobs with steps or chunks.
    pub jobs: u64,
}

/// Where the chunk frames are.
pub(super) fn chunk_root(spill: &Path) -> PathBuf {
    spill.join("chunks")
}

/// Readies `spill` for this layout and locks it for this process
/// (`<spill>/LOCK`, held as long as the returned file is open: a second
/// service on the same directory is refused before it reads or deletes
/// anything). A directory without the marker (empty, or a service older
/// than this layout's, which cleared it at start anyway) is cleared and
/// marked; one with a marker this version does not know, or that cannot
/// be read, is refused, never cleared. Returns the lock and the store of
/// the steps.
pub(super) fn open_layout(spill: &Path) -> Result<(std::fs::File, L1Store)> {
    std::fs::create_dir_all(spill)
        .map_err(|e| StoreError::io("creating the spill directory", spill, e))?;
    let lock_path = spill.join("LOCK");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| StoreError::io("opening the lock of", &lock_path, e))?;
    // SAFETY: flock on a descriptor this function owns (open until `lock`
    // is dropped); it reads its two integer arguments only.
    let rc = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&lock),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(StoreError::invalid(
                "spill directory",
                format!(
                    "{} is in use by another peer service (each service needs a spill directory of its own)",
                    spill.display()
                ),
            ));
        }
        return Err(StoreError::io("locking", &lock_path, e));
    }
    let marker = spill.join("FORMAT");
    match std::fs::read(&marker) {
        Ok(b) if b == FORMAT.as_bytes() => {}
        Ok(b) => {
            return Err(StoreError::invalid(
                "spill directory",
                format!(
                    "{} is marked {:?}, a layout this version does not know: move it away, or start an older version",
                    spill.display(),
                    String::from_utf8_lossy(&b[..b.len().min(64)])
                ),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut cleared = 0;
            for entry in read_dir(spill)? {
                if entry.file_name() != "LOCK" {
                    remove_any(&entry.path());
                    cleared += 1;
                }
            }
            if cleared > 0 {
                tracing::warn!(
                    spill = %spill.display(),
                    "the spill directory was not in this version's layout: cleared"
                );
            }
            // Durably, so a crash never leaves an empty marker behind.
            let tmp = spill.join(".FORMAT.tmp");
            let write = || -> std::io::Result<()> {
                use std::io::Write;
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(FORMAT.as_bytes())?;
                f.sync_all()?;
                std::fs::rename(&tmp, &marker)?;
                std::fs::File::open(spill)?.sync_all()
            };
            write().map_err(|e| StoreError::io("marking the spill directory", &marker, e))?;
        }
        Err(e) => return Err(StoreError::io("reading", &marker, e)),
    }
    std::fs::create_dir_all(chunk_root(spill))
        .map_err(|e| StoreError::io("creating the spill directory", spill, e))?;
    let steps = L1Store::open(spill.join("steps"), EngineChoice::Psync)?;
    Ok((lock, steps))
}

/// A spilled frame found at start.
struct Found {
    job: String,
    id: ChunkId,
    seq: u64,
    path: PathBuf,
}

impl Replicas {
    /// Reloads what the spill directory holds (see the module's doc):
    /// chunks verified in parallel, then every manifest checked against
    /// them, then the manifest ledger rebuilt. Runs on a runtime of its own
    /// on a thread of its own, so that [`Replicas::new`] stays callable
    /// from synchronous code and from inside a runtime alike.
    pub(super) fn reload(&self) -> Result<Reloaded> {
        let mut report = Reloaded::default();
        self.reload_chunks(&mut report)?;
        std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .map_err(|e| StoreError::Internal(format!("reload runtime: {e}")))?;
                rt.block_on(self.reload_steps(&mut report))
            })
            .join()
            .map_err(|_| StoreError::Internal("reload thread panicked".into()))?
        })?;
        if report.chunks + report.steps + report.damaged + report.shards_dropped > 0 {
            tracing::info!(
                chunks = report.chunks,
                bytes = report.bytes,
                steps = report.steps,
                jobs = report.jobs,
                damaged = report.damaged,
                shards_dropped = report.shards_dropped,
                "replicas reloaded from the spill directory"
            );
        }
        if report.damaged + report.shards_dropped > 0 {
            tracing::warn!(
                damaged = report.damaged,
                shards_dropped = report.shards_dropped,
                "damaged or incomplete replicas dropped at start"
            );
        }
        Ok(report)
    }

    /// Every spilled frame, verified against its name; the damaged ones
    /// and leftovers deleted.
    fn reload_chunks(&self, report: &mut Reloaded) -> Result<()> {
        let root = chunk_root(&self.spill);
        let mut found = Vec::new();
        for job in read_dir(&root)? {
            let name = job.file_name().to_string_lossy().into_owned();
            if validate_job_id(&name).is_err() || !job.path().is_dir() {
                remove_any(&job.path());
                continue;
            }
            for f in read_dir(&job.path())? {
                let path = f.path();
                match parse_spill_name(&f.file_name().to_string_lossy()) {
                    Some((id, seq)) => found.push(Found {
                        job: name.clone(),
                        id,
                        seq,
                        path,
                    }),
                    None => remove_any(&path), // a frame being written, or a stranger
                }
            }
        }
        // Verifying is hashing every byte held: on every core.
        // At most 8: each holds one frame (up to the format's largest).
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
        // Against the format's largest chunk, not this start's --max-chunk:
        // a frame admitted under a larger limit before is not damage.
        let max_chunk = strata_format::frame::MAX_CHUNK_LEN;
        let per = found.len().div_ceil(threads).max(1);
        let verdicts: Vec<Option<(u64, u32)>> = std::thread::scope(|s| {
            let handles: Vec<_> = found
                .chunks(per)
                .map(|part| s.spawn(move || part.iter().map(|f| check(f, max_chunk)).collect()))
                .collect();
            let mut all = Vec::with_capacity(found.len());
            for h in handles {
                let part: Vec<Option<(u64, u32)>> = h
                    .join()
                    .map_err(|_| StoreError::Internal("a verifying thread panicked".into()))?;
                all.extend(part);
            }
            Ok::<_, StoreError>(all)
        })?;
        let checked = found.into_iter().zip(verdicts);
        let now = Instant::now();
        let mut c = self.chunks.lock().map_err(|_| poisoned())?;
        let mut next_seq = 0;
        for (f, ok) in checked {
            next_seq = next_seq.max(f.seq.saturating_add(1));
            let Some((len, raw_len)) = ok else {
                report.damaged += 1;
                tracing::warn!(job = %f.job, chunk = %f.id, "a damaged spilled replica deleted");
                remove_any(&f.path);
                continue;
            };
            let key = (f.job.clone(), f.id);
            if c.map.contains_key(&key) {
                remove_any(&f.path); // a second copy of one chunk
                continue;
            }
            c.add(&f.job, len, false, 1);
            c.map.insert(
                key,
                Slot {
                    place: Place::Disk { len, seq: f.seq },
                    raw_len,
                    touched: now,
                },
            );
            report.chunks += 1;
            report.bytes += len;
        }
        self.tmp_seq.store(next_seq, Ordering::Relaxed);
        Ok(())
    }

    /// Every job's steps: shards that cannot be served whole retired, the
    /// ledger charged for what stays.
    async fn reload_steps(&self, report: &mut Reloaded) -> Result<()> {
        let mut jobs: Vec<String> = read_dir(self.steps.root())?
            .into_iter()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|j| validate_job_id(j).is_ok())
            .collect();
        {
            let c = self.chunks.lock().map_err(|_| poisoned())?;
            jobs.extend(c.jobs.keys().cloned());
        }
        jobs.sort();
        jobs.dedup();
        report.jobs = jobs.len() as u64;
        for job in &jobs {
            for st in self.steps.list_steps(job).await? {
                let mut dropped = std::collections::BTreeSet::new();
                for &rank in &st.manifests {
                    match self.steps.get_manifest(job, st.step, rank).await {
                        Ok(bytes) if self.serves_whole(job, &bytes)? => {
                            self.charge_unbounded(job, (st.step, Kind::Manifest, rank), &bytes)?;
                        }
                        Err(e) if e.kind() == StoreErrorKind::NotFound => {}
                        _ => {
                            tracing::warn!(
                                job,
                                step = st.step,
                                rank,
                                "a shard whose chunks are not all held (or whose manifest is unreadable) retired"
                            );
                            self.steps.delete_shard(job, st.step, rank).await?;
                            dropped.insert(rank);
                            report.shards_dropped += 1;
                        }
                    }
                }
                // A retired shard took its record (named by its rank).
                let records: Vec<_> = st
                    .records
                    .iter()
                    .filter(|(first, _)| !dropped.contains(first))
                    .collect();
                for (first, rec) in &records {
                    let bytes = rec
                        .encode()
                        .map_err(|e| StoreError::invalid("commit record", e.to_string()))?;
                    self.charge_unbounded(job, (st.step, Kind::Record, **first), &bytes)?;
                }
                if !records.is_empty() || st.manifests.len() > dropped.len() {
                    report.steps += 1;
                }
            }
        }
        // This start's retention (its limits may differ from the last
        // run's): applied now, not at each job's next commit, which a
        // finished job never sends.
        for job in &jobs {
            self.retain(job).await;
        }
        Ok(())
    }

    /// Whether `manifest` decodes and every chunk it names is held.
    fn serves_whole(&self, job: &str, manifest: &[u8]) -> Result<bool> {
        let Ok(m) = ShardManifest::decode(manifest) else {
            return Ok(false);
        };
        let c = self.chunks.lock().map_err(|_| poisoned())?;
        let job = job.to_string();
        Ok(m.chunks
            .iter()
            .all(|r| c.map.contains_key(&(job.clone(), r.id))))
    }

    /// Charges what was held before the restart: it was admitted then, so
    /// it stays even if the budgets have since shrunk (new writes are
    /// refused until retention frees room).
    fn charge_unbounded(&self, job: &str, key: (u64, Kind, u32), bytes: &[u8]) -> Result<()> {
        self.manifests
            .lock()
            .map_err(|_| poisoned())?
            .charge(
                job,
                key,
                bytes.len() as u64,
                u64::MAX,
                u64::MAX,
                &self.spill,
            )
            .map(|_| ())
    }

    /// Writes the chunks held in memory to the spill directory, so that
    /// the next start of the service finds them (a graceful stop calls
    /// this once no request is in flight), as far as the spill's room
    /// allows: `--memory` plus `--disk` in all (what the operations guide
    /// sizes the directory for; a start reloads what was kept, above the
    /// disk budget, and new writes go to memory), so restarts never grow
    /// it past that. The most recently put or checked first (the newest
    /// step's chunks, which a restore wants), each charged before it is
    /// written; the first that does not fit ends it.
    /// Returns (chunks kept, chunks not kept: over the budget, or not
    /// written; those are lost with the process, and the next start
    /// retires the shards that named them).
    pub fn keep_memory_on_disk(&self) -> Result<(u64, u64)> {
        let mut in_memory: Vec<(String, ChunkId, bytes::Bytes, Instant)> = {
            let c = self.chunks.lock().map_err(|_| poisoned())?;
            c.map
                .iter()
                .filter_map(|((job, id), s)| match &s.place {
                    Place::Memory(b) => Some((job.clone(), *id, b.clone(), s.touched)),
                    Place::Disk { .. } => None,
                })
                .collect()
        };
        in_memory.sort_by_key(|c| std::cmp::Reverse(c.3));
        let room = self
            .limits
            .memory_bytes
            .saturating_add(self.limits.disk_bytes);
        let (mut kept, mut lost, mut over) = (0, 0, 0u64);
        let total = in_memory.len() as u64;
        for (n, (job, id, frame, _)) in (0u64..).zip(in_memory) {
            let len = frame.len() as u64;
            {
                let mut c = self.chunks.lock().map_err(|_| poisoned())?;
                if c.all.disk.saturating_add(len) > room {
                    // This one and every older one: a smaller, older chunk
                    // kept past the first that did not fit would mostly
                    // belong to a shard the next start retires anyway.
                    over = total - n;
                    lost += over;
                    break;
                }
                // Reserved before the write: nothing else can take it.
                c.add(&job, len, false, 0);
            }
            let written = self.write_spill(&job, &id, &frame);
            let mut c = self.chunks.lock().map_err(|_| poisoned())?;
            match written {
                Ok(seq) => match c.map.get_mut(&(job.clone(), id)) {
                    Some(slot) if matches!(slot.place, Place::Memory(_)) => {
                        slot.place = Place::Disk { len, seq };
                        c.release(&job, len, true, 0);
                        kept += 1;
                    }
                    _ => {
                        // Deleted meanwhile: its file goes too.
                        c.release(&job, len, false, 0);
                        drop(c);
                        remove_any(&self.file(&job, &id, seq));
                    }
                },
                Err(e) => {
                    c.release(&job, len, false, 0);
                    tracing::warn!(job, chunk = %id, error = %e, "a replica in memory could not be kept on disk");
                    lost += 1;
                }
            }
        }
        if over > 0 {
            tracing::warn!(
                chunks = over,
                room = room,
                "replicas in memory not kept on disk: the spill holds --memory plus --disk already; the next start retires the shards that named them"
            );
        }
        Ok((kept, lost))
    }
}

/// Reads and verifies one spilled frame: (stored length, raw length), or
/// None if it is damaged.
fn check(f: &Found, max_chunk: u32) -> Option<(u64, u32)> {
    use std::io::Read;
    // A frame is at most the largest chunk plus its header: a longer file
    // is not one, and is not read whole.
    let bound = u64::from(max_chunk) + 4096;
    let file = std::fs::File::open(&f.path).ok()?;
    let mut bytes = Vec::new();
    file.take(bound + 1).read_to_end(&mut bytes).ok()?;
    if bytes.len() as u64 > bound {
        return None;
    }
    let raw = verify_frame(&f.id, &bytes, max_chunk).ok()?;
    Some((bytes.len() as u64, raw))
}

/// `<64 hex>.<seq>` → (id, seq).
fn parse_spill_name(name: &str) -> Option<(ChunkId, u64)> {
    let (hex, seq) = name.split_once('.')?;
    Some((ChunkId::from_hex(hex).ok()?, seq.parse().ok()?))
}

fn read_dir(dir: &Path) -> Result<Vec<std::fs::DirEntry>> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| StoreError::io("listing", dir, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(StoreError::io("listing", dir, e)),
    }
}

/// Removes a file or a directory tree, whichever it is (best effort: what
/// cannot be removed is left, and never loaded).
fn remove_any(path: &Path) {
    let gone = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    if let Err(e) = gone {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "could not remove from the spill directory");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
