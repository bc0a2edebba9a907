//! Certificates and mutual TLS for the peer protocol.
//!
//! A cluster has one CA. Every peer service presents a *node certificate*
//! (its name, `localhost` and its addresses as subject names); every client
//! (a training rank, the CLI) presents a *client certificate* whose subject
//! names say which jobs it may reach: job `J` is the DNS name
//! [`job_name`]`(J)` (the job id's BLAKE3 in hex under
//! `job.strata.invalid`, so any job id gives a valid DNS name). A service refuses, during the TLS
//! handshake, any certificate not issued by the cluster CA, and refuses a
//! connection whose `Hello` names a job its certificate does not list.
//!
//! [`make_certs`] writes a CA and certificates into a directory, for a
//! test or a small cluster (`strata peer certs`); larger clusters issue
//! them from their own PKI with the same subject names.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::proto::ALPN;

/// DNS suffix of job subject names.
pub const JOB_SUFFIX: &str = "job.strata.invalid";

/// Errors building certificates or TLS configurations.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Reading or writing a certificate or key file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable certificate or key.
    #[error("{path}: {reason}")]
    BadPem {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A private key file that other users may read or write: refused,
    /// as ssh refuses one (anyone who reads it can act as its owner).
    #[error("{path}: private key is accessible by others (mode {mode:03o}); run chmod 600 on it")]
    InsecureKey {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Certificate generation failed.
    #[error("generating certificates: {0}")]
    Generate(String),
    /// The TLS library refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
}

type Result<T> = std::result::Result<T, TlsError>;

/// The subject name that lets a client certificate reach job `job`: the
/// BLAKE3 of the job id in hex, as two 32-character labels (a DNS name
/// whatever the job id's characters and length).
pub fn job_name(job: &str) -> String {
    let hex = blake3::hash(job.as_bytes()).to_hex();
    format!("{}.{}.{JOB_SUFFIX}", &hex[..32], &hex[32..])
}

/// True if `cert` (a client's end-entity certificate, already verified
/// against the CA by the handshake) lists `job`.
pub fn allows_job(cert: &CertificateDer<'_>, job: &str) -> bool {
    let Ok(name) = ServerName::try_from(job_name(job)) else {
        return false;
    };
    webpki::EndEntityCert::try_from(cert)
        .is_ok_and(|ee| ee.verify_is_valid_for_subject_name(&name).is_ok())
}

fn gen(e: rcgen::Error) -> TlsError {
    TlsError::Generate(e.to_string())
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a certificate (public): readable by all.
fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(io_err(path))
}

/// Writes a private key readable by its owner only: created 0600 under a
/// temporary name (never readable by others, whatever the umask, even
/// for a moment), then renamed over `path`.
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(name);
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    f.write_all(text.as_bytes()).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// Creates `dir` 0700 (it holds keys). A directory that exists already
/// (`--out .`, a shared directory) keeps its mode: its owner chose it.
fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))
}

/// Reads a private key, refusing one that others may read or write: any
/// bit for others, group write, or group read unless root owns the file
/// (a key mounted from a Kubernetes secret with an `fsGroup` is root's,
/// mode 0440 or 0640; PostgreSQL accepts the same).
fn read_private(path: &Path) -> Result<Vec<u8>> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(path).map_err(io_err(path))?;
    let mode = meta.permissions().mode();
    let group_read_ok = meta.uid() == 0 && mode & 0o037 == 0;
    if mode & 0o077 != 0 && !group_read_ok {
        return Err(TlsError::InsecureKey {
            path: path.to_path_buf(),
            mode: mode & 0o777,
        });
    }
    read(path)
}

/// Where [`make_certs`] keeps the CA's key by default: `private/` inside
/// the certificate directory, 0700. Copy the certificate directory to the
/// nodes *without* it (docs/operations.md).
pub fn default_ca_dir(dir: &Path) -> PathBuf {
    dir.join("private")
}

/// Files of one certificate.
#[derive(Clone, Debug)]
pub struct CertFiles {
    /// The cluster CA's certificate.
    pub ca: PathBuf,
    /// This party's certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

impl CertFiles {
    /// `dir/ca.pem`, `dir/<name>.pem`, `dir/<name>.key`.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        CertFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        }
    }
}

