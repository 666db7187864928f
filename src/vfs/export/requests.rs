//! Counts of the requests an export served, by protocol and kind, and the time spent
//! answering them (a latency histogram per kind), and the bytes read and written through
//! each protocol: logged when the client stops, so that what a workload costs in round trips
//! can be read off (requests per extracted file, per `stat`) and where the time goes, and
//! served as the client's metrics ([`Requests::figures`]). Also the round trips to the
//! metadata database each kind of request made (the engine's tally of the answering thread,
//! read before and after: `metrics::round_trips_here`; so only where one thread answers a
//! request, as FUSE's do).
//!
//! Not for: anything a request does (the front ends and `vfs`), or logging it (`log`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use parking_lot::RwLock;

use super::Proto;
use crate::metrics::{self, Families, Histogram};

/// The series of the requests' latency histograms, labelled `proto` and `op`.
pub const OP_SERIES: &str = "unkai_op_duration_seconds";

/// The series of the round trips to the metadata database by request, labelled as
/// [`OP_SERIES`].
pub const ROUND_TRIPS_SERIES: &str = "unkai_op_round_trips_total";

/// One kind of request: each request's time (its count is the requests answered), and the
/// round trips to the metadata database made while answering.
#[derive(Clone, Debug)]
struct Op {
    latency: Histogram,
    round_trips: Arc<AtomicU64>,
}

/// One protocol's requests by kind, and the bytes its clients read and wrote.
#[derive(Debug, Default)]
struct ByProto {
    ops: RwLock<HashMap<String, Op>>,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
}

/// How many requests of each protocol and kind an export served, and in how long; bytes
/// read and written.
#[derive(Debug, Default)]
pub struct Requests {
    by: [ByProto; Proto::ALL.len()],
}

/// One request being answered: its time is recorded when this is dropped (when the front
/// end has replied), or when [`Answering::done`] says so.
pub struct Answering {
    op: Option<Op>,
    start: Instant,
    /// The thread's round trips when the request came.
    round_trips: u64,
}

impl Answering {
    /// Records the request's time now.
    pub fn done(mut self) {
        self.record();
    }

    fn record(&mut self) {
        if let Some(op) = self.op.take() {
            op.latency.observe(self.start.elapsed().as_secs_f64());
            let made = metrics::round_trips_here().wrapping_sub(self.round_trips);
            if made > 0 {
                op.round_trips.fetch_add(made, Relaxed);
            }
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.record();
    }
}

impl Requests {
    /// The figures of requests `op` of `proto`, made at the first.
    fn op(&self, proto: Proto, op: &str) -> Op {
        let ops = &self.by[proto as usize].ops;
        if let Some(o) = ops.read().get(op) {
            return o.clone();
        }
        ops.write()
            .entry(op.to_string())
            .or_insert_with(|| Op {
                latency: metrics::latency_of(
                    OP_SERIES,
                    "Requests answered, by protocol (fuse, nfs, s3, webdav) and kind, and \
                     the time spent on each.",
                    &[("proto", proto.name()), ("op", op)],
                ),
                round_trips: Arc::default(),
            })
            .clone()
    }

    /// Makes the figures of requests `ops` of `proto` before any comes, so that each kind
    /// shows in the metrics from the start (at zero).
    pub fn register(&self, proto: Proto, ops: &[&str]) {
        for op in ops {
            self.op(proto, op);
        }
    }

    /// Times a request `op` of `proto`, begun at `start`, until the result is dropped, and
    /// counts it then.
    pub fn start_at(&self, proto: Proto, op: &str, start: Instant) -> Answering {
        Answering {
            op: Some(self.op(proto, op)),
            start,
            round_trips: metrics::round_trips_here(),
        }
    }

    /// Times a request `op` of `proto` from now (see [`Requests::start_at`]).
    pub fn start(&self, proto: Proto, op: &str) -> Answering {
        self.start_at(proto, op, Instant::now())
    }

    /// Counts `n` bytes returned by a read of `proto`.
    pub fn read(&self, proto: Proto, n: usize) {
        self.by[proto as usize]
            .read_bytes
            .fetch_add(n as u64, Relaxed);
    }

    /// Counts `n` bytes taken by a write of `proto`.
    pub fn written(&self, proto: Proto, n: usize) {
        self.by[proto as usize]
            .written_bytes
            .fetch_add(n as u64, Relaxed);
    }

