//! The FUSE file system over a [`View`]: lookups, attributes, directory
//! listings, the `latest` link and reads. Everything that would change
//! the tree is refused with EROFS (the mount is read-only as well, so the
//! kernel refuses most of it before asking).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    WriteFlags,
};

use super::view::{Fail, Kind, Node, View};

/// A directory's entries: inode, type, name.
type Listing = Arc<Vec<(u64, FileType, String)>>;

/// The mount: a [`View`] and who owns its files.
pub(crate) struct StrataFs {
    pub(crate) view: View,
    uid: u32,
    gid: u32,
    started: SystemTime,
    /// Directory listings taken at `opendir`, by handle.
    dirs: Mutex<HashMap<u64, Listing>>,
    next_fh: AtomicU64,
    /// How long the kernel may keep a name or attributes: the refresh
    /// interval, so a retired step's names go when the listing does (a
    /// step's bytes never change; the kernel keeps its pages across opens).
    refresh: Duration,
}

impl StrataFs {
    pub(crate) fn new(view: View, refresh: Duration) -> Self {
        // SAFETY: getuid/getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        StrataFs {
            view,
            uid,
            gid,
            started: SystemTime::now(),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            refresh,
        }
    }

    fn attr(&self, node: Node) -> Result<(FileAttr, Duration), Errno> {
        let kind = self.view.kind(node).map_err(|e| errno(&e, node))?;
        let (ty, size, perm, ttl) = match &kind {
            Kind::Dir => (FileType::Directory, 0, 0o555, self.refresh),
            Kind::Link(to) => (FileType::Symlink, to.len() as u64, 0o777, self.refresh),
            Kind::File { size, immutable } => (
                FileType::RegularFile,
                *size,
                0o444,
                if *immutable {
                    self.refresh
                } else {
                    Duration::ZERO
                },
            ),
        };
        let attr = FileAttr {
            ino: INodeNo(self.view.ino(node)),
            size,
            blocks: size.div_ceil(512),
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind: ty,
            perm,
            nlink: if ty == FileType::Directory { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 1 << 20,
        };
        Ok((attr, ttl))
    }

    /// Directory `ino`'s entries, `.` and `..` first.
    fn listing(&self, ino: INodeNo) -> Result<Listing, Errno> {
        let node = self.node(ino)?;
        let children = self.view.children(node).map_err(|e| errno(&e, node))?;
        let parent = match node {
            Node::RankDir(s, _) => Node::Step(s),
            _ => Node::Root,
        };
        let mut all: Vec<(u64, FileType, String)> = vec![
            (self.view.ino(node), FileType::Directory, ".".into()),
            (self.view.ino(parent), FileType::Directory, "..".into()),
        ];
        for (name, child) in children {
            let ty = match child {
                Node::Latest => FileType::Symlink,
                Node::Step(_) | Node::RankDir(..) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            all.push((self.view.ino(child), ty, name));
        }
        Ok(Arc::new(all))
    }

    fn node(&self, ino: INodeNo) -> Result<Node, Errno> {
        self.view.node(ino.0).ok_or(Errno::ENOENT)
    }
}

/// The errno for a failure, logged when it is not a plain absence.
fn errno(f: &Fail, node: Node) -> Errno {
    match f {
        Fail::Gone => Errno::ENOENT,
        Fail::Io(why) => {
            tracing::warn!(?node, "{why}");
            Errno::EIO
        }
    }
}

impl Filesystem for StrataFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Requests of up to 1 MiB (the kernel sizes them by the larger of
        // these two), so a sequential reader takes few round trips; the
        // mount reads ahead itself, by chunks (view.rs).
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = (|| {
            let p = self.node(parent)?;
            let name = name.to_str().ok_or(Errno::ENOENT)?;
            let n = self.view.lookup(p, name).map_err(|e| errno(&e, p))?;
            self.attr(n)
        })();
        match r {
            Ok((attr, ttl)) => reply.entry(&ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.node(ino).and_then(|n| self.attr(n)) {
            Ok((attr, ttl)) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = self.node(ino).and_then(|n| match self.view.kind(n) {
            Ok(Kind::Link(to)) => Ok(to),
            Ok(_) => Err(Errno::EINVAL),
            Err(e) => Err(errno(&e, n)),
        });
        match r {
            Ok(to) => reply.data(to.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return reply.error(Errno::EROFS);
        }
        match self.node(ino).and_then(|n| self.attr(n).map(|a| (n, a))) {
            // A step's files never change: the kernel may keep their pages
            // across opens. The counters change at every read.
            Ok((Node::Stats, _)) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            // manifest.json and model.safetensors of a step not yet whole
            // in any tier are made again: their pages are not kept.
            Ok((Node::Manifest(_) | Node::Model(_), _)) => {
                reply.opened(FileHandle(0), FopenFlags::empty())
            }
            Ok((_, (a, _))) if a.kind == FileType::RegularFile => {
                reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE)
            }
            Ok(_) => reply.error(Errno::EISDIR),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let node = match self.node(ino) {
            Ok(n) => n,
            // An open file of a step retired since: EIO, as for its chunks.
            Err(_) => return reply.error(Errno::EIO),
        };
        match self.view.read(node, offset, size) {
            Ok(bytes) => reply.data(&bytes),
            // An open file of a step that went away: EIO, never zeros.
            Err(Fail::Gone) => reply.error(Errno::EIO),
            Err(e) => reply.error(errno(&e, node)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // The listing is taken once per open: a refresh between two
        // readdir calls of one `ls` never skips or repeats a name.
        match self.listing(ino) {
            Ok(list) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut d) = self.dirs.lock() {
                    d.insert(fh, list);
                }
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let held = self.dirs.lock().ok().and_then(|d| d.get(&fh.0).cloned());
        let all = match held {
            Some(l) => l,
            None => match self.listing(ino) {
                Ok(l) => l,
                Err(e) => return reply.error(e),
            },
        };
        for (i, (ino, ty, name)) in all.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, *ty, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        if let Ok(mut d) = self.dirs.lock() {
            d.remove(&fh.0);
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, 1 << 20, 255, 1 << 20);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }
}
