//! A `strata peer serve` process's first line: where it listens.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::Child;

/// Reads the service's first line ("strata peer NODE: listening on ADDR,
/// metrics on http://ADDR/metrics") and returns its address and, if it
/// serves metrics, theirs.
pub(crate) fn listening(child: &mut Child) -> (SocketAddr, Option<SocketAddr>) {
    let mut line = String::new();
    if let Some(out) = child.stdout.as_mut() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split([',', ' ', '\n']).next())
        .and_then(|a| a.trim().parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let metrics = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|a| a.parse().ok());
    (addr, metrics)
}
