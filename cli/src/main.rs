//! The `strata` command-line tool: `demo` (the whole pipeline on embedded
//! defaults), the inspection commands people on call reach for (`ls`,
//! `show`, `verify`, `diff`, `stat`), `export`/`import` of safetensors
//! files, and the L2 peer service (`peer serve`). Exit codes and the JSON
//! schemas are in docs/cli.md.

mod catalog;
mod codec_report;
mod demo;
mod demo_cluster;
mod demo_restores;
mod diff;
mod gc;
mod ls;
mod mount;
mod out;
mod peer;
mod progress;
mod rank;
mod rm;
mod safetensors_io;
mod show;
mod size;
mod stat;
mod store_args;
mod table;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Strata: a multi-tier checkpoint store for large-scale AI training.
///
/// The store is found from --config strata.toml, then STRATA_* environment
/// variables (STRATA_JOB, STRATA_L1_DIR, STRATA_L3_URL, STRATA_PEERS, ...),
/// then flags (--job, --l1, --l3, --peers); later ones win.
#[derive(Parser, Debug)]
#[command(
    name = "strata",
    version,
    about,
    after_help = "Examples:\n  strata demo\n  strata ls --l1 /nvme/strata --job llama-70b\n  strata verify --all --config strata.toml\n  strata export 1200 -o model.safetensors --job llama-70b\n\nExit status: 0 success; 1 verify found damage; 2 bad arguments; 3 a store or file could not be read or is corrupt; 4 no such step or rank; 5 verify --repair repaired everything it found."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a synthetic training loop: save every step to L1, replicate it
    /// to two peer services on loopback and upload every K-th to L3; then
    /// lose the node's disk and restore from a peer, lose the peers too and
    /// restore from L3, verifying every byte; print stalls, throughput and
    /// what the codecs would store.
    ///
    /// With --nodes N --ranks-per-node M, the same as a cluster of
    /// processes: nodes in network namespaces with their own peer services
    /// and disks, ranks agreeing through etcd, L3 on an S3 server; a node
    /// is lost and its replacement restores from its peers.
    ///
    /// Example: strata demo --state-size 2GiB --steps 4
    ///          strata demo --nodes 3 --ranks-per-node 2
    Demo(demo::DemoArgs),
    /// The job's steps, newest first, with their state in every tier.
    Ls(ls::LsArgs),
    /// The entries of one step's shard: dtype, shape, size, chunks, stored
    /// size, codec ratio, change since the previous step.
    Show(show::ShowArgs),
    /// Re-hash every chunk; name damaged or missing ones and where a good
    /// copy is; --repair rewrites bad copies.
    Verify(verify::VerifyArgs),
    /// Entries added, removed and changed between two steps.
    Diff(diff::DiffArgs),
    /// Per tier: logical and stored bytes, dedup and compression ratios.
    Stat(stat::StatArgs),
    /// Retire old steps and delete unreferenced chunks in every configured
    /// tier (--dry-run: only say what would go).
    Gc(gc::GcArgs),
    /// Pin a step in the tiers (stored there): garbage collection never
    /// retires it until it is unpinned.
    Pin(gc::PinArgs),
    /// Delete steps from the tiers (every rank's shard, retired so that an
    /// interrupted rm never leaves a half-usable step); a rollback.
    Rm(rm::RmArgs),
    /// Remove a step's pin.
    Unpin(gc::PinArgs),
    /// Write a step's shard as a safetensors file.
    Export(safetensors_io::ExportArgs),
    /// Make a checkpoint step from a safetensors file.
    Import(safetensors_io::ImportArgs),
    /// Every step in every tier as a read-only file system (FUSE): each
    /// rank's shard as a safetensors file and its entries as files, DCP
    /// steps' whole tensors as model.safetensors.
    Mount(mount::MountArgs),
    /// Unmount a `strata mount`.
    Umount(mount::UmountArgs),
    /// (Internal) unmount a `strata mount` once its process is gone.
    #[command(hide = true)]
    UnmountWhenGone(mount::WatchArgs),
    /// The L2 peer service and its certificates.
    #[command(subcommand)]
    Peer(peer::PeerCmd),
    /// One rank of a synthetic data-parallel job, as its own process:
    /// resume, save steps, restore and check them; one JSON line per event
    /// (the multi-node demo runs these; under torchrun or srun, a smoke
    /// test of Strata across the nodes).
    Rank(rank::RankArgs),
}

