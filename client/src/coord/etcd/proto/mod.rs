//! etcd's v3 messages in protobuf, written from and read into the JSON
//! shape of etcd's gateway (keys and values in base64, 64-bit numbers as
//! strings or numbers), so that every call of [`super::api`] speaks one
//! shape whichever way it travels. Only the fields the coordinator uses
//! are known: a request naming any other field is refused, never sent
//! without it (a condition dropped on the way would change what a
//! transaction does). Field numbers are those of etcd's `rpc.proto` and
//! `kv.proto` (v3.4 and later; unchanged since v3.0 for these messages).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

fn bad(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Coordination(format!("etcd {what}: {e}"))
}

// ---------------------------------------------------------------- writing

/// A protobuf message being written.
#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn tag(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }

    /// A length-delimited field, written even when empty.
    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.tag(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    /// An integer field (two's complement for negatives, as protobuf's
    /// int64), written even when 0 (a member of a `oneof` must be).
    fn int(&mut self, field: u32, v: i64) {
        self.tag(field, 0);
        self.varint(v as u64);
    }

    fn msg(&mut self, field: u32, m: W) {
        self.bytes(field, &m.0);
    }
}

/// The fields of a JSON request object, each known to the caller:
/// another one is an error.
fn fields<'a>(v: &'a Value, known: &[&str], what: &str) -> Result<&'a Map<String, Value>> {
    let o = v
        .as_object()
        .ok_or_else(|| bad(what, format!("not an object: {v}")))?;
    if let Some(k) = o.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(bad(
            what,
            format!("field {k:?} is not one this client sends"),
        ));
    }
    Ok(o)
}

fn b64(v: &Value, what: &str) -> Result<Vec<u8>> {
    match v {
        Value::String(s) => B64.decode(s).map_err(|e| bad(what, e)),
        other => Err(bad(what, format!("not base64: {other}"))),
    }
}

fn int(v: &Value, what: &str) -> Result<i64> {
    match v {
        Value::String(s) => s.parse().map_err(|e| bad(what, e)),
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| bad(what, format!("not an i64: {n}"))),
        other => Err(bad(what, format!("not a number: {other}"))),
    }
}

fn boolean(v: &Value, what: &str) -> Result<bool> {
    v.as_bool()
        .ok_or_else(|| bad(what, format!("not a bool: {v}")))
}

/// Writes the fields of `o` by `map` (JSON name → field number and kind).
fn put_fields(
    w: &mut W,
    o: &Map<String, Value>,
    map: &[(&str, u32, Kind)],
    what: &str,
) -> Result<()> {
    for (name, field, kind) in map {
        let Some(v) = o.get(*name) else { continue };
        match kind {
            Kind::Bytes => w.bytes(*field, &b64(v, what)?),
            Kind::Int => w.int(*field, int(v, what)?),
            Kind::Bool => {
                if boolean(v, what)? {
                    w.int(*field, 1);
                }
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Kind {
    Bytes,
    Int,
    Bool,
}

const RANGE: &[(&str, u32, Kind)] = &[
    ("key", 1, Kind::Bytes),
    ("range_end", 2, Kind::Bytes),
    ("limit", 3, Kind::Int),
    ("revision", 4, Kind::Int),
    ("serializable", 7, Kind::Bool),
    ("keys_only", 8, Kind::Bool),
    ("count_only", 9, Kind::Bool),
    ("min_mod_revision", 10, Kind::Int),
    ("max_mod_revision", 11, Kind::Int),
    ("min_create_revision", 12, Kind::Int),
    ("max_create_revision", 13, Kind::Int),
];
const PUT: &[(&str, u32, Kind)] = &[
    ("key", 1, Kind::Bytes),
    ("value", 2, Kind::Bytes),
    ("lease", 3, Kind::Int),
    ("prev_kv", 4, Kind::Bool),
];
const DELETE: &[(&str, u32, Kind)] = &[
    ("key", 1, Kind::Bytes),
    ("range_end", 2, Kind::Bytes),
    ("prev_kv", 3, Kind::Bool),
];

fn names<'a>(map: &[(&'a str, u32, Kind)]) -> Vec<&'a str> {
    map.iter().map(|(n, _, _)| *n).collect()
}

