//! Counts of the FUSE requests a mount served, by kind: logged at unmount, so that what a
//! workload costs in round trips to the daemon can be read off (requests per extracted
//! file, per `stat`); the request metrics to come read them too.
//!
//! Not for: timing requests or anything a request does (that is the adapter and `vfs`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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

/// How many requests of each kind a mount served.
pub struct Requests {
    counts: Vec<AtomicU64>,
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            counts: Req::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Requests {
    pub fn count(&self, r: Req) {
        self.counts[r as usize].fetch_add(1, Relaxed);
    }

    pub fn get(&self, r: Req) -> u64 {
        self.counts[r as usize].load(Relaxed)
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// One line: the total, then each kind served, most frequent first:
    /// `FUSE requests: 12 (lookup 5, getattr 4, create 3)`.
    pub fn summary(&self) -> String {
        let mut seen: Vec<(Req, u64)> = Req::ALL
            .iter()
            .map(|&r| (r, self.get(r)))
            .filter(|&(_, n)| n > 0)
            .collect();
        seen.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.name().cmp(b.0.name())));
        let each: Vec<String> = seen
            .iter()
            .map(|(r, n)| format!("{} {n}", r.name()))
            .collect();
        format!("FUSE requests: {} ({})", self.total(), each.join(", "))
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
            r.count(k);
        }
        assert_eq!(r.get(Req::Getattr), 2);
        assert_eq!(
            r.summary(),
            "FUSE requests: 4 (getattr 2, copy_file_range 1, lookup 1)"
        );
        let names: std::collections::HashSet<_> = Req::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), Req::ALL.len(), "names are distinct");
    }
}
