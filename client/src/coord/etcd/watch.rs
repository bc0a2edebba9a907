//! etcd's watches: one gRPC `Watch` stream per watch, its create request
//! sent once, the changes handed over as they come, the stream reset when
//! the watch returns.

use std::time::Duration;

use super::api::{kv_of, prefix_end, Answer, EtcdApi, Event, MAX_RESPONSE};
use super::{grpc, proto};
use crate::error::Result;

impl EtcdApi {
    /// Waits until a key under `prefix` changes after `revision`, or `wait`
    /// passes. Returns whether something changed.
    pub(crate) async fn watch_prefix(
        &self,
        prefix: &[u8],
        revision: i64,
        wait: Duration,
    ) -> Result<bool> {
        self.watch(prefix, revision, wait, |_| true).await
    }

    /// Hands each change under `prefix` after `revision` to `seen` until it
    /// returns true (then returns true), or `wait` passes (false). A watch
    /// etcd cancels (its revision was compacted) returns true: the caller
    /// reads again. One request, however many changes it reports.
    pub(crate) async fn watch(
        &self,
        prefix: &[u8],
        revision: i64,
        wait: Duration,
        mut seen: impl FnMut(Event) -> bool + Send,
    ) -> Result<bool> {
        let create = proto::watch_create(prefix, &prefix_end(prefix), revision + 1);
        let watched = async {
            // The stream has no end of its own: the timeout around this
            // future ends it.
            let token = self.token();
            let method = proto::Method {
                path: "/etcdserverpb.Watch/Watch",
                stream: true,
            };
            let Answer { resp, open: _open } = self
                .send_grpc(
                    method,
                    &create,
                    wait + Duration::from_secs(5),
                    token.as_deref(),
                )
                .await?;
            let mut answer = grpc::Reader::new("watch", resp, MAX_RESPONSE)?;
            // Until etcd ends the stream: with an OK status, nothing
            // changed; with another, an error (an expired token, say).
            while let Some(m) = answer.next(|n| self.got(n)).await? {
                let m = proto::watch_message(&m)?;
                if m.canceled {
                    if !m.cancel_reason.is_empty() {
                        tracing::debug!(reason = %m.cancel_reason, "etcd ended a watch");
                    }
                    return Ok(true);
                }
                for (deleted, kv) in &m.events {
                    let kv = kv_of(kv)?;
                    let event = if *deleted {
                        Event::Delete(kv.key, kv.mod_revision)
                    } else {
                        Event::Put(kv)
                    };
                    if seen(event) {
                        return Ok(true);
                    }
                }
            }
            Ok(false)
        };
        match tokio::time::timeout(wait, watched).await {
            Ok(r) => r,
            Err(_) => Ok(false),
        }
    }
}
