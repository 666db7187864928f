//! Access times of files read and directories listed through this mount: when a read that
//! reaches unkai (or a listing, unless the mount says `nodiratime`) moves an inode's atime
//! (the mount's `relatime`, `strictatime` or `noatime`, as Linux decides it), and the new
//! times waiting to be stored. They are stored in groups, one transaction for all of them,
//! by the background thread (and at unmount), never by the read itself (which is what
//! `lazytime` asks of Linux file systems); until then `getattr` shows them.
//!
//! Not for: other attributes.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::meta::{Attr, Ino, Nanos};

/// When a read moves the access time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Atime {
    /// `relatime` (Linux's default): when the access time is not after the last change, or
    /// is a day old.
    #[default]
    Relative,
    /// `noatime`: never.
    Never,
    /// `strictatime`: on every read.
    Strict,
}

const DAY: Nanos = 86_400 * 1_000_000_000;

/// Access times read and not stored yet.
#[derive(Default)]
pub struct Atimes {
    mode: Atime,
    pending: Mutex<HashMap<Ino, Nanos>>,
}

impl Atimes {
    pub fn new(mode: Atime) -> Atimes {
        Atimes {
            mode,
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// A read of the file `a` (or a listing of the directory `a`), as the engine has it, at
    /// `now`.
    pub fn read(&self, a: &Attr, now: Nanos) {
        if self.mode == Atime::Never {
            return;
        }
        let mut pending = self.pending.lock();
        let atime = pending.get(&a.ino).map_or(a.atime, |&p| p.max(a.atime));
        let change = a.mtime.max(a.ctime);
        let due = match self.mode {
            Atime::Strict => now > atime,
            // Linux's relatime_need_update.
            _ => atime <= change || now - atime >= DAY,
        };
        if due {
            // Under the coarse clock (the kernel's writeback cache, 4 ms ticks) a change in the
            // read's own tick has the read's time: relatime takes an access time equal to it as
            // not after the change, and the next read would move it again. That change may be
            // seen before the read, or only after it (the kernel sends a file's times when it
            // writes the inode back: a full suite caught the second read moving it once more).
            // One nanosecond after the read is after either.
            let t = match self.mode {
                Atime::Relative => now + 1,
                _ => now,
            };
            pending.insert(a.ino, t);
        }
    }

    /// Drops the access time a read moved and not stored yet (one set explicitly wins).
    pub fn forget(&self, ino: Ino) {
        self.pending.lock().remove(&ino);
    }

    /// Shows a read's access time not stored yet.
    pub fn overlay(&self, a: &mut Attr) {
        if let Some(&p) = self.pending.lock().get(&a.ino) {
            a.atime = a.atime.max(p);
        }
    }

    /// The access times to store. They stay here, shown and counted by relatime, until
    /// [`Atimes::stored`] says the engine has them: taken out before, a read while they were
    /// being stored found them neither here nor in the engine and moved the time again (a
    /// full suite caught relatime moving it twice, one tick apart).
    pub fn to_store(&self) -> Vec<(Ino, Nanos)> {
        self.pending.lock().iter().map(|(&i, &t)| (i, t)).collect()
    }

    /// Forgets the times the engine now has (`times`, from [`Atimes::to_store`]); one a read
    /// moved further meanwhile stays, for the next round.
    pub fn stored(&self, times: &[(Ino, Nanos)]) {
        let mut pending = self.pending.lock();
        for (ino, t) in times {
            if pending.get(ino) == Some(t) {
                pending.remove(ino);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Kind;

    /// What a round of the background thread stores, stored.
    fn store(t: &Atimes) -> Vec<(Ino, Nanos)> {
        let times = t.to_store();
        t.stored(&times);
        times
    }

    fn file(atime: Nanos, mtime: Nanos) -> Attr {
        Attr {
            ino: 7,
            kind: Kind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            length: 1,
            rdev: 0,
            atime,
            mtime,
            ctime: mtime,
            parent: 0,
            flags: 0,
            stored: 0,
        }
    }

    #[test]
    fn relatime_moves_an_access_time_older_than_the_change_or_a_day() {
        let t = Atimes::new(Atime::Relative);
        // Read after a change: moves (one nanosecond after the read, see `read`).
        t.read(&file(100, 200), 1_000);
        assert_eq!(store(&t), vec![(7, 1_001)]);
        // Read again soon after: stays (the stored atime is now after the change).
        t.read(&file(1_001, 200), 2_000);
        assert!(store(&t).is_empty());
        // A day later: moves.
        t.read(&file(1_001, 200), 1_001 + DAY);
        assert_eq!(store(&t), vec![(7, 1_002 + DAY)]);
    }

    #[test]
    fn a_read_in_the_tick_of_a_change_moves_the_access_time_once() {
        // The coarse clock gives the change and the read one time, whether the change was
        // seen before the read (CI caught the second read moving it again, one tick later) or
        // only after it (the kernel's times of a file come with its inode's write-back).
        for seen_at_read in [file(100, 5_000), file(100, 200)] {
            let t = Atimes::new(Atime::Relative);
            t.read(&seen_at_read, 5_000);
            let mut a = file(100, 5_000);
            t.overlay(&mut a);
            assert!(a.atime > a.mtime && a.atime > a.ctime, "{a:?}");
            t.read(&a, 9_000);
            let mut b = file(100, 5_000);
            t.overlay(&mut b);
            assert_eq!(
                b.atime, a.atime,
                "relatime moved it twice ({seen_at_read:?})"
            );
        }
    }

    #[test]
    fn a_read_while_the_time_is_being_stored_does_not_move_it_again() {
        let t = Atimes::new(Atime::Relative);
        t.read(&file(100, 200), 1_000);
        let storing = t.to_store();
        assert_eq!(storing, vec![(7, 1_001)]);
        // The engine does not have it yet: a read sees the old time there, and this one.
        t.read(&file(100, 200), 5_000);
        let mut a = file(100, 200);
        t.overlay(&mut a);
        assert_eq!(a.atime, 1_001, "relatime moved it twice");
        t.stored(&storing);
        assert!(t.to_store().is_empty());
        // A time a read moves further while an older one is being stored stays to be stored.
        t.read(&file(1_001, 7_000), 8_000);
        let storing = t.to_store();
        assert_eq!(storing, vec![(7, 8_001)]);
        t.read(&file(1_001, 9_000), 10_000);
        t.stored(&storing);
        assert_eq!(t.to_store(), vec![(7, 10_001)]);
    }

    #[test]
    fn strictatime_moves_on_every_read_and_noatime_never() {
        let s = Atimes::new(Atime::Strict);
        s.read(&file(1_000, 200), 2_000);
        s.read(&file(1_000, 200), 3_000);
        let mut a = file(1_000, 200);
        s.overlay(&mut a);
        assert_eq!(a.atime, 3_000);
        assert_eq!(store(&s), vec![(7, 3_000)]);
        let n = Atimes::new(Atime::Never);
        n.read(&file(100, 200), 1_000);
        assert!(store(&n).is_empty());
    }
}