fn simple(v: &Value, map: &[(&str, u32, Kind)], what: &str) -> Result<W> {
    let o = fields(v, &names(map), what)?;
    let mut w = W::default();
    put_fields(&mut w, o, map, what)?;
    Ok(w)
}

fn compare(v: &Value) -> Result<W> {
    let what = "txn compare";
    let o = fields(
        v,
        &[
            "key",
            "range_end",
            "target",
            "result",
            "version",
            "create_revision",
            "mod_revision",
            "value",
            "lease",
        ],
        what,
    )?;
    let mut w = W::default();
    let name = |k: &str| match o.get(k) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(other) => Err(bad(what, format!("{k} is not a name: {other}"))),
    };
    let result = match name("result")? {
        None | Some("EQUAL") => 0,
        Some("GREATER") => 1,
        Some("LESS") => 2,
        Some("NOT_EQUAL") => 3,
        Some(r) => return Err(bad(what, format!("result {r:?}"))),
    };
    // The target names the one member of the `oneof` that is compared.
    let (target, member, field, kind) = match name("target")? {
        None | Some("VERSION") => (0, "version", 4, Kind::Int),
        Some("CREATE") => (1, "create_revision", 5, Kind::Int),
        Some("MOD") => (2, "mod_revision", 6, Kind::Int),
        Some("VALUE") => (3, "value", 7, Kind::Bytes),
        Some("LEASE") => (4, "lease", 8, Kind::Int),
        Some(t) => return Err(bad(what, format!("target {t:?}"))),
    };
    let others = [
        "version",
        "create_revision",
        "mod_revision",
        "value",
        "lease",
    ];
    if let Some(k) = others.iter().find(|k| **k != member && o.contains_key(**k)) {
        return Err(bad(what, format!("{k} given for another target")));
    }
    w.int(1, result);
    w.int(2, target);
    w.bytes(3, &b64(o.get("key").unwrap_or(&Value::Null), what)?);
    // As the gateway does: the member is set only when given (etcd
    // compares an unset one as 0 or empty).
    match (kind, o.get(member)) {
        (Kind::Bytes, Some(v)) => w.bytes(field, &b64(v, what)?),
        (_, Some(v)) => w.int(field, int(v, what)?),
        (_, None) => {}
    }
    if let Some(end) = o.get("range_end") {
        w.bytes(64, &b64(end, what)?);
    }
    Ok(w)
}

fn request_op(v: &Value) -> Result<W> {
    let what = "txn operation";
    let o = fields(
        v,
        &["request_range", "request_put", "request_delete_range"],
        what,
    )?;
    if o.len() != 1 {
        return Err(bad(what, format!("not one operation: {v}")));
    }
    let mut w = W::default();
    if let Some(r) = o.get("request_range") {
        w.msg(1, simple(r, RANGE, "txn range")?);
    } else if let Some(p) = o.get("request_put") {
        w.msg(2, simple(p, PUT, "txn put")?);
    } else if let Some(d) = o.get("request_delete_range") {
        w.msg(3, simple(d, DELETE, "txn delete")?);
    }
    Ok(w)
}

fn txn(v: &Value) -> Result<W> {
    let what = "txn";
    let o = fields(v, &["compare", "success", "failure"], what)?;
    let list = |k: &str| -> Result<&[Value]> {
        match o.get(k) {
            None => Ok(&[]),
            Some(Value::Array(a)) => Ok(a),
            Some(other) => Err(bad(what, format!("{k} is not a list: {other}"))),
        }
    };
    let mut w = W::default();
    for c in list("compare")? {
        w.msg(1, compare(c)?);
    }
    for op in list("success")? {
        w.msg(2, request_op(op)?);
    }
    for op in list("failure")? {
        w.msg(3, request_op(op)?);
    }
    Ok(w)
}

