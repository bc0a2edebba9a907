//! The save pipeline, owned in one place: the snapshot of a step into
//! pre-faulted staging memory on the caller's thread ([`snapshot`]: the
//! plan of chunks and segments, the copies, from host or GPU), then in the
//! background the persist worker ([`persist`]: hashing, the L1 writes of
//! new chunk ids, the manifest, the vote and the commit record, retention).
//! Beside the L1 write it offers each hashed batch to the mirror's eager
//! push ([`crate::mirror::eager`]), and L1 retention keeps what the
//! mirror still copies ([`crate::mirror::held_on_l1`]): the save path
//! calls the mirror, never the other way. The API (`Checkpointer::save`)
//! and the builder start it; the replicator and the uploader hear of its
//! commits as subscribers.

pub(crate) mod persist;
pub(crate) mod snapshot;
