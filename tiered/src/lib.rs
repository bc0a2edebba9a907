//! # strata-tiered
//!
//! The seam between Strata's engine and its storage tiers. This crate will hold:
//!
//! * the `ChunkStore` trait — put chunks (idempotent by id), get a verified chunk
//!   or a range of it, which ids are present, put/get shard manifests, commit,
//!   list checkpoints with their state, delete — with its contract written down
//!   and one conformance suite every tier must pass;
//! * L1, a content-addressed chunk store on the node's local disk, written and
//!   read with io_uring (O_DIRECT, aligned owned buffers, several requests in
//!   flight) on dedicated I/O threads, with a `pread`/`pwrite` fallback chosen
//!   at start-up;
//! * L3, a `ChunkStore` over `object_store` (S3, GCS, Azure, local files,
//!   memory), compressed with the byte-plane codec, committed with
//!   create-only writes;
//! * wrappers over any store: retries, bandwidth caps, metrics, fault injection.
//!
//! It depends only on `strata-format`; nothing here is written yet (see the
//! L1 and L3 issues).
