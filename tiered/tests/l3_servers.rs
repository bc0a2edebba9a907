//! L3 on real S3-compatible servers: exclusive commits under racing
//! writers, multipart uploads, compression, damage, bad credentials.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;
use support::servers;

use std::sync::Arc;

use object_store::ObjectStoreExt;

use strata_format::codec::ElemHint;
use strata_format::{ChunkId, CommitRecord, ShardRef};
use strata_tiered::ChunkStoreExt;
use strata_tiered::{ChunkData, ChunkPut, ChunkStore, L3Options, StoreErrorKind};

const JOB: &str = "l3-job";

fn record(step: u64, writer: u8) -> CommitRecord {
    CommitRecord {
        job: JOB.into(),
        step,
        world_size: 1,
        committed_unix_ms: 1_000 + u64::from(writer),
        shards: vec![ShardRef {
            rank: 0,
            manifest: ChunkId::of(&[writer]),
            logical_bytes: 10,
        }],
    }
}

/// bf16-like bytes: small normal values, whose exponent bytes compress.
fn bf16_like(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let v = ((x % 2000) as f32 - 1000.0) / 40_000.0;
        out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// moto: 16 writers race to commit the same step with different records;
/// exactly one wins, the others get AlreadyExists, and the stored record is
/// the winner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_commits_have_exactly_one_winner_on_moto() {
    let Some(server) = servers::moto() else {
        return;
    };
    let store = Arc::new(server.store("race"));
    for round in 0..3u64 {
        let tasks: Vec<_> = (0..16u8)
            .map(|w| {
                let s = store.clone();
                tokio::spawn(async move { (w, s.commit(&record(round, w)).await) })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            let (w, r) = t.await.unwrap();
            match r {
                Ok(()) => winners.push(w),
                Err(e) => assert_eq!(e.kind(), StoreErrorKind::AlreadyExists, "{e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let steps = store.list_steps(JOB).await.unwrap();
        let st = steps.iter().find(|s| s.step == round).unwrap();
        assert_eq!(st.records[&0], record(round, winners[0]));
    }
}

/// s3s-fs: a chunk above the multipart threshold goes up in parts and comes
/// back verified; compressible chunks are stored smaller; incompressible
/// ones raw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_and_compression_on_s3s_fs() {
    let Some(server) = servers::s3s_fs() else {
        return;
    };
    let opts = L3Options {
        multipart_threshold: 5 << 20,
        part_size: 5 << 20,
        ..L3Options::default()
    };
    let store = server.store_with("mp", opts);
    let big = bf16_like(13 << 20, 1);
    let random: Vec<u8> = (0..(6u32 << 20))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let puts = vec![
        ChunkPut {
            id: ChunkId::of(&big),
            hint: ElemHint {
                size: 2,
                float: true,
            },
            data: ChunkData::copy_from(&big),
        },
        ChunkPut {
            id: ChunkId::of(&random),
            hint: ElemHint::BYTES,
            data: ChunkData::copy_from(&random),
        },
    ];
    let st = store.put_chunks(JOB, puts.clone()).await.unwrap();
    assert_eq!(st.written, 2);
    assert!(
        st.bytes_stored < st.bytes_written,
        "bf16 weights should shrink: {st:?}"
    );
    for p in &puts {
        let got = store.get_chunk(JOB, &p.id, None).await.unwrap();
        assert_eq!(got.as_slice(), p.data.as_slice());
    }
    // Uploaded once: a second put is all dedup, nothing re-sent.
    let again = store.put_chunks(JOB, puts).await.unwrap();
    assert_eq!((again.written, again.deduped), (0, 2));
}

/// s3s-fs: an object whose bytes were damaged on the server is a Corrupt
/// error naming the chunk; wrong credentials are an `Unauthorized` error,
/// not a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_and_bad_credentials_on_s3s_fs() {
    let Some(server) = servers::s3s_fs() else {
        return;
    };
    let store = server.store("dmg");
    let a = bf16_like(100_000, 2);
    let b = bf16_like(100_000, 3);
    let (ia, ib) = (ChunkId::of(&a), ChunkId::of(&b));
    let put = |id, d: &Vec<u8>| ChunkPut {
        id,
        hint: ElemHint {
            size: 2,
            float: true,
        },
        data: ChunkData::copy_from(d),
    };
    store
        .put_chunks(JOB, vec![put(ia, &a), put(ib, &b)])
        .await
        .unwrap();
    // Swap b's frame into a's key, as a misbehaving server or a bad copy would.
    let raw = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(servers::BUCKET)
        .with_endpoint(format!("http://127.0.0.1:{}", server.port))
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id(servers::ACCESS_KEY)
        .with_secret_access_key(servers::SECRET_KEY)
        .with_virtual_hosted_style_request(false)
        .build()
        .unwrap();
    use object_store::ObjectStoreExt;
    let key = |id: &ChunkId| {
        let h = id.to_hex();
        object_store::path::Path::from(format!("dmg/{JOB}/chunks/{}/{h}", &h[..2]))
    };
    let frame_b = raw.get(&key(&ib)).await.unwrap().bytes().await.unwrap();
    raw.put(&key(&ia), frame_b.clone().into()).await.unwrap();
    let e = store.get_chunk(JOB, &ia, None).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains(&ia.to_hex()), "{e}");
    // Flip a payload byte of b.
    let mut bad = frame_b.to_vec();
    let n = bad.len();
    bad[n - 10] ^= 0x40;
    raw.put(&key(&ib), bad.into()).await.unwrap();
    let e = store.get_chunk(JOB, &ib, None).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");

    let mut opts = server.options();
    for (k, v) in &mut opts {
        if k == "secret_access_key" {
            *v = "wrong".into();
        }
    }
    let fast = L3Options {
        max_retries: 1,
        retry_timeout: std::time::Duration::from_secs(5),
        ..L3Options::default()
    };
    let wrong =
        strata_tiered::L3Store::from_url(&format!("s3://{}/dmg", servers::BUCKET), &opts, fast)
            .unwrap();
    let e = wrong.has_chunks(JOB, &[ia]).await.unwrap_err();
    // The server's 403 is `Unauthorized` since the tier stack gave the
    // kind its own name (it was reported as `Unavailable`); either way it
    // is an error, and it is not retried as a transient one.
    assert_eq!(e.kind(), StoreErrorKind::Unauthorized, "{e}");
    assert!(!e.is_transient(), "{e}");
}

/// Frames larger than `range_size` are read as several ranged GETs at once
/// and reassembled in place: on s3s-fs, a local directory and memory, for a
/// frame of many ranges, one just over a range, one under it, and a range
/// size that does not divide the frame; each decodes and verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranged_reads_reassemble_frames_on_every_backend() {
    let dir = tempfile::tempdir().unwrap();
    let server = servers::s3s_fs();
    let opts = L3Options {
        range_size: 64 << 10,
        ..L3Options::default()
    };
    let mut stores = vec![
        strata_tiered::L3Store::from_url("memory://", &[], opts.clone()).unwrap(),
        strata_tiered::L3Store::from_url(
            &format!("file://{}", dir.path().display()),
            &[],
            opts.clone(),
        )
        .unwrap(),
    ];
    if let Some(s) = &server {
        stores.push(s.store_with("ranged", opts.clone()));
    }
    for store in &stores {
        for (n, seed) in [
            (1 << 20, 1u32),
            ((64 << 10) + 1, 2),
            (1000, 3),
            (777_777, 4),
        ] {
            let data = bf16_like(n & !1, seed);
            let id = ChunkId::of(&data);
            store
                .put_chunks(
                    JOB,
                    vec![ChunkPut {
                        id,
                        hint: ElemHint {
                            size: 2,
                            float: true,
                        },
                        data: ChunkData::copy_from(&data),
                    }],
                )
                .await
                .unwrap();
            // Reuse a buffer that is too small, then one too large.
            for buf in [vec![7u8; 10], vec![7u8; 4 << 20]] {
                let frame = store.get_frame(JOB, id, buf).await.unwrap();
                assert_eq!(frame.raw_len().unwrap(), data.len());
                let mut out = vec![0u8; data.len()];
                frame.decode_into(&mut out).unwrap();
                assert!(out == data, "{} bytes on {}", data.len(), store.url());
                // A destination of the wrong size is an error, not a panic.
                let mut short = vec![0u8; data.len() - 2];
                assert!(frame.decode_into(&mut short).is_err());
            }
            // And through the ChunkStore API.
            let got = store.get_chunk(JOB, &id, None).await.unwrap();
            assert!(got.as_slice() == data.as_slice());
        }
        // A missing object is NotFound.
        let e = store
            .get_frame(JOB, ChunkId::of(b"absent"), Vec::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::NotFound, "{e}");
    }
}

