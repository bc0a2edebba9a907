//! A real etcd server for tests and benchmarks: Debian's `etcd` on free
//! loopback ports in a temporary directory, stopped (killed) when dropped.
//! Without the binary the caller skips, unless `STRATA_REQUIRE_ETCD=1`
//! (CI), which fails.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd server (killed when dropped).
pub struct Etcd {
    /// The client URL (`http://127.0.0.1:PORT`, or `https://…`).
    pub url: String,
    child: Child,
    /// How it was started (to start it again on the same data).
    cmd: Vec<std::ffi::OsString>,
    client: u16,
    metrics: u16,
    /// A plain-HTTP client listener beside an https one (`host:port`), for
    /// [`Etcd::post`] and [`Etcd::call`].
    plain: Option<String>,
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
    pub fn start() -> Option<Etcd> {
        Self::start_with(None, None, true, &[])
    }

    /// etcd serving https with this certificate and key, and plain HTTP on
    /// another loopback port that [`Etcd::post`] and [`Etcd::call`] use
    /// (to add users and turn authentication on, say); `extra`: more of
    /// etcd's flags (e.g. `--auth-token-ttl`).
    pub fn start_tls_with_plain(
        cert: &std::path::Path,
        key: &std::path::Path,
        extra: &[&str],
    ) -> Option<Etcd> {
        Self::start_with(Some((cert, key)), None, true, extra)
    }

    /// etcd without its JSON gateway (`--enable-grpc-gateway=false`): only
    /// gRPC clients are answered.
    pub fn start_grpc_only() -> Option<Etcd> {
        Self::start_with(None, None, false, &[])
    }

    /// etcd serving https with this certificate and key (PEM files), and
    /// with `client_ca`, requiring client certificates it signed.
    pub fn start_tls(
        cert: &std::path::Path,
        key: &std::path::Path,
        client_ca: Option<&std::path::Path>,
    ) -> Option<Etcd> {
        Self::start_with(Some((cert, key)), client_ca, true, &[])
    }

    fn start_with(
        tls: Option<(&std::path::Path, &std::path::Path)>,
        client_ca: Option<&std::path::Path>,
        gateway: bool,
        extra: &[&str],
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
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        if let Some((cert, key)) = tls {
            args.extend([
                "--cert-file".into(),
                cert.into(),
                "--key-file".into(),
                key.into(),
            ]);
        }
        if let Some(ca) = client_ca {
            args.extend([
                "--client-cert-auth".into(),
                "--trusted-ca-file".into(),
                ca.into(),
            ]);
        }
        if !gateway {
            args.push("--enable-grpc-gateway=false".into());
        }
        args.extend(extra.iter().map(std::ffi::OsString::from));
        // A plain listener beside https, for the test's own calls.
        let plain =
            (!extra.is_empty() && tls.is_some()).then(|| format!("127.0.0.1:{}", free_port()));
        let listen = match &plain {
            Some(p) => format!("{url},http://{p}"),
            None => url.clone(),
        };
        args.extend(["--data-dir".into(), dir.path().join("data").into()]);
        for a in [
            "--listen-client-urls",
            &listen,
            "--advertise-client-urls",
            &url,
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
            // Plain HTTP `/health` beside the client URLs, whatever their
            // scheme: how a test sees that etcd serves.
            "--listen-metrics-urls",
            &format!("http://127.0.0.1:{metrics}"),
            "--log-level",
            "error",
        ] {
            args.push(a.into());
        }
        let child = spawn(&args);
        let mut e = Etcd {
            url,
            child,
            cmd: args,
            client,
            metrics,
            plain,
            _dir: dir,
        };
        if let Err(why) = e.wait_serving(tls.is_some() || !gateway) {
            panic!("{why}");
        }
        Some(e)
    }

