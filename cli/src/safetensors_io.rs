//! `strata export` and `strata import`: a step's shard to a safetensors
//! file and back. Blobs (opaque entries) travel as 1-D `U8` tensors whose
//! names are listed in the `strata.blobs` metadata key, so import restores
//! them as blobs and the round trip is exact.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;
use strata::tiered::ChunkData;
use strata::tiers::Tier;
use strata::{Checkpointer, Entry};
use strata_format::safetensors::{decode_header, encode_header, prefix_len, MAX_HEADER_LEN};
use strata_format::{DType, EntryKind, ShardManifest};

use crate::catalog::read_with_fallback;
use crate::out::say;
use crate::progress::Progress;
use crate::size::human;
use crate::store_args::{select, StoreArgs};
use crate::CliError;

/// Metadata key listing the entries exported from blobs (a JSON array).
pub(crate) const BLOBS_KEY: &str = "strata.blobs";

/// Bytes of chunks read per batch while exporting (at most twice this is
/// held at once: chunks kept for a later use, plus the batch).
const BATCH_BYTES: u64 = 128 << 20;

/// `strata export`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  strata export 1200 -o model.safetensors --l1 /nvme/strata --job llama-70b\n  strata export 1200 --rank 3 --tier l3 -o rank3.safetensors --config strata.toml"
)]
pub(crate) struct ExportArgs {
    /// The step.
    pub(crate) step: u64,
    /// The rank.
    #[arg(long, default_value_t = 0)]
    pub(crate) rank: u32,
    /// The file to write (replaced atomically).
    #[arg(short, long, value_name = "FILE.safetensors")]
    pub(crate) output: PathBuf,
    /// Read from this tier first (l1, l3, l2, or a peer's name); chunks it
    /// lacks or holds damaged come from the others.
    #[arg(long)]
    pub(crate) tier: Vec<String>,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Print a JSON summary (schema in docs/cli.md).
    #[arg(long)]
    pub(crate) json: bool,
}

/// `strata import`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  strata import model.safetensors --step 0 --l1 /nvme/strata --job finetune\n  strata import model.safetensors --step 0 --config strata.toml --json"
)]
pub(crate) struct ImportArgs {
    /// The safetensors file.
    pub(crate) file: PathBuf,
    /// The step to create.
    #[arg(long)]
    pub(crate) step: u64,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Print a JSON summary (schema in docs/cli.md).
    #[arg(long)]
    pub(crate) json: bool,
}

/// What export or import did.
#[derive(Serialize, Debug)]
pub(crate) struct Moved {
    pub(crate) job: String,
    pub(crate) step: u64,
    pub(crate) rank: u32,
    pub(crate) file: String,
    pub(crate) tensors: usize,
    pub(crate) blobs: usize,
    /// Tensor bytes.
    pub(crate) bytes: u64,
    /// File size.
    pub(crate) file_bytes: u64,
    /// Export: where the chunks came from (tier -> bytes).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) sources: BTreeMap<String, u64>,
    /// Import: bytes written to L1 (new chunks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bytes_written: Option<u64>,
    pub(crate) seconds: f64,
}

impl Moved {
    /// " and N blobs", or nothing.
    fn and_blobs(&self) -> String {
        if self.blobs > 0 {
            format!(" and {} blobs", self.blobs)
        } else {
            String::new()
        }
    }
}

