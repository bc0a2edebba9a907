//! The node's leader: when a node's ranks are separate processes (one per
//! GPU, as torchrun and srun start them), the process of local rank 0
//! claims all of the node's ranks in etcd and the others reach it over a
//! local socket ([`super::node_member`]). Their values join its reducing
//! rounds as if their ranks ran on its threads, so a round costs etcd a
//! few requests per node, not per rank.
//!
//! The socket is in Linux's abstract namespace (no file to leave behind;
//! one namespace per network namespace, as a node has), and only a process
//! of the same user is served. A member that ends without saying goodbye
//! (killed, crashed) ends the node: every round of it fails and its claims
//! go at once, as a dead process's would, so the other nodes never wait
//! for a rank that cannot answer.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::wire::{self, Hello, ToLeader, ToMember, WireError};
use super::{poisoned, EtcdCoordinator};
use crate::error::{Error, Result};

/// Rounds one member may have open at once (a checkpointer runs one or
/// two); more is a misbehaving process.
const MAX_OPEN_ROUNDS: usize = 64;

/// Longest round a member may ask for.
const MAX_ROUND: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a connecting process has to introduce itself.
const HELLO_WITHIN: Duration = Duration::from_secs(10);

/// Connections that have not said their hello yet, beyond the node's
/// own ranks: more are closed at once (a process of this user opening
/// them in a loop), so they cost neither a thread nor a hello's buffer.
const SPARE_GREETINGS: usize = 8;

/// Largest hello (a job id, a start, a few numbers).
pub(super) const MAX_HELLO: usize = 256 << 10;

/// How long a leader that ends waits for its threads to hand out the
/// outcomes of rounds already decided.
const DRAIN_WITHIN: Duration = Duration::from_secs(5);

/// The abstract socket name of a node's link: the same for every process
/// of the node's ranks, different for every other node, job or start
/// sharing the host's network namespace.
pub(super) fn link_name(prefix: &str, job: &str, incarnation: &str, node: &str) -> String {
    // FNV-1a: stable across builds (the processes may not share one).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [prefix, job, incarnation, node] {
        for b in part.bytes().chain([0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("strata-node-{h:016x}")
}

pub(super) fn link_addr(name: &str) -> Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| Error::Config(format!("node link {name}: {e}")))
}

/// The user id of the process at the other end of `s`.
fn peer_uid(s: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, and
    // the descriptor is a connected Unix socket owned by `s`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

/// Whether the process at the other end of `s` runs as this one's user.
pub(super) fn same_user(s: &UnixStream) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    peer_uid(s) == Some(me)
}

/// Binds the node's link, waiting (until `deadline`) for a leader of an
/// earlier start of the job that still holds the name.
pub(super) fn bind(name: &str, deadline: Instant) -> Result<UnixListener> {
    let addr = link_addr(name)?;
    loop {
        match UnixListener::bind_addr(&addr) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => {
                return Err(Error::Coordination(format!(
                    "node link {name}: cannot listen ({e}): another process of this node's local rank 0 still runs"
                )))
            }
        }
    }
}

/// What a member's hello must say.
#[derive(Clone, Debug)]
pub(super) struct Expect {
    pub(super) job: String,
    pub(super) incarnation: String,
    pub(super) world: u32,
    /// The leader's own rank (no member may take it).
    pub(super) own: u32,
    pub(super) local_world: u32,
}

struct Served {
    node: Arc<EtcdCoordinator>,
    expect: Expect,
    stop: AtomicBool,
    /// Members by rank: the pid, and a handle to close the link.
    members: Mutex<BTreeMap<u32, (u32, UnixStream)>>,
    /// Threads serving a link or a round (each holds the coordinator).
    active: AtomicUsize,
    /// Connections not past their hello yet.
    greeting: AtomicUsize,
}

impl Served {
    /// Connections that may be waiting for their hello at once: every
    /// member reconnecting twice, and a few more.
    fn max_greeting(&self) -> usize {
        2 * self.expect.local_world as usize + SPARE_GREETINGS
    }
}

/// A connection counted as not past its hello until dropped.
struct Greeting(Arc<Served>);

impl Greeting {
    /// Counts a new connection, or None when too many are waiting.
    fn new(s: &Arc<Served>) -> Option<Greeting> {
        let max = s.max_greeting();
        s.greeting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Greeting(s.clone()))
    }
}

