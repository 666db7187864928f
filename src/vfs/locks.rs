//! File locks as the kernel asks for them: test, set, wait for, and drop at close. The locks
//! themselves live in the metadata engine, shared by every client of the volume
//! ([`crate::meta::lock`]); this module remembers which owners locked through this mount, so
//! that a close costs nothing when no lock was taken, and wakes local waiters when a lock is
//! dropped here (waits on locks of other clients poll, backing off).
//!
//! Not for: range arithmetic or conflicts (meta::lock), the kernel's request format (fuse).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::meta::{Ino, LockKind, LockRange, LockRequest, Meta};

use super::{Result, sys};

/// The end of a range that runs to the end of any file.
pub const WHOLE: u64 = u64::MAX;

/// Shortest and longest pause between two attempts of a blocked lock.
const FIRST_WAIT: Duration = Duration::from_millis(2);
const LONGEST_WAIT: Duration = Duration::from_millis(100);

#[derive(Default)]
pub struct Locks {
    /// (inode, owner) that set a lock through this mount, and the handles it used: a close
    /// of the owner (fcntl locks) or the release of such a handle (flock, OFD locks) drops
    /// the owner's locks on the inode.
    held: Mutex<HashMap<(Ino, u64), HashSet<u64>>>,
    /// Inodes locked through this mount, and their directories: the places where programs
    /// coordinate through the volume (a database and its journal, a mail spool), whose
    /// names and attributes the kernel must not cache (see [`Locks::coordinates_in`]).
    locked: Mutex<(HashSet<Ino>, HashSet<Ino>)>,
    /// Bumped whenever this mount drops a lock, to wake its waiters at once.
    dropped: Mutex<u64>,
    wake: Condvar,
}

