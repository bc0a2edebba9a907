//! Prometheus' text format and the one HTTP/1.1 exchange `/metrics` needs,
//! shared by the peer service (`metrics`) and the training process
//! (`strata`'s `metrics_listen`): a latency histogram, label quoting, and
//! the answer to a request head. Each caller reads the head its own way
//! (tokio in the service, a plain thread in the training process), bounded
//! by [`MAX_HEAD`].

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Largest request head read.
pub const MAX_HEAD: usize = 8192;

/// Upper bounds of the latency buckets, in seconds (+Inf is implied):
/// from a sub-millisecond request to a 10-minute barrier.
pub const BOUNDS: [f64; 18] = [
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 120.0, 600.0,
];

/// A latency histogram (cumulative buckets, as Prometheus reads them).
/// Lock-free.
#[derive(Default, Debug)]
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Counts one observation.
    pub fn observe(&self, d: Duration) {
        // The count first and the buckets last, while `render` reads the
        // buckets first and the count last: a scrape in between never
        // shows a bucket above +Inf.
        self.count.fetch_add(1, Ordering::SeqCst);
        self.sum_micros.fetch_add(
            d.as_micros().min(u128::from(u64::MAX)) as u64,
            Ordering::SeqCst,
        );
        let secs = d.as_secs_f64();
        for (b, &le) in self.buckets.iter().zip(&BOUNDS) {
            if secs <= le {
                b.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Writes the samples of one labelled series (`labels` non-empty,
    /// without braces); the `# HELP`/`# TYPE` head is [`head`]'s.
    pub fn render_samples(&self, out: &mut String, name: &str, labels: &str) {
        for (b, le) in self.buckets.iter().zip(BOUNDS) {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{le}\"}} {}",
                b.load(Ordering::SeqCst)
            );
        }
        let count = self.count.load(Ordering::SeqCst);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }

    /// [`head`] and [`Self::render_samples`]: one series in a family of
    /// its own.
    pub fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        head(out, name, "histogram", help);
        self.render_samples(out, name, labels);
    }
}

/// A family's `# HELP` and `# TYPE` lines.
pub fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value as Prometheus' text format quotes it.
pub fn quoted(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Whether `head` holds a whole request head (or as much as is read).
pub fn head_done(head: &[u8]) -> bool {
    head.len() >= MAX_HEAD || head.windows(4).any(|w| w == b"\r\n\r\n")
}

/// The whole HTTP answer to a request head: `render`'s text for
/// `GET /metrics` (a 503 if it has none: the source is gone), a 404 for
/// anything else.
pub fn answer(head: &[u8], render: impl FnOnce() -> Option<String>) -> String {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let path = line.split(|&b| b == b' ').nth(1).unwrap_or_default();
    let (status, body) = match (line.starts_with(b"GET "), path) {
        (true, b"/metrics") => match render() {
            Some(text) => ("200 OK", text),
            None => ("503 Service Unavailable", "closed\n".into()),
        },
        _ => (
            "404 Not Found",
            "only GET /metrics is served here\n".to_string(),
        ),
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_is_cumulative_and_counts_every_observation() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_secs(3));
        let mut out = String::new();
        h.render(&mut out, "x", "help", "op=\"a\"");
        assert!(
            out.contains("x_bucket{op=\"a\",le=\"0.0001\"} 0\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{op=\"a\",le=\"0.0005\"} 1\n"),
            "{out}"
        );
        assert!(out.contains("x_bucket{op=\"a\",le=\"5\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{op=\"a\",le=\"+Inf\"} 2\n"), "{out}");
        assert!(out.contains("x_count{op=\"a\"} 2\n"), "{out}");
        assert!(out.starts_with("# HELP x help\n# TYPE x histogram\n"));
    }

    #[test]
    fn only_get_metrics_is_answered() {
        let ok = answer(b"GET /metrics HTTP/1.1\r\n\r\n", || Some("a 1\n".into()));
        assert!(ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("\r\n\r\na 1\n"));
        assert!(answer(b"GET /metricsx HTTP/1.1\r\n\r\n", || None).starts_with("HTTP/1.1 404"));
        assert!(answer(b"POST /metrics HTTP/1.1\r\n\r\n", || None).starts_with("HTTP/1.1 404"));
        assert!(answer(b"GET /metrics HTTP/1.1\r\n\r\n", || None).starts_with("HTTP/1.1 503"));
        assert!(head_done(&[b'a'; MAX_HEAD]) && !head_done(b"GET /"));
        assert_eq!(quoted("a\"b\\c\n"), "a\\\"b\\\\c\\n");
    }
}