/// What a call is over gRPC: its method's path and whether it is a stream.
pub(crate) struct Method {
    pub(crate) path: &'static str,
    pub(crate) stream: bool,
}

/// The gRPC method of a gateway path, and the request `body` (the
/// gateway's JSON) as that method's protobuf message.
pub(crate) fn request(path: &str, body: &Value) -> Result<(Method, Vec<u8>)> {
    let unary = |path| Method {
        path,
        stream: false,
    };
    let (m, w) = match path {
        "/v3/kv/range" => (
            unary("/etcdserverpb.KV/Range"),
            simple(body, RANGE, "range")?,
        ),
        "/v3/kv/put" => (unary("/etcdserverpb.KV/Put"), simple(body, PUT, "put")?),
        "/v3/kv/deleterange" => (
            unary("/etcdserverpb.KV/DeleteRange"),
            simple(body, DELETE, "delete")?,
        ),
        "/v3/kv/txn" => (unary("/etcdserverpb.KV/Txn"), txn(body)?),
        "/v3/lease/grant" => (
            unary("/etcdserverpb.Lease/LeaseGrant"),
            simple(
                body,
                &[("TTL", 1, Kind::Int), ("ID", 2, Kind::Int)],
                "lease grant",
            )?,
        ),
        "/v3/lease/revoke" => (
            unary("/etcdserverpb.Lease/LeaseRevoke"),
            simple(body, &[("ID", 1, Kind::Int)], "lease revoke")?,
        ),
        "/v3/lease/keepalive" => (
            Method {
                path: "/etcdserverpb.Lease/LeaseKeepAlive",
                stream: true,
            },
            simple(body, &[("ID", 1, Kind::Int)], "lease keepalive")?,
        ),
        "/v3/auth/authenticate" => {
            let o = fields(body, &["name", "password"], "authenticate")?;
            let mut w = W::default();
            for (k, f) in [("name", 1), ("password", 2)] {
                let Some(s) = o.get(k).and_then(Value::as_str) else {
                    return Err(bad("authenticate", format!("no {k}")));
                };
                w.bytes(f, s.as_bytes());
            }
            (unary("/etcdserverpb.Auth/Authenticate"), w)
        }
        other => {
            return Err(bad(
                "call",
                format!("{other} is not a call this client makes"),
            ))
        }
    };
    Ok((m, w.0))
}

/// A watch of the keys in `[key, range_end)` from `start_revision`, as
/// the first message of a `Watch` stream.
pub(crate) fn watch_create(key: &[u8], range_end: &[u8], start_revision: i64) -> Vec<u8> {
    let mut c = W::default();
    c.bytes(1, key);
    c.bytes(2, range_end);
    c.int(3, start_revision);
    let mut w = W::default();
    w.msg(1, c);
    w.0
}

// ---------------------------------------------------------------- reading

/// One field of a message as read: its number and its value.
enum F<'a> {
    Int(u64),
    Bytes(&'a [u8]),
}

/// Reads a message's fields in order; every length is checked against
/// what is left, so a hostile answer can neither overrun nor make this
/// allocate more than it sent.
struct R<'a>(&'a [u8]);

impl<'a> R<'a> {
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self
                .0
                .split_first()
                .ok_or_else(|| bad("answer", "a number is cut"))?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(bad("answer", "a number is longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.0.len() {
            return Err(bad("answer", "a field is longer than the message"));
        }
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(a)
    }

    fn next(&mut self) -> Result<Option<(u32, F<'a>)>> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let tag = self.varint()?;
        let field =
            u32::try_from(tag >> 3).map_err(|_| bad("answer", "a field number too large"))?;
        let f = match tag & 7 {
            0 => F::Int(self.varint()?),
            1 => F::Int(u64::from_le_bytes(
                self.take(8)?.try_into().map_err(|_| bad("answer", "cut"))?,
            )),
            2 => {
                let n = usize::try_from(self.varint()?)
                    .map_err(|_| bad("answer", "a length too large"))?;
                F::Bytes(self.take(n)?)
            }
            5 => F::Int(u64::from(u32::from_le_bytes(
                self.take(4)?.try_into().map_err(|_| bad("answer", "cut"))?,
            ))),
            w => return Err(bad("answer", format!("wire type {w}"))),
        };
        Ok(Some((field, f)))
    }
}

