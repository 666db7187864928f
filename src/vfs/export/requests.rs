//! Counts of the FUSE requests a mount served, by kind, and the time the daemon spent
//! answering them (a latency histogram per kind), and the bytes read and written through the
//! mount: logged at unmount, so that what a workload costs in round trips can be read off
//! (requests per extracted file, per `stat`) and where the daemon's time goes, and served as
//! the mount's metrics ([`Requests::figures`]). Also the round trips to the metadata database
//! each kind of request made (the engine's tally of the answering thread, read before and
//! after: `metrics::round_trips_here`).
//!
//! Not for: anything a request does (that is the adapter and `vfs`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use crate::metrics::{self, Families, Histogram};

macro_rules! kinds {
    ($($kind:ident => $name:literal),* $(,)?) => {
        /// A kind of FUSE request unkai answers.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Req { $($kind),* }

        impl Req {
            pub const ALL: &'static [Req] = &[$(Req::$kind),*];

            /// The request's name, as the kernel's protocol spells it (lower case).
            pub fn name(self) -> &'static str {
                match self { $(Req::$kind => $name),* }
            }
        }
    };
}

kinds! {
    Lookup => "lookup", Getattr => "getattr", Setattr => "setattr", Readlink => "readlink",
    Mknod => "mknod", Mkdir => "mkdir", Unlink => "unlink", Rmdir => "rmdir",
    Symlink => "symlink", Rename => "rename", Link => "link", Open => "open", Read => "read",
    Write => "write", Getlk => "getlk", Setlk => "setlk", Flush => "flush",
    Release => "release", Fsync => "fsync", Opendir => "opendir", Readdir => "readdir",
    Readdirplus => "readdirplus", Releasedir => "releasedir", Fsyncdir => "fsyncdir",
    Statfs => "statfs", Setxattr => "setxattr", Getxattr => "getxattr",
    Listxattr => "listxattr", Removexattr => "removexattr", Access => "access",
    Create => "create", Ioctl => "ioctl", Fallocate => "fallocate", Lseek => "lseek",
    CopyFileRange => "copy_file_range",
}

/// How many requests of each kind a mount served, and in how long; bytes read and written.
#[derive(Debug)]
pub struct Requests {
    /// By kind (`Req as usize`): each request's time; its count is the requests answered.
    latency: Vec<Histogram>,
    /// By kind: round trips to the metadata database made while answering.
    round_trips: Vec<AtomicU64>,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
}

/// One request being answered: its time is recorded when this is dropped (when the adapter's
/// method returns, having replied).
pub struct Answering<'a> {
    requests: &'a Requests,
    kind: Req,
    start: Instant,
    /// The thread's round trips when the request came.
    round_trips: u64,
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        let secs = self.start.elapsed().as_secs_f64();
        self.requests.latency[self.kind as usize].observe(secs);
        let made = metrics::round_trips_here().wrapping_sub(self.round_trips);
        if made > 0 {
            self.requests.round_trips[self.kind as usize].fetch_add(made, Relaxed);
        }
    }
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            latency: Req::ALL
                .iter()
                .map(|r| {
                    metrics::latency(
                        "unkai_fuse_op_duration_seconds",
                        "FUSE requests answered, by kind, and the daemon's time on each.",
                        ("op", r.name()),
                    )
                })
                .collect(),
            round_trips: Req::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            read_bytes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
        }
    }
}

