//! A node's ranks as separate processes meeting before etcd:
//! [`EtcdCoordinator::join_node`] makes local rank 0 the node's leader
//! ([`super::node_leader`]) and every other local rank a [`NodeMember`]
//! that takes part in the rounds through the leader's socket.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::node::gather_through_reduce;
use super::node_leader::{self, Expect, NodeServer};
use super::wire::{self, Hello, ToLeader, ToMember};
use super::{poisoned, EtcdCoordinator, EtcdOptions, EtcdRank};
use crate::config::Config;
use crate::coord::coordinator::{Coordinator, Reduce};
use crate::error::{Error, Result};

/// Where a process's rank sits on its node, as the launcher says
/// (torchrun's `LOCAL_RANK`/`LOCAL_WORLD_SIZE`, Slurm's `SLURM_LOCALID`/
/// `SLURM_NTASKS_PER_NODE`).
#[derive(Clone, Debug)]
pub struct NodePlace {
    /// The node's name (every process of the node gives the same).
    pub node: String,
    /// This process's rank among the node's.
    pub local_rank: u32,
    /// Ranks on the node (one process each).
    pub local_world: u32,
}

impl NodePlace {
    /// Where `cfg`'s rank sits, when its node's ranks meet through the
    /// node link: `etcd_node_rounds` on and the launcher naming more than
    /// one local rank.
    pub fn from_config(cfg: &Config) -> Option<NodePlace> {
        match (cfg.etcd_node_rounds, cfg.local_rank, cfg.local_world_size) {
            (true, Some(local_rank), Some(local_world)) if local_world > 1 => Some(NodePlace {
                node: cfg.node.clone(),
                local_rank,
                local_world,
            }),
            _ => None,
        }
    }
}

/// The coordinator of one rank whose node runs its ranks as separate
/// processes: the node's leader (local rank 0) holds the node's claims in
/// etcd and runs its rounds; the others reach it over a local socket.
pub struct NodeCoordinator {
    role: Role,
}

enum Role {
    // The server is dropped before the coordinator it serves.
    Leader { server: NodeServer, rank: EtcdRank },
    Member(NodeMember),
}

impl std::fmt::Debug for NodeCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.role {
            Role::Leader { rank, .. } => write!(f, "NodeCoordinator(leader, {rank:?})"),
            Role::Member(m) => write!(f, "NodeCoordinator(member, rank {})", m.rank),
        }
    }
}

impl NodeCoordinator {
    /// The node's etcd coordinator, on the leader (its request counters);
    /// None on a member.
    pub fn etcd(&self) -> Option<&Arc<EtcdCoordinator>> {
        match &self.role {
            Role::Leader { rank, .. } => Some(rank.node()),
            Role::Member(_) => None,
        }
    }

    /// The ranks of the node's other processes on the leader's link now
    /// (empty on a member).
    pub fn linked_ranks(&self) -> Vec<u32> {
        match &self.role {
            Role::Leader { server, .. } => server.members(),
            Role::Member(_) => Vec::new(),
        }
    }
}

impl Coordinator for NodeCoordinator {
    fn world_size(&self) -> u32 {
        match &self.role {
            Role::Leader { rank, .. } => rank.world_size(),
            Role::Member(m) => m.world,
        }
    }

    fn all_gather(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        gather_through_reduce(self, rank, key, value, timeout)
    }

    fn all_reduce(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
        reduce: &Reduce<'_>,
    ) -> Result<Vec<u8>> {
        match &self.role {
            Role::Leader { rank: r, .. } => r.all_reduce(rank, key, value, timeout, reduce),
            Role::Member(m) => m.round(rank, key, value, timeout),
        }
    }
}

