//! Counts of the FUSE requests a mount served, by kind, and the time the daemon spent
//! answering them: logged at unmount, so that what a workload costs in round trips can be
//! read off (requests per extracted file, per `stat`) and where the daemon's time goes;
//! the request metrics to come read them too.
//!
//! Not for: anything a request does (that is the adapter and `vfs`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

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

/// How many requests of each kind a mount served, and in how long.
pub struct Requests {
    counts: Vec<AtomicU64>,
    nanos: Vec<AtomicU64>,
}

/// One request being answered: its time is added when this is dropped (when the adapter's
/// method returns, having replied).
pub struct Answering<'a> {
    requests: &'a Requests,
    kind: Req,
    start: Instant,
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        let ns = self.start.elapsed().as_nanos() as u64;
        self.requests.nanos[self.kind as usize].fetch_add(ns, Relaxed);
    }
}

impl Default for Requests {
    fn default() -> Self {
        let zeros = || Req::ALL.iter().map(|_| AtomicU64::new(0)).collect();
        Requests {
            counts: zeros(),
            nanos: zeros(),
        }
    }
}

impl Requests {
    /// Counts a request of kind `r` and times it until the result is dropped.
    pub fn start(&self, r: Req) -> Answering<'_> {
        self.counts[r as usize].fetch_add(1, Relaxed);
        Answering {
            requests: self,
            kind: r,
            start: Instant::now(),
        }
    }

    pub fn get(&self, r: Req) -> u64 {
        self.counts[r as usize].load(Relaxed)
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// Each kind served at least once, with its count and nanoseconds, the largest `key`
    /// first (by name among equals).
    fn served(&self, key: impl Fn(&(Req, u64, u64)) -> u64) -> Vec<(Req, u64, u64)> {
        let mut seen: Vec<(Req, u64, u64)> = Req::ALL
            .iter()
            .map(|&r| (r, self.get(r), self.nanos[r as usize].load(Relaxed)))
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
        let names: std::collections::HashSet<_> = Req::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), Req::ALL.len(), "names are distinct");
    }
}
