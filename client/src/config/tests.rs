//! Unit tests of [`Config`](super::Config): the TOML file, the environment
//! (launcher variables and `STRATA_*`) and the builder (beside `mod.rs`,
//! which stays under the 800-line limit).

use super::*;

#[test]
fn toml_env_and_builder() {
    let c = Config::from_toml(
        "job = \"j1\"\nrank = 1\nworld_size = 4\nbusy_policy = \"skip\"\nio_engine = \"psync\"",
    )
    .unwrap();
    assert_eq!(
        (c.job.as_str(), c.rank, c.world_size, c.busy_policy),
        ("j1", 1, 4, BusyPolicy::Skip)
    );
    c.validate().unwrap();
    let c = c
        .with_env([
            ("STRATA_RANK".into(), "3".into()),
            ("STRATA_L1_DIR".into(), "/x".into()),
            ("OTHER".into(), "1".into()),
        ])
        .unwrap();
    assert_eq!((c.rank, c.l1_dir.as_path()), (3, Path::new("/x")));
    assert!(c
        .clone()
        .with_env([("STRATA_RANK".into(), "x".into())])
        .is_err());
    assert!(
        Config::from_toml("jobb = 1").is_err(),
        "unknown keys are refused"
    );
    assert!(Config::builder().rank(4, 4).validate().is_err());
    assert!(Config::builder().chunk_size(100).validate().is_err());
    assert!(Config::builder().io_engine("spdk").validate().is_err());
    assert!(Config::builder().job("../x").validate().is_err());
}

#[test]
fn peers_from_toml_then_env() {
    let c = Config::from_toml(
        "node = \"node-a\"\npeers = [\"node-a=127.0.0.1:7070\", \"node-b=127.0.0.1:7071\"]\n\
         replicas = 2\npeer_certs = \"/certs\"\nreplication_retry_secs = 5",
    )
    .unwrap();
    c.validate().unwrap();
    let names: Vec<String> = c.peer_list().unwrap().into_iter().map(|p| p.0).collect();
    assert_eq!(names, ["node-a", "node-b"]);
    assert_eq!((c.replicas, c.replication_retry_secs), (2, 5));
    let c = c
        .with_env([
            (
                "STRATA_PEERS".into(),
                "node-a=127.0.0.1:1, node-c=127.0.0.1:2,node-d=127.0.0.1:3".into(),
            ),
            ("STRATA_NODE".into(), "node-c".into()),
            ("STRATA_REPLICAS".into(), "3".into()),
            ("STRATA_REPLICATION_RETRY_SECS".into(), "7".into()),
        ])
        .unwrap();
    let list = c.peer_list().unwrap();
    assert_eq!(list.len(), 3);
    assert_eq!(list[1].1, "127.0.0.1:2".parse().unwrap());
    assert_eq!(
        (c.node.as_str(), c.replicas, c.replication_retry_secs),
        ("node-c", 3, 7)
    );
    // Peers without certificates, or an entry without a name, are refused.
    let mut no_certs = c.clone();
    no_certs.peer_certs = None;
    assert!(no_certs.validate().is_err());
    let bad = c
        .with_env([("STRATA_PEERS".into(), "127.0.0.1:7070".into())])
        .unwrap();
    assert!(bad.validate().is_err());
}

#[test]
fn the_launchers_variables_set_rank_and_world_and_strata_wins() {
    let env = |pairs: &[(&str, &str)]| {
        Config::default().with_env(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>(),
        )
    };
    let torchrun = env(&[("RANK", "5"), ("WORLD_SIZE", "16"), ("LOCAL_RANK", "1")]).unwrap();
    assert_eq!((torchrun.rank, torchrun.world_size), (5, 16));
    let task = [
        ("SLURM_PROCID", "3"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "1"),
    ];
    let slurm = env(&[&task[..], &[("SLURM_STEP_ID", "0")]].concat()).unwrap();
    assert_eq!((slurm.rank, slurm.world_size), (3, 8));
    assert_eq!((slurm.local_rank, slurm.node_rank), (Some(1), Some(1)));
    // A batch script's own shell (no step) is no task of the job.
    let batch = env(&task).unwrap();
    assert_eq!((batch.rank, batch.world_size), (0, 1));
    assert_eq!((batch.local_rank, batch.node_rank), (None, None));
    let local = env(&[
        ("RANK", "5"),
        ("WORLD_SIZE", "16"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "8"),
        ("GROUP_RANK", "0"),
    ])
    .unwrap();
    assert_eq!(
        (local.local_rank, local.local_world_size, local.node_rank),
        (Some(1), Some(8), Some(0))
    );
    local.validate().unwrap();
    let bad = env(&[
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "8"),
        ("LOCAL_WORLD_SIZE", "8"),
    ])
    .unwrap();
    assert!(
        bad.validate().is_err(),
        "local rank beyond the node's ranks"
    );
    // torchrun's over Slurm's (torchrun under srun), STRATA_* over both.
    let both = env(&[
        ("RANK", "1"),
        ("SLURM_PROCID", "3"),
        ("SLURM_STEP_ID", "0"),
        ("WORLD_SIZE", "4"),
    ])
    .unwrap();
    assert_eq!(both.rank, 1);
    let ours = env(&[("RANK", "1"), ("STRATA_RANK", "2"), ("WORLD_SIZE", "4")]).unwrap();
    assert_eq!(ours.rank, 2);
    assert!(env(&[("RANK", "x")]).is_err());
    // The node is the host name unless STRATA_NODE says otherwise.
    assert_eq!(env(&[]).unwrap().node, hostname());
    assert_eq!(env(&[("STRATA_NODE", "n7")]).unwrap().node, "n7");
    let etcd = env(&[
        ("STRATA_ETCD_ENDPOINTS", "http://a:2379, http://b:2379"),
        ("STRATA_ETCD_LEASE_SECS", "3"),
    ])
    .unwrap();
    assert_eq!(etcd.etcd_endpoints, ["http://a:2379", "http://b:2379"]);
    let o = crate::EtcdOptions::from_config(&etcd).unwrap();
    assert_eq!(o.lease_ttl, std::time::Duration::from_secs(3));
    assert_eq!(o.incarnation, None);
    let again = env(&[("TORCHELASTIC_RESTART_COUNT", "2")]).unwrap();
    assert_eq!(again.incarnation.as_deref(), Some("2"));
    let user = env(&[("STRATA_ETCD_USER", "u")]).unwrap();
    assert!(
        crate::EtcdOptions::from_config(&user).is_err(),
        "a user needs a password file"
    );
}

