//! Incomplete multipart uploads: what a writer killed in the middle of a
//! large chunk's upload leaves on object storage. The parts are invisible
//! to every listing of objects, yet billed until aborted.
//!
//! - S3 (and S3-compatible servers that implement it): `ListMultipartUploads`
//!   under the job's chunk prefix, then `AbortMultipartUpload` for each one
//!   begun before the cutoff. `object_store` has no listing call for them,
//!   so the listing is one signed GET per page of 1,000, read with a bound.
//! - `file://`: `object_store` stages a multipart upload as `<key>#<n>`
//!   beside its key; stale staging files are removed.
//! - GCS, Azure: not listed here. GCS needs a bucket lifecycle rule
//!   (`AbortIncompleteMultipartUpload`); Azure drops uncommitted blocks by
//!   itself after seven days (docs/gc.md).
//!
//! The cutoff is on the store's clock ([`crate::ChunkStore::now`]), and S3
//! stamps `Initiated` with that same clock.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjPath;
use object_store::ClientOptions;
use serde::Deserialize;

use super::os_err;
use crate::error::{Result, StoreError};

/// Largest page of a listing read back (1,000 uploads are about 300 KB).
const MAX_PAGE_LEN: usize = 8 << 20;
/// Most pages read in one sweep (a million uploads); the next sweep goes on.
const MAX_PAGES: usize = 1000;

/// How a store's incomplete uploads are found.
pub(crate) enum Uploads {
    /// S3: listed with a signed GET, aborted through `object_store`.
    S3(S3Uploads),
    /// A local directory: staging files beside their keys.
    File(PathBuf),
    /// Nothing to list (memory, or a provider whose uploads expire by a
    /// rule of the bucket).
    None,
}

/// What it takes to list an S3 bucket's multipart uploads.
pub(crate) struct S3Uploads {
    pub(crate) s3: Arc<AmazonS3>,
    pub(crate) http: HttpClient,
    /// `https://host/bucket` (path style) or `https://bucket.host`.
    pub(crate) bucket_url: url::Url,
    pub(crate) bucket: String,
    pub(crate) region: String,
}

