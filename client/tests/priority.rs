//! `background_nice` reaches the threads it names: the persist worker,
//! the runtime's threads (and with L3, the uploader) run at the background
//! priority; the caller's thread, where `save`'s snapshot runs, keeps its
//! own; 0 lowers nothing. Read from `/proc/self/task/*/stat`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use strata::format::DType;
use strata::{Checkpointer, Config, Entry};

/// (thread name, nice) of every thread of this process.
fn threads() -> Vec<(String, i32)> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| {
            let stat = std::fs::read_to_string(e.ok()?.path().join("stat")).ok()?;
            let (head, rest) = stat.rsplit_once(')')?;
            let name = head.split_once('(')?.1.to_string();
            // After the name: state is field 3 of stat(5), nice field 19.
            let nice = rest.split_whitespace().nth(16)?.parse().ok()?;
            Some((name, nice))
        })
        .collect()
}

fn this_thread_nice() -> i32 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    rest.split_whitespace().nth(16).unwrap().parse().unwrap()
}

fn nice_of(name: &str) -> Vec<i32> {
    threads()
        .into_iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v)
        .collect()
}

fn saved(nice: u8) -> (Vec<i32>, Vec<i32>, Vec<i32>, i32) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("l3")).unwrap();
    let mut cfg = Config::builder()
        .job("nice")
        .l1_dir(dir.path().join("l1"))
        .l3_url(format!("file://{}", dir.path().join("l3").display()))
        .upload_every(1);
    cfg.background_nice = nice;
    let ck = Checkpointer::new(cfg).unwrap();
    let w = vec![3u8; 1 << 20];
    ck.save(1, &[Entry::tensor("w", DType::U8, &[1 << 20], &w)])
        .unwrap()
        .wait()
        .unwrap();
    ck.wait_uploads();
    let got = (
        nice_of("strata-persist"),
        nice_of("strata-rt"),
        nice_of("strata-upload"),
        this_thread_nice(),
    );
    drop(ck);
    // The runtime's threads end shortly after it is dropped.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !nice_of("strata-rt").is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    got
}

#[test]
fn background_threads_run_at_background_nice_and_the_caller_keeps_its_own() {
    // One test, so no other test's threads of the same names interfere.
    let base = this_thread_nice();
    let (persist, rt, upload, caller) = saved(10);
    let low = base.max(10);
    assert_eq!(persist, [low], "the persist worker");
    assert!(!rt.is_empty() && rt.iter().all(|&n| n == low), "{rt:?}");
    assert_eq!(upload, [low], "the uploader");
    assert_eq!(caller, base, "the caller's thread, where the snapshot runs");
    let (persist, rt, upload, _) = saved(0);
    assert_eq!(persist, [base]);
    assert!(rt.iter().all(|&n| n == base), "{rt:?}");
    assert_eq!(upload, [base]);
}
