//! `strata mount`: every checkpoint of a job, in every tier, as a
//! read-only FUSE file system (docs/mount.md), and `strata umount`.
//!
//! ```text
//! MOUNT/latest -> step-000120
//! MOUNT/step-000120/manifest.json        every rank's manifest as JSON
//! MOUNT/step-000120/rank-0.safetensors   rank 0's shard as safetensors
//! MOUNT/step-000120/rank-0/<entry>       one entry's raw bytes
//! MOUNT/step-000120/model.safetensors    DCP/DTensor steps: whole tensors by FQN
//! MOUNT/.stats.json                      reads, chunks fetched per tier, cache
//! ```
//!
//! Reads go through the client's catalog and shard reader: the fastest
//! tier holding a verified copy, chunk by chunk fallback, one bounded
//! cache of chunks shared by every open file.

mod counters;
mod fs;
mod layout;
mod names;
mod view;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use fuser::{MountOption, SessionACL};

use crate::out::say;
use crate::store_args::StoreArgs;
use crate::CliError;

/// `strata mount`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  strata mount --l1 /nvme/strata --job llama-70b /mnt/ckpt\n  strata mount --config strata.toml --l3 s3://bucket/ckpt /mnt/ckpt --foreground\n  strata umount /mnt/ckpt"
)]
pub(crate) struct MountArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// An existing, empty directory to mount on.
    pub(crate) mountpoint: PathBuf,
    /// Stay in the foreground (logs on stderr) until unmounted, Ctrl-C or
    /// SIGTERM; without it the mount runs in the background once ready.
    #[arg(long)]
    pub(crate) foreground: bool,
    /// Seconds between listings of the tiers (new steps appear, retired
    /// ones disappear).
    #[arg(long, default_value_t = 2.0, value_name = "SECONDS")]
    pub(crate) refresh: f64,
    /// Chunks kept in memory for every reader of the mount.
    #[arg(long, default_value = "256MiB", value_parser = crate::size::parse_size)]
    pub(crate) cache: u64,
    /// Let every user read the mount (not only its owner); a user other
    /// than root needs `user_allow_other` in /etc/fuse.conf.
    #[arg(long)]
    pub(crate) allow_other: bool,
    /// FUSE request threads.
    #[arg(long, default_value_t = 4)]
    pub(crate) threads: usize,
}

/// `strata umount`.
#[derive(Args, Debug)]
pub(crate) struct UmountArgs {
    /// Where a `strata mount` is mounted.
    pub(crate) mountpoint: PathBuf,
}

/// Runs `strata mount`.
pub(crate) fn run(a: &MountArgs) -> Result<(), CliError> {
    if !(a.refresh.is_finite() && a.refresh >= 0.0) {
        return Err(CliError::Arg(format!(
            "--refresh {}: expected seconds >= 0",
            a.refresh
        )));
    }
    check_fuse()?;
    let mountpoint = std::fs::canonicalize(&a.mountpoint)
        .map_err(|e| CliError::Arg(format!("mount point {}: {e}", a.mountpoint.display())))?;
    if !mountpoint.is_dir() {
        return Err(CliError::Arg(format!(
            "mount point {} is not a directory",
            mountpoint.display()
        )));
    }
    if is_mounted(&mountpoint) {
        return Err(CliError::Arg(format!(
            "{} is already a mount point (strata umount {} first)",
            mountpoint.display(),
            mountpoint.display()
        )));
    }
    if !a.foreground {
        return background(&mountpoint);
    }
    let tiers = a.store.open()?;
    let job = tiers.job().to_string();
    let names: Vec<String> = tiers.tiers().iter().map(|t| t.name.clone()).collect();
    let refresh = Duration::from_secs_f64(a.refresh);
    let cache = usize::try_from(a.cache).unwrap_or(usize::MAX);
    let fs = fs::StrataFs::new(view::View::new(tiers, refresh, cache), refresh);
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
        MountOption::FSName(format!("strata:{job}")),
        MountOption::Subtype("strata".into()),
    ];
    if a.allow_other {
        cfg.acl = SessionACL::All;
    }
    cfg.n_threads = Some(a.threads.max(1));
    let session = fuser::spawn_mount(fs, &mountpoint, &cfg)
        .map_err(|e| CliError::Store(format!("mounting on {}: {e}", mountpoint.display())))?;
    say!(
        "mounted job {job} ({}) read-only at {}; strata umount {} or Ctrl-C to unmount",
        names.join(", "),
        mountpoint.display(),
        mountpoint.display()
    );
    // A killed daemon must not leave a dead mount ("Transport endpoint is
    // not connected") behind: a watcher process unmounts once we are gone.
    // (fuser's AutoUnmount relies on fusermount3's auto_unmount, whose
    // watcher did not outlive the mount call on the machines we test on.)
    spawn_watcher(&mountpoint);
    // This mount's device: an unmount by path below is done only while it
    // is still this mount there (after a lazy unmount from outside, the
    // directory may hold a new mount that must be left alone).
    let dev = device(&mountpoint);
    let result = serve(&session, &mountpoint, dev);
    forget(session);
    result
}

