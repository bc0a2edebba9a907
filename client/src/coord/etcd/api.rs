//! The few calls of etcd's v3 API the coordinator needs, over etcd's
//! gRPC (HTTP/2 through `reqwest`, which the object-store client already
//! builds: no protobuf compiler and no gRPC stack at build time). Each
//! call is written in the JSON shape of etcd's gateway (keys and values in
//! base64, 64-bit numbers as strings) and sent as its protobuf message
//! ([`super::proto`]); etcd's gateway itself is not used: it costs etcd
//! twice the CPU of a gRPC call (JSON both ways, and a second gRPC hop
//! inside etcd), and etcd's CPU is what a round of thousands of nodes
//! waits on. Endpoints are tried in order until one answers; every
//! response is read under a size bound.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

use super::security::{check_auth_transport, Security};
use super::{grpc, proto};
use crate::error::{Error, Result};
use futures::StreamExt as _;

/// Largest response body read (a round of a large world is a few MB).
pub(super) const MAX_RESPONSE: usize = 64 << 20;

/// One key-value pair as etcd returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Kv {
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
    pub(crate) create_revision: i64,
    pub(crate) mod_revision: i64,
}

/// A client of one etcd cluster.
pub(crate) struct EtcdApi {
    http: reqwest::Client,
    endpoints: Vec<String>,
    /// etcd's authentication token, renewed when etcd says it expired.
    token: std::sync::Mutex<Option<String>>,
    user: Option<(String, String)>,
    timeout: Duration,
    /// Requests sent (each counted once, whichever endpoint answered).
    requests: std::sync::atomic::AtomicU64,
    /// Bytes of the answers read (watch streams included).
    received: std::sync::atomic::AtomicU64,
}

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Coordination(format!("etcd {what}: {e}"))
}

/// A key range: from (inclusive), to (exclusive; empty: the key alone).
pub(crate) type KeyRange<'a> = (&'a [u8], &'a [u8]);

/// The end of the key range holding every key that starts with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

