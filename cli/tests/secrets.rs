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
