//! Other clients' changes, pushed into this kernel's caches.
//!
//! The metadata engine reports what other clients changed ([`Change`], PostgreSQL volumes);
//! each change becomes a FUSE notification: `inval_inode` drops the kernel's attributes of an
//! inode (and its pages, if its contents changed), `inval_entry` a cached name. The same sink
//! takes this client's own changes made outside any request (the antivirus scanner's moves
//! to quarantine). Called on the engine's listening thread or the scanner's, never inside a
//! request: the kernel may make a notification wait for a request in progress on the same
//! inode or directory, which our request threads finish without waiting for these threads.
//!
//! While changes flow, the kernel may cache for long; when they stop (connection lost), the
//! adapter hands out short TTLs until they flow again ([`Coherence::pushed`]). On a volume of
//! one machine (SQLite), whether this mount is alone on it ([`Coherence::alone`]) also moves
//! the TTLs, as other mounts come and go.
//!
//! Writes this mount dropped (a close reported them failed; see `Vfs::release_dropping`)
//! are undone in the kernel too ([`Coherence::forget_dropped`]): under the writeback cache
//! the kernel keeps a file's size as its own and takes none from replies, so only a new
//! inode clears it. The file's generation moves on and its names are invalidated: the next
//! lookup answers the new generation and the kernel sets the old inode aside.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use fuser::{Generation, INodeNo, Notifier};
use parking_lot::Mutex;

use super::inodes::Inodes;
use crate::meta::{Change, ChangeSink, Ino};

#[derive(Debug, Default)]
pub struct Coherence {
    /// The session's notifier, and how the kernel numbers the volume's inodes.
    notifier: OnceLock<(Notifier, Inodes)>,
    pushed: AtomicBool,
    alone: AtomicBool,
    /// Told of each inode whose contents another client changed (passthrough's copies).
    on_data: OnceLock<DataHook>,
    /// The generation of each inode whose dropped writes made the kernel set an inode
    /// aside (0, the default, for every other).
    generations: Mutex<HashMap<Ino, u64>>,
    /// Files whose writes from the kernel's writeback cache we refused (a capacity or quota
    /// set while mounted, the store down): the kernel's pages and size still hold them.
    refused: Mutex<HashSet<Ino>>,
}

/// What [`Coherence::on_data`] calls.
pub struct DataHook(pub Box<dyn Fn(Ino) + Send + Sync>);

impl std::fmt::Debug for DataHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataHook")
    }
}

impl Coherence {
    /// Whether this mount is, as last checked, the volume's only client.
    pub fn alone(&self) -> bool {
        self.alone.load(Ordering::Acquire)
    }

    /// Whether this mount starts as the volume's only client.
    pub fn start_alone(&self, alone: bool) {
        self.alone.store(alone, Ordering::Release);
    }

    /// Records whether this mount is the volume's only client; whether that changed.
    pub fn set_alone(&self, alone: bool) -> bool {
        self.alone.swap(alone, Ordering::AcqRel) != alone
    }

    /// Whether other clients' changes reach this kernel as they happen.
    pub fn pushed(&self) -> bool {
        self.pushed.load(Ordering::Acquire)
    }

    /// The session's notifier, once mounted (changes before that have nothing to invalidate),
    /// and the mount's inode numbering.
    pub fn set_notifier(&self, n: Notifier, inodes: Inodes) {
        let _ = self.notifier.set((n, inodes));
    }

    /// The notifier and the kernel's number of the volume's inode `ino` (None: not mounted
    /// yet, or an inode this mount cannot show).
    fn target(&self, ino: Ino) -> Option<(&Notifier, INodeNo)> {
        let (n, inodes) = self.notifier.get()?;
        Some((n, inodes.notified(ino)?))
    }

    /// Drops the kernel's cached attributes of the volume's inode `ino` (not its pages).
    pub fn forget_attr(&self, ino: Ino) {
        if let Some((n, k)) = self.target(ino) {
            if let Err(e) = n.inval_inode(k, -1, 0) {
                tracing::debug!("invalidating attributes of inode {ino}: {e}");
            }
        }
    }

    /// Drops the kernel's cached attributes and pages of the volume's inode `ino`.
    pub fn forget_file(&self, ino: Ino) {
        if let Some((n, k)) = self.target(ino) {
            if let Err(e) = n.inval_inode(k, 0, 0) {
                tracing::debug!("invalidating inode {ino}: {e}");
            }
        }
    }

