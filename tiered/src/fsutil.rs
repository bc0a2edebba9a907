//! Small durable-filesystem helpers: directory fsync, create-only rename,
//! durable small-file writes, bounded reads.

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
