//! The io_uring engine: one dedicated I/O thread owns a ring and keeps
//! several requests in flight across files (pieces of large files, then
//! `fdatasync`s), handling short reads and writes by resubmitting the rest.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use io_uring::{cqueue, opcode, types, IoUring};

use super::{open_direct, write_bytes, IoEngine, ReadReq, WriteBytes, WriteReq};
use crate::aligned::{align_up, AlignedBuf};

/// Requests in flight at once (16 × 4 MiB kept this disk busier than 8 across
/// many chunk files, each ending in its own fdatasync).
const QUEUE_DEPTH: usize = 16;
/// Largest single read or write submitted (a multiple of the page size).
const PIECE: usize = 4 << 20;

type WriteReply = mpsc::SyncSender<Vec<std::io::Result<()>>>;
type ReadReply = mpsc::SyncSender<Vec<std::io::Result<AlignedBuf>>>;

enum Job {
    Write(Vec<WriteReq>, WriteReply),
    Read(Vec<ReadReq>, ReadReply),
}

/// io_uring on a dedicated thread, fed through a channel.
pub struct UringEngine {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    broken: Arc<AtomicBool>,
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UringEngine")
    }
}

impl UringEngine {
    /// Creates the ring (probing that the kernel allows io_uring and supports
    /// the operations used) and starts the I/O thread.
    pub fn start() -> std::io::Result<Self> {
        let ring = IoUring::new((QUEUE_DEPTH * 2) as u32)?;
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        for (code, name) in [
            (opcode::Write::CODE, "write"),
            (opcode::Read::CODE, "read"),
            (opcode::Fsync::CODE, "fsync"),
        ] {
            if !probe.is_supported(code) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    format!("io_uring lacks {name}"),
                ));
            }
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let broken = Arc::new(AtomicBool::new(false));
        let flag = broken.clone();
        let thread = std::thread::Builder::new()
            .name("strata-io-uring".into())
            .spawn(move || {
                let mut ring = ring;
                while let Ok(job) = rx.recv() {
                    match job {
                        Job::Write(reqs, reply) => {
                            let _ = reply.send(run_writes(&mut ring, &reqs, &flag));
                        }
                        Job::Read(reqs, reply) => {
                            let _ = reply.send(run_reads(&mut ring, reqs, &flag));
                        }
                    }
                }
            })?;
        Ok(UringEngine {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            broken,
        })
    }

    fn send(&self, job: Job) -> bool {
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        match self.tx.lock() {
            Ok(guard) => guard.as_ref().is_some_and(|tx| tx.send(job).is_ok()),
            Err(_) => false,
        }
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Ok(mut t) = self.thread.lock() {
            if let Some(t) = t.take() {
                let _ = t.join();
            }
        }
    }
}

fn engine_gone<T>(n: usize) -> Vec<std::io::Result<T>> {
    (0..n)
        .map(|_| Err(std::io::Error::other("io_uring engine stopped")))
        .collect()
}

impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn write_files(&self, reqs: Vec<WriteReq>) -> Vec<std::io::Result<()>> {
        let n = reqs.len();
        let (tx, rx) = mpsc::sync_channel(1);
        if !self.send(Job::Write(reqs, tx)) {
            return engine_gone(n);
        }
        rx.recv().unwrap_or_else(|_| engine_gone(n))
    }

    fn read_files(&self, reqs: Vec<ReadReq>) -> Vec<std::io::Result<AlignedBuf>> {
        let n = reqs.len();
        let (tx, rx) = mpsc::sync_channel(1);
        if !self.send(Job::Read(reqs, tx)) {
            return engine_gone(n);
        }
        rx.recv().unwrap_or_else(|_| engine_gone(n))
    }
}

#[derive(Clone, Copy)]
enum OpKind {
    Io { off: usize, len: usize },
    Fsync,
}

#[derive(Clone, Copy)]
struct Op {
    file: usize,
    kind: OpKind,
}

