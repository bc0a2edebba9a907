//! Sequences of requests against a real service, for fuzzing the protocol
//! as a conversation rather than one message at a time: a service on
//! loopback with small budgets, one authenticated connection, and an input
//! read as a list of operations: raw bytes sent as a request as they are,
//! or well-formed requests built from the input (chunks put raw or
//! compressed, whole and ranged reads of chunks put before, manifests,
//! commit records, retirements, pins, listings), so that a fuzzer reaches
//! the states behind them. Every answer must decode, and after each input
//! the service must still answer. A panic anywhere (a service task
//! included) aborts the process, so the fuzzer sees it.
//!
//! `cargo fuzz run peer_session` drives [`Session::run`]; a test runs it on
//! seeded random inputs.

#![allow(clippy::expect_used)]

use std::sync::Arc;

use strata_format::codec::{ElemHint, EncodeOptions};
use strata_format::frame::encode_frame;
use strata_format::{ChunkId, CommitRecord, ShardRef};

use crate::proto::{put_chunk_envelope, Request, Response, VERSION};
use crate::replicas::Limits;
use crate::service::{Service, ServiceConfig};
use crate::tls::{client_config, make_certs, CertFiles};

const JOB: &str = "fuzz";
/// Most operations read from one input.
const MAX_OPS: usize = 32;

/// A service and a connection to it.
pub struct Session {
    rt: tokio::runtime::Runtime,
    service: Arc<Service>,
    conn: quinn::Connection,
    ids: Vec<ChunkId>,
    _dir: std::path::PathBuf,
}

