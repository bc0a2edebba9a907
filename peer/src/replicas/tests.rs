//! Unit tests of [`Replicas`](super::Replicas): budgets, spill, deletes.
use super::*;
use strata_format::codec::{ElemHint, EncodeOptions};
use strata_format::frame::encode_frame;

fn frame(data: &[u8]) -> Bytes {
    encode_frame(data, ElemHint::BYTES, EncodeOptions::RAW)
        .unwrap()
        .into()
}

#[test]
fn budgets_spill_then_refuse_and_bad_frames_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let r = Replicas::new(
        &dir.path().join("spill"),
        Limits {
            memory_bytes: 3000,
            disk_bytes: 3000,
            ..Limits::default()
        },
    )
    .unwrap();
    let chunks: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 1000]).collect();
    let mut placed = 0;
    for c in &chunks {
        match r.put_chunk("j", ChunkId::of(c), frame(c)) {
            Ok(new) => {
                assert!(new);
                placed += 1;
            }
            Err(e) => assert_eq!(e.kind(), strata_tiered::StoreErrorKind::NoSpace, "{e}"),
        }
    }
    // Two fit in memory, two more on disk, the fifth is refused.
    assert_eq!(placed, 4);
    let (mem, disk, n, jobs) = r.stats().unwrap();
    assert!(mem <= 3000 && disk <= 3000 && disk > 0, "{mem} {disk}");
    assert_eq!((n, jobs), (4, 1));
    for c in &chunks[..4] {
        let f = r.get_frame("j", &ChunkId::of(c)).unwrap();
        assert_eq!(f.as_ref(), &frame(c)[..]);
    }
    assert_eq!(
        r.get_range("j", &ChunkId::of(&chunks[3]), 10, 20).unwrap(),
        vec![3u8; 10]
    );
    // Idempotent; a frame that is not its id; garbage.
    assert!(!r
        .put_chunk("j", ChunkId::of(&chunks[0]), frame(&chunks[0]))
        .unwrap());
    let e = r
        .put_chunk("j", ChunkId::of(b"other"), frame(&chunks[4]))
        .unwrap_err();
    assert_eq!(e.kind(), strata_tiered::StoreErrorKind::Corrupt);
    let e = r
        .put_chunk("j", ChunkId::of(b"x"), Bytes::from_static(&[1, 2, 3]))
        .unwrap_err();
    assert_eq!(e.kind(), strata_tiered::StoreErrorKind::Corrupt);
    // Deleting gives the space back.
    let ids: Vec<ChunkId> = chunks.iter().map(|c| ChunkId::of(c)).collect();
    r.delete_chunks("j", &ids).unwrap();
    assert_eq!(r.stats().unwrap(), (0, 0, 0, 0));
}

/// Retention's re-check at deletion: a chunk planned for the sweep but
/// deduplicated against (found present) or put again after the plan
/// survives; one left alone goes, memory and spilled alike.
#[test]
fn a_chunk_touched_after_the_plan_survives_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let r = Replicas::new(
        &dir.path().join("spill"),
        Limits {
            memory_bytes: 1000,
            disk_bytes: 10_000,
            ..Limits::default()
        },
    )
    .unwrap();
    let chunks: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 900]).collect();
    let ids: Vec<ChunkId> = chunks.iter().map(|c| ChunkId::of(c)).collect();
    for (c, id) in chunks.iter().zip(&ids) {
        assert!(r.put_chunk("j", *id, frame(c)).unwrap());
    }
    let (_, disk, _, _) = r.stats().unwrap();
    assert!(disk > 0, "some chunks spilled");
    // The plan: every chunk is old enough.
    std::thread::sleep(Duration::from_millis(5));
    let cutoff = Instant::now();
    std::thread::sleep(Duration::from_millis(5));
    // Meanwhile a client finds chunk 1 present and puts chunk 3 again.
    assert_eq!(r.has("j", &ids[1..2]).unwrap(), [true]);
    assert!(!r.put_chunk("j", ids[3], frame(&chunks[3])).unwrap());
    let (gone, _) = r.delete_untouched_since("j", &ids, cutoff).unwrap();
    assert_eq!(gone, 2);
    assert_eq!(r.has("j", &ids).unwrap(), [false, true, false, true]);
    for i in [1, 3] {
        assert_eq!(
            r.get_frame("j", &ids[i]).unwrap().as_ref(),
            &frame(&chunks[i])[..]
        );
    }
    // Nothing touched since a later cutoff: the rest goes.
    let (gone, bytes) = r.delete_untouched_since("j", &ids, Instant::now()).unwrap();
    assert_eq!(gone, 2);
    assert_eq!(bytes, 2 * frame(&chunks[0]).len() as u64);
    assert_eq!(r.stats().unwrap(), (0, 0, 0, 0));
}
