//! The answer to each request after `Hello`: the `Service`'s dispatch from
//! a decoded request to [`Replicas`](crate::replicas::Replicas), off the
//! async workers where it blocks.

use std::sync::Arc;

use strata_format::CommitRecord;
use strata_tiered::StoreError;
use tokio::sync::Semaphore;

use super::{error, Service, Work};
use crate::proto::{ErrorCode, Request, Response, StepEntry};

impl Service {
    pub(super) async fn serve(
        &self,
        job: &str,
        req: Request,
        work: &Arc<Semaphore>,
        hold: &mut Option<Work>,
    ) -> Result<Response, StoreError> {
        let r = self.replicas.clone();
        let job_s = job.to_string();
        // Decoding, hashing and spill I/O block: off the async workers.
        let blocking = |f: Box<dyn FnOnce() -> Result<Response, StoreError> + Send>| async move {
            tokio::task::spawn_blocking(f)
                .await
                .map_err(|e| StoreError::Internal(format!("request task: {e}")))?
        };
        Ok(match req {
            Request::Hello { .. } => error(ErrorCode::Invalid, "already said hello".into()),
            Request::PutChunk { id, frame } => {
                let _decode = self.decode_permit(work, &frame).await?;
                blocking(Box::new(move || {
                    r.put_chunk(&job_s, id, frame.into())
                        .map(|new| Response::Stored { new })
                }))
                .await?
            }
            Request::HasChunks(ids) => Response::Present(self.replicas.has(job, &ids)?),
            Request::GetChunk { id, range: None } => {
                let stored = self.replicas.stored_len(job, &id)?;
                *hold = Some(
                    self.work_permit(work, self.spilled_len(job, &id)? + stored)
                        .await?,
                );
                blocking(Box::new(move || {
                    r.get_frame(&job_s, &id)
                        .map(|b| Response::Frame(b.to_vec()))
                }))
                .await?
            }
            Request::GetChunk {
                id,
                range: Some((a, b)),
            } => {
                // The whole chunk is decoded (and verified) for a range:
                // the spilled frame read back, the decoded chunk and the
                // range copied out of it for the answer, all within the
                // work budget until the answer is sent.
                let raw = self.replicas.raw_len(job, &id)?;
                let need = self.spilled_len(job, &id)? + raw + u64::from(b.saturating_sub(a));
                *hold = Some(self.work_permit(work, need).await?);
                let frame = {
                    let (r, job_s) = (r.clone(), job_s.clone());
                    tokio::task::spawn_blocking(move || r.get_frame(&job_s, &id))
                        .await
                        .map_err(|e| StoreError::Internal(format!("request task: {e}")))??
                };
                blocking(Box::new(move || {
                    r.range_of_frame(&id, &frame, a, b).map(Response::Bytes)
                }))
                .await?
            }
            Request::PutManifest { step, rank, bytes } => {
                self.replicas.put_manifest(job, step, rank, &bytes).await?;
                Response::Ok
            }
            Request::GetManifest { step, rank } => {
                // The answer copies the manifest: within the work budget.
                let len = self.replicas.held_len(job, step, rank)?;
                *hold = Some(self.work_permit(work, len).await?);
                Response::Bytes(self.replicas.get_manifest(job, step, rank).await?)
            }
            Request::ListSteps => {
                // The listing copies every record of the job (and its
                // encoding copies them again): within the work budget.
                let held = self.replicas.job_held_bytes(job)?;
                *hold = Some(self.work_permit(work, held.saturating_mul(2)).await?);
                let steps = self.replicas.list_steps(job).await?;
                let mut out = Vec::with_capacity(steps.len());
                for s in steps {
                    let records = s
                        .records
                        .values()
                        .map(CommitRecord::encode)
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| StoreError::Internal(e.to_string()))?;
                    out.push(StepEntry {
                        step: s.step,
                        manifests: s.manifests.into_iter().collect(),
                        records,
                    });
                }
                Response::Steps(out)
            }
            Request::Commit(bytes) => {
                let record = CommitRecord::decode(&bytes)
                    .map_err(|e| StoreError::invalid("commit record", e.to_string()))?;
                if record.job != job {
                    return Ok(error(
                        ErrorCode::Forbidden,
                        format!(
                            "a record of job {:?} on a connection of {job:?}",
                            record.job
                        ),
                    ));
                }
                // Retention after the commit reads every manifest of the
                // job back and lists its chunks with their ages (64 bytes
                // each, with the sets it builds): within the work budget.
                let (_, _, chunks) = self.replicas.job_stats(job)?;
                let need = self.replicas.job_held_bytes(job)? + 64 * chunks;
                *hold = Some(self.work_permit(work, need).await?);
                // Retention decodes every manifest of the job: on a
                // blocking thread, not on the runtime's workers.
                let (r, rt) = (self.replicas.clone(), tokio::runtime::Handle::current());
                let step = record.step;
                let freed = tokio::task::spawn_blocking(move || rt.block_on(r.commit(&record)))
                    .await
                    .map_err(|e| StoreError::Internal(format!("retention task: {e}")))??;
                if freed > 0 {
                    tracing::info!(job, step, freed, "retention freed chunk bytes");
                }
                Response::Ok
            }
            Request::DeleteStep(step) => {
                self.replicas.delete_step(job, step).await?;
                Response::Ok
            }
            Request::DeleteShard { step, rank } => {
                self.replicas.delete_shard(job, step, rank).await?;
                Response::Ok
            }
            Request::DeleteChunks(ids) => {
                blocking(Box::new(move || {
                    r.delete_chunks(&job_s, &ids).map(|()| Response::Ok)
                }))
                .await?
            }
            Request::ListChunks { after } => {
                // The job's ids are gathered and sorted for a page, and
                // the page is encoded: within the work budget.
                let (_, _, chunks) = self.replicas.job_stats(job)?;
                let page = crate::proto::MAX_IDS as u64;
                *hold = Some(self.work_permit(work, 32 * (chunks + 2 * page)).await?);
                Response::Ids(
                    self.replicas
                        .list_chunks_page(job, after, crate::proto::MAX_IDS)?,
                )
            }
            Request::Stats => Response::Stats(self.job_stats(job)),
            Request::SetPin { step, pinned } => {
                self.replicas.set_pin(job, step, pinned).await?;
                Response::Ok
            }
            Request::ListPins => {
                Response::Pins(self.replicas.list_pins(job).await?.into_iter().collect())
            }
        })
    }
}
