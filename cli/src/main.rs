//! The `strata` command-line tool.
//!
//! Today: `strata demo`, which lays out, hashes, encodes and verifies a
//! synthetic multi-GiB training state and prints throughput and ratios. The
//! inspection commands (`ls`, `show`, `verify`, ...) arrive with the tiers.

mod codec_report;
mod demo;
mod out;
mod peer;
mod size;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Strata: a multi-tier checkpoint store for large-scale AI training.
#[derive(Parser, Debug)]
#[command(name = "strata", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Lay out, hash, encode and verify a synthetic training state; print
    /// throughput and compression ratios.
    ///
    /// Example: strata demo --state-size 2GiB
    Demo(demo::DemoArgs),
    /// The L2 peer service and its certificates.
    #[command(subcommand)]
    Peer(peer::PeerCmd),
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
    /// A bad argument.
    #[error("invalid argument: {0}")]
    Arg(String),
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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Peer(cmd) => peer::run(&cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata: error: {e}");
            ExitCode::FAILURE
        }
    }
}
