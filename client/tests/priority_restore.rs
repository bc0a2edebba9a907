//! Priority restore: `restore_first` hands over the entries named first,
//! verified, and reads the rest behind them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use strata::format::DType;
use strata::{Checkpointer, Config, Entry, ErrorKind, StepSelector};

const MIB: usize = 1 << 20;

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    // xorshift64: no two entries (nor two chunks) share a 4 KiB run.
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(seed).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn open(dir: &std::path::Path) -> Arc<Checkpointer> {
    let cfg = Config::builder()
        .job("prio")
        .l1_dir(dir)
        .chunk_size(MIB as u32)
        .io_engine("psync");
    Arc::new(Checkpointer::new(cfg).unwrap())
}

/// Weights (2 MiB in two entries) and optimizer state twice their size.
fn state() -> Vec<(String, Vec<u8>)> {
    vec![
        ("model.embed".into(), bytes(MIB, 1)),
        ("model.head".into(), bytes(MIB, 2)),
        ("optim.exp_avg".into(), bytes(2 * MIB, 3)),
        ("optim.exp_avg_sq".into(), bytes(2 * MIB, 4)),
        ("model_ema.head".into(), bytes(MIB / 2, 5)),
    ]
}

/// Small entries of both parts, interleaved: the writer packs entries
/// under an eighth of a chunk together (packs of 128 KiB here), so most
/// packs hold weights and moments alike.
fn packed() -> Vec<(String, Vec<u8>)> {
    (0..24u8)
        .flat_map(|i| {
            [
                (format!("model.l{i}"), bytes(20 << 10, 10 + i)),
                (format!("optim.l{i}"), bytes(30 << 10, 40 + i)),
            ]
        })
        .collect()
}

fn save(ck: &Checkpointer, step: u64, st: &[(String, Vec<u8>)]) {
    let shapes: Vec<[u64; 1]> = st.iter().map(|(_, d)| [d.len() as u64]).collect();
    let entries: Vec<Entry<'_>> = st
        .iter()
        .zip(&shapes)
        .map(|((n, d), s)| Entry::tensor(n, DType::U8, s, d))
        .collect();
    ck.save(step, &entries).unwrap().wait().unwrap();
}

#[test]
fn the_first_entries_come_back_first_and_the_rest_at_wait() {
    let dir = tempfile::tempdir().unwrap();
    let ck = open(dir.path());
    let st = state();
    save(&ck, 4, &st);
    let p = ck.restore_first(StepSelector::Latest, &["model"]).unwrap();
    assert_eq!(p.first.step, 4);
    let names: Vec<&str> = p.first.entries.iter().map(|e| e.name.as_str()).collect();
    // "model" covers model.embed and model.head, not model_ema.head.
    assert_eq!(names, ["model.embed", "model.head"]);
    for e in &p.first.entries {
        let want = &st.iter().find(|(n, _)| *n == e.name).unwrap().1;
        assert_eq!(&e.bytes, want, "{}", e.name);
    }
    let first = p.first.stats.clone();
    assert_eq!(first.bytes_read, 2 * MIB as u64);
    let to_first = first.first_usable.expect("a priority restore's first part");
    let rest = p.wait().unwrap();
    let names: Vec<&str> = rest.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        ["optim.exp_avg", "optim.exp_avg_sq", "model_ema.head"]
    );
    for e in &rest.entries {
        let want = &st.iter().find(|(n, _)| *n == e.name).unwrap().1;
        assert_eq!(&e.bytes, want, "{}", e.name);
    }
    // The whole restore's counters: both parts, and both times.
    let total: u64 = st.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(rest.stats.bytes_read, total);
    assert_eq!(rest.stats.first_usable, Some(to_first));
    let m = ck.metrics_text();
    let value = |name: &str| {
        m.lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    assert_eq!(value("strata_restores_total").as_deref(), Some("1"));
    assert_eq!(value("strata_restores_failed_total").as_deref(), Some("0"));
}

#[test]
fn a_name_that_covers_nothing_is_refused_before_any_read() {
    let dir = tempfile::tempdir().unwrap();
    let ck = open(dir.path());
    save(&ck, 1, &state());
    // A typo beside a good name is refused too.
    for first in [
        &["mod"][..],
        &["optimizer"][..],
        &[][..],
        &["model", "optimzer"][..],
    ] {
        let e = ck
            .restore_first(StepSelector::Latest, first)
            .expect_err("nothing under it");
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    }
    // An exact name works, and the rest is everything else.
    let p = ck
        .restore_first(StepSelector::Step(1), &["optim.exp_avg_sq"])
        .unwrap();
    assert_eq!(p.first.entries.len(), 1);
    assert_eq!(p.wait().unwrap().entries.len(), 4);
}