impl S3Uploads {
    /// From the builder's settings, before it is consumed by `build`.
    pub(crate) fn new(
        s3: Arc<AmazonS3>,
        b: &object_store::aws::AmazonS3Builder,
        url: &url::Url,
    ) -> Result<Self> {
        use object_store::aws::AmazonS3ConfigKey as K;
        use object_store::client::ClientConfigKey;
        let get = |k: K| b.get_config_value(&k);
        // The URL names the bucket (the builder reads it only in `build`).
        let bucket = url
            .host_str()
            .map(str::to_string)
            .or_else(|| get(K::Bucket))
            .unwrap_or_default();
        let region = get(K::Region).unwrap_or_else(|| "us-east-1".to_string());
        let virtual_hosted = get(K::VirtualHostedStyleRequest).is_some_and(|v| truthy(&v));
        let allow_http = get(K::Client(ClientConfigKey::AllowHttp)).is_some_and(|v| truthy(&v));
        let base = match (get(K::Endpoint), virtual_hosted) {
            // With virtual-hosted requests, an endpoint already names the bucket.
            (Some(e), true) => e,
            (Some(e), false) => format!("{}/{bucket}", e.trim_end_matches('/')),
            (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
            (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
        };
        let bucket_url = url::Url::parse(&base)
            .map_err(|e| StoreError::invalid("S3 endpoint", format!("{base:?}: {e}")))?;
        // The same client settings as the store's own (proxy, CA,
        // timeouts, ...), so the listing goes where the store's requests go.
        let mut options = ClientOptions::new().with_allow_http(allow_http);
        for k in [
            ClientConfigKey::AllowInvalidCertificates,
            ClientConfigKey::NoSystemCertificates,
            ClientConfigKey::ConnectTimeout,
            ClientConfigKey::Timeout,
            ClientConfigKey::ReadTimeout,
            ClientConfigKey::ProxyUrl,
            ClientConfigKey::ProxyCaCertificate,
            ClientConfigKey::ProxyExcludes,
            ClientConfigKey::UserAgent,
            ClientConfigKey::Http1Only,
            ClientConfigKey::Http2Only,
        ] {
            if let Some(v) = get(K::Client(k)) {
                options = options.with_config(k, v);
            }
        }
        let http = ReqwestConnector {}
            .connect(&options)
            .map_err(|e| StoreError::invalid("S3 client", e.to_string()))?;
        Ok(S3Uploads {
            s3,
            http,
            bucket_url,
            bucket,
            region,
        })
    }

    /// Aborts the uploads under `prefix` begun before `cutoff`. A server
    /// that does not implement the listing (501) has nothing aborted.
    async fn abort_before(&self, prefix: &ObjPath, cutoff: SystemTime) -> Result<u64> {
        let mut marker: Option<(String, String)> = None;
        let mut aborted = 0;
        for _ in 0..MAX_PAGES {
            let Some(page) = self.list_page(prefix, marker.as_ref()).await? else {
                // The server does not list uploads (501): nothing to do
                // here; a lifecycle rule of the bucket is the remedy.
                tracing::warn!(
                    "{} does not list multipart uploads: stale ones are left to the bucket's lifecycle rule",
                    self.bucket_url
                );
                return Ok(aborted);
            };
            for u in &page.upload {
                let initiated = chrono::DateTime::parse_from_rfc3339(&u.initiated)
                    .map(SystemTime::from)
                    .map_err(|e| {
                        StoreError::Unavailable(format!(
                            "S3 listed upload {} of {} with an unreadable time {:?}: {e}",
                            u.upload_id, u.key, u.initiated
                        ))
                    })?;
                if initiated >= cutoff {
                    continue;
                }
                let key = ObjPath::parse(&u.key)
                    .map_err(|e| StoreError::invalid("listed upload key", e.to_string()))?;
                match self.s3.abort_multipart(&key, &u.upload_id).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => aborted += 1,
                    Err(e) => return Err(os_err(format!("aborting the upload of {key}"), e)),
                }
            }
            match (
                page.is_truncated,
                page.next_key_marker,
                page.next_upload_id_marker,
            ) {
                (true, Some(k), Some(u)) if !k.is_empty() => marker = Some((k, u)),
                _ => return Ok(aborted),
            }
        }
        Ok(aborted)
    }

    async fn list_page(
        &self,
        prefix: &ObjPath,
        marker: Option<&(String, String)>,
    ) -> Result<Option<ListPage>> {
        let what = || format!("listing the multipart uploads under {prefix}");
        let mut url = self.bucket_url.clone();
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("uploads", "");
            q.append_pair("prefix", &format!("{prefix}/"));
            if let Some((k, u)) = marker {
                q.append_pair("key-marker", k);
                q.append_pair("upload-id-marker", u);
            }
        }
        let mut req = http::Request::builder()
            .method(http::Method::GET)
            .uri(url.as_str())
            .body(HttpRequestBody::empty())
            .map_err(|e| StoreError::invalid("S3 request", e.to_string()))?;
        let cred = self
            .s3
            .credentials()
            .get_credential()
            .await
            .map_err(|e| os_err(what(), e))?;
        AwsAuthorizer::new(&cred, "s3", &self.region)
            .try_authorize(&mut req, None)
            .map_err(|e| os_err(what(), e))?;
        let resp = self
            .http
            .execute(req)
            .await
            .map_err(|e| StoreError::Unavailable(format!("{}: {e}", what())))?;
        let status = resp.status();
        let body = read_bounded(resp.into_body(), MAX_PAGE_LEN)
            .await
            .map_err(|e| StoreError::Unavailable(format!("{}: {e}", what())))?;
        if status.as_u16() == 501 {
            return Ok(None);
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
            return Err(match status.as_u16() {
                401 | 403 => StoreError::Unauthorized(format!("{}: {status} {text}", what())),
                _ => StoreError::Unavailable(format!("{}: {status} {text}", what())),
            });
        }
        let page: ListPage = quick_xml::de::from_reader(body.as_slice())
            .map_err(|e| StoreError::Unavailable(format!("{}: unreadable answer: {e}", what())))?;
        // Only the listing of this bucket is believed (another document,
        // such as a list of buckets, has no `Bucket` and fails to parse).
        if page.bucket != self.bucket {
            return Err(StoreError::Unavailable(format!(
                "{}: the answer lists bucket {:?}, not {:?}",
                what(),
                page.bucket,
                self.bucket
            )));
        }
        Ok(Some(page))
    }
}

fn truthy(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes")
}

/// Reads a response body of at most `max` bytes (a longer one is an error
/// before it is all held).
async fn read_bounded(
    body: object_store::client::HttpResponseBody,
    max: usize,
) -> std::result::Result<Vec<u8>, String> {
    use futures::StreamExt;
    let mut out = Vec::new();
    let mut s = body.bytes_stream();
    while let Some(piece) = s.next().await {
        let piece = piece.map_err(|e| e.to_string())?;
        if out.len() + piece.len() > max {
            return Err(format!("answer longer than {max} bytes"));
        }
        out.extend_from_slice(&piece);
    }
    Ok(out)
}

