//! The virtual file system: POSIX operations on inodes and handles, in terms of `meta` and
//! `data`. Front ends (the FUSE adapter today) translate requests into these calls.
//!
//! Owns the open handles, one write buffer per inode being written ([`writer`]), the read path
//! ([`reader`]) and the background jobs of a mount ([`background`]).
//!
//! Not for: FUSE specifics (TTLs, reply types), SQL, object keys.

pub mod atime;
pub mod background;
pub mod export;
pub mod external;
pub mod handle;
pub mod inspect;
pub mod local;
pub mod locks;
pub mod paths;
pub mod reader;
pub mod scan;
mod unsynced;
pub mod writer;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::data::{self, DataStore};
use crate::meta::{
    self, Attr, CHUNK_SIZE, Ctx, DirEntry, FallocMode, Ino, Kind, LockKind, LockRange, LockRequest,
    Meta, ROOT_INO, RenameFlags, SetAttr, XattrSet, now_nanos, slice,
};

use handle::Handles;
use writer::{FileWriter, Privs};

/// Errors of the VFS: whatever a lower layer reported, or a POSIX outcome of its own.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Meta(#[from] meta::Error),
    #[error(transparent)]
    Data(#[from] data::Error),
    #[error("{}", std::io::Error::from_raw_os_error(*.0))]
    Sys(i32),
}

impl Error {
    pub fn errno(&self) -> i32 {
        match self {
            Error::Meta(e) => e.errno(),
            Error::Data(e) => e.errno(),
            Error::Sys(e) => *e,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

fn sys<T>(errno: i32) -> Result<T> {
    Err(Error::Sys(errno))
}

/// Settings of the VFS.
#[derive(Clone, Debug)]
pub struct Config {
    /// Bytes of unflushed writes buffered (all files) before writes flush themselves.
    pub buffer_limit: usize,
    /// Run compaction and reclaiming in the background.
    pub background: bool,
    /// Writes through O_APPEND handles go to the end of the file as the volume knows it, not
    /// where this kernel believes the end is (another client may have appended meanwhile).
    /// Off under the kernel's writeback cache, which handles O_APPEND itself.
    pub append_at_end: bool,
    /// When reads move access times (the mount's relatime, noatime or strictatime).
    pub atime: atime::Atime,
    /// Whether listing a directory moves its access time, as `atime` says (the mount's
    /// `diratime`, the default); never with `nodiratime`.
    pub diratime: bool,
    /// What a change waits for before it returns (the mount's `sync` and `dirsync`).
    pub durability: Durability,
}

/// What a change made through the VFS waits for before it returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Durable at the next `fsync`, `fsyncdir` or `close` that covers it (as on any file
    /// system); namespace changes of a mount that has the volume to itself commit in groups
    /// (`meta::sqlite::group`) meanwhile.
    #[default]
    Async,
    /// `dirsync`: a change of a directory's entries (create, mknod, mkdir, symlink, link,
    /// unlink, rmdir, rename) is durable before it returns.
    DirSync,
    /// `sync`: every change is, data included: each write is flushed and synced as by
    /// `fsync` before it returns.
    Sync,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            buffer_limit: 256 << 20,
            background: true,
            append_at_end: true,
            atime: atime::Atime::Relative,
            diratime: true,
            durability: Durability::Async,
        }
    }
}

/// What `statfs` reports.
#[derive(Clone, Debug)]
pub struct StatFs {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub files: u64,
    pub free_files: u64,
}

/// An open file.
pub struct Opened {
    pub fh: u64,
    pub attr: Attr,
    /// Whether the kernel may keep the pages it has of the file (false if the file changed
    /// elsewhere since this mount last saw it).
    pub keep: bool,
}

type SharedWriter = Arc<Mutex<FileWriter>>;

pub struct Vfs {
    meta: Arc<dyn Meta>,
    store: DataStore,
    cfg: Config,
    handles: Handles,
    writers: Mutex<HashMap<Ino, SharedWriter>>,
    buffered: AtomicUsize,
    /// Bytes applications wrote through this mount (against the bytes put: amplification).
    written: std::sync::atomic::AtomicU64,
    retired: Mutex<Retired>,
    background: Mutex<Option<background::Background>>,
    /// Access times read and not stored yet (stored by the background thread).
    atimes: Arc<atime::Atimes>,
    locks: locks::Locks,
    stamps: Mutex<HashMap<Ino, Stamp>>,
    /// Antivirus scanning of files written (`--scan`; None: off).
    scanning: Mutex<Option<scan::Scanning>>,
    /// What closed files' writers left for a later fsync to make durable.
    unsynced: Mutex<unsynced::Unsynced>,
}

/// What a file was (size and times) when this mount last opened or changed it: the kernel's
/// page cache of the file is what this version held. Another client's change shows as a
/// different stamp at the next open, which then drops the pages (close-to-open).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    length: u64,
    mtime: meta::Nanos,
    ctime: meta::Nanos,
}

impl Stamp {
    /// Files remembered at most (beyond, all are forgotten: each then loses its pages once).
    const KEEP: usize = 100_000;

    fn of(a: &Attr) -> Stamp {
        Stamp {
            length: a.length,
            mtime: a.mtime,
            ctime: a.ctime,
        }
    }
}

/// Writers removed from the map, newest last. Attributes read before such a removal may
/// predate that writer's last commit (its data was pending then, and no writer is left to
/// overlay it), so they must be read again before reaching the kernel.
#[derive(Default)]
struct Retired {
    generation: u64,
    log: std::collections::VecDeque<(u64, Ino)>,
}

impl Retired {
    const KEEP: usize = 4096;

    fn add(&mut self, ino: Ino) {
        self.generation += 1;
        self.log.push_back((self.generation, ino));
        if self.log.len() > Self::KEEP {
            self.log.pop_front();
        }
    }

    /// Whether a writer of `ino` retired after `mark` (when unsure: yes).
    fn since(&self, mark: u64, ino: Ino) -> bool {
        if self.generation == mark {
            return false;
        }
        if self.log.front().is_none_or(|(g, _)| *g > mark + 1) {
            return true;
        }
        self.log
            .iter()
            .rev()
            .take_while(|(g, _)| *g > mark)
            .any(|(_, i)| *i == ino)
    }
}

/// EPERM for an open that would change a file its flags protect: any write to an immutable
/// file, and to an append-only one any but through O_APPEND (truncation included).
fn open_allowed(a: &Attr, flags: i32) -> Result<()> {
    if a.flags & meta::flags::QUARANTINED != 0 {
        return Err(meta::Error::Sys(libc::EACCES).into());
    }
    let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
    let appends = flags & libc::O_APPEND != 0 && flags & libc::O_TRUNC == 0;
    if writes
        && (a.flags & meta::flags::IMMUTABLE != 0
            || (a.flags & meta::flags::APPEND != 0 && !appends))
    {
        return Err(meta::Error::Sys(libc::EPERM).into());
    }
    Ok(())
}

impl Vfs {
    pub fn new(meta: Arc<dyn Meta>, store: DataStore, cfg: Config) -> Vfs {
        // `sync_ino` syncs the engine right after the store: staged packs on its disk share
        // its flush (one disk flush per small sync write).
        if let Some(file) = meta.sync_file() {
            let n = store.share_flush_with(&file);
            if n > 0 {
                tracing::debug!(
                    "{n} staging directories share the flush of {}",
                    file.display()
                );
            }
        }
        // External slices (`unkai import`): the store looks their rows up as it meets them.
        let rows = Arc::downgrade(&meta);
        store.resolve_externals_with(Box::new(move |id| match rows.upgrade() {
            Some(m) => m.external(id).map_err(|e| e.to_string()),
            None => Err("the volume is closed".into()),
        }));
        let atimes = Arc::new(atime::Atimes::new(cfg.atime));
        let bg = cfg
            .background
            .then(|| background::Background::start(meta.clone(), store.clone(), atimes.clone()));
        Vfs {
            meta,
            store,
            cfg,
            handles: Handles::default(),
            writers: Mutex::new(HashMap::new()),
            buffered: AtomicUsize::new(0),
            written: Default::default(),
            retired: Mutex::new(Retired::default()),
            background: Mutex::new(bg),
            atimes,
            locks: locks::Locks::default(),
            stamps: Mutex::new(HashMap::new()),
            scanning: Mutex::new(None),
            unsynced: Mutex::default(),
        }
    }

    /// Scans what is written from now on with `scanner` (see [`scan`]); `events` gets a line
    /// for each infected file or file not scanned, `changed` each entry and inode the
    /// scanner changes (a file moved to quarantine) for the front end's caches.
    pub fn scan_with(
        &self,
        scanner: Arc<dyn scan::Scanner>,
        policy: scan::FailPolicy,
        events: scan::Events,
        changed: Option<meta::ChangeSink>,
    ) {
        *self.scanning.lock() = Some(scan::Scanning::start(
            self.meta.clone(),
            self.store.clone(),
            scanner,
            policy,
            events,
            changed,
        ));
    }

    /// Whether the antivirus scanner has nothing queued or in hand (true when scanning is off).
    pub fn scans_idle(&self) -> bool {
        self.scanning.lock().as_ref().is_none_or(|s| s.idle())
    }

    pub fn meta(&self) -> &Arc<dyn Meta> {
        &self.meta
    }