#[test]
fn a_damaged_chunk_of_the_rest_fails_the_rest_only() {
    let dir = tempfile::tempdir().unwrap();
    let ck = open(dir.path());
    let st = state();
    save(&ck, 2, &st);
    // Damage the chunk holding the start of optim.exp_avg (L1 is the only
    // tier: nothing to repair it from).
    let needle = &st[2].1[..4096];
    let mut hit = None;
    for f in strata_testkit::files_under(&dir.path().join("prio")) {
        let b = std::fs::read(&f).unwrap();
        if let Some(at) = b.windows(needle.len()).position(|w| w == needle) {
            hit = Some((f, at));
        }
    }
    let (f, at) = hit.expect("the chunk file");
    let mut b = std::fs::read(&f).unwrap();
    b[at + 100] ^= 0xFF;
    std::fs::write(&f, b).unwrap();

    let mut p = ck
        .restore_first(StepSelector::Latest, &["model"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.first.entries[0].bytes, st[0].1);
    let t = std::time::Instant::now();
    while !p.is_done() {
        assert!(t.elapsed() < std::time::Duration::from_secs(30));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let e = p.wait().expect_err("the rest is damaged");
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    // A failure of the rest is counted as a failed restore.
    let m = ck.metrics_text();
    let failed = m
        .lines()
        .find(|l| l.starts_with("strata_restores_failed_total{"))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_string);
    assert_eq!(failed.as_deref(), Some("1"), "{m}");
}

#[test]
fn dropping_the_handle_stops_the_rest_and_lets_go_of_the_checkpointer() {
    let dir = tempfile::tempdir().unwrap();
    let ck = open(dir.path());
    // The rest is 128 chunks of 1 MiB: eight batches, of which the three
    // lanes have at most three in flight when the handle is dropped.
    let st = vec![
        ("model.w".to_string(), bytes(2 * MIB, 1)),
        ("optim.m".to_string(), bytes(64 * MIB, 2)),
        ("optim.v".to_string(), bytes(64 * MIB, 3)),
    ];
    save(&ck, 1, &st);
    let mut p = ck.restore_first(StepSelector::Latest, &["model"]).unwrap();
    assert_eq!(p.first.entries[0].bytes, st[0].1);
    assert!(
        !p.is_done(),
        "the rest (128 MiB) still runs when it is dropped"
    );
    drop(p);
    // The rest's thread ends and lets go of the checkpointer.
    let t = std::time::Instant::now();
    while Arc::strong_count(&ck) > 1 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "the rest still runs"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // It stopped before its end: no restore was counted as read (a whole
    // one counts every byte of both parts), nor as failed.
    let m = ck.metrics_text();
    let l1_bytes = m
        .lines()
        .find(|l| l.starts_with("strata_restore_bytes_total{") && l.contains("tier=\"l1\""))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_string);
    assert_eq!(l1_bytes.as_deref(), Some("0"), "{m}");
    let failed = m
        .lines()
        .find(|l| l.starts_with("strata_restores_failed_total{"))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_string);
    assert_eq!(failed.as_deref(), Some("0"));
    // The checkpointer serves the next restore whole.
    let again = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(again.entries.len(), 3);
    assert_eq!(again.entries[2].bytes, st[2].1);
}

#[test]
fn a_chunk_holding_entries_of_both_parts_is_read_once() {
    let dir = tempfile::tempdir().unwrap();
    let ck = open(dir.path());
    // One large entry of each part besides the packed ones.
    let mut st = packed();
    st.push(("model.big".into(), bytes(3 * MIB, 90)));
    st.push(("optim.big".into(), bytes(3 * MIB, 91)));
    save(&ck, 5, &st);
    let whole = ck.restore(StepSelector::Latest).unwrap().stats;
    assert!(whole.chunks > 0);
    let p = ck.restore_first(StepSelector::Latest, &["model"]).unwrap();
    for e in &p.first.entries {
        let want = &st.iter().find(|(n, _)| *n == e.name).unwrap().1;
        assert_eq!(&e.bytes, want, "{}", e.name);
    }
    assert_eq!(p.first.entries.len(), 25);
    let rest = p.wait().unwrap();
    assert_eq!(rest.entries.len(), 25);
    for e in &rest.entries {
        let want = &st.iter().find(|(n, _)| *n == e.name).unwrap().1;
        assert_eq!(&e.bytes, want, "{}", e.name);
    }
    // Each chunk was read once, by one of the two parts: the whole
    // priority restore read what a plain restore reads.
    assert_eq!(rest.stats.chunks, whole.chunks, "chunks read");
    assert_eq!(rest.stats.bytes_read, whole.bytes_read, "bytes read");
    let total: u64 = st.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(rest.stats.bytes_read, total);
}