impl Drop for Greeting {
    fn drop(&mut self) {
        self.0.greeting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts a serving thread for as long as it lives.
struct Active<'a>(&'a AtomicUsize);

impl<'a> Active<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::AcqRel);
        Active(n)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The listening side of a node's link, run by local rank 0's process
/// for as long as its coordinator lives.
pub(super) struct NodeServer {
    served: Arc<Served>,
    name: String,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl NodeServer {
    /// Serves the node's members on `listener` (bound with [`bind`]),
    /// their rounds joining `node`'s.
    pub(super) fn start(
        listener: UnixListener,
        name: String,
        node: Arc<EtcdCoordinator>,
        expect: Expect,
    ) -> Result<NodeServer> {
        let served = Arc::new(Served {
            node,
            expect,
            stop: AtomicBool::new(false),
            members: Mutex::default(),
            active: AtomicUsize::new(0),
            greeting: AtomicUsize::new(0),
        });
        let s = served.clone();
        let accept = std::thread::Builder::new()
            .name("strata-node-link".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s.stop.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(conn) = conn else {
                        // Out of descriptors, say: never spin on it.
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    let Some(greeting) = Greeting::new(&s) else {
                        tracing::warn!(
                            max = s.max_greeting(),
                            "node link: too many connections without a hello; one closed"
                        );
                        drop(conn);
                        continue;
                    };
                    let s = s.clone();
                    let _ = std::thread::Builder::new()
                        .name("strata-node-member".into())
                        .spawn(move || {
                            let _active = Active::new(&s.active);
                            serve(&s, conn, greeting)
                        });
                }
            })
            .map_err(|e| Error::Config(format!("cannot start the node link: {e}")))?;
        tracing::info!(name, "node link listening");
        Ok(NodeServer {
            served,
            name,
            accept: Some(accept),
        })
    }

