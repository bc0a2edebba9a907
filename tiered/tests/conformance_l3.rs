//! The conformance suite on L3: in memory, on a local directory, and on two
//! real S3-compatible servers (s3s-fs and moto) over HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/servers.rs"]
mod servers;

mod memory {
    strata_tiered::conformance_tests!((
        strata_tiered::L3Store::from_url("memory://", &[], strata_tiered::L3Options::default())
            .unwrap(),
        ()
    ));
}

mod file {
    strata_tiered::conformance_tests!({
        let d = tempfile::tempdir().unwrap();
        let url = format!("file://{}", d.path().display());
        (
            strata_tiered::L3Store::from_url(&url, &[], strata_tiered::L3Options::default())
                .unwrap(),
            d,
        )
    });
}

mod s3s_fs {
    strata_tiered::conformance_tests!(optional super::servers::s3s_fs().map(|s| (s.store("conf"), s)));
}

mod moto {
    strata_tiered::conformance_tests!(optional super::servers::moto().map(|s| (s.store("conf"), s)));
}
