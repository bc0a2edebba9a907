//! A save that deduplicates against a chunk and a sweep that deletes it,
//! driven through one interleaving at a time with the store's pause points
//! (the order real threads hit only rarely).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use strata_format::codec::ElemHint;
use strata_format::ChunkId;

use super::{Inner, L1Store, Pause};
use crate::chunk_data::ChunkData;
use crate::io::EngineChoice;
use crate::store::ChunkPut;

const JOB: &str = "race";

/// A counter the two threads advance and wait on, so each pause point is
/// passed in the order the test names.
#[derive(Default)]
struct Stages {
    at: Mutex<u32>,
    moved: Condvar,
}

impl Stages {
    fn reach(&self, n: u32) {
        let mut at = self.at.lock().unwrap();
        *at = (*at).max(n);
        self.moved.notify_all();
    }

    fn wait(&self, n: u32) {
        let mut at = self.at.lock().unwrap();
        while *at < n {
            let (next, timeout) = self
                .moved
                .wait_timeout(at, Duration::from_secs(20))
                .unwrap();
            at = next;
            if timeout.timed_out() && *at < n {
                panic!("stage {n} never came (stuck at {})", *at);
            }
        }
    }
}

fn put(data: &[u8]) -> ChunkPut {
    ChunkPut {
        id: ChunkId::of(data),
        hint: ElemHint {
            size: 1,
            float: false,
        },
        data: ChunkData::copy_from(data),
    }
}

/// A store holding one chunk last touched an hour ago (past any grace).
fn store_with_old_chunk(data: &[u8]) -> (tempfile::TempDir, L1Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = L1Store::open(dir.path(), EngineChoice::Psync).unwrap();
    let st = store.inner.put_chunks(JOB, vec![put(data)]).unwrap();
    assert_eq!(st.written, 1);
    let path = store.chunk_path(JOB, &ChunkId::of(data));
    std::fs::File::open(&path)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    (dir, store)
}

/// The order open (save), move aside and find it old (sweep), touch
/// (save), delete (sweep): the save touched a file no longer at its name.
/// It must notice and write the chunk again, so the step it is saving
/// never names a deleted chunk.
#[test]
fn a_save_touching_a_chunk_the_sweep_moved_aside_writes_it_again() {
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    let id = ChunkId::of(&data);
    let (_dir, store) = store_with_old_chunk(&data);
    let stages = Arc::new(Stages::default());
    let hook = {
        let stages = stages.clone();
        move |at: Pause| match at {
            Pause::DedupOpened => {
                stages.reach(1);
                stages.wait(2);
            }
            Pause::SweepChecked => {
                stages.reach(2);
                stages.wait(3);
            }
            Pause::DedupTouched => stages.reach(3),
            Pause::SweepMovedAside | Pause::ReadAgain => {}
        }
    };
    *store.inner.pause.lock().unwrap() = Some(Arc::new(hook));

    let cutoff = SystemTime::now() - Duration::from_secs(600);
    let sweeper: Arc<Inner> = store.inner.clone();
    let at_open = stages.clone();
    let sweep = std::thread::spawn(move || {
        // The sweep starts once the save has opened the file.
        at_open.wait(1);
        sweeper.delete_if_old(JOB, &id, cutoff)
    });
    let saver: Arc<Inner> = store.inner.clone();
    let chunk = put(&data);
    let save = std::thread::spawn(move || saver.put_chunks(JOB, vec![chunk]));
    let stats = save.join().unwrap().unwrap();
    let deleted = sweep.join().unwrap().unwrap();

    assert_eq!(
        deleted,
        Some(data.len() as u64),
        "the sweep deleted the old file it had moved aside (the interleaving happened)"
    );
    let path = store.chunk_path(JOB, &id);
    let now_there = std::fs::read(&path);
    assert!(
        now_there.as_ref().is_ok_and(|b| b == &data),
        "the chunk the save reported durable is at {}: {:?}",
        path.display(),
        now_there.map(|b| b.len())
    );
    assert_eq!(
        (stats.written, stats.deduped),
        (1, 0),
        "written again, not counted as deduplicated"
    );
}

