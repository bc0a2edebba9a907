//! A real S3 server for the benchmarks: s3s-fs on loopback, started on a
//! free port with one bucket, and a plain `object_store` client of it for
//! the raw baselines.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStore;

/// The access key the server accepts.
pub const KEY: &str = "bench-key";
/// Its secret.
pub const SECRET: &str = "bench-secret";
/// The bucket the server starts with.
pub const BUCKET: &str = "bench";

/// A running s3s-fs; killed on drop.
pub struct Server(Child);

impl Server {
    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts s3s-fs over `data` (PATH, then the repository's `.tools/bin`),
/// and returns it with its port once it listens.
pub fn start_s3s_fs(data: &Path) -> Result<(Server, u16), String> {
    let bin = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin")])
        .map(|d| d.join("s3s-fs"))
        .find(|p| p.is_file())
        .ok_or("s3s-fs not found (benches/l3-bench.sh installs it)")?;
    std::fs::create_dir_all(data.join(BUCKET)).map_err(|e| e.to_string())?;
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = Command::new(bin)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", KEY, "--secret-key", SECRET])
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("s3s-fs did not start".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((server, port))
}

/// Strata's L3 options for the server on `port`.
pub fn options(port: u16) -> Vec<(String, String)> {
    [
        ("endpoint", format!("http://127.0.0.1:{port}")),
        ("allow_http", "true".into()),
        ("region", "us-east-1".into()),
        ("access_key_id", KEY.into()),
        ("secret_access_key", SECRET.into()),
        ("virtual_hosted_style_request", "false".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// A plain S3 client of the server's bucket: the raw baselines.
pub fn raw_store(port: u16) -> Result<Arc<dyn ObjectStore>, String> {
    let store = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(BUCKET)
        .with_endpoint(format!("http://127.0.0.1:{port}"))
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id(KEY)
        .with_secret_access_key(SECRET)
        .with_virtual_hosted_style_request(false)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(store))
}
