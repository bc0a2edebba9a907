//! The disk I/O engines behind L1.
//!
//! Both take owned requests (paths and shared buffers) and hand back owned
//! results, so a request can sit in an io_uring queue on another thread for as
//! long as it needs. Files are written with O_DIRECT from aligned buffers
//! (padded to the block size, then truncated to their length) and made durable
//! with `fdatasync`; reads use O_DIRECT into aligned buffers. Where the file
//! system refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE and network
//! file systems), the engines fall back to buffered I/O plus `fdatasync` and
//! say so once in the log.

mod psync;
mod uring;

use std::path::PathBuf;
use std::sync::Arc;

pub use psync::PsyncEngine;
pub use uring::UringEngine;

use crate::aligned::AlignedBuf;
use crate::chunk_data::ChunkData;

/// Which engine to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EngineChoice {
    /// io_uring if the kernel allows it, else pread/pwrite.
    #[default]
    Auto,
    /// io_uring or fail.
    IoUring,
    /// pread/pwrite.
    Psync,
}

impl std::str::FromStr for EngineChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(EngineChoice::Auto),
            "io_uring" | "uring" => Ok(EngineChoice::IoUring),
            "psync" | "pwrite" => Ok(EngineChoice::Psync),
            other => Err(format!(
                "unknown I/O engine {other:?} (auto, io_uring, psync)"
            )),
        }
    }
}

/// A file to create and fill.
#[derive(Debug)]
pub struct WriteReq {
    /// Where (a new file: an existing one is an error).
    pub path: PathBuf,
    /// What.
    pub data: ChunkData,
}

/// A whole file to read.
#[derive(Debug)]
pub struct ReadReq {
    /// Which file.
    pub path: PathBuf,
    /// Files longer than this are refused (bounded allocation).
    pub max_len: usize,
    /// A buffer to read into, if large enough (reused across batches so a
    /// restore does not fault in fresh memory for every chunk); else a new
    /// one is allocated.
    pub buf: Option<AlignedBuf>,
}

impl ReadReq {
    /// The buffer for a file of `len` bytes: the offered one if its
    /// capacity holds the aligned length, else a new one.
    pub(crate) fn take_buffer(&mut self, len: usize) -> AlignedBuf {
        match self.buf.take() {
            Some(mut b) if b.capacity() >= crate::aligned::align_up(len) => {
                b.set_len(len);
                b
            }
            _ => AlignedBuf::zeroed(len),
        }
    }
}

/// A disk I/O engine. Calls block the calling thread (run them on a blocking
/// pool, never on an async runtime's workers).
pub trait IoEngine: Send + Sync + std::fmt::Debug {
    /// "io_uring" or "psync".
    fn name(&self) -> &'static str;
    /// Creates each file, writes it, truncates it to its length and makes it
    /// durable (`fdatasync`). One result per request, in order.
    fn write_files(&self, reqs: Vec<WriteReq>) -> Vec<std::io::Result<()>>;
    /// Reads each file whole. One result per request, in order.
    fn read_files(&self, reqs: Vec<ReadReq>) -> Vec<std::io::Result<AlignedBuf>>;
}

/// Opens the engine asked for. `Auto` probes io_uring and falls back to
/// pread/pwrite, logging which one runs.
pub fn open_engine(choice: EngineChoice) -> std::io::Result<Arc<dyn IoEngine>> {
    match choice {
        EngineChoice::Psync => Ok(Arc::new(PsyncEngine::new())),
        EngineChoice::IoUring => Ok(Arc::new(UringEngine::start()?)),
        EngineChoice::Auto => match UringEngine::start() {
            Ok(e) => {
                tracing::info!(engine = "io_uring", "L1 I/O engine");
                Ok(Arc::new(e))
            }
            Err(err) => {
                tracing::warn!(engine = "psync", error = %err, "io_uring refused; L1 falls back to pread/pwrite");
                Ok(Arc::new(PsyncEngine::new()))
            }
        },
    }
}

/// Opens a file for O_DIRECT I/O, falling back to buffered I/O where the
/// file system refuses O_DIRECT. Returns the file and whether it is direct.
pub(crate) fn open_direct(
    path: &std::path::Path,
    create: bool,
) -> std::io::Result<(std::fs::File, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |direct: bool| {
        let mut o = std::fs::OpenOptions::new();
        if create {
            o.write(true).create_new(true).mode(0o644);
        } else {
            o.read(true);
        }
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path)
    };
    match open(true) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| tracing::warn!(path = %path.display(), "O_DIRECT refused by the file system; using buffered I/O + fdatasync"));
            // The kernel checks O_DIRECT after creating the inode, so a
            // refused create-only open can leave an empty file behind. The
            // path is this process's own temporary name: remove and retry.
            if create {
                let _ = std::fs::remove_file(path);
            }
            Ok((open(false)?, false))
        }
        Err(e) => Err(e),
    }
}

/// What a write needs: the bytes to hand the kernel and the length to
/// truncate to. Direct I/O needs an aligned, padded buffer (bounce-copied
/// when the chunk's own buffer cannot provide one); buffered I/O takes the
/// bytes as they are.
pub(crate) enum WriteBytes<'a> {
    Borrowed(&'a [u8]),
    Bounce(AlignedBuf),
}

impl WriteBytes<'_> {
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            WriteBytes::Borrowed(b) => b,
            WriteBytes::Bounce(b) => b.full(),
        }
    }
}

pub(crate) fn write_bytes(data: &ChunkData, direct: bool) -> WriteBytes<'_> {
    if !direct {
        return WriteBytes::Borrowed(data.as_slice());
    }
    match data.padded_for_direct_io() {
        Some(p) => WriteBytes::Borrowed(p),
        None => WriteBytes::Bounce(AlignedBuf::from_slice(data.as_slice())),
    }
}
