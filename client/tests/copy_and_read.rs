//! The two primitives every pipeline shares: `copy_step` (a committed
//! shard copied between tiers: only missing chunks, then the manifest,
//! then the record; idempotent; nothing committed when a chunk is bad) and
//! the `TieredReader` (per-chunk fallback, repair of the bad copy, the
//! write-back, the first tier's error when no tier has a good copy).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use strata::format::codec::ElemHint;
use strata::format::manifest::ChunkRef;
use strata::format::{ChunkId, DType};
use strata::tiered::wrap::{FaultPlan, FaultStore};
use strata::tiered::{ChunkData, ChunkPut, ChunkStore, MemoryStore, StoreErrorKind};
use strata::tiers::copy::{copy_step, CopyOptions, CopyProgress, Pause, Verify};
use strata::tiers::{ReadTier, TieredReader};
use strata::{Checkpointer, Config, Entry, ErrorKind, StepSelector, TierStack};
use strata_tiered::ChunkStoreExt;

const KIB: usize = 1 << 10;

fn cfg(dir: &std::path::Path) -> Config {
    Config::builder()
        .job("c")
        .l1_dir(dir)
        .chunk_size(64 * KIB as u32)
        .io_engine("psync")
}

fn tensor(seed: u8) -> Vec<u8> {
    (0..256 * KIB)
        .map(|j| (j as u8).wrapping_mul(13) ^ seed ^ (j >> 10) as u8)
        .collect()
}

/// The L1 store at `dir`, holding step 7 saved there with `data` as its
/// tensor `w` (read back with the psync engine).
fn l1_with_step_7(dir: &std::path::Path, data: &[u8]) -> Arc<dyn ChunkStore> {
    use strata::tiered::{EngineChoice, L1Store};
    {
        let ck = Checkpointer::new(cfg(dir)).unwrap();
        let shape = [data.len() as u64];
        ck.save(7, &[Entry::tensor("w", DType::U8, &shape, data)])
            .unwrap()
            .wait()
            .unwrap();
    }
    Arc::new(L1Store::open(dir, EngineChoice::Psync).unwrap())
}

/// A checkpointer whose only tier is `store`, with step 7 saved on it.
fn saved_on(store: Arc<MemoryStore>, dir: &std::path::Path, data: &[u8]) -> Checkpointer {
    let ck = Checkpointer::builder(cfg(dir))
        .tiers(TierStack::local(store))
        .build()
        .unwrap();
    let shape = [data.len() as u64];
    ck.save(7, &[Entry::tensor("w", DType::U8, &shape, data)])
        .unwrap()
        .wait()
        .unwrap();
    ck
}