    /// Kills etcd and starts it again on the same data and ports (what an
    /// etcd restart looks like to its clients: refused connections, then
    /// the same keys and leases).
    ///
    /// While it is down, another test's outgoing connection can take one
    /// of its ports as its source port (the kernel hands out the same
    /// range for `:0`): an etcd that exits at once is started again, for
    /// up to 10 s, until the port is free (a CI run once failed with "etcd
    /// did not start" here).
    pub fn restart(&mut self, down: Duration) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down);
        let gateway = !self.cmd.iter().any(|a| a == "--enable-grpc-gateway=false");
        let health_only = self.url.starts_with("https") || !gateway;
        for attempt in 0.. {
            self.child = spawn(&self.cmd);
            match self.wait_serving(health_only) {
                Ok(()) => return,
                Err(why) if attempt < 20 => {
                    eprintln!("etcd restart, attempt {attempt}: {why}; again");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(why) => panic!("{why}"),
            }
        }
    }

    /// Waits until etcd serves; `health_only`: by its health check alone
    /// (TLS, or no gateway to read through).
    /// An etcd that exits before it serves is an error (with its status);
    /// one that does not serve within 60 s fails the test.
    fn wait_serving(&mut self, health_only: bool) -> Result<(), String> {
        let (client, metrics) = (self.client, self.metrics);
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "etcd exited ({status}) before it served: one of its ports (client {client}, metrics {metrics}) taken?"
                ));
            }
            assert!(Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let e = &*self;
        // Serving once its health check says so (the port opens a little
        // earlier); over plain HTTP, once a read succeeds too.
        while !healthy(metrics) {
            assert!(Instant::now() < deadline, "etcd never reported healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
        if health_only {
            return Ok(());
        }
        while e.post("/v3/kv/range", r#"{"key":"AA=="}"#).is_none() {
            assert!(Instant::now() < deadline, "etcd did not answer");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// A JSON request to the gateway over plain HTTP/1.1; the body, if the
    /// status was 200.
    pub fn post(&self, path: &str, body: &str) -> Option<String> {
        use std::io::{Read, Write};
        let addr = self
            .plain
            .as_deref()
            .unwrap_or(self.url.trim_start_matches("http://"));
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

impl Etcd {
    /// One JSON request to the gateway (plain HTTP/1.1 on loopback); its
    /// JSON answer.
    pub fn call(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        use std::io::{Read, Write};
        let host = self
            .plain
            .as_deref()
            .unwrap_or(self.url.trim_start_matches("http://"));
        let mut s = std::net::TcpStream::connect(host).unwrap();
        let body = body.to_string();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let json = out.split("\r\n\r\n").nth(1).unwrap_or_default();
        // A chunked answer: the JSON object is the one line that starts with '{'.
        let line = json.lines().find(|l| l.starts_with('{')).unwrap_or(json);
        serde_json::from_str(line).unwrap()
    }

    /// Adds the user `root` with `password` and the root role, then turns
    /// etcd's authentication on.
    pub fn enable_auth(&self, password: &str) {
        let user = serde_json::json!({"name": "root", "password": password}).to_string();
        for (path, body) in [
            ("/v3/auth/user/add", user.as_str()),
            ("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#),
            ("/v3/auth/enable", "{}"),
        ] {
            assert!(self.post(path, body).is_some(), "{path}");
        }
    }

    /// Revokes the lease holding rank `rank`'s claim of `job` under the
    /// default prefix (as a partition or a SIGSTOP longer than the lease
    /// would let it lapse).
    pub fn revoke_claim(&self, job: &str, rank: u32) {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let key = b64.encode(format!("/strata/{job}/ranks/{rank:08}"));
        let got = self.call("/v3/kv/range", &serde_json::json!({ "key": key }));
        let lease = got["kvs"][0]["lease"].as_str().unwrap().to_string();
        self.call("/v3/lease/revoke", &serde_json::json!({ "ID": lease }));
    }
}

impl Etcd {
    /// A gauge or counter etcd exports on its metrics port (Prometheus
    /// text, unlabelled), e.g. `etcd_debugging_mvcc_watcher_total`: the
    /// watches it serves.
    pub fn metric(&self, name: &str) -> Option<f64> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(
            s,
            // HTTP/1.0: the body comes whole, never chunked (a chunk's
            // header could cut the line looked for).
            "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.lines()
            .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .find_map(|v| v.trim().parse().ok())
    }

    /// The sum of a labelled series over its lines whose labels contain
    /// `labels` (e.g. `grpc_method="Watch"` in `grpc_server_started_total`);
    /// None when etcd's reply could not be read.
    pub fn metric_sum(&self, name: &str, labels: &str) -> Option<f64> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        // A whole reply ends with a newline after its last series.
        if !out.contains("\r\n\r\n") || !out.ends_with('\n') {
            return None;
        }
        Some(
            out.lines()
                .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
                .filter_map(|l| l.split_once("} "))
                .filter(|(l, _)| l.contains(labels))
                .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
                .sum(),
        )
    }
}

fn spawn(args: &[std::ffi::OsString]) -> Child {
    Command::new("etcd")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd starts")
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