/// Submits queued ops (up to the queue depth) and reaps completions until
/// nothing is queued or in flight. `on_done` sees each completion and may
/// queue follow-ups. The buffers behind queued ops must outlive this call,
/// which returns only once the kernel holds none of them.
fn drive(
    ring: &mut IoUring,
    queue: &mut VecDeque<Op>,
    broken: &AtomicBool,
    mut sqe_for: impl FnMut(&Op) -> Option<io_uring::squeue::Entry>,
    mut on_done: impl FnMut(Op, i32, &mut VecDeque<Op>),
) -> std::io::Result<()> {
    let mut slots: Vec<Option<Op>> = vec![None; QUEUE_DEPTH];
    let mut inflight = 0usize;
    loop {
        while inflight < QUEUE_DEPTH {
            let Some(op) = queue.pop_front() else { break };
            let Some(slot) = slots.iter().position(Option::is_none) else {
                queue.push_front(op);
                break;
            };
            let Some(sqe) = sqe_for(&op) else { continue };
            let sqe = sqe.user_data(slot as u64);
            // SAFETY: the buffer and fd named by the entry stay alive until its
            // completion is reaped below: they belong to the caller's request
            // vectors, which outlive this function, and we do not return while
            // any op is in flight.
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                queue.push_front(op);
                break;
            }
            slots[slot] = Some(op);
            inflight += 1;
        }
        if inflight == 0 {
            return Ok(());
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e)
                if e.raw_os_error() == Some(libc::EINTR)
                    || e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => {
                // The kernel may still own buffers: the caller must leak them.
                broken.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c: cqueue::Entry| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in done {
            if let Some(op) = slots.get_mut(ud as usize).and_then(Option::take) {
                inflight -= 1;
                on_done(op, res, queue);
            }
        }
    }
}

/// After a ring failure, operations already submitted may still run. What
/// holds then, and why leaking `buffers` is enough:
/// - reads: each destination buffer is owned by its `ReadFile` and leaked
///   here, so the kernel can only ever write into memory nobody reuses;
/// - writes: the source bytes are *borrowed* from the callers' requests
///   (or owned bounce buffers, leaked here). Borrowed ones go back to
///   their owners when this returns, and an operation still in flight may
///   read them after that: the kernel only reads them, into a temporary
///   file of a batch that failed (never renamed to a chunk's name), so no
///   memory of this process is written and no stored chunk is affected;
/// - the files are leaked too, so their descriptors stay open (and their
///   numbers unused) while the kernel may still hold them.
///
/// Every request fails.
fn abandon<B, T>(buffers: B, n: usize, e: &std::io::Error) -> Vec<std::io::Result<T>> {
    std::mem::forget(buffers);
    (0..n)
        .map(|_| Err(std::io::Error::other(format!("io_uring failed: {e}"))))
        .collect()
}

fn errno(res: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(-res)
}

struct WriteFile<'a> {
    file: Option<File>,
    bytes: Option<WriteBytes<'a>>,
    len: usize,
    pending: usize,
    err: Option<std::io::Error>,
}

fn pieces(file: usize, total: usize, queue: &mut VecDeque<Op>) -> usize {
    let mut n = 0;
    let mut off = 0;
    while off < total {
        let len = (total - off).min(PIECE);
        queue.push_back(Op {
            file,
            kind: OpKind::Io { off, len },
        });
        off += len;
        n += 1;
    }
    n
}

fn run_writes(
    ring: &mut IoUring,
    reqs: &[WriteReq],
    broken: &AtomicBool,
) -> Vec<std::io::Result<()>> {
    let mut queue = VecDeque::new();
    let mut files: Vec<WriteFile<'_>> = Vec::with_capacity(reqs.len());
    for (i, req) in reqs.iter().enumerate() {
        let mut f = WriteFile {
            file: None,
            bytes: None,
            len: req.data.len(),
            pending: 0,
            err: None,
        };
        match open_direct(&req.path, true) {
            Ok((file, direct)) => {
                let bytes = write_bytes(&req.data, direct);
                let total = bytes.as_slice().len();
                f.file = Some(file);
                f.bytes = Some(bytes);
                f.pending = pieces(i, total, &mut queue);
                if f.pending == 0 {
                    queue.push_back(Op {
                        file: i,
                        kind: OpKind::Fsync,
                    });
                }
            }
            Err(e) => f.err = Some(e),
        }
        files.push(f);
    }
    // Raw views for the SQE builder; the data they point to lives in `files`.
    let targets: Vec<Option<(i32, *const u8)>> = files
        .iter()
        .map(|f| {
            Some((
                f.file.as_ref()?.as_raw_fd(),
                f.bytes.as_ref()?.as_slice().as_ptr(),
            ))
        })
        .collect();
    let files_cell = std::cell::RefCell::new(&mut files);
    let result = drive(
        ring,
        &mut queue,
        broken,
        |op| {
            let (fd, ptr) = targets.get(op.file).copied().flatten()?;
            if files_cell.borrow()[op.file].err.is_some() {
                return None;
            }
            Some(match op.kind {
                // off + len lies within the bytes (pieces() cut them so).
                OpKind::Io { off, len } => {
                    opcode::Write::new(types::Fd(fd), ptr.wrapping_add(off), len as u32)
                        .offset(off as u64)
                        .build()
                }
                OpKind::Fsync => opcode::Fsync::new(types::Fd(fd))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build(),
            })
        },
        |op, res, queue| {
            let mut files = files_cell.borrow_mut();
            let f = &mut files[op.file];
            match op.kind {
                OpKind::Io { off, len } => {
                    if res < 0 {
                        f.err.get_or_insert(errno(res));
                    } else if res == 0 {
                        f.err.get_or_insert(std::io::Error::new(
                            std::io::ErrorKind::WriteZero,
                            "write returned 0",
                        ));
                    } else if (res as usize) < len {
                        let done = res as usize;
                        queue.push_front(Op {
                            file: op.file,
                            kind: OpKind::Io {
                                off: off + done,
                                len: len - done,
                            },
                        });
                        return;
                    }
                    f.pending -= 1;
                    if f.pending == 0 && f.err.is_none() {
                        // Padding written for O_DIRECT is cut off before the sync.
                        let padded = f.bytes.as_ref().map_or(0, |b| b.as_slice().len());
                        if padded != f.len {
                            if let Some(Err(e)) =
                                f.file.as_ref().map(|file| file.set_len(f.len as u64))
                            {
                                f.err = Some(e);
                                return;
                            }
                        }
                        queue.push_back(Op {
                            file: op.file,
                            kind: OpKind::Fsync,
                        });
                    }
                }
                OpKind::Fsync => {
                    if res < 0 {
                        f.err.get_or_insert(errno(res));
                    }
                }
            }
        },
    );
    if let Err(e) = result {
        return abandon(files, reqs.len(), &e);
    }
    files
        .into_iter()
        .map(|f| f.err.map_or(Ok(()), Err))
        .collect()
}