/// Serves until unmounted from outside or told to stop, then unmounts
/// (detaching, and serving what is still open, when busy).
fn serve(
    session: &fuser::BackgroundSession,
    mountpoint: &Path,
    dev: Option<u64>,
) -> Result<(), CliError> {
    let ours = || dev.is_some() && device(mountpoint) == dev;
    let stop = Arc::new(AtomicBool::new(false));
    watch_signals(stop.clone())?;
    while !stop.load(Ordering::Relaxed) && !session.guard.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    if session.guard.is_finished() || !ours() {
        // Unmounted from outside (strata umount, fusermount3 -u).
        tracing::info!(mountpoint = %mountpoint.display(), "unmounted from outside");
        return Ok(());
    }
    if let Err(e) = unmount(mountpoint) {
        // Busy (a file open, a tensor mapped): detach it now and keep
        // serving what is open until it is closed, or a second signal.
        tracing::warn!("{e}");
        if ours() {
            let _ = std::process::Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(mountpoint)
                .output();
        }
        if ours() {
            unmount_lazily(mountpoint)?;
        }
        say!(
            "{} detached; files still open there are served until closed (Ctrl-C again to stop now)",
            mountpoint.display()
        );
        stop.store(false, Ordering::Relaxed);
        watch_signals(stop.clone())?;
        while !stop.load(Ordering::Relaxed) && !session.guard.is_finished() {
            std::thread::sleep(Duration::from_millis(100));
        }
        // Exiting at a second signal: what is still open gets ENOTCONN.
        return Ok(());
    }
    // The request threads end once the kernel has let go of the mount.
    let t0 = Instant::now();
    while !session.guard.is_finished() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    say!("unmounted {}", mountpoint.display());
    Ok(())
}

/// The device of what is mounted at `path` (a FUSE mount's own).
fn device(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.dev())
}

/// Lets the session go without dropping it. fuser's unmount on drop
/// decides the mount is still there from its device's poll (which says so
/// after an unmount too) and then unmounts by path: whatever is mounted on
/// that directory by then, a new mount included. Every exit unmounts
/// itself first (or was unmounted from outside), so nothing is left.
fn forget(session: fuser::BackgroundSession) {
    std::mem::forget(session);
}

/// Runs `strata umount`: `fusermount3 -u`, else `umount` (as root).
pub(crate) fn umount(a: &UmountArgs) -> Result<(), CliError> {
    let path = &a.mountpoint;
    if !is_mounted(&std::fs::canonicalize(path).unwrap_or_else(|_| path.clone())) {
        return Err(CliError::NotFound(format!(
            "nothing is mounted at {}",
            path.display()
        )));
    }
    unmount(path)
}

/// `strata unmount-when-gone PID MOUNTPOINT` (hidden): waits for process
/// `PID` to end, then unmounts `MOUNTPOINT` if it is still mounted.
#[derive(Args, Debug)]
pub(crate) struct WatchArgs {
    pub(crate) pid: u32,
    pub(crate) mountpoint: PathBuf,
}

/// Runs the watcher of [`spawn_watcher`].
pub(crate) fn watch(a: &WatchArgs) -> Result<(), CliError> {
    let start = start_time(a.pid);
    loop {
        if !is_mounted(&a.mountpoint) {
            return Ok(());
        }
        // Gone, or the pid now names another process.
        if start.is_none() || start_time(a.pid) != start {
            // Only a dead mount is unmounted: its process is gone, so the
            // kernel answers ENOTCONN. A new mount on the same directory
            // (mount ids are reused) answers, and is left alone.
            // (Listing it asks the daemon itself; `stat` may be answered
            // from the kernel's attribute cache for a while.)
            let dead = std::fs::read_dir(&a.mountpoint)
                .err()
                .is_some_and(|e| e.raw_os_error() == Some(libc::ENOTCONN));
            if !dead {
                return Ok(());
            }
            // A lazy unmount: readers still in it get errors, not a hang.
            let _ = std::process::Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&a.mountpoint)
                .output();
            if is_mounted(&a.mountpoint) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&a.mountpoint)
                    .output();
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A live process's start time (field 22 of /proc/PID/stat); None once
/// it is gone or a zombie (dead, not yet reaped by its parent).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count from its `)`.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    if matches!(rest.next(), Some("Z" | "X" | "x")) {
        return None;
    }
    rest.nth(18)?.parse().ok()
}

