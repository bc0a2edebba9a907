//! The `STRATA_*` variables that are settings, and the nearest one to a
//! name that is not: a variable one edit away from a setting's name
//! (`STRATA_KEEP_LAS`, `STRATA_L1DIR`) is a typo that would otherwise
//! leave the setting at its default (a checkpoint written to the default
//! path), so [`super::Config::with_env`] refuses it, naming the setting.
//! Names further from every setting are not Strata's settings (the tools'
//! and tests' own variables) and are left alone.

/// Every setting `with_env` reads, without the `STRATA_` prefix.
pub(crate) const SETTINGS: &[&str] = &[
    "JOB",
    "RANK",
    "WORLD_SIZE",
    "L1_DIR",
    "CHUNK_SIZE",
    "IO_ENGINE",
    "KEEP_LAST",
    "BUSY_POLICY",
    "ON_BACKGROUND_ERROR",
    "HASH_THREADS",
    "BACKGROUND_NICE",
    "PERSIST_DURING_SNAPSHOT",
    "COORDINATION_TIMEOUT_SECS",
    "SKIP_UNREADABLE_TIERS",
    "GC_GRACE_SECS",
    "L3_URL",
    "UPLOAD_EVERY",
    "UPLOAD_MIN_INTERVAL_SECS",
    "UPLOAD_BYTES_PER_SEC",
    "MAX_PENDING_UPLOADS",
    "UPLOAD_BACKLOG",
    "MAX_PENDING_PUSHES",
    "L3_KEEP_LAST",
    "L3_KEEP_EVERY",
    "L3_GC_GRACE_SECS",
    "REHYDRATE_L1",
    "NODE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "PEERS",
    "REPLICAS",
    "SPREAD_REPLICAS",
    "REPLICATION_RETRY_SECS",
    "EAGER_PUSH",
    "PEER_CERTS",
    "ETCD_ENDPOINTS",
    "ETCD_PREFIX",
    "INCARNATION",
    "ETCD_LEASE_SECS",
    "ETCD_CA",
    "ETCD_CERT",
    "ETCD_KEY",
    "ETCD_USER",
    "ETCD_PASSWORD_FILE",
    "ETCD_ALLOW_PLAINTEXT_AUTH",
    "ETCD_NODE_ROUNDS",
    "METRICS_LISTEN",
];

/// The setting one edit (a letter added, dropped, changed, or two
/// neighbours swapped; case ignored) from `name`, where `name` is not a
/// setting itself.
pub(crate) fn nearest(name: &str) -> Option<&'static str> {
    let upper = name.to_ascii_uppercase();
    if SETTINGS.contains(&name) {
        return None;
    }
    SETTINGS
        .iter()
        .copied()
        .find(|s| *s == upper || within_one_edit(upper.as_bytes(), s.as_bytes()))
}

/// Optimal string alignment distance ≤ 1, without a table.
fn within_one_edit(a: &[u8], b: &[u8]) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    match long.len() - short.len() {
        0 => {
            let diff: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
            match diff.as_slice() {
                [] | [_] => true,
                [i, j] => *j == i + 1 && a[*i] == b[*j] && a[*j] == b[*i],
                _ => false,
            }
        }
        1 => {
            // The first difference is the inserted letter.
            let i = (0..short.len())
                .find(|&i| short[i] != long[i])
                .unwrap_or(short.len());
            short[i..] == long[i + 1..]
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_one_edit_away_name_the_setting() {
        assert_eq!(nearest("KEEP_LAS"), Some("KEEP_LAST"));
        assert_eq!(nearest("L1DIR"), Some("L1_DIR"));
        assert_eq!(nearest("L1_DRI"), Some("L1_DIR"));
        assert_eq!(nearest("CHUNKK_SIZE"), Some("CHUNK_SIZE"));
        assert_eq!(nearest("l1_dir"), Some("L1_DIR"), "case");
        assert_eq!(nearest("ETCD_ENDPOINT"), Some("ETCD_ENDPOINTS"));
        assert_eq!(nearest("L1_DIR"), None, "a setting");
    }

    #[test]
    fn the_projects_own_variables_are_not_settings_and_not_typos() {
        for v in [
            "LOG",
            "PYTHON",
            "BIN",
            "VENV",
            "TOOLS_DIR",
            "QUIC_MTU",
            "TO_TORCH",
            "TO_NUMPY",
            "PRINT_TOKEN",
            "WRITE_SAMPLES",
            "FAULT_SEED",
            "CRASH_SEED",
            "CRASH_ITERS",
            "TEST_SEED",
            "TEST_ETCD_CHILD",
            "SIM_SEED",
            "SIM_RANKS",
            "RF_WORLD",
            "RF_RANK",
            "RF_PHASE",
            "RF_KILL",
            "RF_KEEP",
            "RF_JOB",
            "RF_ETCD",
            "RF_DIR",
            "REQUIRE_FUSE",
            "REQUIRE_NETNS",
            "REQUIRE_SERVERS",
            "REQUIRE_ETCD",
            "REQUIRE_PYTHON",
            "REQUIRE_TORCH",
        ] {
            assert_eq!(nearest(v), None, "{v}");
        }
    }
}
