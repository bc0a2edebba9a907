//! How the coordinator's etcd client proves itself: TLS (a CA, a client
//! certificate) and etcd's own users, whose password never goes over a
//! plain connection unless the operator says so.

use crate::error::{Error, Result};

/// TLS and authentication of the connection.
#[derive(Clone, Default)]
pub(crate) struct Security {
    /// PEM of the CA that signed the servers' certificates.
    pub(crate) ca_pem: Option<Vec<u8>>,
    /// PEM of the client certificate and its key (mutual TLS).
    pub(crate) identity_pem: Option<Vec<u8>>,
    /// User name and password (etcd's own authentication).
    pub(crate) user: Option<(String, String)>,
    /// Send the user and password over plain `http://` endpoints too
    /// (`etcd_allow_plaintext_auth`); refused otherwise.
    pub(crate) allow_plaintext_auth: bool,
}

/// The private key and the password are never shown.
impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = |set: bool| set.then_some(crate::REDACTED);
        f.debug_struct("Security")
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .field("identity_pem", &secret(self.identity_pem.is_some()))
            .field(
                "user",
                &self.user.as_ref().map(|(name, _)| (name, crate::REDACTED)),
            )
            .field("allow_plaintext_auth", &self.allow_plaintext_auth)
            .finish()
    }
}

/// Refuses to send a user and password where an endpoint is not
/// `https://` (anyone on the path reads them, and etcd's token after
/// them), unless the operator allowed it; a warning then says so.
pub(crate) fn check_auth_transport(endpoints: &[String], sec: &Security) -> Result<()> {
    let Some((name, _)) = &sec.user else {
        return Ok(());
    };
    let plain: Vec<String> = endpoints
        .iter()
        .filter(|e| {
            !e.get(..8)
                .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
        })
        .map(|e| strata_tiered::redact_url(e))
        .collect();
    if plain.is_empty() {
        return Ok(());
    }
    if sec.allow_plaintext_auth {
        tracing::warn!(
            user = %name,
            endpoints = ?plain,
            "etcd: the user's password goes over plain HTTP (etcd_allow_plaintext_auth = true)"
        );
        return Ok(());
    }
    Err(Error::Config(format!(
        "etcd: user {name:?} would send its password in clear to {}: use https:// endpoints \
         (with etcd_ca), or set etcd_allow_plaintext_auth = true \
         (STRATA_ETCD_ALLOW_PLAINTEXT_AUTH=1) on a network you trust",
        plain.join(", ")
    )))
}