pub(crate) fn export(a: &ExportArgs) -> Result<(), CliError> {
    let started = std::time::Instant::now();
    let t = a.store.open()?;
    let first = select(&t, &a.tier)?;
    let mut order: Vec<&Tier> = first.clone();
    for x in t.tiers() {
        if !order.iter().any(|o| o.name == x.name) {
            order.push(x);
        }
    }
    let cat = crate::catalog::load(&t, order.clone());
    crate::catalog::pick(&cat, Some(a.step))?;
    let (_, shard, _) = crate::catalog::shard(&cat, &t, a.step, a.rank)?;
    let m = &shard.manifest;
    let (prefix, _) = shard_file(m)?;
    let blobs = m
        .entries
        .iter()
        .filter(|e| matches!(e.kind, EntryKind::Blob))
        .count();

    let tmp = temp_path(&a.output);
    let result = (|| -> Result<BTreeMap<String, u64>, CliError> {
        let file = std::fs::File::create(&tmp)
            .map_err(|e| CliError::Store(format!("creating {}: {e}", tmp.display())))?;
        let mut w = std::io::BufWriter::with_capacity(8 << 20, file);
        let io = |e: std::io::Error| CliError::Store(format!("writing {}: {e}", tmp.display()));
        w.write_all(&prefix).map_err(io)?;
        // Every piece of the data section in file order, and the order in
        // which chunks are first needed.
        let pieces: Vec<(u32, u32, u32)> = m
            .entries
            .iter()
            .flat_map(|e| e.segments.iter().map(|s| (s.chunk, s.offset, s.len)))
            .collect();
        let mut first_use: Vec<u32> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for p in &pieces {
            if seen.insert(p.0) {
                first_use.push(p.0);
            }
        }
        let position: HashMap<u32, usize> =
            first_use.iter().enumerate().map(|(i, c)| (*c, i)).collect();
        let progress = Progress::bytes(m.logical_bytes(), "exporting", a.json);
        let users = crate::catalog::entries_by_chunk(m);
        let mut loaded: HashMap<u32, ChunkData> = HashMap::new();
        let mut sources: BTreeMap<String, u64> = BTreeMap::new();
        // The last piece that needs each chunk: a chunk used again later
        // (identical tensors, zeros) stays loaded instead of being read
        // again with every batch.
        let mut last_use: HashMap<u32, usize> = HashMap::new();
        for (i, p) in pieces.iter().enumerate() {
            last_use.insert(p.0, i);
        }
        let len_of = |c: u32| u64::from(m.chunks[c as usize].len);
        for (i, (chunk, offset, len)) in pieces.into_iter().enumerate() {
            if !loaded.contains_key(&chunk) {
                loaded.retain(|c, _| last_use.get(c).is_some_and(|&l| l >= i));
                let mut held: u64 = loaded.keys().map(|&c| len_of(c)).sum();
                if held > BATCH_BYTES {
                    // Memory stays bounded: drop what is kept for later.
                    loaded.clear();
                    held = 0;
                }
                let from = position.get(&chunk).copied().unwrap_or(0);
                let mut batch = Vec::new();
                let mut bytes = held;
                for &c in &first_use[from..] {
                    if loaded.contains_key(&c) || last_use.get(&c).is_some_and(|&l| l < i) {
                        continue;
                    }
                    let l = len_of(c);
                    if !batch.is_empty() && bytes + l > 2 * BATCH_BYTES {
                        break;
                    }
                    batch.push(c);
                    bytes += l;
                }
                let refs: Vec<_> = batch.iter().map(|&c| m.chunks[c as usize]).collect();
                for (c, r) in batch.iter().zip(read_with_fallback(&t, &order, &refs)) {
                    match r {
                        Ok((d, tier)) => {
                            *sources.entry(tier).or_default() += d.len() as u64;
                            loaded.insert(*c, d);
                        }
                        Err(e) => {
                            let names = users.get(c).map(|v| v.join(", ")).unwrap_or_default();
                            return Err(CliError::Store(format!(
                                "chunk {} ({names}) has no good copy in any tier: {e}",
                                m.chunks[*c as usize].id
                            )));
                        }
                    }
                }
            }
            let data = loaded
                .get(&chunk)
                .ok_or_else(|| CliError::Store(format!("chunk index {chunk} not loaded")))?;
            let bytes = data
                .as_slice()
                .get(offset as usize..offset as usize + len as usize)
                .ok_or_else(|| {
                    CliError::Store(format!("a segment lies outside chunk index {chunk}"))
                })?;
            w.write_all(bytes).map_err(io)?;
            progress.inc(u64::from(len));
        }
        progress.finish();
        let file = w
            .into_inner()
            .map_err(|e| CliError::Store(format!("writing {}: {e}", tmp.display())))?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &a.output)
            .map_err(|e| CliError::Store(format!("renaming to {}: {e}", a.output.display())))?;
        Ok(sources)
    })();
    let sources = match result {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let moved = Moved {
        job: t.job().to_string(),
        step: a.step,
        rank: a.rank,
        file: a.output.display().to_string(),
        tensors: m.entries.len() - blobs,
        blobs,
        bytes: m.logical_bytes(),
        file_bytes: prefix.len() as u64 + m.logical_bytes(),
        sources,
        bytes_written: None,
        seconds: started.elapsed().as_secs_f64(),
    };
    if a.json {
        return crate::print_json(&moved);
    }
    let from: Vec<String> = moved
        .sources
        .iter()
        .map(|(k, v)| format!("{} from {k}", human(*v)))
        .collect();
    say!(
        "exported job {} step {} rank {}: {} tensors{} ({}) to {} in {:.2} s ({})",
        moved.job,
        moved.step,
        moved.rank,
        moved.tensors,
        moved.and_blobs(),
        human(moved.bytes),
        moved.file,
        moved.seconds,
        from.join(", ")
    );
    Ok(())
}