impl EtcdCoordinator {
    /// The coordinator of `rank` when the node's ranks run as separate
    /// processes, one per local rank, with consecutive ranks (as torchrun
    /// and Slurm's block distribution place them). Local rank 0 claims
    /// the node's ranks in etcd and serves the others on a local socket;
    /// the others connect to it, waiting up to `wait` for it to come up.
    /// A round then costs etcd a few requests per node, not per rank.
    pub fn join_node(
        opts: EtcdOptions,
        job: &str,
        rank: u32,
        world: u32,
        place: &NodePlace,
        wait: Duration,
    ) -> Result<NodeCoordinator> {
        let NodePlace {
            node,
            local_rank,
            local_world,
        } = place;
        let first = rank.checked_sub(*local_rank);
        let Some(first) = first.filter(|_| *local_rank < *local_world && rank < world) else {
            return Err(Error::Config(format!(
                "rank {rank} as local rank {local_rank} of {local_world} on its node, in a world of {world}: the node's ranks must be consecutive (set etcd_node_rounds = false otherwise)"
            )));
        };
        let incarnation = opts.incarnation.clone().unwrap_or_default();
        let name = node_leader::link_name(&opts.prefix, job, &incarnation, node);
        // The last node of a Slurm step may hold fewer ranks than
        // SLURM_NTASKS_PER_NODE (a maximum): the node's ranks end at the
        // world's end.
        let end = first.saturating_add(*local_world).min(world);
        let now = Instant::now();
        let deadline = now
            .checked_add(wait)
            .unwrap_or(now + Duration::from_secs(86_400));
        if *local_rank > 0 {
            let hello = Hello {
                version: wire::VERSION,
                job: job.to_string(),
                incarnation,
                world,
                rank,
                pid: std::process::id(),
            };
            return Ok(NodeCoordinator {
                role: Role::Member(NodeMember::connect(&name, hello, deadline, &opts)?),
            });
        }
        // Listen first: the members may connect while the claims are made.
        let listener = node_leader::bind(&name, deadline)?;
        let coord = EtcdCoordinator::connect_node(opts, job, first..end, world).map_err(|e| {
            match e {
                // Another node's leader claimed some of these ranks: the
                // launcher did not place each node's ranks consecutively.
                Error::RankClaimed { job, rank, other } => Error::RankClaimed {
                    job,
                    rank,
                    other: format!(
                        "{other} (as this node's leader, local rank 0 claims ranks {first}..{end}: if the launcher places a node's ranks otherwise, set etcd_node_rounds = false)"
                    ),
                },
                e => e,
            }
        })?;
        let handle = coord.rank_handle(rank)?;
        let server = NodeServer::start(
            listener,
            name,
            coord,
            Expect {
                job: job.to_string(),
                incarnation,
                world,
                own: rank,
                local_world: *local_world,
            },
        )?;
        Ok(NodeCoordinator {
            role: Role::Leader {
                server,
                rank: handle,
            },
        })
    }
}

type Answer = Result<Vec<u8>>;

#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, SyncSender<Answer>>,
    /// Why the link is gone (every later round fails with it).
    closed: Option<Error>,
}

/// A rank of a node whose leader is another process: its rounds go over
/// the node link.
pub(super) struct NodeMember {
    rank: u32,
    world: u32,
    writer: Mutex<UnixStream>,
    pending: Arc<Mutex<Pending>>,
    next: AtomicU64,
    reader: Option<std::thread::JoinHandle<()>>,
    /// Beyond a round's own timeout: the leader's round ends by its own
    /// deadline, then its answer crosses the link.
    grace: Duration,
}

