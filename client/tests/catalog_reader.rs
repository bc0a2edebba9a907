//! The catalog and the shard reader (`strata::tiers`): another rank's
//! shard read by entry and byte range from each tier on its own (L1, the
//! peers over QUIC, L3), and a damaged L1 chunk served by the next tier
//! and repaired on the way.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;

use strata::format::DType;
use strata::tiers::{Held, Tiers};
use strata::{Checkpointer, Config, Entry, ErrorKind, InProcessCoordinator, TierKind};
use strata_peer::replicas::Limits;
use strata_peer::service::{Service, ServiceConfig};
use strata_peer::tls::{make_certs, CertFiles};

const JOB: &str = "catalog-read";
const MIB: usize = 1 << 20;

struct Peers {
    _rt: tokio::runtime::Runtime,
    services: Vec<(String, Arc<Service>)>,
    dir: tempfile::TempDir,
}

impl Peers {
    fn start() -> Peers {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<String> = ["node-a", "node-b", "node-c"].map(String::from).to_vec();
        make_certs(dir.path(), &nodes, &[], &[JOB.into()]).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let services = nodes[1..]
            .iter()
            .map(|n| {
                let cfg = ServiceConfig {
                    node: n.clone(),
                    listen: "127.0.0.1:0".parse().unwrap(),
                    certs: CertFiles::in_dir(dir.path(), n),
                    spill: dir.path().join(format!("spill-{n}")),
                    limits: Limits::default(),
                    max_streams: 32,
                    inflight_bytes: 256 << 20,
                    max_request: ServiceConfig::DEFAULT_MAX_REQUEST,
                    work_bytes: ServiceConfig::DEFAULT_WORK_BYTES,
                    max_connections: ServiceConfig::DEFAULT_MAX_CONNECTIONS,
                };
                let svc = rt.block_on(async { Service::bind(&cfg).unwrap() });
                rt.spawn(svc.clone().run());
                (n.clone(), svc)
            })
            .collect();
        Peers {
            _rt: rt,
            services,
            dir,
        }
    }

    fn list(&self) -> Vec<String> {
        self.services
            .iter()
            .map(|(n, s)| format!("{n}={}", s.local_addr().unwrap()))
            .collect()
    }
}

/// Rank `rank`'s tensors: "w" spans several chunks, "b" is small and
/// packed beside other entries, "blob" is not a tensor.
fn state(rank: u32) -> Vec<(String, Vec<u8>)> {
    // Random bytes: no two chunks alike (a periodic pattern would make
    // every chunk one deduplicated id).
    let mut rng = strata_tiered::SplitMix64::new(0x5eed + u64::from(rank));
    let w: Vec<u8> = (0..3 * MIB + 12345).map(|_| rng.next_u64() as u8).collect();
    let b: Vec<u8> = (0..4096u32).map(|i| (i % 13) as u8 + rank as u8).collect();
    let blob = format!("rank {rank} says hello").into_bytes();
    vec![("w".into(), w), ("b".into(), b), ("blob".into(), blob)]
}

fn base(l1: &Path, l3: &Path, peers: &Peers) -> Config {
    Config::builder()
        .job(JOB)
        .l1_dir(l1)
        .chunk_size(MIB as u32)
        .l3_url(format!("file://{}", l3.display()))
        .upload_every(1)
        .peers("node-a", peers.list(), peers.dir.path())
        .replicas(1)
}

/// Saves step 7 on two ranks of node-a: L1, one peer each, and L3.
fn save_world(l1: &Path, l3: &Path, peers: &Peers) {
    let coord = InProcessCoordinator::new(2);
    std::thread::scope(|sc| {
        for rank in 0..2u32 {
            let coord = coord.clone();
            let cfg = base(l1, l3, peers).rank(rank, 2);
            sc.spawn(move || {
                let ck = Checkpointer::with_coordinator(cfg, Arc::new(coord)).unwrap();
                let s = state(rank);
                let shapes = [[s[0].1.len() as u64], [s[1].1.len() as u64]];
                let entries = [
                    Entry::tensor(&s[0].0, DType::U8, &shapes[0], &s[0].1),
                    Entry::tensor(&s[1].0, DType::U8, &shapes[1], &s[1].1),
                    Entry::blob(&s[2].0, &s[2].1),
                ];
                ck.save(7, &entries).unwrap().wait().unwrap();
                ck.wait_replication();
                ck.wait_uploads();
            });
        }
    });
}