    pub fn store(&self) -> &DataStore {
        &self.store
    }

    /// The figures of the layers under the mount as its metrics: the write buffers, then
    /// the data layer's and the metadata's own.
    pub fn figures(&self, out: &mut crate::metrics::Families) {
        out.gauge(
            "unkai_memory_bytes",
            crate::metrics::MEMORY_HELP,
            &[("use", "buffers")],
            self.buffered.load(Ordering::Relaxed) as u64,
        );
        self.store.figures(out);
        self.meta.figures(out);
    }

    fn writer(&self, ino: Ino) -> Option<SharedWriter> {
        self.writers.lock().get(&ino).cloned()
    }

    fn writer_or_new(&self, ino: Ino) -> SharedWriter {
        self.writers
            .lock()
            .entry(ino)
            .or_insert_with(|| Arc::new(Mutex::new(FileWriter::new(ino))))
            .clone()
    }

    /// Commits the pending writes of `ino`, if any.
    #[track_caller]
    fn flush_ino(&self, ino: Ino) -> Result<()> {
        if let Some(w) = self.writer(ino) {
            tracing::trace!("flush inode {ino} from {}", std::panic::Location::caller());
            let mut w = w.lock();
            let before = w.buffered();
            let res = w.flush(&*self.meta, &self.store);
            self.buffered
                .fetch_sub(before - w.buffered(), Ordering::Relaxed);
            if let Some(a) = w.take_committed() {
                self.restamp(&a);
            }
            res?;
        }
        Ok(())
    }

    /// Notes the file as opened now, as `a` (just read from the engine): whether the kernel's
    /// pages of it are still good (the file has not changed since this mount last saw it).
    fn stamp_open(&self, a: &Attr) -> bool {
        let mut stamps = self.stamps.lock();
        if stamps.len() >= Stamp::KEEP && !stamps.contains_key(&a.ino) {
            stamps.clear();
        }
        stamps.insert(a.ino, Stamp::of(a)) == Some(Stamp::of(a))
    }

    /// A change of this mount committed, leaving the file as `a`: the kernel's pages follow
    /// this mount's own changes, so they stay good. (A change another client committed just
    /// before ours is not told apart; PostgreSQL's change notification covers that one.)
    fn restamp(&self, a: &Attr) {
        if let Some(s) = self.stamps.lock().get_mut(&a.ino) {
            *s = Stamp::of(a);
        }
    }

    /// Marks the attributes about to be read: pass the mark to `overlay_attr`.
    fn attr_mark(&self) -> u64 {
        self.retired.lock().generation
    }

    /// Attributes with pending writes laid over (size, mtime). `a` was read after `mark`
    /// (from `attr_mark`); if a writer of the inode committed since, `a` is read again.
    fn overlay_attr(&self, mark: u64, mut a: Attr) -> Attr {
        if a.kind == Kind::File {
            let writer = self.writer(a.ino);
            if writer.is_none() && self.retired.lock().since(mark, a.ino) {
                // Its writer committed and went away after `a` was read: `a` may predate the
                // commit, and the kernel would believe its older size.
                match self.meta.getattr(a.ino) {
                    Ok(fresh) => a = fresh,
                    Err(e) => tracing::debug!("re-reading inode {}: {e}", a.ino),
                }
            }
            if let Some(w) = writer {
                let w = w.lock();
                // `a` was read before the lock: a flush may have committed (and cleared the
                // writer) in between, so read the committed attributes again under the lock.
                match self.meta.getattr(a.ino) {
                    Ok(fresh) => a = fresh,
                    Err(e) => tracing::debug!("re-reading inode {}: {e}", a.ino),
                }
                if let Some(end) = w.pending_end() {
                    a.length = a.length.max(end);
                    // Counted as stored already (some may overwrite stored bytes), up to
                    // the size (or what is stored already: a reservation past the end).
                    a.stored = (a.stored + w.buffered() as u64).min(a.length.max(a.stored));
                }
                if let Some(m) = w.mtime() {
                    a.mtime = a.mtime.max(m);
                    a.ctime = a.ctime.max(m);
                }
            }
        }
        // A file read or a directory listed and its access time not stored yet.
        self.atimes.overlay(&mut a);
        a
    }

    /// Under `dirsync` or `sync`: the change of a directory just made is durable before it
    /// returns (the engine's group commits, its log is synced).
    fn dir_changed(&self) -> Result<()> {
        if self.cfg.durability != Durability::Async {
            self.meta.sync()?;
        }
        Ok(())
    }

    /// Under `sync`: the change of attributes (or of a file's layout) just made is durable
    /// before it returns.
    fn attr_changed(&self) -> Result<()> {
        if self.cfg.durability == Durability::Sync {
            self.meta.sync()?;
        }
        Ok(())
    }

    /// Makes the file's data and metadata durable: in the bucket (or the staging area) and
    /// in the engine.
    ///
    /// The staged pieces and the engine's commit are written out side by side: the pieces'
    /// writes start, the engine commits and starts its own, then the pieces are waited for
    /// (durable, or written before the engine's flush when that flush covers them), and only
    /// then the engine syncs: its commit never becomes durable before what it refers to.
    ///
    /// What writers of the file already closed left unsynced is made durable too (see
    /// `unsynced`): an fsync through a new descriptor covers what the old ones wrote.
    fn sync_ino(&self, ino: Ino) -> Result<()> {
        self.flush_ino(ino)?;
        let mut keys = self
            .writer(ino)
            .map(|w| w.lock().take_unsynced())
            .unwrap_or_default();
        let (closed, forgot) = self.unsynced.lock().take(ino);
        let ours = keys.len();
        keys.extend(closed);
        let res = self.sync_keys(&keys, forgot);
        if res.is_err() {
            // The next fsync tries again (the open writer's keys included).
            let rest = keys.split_off(ours);
            self.unsynced.lock().give_back(ino, rest, forgot);
            if let Some(w) = self.writer(ino) {
                w.lock().give_back_unsynced(keys);
            }
        }
        res
    }

    /// Makes `keys` durable with the engine's commits (`everything`: all that is stored on
    /// local disk too, for keys forgotten).
    fn sync_keys(&self, keys: &[String], everything: bool) -> Result<()> {
        self.store.start_sync(keys);
        self.meta.begin_sync()?;
        self.store.sync(keys)?;
        if everything {
            self.store.sync_everything()?;
        }
        Ok(self.meta.sync()?)
    }

    /// Whether another client may have joined the volume since this client was last found
    /// alone on it (see [`Meta::others_wrote`]).
    pub fn others_wrote(&self) -> bool {
        self.meta.others_wrote()
    }

    // ---- namespace ----

    pub fn lookup(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr> {
        let mark = self.attr_mark();
        Ok(self.overlay_attr(mark, self.meta.lookup(ctx, parent, name)?))
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let mark = self.attr_mark();
        Ok(self.overlay_attr(mark, self.meta.getattr(ino)?))
    }

    /// `chattr`: sets the inode's flags ([`meta::flags`]).
    /// `chattr` through a kernel whose writeback cache owns the times of regular files
    /// (`cached`): their ctime stays, as the kernel shows it (it takes none from us).
    pub fn set_flags(&self, ctx: &Ctx, ino: Ino, flags: u32, cached: bool) -> Result<Attr> {
        let mark = self.attr_mark();
        let keep = cached && self.meta.getattr(ino)?.kind == Kind::File;
        let a = self.meta.set_flags(ctx, ino, flags, keep)?;
        self.attr_changed()?;
        Ok(self.overlay_attr(mark, a))
    }

    /// Sets attributes. `chown` marks a chown that keeps both ids (chown(-1, -1), which
    /// reaches us as a SETATTR that sets nothing): like any chown, it drops setuid, setgid
    /// and file capabilities as Linux does.
    pub fn setattr(
        &self,
        ctx: &Ctx,
        ino: Ino,
        set: &SetAttr,
        size: Option<u64>,
        chown: bool,
    ) -> Result<Attr> {
        let mark = self.attr_mark();
        let mut attr = None;
        // Pending writes commit first: a truncate cuts them, and an mtime set after them
        // (utimensat, `cp -p`) must not be overwritten by their commit. Writes the kernel's
        // writeback cache sent back from its pages stamp no time at their commit
        // (`write_timed`), so the times it hands over (this setattr, sent whenever it writes
        // the inode back: at close, but also by its flusher or a syncfs between two parts of
        // one file's pages) need no commit before them. Committing there cut a file written
        // in one go into a head and a tail that went up as objects of their own (the flip of
        // the cache's default failed tests/fsck.rs so: 3 objects for two files, not 2); the
        // close's flush commits them instead, and fails the close if that fails.
        let stamped = self.writer(ino).is_some_and(|w| w.lock().mtime().is_some());
        if size.is_some() || (set.mtime.is_some() && stamped) {
            if let Err(e) = self.flush_ino(ino) {
                // Under the kernel's writeback cache, close(2) hands the times over with this
                // setattr before its flush, and fails with its error (the flush is not even
                // sent): the application is told its writes failed, as by a failed flush.
                if let Some(w) = self.writer(ino) {
                    w.lock().set_close_failed();
                }
                return Err(e);
            }
        }
        if let Some(size) = size {
            attr = Some(self.meta.truncate(ctx, ino, size)?);
            // Truncate drops what a write drops. The kernel tells whether the caller holds
            // CAP_FSETID (FATTR_KILL_SUIDGID), but fuser does not pass it on.
            attr = self.drop_privs(ino, unprivileged(ctx), true)?.or(attr);
        }
        let mut set = set.clone();
        if chown || set.uid.is_some() || set.gid.is_some() {
            // Chown of anything but a directory drops setuid, setgid where Linux's
            // `setattr_should_drop_sgid` says, and file capabilities, whoever does it
            // (chown_common, notify_change); under FUSE_HANDLE_KILLPRIV_V2 the kernel leaves
            // that to us.
            let a = self.meta.getattr(ino)?;
            if !matches!(a.kind, Kind::Dir | Kind::Symlink) {
                let mode = set.mode.unwrap_or(a.mode);
                let mut kill = mode & libc::S_ISUID;
                if mode & libc::S_ISGID != 0
                    && (mode & libc::S_IXGRP != 0 || (ctx.uid != 0 && !ctx.in_group(a.gid)))
                {
                    kill |= libc::S_ISGID;
                }
                if kill != 0 {
                    set.mode = Some(mode & !kill);
                }
                self.drop_privs(ino, None, true)?;
            }
        }
        if set.mode.is_some() {
            self.recheck_privs(ino);
        }
        let set = &set;
        if set.atime.is_some() {
            // A time set explicitly wins over one a read moved and not stored yet.
            self.atimes.forget(ino);
        }
        if set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.atime.is_some()
            || set.mtime.is_some()
        {
            attr = Some(self.meta.setattr(ctx, ino, set)?);
        }
        let a = match attr {
            Some(a) => {
                self.restamp(&a);
                self.attr_changed()?;
                a
            }
            None => self.meta.getattr(ino)?,
        };
        Ok(self.overlay_attr(mark, a))
    }

    pub fn mknod(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        kind: Kind,
        mode: u32,
        rdev: u32,
    ) -> Result<Attr> {
        let a = self.meta.mknod(ctx, parent, name, kind, mode, rdev, None)?;
        self.dir_changed()?;
        Ok(a)
    }

    pub fn symlink(&self, ctx: &Ctx, parent: Ino, name: &[u8], target: &[u8]) -> Result<Attr> {
        let a = self
            .meta
            .mknod(ctx, parent, name, Kind::Symlink, 0o777, 0, Some(target))?;
        self.dir_changed()?;
        Ok(a)
    }

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        Ok(self.meta.readlink(ino)?)
    }

