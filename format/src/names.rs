//! Rules for names that come from users and end up in keys and paths.
//!
//! A job id becomes a directory and an object-key prefix in every tier, so it
//! is restricted to a safe alphabet. Entry names are free UTF-8 (they are
//! tensor names like `model.layers.0.attn.q_proj.weight`); layers that turn
//! them into paths (FUSE) escape them there.

use crate::error::{FormatError, Result};

/// Longest job id.
pub const MAX_JOB_ID_LEN: usize = 128;
/// Longest entry name, in bytes.
pub const MAX_ENTRY_NAME_LEN: usize = 4096;
/// Longest metadata key, in bytes.
pub const MAX_META_KEY_LEN: usize = 4096;
/// Longest metadata value, in bytes.
pub const MAX_META_VALUE_LEN: usize = 16 << 20;

/// Checks a job id: 1 to 128 characters of `[A-Za-z0-9._-]`, not starting
/// with a dot.
pub fn validate_job_id(job: &str) -> Result<()> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if job.is_empty()
        || job.len() > MAX_JOB_ID_LEN
        || job.starts_with('.')
        || !job.chars().all(ok_char)
    {
        return Err(FormatError::invalid(
            "job id",
            format!("{job:?}: want 1-{MAX_JOB_ID_LEN} characters of [A-Za-z0-9._-], not starting with '.'"),
        ));
    }
    Ok(())
}

/// Checks an entry name: non-empty UTF-8 of at most 4096 bytes, no NUL and
/// no control characters.
pub fn validate_entry_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_ENTRY_NAME_LEN || name.chars().any(char::is_control) {
        return Err(FormatError::invalid(
            "entry name",
            format!("{name:?}: want 1-{MAX_ENTRY_NAME_LEN} bytes without control characters"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids() {
        for ok in ["llama3-405b", "run_7.b", "A"] {
            assert!(validate_job_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".hidden", "a/b", "..", "a b", "é", &"x".repeat(129)] {
            assert!(validate_job_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn entry_names() {
        assert!(validate_entry_name("model.layers.0.mlp.up_proj.weight").is_ok());
        assert!(validate_entry_name("optimizer/state/0/exp_avg").is_ok());
        assert!(validate_entry_name("").is_err());
        assert!(validate_entry_name("a\0b").is_err());
        assert!(validate_entry_name("a\nb").is_err());
    }
}