fn num(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn bytes(v: &Value) -> Result<Vec<u8>> {
    match v {
        Value::String(s) => B64.decode(s).map_err(|e| err("response", e)),
        Value::Null => Ok(Vec::new()),
        other => Err(err("response", format!("not base64: {other}"))),
    }
}

fn kvs(v: &Value) -> Result<Vec<Kv>> {
    let Some(list) = v.get("kvs").and_then(Value::as_array) else {
        return Ok(Vec::new());
    };
    list.iter().map(kv_of).collect()
}

pub(super) fn kv_of(kv: &Value) -> Result<Kv> {
    Ok(Kv {
        key: bytes(&kv["key"])?,
        value: bytes(&kv["value"])?,
        create_revision: num(&kv["create_revision"]),
        mod_revision: num(&kv["mod_revision"]),
    })
}

/// The keys of the range reads at `ops` of a transaction's answer `v`.
fn range_answers(v: &Value, ops: std::ops::Range<usize>) -> Result<Vec<Vec<Kv>>> {
    ops.map(|i| kvs(&v["responses"][i]["response_range"]))
        .collect()
}

/// A range read in a transaction (`to` empty: the one key `from`).
fn range_op(from: &[u8], to: &[u8]) -> Value {
    let mut r = json!({"key": B64.encode(from)});
    if !to.is_empty() {
        r["range_end"] = Value::String(B64.encode(to));
    }
    json!({ "request_range": r })
}

/// An answer being read; for a stream, with what keeps its request open
/// (dropped with the answer, it ends the stream).
pub(super) struct Answer {
    pub(super) resp: reqwest::Response,
    /// Some exactly for a stream.
    pub(super) open: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A change a watch reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A key was put (with its new value).
    Put(Kv),
    /// A key was deleted (or its lease expired), at a revision.
    Delete(Vec<u8>, i64),
}

impl EtcdApi {
    /// A client of the cluster at `endpoints` (`http://host:port` or
    /// `https://…`); authenticates first when a user is given.
    pub(crate) async fn connect(
        endpoints: Vec<String>,
        sec: &Security,
        timeout: Duration,
    ) -> Result<Self> {
        if endpoints.is_empty() {
            return Err(Error::Config("etcd: no endpoint".into()));
        }
        check_auth_transport(&endpoints, sec)?;
        // A dead endpoint must not hold up the next one (nor a lease's
        // renewal) for a whole request timeout.
        // gRPC is HTTP/2 only: plain `http://` endpoints are spoken to in
        // HTTP/2 from the first byte, `https://` ones negotiate it (ALPN).
        // A connection that stopped answering (a partition) is found by
        // HTTP/2 pings and closed, so the next call connects anew (and
        // fails fast while the network is cut, or succeeds once it is
        // back): every call shares the one connection, which TCP alone
        // would keep retrying for minutes. Only while a stream is open
        // (a watch, a call), and no more often than etcd allows (its
        // `--grpc-keepalive-min-time`, 5 s by default; more often, or on an
        // idle connection, etcd answers with GOAWAY "too_many_pings").
        let mut b = reqwest::Client::builder()
            .http2_prior_knowledge()
            .http2_keep_alive_interval(Duration::from_secs(10))
            .http2_keep_alive_timeout(Duration::from_secs(5))
            .http2_keep_alive_while_idle(false)
            .connect_timeout(timeout.min(Duration::from_secs(2)))
            .pool_idle_timeout(Duration::from_secs(30));
        if let Some(ca) = &sec.ca_pem {
            let cert = reqwest::Certificate::from_pem(ca).map_err(|e| err("CA certificate", e))?;
            b = b.tls_certs_only([cert]);
        }
        if let Some(id) = &sec.identity_pem {
            let id = reqwest::Identity::from_pem(id).map_err(|e| err("client certificate", e))?;
            b = b.identity(id);
        }
        let http = b.build().map_err(|e| err("client", e))?;
        let api = EtcdApi {
            http,
            endpoints,
            token: std::sync::Mutex::new(None),
            user: sec.user.clone(),
            timeout,
            requests: std::sync::atomic::AtomicU64::new(0),
            received: std::sync::atomic::AtomicU64::new(0),
        };
        api.authenticate().await?;
        Ok(api)
    }

    /// Requests sent so far (keep-alives and watches included).
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes of answers read so far.
    pub(crate) fn received(&self) -> u64 {
        self.received.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) fn got(&self, n: usize) {
        self.received
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Gets a token for the user, if one is configured (anew: one expires).
    pub(crate) async fn authenticate(&self) -> Result<()> {
        let Some((name, password)) = &self.user else {
            return Ok(());
        };
        let r = self
            .call_once(
                "/v3/auth/authenticate",
                &json!({"name": name, "password": password}),
                self.timeout,
                None,
            )
            .await
            .map_err(|e| match e {
                // etcd refused the credentials: fix them, retrying will not
                // help (the password is never in etcd's answer).
                Error::Coordination(m) if m.contains("authentication failed") => Error::Store(
                    strata_tiered::StoreError::Unauthorized(format!("etcd user {name:?}: {m}")),
                ),
                other => other,
            })?;
        let token = r["token"]
            .as_str()
            .ok_or_else(|| Error::Coordination("etcd authenticate: no token".into()))?;
        if let Ok(mut t) = self.token.lock() {
            *t = Some(token.to_string());
        }
        Ok(())
    }

    /// Sends one call (at its gateway path, with the gateway's JSON body)
    /// as gRPC to the first endpoint that answers. A stream's request
    /// (a watch, a lease renewal) stays open until the answer is dropped.
    async fn send(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
        token: Option<&str>,
    ) -> Result<Answer> {
        let (method, msg) = proto::request(path, body)?;
        self.send_grpc(method, &msg, timeout, token).await
    }

    pub(super) async fn send_grpc(
        &self,
        method: proto::Method,
        msg: &[u8],
        timeout: Duration,
        token: Option<&str>,
    ) -> Result<Answer> {
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let framed = grpc::frame(msg)?;
        let mut errors = Vec::new();
        let mut none_answered = true;
        for ep in &self.endpoints {
            let (body, open) = if method.stream {
                // The request's one message, then nothing until the answer
                // is dropped: then the request fails, which resets the
                // stream, and etcd ends the watch or the renewal. (A body
                // left pending would keep the stream, and etcd's watch,
                // open after the answer is gone.)
                let (open, dropped) = tokio::sync::oneshot::channel::<()>();
                let first = futures::stream::once(std::future::ready(Ok::<_, std::io::Error>(
                    framed.clone(),
                )));
                let end = futures::stream::once(async move {
                    let _ = dropped.await;
                    Err(std::io::Error::other("the answer was dropped"))
                });
                (reqwest::Body::wrap_stream(first.chain(end)), Some(open))
            } else {
                (reqwest::Body::from(framed.clone()), None)
            };
            let mut req = self
                .http
                .post(format!("{}{}", ep.trim_end_matches('/'), method.path))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(body)
                .timeout(timeout);
            if let Some(t) = token {
                req = req.header("token", t);
            }
            match req.send().await {
                Ok(resp) => return Ok(Answer { resp, open }),
                // Without the URL, which may carry credentials; with the
                // causes ("error sending request" alone says nothing).
                Err(e) => {
                    none_answered &= not_answering(&e);
                    errors.push(format!(
                        "{}: {}",
                        strata_tiered::redact_url(ep),
                        crate::error::with_causes(&e.without_url())
                    ))
                }
            }
        }
        Err(Error::Coordination(format!(
            "{}: {}",
            if none_answered {
                NOT_ANSWERING
            } else {
                "etcd unreachable"
            },
            errors.join("; ")
        )))
    }

    pub(super) fn token(&self) -> Option<String> {
        self.token.lock().ok().and_then(|t| t.clone())
    }

    /// One request and its JSON answer (an error status is an error); an
    /// expired authentication token is renewed once and the request sent
    /// again.
    pub(crate) async fn call(&self, path: &str, body: &Value, timeout: Duration) -> Result<Value> {
        match self
            .call_once(path, body, timeout, self.token().as_deref())
            .await
        {
            Err(Error::Coordination(m)) if self.user.is_some() && m.contains("auth token") => {
                self.authenticate().await?;
                self.call_once(path, body, timeout, self.token().as_deref())
                    .await
            }
            r => r,
        }
    }

    async fn call_once(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
        token: Option<&str>,
    ) -> Result<Value> {
        // (`open` held to the end: dropping it ends a stream.)
        let Answer { resp, open } = self.send(path, body, timeout, token).await?;
        let stream = open.is_some();
        let mut answer = grpc::Reader::new(path, resp, MAX_RESPONSE)?;
        let got = |n| self.got(n);
        let Some(msg) = answer.next(got).await? else {
            return Err(err(path, "the answer ended without its message"));
        };
        // A call's status follows its message: read it (a stream, a lease
        // renewal's, is left at its first message).
        if !stream {
            if let Some(_more) = answer.next(got).await? {
                return Err(err(path, "more than one message in a call's answer"));
            }
        }
        let v = proto::response(path, &msg)?;
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            return Err(Error::Coordination(format!("etcd {path}: {e}")));
        }
        Ok(v)
    }

    /// Grants a lease of `ttl`; returns its id.
    pub(crate) async fn grant(&self, ttl: Duration, timeout: Duration) -> Result<i64> {
        let v = self
            .call(
                "/v3/lease/grant",
                &json!({"TTL": ttl.as_secs().max(1).to_string()}),
                timeout,
            )
            .await?;
        match num(&v["ID"]) {
            0 => Err(Error::Coordination("etcd lease grant: no id".into())),
            id => Ok(id),
        }
    }

    /// Renews a lease; returns its remaining TTL in seconds (0: it expired).
    pub(crate) async fn keepalive(&self, lease: i64, timeout: Duration) -> Result<i64> {
        let v = self
            .call(
                "/v3/lease/keepalive",
                &json!({"ID": lease.to_string()}),
                timeout,
            )
            .await?;
        Ok(num(&v["result"]["TTL"]))
    }

    /// Ends a lease (its keys go with it).
    pub(crate) async fn revoke(&self, lease: i64, timeout: Duration) -> Result<()> {
        self.call(
            "/v3/lease/revoke",
            &json!({"ID": lease.to_string()}),
            timeout,
        )
        .await
        .map(drop)
    }

    /// Puts `key` (attached to `lease` unless 0); returns the revision of
    /// the put.
    pub(crate) async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
        t: Duration,
    ) -> Result<i64> {
        let mut body = json!({"key": B64.encode(key), "value": B64.encode(value)});
        if lease != 0 {
            body["lease"] = Value::String(lease.to_string());
        }
        let v = self.call("/v3/kv/put", &body, t).await?;
        Ok(num(&v["header"]["revision"]))
    }

    /// Puts `key` only if it does not exist (returns the revision of the
    /// put); otherwise returns what is there.
    pub(crate) async fn create(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
        t: Duration,
    ) -> Result<std::result::Result<i64, Kv>> {
        let k = B64.encode(key);
        let mut put = json!({"key": k, "value": B64.encode(value)});
        if lease != 0 {
            put["lease"] = Value::String(lease.to_string());
        }
        let body = json!({
            "compare": [{"key": k, "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": put}],
            "failure": [{"request_range": {"key": k}}],
        });
        let v = self.call("/v3/kv/txn", &body, t).await?;
        if v["succeeded"].as_bool() == Some(true) {
            return Ok(Ok(num(&v["header"]["revision"])));
        }
        let held = kvs(&v["responses"][0]["response_range"])?;
        match held.into_iter().next() {
            Some(kv) => Ok(Err(kv)),
            // Gone between the compare and the range: try again later.
            None => Err(Error::Coordination(format!(
                "etcd create {}: contended",
                String::from_utf8_lossy(key)
            ))),
        }
    }

    /// Every key under `prefix`, and the store's revision.
    pub(crate) async fn range_prefix(&self, prefix: &[u8], t: Duration) -> Result<(Vec<Kv>, i64)> {
        let body = json!({
            "key": B64.encode(prefix),
            "range_end": B64.encode(prefix_end(prefix)),
        });
        let v = self.call("/v3/kv/range", &body, t).await?;
        Ok((kvs(&v)?, num(&v["header"]["revision"])))
    }

    /// The keys in `[from, to)`, and the store's revision.
    pub(crate) async fn range(
        &self,
        from: &[u8],
        to: &[u8],
        t: Duration,
    ) -> Result<(Vec<Kv>, i64)> {
        let body = json!({"key": B64.encode(from), "range_end": B64.encode(to)});
        let v = self.call("/v3/kv/range", &body, t).await?;
        Ok((kvs(&v)?, num(&v["header"]["revision"])))
    }

    /// Several ranges read at one revision (`to` empty: the one key
    /// `from`), and that revision.
    pub(crate) async fn ranges(
        &self,
        ranges: &[(&[u8], &[u8])],
        t: Duration,
    ) -> Result<(Vec<Vec<Kv>>, i64)> {
        let ops: Vec<Value> = ranges.iter().map(|(from, to)| range_op(from, to)).collect();
        let v = self
            .call("/v3/kv/txn", &json!({"compare": [], "success": ops}), t)
            .await?;
        let got = range_answers(&v, 0..ranges.len())?;
        Ok((got, num(&v["header"]["revision"])))
    }

    /// Reads the keys of `all` and those of `newer.0` written at revision
    /// `newer.1` or later (0: every key), at one revision: returns each
    /// range of `all`, the newer keys, how many keys `newer.0` holds in all
    /// (written before or not), and the revision.
    pub(crate) async fn ranges_and_newer(
        &self,
        all: &[KeyRange<'_>],
        newer: (KeyRange<'_>, i64),
        t: Duration,
    ) -> Result<(Vec<Vec<Kv>>, Vec<Kv>, i64, i64)> {
        let mut ops: Vec<Value> = all.iter().map(|(from, to)| range_op(from, to)).collect();
        let ((from, to), since) = newer;
        let mut op = range_op(from, to);
        op["request_range"]["min_mod_revision"] = Value::String(since.to_string());
        ops.push(op);
        let v = self
            .call("/v3/kv/txn", &json!({"compare": [], "success": ops}), t)
            .await?;
        let got = range_answers(&v, 0..all.len())?;
        let last = &v["responses"][all.len()]["response_range"];
        Ok((
            got,
            kvs(last)?,
            num(&last["count"]),
            num(&v["header"]["revision"]),
        ))
    }

    /// Puts `key` and reads the ranges `get` (`to` empty: the one key
    /// `from`), at one revision: returns that revision and each range.
    pub(crate) async fn put_and_get(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
        get: &[(&[u8], &[u8])],
        t: Duration,
    ) -> Result<(i64, Vec<Vec<Kv>>)> {
        let mut put = json!({"key": B64.encode(key), "value": B64.encode(value)});
        if lease != 0 {
            put["lease"] = Value::String(lease.to_string());
        }
        let mut ops = vec![json!({ "request_put": put })];
        ops.extend(get.iter().map(|(from, to)| range_op(from, to)));
        let body = json!({"compare": [], "success": ops});
        let v = self.call("/v3/kv/txn", &body, t).await?;
        let got = range_answers(&v, 1..get.len() + 1)?;
        Ok((num(&v["header"]["revision"]), got))
    }

    /// Creates `key` (it must not exist) while no key in the ranges of
    /// `unchanged_since` (each `from`, `to`) was written after revision
    /// `rev`, and the key of `held` exists, last written at its revision;
    /// in the same transaction puts each of `before` (empty values, ahead
    /// of `key`: a watcher sees them first) and deletes the keys in each
    /// range of `clear`. Returns the revision of the put, or what `key` holds when
    /// a condition failed (`None`: it is absent, so a range or a held key
    /// changed).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn create_and_clear(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
        before: &[Vec<u8>],
        unchanged_since: Option<(&[KeyRange<'_>], i64)>,
        held: Option<(&[u8], i64)>,
        clear: &[KeyRange<'_>],
        t: Duration,
    ) -> Result<std::result::Result<i64, Option<Kv>>> {
        let k = B64.encode(key);
        let mut compare = vec![json!({"key": k, "target": "CREATE", "create_revision": "0"})];
        if let Some((ranges, rev)) = unchanged_since {
            for (from, to) in ranges {
                // Every key of the range last written at or before `rev`.
                compare.push(json!({
                    "key": B64.encode(from),
                    "range_end": B64.encode(to),
                    "target": "MOD",
                    "result": "LESS",
                    "mod_revision": (rev + 1).to_string(),
                }));
            }
        }
        if let Some((key, at)) = held {
            // A key that is gone has mod revision 0: the compare fails.
            compare.push(json!({
                "key": B64.encode(key),
                "target": "MOD",
                "result": "EQUAL",
                "mod_revision": at.to_string(),
            }));
        }
        let leased = |k: String, v: &[u8]| {
            let mut put = json!({"key": k, "value": B64.encode(v)});
            if lease != 0 {
                put["lease"] = Value::String(lease.to_string());
            }
            json!({ "request_put": put })
        };
        let mut success: Vec<Value> = before.iter().map(|b| leased(B64.encode(b), &[])).collect();
        success.push(leased(k.clone(), value));
        for (from, to) in clear {
            success.push(json!({"request_delete_range": {"key": B64.encode(from), "range_end": B64.encode(to)}}));
        }
        let body = json!({
            "compare": compare,
            "success": success,
            "failure": [{"request_range": {"key": k}}],
        });
        let v = self.call("/v3/kv/txn", &body, t).await?;
        if v["succeeded"].as_bool() == Some(true) {
            return Ok(Ok(num(&v["header"]["revision"])));
        }
        Ok(Err(kvs(&v["responses"][0]["response_range"])?
            .into_iter()
            .next()))
    }

    /// Every key under each of two prefixes, read at one revision (a
    /// consistent view of both).
    pub(crate) async fn range_two(
        &self,
        a: &[u8],
        b: &[u8],
        t: Duration,
    ) -> Result<(Vec<Kv>, Vec<Kv>, i64)> {
        let range = |p: &[u8]| json!({"request_range": {"key": B64.encode(p), "range_end": B64.encode(prefix_end(p))}});
        let body = json!({"compare": [], "success": [range(a), range(b)]});
        let v = self.call("/v3/kv/txn", &body, t).await?;
        Ok((
            kvs(&v["responses"][0]["response_range"])?,
            kvs(&v["responses"][1]["response_range"])?,
            num(&v["header"]["revision"]),
        ))
    }

    /// Puts `key` only if it was last modified at `mod_revision` (nobody
    /// changed it since it was read); returns the revision of the put, if
    /// it did.
    pub(crate) async fn replace(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
        mod_revision: i64,
        t: Duration,
    ) -> Result<Option<i64>> {
        let k = B64.encode(key);
        let mut put = json!({"key": k, "value": B64.encode(value)});
        if lease != 0 {
            put["lease"] = Value::String(lease.to_string());
        }
        let body = json!({
            "compare": [{"key": k, "target": "MOD", "mod_revision": mod_revision.to_string()}],
            "success": [{"request_put": put}],
        });
        let v = self.call("/v3/kv/txn", &body, t).await?;
        Ok((v["succeeded"].as_bool() == Some(true)).then(|| num(&v["header"]["revision"])))
    }

    /// Puts `key` only while it is attached to lease `expect` (still the
    /// writer's own); returns whether it did.
    pub(crate) async fn put_if_lease(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
        expect: i64,
        t: Duration,
    ) -> Result<bool> {
        let k = B64.encode(key);
        let body = json!({
            "compare": [{"key": k, "target": "LEASE", "lease": expect.to_string()}],
            "success": [{"request_put": {"key": k, "value": B64.encode(value), "lease": lease.to_string()}}],
        });
        let v = self.call("/v3/kv/txn", &body, t).await?;
        Ok(v["succeeded"].as_bool() == Some(true))
    }

    /// Deletes `key`.
    pub(crate) async fn delete(&self, key: &[u8], t: Duration) -> Result<()> {
        self.call("/v3/kv/deleterange", &json!({"key": B64.encode(key)}), t)
            .await
            .map(drop)
    }
}

/// Runs `read` until it answers, retrying a failure every 200 ms while
/// `deadline` has not passed (etcd restarting, a leader election); the
/// failure once it has. `stop`'s error ends it at once.
pub(crate) async fn until_answered<T, F, Fut>(
    deadline: std::time::Instant,
    stop: impl Fn() -> Result<()>,
    mut read: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    loop {
        // Checked before every try: a process that lost its ranks (its
        // lease expired) fails at once; no read can bring them back.
        stop()?;
        match read().await {
            Ok(v) => return Ok(v),
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "etcd read failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// How a call fails when no endpoint answered at all (refused, no route,
/// no answer in time): etcd is not there, or not yet, which waiting may
/// change; any other failure (a certificate, another protocol) it would
/// not. A process's first contact waits out this one only.
pub(super) const NOT_ANSWERING: &str = "etcd does not answer";

/// Whether `e` says nothing answered at the endpoint, by the I/O error
/// under it (not its words, which vary by platform).
fn not_answering(e: &reqwest::Error) -> bool {
    use std::io::ErrorKind as K;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = next {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                K::ConnectionRefused | K::HostUnreachable | K::NetworkUnreachable | K::TimedOut
            ) {
                return true;
            }
        }
        next = c.source();
    }
    e.is_timeout()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn responses_decode_and_bad_ones_are_errors() {
        let v = json!({"kvs": [{"key": B64.encode("k"), "value": B64.encode("v"), "create_revision": "7", "mod_revision": "9"}]});
        let got = kvs(&v).unwrap();
        assert_eq!(got[0].key, b"k");
        assert_eq!(got[0].value, b"v");
        assert_eq!((got[0].create_revision, got[0].mod_revision), (7, 9));
        assert!(kvs(&json!({"kvs": [{"key": "***", "value": ""}]})).is_err());
        assert!(kvs(&json!({"kvs": [{"key": 5}]})).is_err());
        assert_eq!(kvs(&json!({})).unwrap(), Vec::new());
    }
}
