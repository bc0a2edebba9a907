//! Private keys on disk: written 0600 into 0700 directories, the CA's key
//! apart from what is copied to nodes, and a key others can read refused
//! at start-up (as ssh refuses one).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;

use strata_peer::tls::{
    client_config, default_ca_dir, issue_client, make_certs, server_config, CertFiles, TlsError,
};

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn keys_are_private_and_the_ca_key_is_apart() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let written = make_certs(&certs, &["node-a".into()], &[], &["j".into()]).unwrap();
    let keys: Vec<_> = written
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "key"))
        .collect();
    assert_eq!(keys.len(), 3, "{written:?}");
    for k in &keys {
        assert_eq!(mode(k), 0o600, "{}", k.display());
    }
    assert_eq!(mode(&certs), 0o700);
    let ca_dir = default_ca_dir(&certs);
    assert_eq!(mode(&ca_dir), 0o700);
    assert!(ca_dir.join("ca.key").exists());
    assert!(
        !certs.join("ca.key").exists(),
        "the CA key is not beside what nodes get"
    );
    // Issuing a client certificate later reads the CA key from there.
    let more = issue_client(&certs, &ca_dir, "ops", &["j".into(), "k".into()]).unwrap();
    assert_eq!(mode(&more[1]), 0o600);
    // Certificates stay readable: nodes and clients need the CA's.
    assert_eq!(mode(&certs.join("ca.pem")) & 0o044, 0o044);
}

#[test]
fn a_key_others_can_read_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), &["node-a".into()], &[], &["j".into()]).unwrap();
    let node = CertFiles::in_dir(dir.path(), "node-a");
    let client = CertFiles::in_dir(dir.path(), "client-j");
    assert!(server_config(&node, 8).is_ok());
    assert!(client_config(&client, 8).is_ok());
    for (files, is_server) in [(&node, true), (&client, false)] {
        // Group read alone is accepted from a key root owns (a Kubernetes
        // secret with an fsGroup); from anyone else's, refused.
        let root_owned =
            std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&files.key).unwrap()) == 0;
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o640)).unwrap();
        let group_read = if is_server {
            server_config(files, 8).err()
        } else {
            client_config(files, 8).err()
        };
        assert_eq!(group_read.is_none(), root_owned, "{group_read:?}");
        for loose in [0o644, 0o604, 0o660, 0o641, 0o650] {
            std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(loose)).unwrap();
            let err = if is_server {
                server_config(files, 8).err()
            } else {
                client_config(files, 8).err()
            };
            match err {
                Some(TlsError::InsecureKey { path, mode }) => {
                    assert_eq!(path, files.key);
                    assert_eq!(mode, loose);
                    let text = TlsError::InsecureKey { path, mode }.to_string();
                    assert!(text.contains("chmod 600"), "{text}");
                }
                other => panic!("mode {loose:o}: {other:?}"),
            }
        }
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    // The CA key too, when a client certificate is issued from it.
    let ca_key = default_ca_dir(dir.path()).join("ca.key");
    std::fs::set_permissions(&ca_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(matches!(
        issue_client(dir.path(), &default_ca_dir(dir.path()), "x", &["j".into()]),
        Err(TlsError::InsecureKey { .. })
    ));
}

#[test]
fn an_existing_directory_keeps_its_mode_and_an_old_ca_key_still_issues() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    make_certs(dir.path(), &["node-a".into()], &[], &["j".into()]).unwrap();
    assert_eq!(
        mode(dir.path()),
        0o755,
        "a directory the user made keeps its mode"
    );
    // A CA made before the key moved apart: ca.key beside the certificates.
    let ca_dir = default_ca_dir(dir.path());
    std::fs::rename(ca_dir.join("ca.key"), dir.path().join("ca.key")).unwrap();
    let more = issue_client(dir.path(), &ca_dir, "ops", &["j".into()]).unwrap();
    assert_eq!(more.len(), 2);
}