struct ReadFile {
    file: Option<File>,
    buf: Option<AlignedBuf>,
    len: usize,
    got: usize,
    err: Option<std::io::Error>,
}

fn run_reads(
    ring: &mut IoUring,
    reqs: Vec<ReadReq>,
    broken: &AtomicBool,
) -> Vec<std::io::Result<AlignedBuf>> {
    let mut queue = VecDeque::new();
    let mut files: Vec<ReadFile> = Vec::with_capacity(reqs.len());
    for (i, mut req) in reqs.into_iter().enumerate() {
        let mut f = ReadFile {
            file: None,
            buf: None,
            len: 0,
            got: 0,
            err: None,
        };
        let opened =
            open_direct(&req.path, false).and_then(|(file, _)| Ok((file.metadata()?.len(), file)));
        match opened {
            Ok((len, _)) if len > req.max_len as u64 => {
                f.err = Some(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{len} bytes exceeds the limit of {}", req.max_len),
                ))
            }
            Ok((len, file)) => {
                // len <= max_len, a usize.
                f.len = len as usize;
                f.buf = Some(req.take_buffer(f.len));
                f.file = Some(file);
                pieces(i, align_up(f.len), &mut queue);
            }
            Err(e) => f.err = Some(e),
        }
        files.push(f);
    }
    let targets: Vec<Option<(i32, *mut u8)>> = files
        .iter_mut()
        .map(|f| {
            let fd = f.file.as_ref()?.as_raw_fd();
            Some((fd, f.buf.as_mut()?.full_mut().as_mut_ptr()))
        })
        .collect();
    let files_cell = std::cell::RefCell::new(&mut files);
    let result = drive(
        ring,
        &mut queue,
        broken,
        |op| {
            let (fd, ptr) = targets.get(op.file).copied().flatten()?;
            if files_cell.borrow()[op.file].err.is_some() {
                return None;
            }
            match op.kind {
                // off + len lies within the capacity (pieces() cut them so).
                OpKind::Io { off, len } => Some(
                    opcode::Read::new(types::Fd(fd), ptr.wrapping_add(off), len as u32)
                        .offset(off as u64)
                        .build(),
                ),
                OpKind::Fsync => None,
            }
        },
        |op, res, queue| {
            let mut files = files_cell.borrow_mut();
            let f = &mut files[op.file];
            if let OpKind::Io { off, len } = op.kind {
                if res < 0 {
                    f.err.get_or_insert(errno(res));
                } else if res > 0 {
                    let done = res as usize;
                    f.got += done;
                    if done < len && off + done < f.len {
                        queue.push_front(Op {
                            file: op.file,
                            kind: OpKind::Io {
                                off: off + done,
                                len: len - done,
                            },
                        });
                    }
                }
            }
        },
    );
    if let Err(e) = result {
        let n = files.len();
        return abandon(files, n, &e);
    }
    files
        .into_iter()
        .map(|f| {
            if let Some(e) = f.err {
                return Err(e);
            }
            let mut buf = f.buf.ok_or_else(|| std::io::Error::other("no buffer"))?;
            if f.got < f.len {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("read {} of {} bytes", f.got, f.len),
                ));
            }
            buf.set_len(f.len);
            Ok(buf)
        })
        .collect()
}
