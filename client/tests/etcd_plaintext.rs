//! etcd's user and password never cross the network in clear: over an
//! `http://` endpoint the coordinator refuses to authenticate (a
//! configuration error, before any byte is sent) unless
//! `etcd_allow_plaintext_auth` says the operator accepts it. No etcd
//! server is needed: a plain TCP listener records what reaches it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strata::{Config, ErrorKind, EtcdCoordinator, EtcdOptions};

const PASSWORD: &str = "etcd-pa55-do-not-send-7c1e";

/// A listener on loopback that records every byte sent to it for `for_`,
/// answering each request with `reply` (if any).
struct Listener {
    url: String,
    got: Arc<Mutex<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Listener {
    fn start(for_: Duration, reply: Option<&'static str>) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        l.set_nonblocking(true).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let seen = got.clone();
        let thread = std::thread::spawn(move || {
            let end = Instant::now() + for_;
            while Instant::now() < end {
                match l.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        s.set_read_timeout(Some(Duration::from_millis(300)))
                            .unwrap();
                        let mut buf = [0u8; 4096];
                        while let Ok(n) = s.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            seen.lock().unwrap().extend_from_slice(&buf[..n]);
                            if let Some(body) = reply {
                                let _ = write!(
                                    s,
                                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                                    body.len()
                                );
                                break;
                            }
                        }
                        if reply.is_some() {
                            // One answer only: later requests find nothing
                            // listening and fail at once.
                            return;
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Listener {
            url,
            got,
            thread: Some(thread),
        }
    }

    /// Everything received, once the listener stopped.
    fn received(mut self) -> String {
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let got = self.got.lock().unwrap().clone();
        String::from_utf8_lossy(&got).into_owned()
    }
}

fn opts(url: &str) -> EtcdOptions {
    EtcdOptions {
        endpoints: vec![url.to_string()],
        user: Some(("root".into(), PASSWORD.into())),
        request_timeout: Duration::from_secs(1),
        ..EtcdOptions::default()
    }
}

#[test]
fn etcd_auth_over_plain_http_is_refused_before_anything_is_sent() {
    let server = Listener::start(Duration::from_secs(3), None);
    let e = EtcdCoordinator::connect(opts(&server.url), "plain", 0, 1).unwrap_err();
    let received = server.received();
    assert!(
        !received.contains(PASSWORD),
        "the password went over plain HTTP:\n{received}"
    );
    assert!(received.is_empty(), "nothing is sent at all: {received}");
    assert_eq!(e.kind(), ErrorKind::Invalid, "a configuration error: {e}");
    let msg = e.to_string();
    assert!(
        msg.contains("etcd_allow_plaintext_auth") && msg.contains("https"),
        "the error names the way out: {msg}"
    );
    assert!(!msg.contains(PASSWORD), "{msg}");
}

#[test]
fn every_endpoint_must_be_https_for_auth() {
    // One https endpoint does not make the http one safe: the client
    // falls back to the next endpoint when the first does not answer.
    let server = Listener::start(Duration::from_secs(3), None);
    let mut o = opts("https://127.0.0.1:1");
    o.endpoints.push(server.url.clone());
    let e = EtcdCoordinator::connect(o, "plain", 0, 1).unwrap_err();
    let received = server.received();
    assert!(!received.contains(PASSWORD), "{received}");
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

#[test]
fn debug_output_of_the_etcd_options_hides_the_password() {
    let o = EtcdOptions {
        endpoints: vec![format!("http://root:{PASSWORD}@10.0.0.1:2379")],
        ..opts("http://10.0.0.1:2379")
    };
    for text in [format!("{o:?}"), format!("{o:#?}")] {
        assert!(!text.contains(PASSWORD), "{text}");
        assert!(text.contains("root"), "the user is shown: {text}");
        assert!(text.contains(strata::REDACTED), "{text}");
    }
}

#[test]
fn allowed_plaintext_auth_is_sent() {
    let server = Listener::start(Duration::from_secs(3), Some(r#"{"token":"tok"}"#));
    let o = EtcdOptions {
        allow_plaintext_auth: true,
        ..opts(&server.url)
    };
    // No etcd behind the listener: the connection fails after the
    // authentication, which is what this looks at.
    let _ = EtcdCoordinator::connect(o, "plain", 0, 1);
    let received = server.received();
    // gRPC: HTTP/2 from the first byte, the password in the request's
    // protobuf (the method's path is in HPACK, not plain to see).
    assert!(
        received.starts_with("PRI * HTTP/2.0") && received.contains(PASSWORD),
        "allowed, the password is sent: {received:?}"
    );
}

#[test]
fn etcd_allow_plaintext_auth_is_a_setting_from_toml_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    let c = Config::from_toml(&format!(
        "etcd_endpoints = [\"http://127.0.0.1:1\"]\netcd_user = \"root\"\netcd_password_file = \"{}\"",
        pw.display()
    ))
    .unwrap();
    assert!(!c.etcd_allow_plaintext_auth, "off by default");
    let o = EtcdOptions::from_config(&c).unwrap();
    assert!(!o.allow_plaintext_auth);
    assert_eq!(o.user.as_ref().map(|u| u.1.as_str()), Some(PASSWORD));
    let e = EtcdCoordinator::connect(o, "plain", 0, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let env = c
        .clone()
        .with_env([("STRATA_ETCD_ALLOW_PLAINTEXT_AUTH".into(), "1".into())])
        .unwrap();
    assert!(EtcdOptions::from_config(&env).unwrap().allow_plaintext_auth);
    let toml = Config::from_toml("etcd_allow_plaintext_auth = true").unwrap();
    assert!(toml.etcd_allow_plaintext_auth);
    assert!(c
        .with_env([("STRATA_ETCD_ALLOW_PLAINTEXT_AUTH".into(), "maybe".into())])
        .is_err());
}
