//! The inspection commands (`ls`, `show`, `verify`, `diff`, `stat`,
//! `export`, `import`) run as the real binary on stores written by the
//! library: an L1 directory and an L3 object store (a local directory
//! behind `object_store`), healthy and then damaged.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;

mod support;

use serde_json::Value;
use strata::format::DType;
use strata::{Checkpointer, Config, Entry};
use support::find;
use support::store::{run, snapshot, tensor, Store, JOB};

#[test]
fn ls_show_diff_and_stat_describe_every_tier_and_write_nothing() {
    let s = Store::new();
    let before = (snapshot(&s.l1), snapshot(&s.l3));

    let ls = s.run(&["ls", "--json"]).json();
    let steps: Vec<u64> = ls["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![3, 2, 1], "newest first");
    let three = &ls["steps"][0];
    assert_eq!(three["world_size"], 1);
    assert_eq!(three["tiers"][0]["ranks"], 1, "{three}");
    assert_eq!(
        three["logical_bytes"].as_u64().unwrap(),
        (3 << 20) + (2 << 20) + 4096 + 1000 + 8192
    );
    for t in three["tiers"].as_array().unwrap() {
        assert_eq!(t["state"], "committed", "{t}");
    }
    assert!(three["stored_bytes"].as_u64().unwrap() > 0);
    let human = s.run(&["ls"]);
    assert_eq!(human.code, 0, "{}", human.stderr);
    assert!(human.stdout.contains("STEP"), "{}", human.stdout);
    assert!(human.stdout.contains("committed"), "{}", human.stdout);

    let show = s.run(&["show", "2", "--json"]).json();
    assert_eq!(show["step"], 2);
    assert_eq!(show["previous_step"], 1);
    assert_eq!(show["metadata"]["arch"], "tiny");
    let entry = |name: &str| -> Value {
        show["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name}"))
    };
    assert_eq!(entry("layer.1.w")["change"], "changed");
    assert_eq!(entry("layer.0.w")["change"], "same");
    assert_eq!(entry("layer.1.w")["dtype"], "BF16");
    assert_eq!(entry("layer.1.w")["shape"], serde_json::json!([1024, 1024]));
    assert_eq!(entry("layer.0.w")["bytes"].as_u64().unwrap(), 3 << 20);
    assert_eq!(entry("layer.0.w")["chunks"].as_u64().unwrap(), 3);
    assert_eq!(entry("optimizer.state")["kind"], "blob");
    // From L3 the sizes are the compressed objects'.
    let from_l3 = s.run(&["show", "2", "--tier", "l3", "--json"]).json();
    assert_eq!(from_l3["tier"], "L3");
    let w0 = from_l3["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "layer.0.w")
        .unwrap()
        .clone();
    assert!(w0["codec_ratio"].as_f64().unwrap() > 1.2, "{w0}");
    let table = s.run(&["show", "2"]);
    assert!(table.stdout.contains("layer.1.w"), "{}", table.stdout);
    assert!(table.stdout.contains("changed"), "{}", table.stdout);

    let diff = s.run(&["diff", "1", "3", "--json"]).json();
    assert_eq!(diff["added"], 1);
    assert_eq!(diff["removed"], 1);
    assert_eq!(diff["changed"], 1);
    assert_eq!(diff["unchanged"], 3);
    let names: Vec<(&str, &str)> = diff["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["change"].as_str().unwrap()))
        .collect();
    assert!(names.contains(&("extra.bias", "added")), "{names:?}");
    assert!(names.contains(&("old.scale", "removed")), "{names:?}");
    assert!(names.contains(&("layer.1.w", "changed")), "{names:?}");
    assert_eq!(diff["bytes_differ"].as_u64().unwrap(), (2 << 20) + 8192);
    let same = s.run(&["diff", "2", "2", "--json"]).json();
    assert_eq!(same["changed"], 0);
    assert_eq!(same["bytes_differ"], 0);

    let stat = s.run(&["stat", "--json"]).json();
    let tiers = stat["tiers"].as_array().unwrap();
    assert_eq!(tiers.len(), 2);
    for t in tiers {
        assert_eq!(t["steps"], 3, "{t}");
        // 15.75 MB of steps in 9.45 MB of distinct chunks.
        assert!(t["dedup_ratio"].as_f64().unwrap() > 1.6, "{t}");
    }
    let l3 = tiers.iter().find(|t| t["tier"] == "L3").unwrap();
    assert!(l3["compression_ratio"].as_f64().unwrap() > 1.2, "{l3}");
    let l1 = tiers.iter().find(|t| t["tier"] == "L1").unwrap();
    assert!(
        (l1["compression_ratio"].as_f64().unwrap() - 1.0).abs() < 0.01,
        "{l1}"
    );
    assert!(s.run(&["stat"]).stdout.contains("DEDUP"));
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("x.safetensors");
    assert_eq!(
        s.run(&["export", "3", "-o", file.to_str().unwrap()]).code,
        0
    );
    assert_eq!(s.run(&["verify", "--all"]).code, 0);

    assert!(
        before == (snapshot(&s.l1), snapshot(&s.l3)),
        "a read-only command wrote"
    );
}

#[test]
fn verify_names_damage_and_where_a_good_copy_is_and_repair_fixes_it() {
    let s = Store::new();
    let clean = s.run(&["verify", "--all"]);
    assert_eq!(clean.code, 0, "{}\n{}", clean.stdout, clean.stderr);
    assert!(clean.stdout.contains("0 damaged"), "{}", clean.stdout);

    // Damage one L1 chunk of layer.1.w in step 2 and drop one L3 object.
    let (l1_file, l1_hex) = s.l1_chunk(2, 3);
    let mut bytes = std::fs::read(&l1_file).unwrap();
    bytes[100] ^= 0x5a;
    std::fs::write(&l1_file, &bytes).unwrap();
    let (_, l3_hex) = s.l1_chunk(1, 0);
    std::fs::remove_file(s.l3_chunk(&l3_hex)).unwrap();
    let before = (snapshot(&s.l1), snapshot(&s.l3));

    let found = s.run(&["verify", "--all", "--json"]);
    assert_eq!(found.code, 1, "{}\n{}", found.stdout, found.stderr);
    assert!(
        found.stderr.starts_with("strata: error: damage found"),
        "{}",
        found.stderr
    );
    assert_eq!(found.stderr.lines().count(), 1, "{}", found.stderr);
    let r = found.json();
    let problems = r["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 2, "{r}");
    let damaged = problems.iter().find(|p| p["state"] == "damaged").unwrap();
    assert_eq!(damaged["tier"], "L1");
    assert_eq!(damaged["id"], l1_hex.as_str());
    assert_eq!(damaged["good_copies"], serde_json::json!(["L3"]));
    let users: Vec<&str> = damaged["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["entry"].as_str().unwrap())
        .collect();
    assert!(users.contains(&"layer.1.w"), "{users:?}");
    let missing = problems.iter().find(|p| p["state"] == "missing").unwrap();
    assert_eq!(missing["tier"], "L3");
    assert_eq!(missing["id"], l3_hex.as_str());
    assert_eq!(missing["good_copies"], serde_json::json!(["L1"]));
    assert!(
        before == (snapshot(&s.l1), snapshot(&s.l3)),
        "verify without --repair wrote"
    );

    // One tier only.
    let l3_only = s.run(&["verify", "1", "--tier", "l3", "--json"]).json();
    assert_eq!(l3_only["tiers"], serde_json::json!(["L3"]));
    assert_eq!(l3_only["problems"].as_array().unwrap().len(), 1);

    let human = s.run(&["verify", "--all"]);
    assert!(human.stdout.contains("DAMAGED"), "{}", human.stdout);
    assert!(human.stdout.contains("good copy in L3"), "{}", human.stdout);
    assert!(human.stdout.contains("layer.1.w"), "{}", human.stdout);

    let repaired = s.run(&["verify", "--all", "--repair"]);
    assert_eq!(repaired.code, 5, "{}\n{}", repaired.stdout, repaired.stderr);
    assert_eq!(
        repaired.stdout.matches("REPAIRED").count(),
        2,
        "{}",
        repaired.stdout
    );
    let after = s.run(&["verify", "--all"]);
    assert_eq!(after.code, 0, "{}\n{}", after.stdout, after.stderr);
    assert_eq!(std::fs::read(&l1_file).unwrap().len(), bytes.len());
}

#[test]
fn a_damaged_commit_record_is_named_and_repaired_from_another_tier() {
    let s = Store::new();
    let file =
        s.l1.join(JOB)
            .join("steps")
            .join(format!("{:020}", 3))
            .join("c-0");
    assert!(file.is_file(), "no record at {}", file.display());
    let good = std::fs::read(&file).unwrap();
    let mut bytes = good.clone();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    // L1 no longer counts step 3 as committed; L3 still does.
    let v = s.run(&["verify", "3", "--json"]);
    assert_eq!(v.code, 1, "{}\n{}", v.stdout, v.stderr);
    let r = v.json();
    let p = r["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["object"] == "commit record")
        .unwrap_or_else(|| panic!("no record problem in {r}"));
    assert_eq!(p["tier"], "L1");
    assert_eq!(p["id"], "3/0");
    assert_eq!(p["good_copies"], serde_json::json!(["L3"]));
    let human = s.run(&["verify", "3"]);
    assert_eq!(human.code, 1);
    assert!(human.stdout.contains("commit record"), "{}", human.stdout);
    // Read-only: still damaged.
    assert_eq!(std::fs::read(&file).unwrap(), bytes);
    let fixed = s.run(&["verify", "3", "--repair"]);
    assert_eq!(fixed.code, 5, "{}\n{}", fixed.stdout, fixed.stderr);
    assert!(fixed.stdout.contains("REPAIRED"), "{}", fixed.stdout);
    assert_eq!(std::fs::read(&file).unwrap(), good);
    assert_eq!(s.run(&["verify", "--all"]).code, 0);
}

#[test]
fn a_damaged_manifest_is_named_and_repaired_and_other_tiers_still_serve() {
    let s = Store::new();
    let m = s.l1.join(JOB).join("steps");
    let file = find(&m, "m-0").map(|_| ()).and_then(|()| {
        // The manifest of step 3 (the newest step's directory).
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&m)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        dirs.sort();
        dirs.last().map(|d| d.join("m-0"))
    });
    let file = file.expect("an L1 manifest");
    let mut bytes = std::fs::read(&file).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    // `show` falls back to L3's good manifest.
    let show = s.run(&["show", "3", "--json"]).json();
    assert_eq!(show["tier"], "L3");
    let v = s.run(&["verify", "3", "--tier", "l1", "--json"]);
    assert_eq!(v.code, 1, "{}", v.stderr);
    let r = v.json();
    assert_eq!(r["problems"][0]["object"], "manifest");
    assert_eq!(r["problems"][0]["good_copies"], serde_json::json!(["L3"]));
    // The chunks were still checked, from the good manifest.
    assert!(r["chunks_verified"].as_u64().unwrap() > 0);
    let fixed = s.run(&["verify", "3", "--tier", "l1", "--repair"]);
    assert_eq!(fixed.code, 5, "{}\n{}", fixed.stdout, fixed.stderr);
    assert_eq!(s.run(&["verify", "3"]).code, 0);
    assert_eq!(s.run(&["show", "3", "--json"]).json()["tier"], "L1");
}

#[test]
fn bad_input_gets_one_line_and_a_documented_exit_code() {
    let s = Store::new();
    let nostep = s.run(&["show", "99"]);
    assert_eq!(nostep.code, 4, "{}", nostep.stderr);
    assert_eq!(nostep.stderr.lines().count(), 1, "{}", nostep.stderr);
    assert!(nostep.stderr.contains("step 99"), "{}", nostep.stderr);
    assert_eq!(s.run(&["diff", "1", "42"]).code, 4);
    assert_eq!(
        s.run(&["export", "7", "-o", "/tmp/never.safetensors"]).code,
        4
    );

    let flag = run(&["ls".into(), "--bogus".into()]);
    assert_eq!(flag.code, 2, "{}", flag.stderr);
    assert_eq!(flag.stderr.lines().count(), 1, "{}", flag.stderr);
    assert!(
        flag.stderr.starts_with("strata: error:") && flag.stderr.contains("--bogus"),
        "{}",
        flag.stderr
    );
    let nol1 = run(&[
        "ls".into(),
        "--job".into(),
        JOB.into(),
        "--l1".into(),
        "/nonexistent/strata".into(),
    ]);
    assert_eq!(nol1.code, 2, "{}", nol1.stderr);
    assert!(
        nol1.stderr.contains("/nonexistent/strata"),
        "{}",
        nol1.stderr
    );
    assert_eq!(nol1.stderr.lines().count(), 1, "{}", nol1.stderr);
    let badjob = s.run(&["ls", "--job", "../x"]);
    assert_ne!(badjob.code, 0);
    let dead_l3 = run(&[
        "ls".into(),
        "--job".into(),
        JOB.into(),
        "--l1".into(),
        "/nonexistent".into(),
        "--l3".into(),
        "bogus://x".into(),
    ]);
    assert_ne!(dead_l3.code, 0, "{}", dead_l3.stdout);
    assert_eq!(dead_l3.stderr.lines().count(), 1, "{}", dead_l3.stderr);

    // Garbage where a safetensors file should be.
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.safetensors");
    std::fs::write(&junk, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot json").unwrap();
    let imp = s.run(&["import", junk.to_str().unwrap(), "--step", "9"]);
    assert_eq!(imp.code, 3, "{}", imp.stderr);
    assert_eq!(imp.stderr.lines().count(), 1, "{}", imp.stderr);
    let empty = dir.path().join("empty.safetensors");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(
        s.run(&["import", empty.to_str().unwrap(), "--step", "9"])
            .code,
        3
    );
    // A file whose blob list names a tensor twice, or one it lacks.
    for blobs in [r#"[\"x\",\"x\"]"#, r#"[\"y\"]"#] {
        let header = format!(
            r#"{{"__metadata__":{{"strata.blobs":"{blobs}"}},"x":{{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}}}"#
        );
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        file.extend_from_slice(&[1, 2, 3, 4]);
        let lying = dir.path().join("lying.safetensors");
        std::fs::write(&lying, &file).unwrap();
        let imp = s.run(&["import", lying.to_str().unwrap(), "--step", "9"]);
        assert_eq!(imp.code, 3, "{blobs}: {}", imp.stderr);
        assert_eq!(imp.stderr.lines().count(), 1, "{}", imp.stderr);
        assert!(imp.stderr.contains("strata.blobs"), "{}", imp.stderr);
    }
    // Nothing was imported.
    let ls = s.run(&["ls"]);
    assert_eq!(ls.code, 0, "{}", ls.stderr);
    assert!(!ls.stdout.contains(" 9 "));
}

#[test]
fn export_then_import_then_export_gives_the_same_file() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.safetensors");
    let out = s.run(&["export", "3", "-o", a.to_str().unwrap(), "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json()["tensors"], 4);
    assert_eq!(out.json()["blobs"], 1);

    // Readable by the safetensors crate, with the saved bytes.
    let bytes = std::fs::read(&a).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let w1 = st.tensor("layer.1.w").unwrap();
    assert_eq!(w1.dtype(), safetensors::Dtype::BF16);
    assert_eq!(w1.shape(), &[1024, 1024]);
    assert_eq!(w1.data(), tensor(23, 2 << 20).as_slice());
    assert_eq!(
        st.tensor("optimizer.state").unwrap().data(),
        tensor(6, 1000).as_slice()
    );
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    assert_eq!(meta.get("arch").map(String::as_str), Some("tiny"));

    // Into another job's L1, then out again: the same file.
    let l1b = dir.path().join("l1b");
    let imp = run(&[
        "import".into(),
        a.display().to_string(),
        "--step".into(),
        "7".into(),
        "--job".into(),
        "imported".into(),
        "--l1".into(),
        l1b.display().to_string(),
    ]);
    assert_eq!(imp.code, 0, "{}", imp.stderr);
    assert!(
        imp.stdout.contains("imported 4 tensors and 1 blobs"),
        "{}",
        imp.stdout
    );
    let b = dir.path().join("b.safetensors");
    let again = run(&[
        "export".into(),
        "7".into(),
        "-o".into(),
        b.display().to_string(),
        "--job".into(),
        "imported".into(),
        "--l1".into(),
        l1b.display().to_string(),
    ]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(
        std::fs::read(&b).unwrap() == bytes,
        "export, import, export differ"
    );
    let shown = run(&[
        "show".into(),
        "7".into(),
        "--json".into(),
        "--job".into(),
        "imported".into(),
        "--l1".into(),
        l1b.display().to_string(),
    ])
    .json();
    let blob = shown["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "optimizer.state")
        .unwrap()
        .clone();
    assert_eq!(blob["kind"], "blob");
    assert!(shown["metadata"].get("strata.blobs").is_none());

    // A damaged L1 chunk is read from L3 instead; the export is the same.
    let (f, _) = s.l1_chunk(3, 0);
    let mut c = std::fs::read(&f).unwrap();
    c[0] ^= 1;
    std::fs::write(&f, &c).unwrap();
    let d = dir.path().join("d.safetensors");
    let out = s.run(&["export", "3", "-o", d.to_str().unwrap(), "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.json()["sources"]["L3"].as_u64().unwrap() > 0);
    assert!(std::fs::read(&d).unwrap() == bytes);
}

#[test]
fn a_shard_half_way_through_retirement_is_not_damage_and_is_never_recommitted() {
    let s = Store::new();
    // Retention crashed on L1 after its marker and the record went, before
    // the manifest: step 1 is committed on L3 only.
    let dir = s.l1.join(JOB).join("steps").join(format!("{:020}", 1));
    std::fs::write(dir.join("r-0"), b"").unwrap();
    std::fs::remove_file(dir.join("c-0")).unwrap();
    for repair in [false, true] {
        let mut cmd = vec!["verify", "1", "--json"];
        if repair {
            cmd.push("--repair");
        }
        let out = s.run(&cmd);
        assert_eq!(out.code, 0, "repair {repair}: {}{}", out.stdout, out.stderr);
        let j = out.json();
        assert_eq!(j["problems"].as_array().unwrap().len(), 0, "{j}");
        assert_eq!(j["retiring"][0], "step 1 rank 0 in L1", "{j}");
    }
    assert!(
        !dir.join("c-0").exists(),
        "--repair committed a step retention was removing"
    );
    let text = s.run(&["verify", "1"]);
    assert!(text.stdout.contains("RETIRING"), "{}", text.stdout);
}

#[test]
fn import_puts_the_step_on_the_l3_it_names_without_an_upload_policy() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.safetensors");
    let out = s.run(&["export", "2", "-o", a.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let (l1, l3) = (dir.path().join("l1"), dir.path().join("l3"));
    std::fs::create_dir_all(&l3).unwrap();
    // No upload_every anywhere: naming --l3 is enough.
    let imp = run(&[
        "import".into(),
        a.display().to_string(),
        "--step".into(),
        "5".into(),
        "--job".into(),
        "onl3".into(),
        "--l1".into(),
        l1.display().to_string(),
        "--l3".into(),
        format!("file://{}", l3.display()),
    ]);
    assert_eq!(imp.code, 0, "{}", imp.stderr);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = strata::tiered::L3Store::from_url(
        &format!("file://{}", l3.display()),
        &[],
        strata::tiered::L3Options::default(),
    )
    .unwrap();
    let steps = rt
        .block_on(strata::tiered::ChunkStore::list_steps(&store, "onl3"))
        .unwrap();
    assert!(
        steps.iter().any(|st| st.step == 5 && st.is_complete()),
        "{steps:?}"
    );
}

#[test]
fn import_never_replaces_a_step_and_readers_create_nothing() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.safetensors");
    assert_eq!(s.run(&["export", "1", "-o", a.to_str().unwrap()]).code, 0);
    let before = snapshot(&s.l1);
    let again = s.run(&["import", a.to_str().unwrap(), "--step", "2"]);
    assert_eq!(again.code, 2, "{}", again.stderr);
    assert!(
        again.stderr.contains("already has step 2"),
        "{}",
        again.stderr
    );
    assert!(before == snapshot(&s.l1), "a refused import wrote");
    assert_eq!(s.run(&["verify", "--all"]).code, 0);

    // A mistyped L3 directory is an error, and is not created.
    let typo = dir.path().join("no-such-l3");
    let ls = run(&[
        "ls".into(),
        "--job".into(),
        JOB.into(),
        "--l1".into(),
        s.l1.display().to_string(),
        "--l3".into(),
        format!("file://{}", typo.display()),
    ]);
    assert_ne!(ls.code, 0);
    assert!(!typo.exists(), "ls created the L3 directory");
    // A rank or tier that does not exist verifies nothing: not a pass.
    assert_eq!(s.run(&["verify", "--rank", "9"]).code, 4);
    assert_eq!(s.run(&["verify", "--tier", "node-z"]).code, 2);
}

#[test]
fn export_of_a_step_whose_chunks_repeat_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let l1 = dir.path().join("l1");
    let zeros = vec![0u8; 3 << 20];
    let (a, b) = (tensor(8, 2 << 20), tensor(9, (1 << 20) + 12345));
    let shape_z = [3u64 << 18];
    let shape_a = [2u64 << 20];
    let shape_b = [(1u64 << 20) + 12345];
    let names = ["z0", "a", "z1", "b", "z2"];
    {
        let ck = Checkpointer::new(Config::builder().job("rep").l1_dir(&l1).chunk_size(1 << 20))
            .unwrap();
        ck.save(
            1,
            &[
                Entry::tensor(names[0], DType::F32, &shape_z, &zeros),
                Entry::tensor(names[1], DType::U8, &shape_a, &a),
                Entry::tensor(names[2], DType::F32, &shape_z, &zeros),
                Entry::tensor(names[3], DType::U8, &shape_b, &b),
                Entry::tensor(names[4], DType::F32, &shape_z, &zeros),
            ],
        )
        .unwrap()
        .wait()
        .unwrap();
    }
    let f = dir.path().join("rep.safetensors");
    let out = run(&[
        "export".into(),
        "1".into(),
        "-o".into(),
        f.display().to_string(),
        "--job".into(),
        "rep".into(),
        "--l1".into(),
        l1.display().to_string(),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let bytes = std::fs::read(&f).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (n, want) in names.iter().zip([&zeros, &a, &zeros, &b, &zeros]) {
        assert!(st.tensor(n).unwrap().data() == want.as_slice(), "{n}");
    }
}

#[test]
fn a_two_rank_step_counts_both_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let l1 = dir.path().join("l1");
    let coord = std::sync::Arc::new(strata::InProcessCoordinator::new(2));
    std::thread::scope(|sc| {
        for rank in 0..2u32 {
            let (l1, coord) = (l1.clone(), coord.clone());
            sc.spawn(move || {
                let ck = Checkpointer::with_coordinator(
                    Config::builder()
                        .job("two")
                        .l1_dir(&l1)
                        .rank(rank, 2)
                        .chunk_size(1 << 20),
                    coord,
                )
                .unwrap();
                let w = tensor(u64::from(rank) + 40, 1 << 20);
                let shape = [1u64 << 20];
                ck.save(1, &[Entry::tensor("w", DType::U8, &shape, &w)])
                    .unwrap()
                    .wait()
                    .unwrap();
            });
        }
    });
    let args = |cmd: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = cmd.iter().map(|x| x.to_string()).collect();
        v.extend([
            "--job".into(),
            "two".into(),
            "--l1".into(),
            l1.display().to_string(),
        ]);
        v
    };
    let ls = run(&args(&["ls", "--json"])).json();
    assert_eq!(ls["steps"][0]["logical_bytes"], 2 << 20, "{ls}");
    assert_eq!(ls["steps"][0]["tiers"][0]["state"], "committed", "{ls}");
    assert_eq!(ls["steps"][0]["tiers"][0]["ranks"], 2, "{ls}");
    let stat = run(&args(&["stat", "--json"])).json();
    assert_eq!(stat["tiers"][0]["logical_bytes"], 2 << 20, "{stat}");
    let v = run(&args(&["verify", "--json"]));
    assert_eq!(v.code, 0, "{}", v.stderr);
    assert_eq!(v.json()["manifests_verified"], 2);
}

/// The store comes from `--config`, then `STRATA_*` variables, then flags:
/// each later source wins over the earlier ones.
#[test]
fn the_store_comes_from_config_then_env_then_flags() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("strata.toml");
    std::fs::write(
        &toml,
        format!("job = \"{JOB}\"\nl1_dir = \"{}\"\n", s.l1.display()),
    )
    .unwrap();
    let ls = |env: &[(&str, &str)], flags: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["ls", "--json", "--config"])
            .arg(&toml)
            .args(flags)
            .env_remove("STRATA_L1_DIR")
            .env_remove("STRATA_JOB")
            .env_remove("STRATA_L3_URL")
            .env_remove("STRATA_PEERS")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // The file alone: its job and L1.
    let (code, out, err) = ls(&[], &[]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["job"], JOB);
    assert_eq!(v["steps"].as_array().unwrap().len(), 3);
    // STRATA_JOB wins over the file: a job with no steps.
    let (code, out, err) = ls(&[("STRATA_JOB", "other-job")], &[]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["job"], "other-job");
    assert!(v["steps"].as_array().unwrap().is_empty());
    // --job wins over STRATA_JOB.
    let (code, out, err) = ls(&[("STRATA_JOB", "other-job")], &["--job", JOB]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["job"], JOB);
    assert_eq!(v["steps"].as_array().unwrap().len(), 3);
    // STRATA_L3_URL adds L3 to what the file names.
    let url = format!("file://{}", s.l3.display());
    let (code, out, err) = ls(&[("STRATA_L3_URL", url.as_str())], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"L3\""), "{out}");
    // A file that does not parse: one line, exit 2.
    std::fs::write(&toml, "job = [").unwrap();
    let (code, _, err) = ls(&[], &[]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