/// Errors the CLI reports in one line before exiting non-zero.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// A format-level failure (bad input, corrupt bytes).
    #[error(transparent)]
    Format(#[from] strata_format::FormatError),
    /// A check failed: the bytes read back differ from the bytes written.
    #[error("verification failed: {0}")]
    Verify(String),
    /// A bad argument or configuration.
    #[error("invalid argument: {0}")]
    Arg(String),
    /// A tier or file could not be opened or read, or holds corrupt data.
    #[error("{0}")]
    Store(String),
    /// The step or rank asked for does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// `verify` found damage that is still there.
    #[error("damage found: {0}")]
    Damage(String),
    /// `verify --repair` found damage and repaired all of it.
    #[error("damage found and repaired ({0} cop{s})", s = if *.0 == 1 { "y" } else { "ies" })]
    Repaired(usize),
}

impl CliError {
    /// The exit status (docs/cli.md).
    fn code(&self) -> u8 {
        match self {
            CliError::Verify(_) | CliError::Damage(_) => 1,
            CliError::Arg(_) => 2,
            CliError::Format(_) | CliError::Store(_) => 3,
            CliError::NotFound(_) => 4,
            CliError::Repaired(_) => 5,
        }
    }
}

impl From<strata::Error> for CliError {
    fn from(e: strata::Error) -> Self {
        match e {
            strata::Error::Config(m) => CliError::Arg(m),
            strata::Error::NothingToRestore(_) => CliError::NotFound(e.to_string()),
            other => CliError::Store(other.to_string()),
        }
    }
}

impl From<strata::tiered::StoreError> for CliError {
    fn from(e: strata::tiered::StoreError) -> Self {
        match e.kind() {
            strata::tiered::StoreErrorKind::NotFound => CliError::NotFound(e.to_string()),
            _ => CliError::Store(e.to_string()),
        }
    }
}

/// Prints `v` as pretty JSON on stdout.
pub(crate) fn print_json<T: serde::Serialize>(v: &T) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(v).map_err(|e| CliError::Arg(e.to_string()))?;
    out::say!("{text}");
    Ok(())
}

/// Logs to stderr, filtered by `STRATA_LOG` (default `warn`). With
/// `STRATA_LOG=info` every stage of a save (snapshot, persist, put_manifest,
/// barrier, commit, retention) prints its time when it closes; `debug` adds
/// each batch's hash and write.
fn init_logging() {
    use tracing_subscriber::fmt::format::FmtSpan;
    let filter = tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() -> ExitCode {
    init_logging();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => return usage_error(&e),
    };
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Ls(a) => ls::run(&a),
        Command::Show(a) => show::run(&a),
        Command::Verify(a) => verify::run(&a),
        Command::Diff(a) => diff::run(&a),
        Command::Stat(a) => stat::run(&a),
        Command::Gc(a) => gc::run(&a),
        Command::Pin(a) => gc::run_pin(&a, true),
        Command::Rm(a) => rm::run(&a),
        Command::Unpin(a) => gc::run_pin(&a, false),
        Command::Export(a) => safetensors_io::export(&a),
        Command::Import(a) => safetensors_io::import(&a),
        Command::Mount(a) => mount::run(&a),
        Command::Umount(a) => mount::umount(&a),
        Command::UnmountWhenGone(a) => mount::watch(&a),
        Command::Peer(cmd) => peer::run(&cmd),
        Command::Rank(a) => rank::run(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the reader is on call, not debugging.
            let msg = e.to_string().replace('\n', " ");
            eprintln!("strata: error: {msg}");
            ExitCode::from(e.code())
        }
    }
}

/// Bad flags: one line and exit 2, like every other error (help and
/// version requests print as clap writes them).
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("bad arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    eprintln!("strata: error: {first} (see strata --help)");
    ExitCode::from(2)
}
