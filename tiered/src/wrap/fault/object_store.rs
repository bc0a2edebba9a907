//! [`FaultStore`] over an `ObjectStore`: the failures of a real object
//! store under [`L3Store`](crate::L3Store) (503s, timeouts, dropped
//! connections, a server that stops taking writes, create-only puts it does
//! not implement, multipart parts that fail, damaged bodies).
//!
//! Which calls draw which faults follows what L3 retries: every call but
//! deletions meets the outage, the latency and the error and timeout draw;
//! puts and gets may also lose their connection after the store served
//! them, and gets may come back damaged.

use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use super::{Call, Class, Damage, Fault, FaultStore};

fn err(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: what.to_string().into(),
    }
}

/// A fault as the server would word it.
fn server_err(f: Fault) -> object_store::Error {
    err(match f {
        Fault::Outage => "503 Service Unavailable (outage)",
        Fault::Error => "503 Slow Down",
        Fault::Timeout => "operation timed out",
        Fault::Drop => "connection reset by peer",
    })
}

/// A multipart upload whose parts all fail ([`FaultPlan::fail_parts`]).
///
/// [`FaultPlan::fail_parts`]: super::FaultPlan::fail_parts
#[derive(Debug)]
struct FailingParts(Box<dyn MultipartUpload>);

#[async_trait]
impl MultipartUpload for FailingParts {
    fn put_part(&mut self, _data: PutPayload) -> object_store::UploadPart {
        Box::pin(async { Err(err("500 part upload failed")) })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.0.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.0.abort().await
    }
}

impl<S: ObjectStore> FaultStore<S> {
    /// Damages a get's body (collected first) by the plan's draws.
    async fn damage_body(&self, call: &mut Call, r: GetResult) -> object_store::Result<GetResult> {
        let damage = self.draw_damage(call);
        if matches!(damage, Damage::None) {
            return Ok(r);
        }
        let GetResult {
            payload,
            meta,
            range,
            attributes,
            extensions,
        } = r;
        let body = GetResult {
            payload,
            meta: meta.clone(),
            range: range.clone(),
            attributes: Default::default(),
            extensions: Default::default(),
        };
        let mut bytes = body.bytes().await?.to_vec();
        self.damage_bytes(&damage, &mut bytes);
        let damaged = Bytes::from(bytes);
        Ok(GetResult {
            payload: GetResultPayload::Stream(futures::stream::once(async { Ok(damaged) }).boxed()),
            meta,
            range,
            attributes,
            extensions,
        })
    }
}

#[async_trait]
impl<S: ObjectStore> ObjectStore for FaultStore<S> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if self.plan.no_conditional_put && matches!(opts.mode, PutMode::Create) {
            return Err(object_store::Error::NotImplemented {
                operation: "put with PutMode::Create".into(),
                implementer: "faulty store without conditional writes".into(),
            });
        }
        let mut call = self.gate(Class::Write).await.map_err(server_err)?;
        let r = self.inner.put_opts(location, payload, opts).await;
        self.close(&mut call, r.is_ok()).map_err(server_err)?;
        r
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.gate(Class::Write).await.map_err(server_err)?;
        let up = self.inner.put_multipart_opts(location, opts).await?;
        if self.plan.fail_parts {
            return Ok(Box::new(FailingParts(up)));
        }
        Ok(up)
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let mut call = self.gate(Class::Read).await.map_err(server_err)?;
        let r = self.inner.get_opts(location, options).await;
        self.close(&mut call, r.is_ok()).map_err(server_err)?;
        self.damage_body(&mut call, r?).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.gate(Class::Read).await.map_err(server_err)?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let fail = |f: Fault| futures::stream::once(async move { Err(server_err(f)) }).boxed();
        let mut call = match self.open(Class::List) {
            Ok(c) => c,
            Err(f) => return fail(f),
        };
        let delay = call.delay;
        match self.draw_failure(&mut call) {
            Some(Fault::Timeout) => {
                let hang = delay + self.plan.timeout;
                futures::stream::once(async move {
                    tokio::time::sleep(hang).await;
                    Err(server_err(Fault::Timeout))
                })
                .boxed()
            }
            Some(f) => fail(f),
            None if delay.is_zero() => self.inner.list(prefix),
            None => {
                let listing = self.inner.list(prefix);
                futures::stream::once(async move {
                    tokio::time::sleep(delay).await;
                    listing
                })
                .flatten()
                .boxed()
            }
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.gate(Class::List).await.map_err(server_err)?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.gate(Class::Write).await.map_err(server_err)?;
        self.inner.copy_opts(from, to, options).await
    }
}
