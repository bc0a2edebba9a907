//! The `strata` command-line tool.
//!
//! Today: `strata demo`, which lays out, hashes, encodes and verifies a
//! synthetic multi-GiB training state and prints throughput and ratios. The
//! inspection commands (`ls`, `show`, `verify`, ...) arrive with the tiers.

mod codec_report;
mod demo;
mod out;
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata: error: {e}");
            ExitCode::FAILURE
        }
    }
}
