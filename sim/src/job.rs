//! The simulated job: every rank a real [`Checkpointer`] on a thread of
//! its own, with an in-memory disk that outlives its process; one shared
//! in-memory L3. The job runs in epochs: each starts every rank afresh,
//! restores, then saves steps until a node dies (then the job restarts)
//! or the last step. After every phase the outcomes are checked: a step
//! commits or fails on all live ranks alike, and a restore picks the
//! newest decided step on every rank, with its bytes intact.

use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use strata::format::DType;
use strata::tiered::wrap::OpFamily;
use strata::tiered::{ChunkStore, MemoryStore, MetricsStore};
use strata::{
    Checkpointer, Config, Coordinator, Entry, Error, EtcdCoordinator, EtcdOptions,
    InProcessCoordinator, StepSelector,
};
use strata_testkit::etcd::Etcd;

use crate::faults::{self, Fault, RoundTimes, Script, Scripted};
use crate::report::Report;

/// How ranks agree in the simulation.
pub enum Coord<'a> {
    /// One [`InProcessCoordinator`] for every rank.
    InProcess,
    /// A real etcd; each node's ranks share one [`EtcdCoordinator`]
    /// ([`EtcdCoordinator::connect_node`]). The simulation restarts it
    /// when a fault says so.
    Etcd(&'a mut Etcd),
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Ranks.
    pub ranks: u32,
    /// Ranks per node (the last node may have fewer).
    pub per_node: u32,
    /// Steps to save (1..=steps).
    pub steps: u64,
    /// Seed of the faults: a run is replayed from it.
    pub seed: u64,
    /// Faults to inject ([`faults::plan`]).
    pub faults: usize,
    /// Coordination timeout (what a round waits for a rank that never
    /// comes: the in-process coordinator sees no death sooner).
    pub timeout_secs: u64,
    /// etcd lease of each node (a dead node is seen within it).
    pub lease_secs: u64,
    /// Bytes each rank saves per step.
    pub bytes: usize,
    /// Upload every step to the shared L3 (L3 is listed at every restore
    /// either way). Every rank's catalog then holds every rank's records
    /// on L3: memory that grows with the world squared.
    pub upload: bool,
    /// Print each phase and its time on stderr.
    pub verbose: bool,
    /// Agree by all-gather, every rank reading every value (the protocol
    /// before `all_reduce`; etcd needs one rank per node for it).
    pub gather: bool,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            ranks: 64,
            per_node: 8,
            steps: 10,
            seed: 1,
            faults: 0,
            timeout_secs: 30,
            lease_secs: 5,
            bytes: 4096,
            upload: true,
            verbose: false,
            gather: false,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Cmd {
    Restore,
    Save(u64),
    End,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Pending,
    Restored(u64),
    Nothing,
    Saved,
    Failed(String),
}

struct Shared {
    phase: Barrier,
    cmd: Mutex<Cmd>,
    outcomes: Mutex<Vec<Outcome>>,
    bytes: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Rank `rank`'s bytes at `step`: every restore is checked against them.
pub fn state(rank: u32, step: u64, bytes: usize) -> Vec<u8> {
    let seed = (u64::from(rank) << 32) ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..bytes)
        .map(|i| (seed.rotate_left((i % 64) as u32) as u8) ^ (i as u8))
        .collect()
}

/// One rank's life in an epoch: follows the phases until `End`.
fn rank_main(sh: &Shared, rank: u32, ck: strata::Result<Checkpointer>) {
    let shape = [sh.bytes as u64];
    loop {
        sh.phase.wait();
        let cmd = *lock(&sh.cmd);
        let outcome = match (cmd, &ck) {
            (Cmd::End, _) => break,
            (_, Err(e)) => Outcome::Failed(format!("could not start: {e}")),
            (Cmd::Restore, Ok(ck)) => match ck.restore(StepSelector::Latest) {
                Ok(st) => {
                    let want = state(rank, st.step, sh.bytes);
                    if st.get("w").map(|e| &e.bytes) == Some(&want) {
                        Outcome::Restored(st.step)
                    } else {
                        Outcome::Failed(format!("step {} restored with wrong bytes", st.step))
                    }
                }
                Err(Error::NothingToRestore(_)) => Outcome::Nothing,
                Err(e) => Outcome::Failed(e.to_string()),
            },
            (Cmd::Save(step), Ok(ck)) => {
                let data = state(rank, step, sh.bytes);
                let entries = [Entry::tensor("w", DType::U8, &shape, &data)];
                match ck.save(step, &entries).and_then(|h| h.wait()) {
                    Ok(_) => Outcome::Saved,
                    Err(e) => Outcome::Failed(e.to_string()),
                }
            }
        };
        lock(&sh.outcomes)[rank as usize] = outcome;
        sh.phase.wait();
    }
}

/// One phase: every rank runs `cmd`; returns the outcomes by rank and
/// how long the slowest took.
fn phase(sh: &Shared, cmd: Cmd) -> (Vec<Outcome>, Duration) {
    *lock(&sh.cmd) = cmd;
    lock(&sh.outcomes).fill(Outcome::Pending);
    let t0 = Instant::now();
    sh.phase.wait();
    if matches!(cmd, Cmd::End) {
        return (Vec::new(), Duration::ZERO);
    }
    sh.phase.wait();
    (lock(&sh.outcomes).clone(), t0.elapsed())
}

fn say(plan: &Plan, what: std::fmt::Arguments<'_>) {
    if plan.verbose {
        eprintln!("{what}");
    }
}

/// The ranks of `node`.
fn node_ranks(plan: &Plan, node: u32) -> std::ops::Range<u32> {
    let first = node * plan.per_node;
    first..(first + plan.per_node).min(plan.ranks)
}

/// Runs the simulation; an error says which check failed (a split
/// commit, a disagreeing restore, wrong bytes, no progress).
pub fn run(plan: &Plan, mut coord: Coord<'_>) -> Result<Report, String> {
    if plan.ranks == 0 || plan.per_node == 0 || plan.steps == 0 {
        return Err("ranks, per_node and steps must be positive".into());
    }
    let nodes = plan.ranks.div_ceil(plan.per_node);
    let node_of = |r: u32| r / plan.per_node;
    let etcd = matches!(coord, Coord::Etcd(_));
    let job = format!("sim-{}-{}", plan.ranks, plan.seed);
    let dir = std::env::temp_dir().join(format!("strata-sim-{}", std::process::id()));
    let disks: Vec<Arc<MemoryStore>> = (0..plan.ranks).map(|_| Arc::default()).collect();
    let l3 = Arc::new(MetricsStore::new(MemoryStore::new()));
    let lists = || l3.snapshot().family(OpFamily::List).ops;
    let injected = faults::plan(plan.seed, plan.steps, nodes, plan.faults, etcd);
    let mut used = vec![false; injected.len()];
    let mut report = Report {
        ranks: plan.ranks,
        nodes,
        faults: injected.clone(),
        ..Report::default()
    };
    let mut decided: Option<u64> = None;
    let mut restore_fault: Option<u32> = None;
    let mut keepalives = 0u64;
    widen_futex_hash(plan.ranks);
    // Every rank's checkpointer drives its tier calls on this one runtime
    // (its own would cost each rank a thread and four file descriptors:
    // 16,384 ranks would pass the process's descriptor limit).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sim-rt")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the ranks' runtime: {e}"))?;
    let started = Instant::now();
    loop {
        report.epochs += 1;
        if u64::from(report.epochs) > 2 * plan.steps + 10 {
            return Err(format!(
                "no progress after {} starts of the job",
                report.epochs
            ));
        }
        let scripts: Vec<Arc<Script>> = (0..nodes).map(|_| Arc::default()).collect();
        let t_c = Instant::now();
        let (inner, node_coords) = coordinators(plan, &coord, &job, nodes)?;
        say(
            plan,
            format_args!(
                "start {}: {} nodes connected in {:?}",
                report.epochs,
                node_coords.len(),
                t_c.elapsed()
            ),
        );
        let times = Arc::new(RoundTimes::default());
        let coords: Vec<Arc<dyn Coordinator>> = (0..plan.ranks)
            .map(|r| {
                Arc::new(Scripted {
                    inner: inner[r as usize].clone(),
                    script: scripts[node_of(r) as usize].clone(),
                    times: times.clone(),
                    gather: plan.gather,
                }) as Arc<dyn Coordinator>
            })
            .collect();
        let requests = || {
            node_coords
                .iter()
                .map(|c| {
                    if plan.gather {
                        // The all-gather's requests are not counted apart.
                        c.requests().saturating_sub(c.keepalive_requests())
                    } else {
                        c.round_requests()
                    }
                })
                .sum::<u64>()
        };
        let received = || node_coords.iter().map(|c| c.received_bytes()).sum::<u64>();
        let sh = Shared {
            phase: Barrier::new(plan.ranks as usize + 1),
            cmd: Mutex::new(Cmd::Restore),
            outcomes: Mutex::new(vec![Outcome::Pending; plan.ranks as usize]),
            bytes: plan.bytes,
        };
        // One L3 for the job: a restore lists it on rank 0 only (the
        // product's own sharing, `restore::shared_l3`).
        let l3_store: Arc<dyn ChunkStore> = l3.clone();
        let mut done = false;
        let mut t_end = Instant::now();
        let epoch: Result<(), String> = std::thread::scope(|s| {
            for r in 0..plan.ranks {
                let (sh, coord, disk, l3, rt) = (
                    &sh,
                    coords[r as usize].clone(),
                    disks[r as usize].clone(),
                    l3_store.clone(),
                    rt.handle().clone(),
                );
                let mut cfg = Config::builder()
                    .job(job.as_str())
                    .rank(r, plan.ranks)
                    .l1_dir(&dir)
                    .keep_last(3)
                    .coordination_timeout_secs(plan.timeout_secs)
                    .upload_every(u64::from(plan.upload));
                // L3 is never collected here: rank 0 collects it for the
                // job after its uploads (one listing each), a cost of the
                // uploader's, not of the protocol's rounds.
                cfg.l3_keep_last = 0;
                std::thread::Builder::new()
                    .name(format!("rank-{r}"))
                    .spawn_scoped(s, move || {
                        let ck = Checkpointer::builder(cfg)
                            .coordinator(coord)
                            .local(disk)
                            .remote(Some(l3))
                            .runtime(rt)
                            .build();
                        rank_main(sh, r, ck);
                    })
                    .map_err(|e| format!("cannot start rank {r}: {e}"))?;
            }
            let r = run_epoch(
                plan,
                &sh,
                &mut coord,
                &scripts,
                &job,
                EpochState {
                    decided: &mut decided,
                    restore_fault: &mut restore_fault,
                    injected: &injected,
                    used: &mut used,
                    report: &mut report,
                    done: &mut done,
                    requests: &requests,
                    received: &received,
                    lists: &lists,
                    times: &times,
                },
            );
            phase(&sh, Cmd::End);
            t_end = Instant::now();
            r
        });
        say(
            plan,
            format_args!("  every rank ended in {:?}", t_end.elapsed()),
        );
        keepalives += node_coords
            .iter()
            .map(|c| c.keepalive_requests())
            .sum::<u64>();
        drop(coords);
        drop(inner);
        drop(node_coords);
        epoch?;
        if done {
            break;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    report.keepalives_per_node_s =
        keepalives as f64 / f64::from(nodes) / started.elapsed().as_secs_f64().max(1e-9);
    Ok(report)
}

/// Gives the process a futex hash table sized for its threads. Linux 6.16
/// and later give a process its own table sized by the CPUs (16 buckets on
/// 2 CPUs); with tens of thousands of threads blocked on locks, each wake
/// walks a chain of thousands of waiters, and the simulation measures the
/// kernel's hash instead of the protocol (75% of the CPU went to
/// `futex_wake` at 16,384 ranks). A real rank is a process of a few
/// threads on a node of many CPUs, where this does not arise. The table
/// only grows (a later, smaller run keeps it); on an older kernel the
/// calls fail and change nothing (the global table is used).
fn widen_futex_hash(ranks: u32) {
    const PR_FUTEX_HASH: libc::c_int = 78;
    const PR_FUTEX_HASH_SET_SLOTS: libc::c_ulong = 1;
    const PR_FUTEX_HASH_GET_SLOTS: libc::c_ulong = 2;
    // About four threads per simulated rank, up to 131,072 buckets.
    let slots = (u64::from(ranks) * 4)
        .next_power_of_two()
        .clamp(16, 1 << 17);
    // SAFETY: prctl with integer arguments only; it reads and writes no
    // memory of ours.
    let now = unsafe {
        libc::prctl(
            PR_FUTEX_HASH,
            PR_FUTEX_HASH_GET_SLOTS,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if now < 0 || now as u64 >= slots {
        return;
    }
    // SAFETY: as above.
    let _ = unsafe {
        libc::prctl(
            PR_FUTEX_HASH,
            PR_FUTEX_HASH_SET_SLOTS,
            slots as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
}

type Coordinators = (Vec<Arc<dyn Coordinator>>, Vec<Arc<EtcdCoordinator>>);

/// The real coordinators of one epoch, by rank (and the node ones).
fn coordinators(
    plan: &Plan,
    coord: &Coord<'_>,
    job: &str,
    nodes: u32,
) -> Result<Coordinators, String> {
    match coord {
        Coord::InProcess => {
            let c = InProcessCoordinator::new(plan.ranks);
            Ok((
                (0..plan.ranks)
                    .map(|_| Arc::new(c.clone()) as Arc<dyn Coordinator>)
                    .collect(),
                Vec::new(),
            ))
        }
        Coord::Etcd(e) => {
            let opts = EtcdOptions {
                endpoints: vec![e.url.clone()],
                lease_ttl: Duration::from_secs(plan.lease_secs),
                ..EtcdOptions::default()
            };
            // Nodes connect in parallel, as they would.
            let node_list: Vec<u32> = (0..nodes).collect();
            let mut conns: Vec<Arc<EtcdCoordinator>> = Vec::with_capacity(nodes as usize);
            for chunk in node_list.chunks(64) {
                let got: Vec<strata::Result<Arc<EtcdCoordinator>>> = std::thread::scope(|s| {
                    let hs: Vec<_> = chunk
                        .iter()
                        .map(|&n| {
                            let opts = opts.clone();
                            s.spawn(move || {
                                EtcdCoordinator::connect_node(
                                    opts,
                                    job,
                                    node_ranks(plan, n),
                                    plan.ranks,
                                )
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| {
                            h.join().unwrap_or_else(|_| {
                                Err(Error::Coordination("connect panicked".into()))
                            })
                        })
                        .collect()
                });
                for c in got {
                    conns.push(c.map_err(|e| format!("a node could not connect: {e}"))?);
                }
            }
            let mut ranks: Vec<Arc<dyn Coordinator>> = Vec::with_capacity(plan.ranks as usize);
            for c in &conns {
                if c.ranks().len() == 1 {
                    // A process of one rank: the coordinator itself (its
                    // all-gather is the per-rank one).
                    ranks.push(c.clone());
                    continue;
                }
                for r in c.ranks() {
                    ranks.push(Arc::new(c.rank_handle(r).map_err(|e| e.to_string())?));
                }
            }
            Ok((ranks, conns))
        }
    }
}

/// What an epoch reads and updates of the run.
struct EpochState<'a> {
    decided: &'a mut Option<u64>,
    restore_fault: &'a mut Option<u32>,
    injected: &'a [faults::Injected],
    used: &'a mut [bool],
    report: &'a mut Report,
    done: &'a mut bool,
    requests: &'a dyn Fn() -> u64,
    received: &'a dyn Fn() -> u64,
    lists: &'a dyn Fn() -> u64,
    times: &'a RoundTimes,
}

/// The phases of one epoch, checked as they end.
fn run_epoch(
    plan: &Plan,
    sh: &Shared,
    coord: &mut Coord<'_>,
    scripts: &[Arc<Script>],
    job: &str,
    st: EpochState<'_>,
) -> Result<(), String> {
    use std::sync::atomic::Ordering::SeqCst;
    let node_of = |r: u32| (r / plan.per_node) as usize;
    let dead = |r: u32| scripts[node_of(r)].dead.load(SeqCst);
    let kill = |coord: &mut Coord<'_>, node: u32| {
        // The node's process dies: its lease goes with it (at once, as
        // if the lease had run out).
        if let Coord::Etcd(e) = coord {
            e.revoke_claim(job, node * plan.per_node);
        }
    };
    // Restore.
    let dying = st.restore_fault.take();
    if let Some(node) = dying {
        scripts[node as usize].die_in_restore.store(true, SeqCst);
    }
    let lists0 = (st.lists)();
    let requests0 = (st.requests)();
    let restart = st.decided.is_some();
    st.times.take("");
    let (outs, took) = std::thread::scope(|s| {
        if let (Some(node), Coord::Etcd(e)) = (dying, &*coord) {
            // The node's lease goes a moment after the others saw it
            // (one that died before anyone saw it is waited for until
            // the timeout: it may still be starting).
            let e: &Etcd = e;
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(1000));
                e.revoke_claim(job, node * plan.per_node);
            });
        }
        phase(sh, Cmd::Restore)
    });
    say(
        plan,
        format_args!(
            "  restore: {took:?} (its rounds: {:?})",
            st.times.peek("restore/")
        ),
    );
    let lists = (st.lists)() - lists0;
    let live: Vec<(u32, &Outcome)> = (0..plan.ranks)
        .filter(|&r| !dead(r))
        .map(|r| (r, &outs[r as usize]))
        .collect();
    if live.len() < plan.ranks as usize {
        // A node died in the agreement: no rank may restore.
        if let Some((r, o)) = live.iter().find(|(_, o)| !matches!(o, Outcome::Failed(_))) {
            return Err(format!(
                "a node died in the restore agreement, yet rank {r} went on: {o:?}"
            ));
        }
        return Ok(());
    }
    let want = match *st.decided {
        Some(s) => Outcome::Restored(s),
        None => Outcome::Nothing,
    };
    if let Some((r, o)) = live.iter().find(|(_, o)| **o != want) {
        return Err(format!(
            "restore: rank {r} got {o:?}, every rank must get {want:?} (the newest decided step)"
        ));
    }
    st.report.restore_phase_ms.push(took.as_secs_f64() * 1e3);
    let agreement = st.times.take("restore/").as_secs_f64() * 1e3;
    st.report.restore_ms.push(agreement);
    st.report.restore_lists.push(lists);
    if restart {
        st.report.restart_restore_ms.push(agreement);
        st.report
            .restart_restore_requests
            .push(((st.requests)() - requests0) as f64);
    }
    let first = st.decided.map_or(1, |s| s + 1);
    if first > plan.steps {
        *st.done = true;
        return Ok(());
    }
    for step in first..=plan.steps {
        let mut fault = None;
        for (i, f) in st.injected.iter().enumerate() {
            if f.step == step && !st.used[i] {
                st.used[i] = true;
                fault = Some(*f);
            }
        }
        let script = fault.map(|f| scripts[f.node as usize].clone());
        match (fault.map(|f| f.fault), &script) {
            (Some(Fault::DiesBeforeVote), Some(s)) => {
                s.die_before_vote.store(true, SeqCst);
                if let Some(f) = fault {
                    kill(coord, f.node);
                }
            }
            (Some(Fault::DiesAfterVote), Some(s)) => s.die_after_vote.store(true, SeqCst),
            (Some(Fault::Slow(ms)), Some(s)) => s.slow_ms.store(ms, SeqCst),
            (Some(Fault::EtcdRestart), _) => {
                if let Coord::Etcd(e) = coord {
                    e.restart(Duration::from_millis(300));
                }
            }
            _ => {}
        }
        let r0 = (st.requests)();
        let b0 = (st.received)();
        st.times.take("");
        let (outs, took) = phase(sh, Cmd::Save(step));
        say(
            plan,
            format_args!(
                "  step {step}: {took:?} (its barrier: {:?}){}",
                st.times.peek("commit/"),
                fault.map_or(String::new(), |f| format!(
                    " ({:?} on node {})",
                    f.fault, f.node
                ))
            ),
        );
        let requests = (st.requests)() - r0;
        let received = (st.received)() - b0;
        if let Some(s) = &script {
            s.slow_ms.store(0, SeqCst);
        }
        let live: Vec<(u32, &Outcome)> = (0..plan.ranks)
            .filter(|&r| !dead(r))
            .map(|r| (r, &outs[r as usize]))
            .collect();
        let saved = live.iter().filter(|(_, o)| **o == Outcome::Saved).count();
        if saved != 0 && saved != live.len() {
            let (r, o) = live
                .iter()
                .find(|(_, o)| **o != Outcome::Saved)
                .map(|(r, o)| (*r, (*o).clone()))
                .unwrap_or((0, Outcome::Pending));
            return Err(format!(
                "step {step} split: {saved} of {} live ranks committed, rank {r} did not: {o:?}",
                live.len()
            ));
        }
        let died = live.len() < plan.ranks as usize;
        match fault.map(|f| f.fault) {
            Some(Fault::DiesBeforeVote) if saved != 0 => {
                return Err(format!(
                    "step {step} committed without the votes of a node that died before voting"
                ));
            }
            Some(Fault::DiesAfterVote) if saved == 0 => {
                return Err(format!(
                    "step {step}: every rank voted yes, yet it failed: {:?}",
                    live.first()
                ));
            }
            _ => {}
        }
        if saved > 0 {
            *st.decided = Some(step);
            st.report.committed += 1;
            if fault.is_none() {
                st.report.save_phase_ms.push(took.as_secs_f64() * 1e3);
                st.report
                    .step_ms
                    .push(st.times.take("commit/").as_secs_f64() * 1e3);
                st.report.round_requests.push(requests as f64);
                st.report.round_bytes.push(received as f64);
            }
        } else {
            st.report.failed += 1;
            if fault.is_none() {
                st.report.failed_unfaulted += 1;
                eprintln!(
                    "step {step} failed with no fault injected: {:?}",
                    live.first()
                );
            }
        }
        if let Some(f) = fault.filter(|f| f.fault == Fault::DiesAfterVote) {
            kill(coord, f.node);
        }
        if died {
            return Ok(());
        }
        if let Some(f) = fault.filter(|f| f.fault == Fault::DiesInRestore) {
            // Preempted after this step; the next start loses a node in
            // its restore.
            *st.restore_fault = Some(f.node);
            return Ok(());
        }
    }
    Ok(())
}