/// One page of `ListMultipartUploads`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListPage {
    bucket: String,
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_key_marker: Option<String>,
    #[serde(default)]
    next_upload_id_marker: Option<String>,
    #[serde(default)]
    upload: Vec<Upload>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Upload {
    key: String,
    upload_id: String,
    initiated: String,
}

impl Uploads {
    /// Aborts the incomplete uploads under `prefix` (the job's chunks)
    /// begun before `cutoff`; returns how many.
    pub(crate) async fn abort_before(
        &self,
        prefix: &ObjPath,
        dir_prefix: &[&str],
        cutoff: SystemTime,
    ) -> Result<u64> {
        match self {
            Uploads::S3(s3) => s3.abort_before(prefix, cutoff).await,
            Uploads::File(root) => {
                let mut dir = root.clone();
                dir.extend(dir_prefix);
                tokio::task::spawn_blocking(move || remove_staging_files(&dir, cutoff))
                    .await
                    .map_err(|e| StoreError::Internal(format!("staging sweep: {e}")))?
            }
            Uploads::None => Ok(0),
        }
    }
}

/// Removes `object_store`'s staging files (`<name>#<digits>`) under `dir`,
/// two levels deep as chunk keys are, last modified before `cutoff`.
fn remove_staging_files(dir: &std::path::Path, cutoff: SystemTime) -> Result<u64> {
    let mut removed = 0;
    let fanout = match std::fs::read_dir(dir) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(StoreError::io("listing staged uploads", dir, e)),
    };
    for sub in fanout {
        let sub = sub.map_err(|e| StoreError::io("listing staged uploads", dir, e))?;
        let files = match std::fs::read_dir(sub.path()) {
            Ok(d) => d,
            // A file, or gone meanwhile: nothing staged under it.
            Err(_) => continue,
        };
        for f in files {
            let f = f.map_err(|e| StoreError::io("listing staged uploads", sub.path(), e))?;
            let name = f.file_name();
            let staged = name
                .to_str()
                .and_then(|n| n.rsplit_once('#'))
                .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            if !staged {
                continue;
            }
            let old = f
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t < cutoff);
            if old {
                match std::fs::remove_file(f.path()) {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StoreError::io("removing a staged upload", f.path(), e)),
                }
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_page_parses() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>b</Bucket><KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker>
  <NextKeyMarker>j/chunks/ab/abcd</NextKeyMarker><NextUploadIdMarker>u2</NextUploadIdMarker>
  <MaxUploads>1000</MaxUploads><IsTruncated>true</IsTruncated>
  <Upload><Key>j/chunks/aa/aaaa</Key><UploadId>u1</UploadId>
    <Initiator><ID>x</ID></Initiator><StorageClass>STANDARD</StorageClass>
    <Initiated>2026-11-24T04:48:33.000Z</Initiated></Upload>
  <Upload><Key>j/chunks/ab/abcd</Key><UploadId>u2</UploadId>
    <Initiated>2026-11-24T04:49:00Z</Initiated></Upload>
</ListMultipartUploadsResult>"#;
        let page: ListPage = quick_xml::de::from_str(xml).unwrap();
        assert!(page.is_truncated);
        assert_eq!(page.upload.len(), 2);
        assert_eq!(page.upload[1].upload_id, "u2");
        assert_eq!(page.next_key_marker.as_deref(), Some("j/chunks/ab/abcd"));
        let empty = r#"<ListMultipartUploadsResult><Bucket>b</Bucket><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>"#;
        let page: ListPage = quick_xml::de::from_str(empty).unwrap();
        assert!(page.upload.is_empty() && !page.is_truncated);
        // Another document has no bucket: refused, not an empty page.
        let other = r#"<ListAllMyBucketsResult><Buckets/></ListAllMyBucketsResult>"#;
        assert!(quick_xml::de::from_str::<ListPage>(other).is_err());
    }

    #[test]
    fn only_old_staging_files_are_removed() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("ab");
        std::fs::create_dir_all(&sub).unwrap();
        for n in ["abcd#1", "abcd", "abcd#x1", "abce#22"] {
            std::fs::write(sub.join(n), b"x").unwrap();
        }
        let later = SystemTime::now() + std::time::Duration::from_secs(60);
        assert_eq!(
            remove_staging_files(d.path(), SystemTime::UNIX_EPOCH).unwrap(),
            0
        );
        assert_eq!(remove_staging_files(d.path(), later).unwrap(), 2);
        let mut left: Vec<_> = std::fs::read_dir(&sub)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["abcd", "abcd#x1"]);
    }
}
