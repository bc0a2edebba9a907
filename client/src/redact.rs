//! Secrets in the configuration (`l3_options` keys, tokens, passwords)
//! are never printed: [`Config`]'s `Debug`, the logs and Python's
//! `Checkpointer.config` show `<redacted>` in their place.

use crate::config::Config;

/// True if an `l3_options` key holds a secret (a key, a token, a
/// password, a SAS, a credential): its value is never printed.
pub fn is_secret_option(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "secret",
        "token",
        "password",
        "key",
        "sas",
        "credential",
        "signature",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// What stands for a secret in printed output.
pub const REDACTED: &str = "<redacted>";

impl Config {
    /// The configuration as JSON with every secret `l3_options` value
    /// replaced by `<redacted>`: what `Debug`, logs and the Python
    /// `Checkpointer.config` show.
    pub fn redacted(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(serde_json::Value::Object(opts)) = v.get_mut("l3_options") {
            for (k, val) in opts.iter_mut() {
                if is_secret_option(k) {
                    *val = serde_json::Value::String(REDACTED.into());
                }
            }
        }
        v
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Config {}", self.redacted())
    }
}
