//! A [`Config`] from the Python side: a TOML file, then the environment
//! (the launcher's `RANK`/`WORLD_SIZE`/... and `STRATA_*`), then the
//! keyword arguments, each winning over the one before. The settings are
//! those of the Rust `Config`, checked by it (an unknown key is an error).

use std::path::Path;

use pyo3::prelude::*;
use strata::{Config, Error, Result};

use crate::errors::IntoPy;

/// The environment, skipping variables that are not UTF-8 (never ours).
fn env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// Resolves the configuration: `path` (TOML), the environment, then
/// `settings` (a JSON object of keyword arguments).
pub(crate) fn build(settings: &str, path: Option<&str>) -> Result<Config> {
    let base = match path {
        Some(p) => Config::from_file(Path::new(p))?,
        None => Config::default(),
    };
    let cfg = base.with_env(env())?;
    let mut value =
        serde_json::to_value(&cfg).map_err(|e| Error::Config(format!("configuration: {e}")))?;
    let over: serde_json::Value = serde_json::from_str(settings)
        .map_err(|e| Error::Config(format!("keyword arguments: {e}")))?;
    let (Some(into), serde_json::Value::Object(over)) = (value.as_object_mut(), over) else {
        return Err(Error::Config("keyword arguments must be a mapping".into()));
    };
    for (k, v) in over {
        into.insert(k, v);
    }
    let cfg: Config = serde_json::from_value(value)
        .map_err(|e| Error::Config(format!("keyword arguments: {e}")))?;
    // `peers=["slurm:PORT"]` given as a keyword: expanded from the
    // allocation as the environment's own would have been.
    let cfg = cfg.with_slurm_peers(env())?;
    cfg.validate()?;
    Ok(cfg)
}

/// The resolved configuration as JSON (what `Checkpointer(...)` would
/// use, secrets redacted): for `strata.resolve_config` and the tests.
#[pyfunction]
#[pyo3(signature = (settings, path=None))]
pub(crate) fn resolve_config(
    py: Python<'_>,
    settings: &str,
    path: Option<&str>,
) -> PyResult<String> {
    let settings = settings.to_string();
    let path = path.map(str::to_string);
    let cfg = py
        .detach(move || build(&settings, path.as_deref()))
        .py_err()?;
    // Secrets (`l3_options` keys, tokens) are shown as `<redacted>`.
    Ok(cfg.redacted().to_string())
}