/// Starts the watcher of this process's mount at `mountpoint`, detached.
fn spawn_watcher(mountpoint: &Path) {
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let r = std::process::Command::new(exe)
        .arg("unmount-when-gone")
        .arg(std::process::id().to_string())
        .arg(mountpoint)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn();
    if let Err(e) = r {
        tracing::warn!(
            "no watcher for the mount (a killed mount would stay until strata umount): {e}"
        );
    }
}

/// Detaches `path` (`umount -l`), for a busy mount.
fn unmount_lazily(path: &Path) -> Result<(), CliError> {
    match std::process::Command::new("umount")
        .arg("-l")
        .arg(path)
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(CliError::Store(format!(
            "could not detach {}: {}",
            path.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ))),
        Err(e) => Err(CliError::Store(format!(
            "could not detach {}: {e}",
            path.display()
        ))),
    }
}

/// Unmounts `path`: `fusermount3 -u`, else `umount`.
fn unmount(path: &Path) -> Result<(), CliError> {
    let mut tried = Vec::new();
    for (cmd, args) in [("fusermount3", vec!["-u"]), ("umount", vec![])] {
        match std::process::Command::new(cmd)
            .args(&args)
            .arg(path)
            .output()
        {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => tried.push(format!(
                "{cmd}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => tried.push(format!("{cmd}: {e}")),
        }
    }
    Err(CliError::Store(format!(
        "could not unmount {}: {}",
        path.display(),
        tried.join("; ")
    )))
}

/// A clear error where FUSE cannot work: no `/dev/fuse`, or no right to
/// open it.
fn check_fuse() -> Result<(), CliError> {
    let dev = Path::new("/dev/fuse");
    if !dev.exists() {
        return Err(CliError::Store(
            "FUSE is not available: /dev/fuse is missing (load the fuse module with `modprobe fuse`; in a container, pass --device /dev/fuse)".into(),
        ));
    }
    match std::fs::OpenOptions::new().read(true).write(true).open(dev) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            // Not root: fusermount3 (setuid) can still mount for us.
            if which("fusermount3") {
                Ok(())
            } else {
                Err(CliError::Store(
                    "FUSE is not permitted: /dev/fuse cannot be opened and fusermount3 is not installed (install fuse3, or run as root)".into(),
                ))
            }
        }
        Err(e) => Err(CliError::Store(format!(
            "FUSE is not available: /dev/fuse: {e}"
        ))),
    }
}

/// Whether `path` is a mount point (listed in /proc/self/mountinfo).
fn is_mounted(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|p| unescape_mountinfo(p) == want)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn which(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
}

/// Sets `stop` on SIGINT or SIGTERM.
fn watch_signals(stop: Arc<AtomicBool>) -> Result<(), CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Store(format!("signal handling: {e}")))?;
    let mut term = rt
        .block_on(async {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        })
        .map_err(|e| CliError::Store(format!("signal handling: {e}")))?;
    std::thread::spawn(move || {
        rt.block_on(async {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        });
        stop.store(true, Ordering::Relaxed);
    });
    Ok(())
}

/// Runs this command again with `--foreground`, detached (its own process
/// group, no terminal), and returns once the mount is up, or with the
/// child's error when it exits first.
fn background(mountpoint: &Path) -> Result<(), CliError> {
    let exe =
        std::env::current_exe().map_err(|e| CliError::Store(format!("finding strata: {e}")))?;
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    args.push("--foreground".into());
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let log = dir.join(format!("strata-mount-{}.log", std::process::id()));
    // Created new (never through a link someone left at that name).
    let err = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&log)
        .map_err(|e| CliError::Store(format!("creating {}: {e}", log.display())))?;
    let mut child = std::process::Command::new(exe)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| CliError::Store(format!("starting the mount: {e}")))?;
    let started = Instant::now();
    loop {
        if is_mounted(mountpoint) {
            say!(
                "mounted at {} (process {}, log {}); strata umount {} to unmount",
                mountpoint.display(),
                child.id(),
                log.display(),
                mountpoint.display()
            );
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_file(&log);
            let line = text
                .lines()
                .rev()
                .find(|l| l.contains("error"))
                .unwrap_or("")
                .trim_start_matches("strata: error: ")
                .to_string();
            return Err(CliError::Store(format!(
                "the mount exited ({status}): {line}"
            )));
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            return Err(CliError::Store(
                "the mount did not come up within 60 s".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