/// Reads rank 1's shard through `t`'s catalog: every entry whole and in
/// ranges that cross chunk boundaries, compared with what was saved.
/// Returns the tier the manifest came from and the read stats summed.
fn read_rank1(t: &Tiers) -> (String, strata::tiers::reader::RangeStats) {
    let all: Vec<_> = t.tiers().iter().collect();
    let cat = t.catalog(&all);
    assert_eq!(cat.committed_steps().into_iter().collect::<Vec<_>>(), [7]);
    assert_eq!(cat.ranks(7).into_iter().collect::<Vec<_>>(), [0, 1]);
    let found = t.block_on(cat.shard(7, 1, |_, _| true)).unwrap();
    let from = found.tier.name.clone();
    assert_eq!(found.shard.manifest.info.rank, 1);
    let r = t.shard_reader(&cat, 7, 1, false, 8 * MIB).unwrap();
    let want = state(1);
    let mut sum = strata::tiers::reader::RangeStats::default();
    let mut add = |s: strata::tiers::reader::RangeStats| {
        sum.chunks_read += s.chunks_read;
        sum.fallbacks += s.fallbacks;
        sum.repaired += s.repaired;
        sum.cached += s.cached;
    };
    for (name, bytes) in &want {
        let (got, s) = t.block_on(r.read_entry(name)).unwrap();
        assert!(got == *bytes, "{name} differs");
        add(s);
    }
    let w = &want[0].1;
    for (off, len) in [
        (0, 10),
        (MIB - 5, 10),
        (2 * MIB + 7, MIB + 100),
        (w.len() - 3, 3),
        (17, 0),
    ] {
        let (got, s) = t
            .block_on(r.read_range("w", off as u64, len as u64))
            .unwrap();
        assert_eq!(got, w[off..off + len], "w[{off}..+{len}]");
        add(s);
    }
    // Out of the entry, and an entry that is not there: typed errors.
    let past = t
        .block_on(r.read_range("w", w.len() as u64 - 2, 3))
        .unwrap_err();
    assert_eq!(past.kind(), ErrorKind::Invalid, "{past}");
    let none = t.block_on(r.read_entry("nope")).unwrap_err();
    assert_eq!(none.kind(), ErrorKind::NotFound, "{none}");
    (from, sum)
}

#[test]
fn another_ranks_shard_reads_from_each_tier_and_a_damaged_chunk_is_repaired() {
    let peers = Peers::start();
    let l1 = tempfile::tempdir().unwrap();
    let l3 = tempfile::tempdir().unwrap();
    save_world(l1.path(), l3.path(), &peers);
    run(&peers, l1.path(), l3.path());
}

fn run(peers: &Peers, l1: &Path, l3: &Path) {
    let missing = l1.join("no-such-l1");
    let only = |use_l1: bool, use_peers: bool, use_l3: bool| {
        let mut c = base(if use_l1 { l1 } else { &missing }, l3, peers);
        if !use_l3 {
            c.l3_url = None;
        }
        if !use_peers {
            c.peers = Vec::new();
        }
        Tiers::open(c, false).unwrap()
    };

    // Each tier on its own serves rank 1's shard whole.
    for (use_l1, use_peers, use_l3, kind) in [
        (true, false, false, TierKind::L1),
        (false, true, false, TierKind::L2),
        (false, false, true, TierKind::L3),
    ] {
        let t = only(use_l1, use_peers, use_l3);
        assert!(t.tiers().iter().all(|x| x.kind == kind), "{:?}", t.tiers());
        let (from, stats) = read_rank1(&t);
        let expect = if kind == TierKind::L2 { "L2:" } else { "" };
        assert!(from.starts_with(expect), "{kind:?}: manifest from {from}");
        assert_eq!(stats.fallbacks, 0, "{kind:?}");
        assert!(
            stats.chunks_read > 0 && stats.cached > 0,
            "{kind:?}: {stats:?}"
        );
    }

    // Damage one of rank 1's chunks on L1: a read over every tier gets it
    // from a peer, and with repair L1 holds the good copy again.
    let t = only(true, true, true);
    let all: Vec<_> = t.tiers().iter().collect();
    let cat = t.catalog(&all);
    let l1_tier = &t.tiers()[0];
    assert_eq!(cat.held(l1_tier, 7), Held::Committed);
    let m = t
        .block_on(cat.shard(7, 1, |_, _| true))
        .unwrap()
        .shard
        .manifest;
    let w = m.entry("w").unwrap();
    let victim = m.chunks[w.segments[1].chunk as usize].id.to_hex();
    let files = strata_testkit::files_under(&l1.join(JOB));
    let file = files
        .iter()
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().contains(&victim))
        })
        .unwrap_or_else(|| panic!("no L1 file for chunk {victim} in {files:?}"));
    let mut bytes = std::fs::read(file).unwrap();
    bytes[100] ^= 0x5a;
    std::fs::write(file, &bytes).unwrap();

    // L1 alone: the damage is found, typed.
    let t1 = only(true, false, false);
    let all1: Vec<_> = t1.tiers().iter().collect();
    let cat1 = t1.catalog(&all1);
    let r1 = t1.shard_reader(&cat1, 7, 1, false, 0).unwrap();
    let err = t1.block_on(r1.read_entry("w")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");

    // Every tier, with repair: served by the next tier, L1 rewritten.
    let r = t.shard_reader(&cat, 7, 1, true, 0).unwrap();
    let (got, s) = t.block_on(r.read_entry("w")).unwrap();
    assert!(got == state(1)[0].1, "w differs");
    assert_eq!((s.fallbacks, s.repaired), (1, 1), "{s:?}");
    // The damaged chunk came from the peer holding the replica, the rest
    // from L1.
    let peers: Vec<_> = s
        .served_by
        .iter()
        .filter(|(t, _)| t.starts_with("L2:"))
        .collect();
    assert_eq!(peers.len(), 1, "{s:?}");
    assert_eq!(*peers[0].1, 1, "{s:?}");
    assert_eq!(s.served_by.get("L1"), Some(&(s.chunks_read - 1)), "{s:?}");

    // L1 alone again: whole and verified.
    let r1 = t1.shard_reader(&cat1, 7, 1, false, 0).unwrap();
    let (got, s) = t1.block_on(r1.read_entry("w")).unwrap();
    assert!(got == state(1)[0].1, "w differs after the repair");
    assert_eq!(s.fallbacks, 0);

    // A cache of one chunk: a chunk read again right after is cached, one
    // evicted by a later chunk is read again.
    let seg = &w.segments;
    let (c0, c1) = (
        &m.chunks[seg[0].chunk as usize],
        &m.chunks[seg[1].chunk as usize],
    );
    assert_ne!(c0.id, c1.id);
    let fits_one = c0.len.max(c1.len) as usize;
    let small = t1.shard_reader(&cat1, 7, 1, false, fits_one).unwrap();
    let read = |off: u64| t1.block_on(small.read_range("w", off, 8)).unwrap().1;
    let second = u64::from(seg[0].len) + 10;
    assert_eq!((read(10).chunks_read, read(20).cached), (1, 1));
    assert_eq!(read(second).chunks_read, 1);
    assert_eq!(
        read(10).chunks_read,
        1,
        "the first chunk was evicted by the second"
    );
}