fn each<'a>(b: &'a [u8], mut f: impl FnMut(u32, F<'a>) -> Result<()>) -> Result<()> {
    let mut r = R(b);
    while let Some((n, v)) = r.next()? {
        f(n, v)?;
    }
    Ok(())
}

fn header(b: &[u8]) -> Result<Value> {
    let mut rev = 0i64;
    each(b, |n, v| {
        if let (3, F::Int(i)) = (n, v) {
            rev = i as i64;
        }
        Ok(())
    })?;
    Ok(json!({ "revision": rev }))
}

/// The most key-value pairs one answer may hold: each becomes an object
/// of its own here (a few hundred bytes, from as few as two on the wire),
/// so a hostile answer of 64 MiB could otherwise ask for tens of GB. The
/// largest range the coordinator reads is one key per rank.
const MAX_ENTRIES: usize = 1 << 20;

/// Counts one more key-value pair of an answer against [`MAX_ENTRIES`].
fn spend(left: &mut usize) -> Result<()> {
    *left = left
        .checked_sub(1)
        .ok_or_else(|| bad("answer", format!("more than {MAX_ENTRIES} keys")))?;
    Ok(())
}

/// A key-value pair as the gateway writes it.
fn kv(b: &[u8], left: &mut usize) -> Result<Value> {
    spend(left)?;
    let (mut key, mut value) = (&[][..], &[][..]);
    let (mut create, mut modr, mut version, mut lease) = (0i64, 0i64, 0i64, 0i64);
    each(b, |n, v| {
        match (n, v) {
            (1, F::Bytes(k)) => key = k,
            (2, F::Int(i)) => create = i as i64,
            (3, F::Int(i)) => modr = i as i64,
            (4, F::Int(i)) => version = i as i64,
            (5, F::Bytes(x)) => value = x,
            (6, F::Int(i)) => lease = i as i64,
            _ => {}
        }
        Ok(())
    })?;
    Ok(json!({
        "key": B64.encode(key),
        "value": B64.encode(value),
        "create_revision": create,
        "mod_revision": modr,
        "version": version,
        "lease": lease,
    }))
}

fn range_response(b: &[u8], left: &mut usize) -> Result<Value> {
    let mut o = Map::new();
    let mut kvs = Vec::new();
    each(b, |n, v| {
        match (n, v) {
            (1, F::Bytes(h)) => {
                o.insert("header".into(), header(h)?);
            }
            (2, F::Bytes(k)) => kvs.push(kv(k, left)?),
            (3, F::Int(m)) => {
                o.insert("more".into(), Value::Bool(m != 0));
            }
            (4, F::Int(c)) => {
                o.insert("count".into(), json!(c as i64));
            }
            _ => {}
        }
        Ok(())
    })?;
    o.insert("kvs".into(), Value::Array(kvs));
    Ok(Value::Object(o))
}

/// A response of only a header (put, delete, lease revoke).
fn header_only(b: &[u8]) -> Result<Value> {
    let mut o = Map::new();
    each(b, |n, v| {
        if let (1, F::Bytes(h)) = (n, v) {
            o.insert("header".into(), header(h)?);
        }
        Ok(())
    })?;
    Ok(Value::Object(o))
}

