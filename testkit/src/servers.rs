//! Real S3-compatible servers for tests: s3s-fs (authenticated, fast) and
//! moto (exclusive create-if-absent). Each test starts its own on a free
//! loopback port and stops it when the guard drops.
//!
//! The test command (`scripts/test.sh`) installs both. Where a server is
//! missing, a test says so and skips, unless `STRATA_REQUIRE_SERVERS=1`
//! (set by the test command), where a missing server fails the test.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use strata_tiered::{L3Options, L3Store};

/// The access key every test server accepts.
pub const ACCESS_KEY: &str = "strata-test-key";
/// Its secret.
pub const SECRET_KEY: &str = "strata-test-secret";
/// The bucket each server is started with.
pub const BUCKET: &str = "strata-test";

/// A running server; killed on drop.
pub struct Server {
    child: Child,
    /// The loopback port it listens on.
    pub port: u16,
    /// "s3s-fs" or "moto".
    pub kind: &'static str,
    _data: Option<tempfile::TempDir>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Finds a server binary on PATH or in the directories the test command
/// installs into.
fn find(bin: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(extra) = std::env::var_os("STRATA_TOOLS_DIR") {
        dirs.insert(0, PathBuf::from(extra).join("bin"));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    dirs.push(root.join(".tools/bin"));
    dirs.into_iter().map(|d| d.join(bin)).find(|p| p.is_file())
}

fn missing(bin: &str) -> Option<Server> {
    if std::env::var("STRATA_REQUIRE_SERVERS").is_ok_and(|v| v == "1") {
        panic!("{bin} is required (STRATA_REQUIRE_SERVERS=1) but was not found; scripts/test.sh installs it");
    }
    eprintln!("SKIPPED: {bin} not found (scripts/test.sh installs it)");
    None
}

fn wait_ready(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not listen on port {port} within 30 s");
}

/// The port a server says it listens on (`http://127.0.0.1:PORT` in a line
/// of its stderr), which is read to its end meanwhile: its request log
/// never fills the pipe.
fn said_port(child: &mut Child, what: &str) -> u16 {
    use std::io::BufRead;
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        let mut reader = std::io::BufReader::new(stderr);
        let mut line = Vec::new();
        // Read to the end, whatever the bytes: the server never blocks on
        // a full pipe.
        while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            let text = String::from_utf8_lossy(&line);
            let port = text.split("http://127.0.0.1:").nth(1).and_then(|p| {
                let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u16>().ok()
            });
            if let Some(p) = port {
                if let Some(t) = tx.take() {
                    let _ = t.send(p);
                }
            }
            line.clear();
        }
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(p) => p,
        Err(_) => {
            let _ = child.kill();
            panic!("{what} did not say its port within 30 s");
        }
    }
}

/// An s3s-fs server with one bucket, or None (skipped) if not installed.
pub fn s3s_fs() -> Option<Server> {
    let Some(bin) = find("s3s-fs") else {
        return missing("s3s-fs");
    };
    let data = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(data.path().join(BUCKET)).unwrap();
    let port = free_port();
    let mut child = Command::new(bin)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg(data.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_ready(port, &mut child, "s3s-fs");
    Some(Server {
        child,
        port,
        kind: "s3s-fs",
        _data: Some(data),
    })
}

/// A moto server with one bucket, or None (skipped) if not installed.
pub fn moto() -> Option<Server> {
    let Some(bin) = find("moto_server") else {
        return missing("moto_server");
    };
    // Port 0: moto binds a port of its own and says which ("Running on
    // http://127.0.0.1:PORT"). A port picked here and handed over would be
    // free only until moto, a second or so later, binds it: another test's
    // server could take it first, and this test would then talk to that one.
    let mut child = Command::new(bin)
        .args(["-H", "127.0.0.1", "-p", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let port = said_port(&mut child, "moto_server");
    wait_ready(port, &mut child, "moto_server");
    // Create the bucket: a bare PUT (moto accepts any credentials).
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "PUT /{BUCKET} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    assert!(
        reply.starts_with("HTTP/1.1 200"),
        "moto bucket creation: {reply}"
    );
    Some(Server {
        child,
        port,
        kind: "moto",
        _data: None,
    })
}

impl Server {
    /// The S3 options for this server.
    pub fn options(&self) -> Vec<(String, String)> {
        [
            ("endpoint", format!("http://127.0.0.1:{}", self.port)),
            ("allow_http", "true".to_string()),
            ("region", "us-east-1".to_string()),
            ("access_key_id", ACCESS_KEY.to_string()),
            ("secret_access_key", SECRET_KEY.to_string()),
            ("virtual_hosted_style_request", "false".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The bucket itself, through a plain S3 client of its own: what the
    /// damage checks write to behind an L3 store's back (its keys under
    /// the store's prefix).
    pub fn objects(&self) -> std::sync::Arc<dyn object_store::ObjectStore> {
        let mut b = object_store::aws::AmazonS3Builder::new().with_bucket_name(BUCKET);
        for (k, v) in self.options() {
            b = b.with_config(k.parse().unwrap(), v);
        }
        std::sync::Arc::new(b.build().unwrap())
    }

    /// An L3 store on this server under `prefix`.
    pub fn store(&self, prefix: &str) -> L3Store {
        self.store_with(prefix, L3Options::default())
    }

    /// An L3 store on this server under `prefix`, with options.
    pub fn store_with(&self, prefix: &str, opts: L3Options) -> L3Store {
        L3Store::from_url(&format!("s3://{BUCKET}/{prefix}"), &self.options(), opts).unwrap()
    }
}