/// The safetensors file of a shard: its prefix (length and JSON header:
/// every entry in manifest order, blobs as `U8` tensors named in the
/// `__metadata__` key `strata.blobs`, the shard's metadata beside it) and
/// each entry's `(begin, end)` in the data section. What `strata export`
/// writes and what `strata mount` serves as `rank-N.safetensors`.
pub(crate) fn shard_file(
    m: &ShardManifest,
) -> Result<strata_format::safetensors::EncodedHeader, CliError> {
    let mut metadata = m.metadata.clone();
    let blobs: Vec<&str> = m
        .entries
        .iter()
        .filter(|e| matches!(e.kind, EntryKind::Blob))
        .map(|e| e.name.as_str())
        .collect();
    if !blobs.is_empty() {
        let list = serde_json::to_string(&blobs).map_err(|e| CliError::Arg(e.to_string()))?;
        metadata.insert(BLOBS_KEY.into(), list);
    }
    let shapes: Vec<(DType, Vec<u64>)> = m
        .entries
        .iter()
        .map(|e| match &e.kind {
            EntryKind::Tensor { dtype, shape } => (*dtype, shape.clone()),
            EntryKind::Blob => (DType::U8, vec![e.len]),
        })
        .collect();
    let tensors: Vec<(&str, DType, &[u64])> = m
        .entries
        .iter()
        .zip(&shapes)
        .map(|(e, (d, s))| (e.name.as_str(), *d, s.as_slice()))
        .collect();
    Ok(encode_header(&tensors, &metadata)?)
}

fn temp_path(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map_or_else(|| "export".into(), |n| n.to_string_lossy().into_owned());
    out.with_file_name(format!(".{name}.strata-tmp-{}", std::process::id()))
}

/// A read-only memory map of a whole file.
struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapped {
    fn open(file: &std::fs::File, len: usize) -> std::io::Result<Self> {
        if len == 0 {
            return Ok(Mapped {
                ptr: std::ptr::null_mut(),
                len: 0,
            });
        }
        // SAFETY: a fresh private read-only mapping of an open file; the
        // kernel picks the address; the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(file),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapped { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` maps `len` readable bytes for the life of `self`.
        // A file truncated by another process meanwhile would fault (as
        // with any mapped reader); the import documents it reads a file
        // nobody is rewriting.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly the mapping made in `open`.
            unsafe {
                libc::munmap(self.ptr, self.len);
            }
        }
    }
}