impl NodeMember {
    fn connect(
        name: &str,
        hello: Hello,
        deadline: Instant,
        opts: &EtcdOptions,
    ) -> Result<NodeMember> {
        let addr = node_leader::link_addr(name)?;
        let io = |e: std::io::Error| Error::Coordination(format!("node link {name}: {e}"));
        let (rank, world) = (hello.rank, hello.world);
        // A leader with too many connections waiting for their hello
        // closes new ones at once: connect again until the deadline.
        let conn = loop {
            let mut conn = loop {
                match UnixStream::connect_addr(&addr) {
                    // Only a leader of this user is trusted with the rank's
                    // rounds (an abstract name can be bound by anyone).
                    Ok(c) if node_leader::same_user(&c) => break c,
                    Ok(_) => {
                        return Err(Error::Coordination(format!(
                            "rank {}: the process listening on {name} runs as another user: not this node's leader",
                            hello.rank
                        )))
                    }
                    Err(e) if Instant::now() >= deadline => {
                        return Err(Error::Coordination(format!(
                            "rank {}: the node's leader (local rank 0) never listened on {name} ({e}): is it running on this node, with the same job and node name?",
                            hello.rank
                        )))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            // The leader answers once its claims are made (it may wait out a
            // dead predecessor's lease).
            let left = deadline.saturating_duration_since(Instant::now());
            conn.set_read_timeout(Some(left.max(Duration::from_secs(1))))
                .map_err(io)?;
            // A write to, or a read from, a link the leader closed at once
            // fails: as a close.
            let answer = wire::write_frame(&mut conn, &ToLeader::Hello(hello.clone()).encode())
                .and_then(|()| wire::read_frame(&mut conn));
            match answer {
                Ok(Some(b)) => match ToMember::decode(&b)? {
                    ToMember::Welcome => break conn,
                    ToMember::Refused(e) => return Err(e.into()),
                    ToMember::Outcome { .. } => {
                        return Err(Error::Coordination(
                            "node link: an answer before the welcome".into(),
                        ))
                    }
                },
                Ok(None) | Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(io(e)),
                Ok(None) => {
                    return Err(Error::Coordination(format!(
                        "rank {rank}: the node's leader closed the link before welcoming it"
                    )))
                }
            }
        };
        conn.set_read_timeout(None).map_err(io)?;
        let writer = Mutex::new(conn.try_clone().map_err(io)?);
        let pending = Arc::new(Mutex::new(Pending::default()));
        let p = pending.clone();
        let reader = std::thread::Builder::new()
            .name("strata-node-member".into())
            .spawn(move || read_answers(conn, &p))
            .map_err(|e| Error::Config(format!("cannot start the node link: {e}")))?;
        tracing::info!(rank, name, "joined the node's leader");
        Ok(NodeMember {
            rank,
            world,
            writer,
            pending,
            next: AtomicU64::new(1),
            reader: Some(reader),
            grace: opts.request_timeout + Duration::from_secs(5),
        })
    }

    fn round(&self, rank: u32, key: &str, value: Vec<u8>, timeout: Duration) -> Result<Vec<u8>> {
        if rank != self.rank {
            return Err(Error::Config(format!(
                "this coordinator holds rank {}, not {rank}",
                self.rank
            )));
        }
        if key.len() > wire::MAX_STRING {
            return Err(Error::Config(format!(
                "a round key of {} bytes (the node link carries at most {})",
                key.len(),
                wire::MAX_STRING
            )));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        {
            let mut p = self.pending.lock().map_err(poisoned)?;
            if let Some(e) = &p.closed {
                return Err(e.clone());
            }
            p.waiting.insert(id, tx);
        }
        let msg = ToLeader::Round {
            id,
            key: key.to_string(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            value,
        };
        let sent = self.writer.lock().map_err(poisoned).and_then(|mut w| {
            let b = msg.encode();
            if b.len() > wire::MAX_FRAME {
                return Err(Error::Coordination(format!(
                    "{key}: a value of {} bytes is larger than the node link carries ({} bytes)",
                    b.len(),
                    wire::MAX_FRAME
                )));
            }
            wire::write_frame(&mut *w, &b).map_err(|e| {
                Error::Coordination(format!("{key}: the node's leader is unreachable ({e})"))
            })
        });
        if let Err(e) = sent {
            self.forget(id);
            return Err(e);
        }
        // The leader answers every round it took (by the earliest deadline
        // of the node's ranks in it), or the link ends: this bound is only
        // a safety net, far beyond the round's own.
        let limit = timeout.saturating_mul(2).saturating_add(self.grace);
        match rx.recv_timeout(limit) {
            Ok(a) => a,
            Err(RecvTimeoutError::Timeout) => {
                self.forget(id);
                Err(Error::Coordination(format!(
                    "{key}: no answer from the node's leader within {limit:?}"
                )))
            }
            Err(RecvTimeoutError::Disconnected) => Err(self.closed_error(key)),
        }
    }

    fn forget(&self, id: u64) {
        if let Ok(mut p) = self.pending.lock() {
            p.waiting.remove(&id);
        }
    }

    fn closed_error(&self, key: &str) -> Error {
        self.pending
            .lock()
            .ok()
            .and_then(|p| p.closed.clone())
            .unwrap_or_else(|| Error::Coordination(format!("{key}: the node link closed")))
    }
}

/// The member's reading side: hands each answer to the round waiting for
/// it; at the link's end, fails every round (and every later one).
fn read_answers(mut conn: UnixStream, pending: &Mutex<Pending>) {
    let why = loop {
        match wire::read_frame(&mut conn) {
            Ok(Some(b)) => match ToMember::decode(&b) {
                Ok(ToMember::Outcome { id, result }) => {
                    let tx = pending.lock().ok().and_then(|mut p| p.waiting.remove(&id));
                    if let Some(tx) = tx {
                        let _ = tx.try_send(result.map_err(Error::from));
                    }
                }
                Ok(_) => break "the leader sent a message out of turn".to_string(),
                Err(e) => break e.to_string(),
            },
            Ok(None) => break "the node's leader (local rank 0) ended".to_string(),
            Err(e) => break format!("the node link broke ({e})"),
        }
    };
    if let Ok(mut p) = pending.lock() {
        let e = Error::Coordination(format!(
            "{why}: this node's ranks stop (the launcher restarts the node's processes)"
        ));
        p.closed.get_or_insert(e.clone());
        for (_, tx) in p.waiting.drain() {
            let _ = tx.try_send(Err(e.clone()));
        }
    }
}

impl Drop for NodeMember {
    fn drop(&mut self) {
        if let Ok(mut w) = self.writer.lock() {
            // A clean goodbye: the leader forgets this rank without ending
            // the node.
            let _ = wire::write_frame(&mut *w, &ToLeader::Bye.encode());
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}
