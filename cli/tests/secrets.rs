//! A secret in the configuration never appears in any output: not in a
//! failing command's errors, not in its most verbose logs, not in a
//! configuration printed with `{:?}`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

const SECRET: &str = "Sup3rS3cretKey-do-not-print-9f8e7d";
const TOKEN: &str = "t0ken-do-not-print-1a2b3c";

fn strata() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

#[test]
fn a_failing_run_never_prints_the_secret_key() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 9: every request fails.
    let opts = [
        "endpoint=http://127.0.0.1:9".to_string(),
        "allow_http=true".into(),
        "region=us-east-1".into(),
        "access_key_id=AKIAEXAMPLE".into(),
        format!("secret_access_key={SECRET}"),
        format!("token={TOKEN}"),
        "max_retries=1".into(),
    ];
    for cmd in [
        vec!["ls"],
        vec!["verify", "--all"],
        vec!["gc", "--tier", "l3"],
        vec!["pin", "3"],
    ] {
        let mut c = strata();
        c.args(&cmd)
            .args(["--job", "secrets", "--l3", "s3://bucket/prefix"])
            .env("STRATA_LOG", "trace")
            .env("RUST_BACKTRACE", "1")
            .current_dir(dir.path());
        for o in &opts {
            c.args(["--l3-option", o]);
        }
        let out = c.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.status.success(),
            "{cmd:?} against a dead server: {text}"
        );
        assert!(text.len() > 20, "{cmd:?} said why it failed: {text}");
        assert!(
            !text.contains(SECRET),
            "{cmd:?} printed the secret:\n{text}"
        );
        assert!(!text.contains(TOKEN), "{cmd:?} printed the token:\n{text}");
    }
}

#[test]
fn a_printed_configuration_hides_secrets() {
    let mut cfg = strata::Config::builder().job("secrets");
    cfg.l3_options
        .insert("secret_access_key".into(), SECRET.into());
    cfg.l3_options
        .insert("azure_storage_sas_key".into(), TOKEN.into());
    cfg.l3_options
        .insert("endpoint".into(), "http://shown.example".into());
    for text in [
        format!("{cfg:?}"),
        format!("{cfg:#?}"),
        cfg.redacted().to_string(),
    ] {
        assert!(!text.contains(SECRET) && !text.contains(TOKEN), "{text}");
        assert!(text.contains("http://shown.example"), "{text}");
        assert!(text.contains(strata::REDACTED), "{text}");
    }
}

const URL_PASSWORD: &str = "UrlPa55-do-not-print-4d5e6f";
const SAS_SIG: &str = "SaSsIgNaTuRe-do-not-print-0a9b8c";

/// L3 URLs carrying credentials: a userinfo password, an Azure SAS, a
/// presigned S3 signature; each points at nothing that answers.
fn urls_with_credentials() -> Vec<String> {
    vec![
        format!("https://alice:{URL_PASSWORD}@127.0.0.1:9/container?sv=2022-11-02&se=2030-01-01T00%3A00%3A00Z&sig={SAS_SIG}"),
        format!("az://container/prefix?sv=2022-11-02&sp=racwdl&sig={SAS_SIG}"),
        format!("s3://alice:{URL_PASSWORD}@bucket/prefix?X-Amz-Signature={SAS_SIG}"),
        format!("gs://bucket/prefix?X-Goog-Signature={SAS_SIG}"),
    ]
}

#[test]
fn credentials_inside_the_l3_url_never_appear_in_any_output() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls_with_credentials() {
        for cmd in [
            vec!["ls"],
            vec!["verify", "--all"],
            vec!["gc", "--tier", "l3"],
        ] {
            let out = strata()
                .args(&cmd)
                .args(["--job", "secrets", "--l3", &url])
                .args(["--l3-option", "endpoint=http://127.0.0.1:9"])
                .args(["--l3-option", "allow_http=true"])
                .args(["--l3-option", "max_retries=0"])
                .env("STRATA_LOG", "trace")
                .current_dir(dir.path())
                .output()
                .unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                !text.contains(URL_PASSWORD) && !text.contains(SAS_SIG),
                "{cmd:?} with {url} printed a credential:\n{text}"
            );
        }
    }
}

#[test]
fn a_printed_configuration_hides_url_credentials_and_etcd_passwords() {
    for url in urls_with_credentials() {
        let mut cfg = strata::Config::builder().job("secrets").l3_url(&url);
        cfg.etcd_endpoints = vec![format!("http://root:{URL_PASSWORD}@10.0.0.1:2379")];
        cfg.l3_options.insert(
            "endpoint".into(),
            format!("https://minio:{URL_PASSWORD}@minio.example"),
        );
        for text in [
            format!("{cfg:?}"),
            format!("{cfg:#?}"),
            cfg.redacted().to_string(),
        ] {
            assert!(
                !text.contains(URL_PASSWORD) && !text.contains(SAS_SIG),
                "{text}"
            );
            assert!(text.contains(strata::REDACTED), "{text}");
            assert!(text.contains("10.0.0.1:2379"), "the rest is shown: {text}");
        }
    }
}
