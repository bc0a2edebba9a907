//! Settings of an L3 store, and the option keys Strata reads itself.

use std::time::Duration;

use strata_format::codec::EncodeOptions;

use crate::error::{Result, StoreError};
use crate::wrap::RetryPolicy;

/// Settings of an L3 store.
#[derive(Clone, Debug)]
pub struct L3Options {
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Frames larger than this are uploaded in parts.
    pub multipart_threshold: usize,
    /// Part size of multipart uploads (S3 needs at least 5 MiB).
    pub part_size: usize,
    /// Reads of larger objects are split into ranged GETs of this size,
    /// issued at once (one connection of a cloud store rarely carries more
    /// than 100 MB/s).
    pub range_size: usize,
    /// How chunks are encoded.
    pub codec: EncodeOptions,
    /// Accept a store without create-if-absent writes, committing with a
    /// check then a put (not atomic; see the module documentation).
    pub non_atomic_commits: bool,
    /// Retries of failed requests (throttling, 5xx, timeouts, dropped
    /// connections) with exponential backoff: by the HTTP client for each
    /// request, and by the [`RetryStore`] of [`L3Store::into_tier`] for each
    /// call that still fails `Unavailable` (see [`Self::retry_policy`]).
    ///
    /// [`RetryStore`]: crate::RetryStore
    /// [`L3Store::into_tier`]: crate::L3Store::into_tier
    pub max_retries: usize,
    /// Give up retrying a request after this long (and a call after this
    /// long without progress).
    pub retry_timeout: Duration,
    /// Chunks encoded (compressed) at once for uploads. Uploads run beside
    /// training, so by default they take a quarter of the cores (at least
    /// one); reads decode on as many as they need.
    pub encode_threads: usize,
    /// A chunk older than this (by the object store's clock) counts as
    /// missing to `has_chunks`, so an upload that reuses it writes it again
    /// and refreshes its age: garbage collection, which deletes only chunks
    /// older than its grace period, then never deletes a chunk an upload in
    /// flight relies on (set it to half the grace period; None: never).
    pub refresh_after: Option<Duration>,
}

impl Default for L3Options {
    fn default() -> Self {
        L3Options {
            concurrency: 16,
            multipart_threshold: 8 << 20,
            part_size: 8 << 20,
            range_size: 8 << 20,
            codec: EncodeOptions::PLANES,
            non_atomic_commits: false,
            max_retries: 10,
            retry_timeout: Duration::from_secs(180),
            encode_threads: std::thread::available_parallelism()
                .map_or(1, |n| n.get() / 4)
                .max(1),
            refresh_after: None,
        }
    }
}

impl L3Options {
    /// The policy of the [`RetryStore`](crate::RetryStore) over an L3 tier
    /// ([`L3Store::into_tier`](crate::L3Store::into_tier)): `max_retries`
    /// retries, at most 7 (each call may be many HTTP requests, each
    /// retried by the client already), from 20 ms of backoff up to 5 s,
    /// none started `retry_timeout` after the first failure.
    pub fn retry_policy(&self) -> RetryPolicy {
        let retries = u32::try_from(self.max_retries).unwrap_or(u32::MAX).min(7);
        RetryPolicy {
            max_attempts: retries + 1,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(5),
            deadline: self.retry_timeout,
            ..RetryPolicy::default()
        }
    }

    /// Option keys Strata reads itself; every other key goes to the
    /// `object_store` builder.
    pub const KEYS: [&'static str; 7] = [
        "concurrency",
        "multipart_threshold",
        "part_size",
        "range_size",
        "non_atomic_commits",
        "max_retries",
        "encode_threads",
    ];

    /// Sets the option `key` (one of [`Self::KEYS`]) from text. Returns
    /// `Ok(false)` for a key that is not Strata's.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool> {
        let num = || {
            value
                .parse::<usize>()
                .map_err(|e| StoreError::invalid("L3 option", format!("{key}={value:?}: {e}")))
        };
        let positive = |n: usize| {
            if n == 0 {
                Err(StoreError::invalid(
                    "L3 option",
                    format!("{key} must be at least 1"),
                ))
            } else {
                Ok(n)
            }
        };
        match key {
            "concurrency" => self.concurrency = positive(num()?)?,
            "multipart_threshold" => self.multipart_threshold = num()?,
            "part_size" => {
                let n = num()?;
                if n < 5 << 20 {
                    return Err(StoreError::invalid(
                        "L3 option",
                        format!("part_size {n} is below S3's 5 MiB minimum"),
                    ));
                }
                self.part_size = n;
            }
            "range_size" => self.range_size = positive(num()?)?.max(64 << 10),
            "non_atomic_commits" => {
                self.non_atomic_commits = match value {
                    "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    _ => {
                        return Err(StoreError::invalid(
                            "L3 option",
                            format!("non_atomic_commits={value:?}: true or false"),
                        ))
                    }
                }
            }
            "max_retries" => self.max_retries = num()?,
            "encode_threads" => self.encode_threads = positive(num()?)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::L3Store;

    #[test]
    fn strata_options_parse_and_provider_keys_pass_through() {
        let mut o = L3Options::default();
        assert!(o.set("concurrency", "32").unwrap());
        assert_eq!(o.concurrency, 32);
        assert!(o.set("range_size", "1").unwrap());
        assert_eq!(o.range_size, 64 << 10, "clamped to 64 KiB");
        assert!(o.set("non_atomic_commits", "true").unwrap());
        assert!(o.non_atomic_commits);
        assert!(!o.set("endpoint", "http://x").unwrap());
        for (k, v) in [
            ("concurrency", "0"),
            ("concurrency", "many"),
            ("part_size", "1024"),
            ("non_atomic_commits", "perhaps"),
            ("encode_threads", "0"),
        ] {
            assert!(o.set(k, v).is_err(), "{k}={v}");
        }
        // from_url takes Strata's keys out before the provider sees them
        // (an unknown provider key would fail the build).
        let s = L3Store::from_url(
            "memory://",
            &[("concurrency".into(), "3".into())],
            L3Options::default(),
        )
        .unwrap();
        assert_eq!(s.options().concurrency, 3);
        let err = L3Store::from_url(
            "s3://b/p",
            &[("no_such_key".into(), "1".into())],
            L3Options::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("no_such_key"), "{err}");
    }
}
