//! CPU time of the bench and of a server process, per phase, to tell who
//! was busy (on two shared cores a ratio means little without it).

use std::time::Duration;

/// CPU seconds (user + system) used so far by a process (`"self"` or a pid).
pub fn cpu_secs(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // utime and stime are fields 14 and 15 (11 and 12 after the name).
    (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / 100.0
}

/// CPU seconds of the bench and of one server process.
pub struct Cpu {
    /// The server's pid.
    pub server: String,
}

impl Cpu {
    /// (bench, server) CPU seconds so far.
    pub fn now(&self) -> (f64, f64) {
        (cpu_secs("self"), cpu_secs(&self.server))
    }

    /// Prints the CPU used by each since `t0`, on stderr.
    pub fn since(&self, t0: (f64, f64), what: &str, wall: Duration) {
        let (a, b) = self.now();
        let up = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
        eprintln!(
            "    [{what}: ended at uptime {}; {:.2} s wall, client {:.2} s CPU, server {:.2} s CPU]",
            up.split_whitespace().next().unwrap_or("?"),
            wall.as_secs_f64(),
            a - t0.0,
            b - t0.1
        );
    }
}
