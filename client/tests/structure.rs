//! The shape of the code, checked: the client's modules import each other
//! one way (no cycle: the API modules on top, the pipelines below them, the
//! shared state and the tier stack below those), and no Rust file of the
//! workspace grows past 800 lines.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most lines a source file may have.
const MAX_LINES: usize = 800;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `crate::<module>` names on the non-comment lines of `text`.
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue; // doc links are not imports
        }
        let mut rest = t;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// A cycle in `graph`, if there is one (as the path that closes it).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        u: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(u.to_string(), 1);
        path.push(u.to_string());
        for v in graph.get(u).into_iter().flatten() {
            match state.get(v.as_str()) {
                Some(1) => {
                    let at = path.iter().position(|p| p == v).unwrap_or(0);
                    let mut cycle = path[at..].to_vec();
                    cycle.push(v.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(v, graph, state, path) {
                        return Some(c);
                    }
                }
            }
        }
        path.pop();
        state.insert(u.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for u in graph.keys() {
        if !state.contains_key(u.as_str()) {
            if let Some(c) = visit(u, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// Every `.rs` file under `dir`, nested folders included.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().and_then(|x| x.to_str()) == Some("rs") {
            out.push(p);
        }
    }
    out
}

#[test]
fn the_client_modules_import_each_other_one_way() {
    let src = workspace().join("client/src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let mut p = e.unwrap().path();
        // A module in a directory (`coord/mod.rs`) counts as one module,
        // with its child modules' references (nested folders included).
        let mut text = String::new();
        if p.is_dir() {
            for f in rust_files(&p) {
                text.push_str(&std::fs::read_to_string(f).unwrap());
            }
            p.set_extension("rs");
        } else if p.extension().and_then(|x| x.to_str()) == Some("rs") {
            text = std::fs::read_to_string(&p).unwrap();
        } else {
            continue;
        }
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if name == "lib" {
            continue; // declares the modules and re-exports them
        }
        graph.insert(name, crate_refs(&text));
    }
    assert!(graph.len() > 20, "modules found: {:?}", graph.keys());
    let names: BTreeSet<String> = graph.keys().cloned().collect();
    for (m, deps) in graph.iter_mut() {
        deps.retain(|d| names.contains(d) && d != m);
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "client modules import each other in a circle: {}",
            cycle.join(" -> ")
        );
    }
    // The pipelines stay below the API: none of them names the checkpointer
    // or its builder except through `impl Checkpointer` blocks of the API.
    for low in ["shared", "save", "mirror", "tiers"] {
        let deps = &graph[low];
        assert!(
            !deps.contains("checkpointer") && !deps.contains("builder"),
            "{low} imports {deps:?}"
        );
    }
    // The tiers (the stack, the catalog, the reader, the copy) sit below
    // every pipeline: they import only the crate's errors and settings, so
    // restore, the CLI and the Python package can all stand on them.
    let tiers = &graph["tiers"];
    assert!(
        tiers.iter().all(|d| d == "error" || d == "config"),
        "tiers imports {tiers:?}"
    );
    // How ranks agree (the coordinators and the commit protocol) knows
    // nothing of the pipelines or the tiers either.
    let coord = &graph["coord"];
    assert!(
        coord.iter().all(|d| d == "error" || d == "config"),
        "coord imports {coord:?}"
    );
    // Nothing outside the tiers picks a manifest, and only the shared
    // state lists the stack (`Shared::catalog`, for restore and the
    // refusal of a committed step).
    for p in rust_files(&src) {
        if p.starts_with(src.join("tiers")) {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let name = p.strip_prefix(&src).unwrap().display().to_string();
        assert!(
            !text.contains("load_shard("),
            "{name} loads a manifest itself"
        );
        assert!(
            name == "shared.rs" || !text.contains("Catalog::list("),
            "{name} lists the tiers itself (use Shared::catalog)"
        );
        // The R-copy policy is the peer group's: nothing in the client
        // walks the ring choosing replicas, nor replaces a failed one.
        assert!(
            !text.contains(".spread(") || name == "mirror/to_peers.rs",
            "{name} pushes over the peer group outside replication"
        );
        assert!(
            !text.contains("take(wanted") && !text.contains("take(s.cfg.replicas"),
            "{name} chooses replicas itself (use PeerGroup::targets or spread)"
        );
    }
    // The save path calls the mirror (offers batches to the eager push,
    // asks what L1 must keep), never the other way, and never reads the
    // copiers' states itself.
    assert!(
        !graph["mirror"].contains("save"),
        "mirror imports {:?}",
        graph["mirror"]
    );
    for p in rust_files(&src.join("save")) {
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            !text.contains(".uploads") && !text.contains(".replication"),
            "{} reads the copiers' states (use mirror::held_on_l1)",
            p.display()
        );
    }
    // Only opening the stack orders the peers (the ring).
    for p in rust_files(&src) {
        let text = std::fs::read_to_string(&p).unwrap();
        let name = p.strip_prefix(&src).unwrap().display().to_string();
        assert!(
            name == "tiers/open.rs" || !text.contains("ring::placement("),
            "{name} computes the ring itself"
        );
    }
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
    assert_eq!(
        crate_refs("use crate::x::Y;\n/// [`crate::z`]\nlet a = crate::w::f();"),
        ["w", "x"].into_iter().map(String::from).collect()
    );
}

#[test]
fn no_source_file_passes_800_lines() {
    let root = workspace();
    let mut long = Vec::new();
    let mut seen = 0;
    let mut dirs = vec![root.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "corpus") {
                    dirs.push(p);
                }
            } else if name.ends_with(".rs") {
                seen += 1;
                let n = std::fs::read_to_string(&p).unwrap().lines().count();
                if n > MAX_LINES {
                    long.push(format!("{} ({n} lines)", p.display()));
                }
            }
        }
    }
    assert!(
        seen > 50,
        "found only {seen} Rust files under {}",
        root.display()
    );
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:?}");
}