/// Readers sharing one cache read each chunk once, however many read it
/// at the same time (the others wait for that read); a prefetch fills
/// the cache for the read that follows it.
#[test]
fn readers_sharing_a_cache_read_each_chunk_once_and_prefetch_fills_it() {
    let peers = Peers::start();
    let l1 = tempfile::tempdir().unwrap();
    let l3 = tempfile::tempdir().unwrap();
    save_world(l1.path(), l3.path(), &peers);
    let mut c = base(l1.path(), l3.path(), &peers);
    c.l3_url = None;
    c.peers = Vec::new();
    let t = Tiers::open(c, false).unwrap();
    let all: Vec<_> = t.tiers().iter().collect();
    let cat = t.catalog(&all);
    let cache = strata::tiers::SharedChunkCache::new(64 * MIB);
    let want = state(1)[0].1.clone();
    let chunks = {
        let r = t.shard_reader(&cat, 7, 1, false, 0).unwrap();
        let mut ids: Vec<u32> = r
            .manifest()
            .entry("w")
            .unwrap()
            .segments
            .iter()
            .map(|s| s.chunk)
            .collect();
        ids.dedup();
        ids.len() as u64
    };
    assert!(chunks >= 3);
    let readers: Vec<_> = (0..8)
        .map(|_| {
            t.shard_reader(&cat, 7, 1, false, 0)
                .unwrap()
                .share_cache(&cache)
        })
        .collect();
    let read: u64 = std::thread::scope(|sc| {
        let handles: Vec<_> = readers
            .iter()
            .map(|r| {
                let (t, want) = (&t, &want);
                sc.spawn(move || {
                    let (got, s) = t.block_on(r.read_entry("w")).unwrap();
                    assert!(got == *want, "w differs");
                    assert_eq!(s.chunks_read + s.cached, chunks, "{s:?}");
                    s.chunks_read
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(read, chunks, "every chunk read once across eight readers");
    assert!(cache.held() > 0);

    // A prefetch, then the read: everything from the cache.
    let cache = strata::tiers::SharedChunkCache::new(64 * MIB);
    let r = t
        .shard_reader(&cat, 7, 1, false, 0)
        .unwrap()
        .share_cache(&cache);
    let p = t.block_on(r.prefetch("w", 0, want.len() as u64)).unwrap();
    assert_eq!(p.chunks_read, chunks);
    let (got, s) = t.block_on(r.read_entry("w")).unwrap();
    assert!(got == want);
    assert_eq!((s.chunks_read, s.cached), (0, chunks), "{s:?}");
}
