//! The pread/pwrite engine: one request at a time per calling thread. The
//! fallback where io_uring is refused (many container runtimes block it).

use std::os::unix::fs::FileExt;

use super::{open_direct, write_bytes, IoEngine, ReadReq, WriteReq};
use crate::aligned::{align_up, AlignedBuf};

/// Blocking pread/pwrite with O_DIRECT.
#[derive(Debug, Default)]
pub struct PsyncEngine;

impl PsyncEngine {
    /// A new engine (stateless).
    pub fn new() -> Self {
        PsyncEngine
    }
}

pub(crate) fn write_one(req: &WriteReq) -> std::io::Result<()> {
    let (file, direct) = open_direct(&req.path, true)?;
    let bytes = write_bytes(&req.data, direct);
    // write_all_at retries short writes and EINTR.
    file.write_all_at(bytes.as_slice(), 0)?;
    if bytes.as_slice().len() != req.data.len() {
        file.set_len(req.data.len() as u64)?;
    }
    file.sync_data()
}

pub(crate) fn read_one(mut req: ReadReq) -> std::io::Result<AlignedBuf> {
    let (file, _) = open_direct(&req.path, false)?;
    let len = file.metadata()?.len();
    if len > req.max_len as u64 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} bytes exceeds the limit of {}", len, req.max_len),
        ));
    }
    // len <= max_len, a usize.
    let len = len as usize;
    let mut buf = req.take_buffer(len);
    let want = align_up(len);
    let mut got = 0;
    let dst = buf.full_mut();
    while got < want {
        match file.read_at(&mut dst[got..want], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if got < len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("read {got} of {len} bytes"),
        ));
    }
    buf.set_len(len);
    Ok(buf)
}

impl IoEngine for PsyncEngine {
    fn name(&self) -> &'static str {
        "psync"
    }

    fn write_files(&self, reqs: Vec<WriteReq>) -> Vec<std::io::Result<()>> {
        reqs.iter().map(write_one).collect()
    }

    fn read_files(&self, reqs: Vec<ReadReq>) -> Vec<std::io::Result<AlignedBuf>> {
        reqs.into_iter().map(read_one).collect()
    }
}
