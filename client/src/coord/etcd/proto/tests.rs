//! The translation's tests: bytes as etcd reads them, answers as the
//! callers read them, and hostile answers refused.

use super::*;

fn b(s: &str) -> String {
    B64.encode(s)
}

#[test]
fn a_put_is_etcds_bytes() {
    let (m, w) = request(
        "/v3/kv/put",
        &json!({"key": b("k"), "value": b("v"), "lease": "5"}),
    )
    .unwrap();
    assert_eq!(m.path, "/etcdserverpb.KV/Put");
    assert!(!m.stream);
    assert_eq!(w, [0x0a, 1, b'k', 0x12, 1, b'v', 0x18, 5]);
    // A negative number is int64's ten bytes.
    let (_, w) = request("/v3/kv/range", &json!({"key": b("k"), "revision": "-1"})).unwrap();
    assert_eq!(w.len(), 3 + 1 + 10);
}

#[test]
fn a_compare_sends_its_target_even_when_0_and_a_field_not_known_is_refused() {
    let body = json!({
        "compare": [{"key": b("k"), "target": "CREATE", "create_revision": "0"}],
        "success": [{"request_put": {"key": b("k"), "value": b("v")}}],
        "failure": [{"request_range": {"key": b("k")}}],
    });
    let (m, w) = request("/v3/kv/txn", &body).unwrap();
    assert_eq!(m.path, "/etcdserverpb.KV/Txn");
    // compare: result EQUAL, target CREATE, key "k", create_revision 0
    // (a oneof member, so written though 0).
    let cmp = [0x08, 0, 0x10, 1, 0x1a, 1, b'k', 0x28, 0];
    assert_eq!(&w[..2], &[0x0a, cmp.len() as u8]);
    assert_eq!(&w[2..2 + cmp.len()], &cmp);
    // A range compare carries its end as field 64 (two-byte tag).
    let (_, w) = request(
        "/v3/kv/txn",
        &json!({"compare": [{"key": b("a"), "range_end": b("b"), "target": "MOD", "result": "LESS", "mod_revision": "9"}]}),
    )
    .unwrap();
    assert!(w.windows(4).any(|x| x == [0x82, 0x04, 1, b'b']), "{w:?}");
    // Anything this client does not know is refused, never dropped.
    for bad_body in [
        json!({"key": b("k"), "ignore_lease": true}),
        json!({"key": "***"}),
        json!({"key": b("k"), "lease": "x"}),
    ] {
        assert!(request("/v3/kv/put", &bad_body).is_err(), "{bad_body}");
    }
    for bad_txn in [
        json!({"compare": [{"key": b("k"), "target": "NEWEST"}]}),
        json!({"compare": [{"key": b("k"), "target": "MOD", "create_revision": "0"}]}),
        json!({"success": [{"request_txn": {}}]}),
        json!({"success": [{"request_put": {"key": b("k")}, "request_range": {"key": b("k")}}]}),
        json!({"success": {"request_put": {}}}),
    ] {
        assert!(request("/v3/kv/txn", &bad_txn).is_err(), "{bad_txn}");
    }
    assert!(request("/v3/kv/compact", &json!({})).is_err());
    // Names must be names: the gateway would read a number as an enum's
    // value; this client never sends one, and refuses it.
    assert!(request(
        "/v3/kv/txn",
        &json!({"compare": [{"key": b("k"), "result": 2}]})
    )
    .is_err());
    assert!(request(
        "/v3/auth/authenticate",
        &json!({"name": "root", "password": 5})
    )
    .is_err());
    // A member not given is not sent (as the gateway leaves it unset).
    let (_, w) = request(
        "/v3/kv/txn",
        &json!({"compare": [{"key": b("k"), "target": "MOD"}]}),
    )
    .unwrap();
    assert_eq!(w, [0x0a, 7, 0x08, 0, 0x10, 2, 0x1a, 1, b'k']);
}

/// A RangeResponse as etcd writes it.
fn range_bytes() -> Vec<u8> {
    let mut h = W::default();
    h.int(1, 77);
    h.int(3, 42);
    let mut kv = W::default();
    kv.bytes(1, b"key");
    kv.int(2, 7);
    kv.int(3, 9);
    kv.int(4, 2);
    kv.bytes(5, b"value");
    kv.int(6, 1234);
    let mut r = W::default();
    r.msg(1, h);
    r.msg(2, kv);
    r.int(4, 1);
    r.0
}

