//! A chunk left short by a crash (an object store's host losing power
//! before its write reached the disk; an L1 file renamed but never synced)
//! must not pass for the chunk: the presence check says missing, the next
//! put writes it whole, and reads verify.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use strata_format::codec::ElemHint;
use strata_format::ChunkId;
use strata_tiered::ChunkStoreExt;
use strata_tiered::{ChunkData, ChunkPut, ChunkStore, EngineChoice, L1Store, L3Options, L3Store};

const JOB: &str = "torn";

fn put_of(data: &[u8]) -> ChunkPut {
    ChunkPut {
        id: ChunkId::of(data),
        hint: ElemHint::BYTES,
        data: ChunkData::copy_from(data),
    }
}

/// Cuts every file under `dir` named like `hex` to `len` bytes.
fn cut(dir: &std::path::Path, hex: &str, len: u64) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.file_name().to_string_lossy() == hex {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(e.path())
                    .unwrap()
                    .set_len(len)
                    .unwrap();
                n += 1;
            }
        }
    }
    n
}

/// `lengths`: the torn lengths the presence check must see through (L1
/// knows only that a chunk file is not empty; its puts compare lengths).
async fn torn_then_rewritten(store: &dyn ChunkStore, root: &std::path::Path, seen: &[u64]) {
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let c = put_of(&data);
    let id = c.id;
    store.put_chunks(JOB, vec![c]).await.unwrap();
    assert_eq!(store.has_chunks(JOB, &[id]).await.unwrap(), [true]);
    for len in [0u64, 10] {
        assert_eq!(cut(root, &id.to_hex(), len), 1, "{}", store.name());
        if seen.contains(&len) {
            assert_eq!(
                store.has_chunks(JOB, &[id]).await.unwrap(),
                [false],
                "{}: a {len}-byte chunk file passed for the chunk",
                store.name()
            );
        }
        let st = store.put_chunks(JOB, vec![put_of(&data)]).await.unwrap();
        assert_eq!((st.written, st.deduped), (1, 0), "{}", store.name());
        assert_eq!(store.has_chunks(JOB, &[id]).await.unwrap(), [true]);
        let back = store.get_chunk(JOB, &id, None).await.unwrap();
        assert!(back.as_slice() == data.as_slice());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_l1_chunk_is_missing_and_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let l1 = L1Store::open(dir.path(), EngineChoice::Psync).unwrap();
    torn_then_rewritten(&l1, dir.path(), &[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_l3_object_is_missing_and_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let l3 = L3Store::from_url(&url, &[], L3Options::default()).unwrap();
    torn_then_rewritten(&l3, dir.path(), &[0, 10]).await;
}