#[test]
fn copy_step_sends_only_what_is_missing_commits_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let data = tensor(1);
    let src = Arc::new(MemoryStore::new());
    let _ck = saved_on(src.clone(), dir.path(), &data);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ids = rt.block_on(src.list_chunks("c")).unwrap();
    assert_eq!(ids.len(), 4, "256 KiB in 64 KiB chunks");
    // The destination already holds one chunk of the step.
    let dst = Arc::new(MemoryStore::new());
    let one = rt.block_on(src.get_chunk("c", &ids[0], None)).unwrap();
    let hint = ElemHint {
        size: 1,
        float: false,
    };
    rt.block_on(dst.put_chunks(
        "c",
        vec![ChunkPut {
            id: ids[0],
            hint,
            data: one.clone(),
        }],
    ))
    .unwrap();

    let src_dyn: Arc<dyn ChunkStore> = src.clone();
    let seen = std::sync::Mutex::new(Vec::new());
    let progress = |p: CopyProgress| seen.lock().unwrap().push(p);
    let opts = CopyOptions {
        batch_bytes: 100 * KIB as u64,
        verify: Verify::Here,
        siblings: None,
        pause: None,
    };
    let st = rt
        .block_on(copy_step(&src_dyn, &*dst, "c", 7, 0, opts, &progress))
        .unwrap();
    assert_eq!((st.chunks, st.chunks_sent), (4, 3));
    assert_eq!(st.bytes_present, one.len() as u64);
    assert_eq!(st.bytes_sent, (data.len() - one.len()) as u64);
    let seen = seen.into_inner().unwrap();
    assert_eq!(
        seen[0],
        CopyProgress::Planned {
            total: st.bytes_sent
        }
    );
    // Batches of at most 100 KiB: one chunk each.
    assert_eq!(seen.len(), 4, "{seen:?}");

    // Committed there with the source's record, byte for byte.
    let a = rt.block_on(src.list_steps("c")).unwrap();
    let b = rt.block_on(dst.list_steps("c")).unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(a[0].records, b[0].records);
    assert!(b[0].committed_ranks().contains(&0));

    // Again: nothing to send, the identical record is success.
    let again = rt
        .block_on(copy_step(&src_dyn, &*dst, "c", 7, 0, opts, &|_| {}))
        .unwrap();
    assert_eq!((again.chunks_sent, again.bytes_sent), (0, 0));

    // The copy restores on its own, byte-identical.
    let dir2 = tempfile::tempdir().unwrap();
    let ck2 = Checkpointer::builder(cfg(dir2.path()))
        .tiers(TierStack::local(dst))
        .build()
        .unwrap();
    let got = ck2.restore(StepSelector::Latest).unwrap();
    assert_eq!(got.step, 7);
    assert_eq!(got.get("w").unwrap().bytes, data);
}

/// A pause held shut until permits are added: counts the batches it let
/// through.
struct Gate {
    permits: tokio::sync::Semaphore,
    passed: std::sync::atomic::AtomicUsize,
}

impl Pause for Gate {
    fn before_batch(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Ok(p) = self.permits.acquire().await {
                p.forget();
            }
            self.passed
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
    }
}