/// [`make_certs_with_ca`] with the CA key in [`default_ca_dir`].
pub fn make_certs(
    dir: &Path,
    nodes: &[String],
    addrs: &[String],
    jobs: &[String],
) -> Result<Vec<PathBuf>> {
    make_certs_with_ca(dir, &default_ca_dir(dir), nodes, addrs, jobs)
}

/// Writes a new cluster CA (unless one is there already: `ca_dir/ca.key`
/// and `dir/ca.pem`, which then issues the new certificates): its
/// certificate `ca.pem` into `dir` and its key `ca.key` into `ca_dir`
/// (apart: it signs certificates for any job, and no node needs it); a node certificate per `nodes` entry
/// (`<node>.pem`, `<node>.key`; subject names: the node name,
/// `localhost`, `127.0.0.1`, `::1`, and `addrs`), and a client certificate
/// `client-<job>.pem` for each job in `jobs`. Keys are 0600, both
/// directories 0700. Returns the files written.
pub fn make_certs_with_ca(
    dir: &Path,
    ca_dir: &Path,
    nodes: &[String],
    addrs: &[String],
    jobs: &[String],
) -> Result<Vec<PathBuf>> {
    private_dir(dir)?;
    private_dir(ca_dir)?;
    let mut written = Vec::new();
    let (key_path, pem_path) = (ca_dir.join("ca.key"), dir.join("ca.pem"));
    // A CA already there issues the new certificates: a node or a job
    // added later must not replace the CA every certificate issued before
    // chains to.
    let old_key = dir.join("ca.key");
    if pem_path.exists() != (key_path.exists() || old_key.exists()) {
        // One half of a CA: making a new one would overwrite the other
        // half, and every certificate issued before would stop chaining.
        return Err(TlsError::Generate(format!(
            "{} and {} must both exist (to issue from that CA) or neither (to make a new one)",
            pem_path.display(),
            key_path.display()
        )));
    }
    let key_path = if !key_path.exists() && old_key.exists() {
        old_key
    } else {
        key_path
    };
    let ca_key = if key_path.exists() && pem_path.exists() {
        let key_pem = String::from_utf8_lossy(&read_private(&key_path)?).into_owned();
        rcgen::KeyPair::from_pem(&key_pem).map_err(|e| TlsError::BadPem {
            path: key_path.clone(),
            reason: e.to_string(),
        })?
    } else {
        let ca_key = rcgen::KeyPair::generate().map_err(gen)?;
        let ca_cert = ca_params()?.self_signed(&ca_key).map_err(gen)?;
        write(&pem_path, &ca_cert.pem())?;
        written.push(pem_path);
        write_private(&key_path, &ca_key.serialize_pem())?;
        written.push(key_path);
        ca_key
    };
    let issuer = rcgen::Issuer::new(ca_params()?, &ca_key);
    for node in nodes {
        let mut names = vec![
            node.clone(),
            "localhost".into(),
            "127.0.0.1".into(),
            "::1".into(),
        ];
        names.extend(addrs.iter().cloned());
        written.extend(issue(dir, &issuer, node, node, names, true)?);
    }
    for job in jobs {
        written.extend(issue_job(dir, &issuer, job, std::slice::from_ref(job))?);
    }
    Ok(written)
}

/// The CA's parameters. Issuing from an existing CA rebuilds them (the
/// issuer name and key identifier of issued certificates come from these
/// and the CA key), so no certificate parser is needed.
fn ca_params() -> Result<rcgen::CertificateParams> {
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(gen)?;
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "strata cluster CA");
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

/// Issues, from the CA whose key is `ca_dir/ca.key`, a client certificate
/// `dir/client-<name>.pem` (key 0600) allowing every job in `jobs`.
/// Returns the files. A CA made before the key moved apart has it at
/// `dir/ca.key`: it is used from there, with a warning to move it.
pub fn issue_client(
    dir: &Path,
    ca_dir: &Path,
    name: &str,
    jobs: &[String],
) -> Result<Vec<PathBuf>> {
    let mut ca_key = ca_dir.join("ca.key");
    let old = dir.join("ca.key");
    if !ca_key.exists() && old.exists() {
        tracing::warn!(
            "using the CA key {} beside the certificates nodes receive; move it to {}",
            old.display(),
            ca_key.display()
        );
        ca_key = old;
    }
    let key_pem = String::from_utf8_lossy(&read_private(&ca_key)?).into_owned();
    let key = rcgen::KeyPair::from_pem(&key_pem).map_err(|e| TlsError::BadPem {
        path: ca_key.clone(),
        reason: e.to_string(),
    })?;
    private_dir(dir)?;
    let issuer = rcgen::Issuer::new(ca_params()?, key);
    issue_job(dir, &issuer, name, jobs)
}

