//! Secrets in the configuration (`l3_options` keys, tokens, passwords,
//! credentials inside `l3_url` or an etcd endpoint, the etcd password) are
//! never printed: [`Config`]'s `Debug`, [`EtcdOptions`]' `Debug`, the logs,
//! the CLI and Python's `Checkpointer.config` show `<redacted>` in their
//! place. URLs keep everything but their credentials
//! ([`strata_tiered::redact_url`]: a userinfo password, query values such
//! as an Azure SAS).

use strata_tiered::redact_url;

use crate::config::Config;
use crate::coord::etcd::EtcdOptions;

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

pub use strata_tiered::REDACTED;

impl Config {
    /// The configuration as JSON with every secret replaced by
    /// `<redacted>`: secret `l3_options` values, and the credentials inside
    /// `l3_url`, the etcd endpoints and URL-valued options (see
    /// [`strata_tiered::redact_url`]). What `Debug`, logs and the Python
    /// `Checkpointer.config` show.
    pub fn redacted(&self) -> serde_json::Value {
        use serde_json::Value;
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        let url = |val: &mut Value| {
            if let Value::String(s) = val {
                *s = redact_url(s);
            }
        };
        if let Some(Value::Object(opts)) = v.get_mut("l3_options") {
            for (k, val) in opts.iter_mut() {
                if is_secret_option(k) {
                    *val = Value::String(REDACTED.into());
                } else {
                    url(val);
                }
            }
        }
        if let Some(val) = v.get_mut("l3_url") {
            url(val);
        }
        if let Some(Value::Array(eps)) = v.get_mut("etcd_endpoints") {
            eps.iter_mut().for_each(url);
        }
        v
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Config {}", self.redacted())
    }
}

/// The user is shown, the password never; endpoints without credentials.
impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let endpoints: Vec<String> = self.endpoints.iter().map(|e| redact_url(e)).collect();
        f.debug_struct("EtcdOptions")
            .field("endpoints", &endpoints)
            .field("prefix", &self.prefix)
            .field("lease_ttl", &self.lease_ttl)
            .field("request_timeout", &self.request_timeout)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field(
                "user",
                &self.user.as_ref().map(|(name, _)| (name, REDACTED)),
            )
            .field("allow_plaintext_auth", &self.allow_plaintext_auth)
            .field("incarnation", &self.incarnation)
            .finish()
    }
}