    /// Ranks whose processes are on the link now.
    pub(super) fn members(&self) -> Vec<u32> {
        self.served
            .members
            .lock()
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default()
    }
}

impl Drop for NodeServer {
    fn drop(&mut self) {
        let s = &self.served;
        let linked: Vec<u32> = match s.members.lock() {
            Ok(m) => {
                s.stop.store(true, Ordering::Release);
                m.keys().copied().collect()
            }
            Err(_) => Vec::new(),
        };
        // Rounds still waiting for a member fail now; those decided hand
        // their outcomes out before the links close.
        for r in linked {
            s.node.set_departed(r, true);
        }
        let t = Instant::now();
        while s.active.load(Ordering::Acquire) > linked_threads(s) && t.elapsed() < DRAIN_WITHIN {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Ok(m) = s.members.lock() {
            for (_, c) in m.values() {
                let _ = c.shutdown(std::net::Shutdown::Both);
            }
        }
        // Wakes the accepting thread (it sees `stop` and ends).
        if let Ok(addr) = link_addr(&self.name) {
            let _ = UnixStream::connect_addr(&addr);
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        // The links' threads end with their sockets: the coordinator's
        // last holder is then the caller.
        let t = Instant::now();
        while s.active.load(Ordering::Acquire) > 0 && t.elapsed() < DRAIN_WITHIN {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Threads that serve a link (not a round): one per member.
fn linked_threads(s: &Served) -> usize {
    s.members.lock().map(|m| m.len()).unwrap_or(0)
}

fn refuse(conn: &mut UnixStream, e: WireError) {
    let _ = wire::write_frame(conn, &ToMember::Refused(e).encode());
}

/// Checks a hello against what the leader expects.
fn admit(s: &Served, h: &Hello) -> std::result::Result<(), WireError> {
    let x = &s.expect;
    if h.version != wire::VERSION {
        return Err(WireError::Config(format!(
            "node link version {} (the leader speaks {}): every process of a node must run the same strata",
            h.version,
            wire::VERSION
        )));
    }
    if h.job != x.job || h.incarnation != x.incarnation || h.world != x.world {
        return Err(WireError::Config(format!(
            "this node's leader runs job {:?} (start {:?}) of {} ranks, not job {:?} (start {:?}) of {}",
            x.job, x.incarnation, x.world, h.job, h.incarnation, h.world
        )));
    }
    let ranks = s.node.ranks();
    if !ranks.contains(&h.rank) {
        return Err(WireError::Config(format!(
            "rank {} is not one of this node's ranks {ranks:?} (local rank 0 is rank {}, {} ranks on the node): the node link needs each node's ranks consecutive; set etcd_node_rounds = false for a launcher that places them otherwise",
            h.rank, x.own, x.local_world
        )));
    }
    if h.rank == x.own {
        return Err(WireError::RankClaimed {
            job: x.job.clone(),
            rank: h.rank,
            other: format!(
                "the node's leader (pid {}) is that rank",
                std::process::id()
            ),
        });
    }
    Ok(())
}

/// One member's link, from its hello to its goodbye (or its end).
fn serve(s: &Arc<Served>, mut conn: UnixStream, greeting: Greeting) {
    if s.stop.load(Ordering::Acquire) {
        return;
    }
    if !same_user(&conn) {
        tracing::warn!(uid = ?peer_uid(&conn), "node link: a process of another user was refused");
        refuse(
            &mut conn,
            WireError::Config("the node's leader serves only its own user".into()),
        );
        return;
    }
    let _ = conn.set_read_timeout(Some(HELLO_WITHIN));
    let hello =
        match wire::read_frame_max(&mut conn, MAX_HELLO).map(|f| f.map(|b| ToLeader::decode(&b))) {
            Ok(Some(Ok(ToLeader::Hello(h)))) => h,
            other => {
                tracing::warn!(?other, "node link: no hello; closed");
                refuse(
                    &mut conn,
                    WireError::Coordination("node link: expected a hello".into()),
                );
                return;
            }
        };
    drop(greeting);
    // A node that gave up takes no one in.
    let admitted =
        admit(s, &hello).and_then(|()| s.node.check_lost().map_err(|e| WireError::from(&e)));
    if let Err(e) = admitted {
        tracing::warn!(rank = hello.rank, pid = hello.pid, error = ?e, "node link: refused");
        refuse(&mut conn, e);
        return;
    }
    let (rank, pid) = (hello.rank, hello.pid);
    {
        let Ok(mut m) = s.members.lock() else { return };
        if let Some((held, _)) = m.get(&rank) {
            let other = format!("process {held} of this node holds it through the node link");
            drop(m);
            refuse(
                &mut conn,
                WireError::RankClaimed {
                    job: s.expect.job.clone(),
                    rank,
                    other,
                },
            );
            return;
        }
        // Checked under the lock the leader's end takes: a member is
        // either seen (and closed) by it, or never admitted.
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(handle) = conn.try_clone() else { return };
        m.insert(rank, (pid, handle));
    }
    s.node.set_departed(rank, false);
    let _ = conn.set_read_timeout(None);
    let writer = match conn.try_clone() {
        Ok(w) => Arc::new(Mutex::new(w)),
        Err(_) => {
            forget(s, rank);
            return;
        }
    };
    if write(&writer, &ToMember::Welcome).is_err() {
        forget(s, rank);
        return;
    }
    tracing::info!(rank, pid, "node link: a rank joined");
    let open = Arc::new(AtomicUsize::new(0));
    let why = loop {
        let msg = match wire::read_frame(&mut conn) {
            Ok(Some(b)) => ToLeader::decode(&b),
            Ok(None) => break "ended without leaving".to_string(),
            // A process killed while frames to it were unread resets the
            // connection instead of closing it: it ended all the same.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                break "ended without leaving (its connection was reset)".to_string()
            }
            Err(e) => break format!("broke the link ({e})"),
        };
        match msg {
            Ok(ToLeader::Bye) => {
                tracing::info!(rank, pid, "node link: a rank left");
                forget(s, rank);
                s.node.set_departed(rank, true);
                return;
            }
            Ok(ToLeader::Round {
                id,
                key,
                timeout_ms,
                value,
            }) => {
                if open.fetch_add(1, Ordering::AcqRel) >= MAX_OPEN_ROUNDS {
                    open.fetch_sub(1, Ordering::AcqRel);
                    break format!("opened more than {MAX_OPEN_ROUNDS} rounds at once");
                }
                let (node, writer, open) = (s.node.clone(), writer.clone(), open.clone());
                let timeout = Duration::from_millis(timeout_ms).min(MAX_ROUND);
                s.active.fetch_add(1, Ordering::AcqRel);
                let served = Arc::clone(s);
                let spawned = std::thread::Builder::new()
                    .name("strata-node-round".into())
                    .spawn(move || {
                        let r = node.reduce_locally(rank, &key, value, timeout, None);
                        let result = r.map_err(|e| WireError::from(&e));
                        if write(&writer, &ToMember::Outcome { id, result }).is_err() {
                            // Too large to send, say: the member must not
                            // wait for an answer that never comes.
                            let e = WireError::Coordination(format!(
                                "{key}: the outcome could not be sent over the node link"
                            ));
                            let _ = write(&writer, &ToMember::Outcome { id, result: Err(e) });
                        }
                        open.fetch_sub(1, Ordering::AcqRel);
                        served.active.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    s.active.fetch_sub(1, Ordering::AcqRel);
                    break "could not be served (no thread)".to_string();
                }
            }
            Ok(ToLeader::Hello(_)) => break "said hello twice".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    forget(s, rank);
    if s.stop.load(Ordering::Acquire) {
        return;
    }
    let e = Error::Coordination(format!(
        "local rank {rank} (pid {pid}) {why}: this node's ranks stop (the launcher restarts the node's processes)"
    ));
    tracing::error!(error = %e, "node link: a rank's process is gone");
    // The other members learn it from their next round (or the one they
    // wait in), with this reason.
    s.node.give_up(e);
}

fn forget(s: &Served, rank: u32) {
    if let Ok(mut m) = s.members.lock() {
        m.remove(&rank);
    }
}

fn write(w: &Mutex<UnixStream>, m: &ToMember) -> Result<()> {
    let mut w = w.lock().map_err(poisoned)?;
    wire::write_frame(&mut *w, &m.encode())
        .and_then(|()| w.flush())
        .map_err(|e| Error::Coordination(format!("node link: {e}")))
}