impl Requests {
    /// Times a request of kind `r` until the result is dropped, and counts it then.
    pub fn start(&self, r: Req) -> Answering<'_> {
        Answering {
            requests: self,
            kind: r,
            start: Instant::now(),
            round_trips: metrics::round_trips_here(),
        }
    }

    /// Counts `n` bytes returned by a read.
    pub fn read(&self, n: usize) {
        self.read_bytes.fetch_add(n as u64, Relaxed);
    }

    /// Counts `n` bytes taken by a write.
    pub fn written(&self, n: usize) {
        self.written_bytes.fetch_add(n as u64, Relaxed);
    }

    /// Requests of kind `r` answered so far.
    pub fn get(&self, r: Req) -> u64 {
        self.latency[r as usize].get_sample_count()
    }

    /// Round trips to the metadata database made answering requests of kind `r` so far.
    pub fn round_trips(&self, r: Req) -> u64 {
        self.round_trips[r as usize].load(Relaxed)
    }

    pub fn total(&self) -> u64 {
        Req::ALL.iter().map(|&r| self.get(r)).sum()
    }

    fn nanos(&self, r: Req) -> u64 {
        (self.latency[r as usize].get_sample_sum() * 1e9) as u64
    }

    /// The figures as the mount's metrics.
    pub fn figures(&self, out: &mut Families) {
        out.histograms(&self.latency);
        for &r in Req::ALL {
            out.counter(
                "unkai_fuse_op_round_trips_total",
                "Round trips to the metadata database made answering FUSE requests, by kind \
                 (none on an embedded engine).",
                &[("op", r.name())],
                self.round_trips(r),
            );
        }
        out.counter(
            "unkai_fuse_read_bytes_total",
            "Bytes applications read through the mount (FUSE reads).",
            &[],
            self.read_bytes.load(Relaxed),
        );
        out.counter(
            "unkai_fuse_written_bytes_total",
            "Bytes applications wrote through the mount (FUSE writes).",
            &[],
            self.written_bytes.load(Relaxed),
        );
    }

    /// Each kind served at least once, with its count and nanoseconds, the largest `key`
    /// first (by name among equals).
    fn served(&self, key: impl Fn(&(Req, u64, u64)) -> u64) -> Vec<(Req, u64, u64)> {
        let mut seen: Vec<(Req, u64, u64)> = Req::ALL
            .iter()
            .map(|&r| (r, self.get(r), self.nanos(r)))
            .filter(|&(_, n, _)| n > 0)
            .collect();
        seen.sort_by(|a, b| key(b).cmp(&key(a)).then(a.0.name().cmp(b.0.name())));
        seen
    }

    /// One line: the total, then each kind served, most frequent first:
    /// `FUSE requests: 12 (lookup 5, getattr 4, create 3)`.
    pub fn summary(&self) -> String {
        let each: Vec<String> = self
            .served(|s| s.1)
            .iter()
            .map(|(r, n, _)| format!("{} {n}", r.name()))
            .collect();
        format!("FUSE requests: {} ({})", self.total(), each.join(", "))
    }

    /// One line: the round trips to the metadata database, by kind of request, most first,
    /// with the mean per request: `metadata round trips: 30 (create 20, 2.0 each; unlink 10,
    /// 1.0 each)`; None if there were none (an embedded engine).
    pub fn round_trip_summary(&self) -> Option<String> {
        let mut seen: Vec<(Req, u64, u64)> = Req::ALL
            .iter()
            .map(|&r| (r, self.round_trips(r), self.get(r)))
            .filter(|&(_, n, _)| n > 0)
            .collect();
        if seen.is_empty() {
            return None;
        }
        seen.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.name().cmp(b.0.name())));
        let total: u64 = seen.iter().map(|s| s.1).sum();
        let each: Vec<String> = seen
            .iter()
            .map(|&(r, n, reqs)| {
                format!(
                    "{} {n}, {:.1} each",
                    r.name(),
                    n as f64 / reqs.max(1) as f64
                )
            })
            .collect();
        Some(format!(
            "metadata round trips: {total} ({})",
            each.join("; ")
        ))
    }

    /// One line: the daemon's time answering requests, by kind, most first:
    /// `FUSE request time: 1.2 s (create 800 ms, 181 µs each; getattr 400 ms, 22 µs each)`.
    pub fn time_summary(&self) -> String {
        let seen = self.served(|s| s.2);
        let total: u64 = seen.iter().map(|s| s.2).sum();
        let each: Vec<String> = seen
            .iter()
            .map(|&(r, n, ns)| format!("{} {}, {} µs each", r.name(), duration(ns), ns / n / 1000))
            .collect();
        format!(
            "FUSE request time: {} ({})",
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
    fn counts_by_kind_most_frequent_first() {
        let r = Requests::default();
        assert_eq!(r.summary(), "FUSE requests: 0 ()");
        for k in [Req::Getattr, Req::Lookup, Req::Getattr, Req::CopyFileRange] {
            let _answering = r.start(k);
            if k == Req::Lookup {
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
        }
        assert_eq!(r.get(Req::Getattr), 2);
        assert_eq!(
            r.summary(),
            "FUSE requests: 4 (getattr 2, copy_file_range 1, lookup 1)"
        );
        let t = r.time_summary();
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
        assert_eq!(r.round_trip_summary(), None, "no round trips, no line");
        {
            let _answering = r.start(Req::Create);
            metrics::round_trips(3);
        }
        {
            let _answering = r.start(Req::Unlink);
            metrics::round_trips(1);
        }
        metrics::round_trips(5); // outside any request: not counted
        assert_eq!(
            (r.round_trips(Req::Create), r.round_trips(Req::Unlink)),
            (3, 1)
        );
        assert_eq!(
            r.round_trip_summary().unwrap(),
            "metadata round trips: 4 (create 3, 3.0 each; unlink 1, 1.0 each)"
        );
        let names: std::collections::HashSet<_> = Req::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), Req::ALL.len(), "names are distinct");
    }
}
