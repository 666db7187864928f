//! What closed files left to make durable: the keys of the blocks each uploaded or staged
//! since its last fsync, kept past its last close, so that a later fsync of the file through
//! a new descriptor (`sync FILE`, an open-fsync-close, `dd conv=fsync` of a file written
//! before) makes them durable, as a local file system's fsync makes durable what any
//! descriptor wrote. A local bucket's objects and staged blocks sit in the page cache until
//! then: the engine's record of them became durable at the fsync, their bytes did not.
//!
//! Not for: the keys of files still being written (their writer keeps them, `writer.rs`),
//! or making anything durable (the data store does, `data`).

use std::collections::HashMap;

use crate::meta::Ino;

/// Keys kept for closed files, per inode, up to [`Unsynced::KEEP`] in all: beyond, all are
/// forgotten at once and the next fsync makes the whole local store durable instead.
#[derive(Default)]
pub(super) struct Unsynced {
    by_ino: HashMap<Ino, Vec<String>>,
    count: usize,
    /// Keys were forgotten since the last fsync that was told so.
    forgot: bool,
}

impl Unsynced {
    /// Keys remembered at most (some 100 bytes each).
    const KEEP: usize = 100_000;

    /// Keeps the keys a file's last writer left unsynced at its last close.
    pub(super) fn keep(&mut self, ino: Ino, keys: Vec<String>) {
        if keys.is_empty() {
            return;
        }
        if self.count + keys.len() > Self::KEEP {
            self.by_ino.clear();
            self.count = 0;
            self.forgot = true;
        }
        self.count += keys.len();
        self.by_ino.entry(ino).or_default().extend(keys);
    }

    /// What an fsync of `ino` must make durable besides its writer's keys: the keys its
    /// closed writers left, and whether any keys were forgotten since the last fsync told
    /// so (then everything stored locally must be made durable). A caller that fails to
    /// make them durable gives them back ([`Unsynced::give_back`]).
    pub(super) fn take(&mut self, ino: Ino) -> (Vec<String>, bool) {
        let keys = self.by_ino.remove(&ino).unwrap_or_default();
        self.count -= keys.len();
        (keys, std::mem::take(&mut self.forgot))
    }

    /// Returns what [`Unsynced::take`] gave, after a failed fsync (the next one tries again).
    pub(super) fn give_back(&mut self, ino: Ino, keys: Vec<String>, forgot: bool) {
        self.forgot |= forgot;
        self.keep(ino, keys);
    }

    /// Forgets a deleted file's keys (its blocks have no future to make durable).
    pub(super) fn drop_file(&mut self, ino: Ino) {
        if let Some(keys) = self.by_ino.remove(&ino) {
            self.count -= keys.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize, tag: &str) -> Vec<String> {
        (0..n).map(|i| format!("{tag}{i}")).collect()
    }

    #[test]
    fn keys_are_kept_per_file_until_taken() {
        let mut u = Unsynced::default();
        u.keep(1, keys(2, "a"));
        u.keep(2, keys(1, "b"));
        u.keep(1, keys(1, "c"));
        assert_eq!(
            u.take(1),
            (vec!["a0".into(), "a1".into(), "c0".into()], false)
        );
        assert_eq!(u.take(1), (vec![], false));
        u.drop_file(2);
        assert_eq!(u.take(2), (vec![], false));
        assert_eq!(u.count, 0);
    }

    #[test]
    fn too_many_keys_are_forgotten_and_the_next_fsync_is_told() {
        let mut u = Unsynced::default();
        u.keep(1, keys(Unsynced::KEEP - 1, "a"));
        u.keep(2, keys(2, "b"));
        assert_eq!(u.count, 2, "the first file's keys forgotten");
        assert_eq!(u.take(1), (vec![], true), "told once");
        assert_eq!(u.take(2), (keys(2, "b"), false));
        u.give_back(2, keys(2, "b"), true);
        assert_eq!(
            u.take(2),
            (keys(2, "b"), true),
            "given back after a failure"
        );
    }
}
