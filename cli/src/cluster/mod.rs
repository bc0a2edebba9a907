//! A multi-node test bed on one machine, used by the tests and by
//! `strata demo --nodes N`: nodes as network namespaces ([`net`]), each
//! with its own `strata peer serve` process and L1 directory; ranks as
//! `strata rank` processes (several per node, sharing the node's L1 and
//! peer service); etcd and an S3 server (s3s-fs) on the bridge, outside
//! every node. The driver starts and stops nodes, kills a node's
//! processes (SIGKILL), wipes its disk, cuts its link and, where the
//! kernel has netem, delays it ([`Fabric::delay`]).

pub mod net;

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use net::{Fabric, Isolation};

/// Port of every node's peer service (each node has its own address).
const PEER_PORT: u16 = 7070;
/// S3 credentials of the test bed's object store.
const S3_KEY: (&str, &str) = ("strata-cluster", "strata-cluster-secret");
/// The bucket.
const BUCKET: &str = "strata";

/// What to build.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Nodes.
    pub nodes: usize,
    /// Rank processes per node.
    pub ranks_per_node: usize,
    /// The job id.
    pub job: String,
    /// Where everything lives (L1 directories, spill, certificates, the
    /// object store's files, etcd's data).
    pub dir: PathBuf,
    /// The `strata` binary.
    pub strata: PathBuf,
    /// Replicas of each step on other nodes.
    pub replicas: usize,
    /// Upload every K-th step to L3 (0: none).
    pub upload_every: u64,
    /// etcd lease of a rank, seconds.
    pub lease_secs: u64,
    /// Chunk size.
    pub chunk_size: u32,
    /// Committed steps kept on L1 and on each peer.
    pub keep_last: usize,
    /// Use loopback addresses even where namespaces are possible.
    pub force_loopback: bool,
    /// Start the ranks as torchrun does (`LOCAL_RANK`, `LOCAL_WORLD_SIZE`):
    /// a node's rank processes then meet on the node link and local rank
    /// 0 takes part in etcd's rounds for all of them.
    pub node_link: bool,
}

/// A child process killed when dropped.
#[derive(Debug)]
pub struct Proc(pub Child);