#[test]
fn a_held_copy_reads_and_sends_nothing_until_its_pause_lets_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = tensor(3);
    let src = Arc::new(MemoryStore::new());
    let _ck = saved_on(src.clone(), dir.path(), &data);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dst = Arc::new(MemoryStore::new());
    let gate = Arc::new(Gate {
        permits: tokio::sync::Semaphore::new(0),
        passed: std::sync::atomic::AtomicUsize::new(0),
    });
    let src_dyn: Arc<dyn ChunkStore> = src.clone();
    let (d2, g2) = (dst.clone(), gate.clone());
    let copy = rt.spawn(async move {
        let opts = CopyOptions {
            batch_bytes: 100 * KIB as u64,
            verify: Verify::Here,
            siblings: None,
            pause: Some(&*g2),
        };
        copy_step(&src_dyn, &*d2, "c", 7, 0, opts, &|_| {}).await
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Held before its first batch: nothing sent.
    assert!(!copy.is_finished());
    assert!(rt.block_on(dst.list_chunks("c")).unwrap().is_empty());
    // One batch let through at a time: exactly one chunk each (100 KiB
    // batches of 64 KiB chunks), then held again before the next.
    for sent in 1..=2 {
        gate.permits.add_permits(1);
        let t = std::time::Instant::now();
        while rt.block_on(dst.list_chunks("c")).unwrap().len() < sent {
            assert!(t.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(
            rt.block_on(dst.list_chunks("c")).unwrap().len(),
            sent,
            "sent while held"
        );
        assert!(!copy.is_finished());
    }
    // Let it run: one pause per batch (4 chunks, 4 batches).
    gate.permits.add_permits(100);
    let st = rt.block_on(copy).unwrap().unwrap();
    assert_eq!(st.chunks_sent, 4);
    assert_eq!(gate.passed.load(std::sync::atomic::Ordering::SeqCst), 4);
    // Nothing left to send: never held (with no permit it would hang).
    let closed = Gate {
        permits: tokio::sync::Semaphore::new(0),
        passed: std::sync::atomic::AtomicUsize::new(0),
    };
    let src_dyn: Arc<dyn ChunkStore> = src.clone();
    let opts = CopyOptions {
        batch_bytes: 100 * KIB as u64,
        verify: Verify::Here,
        siblings: None,
        pause: Some(&closed),
    };
    let again = rt
        .block_on(copy_step(&src_dyn, &*dst, "c", 7, 0, opts, &|_| {}))
        .unwrap();
    assert_eq!(again.chunks_sent, 0);
    assert_eq!(closed.passed.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(rt.block_on(dst.list_steps("c")).unwrap().len(), 1);
}

#[test]
fn copy_step_of_a_damaged_source_chunk_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = Arc::new(MemoryStore::new());
    let _ck = saved_on(src.clone(), dir.path(), &tensor(2));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ids = rt.block_on(src.list_chunks("c")).unwrap();
    src.corrupt_chunk("c", &ids[2], b"not the chunk").unwrap();
    let dst = MemoryStore::new();
    let src_dyn: Arc<dyn ChunkStore> = src.clone();
    let e = rt
        .block_on(copy_step(
            &src_dyn,
            &dst,
            "c",
            7,
            0,
            CopyOptions::default(),
            &|_| {},
        ))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains(&ids[2].to_hex()), "{e}");
    let steps = rt.block_on(dst.list_steps("c")).unwrap();
    assert!(
        steps.iter().all(|s| s.committed_ranks().is_empty()),
        "no record after a failed copy: {steps:?}"
    );
    // A step the source does not hold is NotFound, before anything is sent.
    let e = rt
        .block_on(copy_step(
            &src_dyn,
            &dst,
            "c",
            8,
            0,
            CopyOptions::default(),
            &|_| {},
        ))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}

/// Four distinct chunks and their refs.
fn chunks() -> (Vec<ChunkRef>, Vec<ChunkPut>) {
    let hint = ElemHint {
        size: 2,
        float: true,
    };
    let puts: Vec<ChunkPut> = (0..4u8)
        .map(|i| {
            let d: Vec<u8> = (0..10_000u32).map(|j| (j as u8) ^ i).collect();
            ChunkPut {
                id: ChunkId::of(&d),
                hint,
                data: ChunkData::copy_from(&d),
            }
        })
        .collect();
    let refs = puts
        .iter()
        .map(|p| ChunkRef {
            id: p.id,
            len: p.data.len() as u32,
            hint,
        })
        .collect();
    (refs, puts)
}

fn holding(puts: &[ChunkPut]) -> MemoryStore {
    let m = MemoryStore::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(m.put_chunks("c", puts.to_vec())).unwrap();
    m
}

#[test]
fn reader_falls_back_per_chunk_repairs_the_first_tier_and_writes_back() {
    let (refs, puts) = chunks();
    let (a, b, c, d) = (
        holding(&puts),
        holding(&puts),
        holding(&puts),
        MemoryStore::new(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    // a lacks chunk 1 and holds chunk 2 damaged; b holds chunk 1 damaged.
    rt.block_on(a.delete_chunks("c", &[refs[1].id])).unwrap();
    a.corrupt_chunk("c", &refs[2].id, b"damaged").unwrap();
    b.corrupt_chunk("c", &refs[1].id, b"damaged too").unwrap();
    let tiers = vec![
        ReadTier {
            store: &a,
            repair: true,
        },
        ReadTier {
            store: &b,
            repair: false,
        },
        ReadTier {
            store: &c,
            repair: false,
        },
    ];
    let reader = TieredReader::new("c", tiers).write_back(Some(&d));
    let out = rt.block_on(reader.read(&refs, Vec::new()));
    for (i, got) in out.chunks.iter().enumerate() {
        assert_eq!(
            got.result.as_ref().unwrap().as_slice(),
            puts[i].data.as_slice()
        );
    }
    assert_eq!(out.chunks[0].from, Some(0));
    assert_eq!(out.chunks[1].from, Some(2), "a missing, b damaged");
    assert_eq!(out.chunks[2].from, Some(1));
    let kinds: Vec<_> = out.chunks[1]
        .errors
        .iter()
        .map(|(t, e)| (*t, e.kind()))
        .collect();
    assert_eq!(
        kinds,
        [(0, StoreErrorKind::NotFound), (1, StoreErrorKind::Corrupt)]
    );
    // Only the tier marked for repair was rewritten, and it reads good now.
    assert_eq!(out.chunks[1].repaired, [0]);
    assert_eq!(out.chunks[2].repaired, [0]);
    assert_eq!(out.repaired(), 2);
    for r in rt.block_on(a.get_chunks("c", &[refs[1].id, refs[2].id])) {
        r.unwrap();
    }
    assert_eq!(
        rt.block_on(b.get_chunk("c", &refs[1].id, None))
            .unwrap_err()
            .kind(),
        StoreErrorKind::Corrupt
    );
    // The write-back tier got every chunk.
    assert_eq!(out.written_back.unwrap().unwrap().written, 4);
    assert_eq!(
        rt.block_on(d.has_chunks("c", &refs.iter().map(|r| r.id).collect::<Vec<_>>()))
            .unwrap(),
        [true; 4]
    );

    // every_copy lists every tier holding a good copy of a failed chunk.
    b.corrupt_chunk("c", &refs[3].id, b"x").unwrap();
    let reader = TieredReader::new(
        "c",
        vec![
            ReadTier {
                store: &b,
                repair: false,
            },
            ReadTier {
                store: &a,
                repair: false,
            },
            ReadTier {
                store: &c,
                repair: false,
            },
        ],
    )
    .every_copy(true);
    let out = rt.block_on(reader.read(&refs[3..], Vec::new()));
    assert_eq!(out.chunks[0].good, [1, 2]);
    assert_eq!(out.chunks[0].from, Some(1));
    assert!(out.chunks[0].repaired.is_empty(), "not marked for repair");
}

#[test]
fn reader_skips_an_unreachable_tier_without_repairing_it_and_keeps_the_first_error() {
    let (refs, puts) = chunks();
    let down = FaultStore::new(
        holding(&puts),
        FaultPlan {
            outage_after: Some(0),
            ..FaultPlan::default()
        },
    );
    let good = holding(&puts[..2]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let reader = TieredReader::new(
        "c",
        vec![
            ReadTier {
                store: &down,
                repair: true,
            },
            ReadTier {
                store: &good,
                repair: false,
            },
        ],
    );
    let out = rt.block_on(reader.read(&refs, Vec::new()));
    assert_eq!(out.chunks[0].from, Some(1));
    assert!(out.chunks[0].repaired.is_empty() && out.chunks[0].repair_failed.is_empty());
    // No tier has chunk 3: the error is the first tier's (it is down).
    assert_eq!(
        out.chunks[3].result.as_ref().unwrap_err().kind(),
        StoreErrorKind::Unavailable
    );
    assert_eq!(out.chunks[3].errors.len(), 2);
    assert_eq!(out.repaired(), 0);
    assert!(out.written_back.is_none());
}

/// A tier that refuses every call (a peer that no longer accepts the
/// job's certificate).
#[derive(Debug)]
struct Refusing;

fn refused<T>() -> strata::tiered::Result<T> {
    Err(strata::tiered::StoreError::Unauthorized(
        "not this job".into(),
    ))
}

#[async_trait::async_trait]
impl ChunkStore for Refusing {
    fn name(&self) -> &str {
        "refusing"
    }
    async fn put_chunks_opts(
        &self,
        _: &str,
        _: Vec<ChunkPut>,
        _: strata::tiered::PutOptions,
    ) -> strata::tiered::Result<strata::tiered::PutStats> {
        refused()
    }
    async fn get_chunk(
        &self,
        _: &str,
        _: &ChunkId,
        _: Option<std::ops::Range<u32>>,
    ) -> strata::tiered::Result<ChunkData> {
        refused()
    }
    async fn has_chunks(&self, _: &str, _: &[ChunkId]) -> strata::tiered::Result<Vec<bool>> {
        refused()
    }
    async fn list_chunks(&self, _: &str) -> strata::tiered::Result<Vec<ChunkId>> {
        refused()
    }
    async fn delete_chunks(&self, _: &str, _: &[ChunkId]) -> strata::tiered::Result<()> {
        refused()
    }
    async fn put_manifest(&self, _: &str, _: u64, _: u32, _: &[u8]) -> strata::tiered::Result<()> {
        refused()
    }
    async fn get_manifest(&self, _: &str, _: u64, _: u32) -> strata::tiered::Result<Vec<u8>> {
        refused()
    }
    async fn commit(&self, _: &strata::format::CommitRecord) -> strata::tiered::Result<()> {
        refused()
    }
    async fn list_steps(&self, _: &str) -> strata::tiered::Result<Vec<strata::tiered::StepInfo>> {
        refused()
    }
    async fn delete_step(&self, _: &str, _: u64) -> strata::tiered::Result<()> {
        refused()
    }
    async fn delete_shard(&self, _: &str, _: u64, _: u32) -> strata::tiered::Result<()> {
        refused()
    }
}

#[test]
fn a_tier_refusing_the_job_does_not_hide_a_good_copy_further_down() {
    let (refs, puts) = chunks();
    let (first, last) = (MemoryStore::new(), holding(&puts));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let reader = TieredReader::new(
        "c",
        vec![
            ReadTier {
                store: &first,
                repair: true,
            },
            ReadTier {
                store: &Refusing,
                repair: false,
            },
            ReadTier {
                store: &last,
                repair: false,
            },
        ],
    );
    let out = rt.block_on(reader.read(&refs, Vec::new()));
    for (c, p) in out.chunks.iter().zip(&puts) {
        assert_eq!(c.from, Some(2), "{:?}", c.errors);
        assert_eq!(c.result.as_ref().unwrap().as_slice(), p.data.as_slice());
        assert_eq!(c.errors[1].1.kind(), StoreErrorKind::Unauthorized);
        // The first tier lacked it: repaired from the last one.
        assert_eq!(c.repaired, [0]);
    }
}

/// A copy out of L1 in many batches reads each into the buffers of the
/// batches already sent (`tiers/recycle.rs`): whatever a reused buffer
/// held before, every byte that arrives is the chunk's own.
#[test]
fn a_copy_from_l1_in_many_batches_reusing_its_read_buffers_delivers_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    // 16 chunks of 64 KiB, each unlike the others; the last one shorter,
    // so a reused buffer is longer than what it holds.
    let data: Vec<u8> = (0..1024 * KIB - 1000)
        .map(|j| (j as u8) ^ ((j >> 16) as u8).wrapping_mul(31))
        .collect();
    let src = l1_with_step_7(dir.path(), &data);
    let rt = tokio::runtime::Runtime::new().unwrap();
    for verify in [Verify::Receiver, Verify::Here] {
        let dst = Arc::new(MemoryStore::new());
        let opts = CopyOptions {
            // Two chunks a batch: eight batches, the later ones into the
            // earlier ones' buffers.
            batch_bytes: 128 * KIB as u64,
            verify,
            siblings: None,
            pause: None,
        };
        let st = rt
            .block_on(copy_step(&src, &*dst, "c", 7, 0, opts, &|_| {}))
            .unwrap();
        assert_eq!((st.chunks, st.chunks_sent), (16, 16));
        for id in rt.block_on(src.list_chunks("c")).unwrap() {
            let want = rt.block_on(src.get_chunk("c", &id, None)).unwrap();
            let got = rt.block_on(dst.get_chunk("c", &id, None)).unwrap();
            assert_eq!(got.as_slice(), want.as_slice(), "{verify:?}: chunk {id}");
        }
        // And the step restores from there, whole.
        let back = Checkpointer::builder(cfg(tempfile::tempdir().unwrap().path()))
            .tiers(TierStack::local(dst))
            .build()
            .unwrap()
            .restore(StepSelector::Step(7))
            .unwrap();
        assert_eq!(back.get("w").unwrap().bytes, data, "{verify:?}");
    }
}

/// What a held copy's loan of its free read buffers looks like from the
/// side that holds it back: each offer taken (the sizes of each noted),
/// every other buffer kept for good (as buffers a restore's lanes read
/// into and did not give back), the rest handed back when the copy goes on.
#[derive(Default)]
struct Borrower {
    offers: std::sync::Mutex<Vec<usize>>,
    lent_bytes: std::sync::atomic::AtomicUsize,
    lent: std::sync::Mutex<Vec<strata::tiered::AlignedBuf>>,
    kept: std::sync::Mutex<Vec<strata::tiered::AlignedBuf>>,
}

impl Pause for Borrower {
    fn before_batch(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async {})
    }

    fn lend_spares(
        &self,
        spares: Vec<strata::tiered::AlignedBuf>,
    ) -> Result<(), Vec<strata::tiered::AlignedBuf>> {
        use std::sync::atomic::Ordering::SeqCst;
        self.offers.lock().unwrap().push(spares.len());
        for (i, b) in spares.into_iter().enumerate() {
            self.lent_bytes.fetch_add(b.capacity(), SeqCst);
            if i % 2 == 0 {
                self.kept.lock().unwrap().push(b);
            } else {
                self.lent.lock().unwrap().push(b);
            }
        }
        Ok(())
    }

    fn take_back(&self, limit: usize) -> Vec<strata::tiered::AlignedBuf> {
        let mut lent = self.lent.lock().unwrap();
        let mut out = Vec::new();
        let mut held = 0;
        while lent.last().is_some_and(|b| held + b.capacity() <= limit) {
            let b = lent.pop().unwrap();
            held += b.capacity();
            out.push(b);
        }
        out
    }
}

/// A copy held back lends its free read buffers to what holds it (a
/// restore of the same process reads into them instead of faulting in new
/// memory) at every hold but the first (nothing was sent yet: an empty
/// offer), and goes on with what it gets back and new buffers: every byte
/// still arrives.
#[test]
fn a_held_copy_lends_its_free_read_buffers_and_delivers_every_byte() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..1024 * KIB)
        .map(|j| (j as u8) ^ ((j >> 16) as u8).wrapping_mul(29))
        .collect();
    let src = l1_with_step_7(dir.path(), &data);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dst = Arc::new(MemoryStore::new());
    let borrower = Borrower::default();
    let opts = CopyOptions {
        // Two 64 KiB chunks a batch: eight batches, each held before.
        batch_bytes: 128 * KIB as u64,
        verify: Verify::Receiver,
        siblings: None,
        pause: Some(&borrower),
    };
    let st = rt
        .block_on(copy_step(&src, &*dst, "c", 7, 0, opts, &|_| {}))
        .unwrap();
    assert_eq!((st.chunks, st.chunks_sent), (16, 16));
    let offers = borrower.offers.lock().unwrap().clone();
    assert_eq!(offers.len(), 8, "{offers:?}");
    assert_eq!(offers[0], 0, "{offers:?}");
    assert!(offers[1..].iter().all(|&n| n > 0), "{offers:?}");
    assert!(
        borrower.lent_bytes.load(SeqCst) >= 4 * 64 * KIB,
        "lent {} bytes",
        borrower.lent_bytes.load(SeqCst)
    );
    assert!(!borrower.kept.lock().unwrap().is_empty());
    for id in rt.block_on(src.list_chunks("c")).unwrap() {
        let want = rt.block_on(src.get_chunk("c", &id, None)).unwrap();
        let got = rt.block_on(dst.get_chunk("c", &id, None)).unwrap();
        assert_eq!(got.as_slice(), want.as_slice(), "chunk {id}");
    }
}