fn issue_job(
    dir: &Path,
    issuer: &rcgen::Issuer<'_, impl rcgen::SigningKey>,
    name: &str,
    jobs: &[String],
) -> Result<Vec<PathBuf>> {
    for job in jobs {
        strata_format::names::validate_job_id(job)
            .map_err(|e| TlsError::Generate(e.to_string()))?;
    }
    issue(
        dir,
        issuer,
        &format!("client-{name}"),
        &format!("strata client {name}"),
        jobs.iter().map(|j| job_name(j)).collect(),
        false,
    )
}

/// Writes `<file>.pem` and `<file>.key`: a certificate for `names` signed
/// by `issuer`, for a server or a client.
fn issue(
    dir: &Path,
    issuer: &rcgen::Issuer<'_, impl rcgen::SigningKey>,
    file: &str,
    cn: &str,
    names: Vec<String>,
    server: bool,
) -> Result<Vec<PathBuf>> {
    let key = rcgen::KeyPair::generate().map_err(gen)?;
    let mut p = rcgen::CertificateParams::new(names).map_err(gen)?;
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    // A node's certificate serves, and may also authenticate the node as
    // a client of a service of the cluster's (etcd's gateway dials its
    // own gRPC port with its server certificate).
    p.extended_key_usages = if server {
        vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ]
    } else {
        vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth]
    };
    let cert = p.signed_by(&key, issuer).map_err(gen)?;
    let (c, k) = (
        dir.join(format!("{file}.pem")),
        dir.join(format!("{file}.key")),
    );
    write(&c, &cert.pem())?;
    write_private(&k, &key.serialize_pem())?;
    Ok(vec![c, k])
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = read(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| TlsError::BadPem {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::BadPem {
            path: path.to_path_buf(),
            reason: "no certificate".into(),
        });
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let bytes = read_private(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::BadPem {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn roots(ca: &Path) -> Result<Arc<rustls::RootCertStore>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca)? {
        roots.add(c).map_err(|e| TlsError::BadPem {
            path: ca.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(Arc::new(roots))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn cfg_err(e: impl std::fmt::Display) -> TlsError {
    TlsError::Config(e.to_string())
}

/// Milliseconds without a packet after which a connection is dead.
pub const IDLE_TIMEOUT_MS: u32 = 3000;

/// The largest UDP payload an endpoint sends or accepts, and the upper
/// bound of path-MTU discovery: `STRATA_QUIC_MTU` (1200..=65527), default
/// 1472 (a 1500-byte Ethernet MTU). On jumbo-frame networks set 8972 on
/// every node, services and clients alike (docs/operations.md).
pub fn quic_mtu() -> u16 {
    std::env::var("STRATA_QUIC_MTU")
        .ok()
        .and_then(|v| v.parse::<u16>().ok())
        .filter(|v| (1200..=65_527).contains(v))
        .unwrap_or(1472)
}

/// A QUIC endpoint bound to `bind` (a service when `server` is given).
pub fn endpoint(
    bind: std::net::SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> std::io::Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(bind)?;
    let mut cfg = quinn::EndpointConfig::default();
    cfg.max_udp_payload_size(quic_mtu())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    quinn::Endpoint::new(cfg, server, socket, Arc::new(quinn::TokioRuntime))
}

/// QUIC transport settings shared by services and clients: windows large
/// enough for 16 MiB chunks in flight on several streams, and a bounded
/// number of concurrent streams (backpressure: a client opening more waits).
pub fn transport(max_streams: u32) -> Arc<quinn::TransportConfig> {
    Arc::new(transport_config(max_streams))
}

fn transport_config(max_streams: u32) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    let mtu = quic_mtu();
    if mtu > 1472 {
        // Path-MTU discovery climbs from 1200 to the bound. Segmentation
        // offload is off with large datagrams: measured here, GSO with a
        // 9000-byte MTU fell back to 1200-byte packets, while without it
        // one stream ran about 1.7x faster than the 1472 default.
        let mut d = quinn::MtuDiscoveryConfig::default();
        d.upper_bound(mtu);
        t.mtu_discovery_config(Some(d));
        t.enable_segmentation_offload(false);
    }
    t.max_concurrent_bidi_streams(max_streams.into())
        .max_concurrent_uni_streams(0u8.into())
        .stream_receive_window((32u32 << 20).into())
        .receive_window((256u32 << 20).into())
        .send_window(256 << 20)
        // A peer that vanished (killed, cut off) is noticed after this long
        // without a packet; live connections send keep-alives well within it.
        .max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(
            IDLE_TIMEOUT_MS,
        ))))
        .keep_alive_interval(Some(std::time::Duration::from_millis(
            u64::from(IDLE_TIMEOUT_MS) / 6,
        )));
    t
}

/// A service's QUIC configuration: its node certificate, client
/// certificates required and verified against the CA.
pub fn server_config(files: &CertFiles, max_streams: u32) -> Result<quinn::ServerConfig> {
    server_config_with_windows(files, max_streams, None)
}

/// [`server_config`] with per-connection windows `(receive, send)` in
/// bytes: what QUIC buffers for one client, request data not read yet and
/// answers not acknowledged yet, outside the service's own budgets.
pub fn server_config_with_windows(
    files: &CertFiles,
    max_streams: u32,
    windows: Option<(u64, u64)>,
) -> Result<quinn::ServerConfig> {
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots(&files.ca)?, provider())
            .build()
            .map_err(cfg_err)?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(cfg_err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs(&files.cert)?, key(&files.key)?)
        .map_err(cfg_err)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(cfg_err)?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(quic));
    let mut t = transport_config(max_streams);
    if let Some((receive, send)) = windows {
        let receive = quinn::VarInt::from_u64(receive).unwrap_or(quinn::VarInt::MAX);
        t.receive_window(receive)
            .stream_receive_window(receive)
            .send_window(send);
    }
    cfg.transport_config(Arc::new(t));
    Ok(cfg)
}