impl Proc {
    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One rank process and the JSON lines it printed so far.
#[derive(Debug)]
pub struct RankProc {
    /// The rank.
    pub rank: u32,
    /// Its node.
    pub node: usize,
    /// The process.
    pub proc: Proc,
    /// Its events (one JSON object per line of its output).
    pub events: Arc<Mutex<Vec<Value>>>,
    /// The thread reading its output: joined once the process exits, so
    /// [`RankProc::events`] then holds every line it printed.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl RankProc {
    /// The events so far.
    pub fn events(&self) -> Vec<Value> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Waits for the process to exit (up to `timeout`); returns whether
    /// it succeeded, or None if it still runs.
    pub fn wait(&mut self, timeout: Duration) -> Option<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = self.proc.0.try_wait() {
                // The process is gone; its last lines may still be in the
                // pipe: read them all before anyone looks at the events.
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                return Some(st.success());
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One node.
#[derive(Debug)]
pub struct Node {
    /// Its name (`node-<i>`).
    pub name: String,
    /// Its address.
    pub addr: Ipv4Addr,
    /// Its L1 directory (shared by its ranks).
    pub l1: PathBuf,
    /// Its peer service's spill directory.
    pub spill: PathBuf,
    /// Its peer service, while running.
    pub peer: Option<Proc>,
}

/// The running test bed.
#[derive(Debug)]
pub struct Cluster {
    /// What was built.
    pub spec: Spec,
    /// The nodes (index = node number).
    pub nodes: Vec<Node>,
    /// The shared configuration file every rank reads.
    pub config: PathBuf,
    /// etcd's client URL.
    pub etcd_url: String,
    // Fields drop in order: services after the fabric's processes.
    _etcd: Proc,
    _s3: Proc,
    /// The network (dropped last: processes in namespaces go first).
    pub fabric: Fabric,
}

/// `bin` from PATH or the project's `.tools/bin`.
pub fn find_bin(bin: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin"));
    dirs.into_iter().map(|d| d.join(bin)).find(|p| p.is_file())
}

fn free_port(on: Ipv4Addr) -> Result<u16, String> {
    TcpListener::bind((on, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port on {on}: {e}"))
}

fn wait_port(addr: (Ipv4Addr, u16), child: &mut Child, what: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!("{what} exited: {st}"));
        }
        if Instant::now() > deadline {
            return Err(format!("{what} did not listen on {}:{}", addr.0, addr.1));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A log file (appended to) for a process's stderr.
fn log_file(p: &Path) -> Result<std::fs::File, String> {
    if let Some(d) = p.parent() {
        mkdir(d)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .map_err(|e| format!("{}: {e}", p.display()))
}

fn mkdir(p: &Path) -> Result<(), String> {
    std::fs::create_dir_all(p).map_err(|e| format!("{}: {e}", p.display()))
}

impl Cluster {
    /// Builds the network, starts etcd, the object store and every node's
    /// peer service, and writes the ranks' configuration.
    pub fn start(spec: Spec) -> Result<Cluster, String> {
        let fabric = Fabric::new(spec.nodes, spec.force_loopback);
        let svc = fabric.services_addr();
        mkdir(&spec.dir)?;
        // etcd and s3s-fs on the bridge (outside every node).
        let etcd_bin = find_bin("etcd").ok_or("etcd not found (apt-get install etcd-server)")?;
        let (cport, pport) = (free_port(svc)?, free_port(svc)?);
        let etcd_url = format!("http://{svc}:{cport}");
        let etcd = Command::new(etcd_bin)
            .arg("--data-dir")
            .arg(spec.dir.join("etcd"))
            .args([
                "--listen-client-urls",
                &etcd_url,
                "--advertise-client-urls",
                &etcd_url,
            ])
            .args(["--listen-peer-urls", &format!("http://{svc}:{pport}")])
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("etcd: {e}"))?;
        let mut etcd = Proc(etcd);
        wait_port((svc, cport), &mut etcd.0, "etcd")?;
        let s3_bin = find_bin("s3s-fs").ok_or("s3s-fs not found (scripts/test.sh installs it)")?;
        let s3_dir = spec.dir.join("s3");
        mkdir(&s3_dir.join(BUCKET))?;
        let s3_port = free_port(svc)?;
        let s3 = Command::new(s3_bin)
            .args(["--host", &svc.to_string(), "--port", &s3_port.to_string()])
            .args(["--access-key", S3_KEY.0, "--secret-key", S3_KEY.1])
            .arg(&s3_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("s3s-fs: {e}"))?;
        let mut s3 = Proc(s3);
        wait_port((svc, s3_port), &mut s3.0, "s3s-fs")?;

        let nodes: Vec<Node> = (0..spec.nodes)
            .map(|i| Node {
                name: format!("node-{i}"),
                addr: fabric.addr(i),
                l1: spec.dir.join(format!("node-{i}/l1")),
                spill: spec.dir.join(format!("node-{i}/spill")),
                peer: None,
            })
            .collect();
        let certs = spec.dir.join("certs");
        let mut c = Command::new(&spec.strata);
        c.args(["peer", "certs", "--job", &spec.job, "--out"])
            .arg(&certs);
        for n in &nodes {
            c.args(["--node", &n.name, "--addr", &n.addr.to_string()]);
        }
        let out = c.output().map_err(|e| format!("strata peer certs: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "strata peer certs: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let peers: Vec<String> = nodes
            .iter()
            .map(|n| format!("\"{}={}:{PEER_PORT}\"", n.name, n.addr))
            .collect();
        let config = spec.dir.join("cluster.toml");
        let toml = format!(
            "job = \"{job}\"\nchunk_size = {chunk}\nkeep_last = {keep}\ngc_grace_secs = 600\n\
             coordination_timeout_secs = 120\npeers = [{peers}]\npeer_certs = \"{certs}\"\n\
             replicas = {replicas}\nreplication_retry_secs = 2\nl3_url = \"s3://{BUCKET}/cluster\"\n\
             upload_every = {every}\nupload_backlog = \"wait\"\nl3_keep_last = 0\netcd_endpoints = [\"{etcd_url}\"]\netcd_lease_secs = {lease}\n\n\
             [l3_options]\nendpoint = \"http://{svc}:{s3_port}\"\nallow_http = \"true\"\n\
             region = \"us-east-1\"\naccess_key_id = \"{ak}\"\nsecret_access_key = \"{sk}\"\n\
             virtual_hosted_style_request = \"false\"\n",
            job = spec.job,
            chunk = spec.chunk_size,
            keep = spec.keep_last,
            peers = peers.join(", "),
            certs = certs.display(),
            replicas = spec.replicas,
            every = spec.upload_every,
            lease = spec.lease_secs,
            ak = S3_KEY.0,
            sk = S3_KEY.1,
        );
        std::fs::write(&config, toml).map_err(|e| format!("{}: {e}", config.display()))?;
        let mut cluster = Cluster {
            spec,
            nodes,
            config,
            etcd_url,
            _etcd: etcd,
            _s3: s3,
            fabric,
        };
        for i in 0..cluster.nodes.len() {
            cluster.start_peer(i)?;
        }
        Ok(cluster)
    }

    /// Starts node `i`'s peer service (empty: a restarted service keeps
    /// nothing).
    pub fn start_peer(&mut self, i: usize) -> Result<(), String> {
        let n = &self.nodes[i];
        let mut child = self
            .fabric
            .command(i, &self.spec.strata)
            .args(["peer", "serve", "--node", &n.name])
            .args(["--listen", &format!("{}:{PEER_PORT}", n.addr)])
            .args(["--keep-last", &self.spec.keep_last.to_string()])
            .arg("--certs")
            .arg(self.spec.dir.join("certs"))
            .arg("--spill")
            .arg(&n.spill)
            .stdout(Stdio::piped())
            .stderr(log_file(
                &self.spec.dir.join(format!("{}/peer.log", n.name)),
            )?)
            .spawn()
            .map_err(|e| format!("peer serve on {}: {e}", n.name))?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let mut r = BufReader::new(out);
            let _ = r.read_line(&mut line);
            // Keep draining so the service never blocks on a full pipe.
            std::thread::spawn(move || {
                let mut sink = String::new();
                while r.read_line(&mut sink).is_ok_and(|n| n > 0) {
                    sink.clear();
                }
            });
        }
        if !line.contains("listening on") {
            let _ = child.kill();
            let log = std::fs::read_to_string(self.spec.dir.join(format!("{}/peer.log", n.name)))
                .unwrap_or_default();
            return Err(format!("peer serve on {}: {line:?} {log}", n.name));
        }
        self.nodes[i].peer = Some(Proc(child));
        Ok(())
    }

    /// What rank `rank`'s processes on node `node` logged (warnings and
    /// errors), for a failing test to show.
    pub fn rank_log(&self, node: usize, rank: u32) -> String {
        let name = &self.nodes[node].name;
        std::fs::read_to_string(self.spec.dir.join(format!("{name}/rank-{rank}.log")))
            .unwrap_or_default()
    }

    /// The global rank of node `node`'s `local`-th rank.
    pub fn rank_of(&self, node: usize, local: usize) -> u32 {
        (node * self.spec.ranks_per_node + local) as u32
    }

    /// Starts the ranks of `nodes` as `strata rank --config <cluster.toml>
    /// <args>` processes on their nodes.
    pub fn spawn_ranks(&self, nodes: &[usize], args: &[String]) -> Result<Vec<RankProc>, String> {
        let world = (self.spec.nodes * self.spec.ranks_per_node) as u32;
        let mut out = Vec::new();
        for &i in nodes {
            let n = &self.nodes[i];
            for local in 0..self.spec.ranks_per_node {
                let rank = self.rank_of(i, local);
                let mut child = self
                    .fabric
                    .command(i, &self.spec.strata)
                    .arg("rank")
                    .arg("--config")
                    .arg(&self.config)
                    .args(args)
                    .env("STRATA_RANK", rank.to_string())
                    .env("STRATA_WORLD_SIZE", world.to_string())
                    .env("STRATA_ETCD_NODE_ROUNDS", self.spec.node_link.to_string())
                    .env("LOCAL_RANK", local.to_string())
                    .env("LOCAL_WORLD_SIZE", self.spec.ranks_per_node.to_string())
                    .env("STRATA_NODE", &n.name)
                    .env("STRATA_L1_DIR", &n.l1)
                    .env("STRATA_LOG", "warn")
                    .stdout(Stdio::piped())
                    .stderr(log_file(
                        &self.spec.dir.join(format!("{}/rank-{rank}.log", n.name)),
                    )?)
                    .spawn()
                    .map_err(|e| format!("rank {rank} on {}: {e}", n.name))?;
                let events = Arc::new(Mutex::new(Vec::new()));
                let mut reader = None;
                if let Some(stdout) = child.stdout.take() {
                    let sink = events.clone();
                    reader = Some(std::thread::spawn(move || {
                        for line in BufReader::new(stdout).lines() {
                            let Ok(line) = line else { break };
                            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                                if let Ok(mut e) = sink.lock() {
                                    e.push(v);
                                }
                            }
                        }
                    }));
                }
                out.push(RankProc {
                    rank,
                    node: i,
                    proc: Proc(child),
                    events,
                    reader,
                });
            }
        }
        Ok(out)
    }

    /// Kills node `i`: its peer service (SIGKILL); its ranks are the
    /// caller's [`RankProc`]s (kill them too).
    pub fn kill_peer(&mut self, i: usize) {
        if let Some(mut p) = self.nodes[i].peer.take() {
            p.kill();
        }
    }

    /// Wipes node `i`'s disk (its L1 and its peer's spill): a replacement
    /// node.
    pub fn wipe(&self, i: usize) -> Result<(), String> {
        for d in [&self.nodes[i].l1, &self.nodes[i].spill] {
            if d.exists() {
                std::fs::remove_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            }
        }
        Ok(())
    }
}
