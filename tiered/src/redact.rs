//! Credentials carried inside a store's URL never reach a log, an error
//! or a report: the password of its userinfo
//! (`https://user:pass@host/...`) and the values of its query string
//! (an Azure SAS `?sv=...&sig=...`, a presigned S3 or GCS signature) are
//! replaced by [`REDACTED`] wherever a URL is printed.
//!
//! The parsing is by hand, not `url::Url`: a URL too broken to parse may
//! still hold a secret, and its error message must not show it either.

/// What stands for a secret in printed output.
pub const REDACTED: &str = "<redacted>";

/// Shortest query value scrubbed from free text by [`scrub_url_secrets`]:
/// shorter ones (`sp=r`, `sv=2022`) are not secrets, and replacing them
/// everywhere would garble the message.
const MIN_SCRUBBED: usize = 8;

/// The parts of a URL that may hold credentials, as byte ranges.
struct Secrets {
    /// The password of the userinfo (after `user:`).
    password: Option<std::ops::Range<usize>>,
    /// Each query parameter's value.
    values: Vec<std::ops::Range<usize>>,
}

fn find_secrets(url: &str) -> Secrets {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[after_scheme..];
    // The authority ends at the first '/', '?' or '#'.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let password = authority.rfind('@').and_then(|at| {
        let userinfo = &authority[..at];
        userinfo
            .find(':')
            .map(|colon| after_scheme + colon + 1..after_scheme + at)
    });
    let mut values = Vec::new();
    if let Some(q) = url.find('?') {
        let end = url[q..].find('#').map_or(url.len(), |h| q + h);
        let mut start = q + 1;
        for pair in url[q + 1..end].split('&') {
            if let Some(eq) = pair.find('=') {
                let v = start + eq + 1..start + pair.len();
                if !v.is_empty() {
                    values.push(v);
                }
            }
            start += pair.len() + 1;
        }
    }
    Secrets { password, values }
}

/// `url` with the password of its userinfo and every query value replaced
/// by [`REDACTED`]; the rest (scheme, user, host, path, parameter names)
/// stays, so a printed URL still says where the store is. A string that
/// holds no such parts comes back unchanged.
pub fn redact_url(url: &str) -> String {
    let s = find_secrets(url);
    let mut ranges: Vec<std::ops::Range<usize>> = s.password.into_iter().chain(s.values).collect();
    ranges.sort_by_key(|r| r.start);
    let mut out = String::with_capacity(url.len());
    let mut at = 0;
    for r in ranges {
        out.push_str(&url[at..r.start]);
        out.push_str(REDACTED);
        at = r.end;
    }
    out.push_str(&url[at..]);
    out
}

/// `text` (an error message, a log line) with `url` and the secrets in it
/// replaced: the URL as written by its redacted form, then its password
/// and its longer query values wherever else they appear (a library may
/// quote them percent-decoded or on their own).
pub fn scrub_url_secrets(text: &str, url: &str) -> String {
    let mut out = text.replace(url, &redact_url(url));
    let s = find_secrets(url);
    let secrets = s
        .password
        .into_iter()
        .map(|r| (r, 1))
        .chain(s.values.into_iter().map(|r| (r, MIN_SCRUBBED)));
    for (r, min) in secrets {
        let raw = &url[r];
        for form in [raw.to_string(), percent_decode(raw, true)] {
            if form.len() >= min && form != REDACTED {
                out = out.replace(&form, REDACTED);
            }
        }
    }
    out
}

/// `s` with `%XX` escapes decoded, and `+` as a space where `form` (a
/// URL's query); invalid escapes and non-UTF-8 results left as they are.
pub fn percent_decode(s: &str, form: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(if form && b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_passwords_and_query_values_are_redacted() {
        assert_eq!(
            redact_url("https://alice:pa55w0rd@host.example:9000/b/p?sig=abc%2Bdef&se=2030-01-01"),
            "https://alice:<redacted>@host.example:9000/b/p?sig=<redacted>&se=<redacted>"
        );
        assert_eq!(redact_url("s3://bucket/prefix"), "s3://bucket/prefix");
        assert_eq!(
            redact_url("abfss://container@account.dfs.core.windows.net/x"),
            "abfss://container@account.dfs.core.windows.net/x",
            "a userinfo without a password (Azure's container) is no secret"
        );
        assert_eq!(
            redact_url("az://c/p?flag&k=v#frag"),
            "az://c/p?flag&k=<redacted>#frag"
        );
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(redact_url("user:pw@host"), "user:<redacted>@host");
        assert_eq!(
            redact_url("http://u:p@h/path@x:y"),
            "http://u:<redacted>@h/path@x:y",
            "an '@' in the path is not userinfo"
        );
    }

    #[test]
    fn scrubbing_removes_the_secrets_however_quoted() {
        let url = "https://alice:pa55w0rd@h/b?sig=abc%2Bdefghij&sp=r";
        let text =
            format!("cannot open {url:?}: bad password pa55w0rd, signature abc+defghij, sp r");
        let clean = scrub_url_secrets(&text, url);
        assert!(!clean.contains("pa55w0rd"), "{clean}");
        assert!(
            !clean.contains("abc+defghij") && !clean.contains("abc%2Bdefghij"),
            "{clean}"
        );
        assert!(
            clean.contains("sp r"),
            "short values are left in free text: {clean}"
        );
    }
}
