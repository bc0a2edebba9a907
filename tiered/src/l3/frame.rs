//! A chunk frame fetched from L3 (ranged GETs issued at once, each body
//! streamed into its place in one buffer) and decoded where the bytes
//! belong.

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{GetOptions, ObjectStore};
use strata_format::frame::FrameDecoder;
use strata_format::ChunkId;

use super::os_err;
use crate::error::{Result, StoreError};

/// Reads a whole object of at most `max` bytes into `buf`, in ranged
/// reads issued at once. The first read learns the size (and is the
/// whole object when it is small); each part is streamed into its place
/// in the one buffer, so no part is copied twice.
pub(crate) async fn get_ranged(
    store: &dyn ObjectStore,
    key: &ObjPath,
    range_size: u64,
    max: usize,
    what: &str,
    mut buf: Vec<u8>,
) -> Result<Vec<u8>> {
    let rs = range_size.max(1);
    let first = store
        .get_opts(key, GetOptions::new().with_range(Some(0..rs)))
        .await
        .map_err(|e| os_err(what, e))?;
    let total = first.meta.size;
    if total > max as u64 {
        return Err(StoreError::Corrupt {
            what: what.to_string(),
            source: strata_format::FormatError::TooLarge {
                what: "object",
                value: total,
                limit: max as u64,
            },
        });
    }
    if first.range.start != 0 || first.range.end > total {
        return Err(StoreError::Unavailable(format!(
            "{what}: asked for bytes 0..{rs} of {total}, got {:?}",
            first.range
        )));
    }
    let mut at = first.range.end;
    if buf.capacity() >= total as usize {
        // Reused memory is already faulted in; only its length changes.
        buf.clear();
        buf.resize(total as usize, 0);
    } else {
        // New memory comes zeroed from the allocator (fresh pages, faulted
        // in as the bodies are copied into them), not written twice: a
        // `resize` would memset it first, on the runtime's thread where
        // the read runs as a task.
        buf = vec![0u8; total as usize];
    }
    let (head, mut rest) = buf.split_at_mut(at as usize);
    let mut parts: Vec<futures::future::BoxFuture<'_, Result<()>>> =
        vec![Box::pin(fill(first.into_stream(), head, what))];
    while at < total {
        let end = (at + rs).min(total);
        let (mine, tail) = rest.split_at_mut((end - at) as usize);
        rest = tail;
        parts.push(Box::pin(async move {
            let r = store
                .get_opts(key, GetOptions::new().with_range(Some(at..end)))
                .await
                .map_err(|e| os_err(what, e))?;
            if r.range != (at..end) || r.meta.size != total {
                // Chunk objects never change (same id, same bytes):
                // this one was replaced or is being rewritten.
                return Err(StoreError::Unavailable(format!(
                    "{what}: asked for bytes {at}..{end} of {total}, got {:?} of {}",
                    r.range, r.meta.size
                )));
            }
            fill(r.into_stream(), mine, what).await
        }));
        at = end;
    }
    futures::future::try_join_all(parts).await?;
    Ok(buf)
}

/// Streams a response body into `dst`, which it must fill exactly.
pub(crate) async fn fill(
    mut body: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    dst: &mut [u8],
    what: &str,
) -> Result<()> {
    let mut at = 0usize;
    while let Some(piece) = body.next().await {
        let piece = piece.map_err(|e| os_err(what, e))?;
        let end = at + piece.len();
        dst.get_mut(at..end)
            .ok_or_else(|| {
                StoreError::Unavailable(format!("{what}: the server sent more than asked for"))
            })?
            .copy_from_slice(&piece);
        at = end;
    }
    if at != dst.len() {
        return Err(StoreError::Unavailable(format!(
            "{what}: the body ended after {at} of {} bytes",
            dst.len()
        )));
    }
    Ok(())
}

/// A chunk's frame as stored on L3, fetched but not yet decoded: decode
/// it where the bytes belong (the restore decodes straight into the
/// destination buffers).
pub struct Frame {
    pub(crate) id: ChunkId,
    pub(crate) bytes: Vec<u8>,
    pub(crate) what: String,
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Frame({}, {} bytes)", self.id, self.bytes.len())
    }
}

thread_local! {
    /// One decoder per thread: its scratch planes stay allocated and
    /// faulted in from one chunk to the next.
    static DECODER: std::cell::RefCell<Option<FrameDecoder>> =
        const { std::cell::RefCell::new(None) };
}

impl Frame {
    /// A raw (uncompressed) frame of verified bytes: what a tier that
    /// stores chunks raw hands out as its "stored frame".
    pub fn raw(id: ChunkId, data: &[u8], what: String) -> Result<Frame> {
        let mut enc =
            strata_format::frame::FrameEncoder::new(strata_format::codec::EncodeOptions::RAW)
                .map_err(StoreError::from)?;
        let bytes = enc
            .encode(data, strata_format::codec::ElemHint::BYTES, Some(id))
            .map_err(StoreError::from)?;
        Ok(Frame { id, bytes, what })
    }

    /// The chunk this frame claims to hold (checked by
    /// [`Self::decode_into`]).
    pub fn id(&self) -> ChunkId {
        self.id
    }

    fn corrupt(&self, source: strata_format::FormatError) -> StoreError {
        StoreError::Corrupt {
            what: self.what.clone(),
            source,
        }
    }

    /// Runs `f` with this thread's decoder.
    fn with_decoder<T>(
        &self,
        f: impl FnOnce(&mut FrameDecoder) -> strata_format::Result<T>,
    ) -> Result<T> {
        DECODER.with(|cell| {
            let mut slot = cell
                .try_borrow_mut()
                .map_err(|_| StoreError::Internal("frame decoder in use".into()))?;
            let dec = match &mut *slot {
                Some(d) => d,
                empty => empty.insert(FrameDecoder::new().map_err(|e| self.corrupt(e))?),
            };
            f(dec).map_err(|e| self.corrupt(e))
        })
    }

    /// The chunk's length once decoded (from the frame's checked header).
    pub fn raw_len(&self) -> Result<usize> {
        let h = self.with_decoder(|d| d.header(&self.bytes))?;
        Ok(h.raw_len as usize)
    }

    /// Bytes as stored (after the tier's codec).
    pub fn stored_len(&self) -> usize {
        self.bytes.len()
    }

    /// Decodes the chunk into `dst` (exactly [`Self::raw_len`] bytes) and
    /// verifies it is the chunk asked for. On an error `dst` holds no
    /// meaningful bytes.
    pub fn decode_into(&self, dst: &mut [u8]) -> Result<()> {
        self.with_decoder(|d| d.decode_into(&self.bytes, Some(&self.id), dst))?;
        Ok(())
    }

    /// The frame's buffer, for the next [`crate::L3Store::get_frame`].
    pub fn into_buf(self) -> Vec<u8> {
        self.bytes
    }
}