impl Session {
    /// Starts a service (budgets of a few MiB, so inputs reach them) and
    /// connects to it. Panics if it cannot (a harness, not a product path).
    pub fn start() -> Session {
        // A panic in any task of the service is a finding: abort.
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            std::process::abort();
        }));
        let dir = std::env::temp_dir().join(format!("strata-fuzz-session-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        make_certs(&dir, &["node-a".into()], &[], &[JOB.into()]).expect("certificates");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let cfg = ServiceConfig {
            node: "node-a".into(),
            listen: "127.0.0.1:0".parse().expect("address"),
            certs: CertFiles::in_dir(&dir, "node-a"),
            spill: dir.join("spill"),
            limits: Limits {
                memory_bytes: 4 << 20,
                disk_bytes: 8 << 20,
                manifest_bytes: 1 << 20,
                keep_last: 2,
                grace: std::time::Duration::ZERO,
                max_chunk: 1 << 20,
                ..Limits::default()
            },
            max_streams: 16,
            inflight_bytes: 8 << 20,
            max_request: (1 << 20) + 8192,
            work_bytes: 8 << 20,
            max_connections: 8,
        };
        let (service, conn) = rt.block_on(async {
            let service = Service::bind(&cfg).expect("service");
            tokio::spawn(service.clone().run());
            let client = client_config(&CertFiles::in_dir(&dir, &format!("client-{JOB}")), 16)
                .expect("client config");
            let mut ep =
                quinn::Endpoint::client("127.0.0.1:0".parse().expect("address")).expect("endpoint");
            ep.set_default_client_config(client);
            let conn = ep
                .connect(service.local_addr().expect("bound"), "node-a")
                .expect("connect")
                .await
                .expect("handshake");
            let hello = Request::Hello {
                version: VERSION,
                job: JOB.into(),
            };
            let answer = exchange(&conn, &hello.encode()).await;
            assert!(
                matches!(answer, Some(Response::HelloOk { .. })),
                "hello: {answer:?}"
            );
            (service, conn)
        });
        Session {
            rt,
            service,
            conn,
            ids: Vec::new(),
            _dir: dir,
        }
    }

    /// Runs the operations `data` encodes; panics if an answer does not
    /// decode or the service stops answering.
    pub fn run(&mut self, data: &[u8]) {
        let mut ops = Ops { data, at: 0 };
        let mut msgs = Vec::new();
        for _ in 0..MAX_OPS {
            let Some(m) = self.next_message(&mut ops) else {
                break;
            };
            msgs.push(m);
        }
        let conn = self.conn.clone();
        self.rt.block_on(async {
            for m in &msgs {
                let _ = exchange(&conn, m).await;
            }
            let stats = exchange(&conn, &Request::Stats.encode()).await;
            assert!(
                matches!(stats, Some(Response::Stats(_))),
                "the service stopped answering: {stats:?}"
            );
        });
        assert!(self.service.manifest_bytes() <= 1 << 20);
    }

    /// The next request, as bytes.
    fn next_message(&mut self, o: &mut Ops<'_>) -> Option<Vec<u8>> {
        let op = o.u8()?;
        let pick = |o: &mut Ops<'_>, ids: &[ChunkId]| -> ChunkId {
            let i = o.u8().unwrap_or(0) as usize;
            ids.get(i % ids.len().max(1))
                .copied()
                .unwrap_or_else(|| ChunkId::of(&[i as u8]))
        };
        Some(match op % 12 {
            // Raw bytes, framed or not.
            0 => {
                let n = o.u16()? as usize;
                o.take(n).to_vec()
            }
            // A chunk put raw or compressed (sizes up to 1.5 MiB: some
            // past the largest request).
            1 | 2 => {
                let seed = o.u8()?;
                let len = (o.u16()? as usize) * 24;
                let data: Vec<u8> = (0..len).map(|i| (i as u8 / 7) ^ seed).collect();
                let opts = if op % 12 == 1 {
                    EncodeOptions::RAW
                } else {
                    EncodeOptions::ZSTD
                };
                let frame = encode_frame(&data, ElemHint::BYTES, opts).ok()?;
                let id = ChunkId::of(&data);
                self.ids.push(id);
                let mut m = put_chunk_envelope(&id, frame.len())?.to_vec();
                m.extend_from_slice(&frame);
                m
            }
            3 => Request::GetChunk {
                id: pick(o, &self.ids),
                range: None,
            }
            .encode(),
            4 => {
                let id = pick(o, &self.ids);
                let (a, b) = (o.u16()? as u32 * 16, o.u16()? as u32 * 16);
                Request::GetChunk {
                    id,
                    range: Some((a.min(b), a.max(b))),
                }
                .encode()
            }
            5 => {
                let (step, rank) = (u64::from(o.u8()?), u32::from(o.u8()?));
                let n = o.u16()? as usize;
                Request::PutManifest {
                    step,
                    rank,
                    bytes: o.take(n).to_vec(),
                }
                .encode()
            }
            6 => {
                let step = u64::from(o.u8()?);
                let world = u32::from(o.u8()?).max(1);
                let record = CommitRecord {
                    job: JOB.into(),
                    step,
                    world_size: world,
                    committed_unix_ms: 1,
                    shards: (0..world)
                        .map(|rank| ShardRef {
                            rank,
                            manifest: ChunkId::of(&rank.to_le_bytes()),
                            logical_bytes: 1,
                        })
                        .collect(),
                };
                Request::Commit(record.encode().ok()?).encode()
            }
            7 => Request::DeleteShard {
                step: u64::from(o.u8()?),
                rank: u32::from(o.u8()?),
            }
            .encode(),
            8 => match o.u8()? % 3 {
                0 => Request::DeleteStep(u64::from(o.u8()?)).encode(),
                1 => Request::DeleteChunks(vec![pick(o, &self.ids)]).encode(),
                _ => Request::HasChunks(vec![pick(o, &self.ids), pick(o, &self.ids)]).encode(),
            },
            9 => Request::SetPin {
                step: u64::from(o.u8()?),
                pinned: o.u8()? % 2 == 0,
            }
            .encode(),
            10 => match o.u8()? % 3 {
                0 => Request::ListSteps.encode(),
                1 => Request::ListPins.encode(),
                _ => Request::ListChunks { after: None }.encode(),
            },
            // A well-formed request cut short or with bytes appended.
            _ => {
                let mut m = Request::GetManifest {
                    step: u64::from(o.u8()?),
                    rank: u32::from(o.u8()?),
                }
                .encode();
                let cut = o.u8()? as usize;
                if cut % 2 == 0 {
                    m.truncate(cut % m.len());
                } else {
                    m.extend_from_slice(o.take(cut % 16));
                }
                m
            }
        })
    }
}

/// Sends `msg` on a stream of its own and reads the answer (None: the
/// stream was refused or reset, which a malformed request may earn). An
/// answer that does not decode panics.
async fn exchange(conn: &quinn::Connection, msg: &[u8]) -> Option<Response> {
    let (mut send, mut recv) = conn.open_bi().await.ok()?;
    send.write_all(msg).await.ok()?;
    let _ = send.finish();
    let got = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        recv.read_to_end(crate::proto::MAX_MESSAGE + 4),
    )
    .await
    .expect("the service did not answer within 30 s")
    .ok()?;
    if got.is_empty() {
        return None;
    }
    let body = got
        .get(4..)
        .expect("an answer shorter than its length prefix");
    Some(Response::decode(body).expect("an answer that does not decode"))
}

/// The input, read front to back.
struct Ops<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Ops<'a> {
    fn u8(&mut self) -> Option<u8> {
        let b = *self.data.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.u8()?, self.u8()?]))
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let end = (self.at + n).min(self.data.len());
        let s = &self.data[self.at..end];
        self.at = end;
        s
    }
}