pub(crate) fn import(a: &ImportArgs) -> Result<(), CliError> {
    let started = std::time::Instant::now();
    let path = &a.file;
    let bad = |e: String| CliError::Store(format!("{}: {e}", path.display()));
    let mut file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let file_len = file.metadata().map_err(|e| bad(e.to_string()))?.len();
    let mut first8 = [0u8; 8];
    file.read_exact(&mut first8)
        .map_err(|e| bad(format!("not a safetensors file ({e})")))?;
    let need = prefix_len(&first8).map_err(|e| bad(e.to_string()))?;
    if need > file_len || need > MAX_HEADER_LEN + 8 {
        return Err(bad(format!(
            "not a safetensors file (header of {need} bytes in a {file_len}-byte file)"
        )));
    }
    let len = usize::try_from(file_len).map_err(|_| bad("too large to map".into()))?;
    let map = Mapped::open(&file, len).map_err(|e| bad(format!("mapping: {e}")))?;
    let bytes = map.bytes();
    let header =
        decode_header(&bytes[..need as usize], file_len).map_err(|e| bad(e.to_string()))?;
    let mut metadata = header.metadata.clone();
    let blobs: Vec<String> = match metadata.remove(BLOBS_KEY) {
        Some(v) => {
            serde_json::from_str(&v).map_err(|e| bad(format!("metadata {BLOBS_KEY}: {e}")))?
        }
        None => Vec::new(),
    };
    // Each name listed as a blob must be one of the file's tensors, once.
    let mut listed = std::collections::BTreeSet::new();
    for n in &blobs {
        if !listed.insert(n.as_str()) {
            return Err(bad(format!("metadata {BLOBS_KEY} names {n:?} twice")));
        }
        if !header.tensors.iter().any(|t| &t.name == n) {
            return Err(bad(format!(
                "metadata {BLOBS_KEY} names {n:?}, which is not in the file"
            )));
        }
    }
    let data = &bytes[header.data_start as usize..];
    let mut entries = Vec::with_capacity(header.tensors.len());
    for ti in &header.tensors {
        let b = data
            .get(ti.begin as usize..ti.end as usize)
            .ok_or_else(|| bad(format!("tensor {} lies outside the file", ti.name)))?;
        if blobs.iter().any(|n| n == &ti.name) {
            entries.push(Entry::blob(&ti.name, b));
        } else {
            entries.push(Entry::tensor(&ti.name, ti.dtype, &ti.shape, b));
        }
    }
    let mut cfg = a.store.config()?;
    cfg.rank = 0;
    cfg.world_size = 1;
    // An import adds a step; it never replaces one or prunes older ones.
    cfg.keep_last = usize::MAX;
    let job = cfg.job.clone();
    {
        let t = strata::tiers::Tiers::open(cfg.clone(), false)?;
        for tier in t.tiers() {
            let steps = t.steps(tier)?;
            if steps.iter().any(|i| i.step == a.step) {
                return Err(CliError::Arg(format!(
                    "job {job} already has step {} in {}: import into a new step",
                    a.step, tier.name
                )));
            }
        }
    }
    let spinner = crate::progress::Spinner::start(
        &format!("importing {} as step {}", path.display(), a.step),
        a.json,
    );
    let ck = Checkpointer::new(cfg)?;
    let handle = ck.save_with_metadata(a.step, &entries, metadata)?;
    let stats = handle.wait()?;
    // Every tier the command names gets the step: the peers by
    // replication, L3 by an upload asked for here when the upload policy
    // (`upload_every`) did not pick the step already.
    if !ck.config().peers.is_empty() {
        spinner.set("replicating to the peers");
        handle.wait_for(strata::Target::Peers, None)?;
    }
    if ck.l3().is_some() {
        spinner.set("uploading to L3");
        if !ck.uploads().contains_key(&a.step) {
            ck.upload(a.step)?;
        }
        handle.wait_for(strata::Target::L3, None)?;
    }
    drop(ck);
    drop(spinner);
    let moved = Moved {
        job,
        step: a.step,
        rank: 0,
        file: path.display().to_string(),
        tensors: entries.len().saturating_sub(blobs.len()),
        blobs: blobs.len(),
        bytes: entries.iter().map(|e| e.len()).sum(),
        file_bytes: file_len,
        sources: BTreeMap::new(),
        bytes_written: Some(stats.bytes_written),
        seconds: started.elapsed().as_secs_f64(),
    };
    if a.json {
        return crate::print_json(&moved);
    }
    say!(
        "imported {} tensors{} ({}) from {} as job {} step {} in {:.2} s ({} new on L1)",
        moved.tensors,
        moved.and_blobs(),
        human(moved.bytes),
        moved.file,
        moved.job,
        moved.step,
        moved.seconds,
        human(stats.bytes_written)
    );
    Ok(())
}