    /// Requests `op` of `proto` answered so far.
    pub fn get(&self, proto: Proto, op: &str) -> u64 {
        self.by[proto as usize]
            .ops
            .read()
            .get(op)
            .map_or(0, |o| o.latency.get_sample_count())
    }

    /// Round trips to the metadata database made answering requests `op` of `proto`.
    pub fn round_trips(&self, proto: Proto, op: &str) -> u64 {
        self.by[proto as usize]
            .ops
            .read()
            .get(op)
            .map_or(0, |o| o.round_trips.load(Relaxed))
    }

    /// Requests of `proto` answered so far.
    pub fn total(&self, proto: Proto) -> u64 {
        self.served(proto).iter().map(|s| s.1).sum()
    }

    /// Each kind of `proto` served at least once, with its count and nanoseconds.
    fn served(&self, proto: Proto) -> Vec<(String, u64, u64)> {
        self.by[proto as usize]
            .ops
            .read()
            .iter()
            .map(|(op, o)| {
                let ns = (o.latency.get_sample_sum() * 1e9) as u64;
                (op.clone(), o.latency.get_sample_count(), ns)
            })
            .filter(|s| s.1 > 0)
            .collect()
    }

    /// The served kinds of `proto`, the largest `key` first (by name among equals).
    fn sorted(
        &self,
        proto: Proto,
        key: impl Fn(&(String, u64, u64)) -> u64,
    ) -> Vec<(String, u64, u64)> {
        let mut seen = self.served(proto);
        seen.sort_by(|a, b| key(b).cmp(&key(a)).then(a.0.cmp(&b.0)));
        seen
    }

    /// The protocols that served anything.
    pub fn protocols(&self) -> Vec<Proto> {
        Proto::ALL
            .into_iter()
            .filter(|&p| {
                let b = &self.by[p as usize];
                !b.ops.read().is_empty()
                    || b.read_bytes.load(Relaxed) > 0
                    || b.written_bytes.load(Relaxed) > 0
            })
            .collect()
    }

    /// The figures as metrics: the latency histograms, and the bytes of each protocol that
    /// served anything.
    pub fn figures(&self, out: &mut Families) {
        for p in Proto::ALL {
            let b = &self.by[p as usize];
            let ops = b.ops.read();
            let mut sorted: Vec<(&String, &Op)> = ops.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            out.histograms(sorted.iter().map(|(_, o)| &o.latency));
            for (name, o) in sorted {
                out.counter(
                    ROUND_TRIPS_SERIES,
                    "Round trips to the metadata database made answering requests, by \
                     protocol and kind (none on an embedded engine; counted where one thread \
                     answers a request: FUSE's).",
                    &[("op", name), ("proto", p.name())],
                    o.round_trips.load(Relaxed),
                );
            }
        }
        for p in self.protocols() {
            let b = &self.by[p as usize];
            out.counter(
                "unkai_read_bytes_total",
                "Bytes clients read through the export, by protocol.",
                &[("proto", p.name())],
                b.read_bytes.load(Relaxed),
            );
            out.counter(
                "unkai_written_bytes_total",
                "Bytes clients wrote through the export, by protocol.",
                &[("proto", p.name())],
                b.written_bytes.load(Relaxed),
            );
        }
    }

    /// One line: the total of `proto`, then each kind served, most frequent first:
    /// `FUSE requests: 12 (lookup 5, getattr 4, create 3)`.
    pub fn summary(&self, proto: Proto) -> String {
        let seen = self.sorted(proto, |s| s.1);
        let total: u64 = seen.iter().map(|s| s.1).sum();
        let each: Vec<String> = seen.iter().map(|(op, n, _)| format!("{op} {n}")).collect();
        format!("{} requests: {total} ({})", proto.title(), each.join(", "))
    }