/// Starts a multipart upload of `key` with one 5 MiB part and abandons it,
/// as a writer killed in the middle of a large chunk's upload does.
async fn abandon_upload(raw: &dyn object_store::ObjectStore, key: &str) {
    let mut up = raw
        .put_multipart(&object_store::path::Path::from(key))
        .await
        .unwrap();
    up.put_part(vec![7u8; 5 << 20].into()).await.unwrap();
    // Killed: no abort, no cleanup on drop (the local store has one).
    std::mem::forget(up);
}

fn raw_s3(server: &servers::Server) -> object_store::aws::AmazonS3 {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    let mut b = AmazonS3Builder::new().with_bucket_name(servers::BUCKET);
    for (k, v) in server.options() {
        b = b.with_config(k.parse::<AmazonS3ConfigKey>().unwrap(), v);
    }
    b.build().unwrap()
}

/// moto: incomplete multipart uploads of the job's chunks begun before the
/// cutoff are aborted, on the server's clock; younger ones and another
/// job's are left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_multipart_uploads_are_aborted_on_moto() {
    let Some(server) = servers::moto() else {
        return;
    };
    let store = server.store("mpu");
    let raw = raw_s3(&server);
    let hex = ChunkId::of(b"big").to_hex();
    let mine = format!("mpu/{JOB}/chunks/{}/{hex}", &hex[..2]);
    abandon_upload(&raw, &mine).await;
    abandon_upload(&raw, &mine).await;
    abandon_upload(&raw, &format!("mpu/other/chunks/{}/{hex}", &hex[..2])).await;
    // Begun after the cutoff: kept. (moto stamps every upload as begun
    // on 2010-11-10, so "young" here means a cutoff before that.)
    let y2k = std::time::UNIX_EPOCH + std::time::Duration::from_secs(946_684_800);
    assert_eq!(store.abort_stale_uploads(JOB, y2k).await.unwrap(), 0);
    let cutoff = store.now(JOB).await.unwrap();
    assert_eq!(store.abort_stale_uploads(JOB, cutoff).await.unwrap(), 2);
    // Gone from the server's listing: a second sweep finds none.
    assert_eq!(store.abort_stale_uploads(JOB, cutoff).await.unwrap(), 0);
    // Another job's upload was not touched.
    assert_eq!(store.abort_stale_uploads("other", cutoff).await.unwrap(), 1);
}