    pub fn link(&self, ctx: &Ctx, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        let mark = self.attr_mark();
        let a = self.meta.link(ctx, ino, parent, name)?;
        self.restamp(&a);
        self.dir_changed()?;
        Ok(self.overlay_attr(mark, a))
    }

    pub fn unlink(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        let a = self.meta.unlink(ctx, parent, name)?;
        self.restamp(&a);
        if a.nlink == 0 {
            self.drop_writer_if_closed(a.ino);
        }
        self.dir_changed()
    }

    pub fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        self.meta.rmdir(ctx, parent, name)?;
        self.dir_changed()
    }

    pub fn rename(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        if let Some(victim) = self
            .meta
            .rename(ctx, parent, name, new_parent, new_name, flags)?
        {
            if victim.nlink == 0 {
                self.drop_writer_if_closed(victim.ino);
            }
        }
        self.dir_changed()
    }

    /// A deleted inode with no open handle has no use for pending writes.
    fn drop_writer_if_closed(&self, ino: Ino) {
        if !self.handles.any_open(ino) {
            self.discard_writer(ino);
            self.unsynced.lock().drop_file(ino);
        }
    }

    /// Throws away a file's pending writes (and their uploaded blocks); returns how many
    /// bytes they were.
    fn discard_writer(&self, ino: Ino) -> usize {
        let w = {
            let mut writers = self.writers.lock();
            let w = writers.remove(&ino);
            if w.is_some() {
                self.retired.lock().add(ino);
            }
            w
        };
        let Some(w) = w else {
            return 0;
        };
        let mut w = w.lock();
        w.retire();
        let bytes = w.buffered();
        self.buffered.fetch_sub(bytes, Ordering::Relaxed);
        w.discard(&self.store);
        bytes
    }

    /// A page of directory `ino` from `cookie`. In an hour directory of the trash, a user
    /// other than root sees only the entries they own (the trash holds everyone's deletions).
    pub fn readdir(
        &self,
        ctx: &Ctx,
        ino: Ino,
        cookie: u64,
        limit: usize,
        plus: bool,
    ) -> Result<Vec<DirEntry>> {
        Ok(self.readdir_page(ctx, ino, cookie, limit, plus)?.0)
    }

    /// Lists directory `ino` through its open handle `fh` (the kernel's READDIR): as
    /// [`readdir_page`](Self::readdir_page), but once a page has reached the end, a read
    /// from the end's cookie answers the end without asking the engine again. The kernel
    /// asks once more at the end of every listing (a round trip per directory on
    /// PostgreSQL, three of `rm -rf`'s ten per directory with the page after the last);
    /// entries made since the opendir need not show (POSIX leaves it unspecified), and a
    /// rewind (cookie 0) or any other cookie reads again.
    pub fn readdir_open(
        &self,
        ctx: &Ctx,
        fh: u64,
        ino: Ino,
        cookie: u64,
        limit: usize,
        plus: bool,
    ) -> Result<(Vec<DirEntry>, bool)> {
        let h = self.handles.get(fh);
        if let Some(h) = &h
            && cookie != 0
            && h.listed_to.load(Ordering::Relaxed) == cookie
        {
            return Ok((Vec::new(), true));
        }
        let (entries, end) = self.readdir_page(ctx, ino, cookie, limit, plus)?;
        if let Some(h) = &h
            && end
        {
            let to = entries.last().map_or(cookie, |e| e.cookie);
            h.listed_to.store(to, Ordering::Relaxed);
        }
        Ok((entries, end))
    }

    /// A page of directory `ino`'s listing from `cookie` on (at most `limit` entries), and
    /// whether it is the last (nothing follows it now).
    pub fn readdir_page(
        &self,
        ctx: &Ctx,
        ino: Ino,
        cookie: u64,
        limit: usize,
        plus: bool,
    ) -> Result<(Vec<DirEntry>, bool)> {
        let mark = self.attr_mark();
        if self.cfg.diratime && self.cfg.atime != atime::Atime::Never {
            // A listing is an access of the directory, as Linux's getdents says.
            self.atimes.read(&self.meta.getattr(ino)?, now_nanos());
        }
        let only = self.trash_owner(ctx, ino)?;
        let mut cookie = cookie;
        loop {
            let mut entries = self
                .meta
                .readdir(ino, cookie, limit, plus || only.is_some())?;
            // The engine answers fewer than asked only at the end, or one fewer in the root
            // (whose trash it reads but never lists).
            let end = entries.len() + usize::from(ino == ROOT_INO) < limit;
            let Some(last) = entries.last().map(|e| e.cookie) else {
                return Ok((entries, true));
            };
            if let Some(uid) = only {
                entries.retain(|e| {
                    e.name == b"."
                        || e.name == b".."
                        || e.attr.as_ref().is_some_and(|a| a.uid == uid)
                });
                if !plus {
                    for e in entries.iter_mut() {
                        e.attr = None;
                    }
                }
            }
            if plus {
                for e in entries.iter_mut() {
                    if let Some(a) = e.attr.take() {
                        e.attr = Some(self.overlay_attr(mark, a));
                    }
                }
            }
            if !entries.is_empty() || end {
                return Ok((entries, end));
            }
            cookie = last;
        }
    }

    /// The uid whose entries alone `ctx` sees in directory `ino`: its own, in an hour
    /// directory of the trash (`meta::trash`), unless root; `None` elsewhere.
    fn trash_owner(&self, ctx: &Ctx, ino: Ino) -> Result<Option<u32>> {
        if ctx.uid == 0 || ino == ROOT_INO {
            return Ok(None);
        }
        let dir = self.meta.getattr(ino)?;
        if dir.parent == ROOT_INO || dir.parent == 0 {
            return Ok(None);
        }
        Ok(
            match self
                .meta
                .lookup(&Ctx::ROOT, ROOT_INO, crate::meta::trash::TRASH_NAME)
            {
                Ok(t) if t.ino == dir.parent => Some(ctx.uid),
                _ => None,
            },
        )
    }

    // ---- handles ----

    /// Opens a file (see [`Opened`]).
    pub fn open(&self, ino: Ino, flags: i32) -> Result<Opened> {
        let mark = self.attr_mark();
        let a = self.meta.open_inode(ino)?;
        self.opened(mark, a, flags)
    }

    /// The rest of an open, once the meta layer has counted it (`a` as it returned).
    fn opened(&self, mark: u64, a: Attr, flags: i32) -> Result<Opened> {
        let ino = a.ino;
        if let Err(e) = open_allowed(&a, flags) {
            self.meta.close_inode(ino)?;
            return Err(e);
        }
        // Reads the kernel answers from its page cache never reach us (FUSE leaves access
        // times to the file system): under strictatime every open starts without them.
        let keep = self.stamp_open(&a) && self.cfg.atime != atime::Atime::Strict;
        if keep && flags & libc::O_ACCMODE == libc::O_RDONLY && a.kind == Kind::File {
            // Under relatime: the kernel may answer every read of this open from its pages
            // (with its writeback cache, the pages a write here left), so the open is the
            // read we see. Moves the time only as a read would (after a change, or daily).
            self.atimes.read(&a, now_nanos());
        }
        let fh = self.handles.insert(ino, flags);
        Ok(Opened {
            fh,
            attr: self.overlay_attr(mark, a),
            keep,
        })
    }

    pub fn create(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<Opened> {
        let mark = self.attr_mark();
        // The new file is opened with its create: another client's unlink or rename over
        // the name in between leaves this open an unlinked file, as POSIX has it.
        let a = match self.meta.create_open(ctx, parent, name, mode) {
            Err(e) if e.errno() == libc::EEXIST && flags & libc::O_EXCL == 0 => {
                let a = match self.open_created_elsewhere(ctx, parent, name, flags) {
                    Ok(a) => a,
                    // Gone again meanwhile: the name was taken when it was asked for.
                    Err(gone) if gone.errno() == libc::ENOENT => return Err(e.into()),
                    Err(other) => return Err(other),
                };
                self.dir_changed()?;
                return self.open(a.ino, flags);
            }
            res => res?,
        };
        if let Err(e) = self.dir_changed() {
            self.meta.close_inode(a.ino)?;
            return Err(e);
        }
        self.opened(mark, a, flags)
    }

    /// `open(O_CREAT)` without O_EXCL of a name another client created after this kernel
    /// looked it up: the file the other created is opened, as if it had been there first
    /// (checked for the access asked, truncated with O_TRUNC). Anything but a regular file
    /// is refused (the caller answers EEXIST, as before).
    fn open_created_elsewhere(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        flags: i32,
    ) -> Result<Attr> {
        let a = self.meta.lookup(ctx, parent, name)?;
        if a.kind != Kind::File {
            return sys(libc::EEXIST);
        }
        let want = match flags & libc::O_ACCMODE {
            libc::O_RDONLY => 4,
            libc::O_WRONLY => 2,
            _ => 6,
        } | if flags & libc::O_TRUNC != 0 { 2 } else { 0 };
        if !may(ctx, &a, want) {
            return sys(libc::EACCES);
        }
        if flags & libc::O_TRUNC != 0 && a.length != 0 {
            return self.setattr(ctx, a.ino, &SetAttr::default(), Some(0), false);
        }
        Ok(a)
    }

    pub fn opendir(&self, ino: Ino, flags: i32) -> Result<u64> {
        let a = self.meta.open_dir(ino)?;
        if a.kind != Kind::Dir {
            self.meta.close_dir(ino)?;
            return sys(libc::ENOTDIR);
        }
        Ok(self.handles.insert(ino, flags))
    }

    /// The byte of file `ino` at `off` (None past its end), read without moving its access
    /// time (for the FUSE layer telling its kernel a size).
    pub fn read_at(&self, ino: Ino, off: u64) -> Result<Option<u8>> {
        Ok(self.read_ino(ino, off, 1, false, false)?.first().copied())
    }

    /// Whether a descriptor of this mount may write file `ino`.
    pub fn open_for_writing(&self, ino: Ino) -> bool {
        self.handles.any_open_for_writing(ino)
    }

    fn handle(&self, fh: u64) -> Result<Arc<handle::Handle>> {
        self.handles.get(fh).ok_or(Error::Sys(libc::EBADF))
    }

    pub fn read(&self, fh: u64, off: u64, size: u32) -> Result<Vec<u8>> {
        self.read_shared(fh, off, size).map(Vec::from)
    }

    /// [`Vfs::read`], as shared bytes: a read within one block of a file this mount is not
    /// writing is a view of the memory cache's block (no copy; the FUSE reply is written
    /// from it).
    pub fn read_shared(&self, fh: u64, off: u64, size: u32) -> Result<Bytes> {
        let h = self.handle(fh)?;
        let last = h.read_end.load(Ordering::Relaxed);
        // Part of a stream: at its end, or near it (the kernel sends a stream's reads a few
        // at a time, and they may come in any order).
        let near = off == 0 || off.abs_diff(last) <= STREAM_SLACK;
        let start = h.stream_start.load(Ordering::Relaxed);
        let read = h.stream_bytes.load(Ordering::Relaxed);
        let sequential = off == 0 || last == off || (near && self.streams(read, last - start));
        let touch = h.flags & libc::O_NOATIME == 0;
        let data = self.read_ino(h.ino, off, size as usize, sequential, touch)?;
        let end = off + data.len() as u64;
        if near {
            let start = h.stream_start.fetch_min(off, Ordering::Relaxed).min(off);
            let last = h.read_end.fetch_max(end, Ordering::Relaxed).max(end);
            let read = h
                .stream_bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed)
                + data.len() as u64;
            if self.streams(read, last.saturating_sub(start)) {
                self.read_ahead(&h, end);
            }
        } else {
            // A jump: a new stream starts here, with nothing fetched ahead for it.
            h.read_end.store(end, Ordering::Relaxed);
            h.stream_start.store(off, Ordering::Relaxed);
            h.stream_bytes.store(data.len() as u64, Ordering::Relaxed);
            h.window.store(0, Ordering::Relaxed);
            h.ahead.store(0, Ordering::Relaxed);
        }
        Ok(data)
    }

    /// Whether reads that read `read` bytes over a `span` make a stream worth fetching ahead
    /// of: a quarter of a block at least, and densely (half the span or more). Random reads,
    /// even close together, do not, so they fetch no more than what they ask for.
    fn streams(&self, read: u64, span: u64) -> bool {
        read >= self.store.block_size() as u64 / 4 && read * 2 >= span
    }

    /// Keeps a stream's next blocks coming: the blocks up to `window` past where the reader
    /// is are fetched ahead (two blocks at first, doubling while the stream goes on, up to
    /// [`AHEAD_MAX`]); more are asked for when it is half way there.
    fn read_ahead(&self, h: &handle::Handle, end: u64) {
        let bs = self.store.block_size() as u64;
        let window = h.window.load(Ordering::Relaxed);
        let ahead = h.ahead.load(Ordering::Relaxed);
        if window > 0 && ahead >= end + window / 2 {
            return;
        }
        let window = if window == 0 {
            2 * bs
        } else {
            (window * 2).min(AHEAD_MAX.max(2 * bs))
        };
        let (from, to) = (ahead.max(end), end + window);
        h.window.store(window, Ordering::Relaxed);
        h.ahead.store(to, Ordering::Relaxed);
        match reader::plan(&*self.meta, h.ino, from, to - from) {
            Ok(ranges) => {
                let ranges: Vec<_> = ranges.into_iter().map(|(_, r)| r).collect();
                self.store.fetch_ahead(&ranges);
            }
            Err(e) => tracing::debug!("planning a read-ahead of inode {}: {e}", h.ino),
        }
    }

    /// Reads, moving the access time if `touch` (not an O_NOATIME descriptor). A read that
    /// lies in one block of one slice of a file with nothing pending here is a view of the
    /// memory cache's block ([`DataStore::read_shared`]: no copy); any other read (holes,
    /// several pieces or blocks, pending writes laid over) is assembled in a buffer.
    fn read_ino(
        &self,
        ino: Ino,
        off: u64,
        size: usize,
        sequential: bool,
        touch: bool,
    ) -> Result<Bytes> {
        // Hold the writer (if any) so that no flush commits between reading and overlaying.
        let w = self.writer(ino);
        let guard = w.as_ref().map(|w| w.lock());
        let a = self.meta.getattr(ino)?;
        if touch {
            self.atimes.read(&a, now_nanos());
        }
        let mut len = a.length;
        if let Some(end) = guard.as_ref().and_then(|g| g.pending_end()) {
            len = len.max(end);
        }
        if off >= len {
            return Ok(Bytes::new());
        }
        let n = (size as u64).min(len - off) as usize;
        // Planned here when nothing is pending (for the view), and used below if no view.
        let mut planned = None;
        if guard.is_none() {
            let wanted = reader::plan(&*self.meta, ino, off, n as u64)?;
            if let [(0, r)] = wanted[..]
                && r.len as usize == n
            {
                match self.store.read_shared(r, sequential) {
                    Ok(Some(b)) => return Ok(b),
                    Ok(None) => planned = Some(wanted),
                    // Replaced by a compaction since the plan: planned again below.
                    Err(data::Error::Object(crate::object::Error::NotFound(_))) => {}
                    Err(e) => return Err(e.into()),
                }
            } else {
                planned = Some(wanted);
            }
        }
        let mut buf = vec![0u8; n];
        reader::read_planned(
            &*self.meta,
            &self.store,
            ino,
            off,
            &mut buf,
            sequential,
            planned,
        )?;
        if let Some(g) = &guard {
            g.overlay(off, &mut buf);
        }
        Ok(Bytes::from(buf))
    }

    /// Writes `data` at `off` (buffered until flush). `kill_suidgid` is the writer when it
    /// lacks CAP_FSETID (the kernel says so under FUSE_HANDLE_KILLPRIV_V2): setuid and setgid
    /// then go, as file capabilities go on any write (see [`Vfs::drop_privs`]).
    /// Returns the bytes taken, and whether the file's attributes changed besides its size
    /// and times (privileges dropped: the kernel's copy is then stale).
    pub fn write(
        &self,
        fh: u64,
        off: u64,
        data: &[u8],
        kill_suidgid: Option<&Ctx>,
    ) -> Result<(u32, bool)> {
        self.write_timed(fh, off, data, kill_suidgid, true)
    }

    /// [`Vfs::write`], stamping the file's mtime and ctime at its commit only if `stamp`: the
    /// kernel's writeback cache keeps the times of the writes it sends back from its pages
    /// (it stamped them itself, and hands them over with a setattr when they moved; a write
    /// within the tick of the file's last time moves none), so their commit must not put
    /// ours, a little later, in the volume: the file's times would change at the remount.
    pub fn write_timed(
        &self,
        fh: u64,
        off: u64,
        data: &[u8],
        kill_suidgid: Option<&Ctx>,
        stamp: bool,
    ) -> Result<(u32, bool)> {
        let h = self.handle(fh)?;
        let w = self.writer_or_new(h.ino);
        self.write_with(&h, w, off, data, kill_suidgid, stamp)
    }

    /// [`Vfs::write_timed`] through writer `taken`, just taken from the mount's map, or, if
    /// the map let go of it before its lock is had here (the last release of another
    /// descriptor of the file, or a discard), through the map's writer now. Bytes buffered
    /// into a writer the map no longer holds reach no flush: the write, the unlock and the
    /// close succeed and the bytes are lost (see docs/design.md, "Writes").
    fn write_with(
        &self,
        h: &handle::Handle,
        mut taken: SharedWriter,
        off: u64,
        data: &[u8],
        kill_suidgid: Option<&Ctx>,
        stamp: bool,
    ) -> Result<(u32, bool)> {
        h.wrote.store(true, Ordering::Relaxed);
        let at_end = self.cfg.append_at_end || h.at_end.load(Ordering::Relaxed);
        let append = at_end && h.flags & libc::O_APPEND != 0;
        let mut changed = false;
        let total = loop {
            // The counter moves only under the writer's lock, as in flush: so it can never be
            // taken below zero by a flush that already counts bytes not yet added.
            let mut w = taken.lock();
            if w.retired() {
                drop(w);
                taken = self.writer_or_new(h.ino);
                continue;
            }
            let caps = !w.privs_dropped.caps;
            let suidgid = kill_suidgid.filter(|_| !w.privs_dropped.suidgid);
            if caps || suidgid.is_some() {
                changed = self.drop_privs(h.ino, suidgid, caps)?.is_some();
                w.privs_dropped.caps = true;
                w.privs_dropped.suidgid |= suidgid.is_some();
            }
            let off = if append {
                // The end as the volume knows it (another client may have appended since
                // this kernel last heard the size), or of this mount's pending writes.
                let committed = self.meta.getattr(h.ino)?.length;
                committed.max(w.pending_end().unwrap_or(0))
            } else {
                off
            };
            if off
                .checked_add(data.len() as u64)
                .is_none_or(|e| e > meta::MAX_FILE_SIZE)
            {
                return sys(libc::EFBIG);
            }
            let end = off + data.len() as u64;
            if end > w.room_to && self.meta.limited() {
                // A write past the volume's capacity or a directory's quota fails here, not
                // only at the commit (which checks again, exactly). Asked again when the file
                // passes half the room left (at most 4 MiB on), so rarely far from a limit.
                let committed = self.meta.getattr(h.ino)?.length;
                let left = match end.checked_sub(committed) {
                    Some(grow) if grow > 0 => self.meta.room_for(h.ino, grow)?,
                    _ => u64::MAX,
                };
                w.room_to = end + (left / 2).min(4 << 20);
            }
            tracing::trace!("write inode {} at {off} len {}", h.ino, data.len());
            self.written.fetch_add(data.len() as u64, Ordering::Relaxed);
            let before = w.buffered();
            let now = stamp.then(now_nanos);
            let res = w.write(&*self.meta, &self.store, off, data, now);
            let grew = w.buffered() - before;
            let total = self.buffered.fetch_add(grew, Ordering::Relaxed) + grew;
            res?;
            break total;
        };
        if total > self.cfg.buffer_limit {
            tracing::debug!(
                "write buffers full ({total} bytes): flushing inode {}",
                h.ino
            );
            // Back-pressure: a writer that fills the buffers flushes its own file.
            self.flush_ino(h.ino)?;
        }
        if self.cfg.durability == Durability::Sync {
            self.sync_ino(h.ino)?;
        }
        Ok((data.len() as u32, changed))
    }

    /// O_APPEND writes through `fh` go at the end the volume knows (with this mount's pending
    /// writes), whatever offset the kernel sends, as on a mount configured so
    /// ([`Config::append_at_end`]): for a descriptor whose writes bypass a kernel cache that
    /// otherwise decides the offset from a size of its own, which another client's appends
    /// leave behind.
    pub fn append_at_end(&self, fh: u64) {
        if let Ok(h) = self.handle(fh) {
            h.at_end.store(true, Ordering::Relaxed);
        }
    }

    /// `close()` of a descriptor: commits the file's writes so the next open sees them.
    /// If it fails, the application is told its writes failed: they are then never stored
    /// later (see [`Vfs::release`]), unless a later fsync or close of the file succeeds.
    pub fn flush(&self, fh: u64) -> Result<()> {
        let h = self.handle(fh)?;
        let res = self
            .flush_ino(h.ino)
            .and_then(|()| Ok(self.meta.share(h.ino)?));
        if res.is_err() {
            if let Some(w) = self.writer(h.ino) {
                w.lock().set_close_failed();
            }
        }
        res
    }

    pub fn release(&self, fh: u64) -> Result<()> {
        self.release_dropping(fh).map(|_| ())
    }

    /// [`Vfs::release`], saying whether it dropped writes a failed close reported (the
    /// caller's caches of the file, such as the kernel's pages and size under its writeback
    /// cache, still hold them and must forget them).
    pub fn release_dropping(&self, fh: u64) -> Result<bool> {
        let Some(h) = self.handles.remove(fh) else {
            return sys(libc::EBADF);
        };
        let last = !self.handles.any_open(h.ino);
        if last && self.writer(h.ino).is_some_and(|w| w.lock().is_dirty()) {
            // The last close of a file deleted meanwhile: its pending data has no future.
            if self
                .meta
                .getattr(h.ino)
                .map(|a| a.nlink == 0)
                .unwrap_or(true)
            {
                self.discard_writer(h.ino);
            }
        }
        let told = last && self.writer(h.ino).is_some_and(|w| w.lock().close_failed());
        let res = if told {
            // close(2) reported these writes failed: an application told so must not find
            // them written later (the durability contract), so they go now.
            let bytes = self.discard_writer(h.ino);
            tracing::error!(
                "inode {}: {bytes} bytes written are dropped, not stored: close reported the \
                 failure to store them",
                h.ino
            );
            // The kernel still caches the dropped bytes: the next open must not keep its
            // pages or attributes (see `stamp_open`).
            self.stamps.lock().remove(&h.ino);
            Ok(())
        } else {
            self.flush_ino(h.ino)
        };
        if let Err(e) = &res {
            tracing::error!("inode {}: writes could not be stored at close: {e}", h.ino);
        }
        if let Some(s) = &*self.scanning.lock() {
            s.closed(h.ino, h.wrote.load(Ordering::Relaxed), last);
        }
        if last {
            let mut writers = self.writers.lock();
            let clean = writers.get(&h.ino).is_some_and(|w| {
                let mut w = w.lock();
                // Retired under its lock: a write that took it from the map meanwhile (a
                // descriptor opened since `last` was decided) goes to the map's next one.
                let clean = !w.is_dirty();
                if clean {
                    w.retire();
                    // For a later fsync of the file (`unsynced`).
                    self.unsynced.lock().keep(h.ino, w.take_unsynced());
                }
                clean
            });
            if clean {
                writers.remove(&h.ino);
                // Under the map's lock: once the writer is gone, its retirement is known.
                self.retired.lock().add(h.ino);
            }
        }
        self.meta.close_inode(h.ino)?;
        res.map(|()| told)
    }

    /// The entries naming file `ino`: (directory, name), one per hard link.
    pub fn names_of(&self, ino: Ino) -> Result<Vec<(Ino, Vec<u8>)>> {
        Ok(self.meta.names_of(ino)?)
    }

    // ---- file locks (shared by every client of the volume; see [`locks`]) ----

    /// The lock of another owner that conflicts with `kind` over `start..=end`, if any.
    pub fn getlk(
        &self,
        ino: Ino,
        owner: u64,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Result<Option<LockRange>> {
        self.locks
            .test(self.meta.as_ref(), ino, owner, kind, start, end)
    }

    /// Sets or clears a lock; EAGAIN on a conflict unless `wait` (then until granted, or
    /// EINTR once `cancelled()`).
    pub fn setlk(
        &self,
        ino: Ino,
        fh: u64,
        owner: u64,
        req: LockRequest,
        wait: bool,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<()> {
        if req.kind.is_none() {
            // As NFS does: what was written under a lock is stored before the lock goes, so
            // the next holder (on any client) reads it.
            self.flush_ino(ino)?;
        }
        self.locks
            .set(self.meta.as_ref(), ino, fh, owner, req, wait, cancelled)
    }

    /// Whether programs coordinate through directory `dir` with locks (its entries and
    /// attributes should not be cached by the kernel; see [`locks::Locks::coordinates_in`]).
    pub fn coordinates_in(&self, dir: Ino) -> bool {
        self.locks.coordinates_in(dir)
    }

    /// A process closed a descriptor of the file: its fcntl locks on it are gone.
    pub fn locks_closed_by(&self, ino: Ino, owner: u64) -> Result<()> {
        self.locks.closed_by(self.meta.as_ref(), ino, owner)
    }

    /// An open file description ended: its flock and OFD locks are gone.
    pub fn locks_released(&self, ino: Ino, fh: u64) -> Result<()> {
        self.locks.released(self.meta.as_ref(), ino, fh)
    }

    pub fn releasedir(&self, fh: u64) -> Result<()> {
        let Some(h) = self.handles.remove(fh) else {
            return sys(libc::EBADF);
        };
        Ok(self.meta.close_dir(h.ino)?)
    }

    /// Makes the file's data and metadata durable: in the bucket and in the engine.
    pub fn fsync(&self, fh: u64) -> Result<()> {
        let h = self.handle(fh)?;
        self.sync_ino(h.ino)
    }

    pub fn fsyncdir(&self) -> Result<()> {
        Ok(self.meta.sync()?)
    }

    /// Drops what a change of a file's contents or owner takes away on Linux: setuid and
    /// setgid for `kill_suidgid` (the caller, known to lack CAP_FSETID; setgid only where
    /// [`suidgid_to_drop`] says), and its file capabilities (`security.capability`) when
    /// `caps`. Under FUSE_HANDLE_KILLPRIV_V2 the kernel leaves both to us, and in exchange
    /// no longer asks for `security.capability` before every write. Returns the new
    /// attributes if anything changed.
    fn drop_privs(&self, ino: Ino, kill_suidgid: Option<&Ctx>, caps: bool) -> Result<Option<Attr>> {
        let mut changed = None;
        // Looked up first: a read, where a removal would be a write transaction (and is
        // refused on an append-only file).
        if caps {
            match self.meta.get_xattr(ino, meta::CAPABILITY) {
                Ok(_) => {
                    self.meta.remove_xattr(&Ctx::ROOT, ino, meta::CAPABILITY)?;
                    changed = Some(self.meta.getattr(ino)?);
                }
                Err(e) if e.errno() == libc::ENODATA => {}
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(ctx) = kill_suidgid {
            let a = self.meta.getattr(ino)?;
            let kill = suidgid_to_drop(ctx, &a);
            if kill != 0 {
                let set = SetAttr {
                    mode: Some(a.mode & !kill),
                    ..SetAttr::default()
                };
                changed = Some(self.meta.setattr(&Ctx::ROOT, ino, &set)?);
            }
        }
        if let Some(a) = &changed {
            self.restamp(a);
        }
        Ok(changed)
    }

    /// Writes through this mount must check again what they drop (a chmod or an xattr set).
    fn recheck_privs(&self, ino: Ino) {
        if let Some(w) = self.writer(ino) {
            w.lock().privs_dropped = Privs::default();
        }
    }

    // ---- file data operations ----

    pub fn fallocate(&self, ctx: &Ctx, fh: u64, off: u64, len: u64, mode: i32) -> Result<Attr> {
        let h = self.handle(fh)?;
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return sys(libc::EOPNOTSUPP);
        }
        let m = FallocMode {
            keep_size: mode & libc::FALLOC_FL_KEEP_SIZE != 0,
            punch_hole: mode & libc::FALLOC_FL_PUNCH_HOLE != 0,
            zero_range: mode & libc::FALLOC_FL_ZERO_RANGE != 0,
        };
        if m.punch_hole && (!m.keep_size || m.zero_range) {
            return sys(libc::EOPNOTSUPP);
        }
        self.flush_ino(h.ino)?;
        if !m.punch_hole {
            // Space asked for must exist: past the end of the file, what the volume has free
            // (its --capacity, or the disk under a local bucket) bounds what may be promised.
            let end = off.checked_add(len).ok_or(Error::Sys(libc::EFBIG))?;
            let grow = end.saturating_sub(self.meta.getattr(h.ino)?.length);
            if grow > 0 && grow > self.statfs()?.free_bytes {
                return sys(libc::ENOSPC);
            }
        }
        let a = self.meta.fallocate(ctx, h.ino, m, off, len)?;
        self.restamp(&a);
        let a = self
            .drop_privs(h.ino, unprivileged(ctx), true)?
            .unwrap_or(a);
        self.attr_changed()?;
        Ok(a)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        ctx: &Ctx,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let (hi, ho) = (self.handle(fh_in)?, self.handle(fh_out)?);
        ho.wrote.store(true, Ordering::Relaxed);
        self.flush_ino(hi.ino)?;
        self.flush_ino(ho.ino)?;
        let (n, a) = self
            .meta
            .copy_range(ctx, hi.ino, off_in, ho.ino, off_out, len)?;
        self.restamp(&a);
        // A copy into a file is a write to it (see `write`).
        self.drop_privs(ho.ino, unprivileged(ctx), true)?;
        self.attr_changed()?;
        Ok(n)
    }

    /// SEEK_DATA / SEEK_HOLE.
    pub fn lseek(&self, fh: u64, off: u64, whence: i32) -> Result<u64> {
        let h = self.handle(fh)?;
        self.flush_ino(h.ino)?;
        let len = self.meta.getattr(h.ino)?.length;
        if off >= len {
            return sys(libc::ENXIO);
        }
        let want_data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return sys(libc::EINVAL),
        };
        let mut at = off;
        while at < len {
            let index = (at / CHUNK_SIZE) as u32;
            let base = index as u64 * CHUNK_SIZE;
            let chunk_end = (base + CHUNK_SIZE).min(len);
            let view = slice::build_view(&self.meta.read_chunk(h.ino, index)?);
            let mut pos = at;
            for p in view.iter().filter(|p| p.id != 0 && base + p.end() > at) {
                let (ps, pe) = (base + p.pos as u64, base + p.end());
                if want_data {
                    return Ok(ps.max(at).min(len));
                }
                if ps > pos {
                    return Ok(pos); // a hole before this piece
                }
                pos = pos.max(pe);
            }
            if !want_data && pos < chunk_end {
                return Ok(pos);
            }
            at = chunk_end.max(pos);
        }
        if want_data { sys(libc::ENXIO) } else { Ok(len) }
    }

    // ---- xattrs ----

    pub fn set_xattr(
        &self,
        ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        let how = match flags {
            0 => XattrSet::Any,
            libc::XATTR_CREATE => XattrSet::Create,
            libc::XATTR_REPLACE => XattrSet::Replace,
            _ => return sys(libc::EINVAL),
        };
        if inspect::is_virtual(name) {
            return sys(libc::EPERM);
        }
        self.meta.set_xattr(ctx, ino, name, value, how)?;
        if name == meta::CAPABILITY {
            self.recheck_privs(ino);
        }
        self.attr_changed()
    }

    pub fn get_xattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        if let Some(v) = self.virtual_xattr(ino, name) {
            return v;
        }
        Ok(self.meta.get_xattr(ino, name)?)
    }

    pub fn list_xattr(&self, ino: Ino) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for n in self.meta.list_xattr(ino)? {
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }

    pub fn remove_xattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<()> {
        if inspect::is_virtual(name) {
            return sys(libc::EPERM);
        }
        self.meta.remove_xattr(ctx, ino, name)?;
        self.attr_changed()
    }

    // ---- volume ----

    /// [`Vfs::statfs`] as seen from directory `dir` (the root of a subdir mount): the
    /// quota of `dir`, if it has one, bounds what is shown.
    pub fn statfs_in(&self, dir: Ino) -> Result<StatFs> {
        let mut s = self.statfs()?;
        if dir == meta::ROOT_INO || !self.meta.limited() {
            return Ok(s);
        }
        let Some(q) = self.meta.quotas()?.into_iter().find(|q| q.ino == dir) else {
            return Ok(s);
        };
        let used = q.used_bytes.max(0) as u64;
        if q.max_bytes > 0 {
            s.total_bytes = s.total_bytes.min(q.max_bytes.max(used));
            s.free_bytes = s.free_bytes.min(q.max_bytes.saturating_sub(used));
        }
        if q.max_inodes > 0 {
            let iused = q.used_inodes.max(0) as u64;
            s.files = q.max_inodes.max(iused);
            s.free_files = s.free_files.min(q.max_inodes.saturating_sub(iused));
        }
        Ok(s)
    }

    pub fn statfs(&self) -> Result<StatFs> {
        let u = self.meta.usage()?;
        let fmt = self.meta.format();
        let cap = fmt.capacity;
        let (total, free) = if cap > 0 {
            (cap, cap.saturating_sub(u.used_bytes))
        } else if let Some(root) = self.store.local_root() {
            // A local bucket: what is left is what the disk under it has left.
            match nix::sys::statvfs::statvfs(root) {
                Ok(s) => {
                    let free = s.blocks_available() * s.fragment_size();
                    (u.used_bytes + free, free)
                }
                Err(_) => (1 << 50, (1u64 << 50).saturating_sub(u.used_bytes)),
            }
        } else {
            (1 << 50, (1u64 << 50).saturating_sub(u.used_bytes))
        };
        let (files, free_files) = if fmt.inodes > 0 {
            (fmt.inodes, fmt.inodes.saturating_sub(u.inodes))
        } else {
            (u.inodes + (1 << 32), 1 << 32)
        };
        Ok(StatFs {
            total_bytes: total,
            free_bytes: free,
            files,
            free_files,
        })
    }

    /// Flushes every pending write (unmount, signal): nothing buffered is lost; and stores
    /// the access times reads moved.
    pub fn flush_all(&self) -> Result<()> {
        background::store_atimes(&*self.meta, &self.atimes);
        let writers: Vec<SharedWriter> = self.writers.lock().values().cloned().collect();
        let mut first = None;
        for w in writers {
            let mut w = w.lock();
            let before = w.buffered();
            if let Err(e) = w.flush(&*self.meta, &self.store) {
                tracing::error!("flushing at shutdown: {e}");
                first.get_or_insert(e);
            }
            self.buffered
                .fetch_sub(before - w.buffered(), Ordering::Relaxed);
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stops background work after flushing everything; call once at unmount.
    pub fn shutdown(&self) -> Result<()> {
        let res = self.flush_all();
        if let Some(s) = self.scanning.lock().take() {
            s.finish(std::time::Duration::from_secs(30));
        }
        self.background.lock().take();
        // Staged blocks go up before the session ends (its reserved ids protect them until then).
        let (blocks, bytes) = self.store.staged();
        if blocks > 0 {
            tracing::info!("uploading {blocks} staged blocks ({bytes} bytes) before unmounting");
            self.store.drain(|blocks, bytes| {
                tracing::info!("unmounting: {blocks} staged blocks ({bytes} bytes) left to upload")
            });
            tracing::info!("every staged block is uploaded");
            // Packs still live at the background's last round are sealed and committed now.
            if let Err(e) = crate::garbage::reclaim_all(&*self.meta, &self.store) {
                tracing::warn!("reclaiming dead slices: {e}");
            }
        }
        let t = self.store.traffic();
        let written = self.written.load(Ordering::Relaxed);
        let put = t.put_bytes.load(Ordering::Relaxed);
        // Amplification is a ratio to what applications wrote: without writes there is none.
        let amplification = if written > 0 {
            format!(
                " (write amplification {:.2}, compaction included)",
                put as f64 / written as f64
            )
        } else {
            String::new()
        };
        tracing::info!(
            "this mount: applications wrote {written} bytes; {put} bytes put in {} \
             objects{amplification}; {} bytes got in {} objects",
            t.puts.load(Ordering::Relaxed),
            t.get_bytes.load(Ordering::Relaxed),
            t.gets.load(Ordering::Relaxed),
        );
        if let Some(d) = self.store.disk_cache() {
            let (blocks, bytes) = d.usage();
            let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
            let st = &d.stats;
            tracing::info!(
                "disk cache: {} hits ({} bytes), {} misses, {} blocks written ({} bytes), {} \
                 evicted, {} damaged; {blocks} blocks ({bytes} bytes) cached",
                n(&st.hits),
                n(&st.hit_bytes),
                n(&st.misses),
                n(&st.written),
                n(&st.written_bytes),
                n(&st.evicted),
                n(&st.damaged),
            );
        }
        self.meta.close_session()?;
        res
    }
}

/// Whether a sticky directory `dir` lets `ctx` remove or replace its entry `victim` (only
/// its owner, the directory's or root may), as the kernel enforces it for a mount. Front ends
/// other than FUSE check it themselves (the vfs checks no permissions).
pub fn sticky_allows(ctx: &Ctx, dir: &Attr, victim: &Attr) -> bool {
    dir.mode & 0o1000 == 0 || ctx.uid == 0 || ctx.uid == dir.uid || ctx.uid == victim.uid
}

/// Whether `ctx` may access `a` for `want` (r=4, w=2, x=1) by its mode bits, as the kernel's
/// `default_permissions` checks them: root may read and write anything, and execute what has
/// an execute bit (or is a directory).
pub fn may(ctx: &Ctx, a: &Attr, want: u32) -> bool {
    if ctx.uid == 0 {
        return want & 1 == 0 || a.kind == Kind::Dir || a.mode & 0o111 != 0;
    }
    let bits = if ctx.uid == a.uid {
        a.mode >> 6
    } else if ctx.in_group(a.gid) {
        a.mode >> 3
    } else {
        a.mode
    } & 7;
    bits & want == want
}

/// The caller as one that lacks CAP_FSETID, where only its uid is known (truncate, fallocate,
/// copy_file_range: the kernel's own flag reaches us only with writes): root is taken as
/// holding it, anyone else as not.
fn unprivileged(ctx: &Ctx) -> Option<&Ctx> {
    (ctx.uid != 0).then_some(ctx)
}

/// The setuid/setgid bits a change of contents by `ctx`, a caller without CAP_FSETID, clears:
/// setuid always, setgid if the file is group-executable or the caller is not in its group.
fn suidgid_to_drop(ctx: &Ctx, a: &Attr) -> u32 {
    if a.kind != Kind::File {
        return 0;
    }
    let mut kill = a.mode & libc::S_ISUID;
    if a.mode & libc::S_ISGID != 0 && (a.mode & libc::S_IXGRP != 0 || !ctx.in_group(a.gid)) {
        kill |= libc::S_ISGID;
    }
    kill
}

/// How far ahead of a sequential reader blocks are fetched at most.
const AHEAD_MAX: u64 = 64 << 20;
/// How far from the end of the last read a read may start and still continue its stream.
const STREAM_SLACK: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::data::{Config as DataConfig, DataStore};
    use crate::meta::{Format, ROOT_INO, SetTime};
    use crate::object::ObjectStorage;

    /// A Vfs without background work over a fresh SQLite volume whose blocks of `block_size`
    /// go to a local bucket in the directory returned.
    fn scratch_vfs(block_size: u32) -> (tempfile::TempDir, Vfs) {
        let dir = tempfile::tempdir().unwrap();
        let storage = format!("file://{}", dir.path().join("bucket").display());
        let fmt = Format::for_tests("r", &storage, block_size);
        let (mdir, meta) = crate::meta::sqlite::scratch(&fmt);
        std::mem::forget(mdir);
        let obj = ObjectStorage::open(&fmt.storage, true).unwrap();
        let store = DataStore::new(obj, fmt.clone(), DataConfig::default()).unwrap();
        let cfg = Config {
            background: false,
            ..Config::default()
        };
        (dir, Vfs::new(meta, store, cfg))
    }

    /// A file of 32 blocks of 64 KiB, written through one data store; returns the volume's
    /// metadata, a Vfs over a fresh data store (nothing cached), the file and its bytes.
    fn cold_file() -> (tempfile::TempDir, Vfs, Ino, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let storage = format!("file://{}", dir.path().join("bucket").display());
        let fmt = Format::for_tests("r", &storage, 64 << 10);
        let (_mdir, meta) = crate::meta::sqlite::scratch(&fmt);
        let open = || {
            let obj = ObjectStorage::open(&fmt.storage, true).unwrap();
            DataStore::new(obj, fmt.clone(), DataConfig::default()).unwrap()
        };
        let f = meta
            .mknod(&Ctx::ROOT, ROOT_INO, b"f", Kind::File, 0o644, 0, None)
            .unwrap();
        let data: Vec<u8> = (0..32u32 << 16).map(|i| (i % 253) as u8).collect();
        let mut w = FileWriter::new(f.ino);
        w.write(&*meta, &open(), 0, &data, 1).unwrap();
        w.flush(&*meta, &open()).unwrap();
        let cfg = Config {
            background: false,
            ..Config::default()
        };
        let vfs = Vfs::new(meta, open(), cfg);
        std::mem::forget(_mdir);
        (dir, vfs, f.ino, data)
    }

    /// An fsync through a new descriptor makes durable what closed ones wrote (a local
    /// bucket's objects sit in the page cache until then), as a local file system's fsync
    /// does: `sync FILE`, or open, fsync, close after writing. A deleted file's are dropped.
    #[test]
    fn an_fsync_after_the_close_makes_the_closed_writes_durable() {
        let (_dir, vfs) = scratch_vfs(256 << 10);
        let synced = || vfs.store().traffic().synced.load(Relaxed);
        let data: Vec<u8> = (0..600_000u32).map(|i| (i % 249) as u8).collect();
        let mut inos = Vec::new();
        for name in [&b"kept"[..], b"deleted"] {
            let f = vfs
                .meta
                .mknod(&Ctx::ROOT, ROOT_INO, name, Kind::File, 0o644, 0, None)
                .unwrap();
            for half in [&data[..300_000], &data[300_000..]] {
                let fh = vfs.open(f.ino, libc::O_WRONLY | libc::O_APPEND).unwrap().fh;
                let at = vfs.getattr(f.ino).unwrap().length;
                vfs.write(fh, at, half, None).unwrap();
                vfs.flush(fh).unwrap();
                vfs.release(fh).unwrap();
            }
            inos.push(f.ino);
        }
        assert_eq!(synced(), 0, "nothing synced before an fsync");
        // Two slices of 300,000 bytes, each two blocks (256 KiB and the rest).
        let fh = vfs.open(inos[0], libc::O_RDONLY).unwrap().fh;
        vfs.fsync(fh).unwrap();
        assert_eq!(synced(), 4, "both closed writers' blocks");
        vfs.fsync(fh).unwrap();
        assert_eq!(synced(), 4, "once");
        assert_eq!(vfs.read(fh, 0, 1 << 20).unwrap(), data);
        vfs.release(fh).unwrap();
        vfs.unlink(&Ctx::ROOT, ROOT_INO, b"deleted").unwrap();
        assert_eq!(vfs.unsynced.lock().take(inos[1]), (vec![], false));
    }

    /// The kernel's writeback cache may send one file's pages in two parts with its times
    /// between them (its flusher, or a syncfs, writes the inode back after the first part):
    /// the times need no commit of writes that stamp none, so the tail joins its head and the
    /// file goes up as one slice, one object, as without the cache (tests/fsck.rs counts
    /// them). Writes that stamp their time still commit before an mtime set after them.
    #[test]
    fn times_handed_over_between_writebacks_do_not_cut_the_file() {
        let (_dir, vfs) = scratch_vfs(4 << 20);
        let puts = || vfs.store().traffic().puts.load(Relaxed);
        let data: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
        let times = SetAttr {
            mtime: Some(SetTime::At(now_nanos())),
            ctime: Some(now_nanos()),
            ..SetAttr::default()
        };
        for (name, stamp) in [(&b"cached"[..], false), (&b"stamped"[..], true)] {
            let f = vfs
                .meta
                .mknod(&Ctx::ROOT, ROOT_INO, name, Kind::File, 0o644, 0, None)
                .unwrap();
            let fh = vfs.open(f.ino, libc::O_RDWR).unwrap().fh;
            let before = puts();
            vfs.write_timed(fh, 0, &data[..512 << 10], None, stamp)
                .unwrap();
            vfs.setattr(&Ctx::ROOT, f.ino, &times, None, false).unwrap();
            vfs.write_timed(fh, 512 << 10, &data[512 << 10..], None, stamp)
                .unwrap();
            vfs.flush(fh).unwrap();
            vfs.release(fh).unwrap();
            let recs = vfs.meta.read_chunk(f.ino, 0).unwrap();
            let (want_recs, want_puts) = if stamp { (2, 2) } else { (1, 1) };
            assert_eq!(recs.len(), want_recs, "{name:?}: {recs:?}");
            assert_eq!(puts() - before, want_puts, "{name:?}: objects put");
            let fh = vfs.open(f.ino, libc::O_RDONLY).unwrap().fh;
            assert_eq!(vfs.read(fh, 0, 1 << 20).unwrap(), data, "{name:?}");
            vfs.release(fh).unwrap();
        }
    }

    /// A read within one block is a view of the memory cache's block (two reads of it share
    /// their bytes: nothing copied); reads across blocks, past the end, over a hole, or of
    /// a file with writes pending here take the copying path, and every read returns the
    /// file's bytes, the pending ones laid over.
    #[test]
    fn a_read_within_one_block_is_a_view_of_the_cached_block() {
        let (_dir, vfs) = scratch_vfs(64 << 10);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 249) as u8).collect();
        let f = vfs
            .meta
            .mknod(&Ctx::ROOT, ROOT_INO, b"f", Kind::File, 0o644, 0, None)
            .unwrap();
        let fh = vfs.open(f.ino, libc::O_RDWR).unwrap().fh;
        vfs.write(fh, 0, &data, None).unwrap();
        // A hole, then 10 bytes at 300,000.
        vfs.write(fh, 300_000, b"after hole", None).unwrap();
        vfs.release(fh).unwrap();
        let mut want = data.clone();
        want.resize(300_000, 0);
        want.extend_from_slice(b"after hole");
        let fh = vfs.open(f.ino, libc::O_RDONLY).unwrap().fh;
        let one = vfs.read_shared(fh, 1000, 4096).unwrap();
        let two = vfs.read_shared(fh, 1000, 4096).unwrap();
        assert_eq!(&one[..], &want[1000..5096]);
        assert_eq!(one.as_ptr(), two.as_ptr(), "both views of the cached block");
        let b = 64 << 10;
        for (off, len) in [
            (b - 100, 200),
            (0, 200_000),
            (199_000, 120_000),
            (310_000, 10),
        ] {
            let got = vfs.read_shared(fh, off as u64, len).unwrap();
            let end = (off + len as usize)
                .min(want.len())
                .max(off.min(want.len()));
            assert!(
                got[..] == want[off.min(want.len())..end],
                "read of {len} at {off}"
            );
        }
        // Written here, not flushed: the pending bytes are read.
        let w = vfs.open(f.ino, libc::O_RDWR).unwrap().fh;
        vfs.write(w, 1010, b"pending", None).unwrap();
        let got = vfs.read_shared(fh, 1000, 4096).unwrap();
        assert_eq!(&got[10..17], b"pending");
        assert_eq!(&got[..10], &want[1000..1010]);
        assert_eq!(&got[17..], &want[1017..5096]);
        vfs.release(w).unwrap();
        vfs.release(fh).unwrap();
    }

    /// A write that took the file's writer from the mount's map just before the last release
    /// of another descriptor let go of it (clean, so the map drops it) still reaches the
    /// volume: it finds the writer retired once it holds its lock, and buffers into the
    /// map's. Before, its bytes went into the dropped writer, which no flush finds: close
    /// succeeded and the bytes were lost.
    #[test]
    fn a_write_racing_the_last_release_is_not_lost() {
        let (_dir, vfs) = scratch_vfs(64 << 10);
        let f = vfs
            .meta
            .mknod(&Ctx::ROOT, ROOT_INO, b"log", Kind::File, 0o644, 0, None)
            .unwrap();
        let first = vfs.open(f.ino, libc::O_WRONLY).unwrap().fh;
        vfs.write_timed(first, 0, b"first ", None, true).unwrap();
        // The next write's first step, on a descriptor about to be opened ...
        let taken = vfs.writer_or_new(f.ino);
        // ... then the last release: it commits "first " and lets the clean writer go.
        vfs.release(first).unwrap();
        assert!(vfs.writer(f.ino).is_none(), "the map let go of the writer");
        let second = vfs.open(f.ino, libc::O_WRONLY).unwrap().fh;
        let h = vfs.handle(second).unwrap();
        vfs.write_with(&h, taken, 6, b"second", None, true).unwrap();
        vfs.release(second).unwrap();
        let fh = vfs.open(f.ino, libc::O_RDONLY).unwrap().fh;
        assert_eq!(vfs.read(fh, 0, 100).unwrap(), b"first second");
        vfs.release(fh).unwrap();
    }

    /// Reads that come a little out of order still make a stream, whose next blocks are
    /// fetched ahead (each once); a jump far away starts over with nothing fetched ahead, and
    /// random reads fetch only what they ask for.
    #[test]
    fn streams_fetch_ahead_and_random_reads_do_not() {
        let (_d, vfs, ino, data) = cold_file();
        let fh = vfs.open(ino, libc::O_RDONLY).unwrap().fh;
        let h = vfs.handle(fh).unwrap();
        let gets = || vfs.store().traffic().gets.load(Relaxed);
        let k = 16 << 10;
        // The kernel's order: 0, 2, 1, 3, ... (pairs swapped), 16 KiB each, 4 blocks' worth.
        for i in 0..16u64 {
            let j = i ^ 1;
            let got = vfs.read(fh, j * k, k as u32).unwrap();
            assert_eq!(got, data[(j * k) as usize..((j + 1) * k) as usize]);
        }
        assert!(
            h.ahead.load(Relaxed) > 4 * (64 << 10),
            "no read-ahead for the stream"
        );
        // Blocks up to the window come without being read (each block once).
        let deadline = Instant::now() + Duration::from_secs(60);
        while gets() < 8 {
            assert!(
                Instant::now() < deadline,
                "nothing fetched ahead: {} GETs",
                gets()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        for i in 16..128u64 {
            let got = vfs.read(fh, i * k, k as u32).unwrap();
            assert_eq!(got, data[(i * k) as usize..((i + 1) * k) as usize]);
        }
        // Every block once (the first read, not a stream yet, got its range: two requests).
        let fetched = gets();
        assert!(
            fetched <= 32 + 2,
            "blocks fetched twice: {fetched} GETs for 32 blocks"
        );
        // A jump: a new stream, nothing ahead.
        vfs.read(fh, 4096, 4096).unwrap();
        assert_eq!(h.ahead.load(Relaxed), 0);
        vfs.release(fh).unwrap();
        // Random 4 KiB reads on a fresh handle and a cold store: no read-ahead; two range
        // requests each (data and checksums), nothing more.
        let (_d, vfs, ino, data) = cold_file();
        let fh = vfs.open(ino, libc::O_RDONLY).unwrap().fh;
        let h = vfs.handle(fh).unwrap();
        let mut rng = 7u64;
        let mut reads = 0;
        for _ in 0..40 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = 4096 + (rng >> 33) % ((32 << 16) - 8192) / 4096 * 4096;
            let got = vfs.read(fh, off, 4096).unwrap();
            assert_eq!(got, data[off as usize..off as usize + 4096]);
            reads += 1;
            assert_eq!(
                h.ahead.load(Relaxed),
                0,
                "read-ahead for a random read at {off}"
            );
        }
        let gets = vfs.store().traffic().gets.load(Relaxed);
        assert!(gets <= 2 * reads, "{gets} GETs for {reads} random reads");
        vfs.release(fh).unwrap();
    }
}