/// The order open, touch (save), move aside and check (sweep): the sweep
/// sees the fresh time and puts the file back; the save's dedup stands.
#[test]
fn a_save_touching_before_the_sweep_moves_it_keeps_its_dedup() {
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 13 % 241) as u8).collect();
    let id = ChunkId::of(&data);
    let (_dir, store) = store_with_old_chunk(&data);
    let st = store.inner.put_chunks(JOB, vec![put(&data)]).unwrap();
    assert_eq!((st.written, st.deduped), (0, 1));
    let cutoff = SystemTime::now() - Duration::from_secs(600);
    let deleted = store.inner.delete_if_old(JOB, &id, cutoff).unwrap();
    assert_eq!(deleted, None, "touched within the grace: kept");
    let back = std::fs::read(store.chunk_path(JOB, &id)).unwrap();
    assert_eq!(back, data);
}

/// A read while a sweep holds a young chunk aside (moved, age not checked
/// yet) finds no file at the chunk's name, yet the chunk stays: the read
/// waits for the sweep and returns the bytes, never `NotFound`.
#[test]
fn a_read_while_the_sweep_holds_a_young_chunk_aside_gets_the_chunk() {
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 % 251) as u8).collect();
    let id = ChunkId::of(&data);
    let dir = tempfile::tempdir().unwrap();
    let store = L1Store::open(dir.path(), EngineChoice::Psync).unwrap();
    store.inner.put_chunks(JOB, vec![put(&data)]).unwrap();
    let stages = Arc::new(Stages::default());
    let hook = {
        let stages = stages.clone();
        move |at: Pause| match at {
            // The sweep has it aside: let the reader look.
            Pause::SweepMovedAside => {
                stages.reach(1);
                stages.wait(2);
            }
            // The reader found it missing and waits for the sweep.
            Pause::ReadAgain => {
                stages.reach(2);
                stages.wait(3);
            }
            _ => {}
        }
    };
    *store.inner.pause.lock().unwrap() = Some(Arc::new(hook));
    // Young: the sweep puts it back.
    let cutoff = SystemTime::now() - Duration::from_secs(600);
    std::thread::scope(|sc| {
        let sweep = sc.spawn(|| store.inner.delete_if_old(JOB, &id, cutoff));
        let read = sc.spawn(|| {
            stages.wait(1);
            store.inner.get_chunks(JOB, &[id], Vec::new(), true)
        });
        assert_eq!(
            sweep.join().unwrap().unwrap(),
            None,
            "a young chunk is kept"
        );
        stages.reach(3);
        let got = read.join().unwrap();
        assert_eq!(got[0].as_ref().unwrap().as_slice(), &data[..]);
    });
}

/// A chunk really missing, with no sweep at work, is `NotFound` at once:
/// no pause, no second look beyond one more open.
#[test]
fn a_missing_chunk_with_no_sweep_is_not_found_without_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let store = L1Store::open(dir.path(), EngineChoice::Psync).unwrap();
    store.inner.put_chunks(JOB, vec![put(b"other")]).unwrap();
    let waits = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let hook = {
        let waits = waits.clone();
        move |at: Pause| {
            if at == Pause::ReadAgain {
                waits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    };
    *store.inner.pause.lock().unwrap() = Some(Arc::new(hook));
    let got = store
        .inner
        .get_chunks(JOB, &[ChunkId::of(b"absent")], Vec::new(), true);
    assert_eq!(
        got[0].as_ref().err().map(|e| e.kind()),
        Some(crate::StoreErrorKind::NotFound)
    );
    assert_eq!(waits.load(std::sync::atomic::Ordering::SeqCst), 0);
}