    /// The generation entry replies give the volume's inode `ino`.
    pub fn generation(&self, ino: Ino) -> Generation {
        Generation(self.generations.lock().get(&ino).copied().unwrap_or(0))
    }

    /// Makes the kernel forget what it caches of file `ino`, whose writes this mount dropped
    /// (a close reported them failed): its pages, and, as the kernel takes no size from our
    /// replies under the writeback cache, the inode itself: a new generation, and the
    /// entries naming it (`names`, as (directory, name)) invalidated, so that the next
    /// lookup finds the new generation and the kernel makes a fresh inode with our size,
    /// setting the old one aside (any descriptor still open on it then fails with EIO).
    /// Called at the last release of the file, before its reply: no descriptor is open, and
    /// the kernel holds no lock a notification waits for.
    pub fn forget_dropped(&self, ino: Ino, names: &[(Ino, Vec<u8>)]) {
        *self.generations.lock().entry(ino).or_insert(0) += 1;
        self.forget_file(ino);
        for (dir, name) in names {
            if let Some((n, k)) = self.target(*dir) {
                if let Err(e) = n.inval_entry(k, OsStr::from_bytes(name)) {
                    tracing::debug!("invalidating the entry of inode {ino} in {dir}: {e}");
                }
            }
        }
    }

    /// Notes that a write of file `ino` the kernel's writeback cache handed over was refused
    /// (the kernel keeps the bytes in its pages: written back is clean to it). Forgotten by
    /// [`Coherence::forget_refused`] at the next flush or release, outside the write.
    pub fn refused(&self, ino: Ino) {
        self.refused.lock().insert(ino);
    }

    /// If writes of file `ino` were refused since the last call, makes the kernel forget them
    /// ([`Coherence::forget_dropped`]; `names` gives the file's entries); whether it did.
    pub fn forget_refused(&self, ino: Ino, names: impl FnOnce() -> Vec<(Ino, Vec<u8>)>) -> bool {
        if !self.refused.lock().remove(&ino) {
            return false;
        }
        self.forget_dropped(ino, &names());
        true
    }

    /// Calls `hook` with each inode whose contents another client changed, after the
    /// kernel's pages of it are dropped (on this thread: `hook` must not wait for reads).
    pub fn on_data(&self, hook: DataHook) {
        let _ = self.on_data.set(hook);
    }

    /// Makes the kernel's size of the volume's inode `ino` at least `len`, `last` being the
    /// file's byte at `len - 1`. With the writeback cache the kernel never takes a regular
    /// file's size from our replies (it trusts its own), so a file another mount made longer
    /// would stay short here; only a stored byte moves it (FUSE_NOTIFY_STORE of nothing
    /// does not). The caller makes sure the kernel holds no dirty page there.
    pub fn grow(&self, ino: Ino, len: u64, last: u8) {
        let Some(end) = len.checked_sub(1) else {
            return;
        };
        if let Some((n, k)) = self.target(ino) {
            if let Err(e) = n.store(k, end, &[last]) {
                tracing::debug!("growing inode {ino} to {len} in the kernel: {e}");
            }
        }
    }

    /// Where the engine reports changes.
    pub fn sink(self: &Arc<Self>) -> ChangeSink {
        let me = self.clone();
        Box::new(move |c| me.apply(c))
    }

    fn apply(&self, c: Change) {
        let res = match &c {
            Change::Up => {
                self.pushed.store(true, Ordering::Release);
                Ok(())
            }
            Change::Down => {
                self.pushed.store(false, Ordering::Release);
                Ok(())
            }
            Change::Inode { ino, data } => match self.target(*ino) {
                // Offset -1: attributes only; 0 with length 0: attributes and every page.
                Some((n, k)) => n.inval_inode(k, if *data { 0 } else { -1 }, 0),
                None => Ok(()),
            },
            Change::Entry { parent, name } => match self.target(*parent) {
                Some((n, k)) => n.inval_entry(k, OsStr::from_bytes(name)),
                None => Ok(()),
            },
        };
        if let (Change::Inode { ino, data: true }, Some(h)) = (&c, self.on_data.get()) {
            (h.0)(*ino);
        }
        tracing::trace!("pushed {c:?}");
        if let Err(e) = res {
            tracing::debug!("invalidating after {c:?}: {e}");
        }
    }
}