impl Locks {
    /// The lock of another owner (of any client) that conflicts with `kind` over `start..=end`.
    pub fn test(
        &self,
        meta: &dyn Meta,
        ino: Ino,
        owner: u64,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Result<Option<LockRange>> {
        Ok(meta.getlk(ino, owner, kind, start, end)?)
    }

    /// Locks (`req.kind` set) or unlocks a range for `owner`, through handle `fh`. On a
    /// conflict: EAGAIN, or with `wait`, tries again until granted or `cancelled()` (EINTR).
    #[allow(clippy::too_many_arguments)]
    pub fn set(
        &self,
        meta: &dyn Meta,
        ino: Ino,
        fh: u64,
        owner: u64,
        req: LockRequest,
        wait: bool,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<()> {
        let mut pause = FIRST_WAIT;
        loop {
            let seen = *self.dropped.lock();
            if req.kind.is_some() {
                // Noted before asking: a close racing with the grant still drops the lock.
                self.held.lock().entry((ino, owner)).or_default().insert(fh);
            }
            match meta.setlk(ino, owner, req)? {
                None => {
                    if req.kind.is_none() {
                        self.woke();
                    } else if !self.locked.lock().0.contains(&ino) {
                        let dir = meta.getattr(ino).map(|a| a.parent).unwrap_or(0);
                        let mut l = self.locked.lock();
                        l.0.insert(ino);
                        l.1.insert(dir);
                    }
                    return Ok(());
                }
                Some(_) if !wait => return sys(libc::EAGAIN),
                Some(_) => {
                    if cancelled() {
                        return sys(libc::EINTR);
                    }
                    let mut d = self.dropped.lock();
                    if *d == seen {
                        self.wake.wait_for(&mut d, pause);
                    }
                    pause = (pause * 2).min(LONGEST_WAIT);
                }
            }
        }
    }

    /// Whether a file of directory `dir` was locked through this mount. Programs that lock
    /// a file coordinate with other clients through that directory (SQLite's journal comes
    /// and goes beside the database): the kernel gets no cache time for its entries, so
    /// that a name created or removed by another client is seen at once.
    pub fn coordinates_in(&self, dir: Ino) -> bool {
        let l = self.locked.lock();
        !l.1.is_empty() && l.1.contains(&dir)
    }

    /// A close by `owner` (fcntl locks: any close by the process drops its locks on the file).
    pub fn closed_by(&self, meta: &dyn Meta, ino: Ino, owner: u64) -> Result<()> {
        if self.held.lock().remove(&(ino, owner)).is_none() {
            return Ok(());
        }
        self.unlock_all(meta, ino, owner)
    }

    /// The release of handle `fh` (flock and OFD locks belong to the open file description).
    ///
    /// The kernel sends a release after close(2) has returned, and names the flock owner by
    /// the address of the closed file, which a later open may already reuse: a program that
    /// loops open, flock, write, unlock, close can hold its next lock, under the same owner,
    /// when the release of its previous file arrives (dropping that lock let another writer
    /// append over its line). So an owner's locks go only with the last handle it locked
    /// through; the release of an older handle leaves them. The map stays locked until the
    /// locks are dropped, so that a lock being taken through another handle (noted in the map
    /// before it is asked for) is never dropped by this release.
    pub fn released(&self, meta: &dyn Meta, ino: Ino, fh: u64) -> Result<()> {
        let mut held = self.held.lock();
        if held.is_empty() {
            return Ok(());
        }
        let mut owners = Vec::new();
        held.retain(|(i, o), fhs| {
            if *i != ino || !fhs.remove(&fh) {
                return true;
            }
            if fhs.is_empty() {
                owners.push(*o);
                false
            } else {
                true
            }
        });
        let mut first_err = Ok(());
        for o in owners {
            if let Err(e) = self.unlock_all(meta, ino, o) {
                tracing::error!("inode {ino}: could not drop the locks of a closed file: {e}");
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
        first_err
    }

    fn unlock_all(&self, meta: &dyn Meta, ino: Ino, owner: u64) -> Result<()> {
        meta.setlk(
            ino,
            owner,
            LockRequest {
                kind: None,
                start: 0,
                end: WHOLE,
                pid: 0,
            },
        )?;
        self.woke();
        Ok(())
    }

    fn woke(&self) {
        *self.dropped.lock() += 1;
        self.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::meta::format::SCHEMA_VERSION;
    use crate::meta::{Ctx, Format, Kind, LockKind, ROOT_INO};

    fn meta() -> (tempfile::TempDir, Arc<dyn Meta>) {
        let fmt: Format = serde_json::from_value(serde_json::json!({
            "name": "locks", "uuid": "u", "storage": "memory://", "block_size": 65536,
            "trash_days": 0, "created": 0, "schema": SCHEMA_VERSION,
        }))
        .unwrap();
        crate::meta::sqlite::scratch(&fmt)
    }

    /// open, flock, unlock, close, then open again at the same file address (the flock
    /// owner) and flock, before the kernel's release of the first file arrives: that release
    /// must not drop the second file's lock.
    #[test]
    fn a_late_release_leaves_the_lock_a_reused_owner_took_since() {
        let (_dir, meta) = meta();
        let ino = meta
            .mknod(&Ctx::ROOT, ROOT_INO, b"log", Kind::File, 0o644, 0, None)
            .unwrap()
            .ino;
        let locks = Locks::default();
        let ex = LockRequest {
            kind: Some(LockKind::Write),
            start: 0,
            end: WHOLE,
            pid: 1,
        };
        let un = LockRequest { kind: None, ..ex };
        let never = || false;
        const OWNER: u64 = 0xfeed;
        const OTHER: u64 = 0xbeef;
        locks.set(&*meta, ino, 1, OWNER, ex, false, &never).unwrap();
        locks.set(&*meta, ino, 1, OWNER, un, false, &never).unwrap();
        locks.set(&*meta, ino, 2, OWNER, ex, false, &never).unwrap();
        locks.released(&*meta, ino, 1).unwrap();
        assert!(
            locks.set(&*meta, ino, 3, OTHER, ex, false, &never).is_err(),
            "the release of the closed file dropped the lock of the open one"
        );
        locks.released(&*meta, ino, 2).unwrap();
        locks.set(&*meta, ino, 3, OTHER, ex, false, &never).unwrap();
    }
}