/// moto: a multipart upload whose parts fail is aborted, not left behind
/// (billed): after failed puts, no upload of the job is listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_multipart_upload_is_aborted_on_moto() {
    let Some(server) = servers::moto() else {
        return;
    };
    let raw: Arc<dyn object_store::ObjectStore> = Arc::new(raw_s3(&server));
    let faulty = strata_tiered::FaultStore::new(
        raw,
        strata_tiered::FaultPlan {
            fail_parts: true,
            ..Default::default()
        },
    );
    let opts = L3Options {
        multipart_threshold: 5 << 20,
        part_size: 5 << 20,
        max_retries: 2,
        ..L3Options::default()
    };
    let failing = strata_tiered::L3Store::with_store(Arc::new(faulty), "fail", "faulty moto", opts);
    let data = bf16_like(12 << 20, 7);
    let c = ChunkPut {
        id: ChunkId::of(&data),
        hint: ElemHint::BYTES,
        data: ChunkData::copy_from(&data),
    };
    let err = failing.put_chunks(JOB, vec![c]).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    // Listed through the real server: nothing begun is left.
    let lister = server.store("fail");
    let later = lister.now(JOB).await.unwrap() + std::time::Duration::from_secs(3600);
    assert_eq!(lister.abort_stale_uploads(JOB, later).await.unwrap(), 0);
}

/// s3s-fs does not implement the listing (501): the sweep aborts nothing
/// and garbage collection is not failed by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_listing_aborts_nothing() {
    let Some(server) = servers::s3s_fs() else {
        return;
    };
    let store = server.store("mpu");
    let cutoff = store.now(JOB).await.unwrap();
    assert_eq!(store.abort_stale_uploads(JOB, cutoff).await.unwrap(), 0);
}

/// file://: object_store stages a multipart upload beside its key
/// (`<key>#<n>`); stale staging files are removed, committed objects kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_staged_uploads_are_removed_on_file_urls() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let store = strata_tiered::L3Store::from_url(&url, &[], L3Options::default()).unwrap();
    let raw = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let hex = ChunkId::of(b"big").to_hex();
    let key = format!("{JOB}/chunks/{}/{hex}", &hex[..2]);
    abandon_upload(&raw, &key).await;
    let staged: Vec<_> = std::fs::read_dir(dir.path().join(&key).parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(staged.len(), 1, "{staged:?}");
    assert!(staged[0].starts_with(&format!("{hex}#")), "{staged:?}");
    let before = store.now(JOB).await.unwrap() - std::time::Duration::from_secs(3600);
    assert_eq!(store.abort_stale_uploads(JOB, before).await.unwrap(), 0);
    // File times move in clock ticks: step past the staging file's.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let cutoff = store.now(JOB).await.unwrap();
    assert_eq!(store.abort_stale_uploads(JOB, cutoff).await.unwrap(), 1);
    assert!(std::fs::read_dir(dir.path().join(&key).parent().unwrap())
        .unwrap()
        .next()
        .is_none());
}
