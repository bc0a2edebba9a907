//! The save pipeline, owned in one place: the snapshot of a step into
//! pre-faulted staging memory on the caller's thread ([`snapshot`]: the
//! plan of chunks and segments, the copies, from host or GPU), then in the
//! background the persist worker ([`persist`]: hashing, the L1 writes of
//! new chunk ids, the manifest, the vote and the commit record, retention)
//! and, beside the L1 write, the eager push of new chunks to the peers
//! ([`eager_push`]). The API (`Checkpointer::save`) and the builder start
//! it; the replicator and the uploader hear of its commits as subscribers.

pub(crate) mod eager_push;
pub(crate) mod persist;
pub(crate) mod snapshot;