/// A client's QUIC configuration: trusts only the CA, presents its client
/// certificate.
pub fn client_config(files: &CertFiles, max_streams: u32) -> Result<quinn::ClientConfig> {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(cfg_err)?
        .with_root_certificates(roots(&files.ca)?)
        .with_client_auth_cert(certs(&files.cert)?, key(&files.key)?)
        .map_err(cfg_err)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(cfg_err)?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(quic));
    cfg.transport_config(transport(max_streams));
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn job_names_are_dns_names_and_certificates_list_their_jobs() {
        let long = "j".repeat(128);
        for job in ["a", "job-1.x_y", long.as_str()] {
            assert!(ServerName::try_from(job_name(job)).is_ok(), "{job}");
        }
        let dir = tempfile::tempdir().unwrap();
        make_certs(
            dir.path(),
            &["node-a".into()],
            &[],
            &["train".into(), long.clone()],
        )
        .unwrap();
        let c = &certs(&dir.path().join("client-train.pem")).unwrap()[0];
        assert!(allows_job(c, "train"));
        assert!(!allows_job(c, "other"));
        assert!(!allows_job(c, "trai"));
        let c = &certs(&dir.path().join(format!("client-{long}.pem"))).unwrap()[0];
        assert!(allows_job(c, &long));
        // A node certificate lists no job.
        let n = &certs(&dir.path().join("node-a.pem")).unwrap()[0];
        assert!(!allows_job(n, "train"));
        // Both sides' configurations build from the files.
        server_config(&CertFiles::in_dir(dir.path(), "node-a"), 16).unwrap();
        client_config(&CertFiles::in_dir(dir.path(), "client-train"), 16).unwrap();
        // Bad files are typed errors.
        std::fs::write(dir.path().join("junk.pem"), "not pem").unwrap();
        assert!(matches!(
            client_config(&CertFiles::in_dir(dir.path(), "junk"), 16),
            Err(TlsError::BadPem { .. } | TlsError::Io { .. })
        ));
    }
}
