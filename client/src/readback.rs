//! Sending a step's chunks from L1 to another tier (uploads to L3,
//! replication to peers): bounded batches read back from L1, verified, the
//! next batch read while the current one is sent, so the read-back costs no
//! wall time.

use strata_format::ShardManifest;
use strata_tiered::{ChunkPut, ChunkStore};

use crate::checkpointer::Shared;
use crate::error::{Error, Result};

/// Who hashes the chunks read back from L1.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Check {
    /// Here, before sending (the receiver stores what it gets).
    Here,
    /// The receiver, which verifies every chunk against its id.
    Receiver,
}

/// Reads the chunks at indices `missing` of `m` from L1 in batches of at
/// most `batch_bytes` and hands each batch to `send` (which returns the
/// bytes it sent), reading the next batch meanwhile. Stops at the first
/// error (a damaged L1 chunk is an [`Error::Chunk`]). Returns the bytes sent.
///
/// With [`Check::Receiver`], chunks are not hashed on the way out: for a
/// receiver that verifies every chunk against its id itself (a peer
/// service), so the hash is paid once; it then refuses a damaged chunk.
pub(crate) fn send_from_l1(
    s: &Shared,
    m: &ShardManifest,
    missing: &[usize],
    batch_bytes: u64,
    check: Check,
    mut send: impl FnMut(Vec<ChunkPut>) -> Result<u64>,
) -> Result<u64> {
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0u64;
    for &i in missing {
        let len = u64::from(m.chunks[i].len);
        match batches.last_mut() {
            Some(b) if bytes + len <= batch_bytes => b.push(i),
            _ => {
                batches.push(vec![i]);
                bytes = 0;
            }
        }
        bytes += len;
    }
    let read = |batch: &Vec<usize>| {
        let (l1, job) = (s.l1.clone(), s.cfg.job.clone());
        let want: Vec<_> = batch.iter().map(|&i| m.chunks[i].id).collect();
        s.rt.spawn(async move {
            match check {
                Check::Here => l1.get_chunks(&job, &want).await,
                Check::Receiver => l1.get_chunks_unverified(&job, &want).await,
            }
        })
    };
    let mut sent = 0u64;
    let mut next = batches.first().map(read);
    let result = (|| {
        for (k, batch) in batches.iter().enumerate() {
            let Some(pending) = next.take() else { break };
            let got =
                s.rt.block_on(pending)
                    .map_err(|e| Error::Pipeline(format!("L1 read task: {e}")))?;
            next = batches.get(k + 1).map(read);
            let puts = batch
                .iter()
                .zip(got)
                .map(|(&i, data)| {
                    let c = &m.chunks[i];
                    data.map(|data| ChunkPut {
                        id: c.id,
                        hint: c.hint,
                        data,
                    })
                    .map_err(|source| Error::Chunk {
                        chunk: c.id,
                        entries: Vec::new(),
                        source: Box::new(source),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            sent += send(puts)?;
        }
        Ok(sent)
    })();
    if let Some(n) = next.take() {
        n.abort();
    }
    result
}
