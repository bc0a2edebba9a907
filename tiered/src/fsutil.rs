//! Small durable-filesystem helpers: directory fsync, create-only rename,
//! durable directory creation, durable small-file writes, bounded reads,
//! unique temporary names.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::error::{Result, StoreError};

/// fsyncs a directory, making the names in it durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io("syncing directory", dir, e))
}

/// Renames `from` to `to` unless `to` exists (`renameat2(RENAME_NOREPLACE)`,
/// or `link` + `unlink` where the file system lacks it). Returns false if
/// `to` already existed (and leaves `from` in place).
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let cstr = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| StoreError::invalid("path", "contains NUL"))
    };
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both are valid NUL-terminated paths; AT_FDCWD resolves them
    // relative to the working directory as rename(2) would.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EEXIST) => Ok(false),
        Some(libc::EINVAL) | Some(libc::ENOSYS) => match std::fs::hard_link(from, to) {
            Ok(()) => {
                std::fs::remove_file(from).map_err(|e| StoreError::io("removing", from, e))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(StoreError::io("linking", to, e)),
        },
        _ => Err(StoreError::io("renaming", to, err)),
    }
}

/// True if the open `file` is still the file named `path` (same device
/// and inode); false if the name is gone or names another file (renamed
/// or unlinked since `file` was opened).
pub(crate) fn still_named(file: &File, path: &Path) -> Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let open = file
        .metadata()
        .map_err(|e| StoreError::io("checking", path, e))?;
    match std::fs::metadata(path) {
        Ok(named) => Ok(named.dev() == open.dev() && named.ino() == open.ino()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StoreError::io("checking", path, e)),
    }
}

/// Writes `bytes` to `tmp`, fsyncs it, and renames it to `to`: over an
/// existing file when `replace`, create-only otherwise (returns false if
/// `to` existed; `tmp` is removed either way). The caller fsyncs the
/// directory of `to`.
pub(crate) fn write_durable(tmp: &Path, to: &Path, bytes: &[u8], replace: bool) -> Result<bool> {
    let res = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp)
            .map_err(|e| StoreError::io("creating", tmp, e))?;
        f.write_all(bytes)
            .map_err(|e| StoreError::io("writing", tmp, e))?;
        f.sync_all()
            .map_err(|e| StoreError::io("syncing", tmp, e))?;
        if replace {
            std::fs::rename(tmp, to).map_err(|e| StoreError::io("renaming", to, e))?;
            Ok(true)
        } else {
            rename_noreplace(tmp, to)
        }
    })();
    if !matches!(res, Ok(true)) {
        let _ = std::fs::remove_file(tmp);
    }
    res
}

/// Reads a whole file of at most `max` bytes (the limit is checked before
/// allocating).
pub(crate) fn read_bounded(path: &Path, max: usize, what: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    let f = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => StoreError::NotFound {
            what: what.to_string(),
        },
        _ => StoreError::io("opening", path, e),
    })?;
    let len = f
        .metadata()
        .map_err(|e| StoreError::io("reading metadata of", path, e))?
        .len();
    if len > max as u64 {
        return Err(StoreError::Corrupt {
            what: format!("{what} ({})", path.display()),
            source: strata_format::FormatError::TooLarge {
                what: "file length",
                value: len,
                limit: max as u64,
            },
        });
    }
    let mut out = Vec::with_capacity(len as usize);
    f.take(max as u64)
        .read_to_end(&mut out)
        .map_err(|e| StoreError::io("reading", path, e))?;
    Ok(out)
}

/// Creates `dir` and its missing parents, each new one made durable by
/// name (its parent fsynced): a new `l1_dir` survives a power loss along
/// with the chunks written under it.
pub(crate) fn create_dir_durably(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_durably(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        // Another process made it meanwhile: its name is its to sync, but
        // syncing the parent again costs nothing and makes sure.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(StoreError::io("creating", dir, e)),
    }
    match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => fsync_dir(parent),
        None => Ok(()),
    }
}

/// 16 hex digits drawn once per process from the kernel's random source
/// (or, should it be unreadable, from the time, the pid and an address).
pub(crate) fn process_token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| {
        use std::io::Read;
        let mut b = [0u8; 8];
        let random = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut b))
            .is_ok();
        if !random {
            let seed = format!(
                "{:?} {} {:p}",
                std::time::SystemTime::now(),
                std::process::id(),
                &b
            );
            b.copy_from_slice(&strata_format::ChunkId::of(seed.as_bytes()).as_bytes()[..8]);
        }
        b.iter().map(|x| format!("{x:02x}")).collect()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    /// Run by the test below in a child process: prints its pid and token.
    #[test]
    fn print_token() {
        if std::env::var_os("STRATA_PRINT_TOKEN").is_some() {
            println!("TOKEN {} {}", std::process::id(), process_token());
        }
    }

    /// Two processes that both are pid 1 (each in a PID namespace of its
    /// own, as two containers sharing an L1 are) still name their
    /// temporary files apart: the token is random, not the pid.
    #[test]
    fn processes_with_the_same_pid_get_different_tokens() {
        let exe = std::env::current_exe().unwrap();
        let run = || {
            let out = std::process::Command::new("unshare")
                .args(["--pid", "--fork"])
                .arg(&exe)
                .args(["--exact", "fsutil::tests::print_token", "--nocapture"])
                .env("STRATA_PRINT_TOKEN", "1")
                .output();
            let text = out
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())?;
            let line = text.lines().find(|l| l.starts_with("TOKEN "))?.to_string();
            let mut parts = line.split(' ').skip(1);
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        };
        let (Some(a), Some(b)) = (run(), run()) else {
            assert!(
                std::env::var_os("STRATA_REQUIRE_NETNS").is_none(),
                "unshare --pid (root) is required here"
            );
            eprintln!("SKIPPED: unshare --pid needs root");
            return;
        };
        assert_eq!((a.0.as_str(), b.0.as_str()), ("1", "1"), "both are pid 1");
        assert_eq!(a.1.len(), 16);
        assert!(a.1.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.1, b.1, "two pid 1s drew the same token");
    }
}