fn txn_response(b: &[u8], left: &mut usize) -> Result<Value> {
    let mut o = Map::new();
    let mut responses = Vec::new();
    let mut succeeded = false;
    each(b, |n, v| {
        match (n, v) {
            (1, F::Bytes(h)) => {
                o.insert("header".into(), header(h)?);
            }
            (2, F::Int(s)) => succeeded = s != 0,
            (3, F::Bytes(op)) => {
                let mut r = Map::new();
                each(op, |n, v| {
                    match (n, v) {
                        (1, F::Bytes(x)) => {
                            r.insert("response_range".into(), range_response(x, left)?);
                        }
                        (2, F::Bytes(x)) => {
                            r.insert("response_put".into(), header_only(x)?);
                        }
                        (3, F::Bytes(x)) => {
                            r.insert("response_delete_range".into(), header_only(x)?);
                        }
                        _ => {}
                    }
                    Ok(())
                })?;
                responses.push(Value::Object(r));
            }
            _ => {}
        }
        Ok(())
    })?;
    o.insert("succeeded".into(), Value::Bool(succeeded));
    o.insert("responses".into(), Value::Array(responses));
    Ok(Value::Object(o))
}

fn lease_response(b: &[u8], stream: bool) -> Result<Value> {
    let mut o = Map::new();
    let mut error = String::new();
    each(b, |n, v| {
        match (n, v) {
            (1, F::Bytes(h)) => {
                o.insert("header".into(), header(h)?);
            }
            (2, F::Int(id)) => {
                o.insert("ID".into(), json!(id as i64));
            }
            (3, F::Int(ttl)) => {
                o.insert("TTL".into(), json!(ttl as i64));
            }
            (4, F::Bytes(e)) => error = String::from_utf8_lossy(e).into_owned(),
            _ => {}
        }
        Ok(())
    })?;
    if !error.is_empty() {
        o.insert("error".into(), Value::String(error));
    }
    // The gateway wraps each message of a stream in "result".
    Ok(if stream {
        json!({ "result": Value::Object(o) })
    } else {
        Value::Object(o)
    })
}

/// The answer of the call at gateway path `path`, from its protobuf
/// message, in the gateway's JSON shape.
pub(crate) fn response(path: &str, b: &[u8]) -> Result<Value> {
    let mut left = MAX_ENTRIES;
    match path {
        "/v3/kv/range" => range_response(b, &mut left),
        "/v3/kv/put" | "/v3/kv/deleterange" | "/v3/lease/revoke" => header_only(b),
        "/v3/kv/txn" => txn_response(b, &mut left),
        "/v3/lease/grant" => lease_response(b, false),
        "/v3/lease/keepalive" => lease_response(b, true),
        "/v3/auth/authenticate" => {
            let mut token = String::new();
            each(b, |n, v| {
                if let (2, F::Bytes(t)) = (n, v) {
                    token = String::from_utf8_lossy(t).into_owned();
                }
                Ok(())
            })?;
            Ok(json!({ "token": token }))
        }
        other => Err(bad(
            "call",
            format!("{other} is not a call this client makes"),
        )),
    }
}

/// What one message of a watch stream says.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct WatchMessage {
    /// etcd ended the watch (its start was compacted, or it was refused).
    pub(crate) canceled: bool,
    /// Why, when etcd says.
    pub(crate) cancel_reason: String,
    /// The changes, in order: whether the key was deleted, and the key as
    /// the gateway writes it.
    pub(crate) events: Vec<(bool, Value)>,
}

/// Reads one message of a `Watch` stream.
pub(crate) fn watch_message(b: &[u8]) -> Result<WatchMessage> {
    let mut m = WatchMessage::default();
    let mut left = MAX_ENTRIES;
    each(b, |n, v| {
        match (n, v) {
            (4, F::Int(c)) => m.canceled = c != 0,
            (6, F::Bytes(r)) => m.cancel_reason = String::from_utf8_lossy(r).into_owned(),
            (11, F::Bytes(e)) => {
                let (mut deleted, mut kvv) = (false, None);
                each(e, |n, v| {
                    match (n, v) {
                        (1, F::Int(t)) => deleted = t == 1,
                        (2, F::Bytes(k)) => kvv = Some(kv(k, &mut left)?),
                        _ => {}
                    }
                    Ok(())
                })?;
                let kvv = kvv.ok_or_else(|| bad("watch", "an event without its key"))?;
                m.events.push((deleted, kvv));
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(m)
}

#[cfg(test)]
mod tests;