#[test]
fn answers_read_into_the_gateways_shape() {
    let v = response("/v3/kv/range", &range_bytes()).unwrap();
    assert_eq!(v["header"]["revision"], 42);
    assert_eq!(v["count"], 1);
    assert_eq!(v["kvs"][0]["key"], b("key"));
    assert_eq!(v["kvs"][0]["value"], b("value"));
    assert_eq!(v["kvs"][0]["mod_revision"], 9);
    assert_eq!(v["kvs"][0]["lease"], 1234);
    // A transaction: succeeded, a put's and a range's answers in order.
    let mut t = W::default();
    t.int(2, 1);
    let mut op = W::default();
    op.msg(2, W::default());
    t.msg(3, op);
    let mut op = W::default();
    op.bytes(1, &range_bytes());
    t.msg(3, op);
    let v = response("/v3/kv/txn", &t.0).unwrap();
    assert_eq!(v["succeeded"], true);
    assert!(v["responses"][0].get("response_put").is_some());
    assert_eq!(
        v["responses"][1]["response_range"]["kvs"][0]["create_revision"],
        7
    );
    // A lease renewal's answer is wrapped as the gateway's stream is.
    let mut l = W::default();
    l.int(2, 5);
    l.int(3, 10);
    assert_eq!(
        response("/v3/lease/keepalive", &l.0).unwrap()["result"]["TTL"],
        10
    );
    let mut g = W::default();
    g.bytes(4, b"too many leases");
    assert_eq!(
        response("/v3/lease/grant", &g.0).unwrap()["error"],
        "too many leases"
    );
}

#[test]
fn a_watch_message_reads_its_events_and_its_end() {
    let mut ev = W::default();
    ev.int(1, 1);
    let mut kv = W::default();
    kv.bytes(1, b"gone");
    kv.int(3, 11);
    ev.msg(2, kv);
    let mut m = W::default();
    m.int(2, 0);
    m.msg(11, ev);
    let got = watch_message(&m.0).unwrap();
    assert!(!got.canceled);
    assert_eq!(got.events.len(), 1);
    assert!(got.events[0].0);
    assert_eq!(got.events[0].1["key"], b("gone"));
    let mut c = W::default();
    c.int(4, 1);
    c.bytes(6, b"compacted");
    let got = watch_message(&c.0).unwrap();
    assert!(got.canceled);
    assert_eq!(got.cancel_reason, "compacted");
    // An event without its key is an error, not an empty key.
    let mut e = W::default();
    e.msg(11, W::default());
    assert!(watch_message(&e.0).is_err());
}

#[test]
fn an_answer_of_more_keys_than_the_bound_is_refused() {
    // Two bytes each on the wire: an empty key-value pair, eleven of
    // them, against a bound of ten (MAX_ENTRIES in use).
    let eleven: Vec<u8> = [0x12, 0].repeat(11);
    let e = range_response(&eleven, &mut 10).unwrap_err();
    assert!(e.to_string().contains("more than"), "{e}");
    assert!(range_response(&eleven[2..], &mut 10).is_ok());
    // Counted over the whole answer: two ranges of six in a transaction.
    let mut t = W::default();
    for _ in 0..2 {
        let mut op = W::default();
        op.bytes(1, &[0x12, 0].repeat(6));
        t.msg(3, op);
    }
    assert!(txn_response(&t.0, &mut 10).is_err());
    assert!(txn_response(&t.0, &mut 12).is_ok());
}

#[test]
fn cut_or_hostile_answers_are_errors_never_panics() {
    let whole = range_bytes();
    for n in 0..whole.len() {
        // Every cut either reads (a cut between fields) or is an error.
        let _ = response("/v3/kv/range", &whole[..n]);
    }
    // A length far past the message, a 1 GiB one, an 11-byte number,
    // a group (wire type 3): errors.
    for hostile in [
        vec![0x12, 0x05, 1],
        vec![0x12, 0x80, 0x80, 0x80, 0x80, 0x04],
        vec![
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ],
        vec![0x0b],
    ] {
        assert!(response("/v3/kv/range", &hostile).is_err(), "{hostile:?}");
        assert!(watch_message(&hostile).is_err(), "{hostile:?}");
    }
}