#[test]
fn a_planned_read_in_two_parts_reads_each_chunk_once() {
    let dir = tempfile::tempdir().unwrap();
    let ck = open(dir.path());
    let mut st = packed();
    st.push(("optim.big".into(), bytes(3 * MIB, 91)));
    save(&ck, 6, &st);
    let plan = ck.plan_restore(StepSelector::Latest).unwrap();
    let whole = ck.restore(StepSelector::Latest).unwrap().stats;
    let (first_st, rest_st): (Vec<_>, Vec<_>) =
        st.iter().partition(|(n, _)| n.starts_with("model."));
    let mut first_bufs: Vec<Vec<u8>> = first_st.iter().map(|(_, d)| vec![0; d.len()]).collect();
    let mut rest_bufs: Vec<Vec<u8>> = rest_st.iter().map(|(_, d)| vec![0; d.len()]).collect();
    let first_names: Vec<&str> = first_st.iter().map(|(n, _)| n.as_str()).collect();
    let a = {
        let mut first: Vec<(&str, &mut [u8])> = first_st
            .iter()
            .zip(first_bufs.iter_mut())
            .map(|((n, _), b)| (n.as_str(), b.as_mut_slice()))
            .collect();
        let mut rest: Vec<(&str, &mut [u8])> = rest_st
            .iter()
            .zip(rest_bufs.iter_mut())
            .map(|((n, _), b)| (n.as_str(), b.as_mut_slice()))
            .collect();
        ck.restore_planned_first(&plan, &mut first, &mut rest)
            .unwrap()
    };
    for ((n, d), b) in first_st.iter().zip(&first_bufs) {
        assert_eq!(b, d, "{n}");
    }
    // Some of the rest is in place already: the moments packed beside
    // the weights.
    let early = rest_st
        .iter()
        .zip(&rest_bufs)
        .filter(|((_, d), b)| *b == d)
        .count();
    assert!(
        early > 0 && early < rest_st.len(),
        "{early} of the rest read early"
    );
    let b = {
        let mut rest: Vec<(&str, &mut [u8])> = rest_st
            .iter()
            .zip(rest_bufs.iter_mut())
            .map(|((n, _), b)| (n.as_str(), b.as_mut_slice()))
            .collect();
        ck.restore_planned_rest(&plan, &mut rest, &first_names)
            .unwrap()
    };
    for ((n, d), b) in rest_st.iter().zip(&rest_bufs) {
        assert_eq!(b, d, "{n}");
    }
    assert_eq!(a.chunks + b.chunks, whole.chunks);
    assert_eq!(a.bytes_read + b.bytes_read, whole.bytes_read);
    // A name read now and named as read before is refused (its bytes
    // would be left as the buffer held them).
    let mut z = vec![0u8; 30 << 10];
    let e = ck
        .restore_planned_rest(&plan, &mut [("optim.l0", &mut z)], &["optim.l0"])
        .expect_err("one entry in both parts");
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    // A name in both lists of the first part is refused.
    let mut x = vec![0u8; 20 << 10];
    let mut y = vec![0u8; 20 << 10];
    let e = ck
        .restore_planned_first(
            &plan,
            &mut [("model.l0", &mut x)],
            &mut [("model.l0", &mut y)],
        )
        .expect_err("one entry, two buffers");
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

#[test]
fn a_packed_priority_restore_from_l3_writes_every_chunk_back_to_l1_once() {
    let (l1, l3) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let cfg = || {
        Config::builder()
            .job("prio-l3")
            .l1_dir(l1.path())
            .chunk_size(MIB as u32)
            .io_engine("psync")
            .l3_url(format!("file://{}", l3.path().display()))
            .upload_every(1)
    };
    let mut st = packed();
    st.push(("optim.big".into(), bytes(3 * MIB, 91)));
    {
        let ck = Checkpointer::new(cfg()).unwrap();
        save(&ck, 3, &st);
        ck.wait_uploads();
    }
    // The node lost its disk: only L3 holds step 3.
    std::fs::remove_dir_all(l1.path()).unwrap();
    let ck = Arc::new(Checkpointer::new(cfg()).unwrap());
    let p = ck.restore_first(StepSelector::Latest, &["model"]).unwrap();
    assert_eq!(p.first.entries.len(), 24);
    let rest = p.wait().unwrap();
    for e in &rest.entries {
        let want = &st.iter().find(|(n, _)| *n == e.name).unwrap().1;
        assert_eq!(&e.bytes, want, "{}", e.name);
    }
    let total: u64 = st.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(rest.stats.bytes_read, total, "each chunk read once");
    assert_eq!(rest.stats.bytes_from_l3, total);
    // Both parts' chunks were written back: the step is whole on L1 and
    // committed there, and the next restore reads L1 alone.
    assert!(rest.stats.rehydrated);
    assert_eq!(ck.committed_steps().unwrap(), vec![3]);
    let again = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(again.stats.bytes_from_l3, 0);
    assert_eq!(again.stats.chunks, rest.stats.chunks);
    for e in &again.entries {
        let want = &st.iter().find(|(n, _)| *n == e.name).unwrap().1;
        assert_eq!(&e.bytes, want, "{}", e.name);
    }
}