    /// One line: the round trips to the metadata database made answering requests of
    /// `proto`, by kind, most first, with the mean per request: `metadata round trips: 30
    /// (create 20, 2.0 each; unlink 10, 1.0 each)`; None if there were none (an embedded
    /// engine).
    pub fn round_trip_summary(&self, proto: Proto) -> Option<String> {
        let mut seen: Vec<(String, u64, u64)> = self.by[proto as usize]
            .ops
            .read()
            .iter()
            .map(|(op, o)| {
                let n = o.round_trips.load(Relaxed);
                (op.clone(), n, o.latency.get_sample_count())
            })
            .filter(|s| s.1 > 0)
            .collect();
        if seen.is_empty() {
            return None;
        }
        seen.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let total: u64 = seen.iter().map(|s| s.1).sum();
        let each: Vec<String> = seen
            .iter()
            .map(|(op, n, reqs)| format!("{op} {n}, {:.1} each", *n as f64 / (*reqs).max(1) as f64))
            .collect();
        Some(format!(
            "metadata round trips: {total} ({})",
            each.join("; ")
        ))
    }

    /// One line: the time spent answering requests of `proto`, by kind, most first:
    /// `FUSE request time: 1.2 s (create 800 ms, 181 µs each; getattr 400 ms, 22 µs each)`.
    pub fn time_summary(&self, proto: Proto) -> String {
        let seen = self.sorted(proto, |s| s.2);
        let total: u64 = seen.iter().map(|s| s.2).sum();
        let each: Vec<String> = seen
            .iter()
            .map(|(op, n, ns)| format!("{op} {}, {} µs each", duration(*ns), ns / n / 1000))
            .collect();
        format!(
            "{} request time: {} ({})",
            proto.title(),
            duration(total),
            each.join("; ")
        )
    }
}

/// `ns` for a person: "850 µs", "12 ms", "3.4 s".
fn duration(ns: u64) -> String {
    match ns {
        n if n < 1_000_000 => format!("{} µs", n / 1000),
        n if n < 10_000_000_000 => format!("{} ms", n / 1_000_000),
        n => format!("{:.1} s", n as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_protocol_and_kind_most_frequent_first() {
        let r = Requests::default();
        assert_eq!(r.summary(Proto::Fuse), "FUSE requests: 0 ()");
        for k in ["getattr", "lookup", "getattr", "copy_file_range"] {
            let _answering = r.start(Proto::Fuse, k);
            if k == "lookup" {
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
        }
        r.start(Proto::Webdav, "PUT").done();
        assert_eq!(r.get(Proto::Fuse, "getattr"), 2);
        assert_eq!(r.get(Proto::Webdav, "PUT"), 1);
        assert_eq!(r.get(Proto::Nfs, "getattr"), 0);
        assert_eq!(
            r.summary(Proto::Fuse),
            "FUSE requests: 4 (getattr 2, copy_file_range 1, lookup 1)"
        );
        assert_eq!(r.summary(Proto::Webdav), "WebDAV requests: 1 (PUT 1)");
        assert_eq!(r.protocols(), [Proto::Fuse, Proto::Webdav]);
        let t = r.time_summary(Proto::Fuse);
        assert!(t.starts_with("FUSE request time: "), "{t}");
        let after = t.split_once('(').unwrap().1;
        assert!(after.starts_with("lookup "), "the slowest first: {t}");
        assert!(
            t.contains("getattr ") && t.contains("copy_file_range "),
            "{t}"
        );
        assert_eq!(
            (duration(999), duration(2_500_000)),
            ("0 µs".into(), "2 ms".into())
        );
        assert_eq!(duration(12_345_000_000), "12.3 s");
        let mut f = Families::default();
        r.figures(&mut f);
        let text = f.text();
        assert!(
            text.contains("unkai_op_duration_seconds_count{op=\"getattr\",proto=\"fuse\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("unkai_op_duration_seconds_count{op=\"PUT\",proto=\"webdav\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("unkai_written_bytes_total{proto=\"webdav\"} 0"),
            "{text}"
        );
        assert!(!text.contains("proto=\"nfs\""), "{text}");
        assert_eq!(
            r.round_trip_summary(Proto::Fuse),
            None,
            "no round trips, no line"
        );
        {
            let _answering = r.start(Proto::Fuse, "create");
            metrics::round_trips(3);
        }
        {
            let _answering = r.start(Proto::Fuse, "unlink");
            metrics::round_trips(1);
        }
        metrics::round_trips(5); // outside any request: not counted
        assert_eq!(
            (
                r.round_trips(Proto::Fuse, "create"),
                r.round_trips(Proto::Fuse, "unlink")
            ),
            (3, 1)
        );
        assert_eq!(
            r.round_trip_summary(Proto::Fuse).unwrap(),
            "metadata round trips: 4 (create 3, 3.0 each; unlink 1, 1.0 each)"
        );
    }
}
