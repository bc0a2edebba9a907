//! How ranks agree: the [`Coordinator`](coordinator::Coordinator) trait and
//! its in-process implementations ([`coordinator`]), the etcd one
//! ([`etcd`]: leases, fencing, TLS and auth), and the commit protocol built
//! on them ([`commit`]: the barrier, the votes, the records, the events
//! the workers subscribe to; see `docs/commit-protocol.md`), and the
//! decision a reducing round sends every rank ([`verdict`]). It imports
//! only the crate's errors and settings.

pub(crate) mod commit;
pub mod coordinator;
pub mod etcd;
pub(crate) mod verdict;
