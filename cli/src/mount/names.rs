//! Entry names as path components: a documented, reversible escape
//! (docs/mount.md, "Names").
//!
//! A manifest's entry name may hold anything a `String` can, including
//! `/`, `..` and control bytes; a path component may not. The escape is
//! percent-encoding of exactly what a component cannot hold or would make
//! ambiguous: `%` itself, `/`, control bytes (below 0x20, and 0x7f), and a
//! whole name of `.` or `..` (as `%2E`, `%2E%2E`). Everything else, UTF-8
//! included, stays as it is, so `model.layers.0.weight` is its own file
//! name. Escaped names longer than [`MAX_COMPONENT`] bytes keep their
//! first bytes and end in `%~` and 16 hex digits of the name's BLAKE3
//! hash (no escape produces `%~`, so such a name is never another's);
//! `manifest.json` gives every entry's full name beside its file name.

/// The longest path component Linux file systems accept.
pub(crate) const MAX_COMPONENT: usize = 255;

/// `name` as one path component.
pub(crate) fn escape(name: &str) -> String {
    match name {
        "." => return "%2E".into(),
        ".." => return "%2E%2E".into(),
        // An empty name cannot be a component either (entry names are
        // never empty, but the escape stays total): a lone `%`, which no
        // other name escapes to.
        "" => return "%".into(),
        _ => {}
    }
    let mut out = String::with_capacity(name.len());
    for ch in name.chars() {
        let c = ch as u32;
        if ch == '%' || ch == '/' || c < 0x20 || c == 0x7f {
            out.push_str(&format!("%{c:02X}"));
        } else {
            out.push(ch);
        }
    }
    if out.len() <= MAX_COMPONENT {
        return out;
    }
    let hash = blake3::hash(name.as_bytes()).to_hex();
    let keep = MAX_COMPONENT - 2 - 16;
    let mut cut = keep;
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    // Never cut inside an escape (`%XX`): the shortened name stays a
    // prefix of valid escapes.
    if let Some(p) = out[..cut].rfind('%') {
        if cut - p < 3 {
            cut = p;
        }
    }
    format!("{}%~{}", &out[..cut], &hash[..16])
}

/// The name an escaped component stands for; None for a shortened name
/// (look it up in `manifest.json`) or one no escape produces. (The mount
/// looks names up by their escape; this is the escape's proof of being
/// reversible, and the reference for docs/mount.md.)
#[cfg(test)]
pub(crate) fn unescape(component: &str) -> Option<String> {
    if component == "%" {
        return Some(String::new());
    }
    let bytes = component.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = component.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let name = String::from_utf8(out).ok()?;
    (escape(&name) == component).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_a_component_cannot_hold_and_reverses() {
        for (name, want) in [
            ("model.layers.0.weight", "model.layers.0.weight"),
            ("a/b", "a%2Fb"),
            ("..", "%2E%2E"),
            (".", "%2E"),
            ("50%", "50%25"),
            ("tab\there", "tab%09here"),
            ("del\u{7f}", "del%7F"),
            ("héllo/π", "héllo%2Fπ"),
            ("..a", "..a"),
            ("", "%"),
        ] {
            assert_eq!(escape(name), want, "{name:?}");
            assert_eq!(unescape(want).as_deref(), Some(name), "{want:?}");
            assert!(!want.contains('/') && want != "." && want != "..");
        }
        // Not an escape's output: refused rather than mapped to a name.
        assert_eq!(unescape("%2F%"), None);
        assert_eq!(unescape("%zz"), None);
        assert_eq!(unescape("%2e"), None);
    }

    #[test]
    fn long_names_are_bounded_and_distinct() {
        let a = "x".repeat(300);
        let b = format!("{}y", "x".repeat(299));
        let (ea, eb) = (escape(&a), escape(&b));
        assert!(ea.len() <= MAX_COMPONENT && eb.len() <= MAX_COMPONENT);
        assert_ne!(ea, eb);
        assert!(ea.contains("%~"));
        assert_eq!(unescape(&ea), None);
        // Multi-byte characters and escapes at the cut stay whole.
        let c = format!("{}{}", "é".repeat(120), "/".repeat(40));
        let ec = escape(&c);
        assert!(ec.len() <= MAX_COMPONENT, "{}", ec.len());
        let head = ec.split("%~").next().unwrap();
        assert!(head.ends_with("%2F") || head.ends_with('é'));
    }
}