fn with(pairs: &[(&str, &str)]) -> crate::error::Result<Config> {
    Config::default().with_env(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>(),
    )
}

#[test]
fn a_strata_variable_one_edit_from_a_setting_is_refused_naming_it() {
    let e = with(&[("STRATA_KEEP_LAS", "5")]).unwrap_err().to_string();
    assert!(
        e.contains("STRATA_KEEP_LAS is not a setting; did you mean STRATA_KEEP_LAST?"),
        "{e}"
    );
    let e = with(&[("STRATA_L1DIR", "/nvme")]).unwrap_err().to_string();
    assert!(e.contains("STRATA_L1_DIR"), "{e}");
    // Other variables of the environment are not Strata's settings.
    assert!(with(&[("STRATA_LOG", "debug"), ("STRATA_PYTHON", "python3")]).is_ok());
    // Every setting's own name is read, none is taken for a typo.
    for key in super::env_names::SETTINGS {
        let name = format!("STRATA_{key}");
        if let Err(e) = with(&[(name.as_str(), "1")]) {
            assert!(!e.to_string().contains("not a setting"), "{name}: {e}");
        }
    }
}

#[test]
fn hash_threads_default_to_this_ranks_share_of_the_cores() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(Config::default().hash_threads, 0, "automatic");
    let alone = with(&[]).unwrap();
    assert!(alone.effective_hash_threads() >= 1 && alone.effective_hash_threads() <= cores);
    let eight = with(&[("LOCAL_WORLD_SIZE", "8")]).unwrap();
    let shared = eight.effective_hash_threads();
    assert!(
        shared >= 1 && shared <= alone.effective_hash_threads(),
        "{shared}"
    );
    let set = with(&[("LOCAL_WORLD_SIZE", "8"), ("STRATA_HASH_THREADS", "3")]).unwrap();
    assert_eq!(set.effective_hash_threads(), 3, "an explicit setting wins");
}

#[test]
fn peers_slurm_port_are_the_allocations_nodes() {
    let cfg = |pairs: &[(&str, &str)]| {
        Config {
            peers: vec!["slurm:7070".into()],
            ..Config::default()
        }
        .with_env(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>(),
        )
    };
    let c = cfg(&[
        ("SLURM_JOB_NODELIST", "gpu[01-02],login"),
        ("SLURMD_NODENAME", "gpu02"),
    ])
    .unwrap();
    assert_eq!(
        c.peers,
        ["gpu01=gpu01:7070", "gpu02=gpu02:7070", "login=login:7070"]
    );
    assert_eq!(c.node, "gpu02", "named as Slurm names it");
    let ours = cfg(&[
        ("SLURM_JOB_NODELIST", "gpu[01-02]"),
        ("SLURMD_NODENAME", "gpu02"),
        ("STRATA_NODE", "mine"),
    ])
    .unwrap();
    assert_eq!(ours.node, "mine");
    // From the environment too, and without an allocation: a clear error.
    let env_only = with(&[("STRATA_PEERS", "slurm:9000"), ("SLURM_NODELIST", "a[1-2]")]).unwrap();
    assert_eq!(env_only.peers, ["a1=a1:9000", "a2=a2:9000"]);
    let e = cfg(&[]).unwrap_err().to_string();
    assert!(e.contains("needs SLURM_JOB_NODELIST"), "{e}");
    let e = cfg(&[("SLURM_JOB_NODELIST", "n[3-1]")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("backwards"), "{e}");
    let e = with(&[("STRATA_PEERS", "slurm:x"), ("SLURM_NODELIST", "a")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("slurm:PORT"), "{e}");
    // Not read from an environment: said so, not "expected name=host:port".
    let raw = Config {
        peers: vec!["slurm:7070".into()],
        ..Config::default()
    };
    let e = raw.peer_list().unwrap_err().to_string();
    assert!(e.contains("SLURM_JOB_NODELIST"), "{e}");
}

#[test]
fn every_listed_setting_is_read_from_the_environment() {
    // The typo check's list and `with_env`'s reading must name the same
    // settings: each listed name changes the configuration.
    let default = serde_json::to_value(Config::default()).unwrap();
    let values = [
        "7",
        "false",
        "true",
        "0",
        "log",
        "skip",
        "wait",
        "psync",
        "a=127.0.0.1:1",
        "/tmp/x",
        "x",
    ];
    for key in super::env_names::SETTINGS {
        let name = format!("STRATA_{key}");
        let changed = values.iter().any(|v| {
            with(&[(name.as_str(), v)]).is_ok_and(|c| serde_json::to_value(c).unwrap() != default)
        });
        assert!(changed, "{name} is listed but with_env does not read it");
    }
}
