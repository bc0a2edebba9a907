//! A real etcd server for tests: Debian's `etcd` on free loopback ports in
//! a temporary directory, stopped (killed) when dropped. Without the binary
//! the caller skips, unless `STRATA_REQUIRE_ETCD=1` (CI), which fails.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) struct Etcd {
    pub(crate) url: String,
    child: Child,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Etcd {
    /// Starts etcd, or returns None (test skipped) when it is not
    /// installed and not required.
    pub(crate) fn start() -> Option<Etcd> {
        Self::start_with(None, None)
    }

    /// etcd serving https with this certificate and key (PEM files), and
    /// with `client_ca`, requiring client certificates it signed.
    pub(crate) fn start_tls(
        cert: &std::path::Path,
        key: &std::path::Path,
        client_ca: Option<&std::path::Path>,
    ) -> Option<Etcd> {
        Self::start_with(Some((cert, key)), client_ca)
    }

    fn start_with(
        tls: Option<(&std::path::Path, &std::path::Path)>,
        client_ca: Option<&std::path::Path>,
    ) -> Option<Etcd> {
        let found = Command::new("etcd")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            assert!(
                std::env::var("STRATA_REQUIRE_ETCD").as_deref() != Ok("1"),
                "STRATA_REQUIRE_ETCD=1 but no etcd binary (apt-get install etcd-server)"
            );
            eprintln!("SKIPPED: no etcd binary (apt-get install etcd-server)");
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let (client, peer, metrics) = (free_port(), free_port(), free_port());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://127.0.0.1:{client}");
        let mut cmd = Command::new("etcd");
        if let Some((cert, key)) = tls {
            cmd.arg("--cert-file").arg(cert).arg("--key-file").arg(key);
        }
        if let Some(ca) = client_ca {
            cmd.arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(ca);
        }
        let child = cmd
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            // Plain HTTP `/health` beside the client URLs, whatever their
            // scheme: how a test sees that etcd serves.
            .args([
                "--listen-metrics-urls",
                &format!("http://127.0.0.1:{metrics}"),
            ])
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd starts");
        let e = Etcd {
            url,
            child,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
            assert!(Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Serving once its health check says so (the port opens a little
        // earlier); over plain HTTP, once a read succeeds too.
        while !healthy(metrics) {
            assert!(Instant::now() < deadline, "etcd never reported healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
        if tls.is_some() {
            return Some(e);
        }
        while e.post("/v3/kv/range", r#"{"key":"AA=="}"#).is_none() {
            assert!(Instant::now() < deadline, "etcd did not answer");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(e)
    }

    /// A JSON request to the gateway over plain HTTP/1.1; the body, if the
    /// status was 200.
    pub(crate) fn post(&self, path: &str, body: &str) -> Option<String> {
        use std::io::{Read, Write};
        let addr = self.url.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let (head, rest) = out.split_once("\r\n\r\n")?;
        if !head.starts_with("HTTP/1.1 200") {
            return None;
        }
        Some(rest.to_string())
    }
}

/// Whether etcd's `/health` on its plain-HTTP metrics port says it
/// serves (a leader, and a read through raft succeeded).
fn healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let asked = write!(
        s,
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    asked.is_ok()
        && s.read_to_string(&mut out).is_ok()
        && out.starts_with("HTTP/1.1 200")
        && out.contains(r#""health":"true""#)
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
