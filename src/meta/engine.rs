//! What a metadata engine provides, so that every [`Meta`](super::Meta) operation is written
//! once (in `ops`) over any database: transactions ([`Engine`]) and the rows they read and
//! write ([`Txn`]: nodes, entries, chunks' slice records, slice references, xattrs, sessions,
//! open-file records, locks, counters).
//!
//! Methods with a default body are the plain way; an engine overrides one where it can do the
//! same in fewer round trips (PostgreSQL's combined statements and row locks). Every method
//! runs inside the transaction it is called on, and none decides anything POSIX: what an
//! operation means lives in `ops`.
//!
//! Not for: SQL (each engine's own module), caching, file data.

use super::lock::{LockOwner, LockRange};
use super::slice::SliceRec;
use super::{Attr, Change, ChangeSink, DeadSlice, DirEntry, EngineKind, Error, Ino, Kind, Nanos};
use super::{Result, Usage};

/// How a statement or a transaction failed: a POSIX outcome or an engine failure (ended), or
/// a conflict with another transaction (`Conflict`: the engine runs it again).
#[derive(Debug)]
pub enum TxError {
    Meta(Error),
    Conflict(String),
}

impl From<Error> for TxError {
    fn from(e: Error) -> Self {
        TxError::Meta(e)
    }
}

impl TxError {
    /// The error a caller sees (a conflict that escaped its retries is an engine failure).
    pub(crate) fn into_meta(self) -> Error {
        match self {
            TxError::Meta(m) => m,
            TxError::Conflict(why) => Error::Engine(why),
        }
    }

    /// Whether this is a POSIX outcome (not a failure of the engine).
    pub(crate) fn is_posix(&self) -> bool {
        matches!(self, TxError::Meta(Error::Sys(_)))
    }

    /// Whether this is the POSIX outcome `errno`.
    pub(crate) fn is_sys(&self, errno: i32) -> bool {
        matches!(self, TxError::Meta(Error::Sys(e)) if *e == errno)
    }
}

/// The result of a statement inside a transaction.
pub type TxResult<T> = std::result::Result<T, TxError>;

/// A POSIX outcome, inside a transaction.
pub(crate) fn fail<T>(errno: i32) -> TxResult<T> {
    Err(TxError::Meta(Error::Sys(errno)))
}

/// Damaged metadata, inside a transaction.
pub(crate) fn corrupt(what: String) -> TxError {
    TxError::Meta(Error::Engine(what))
}

/// `Ok(None)` for ENOENT: for rows that may be gone by the time they are looked at.
pub(crate) fn unless_gone<T>(r: TxResult<T>) -> TxResult<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_sys(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A session as stored: (id, its `SessionInfo` as JSON, last heartbeat).
pub type SessionRow = (u64, String, Nanos);

/// Transactions of one engine.
pub trait Engine: Send + Sync + 'static {
    /// Whether every open is recorded in the volume from the start (PostgreSQL). If not
    /// (SQLite), a client counts its opens in memory, keeps an unlinked inode it has open
    /// itself (a `sustained` row), and records opens only once another client shares the
    /// volume.
    const RECORDS_OPENS: bool;

    fn kind(&self) -> EngineKind;

    /// Runs `f` in one write transaction, again from the start after a conflict. `lock`: the
    /// inodes `f` will lock (an engine with row locks may lock them in its first round trip);
    /// `rename_lock`: the volume's lock on moves between directories.
    fn write<T>(
        &self,
        lock: &[Ino],
        rename_lock: bool,
        f: impl FnMut(&mut dyn Txn) -> TxResult<T>,
    ) -> Result<T>;

    /// Runs `f`, which makes one statement that is atomic on its own (it may write): outside
    /// an explicit transaction where the engine allows that, else in a write transaction.
    fn single<T>(&self, f: impl FnMut(&mut dyn Txn) -> TxResult<T>) -> Result<T>;

    /// Runs `f`, which only reads; statements need not see one snapshot.
    fn read<T>(&self, f: impl FnMut(&mut dyn Txn) -> TxResult<T>) -> Result<T>;

    /// Runs `f`, which only reads, in one snapshot (its statements agree).
    fn snapshot<T>(&self, f: impl FnMut(&mut dyn Txn) -> TxResult<T>) -> Result<T> {
        self.read(f)
    }

    /// Waits until the write transaction in flight, if any, has committed (SQLite's single
    /// writer: an open must not miss an unlink about to commit; see `ops`).
    fn settle_writes(&self) {}

    /// Makes every commit so far durable on stable storage.
    fn sync(&self) -> Result<()>;

    /// Starts exchanging changes with other clients (see [`Meta::watch`](super::Meta::watch)).
    fn watch(&self, session: u64, sink: ChangeSink) -> Result<bool> {
        let _ = (session, sink);
        Ok(false)
    }

    /// Stops what [`Engine::watch`] started.
    fn unwatch(&self) {}

    /// Tells the other clients what a committed change touched (`f` runs only if they
    /// listen).
    fn publish(&self, f: impl FnOnce() -> Vec<Change>) {
        let _ = f;
    }
}

/// The rows of a volume, as one transaction sees them.
pub trait Txn {
    // ---- nodes ----
    /// An inode's attributes (ENOENT if it has none).
    fn get_node(&mut self, ino: Ino) -> TxResult<Attr>;
    /// [`Txn::get_node`], locking the row for the rest of the transaction where rows are
    /// locked.
    fn lock_node(&mut self, ino: Ino) -> TxResult<Attr> {
        self.get_node(ino)
    }
    /// Locks two inodes (in an order that cannot deadlock); the same twice if `a == b`.
    fn lock_two(&mut self, a: Ino, b: Ino) -> TxResult<(Attr, Attr)> {
        let x = self.lock_node(a)?;
        let y = if a == b {
            x.clone()
        } else {
            self.lock_node(b)?
        };
        Ok((x, y))
    }
    fn insert_node(&mut self, a: &Attr) -> TxResult<()>;
    fn update_node(&mut self, a: &Attr) -> TxResult<()>;
    /// Applies a setattr to a locked or read inode and writes it (see `ops::apply_set`): an
    /// engine may do both in one statement.
    fn set_attr(&mut self, ino: Ino, set: &super::SetAttr, now: Nanos) -> TxResult<Attr> {
        let mut a = self.lock_node(ino)?;
        if super::ops::apply_set(&mut a, set, now) {
            self.update_node(&a)?;
        }
        Ok(a)
    }
    /// Deletes an inode's rows (node, symlink target, xattrs, chunks); returns the records of
    /// its chunks, whose slices the caller releases.
    fn delete_node_rows(&mut self, ino: Ino) -> TxResult<Vec<SliceRec>>;
    /// Adds to the volume's usage counters (an engine may gather them until commit).
    fn add_usage(&mut self, used_bytes: i64, inodes: i64) -> TxResult<()>;
    /// Sets the usage counters (fsck).
    fn set_usage(&mut self, used_bytes: u64, inodes: u64) -> TxResult<()>;
    /// Takes `n` ids from the counter `name` (`nextInode`, `nextSlice`); returns the first.
    fn take_ids(&mut self, name: &'static str, n: u64) -> TxResult<u64>;
    fn usage(&mut self) -> TxResult<Usage>;

    // ---- directory entries ----
    /// The entry `name` of `parent`: (entry id, inode).
    fn get_edge(&mut self, parent: Ino, name: &[u8]) -> TxResult<Option<(i64, Ino)>>;
    /// The inode `name` of `parent` names: ENOENT if none, ENOTDIR if `parent` is not a
    /// directory.
    fn find(&mut self, parent: Ino, name: &[u8]) -> TxResult<Attr> {
        match self.child(parent, name)? {
            Some(a) => Ok(a),
            None if self.get_node(parent)?.kind != Kind::Dir => fail(libc::ENOTDIR),
            None => fail(libc::ENOENT),
        }
    }
    /// The inode `name` of `parent` names, if any.
    fn child(&mut self, parent: Ino, name: &[u8]) -> TxResult<Option<Attr>> {
        match self.get_edge(parent, name)? {
            Some((_, ino)) => unless_gone(self.get_node(ino)),
            None => Ok(None),
        }
    }
    /// The entry `name` of `parent` and its inode, locked: (entry id, attributes).
    fn lock_entry(&mut self, parent: Ino, name: &[u8]) -> TxResult<Option<(i64, Attr)>> {
        match self.get_edge(parent, name)? {
            Some((id, ino)) => Ok(Some((id, self.lock_node(ino)?))),
            None => Ok(None),
        }
    }
    fn insert_edge(&mut self, parent: Ino, name: &[u8], ino: Ino, kind: Kind) -> TxResult<()>;
    /// Inserts a new inode and its first entry; EEXIST if the name is taken.
    fn create_entry(&mut self, a: &Attr, parent: Ino, name: &[u8]) -> TxResult<()> {
        if self.get_edge(parent, name)?.is_some() {
            return super::engine::fail(libc::EEXIST);
        }
        self.insert_node(a)?;
        self.insert_edge(parent, name, a.ino, a.kind)
    }
    fn delete_edge(&mut self, id: i64) -> TxResult<()>;
    /// Removes entry `id` and writes its directory `dir`. Returns whether the entry's inode
    /// `ino` is recorded open anywhere, where the engine learns it in the same round trip
    /// (`None`: ask [`Txn::open_anywhere`]).
    fn remove_entry(&mut self, id: i64, dir: &Attr, ino: Ino) -> TxResult<Option<bool>> {
        let _ = ino;
        self.delete_edge(id)?;
        self.update_node(dir)?;
        Ok(None)
    }
    /// Points entry `id` at another inode (rename's exchange).
    fn set_edge_target(&mut self, id: i64, ino: Ino, kind: Kind) -> TxResult<()>;
    /// Moves entry `id` to `parent`/`name`.
    fn move_edge(&mut self, id: i64, parent: Ino, name: &[u8]) -> TxResult<()>;
    fn dir_is_empty(&mut self, ino: Ino) -> TxResult<bool>;
    /// Entries of `dir` after entry id `after`, at most `limit`, in id order; with their
    /// attributes if `plus`. Cookies are the entry id + 2 (after "." and "..").
    fn list_entries(
        &mut self,
        dir: Ino,
        after: i64,
        limit: i64,
        plus: bool,
    ) -> TxResult<Vec<DirEntry>>;
    /// Removes the entry `name` of `parent` (fsck).
    fn remove_edge_named(&mut self, parent: Ino, name: &[u8]) -> TxResult<()>;
    /// Corrects the kind an entry records (fsck).
    fn set_edge_kind(&mut self, parent: Ino, name: &[u8], kind: Kind) -> TxResult<()>;

    // ---- symlinks and xattrs ----
    fn insert_symlink(&mut self, ino: Ino, target: &[u8]) -> TxResult<()>;
    fn symlink(&mut self, ino: Ino) -> TxResult<Option<Vec<u8>>>;
    fn xattr(&mut self, ino: Ino, name: &[u8]) -> TxResult<Option<Vec<u8>>>;
    fn has_xattr(&mut self, ino: Ino, name: &[u8]) -> TxResult<bool> {
        Ok(self.xattr(ino, name)?.is_some())
    }
    fn put_xattr(&mut self, ino: Ino, name: &[u8], value: &[u8]) -> TxResult<()>;
    /// Whether there was one to delete.
    fn delete_xattr(&mut self, ino: Ino, name: &[u8]) -> TxResult<bool>;
    fn xattr_names(&mut self, ino: Ino) -> TxResult<Vec<Vec<u8>>>;

    // ---- chunks and slices ----
    /// The records of one chunk, oldest first (none for a missing chunk).
    fn chunk(&mut self, ino: Ino, index: u32) -> TxResult<Vec<SliceRec>>;
    /// Appends records to a chunk; returns its record count after.
    fn append_chunk(&mut self, ino: Ino, index: u32, recs: &[SliceRec]) -> TxResult<usize>;
    /// Replaces a chunk's records (deletes the chunk if `recs` is empty).
    fn set_chunk(&mut self, ino: Ino, index: u32, recs: &[SliceRec]) -> TxResult<()>;
    /// Deletes the chunks of `ino` with index in `from..to`; returns their records (the
    /// decodable ones), whose slices the caller releases.
    fn drop_chunks(&mut self, ino: Ino, from: u64, to: u64) -> TxResult<Vec<SliceRec>>;
    /// One more reference to each record's slice.
    fn incref(&mut self, recs: &[SliceRec]) -> TxResult<()>;
    /// One reference less to each record's slice; a slice left with none is queued for
    /// deletion (dead since `now`).
    fn decref(&mut self, recs: &[SliceRec], now: Nanos) -> TxResult<()>;
    /// Sets a slice's reference count; 0 queues it for deletion (fsck).
    fn set_slice_refs(&mut self, id: u64, size: u32, refs: u32, now: Nanos) -> TxResult<()>;
    /// Slices queued for deletion that died at or before `cutoff` (all if `None`).
    fn dead_slices(&mut self, cutoff: Option<Nanos>, limit: usize) -> TxResult<Vec<DeadSlice>>;
    /// Removes slices from the deletion queue.
    fn forget_dead(&mut self, ids: &[u64]) -> TxResult<()>;

    // ---- sessions and open files ----
    fn insert_session(&mut self, info: &str, now: Nanos) -> TxResult<u64>;
    /// Records a heartbeat; false if the session's row is gone.
    fn touch_session(&mut self, id: u64, now: Nanos) -> TxResult<bool>;
    fn session(&mut self, id: u64) -> TxResult<Option<SessionRow>>;
    fn sessions(&mut self) -> TxResult<Vec<SessionRow>>;
    fn delete_session(&mut self, id: u64) -> TxResult<()>;
    /// Removes every open-file record of a session; returns their inodes.
    fn take_session_opens(&mut self, session: u64) -> TxResult<Vec<Ino>>;
    /// Records that `session` has `ino` open.
    fn insert_open(&mut self, ino: Ino, session: u64) -> TxResult<()>;
    /// Forgets that `session` has `ino` open (every session if `None`).
    fn delete_open(&mut self, ino: Ino, session: Option<u64>) -> TxResult<()>;
    /// Reads an inode and records that `session` has it open.
    fn open_node(&mut self, ino: Ino, session: u64) -> TxResult<Attr> {
        let a = self.get_node(ino)?;
        self.insert_open(ino, session)?;
        Ok(a)
    }
    /// Forgets the open of `ino` by `session` (if `recorded`), then reads its link count
    /// (`None` if the inode is gone).
    fn close_node(&mut self, ino: Ino, session: u64, recorded: bool) -> TxResult<Option<u32>> {
        if recorded {
            self.delete_open(ino, Some(session))?;
        }
        Ok(unless_gone(self.get_node(ino))?.map(|a| a.nlink))
    }
    /// Whether any client has the inode recorded open (call with the inode locked).
    fn open_anywhere(&mut self, ino: Ino) -> TxResult<bool>;
    /// Records that this client keeps an unlinked inode it has open (engines that count
    /// opens in memory).
    fn insert_sustained(&mut self, session: u64, ino: Ino) -> TxResult<()>;
    /// Forgets such records of `ino` (of every session if `None`).
    fn delete_sustained(&mut self, ino: Ino, session: Option<u64>) -> TxResult<()>;
    /// Every open-file record: (session, inode), sorted.
    fn open_records(&mut self) -> TxResult<Vec<(u64, Ino)>>;

    // ---- file locks ----
    /// Every lock held on `ino` by a live session.
    fn locks(&mut self, ino: Ino) -> TxResult<Vec<(LockOwner, LockRange)>>;
    /// Deletes the locks on `ino` of sessions that ended.
    fn drop_orphan_locks(&mut self, ino: Ino) -> TxResult<()>;
    /// Replaces the ranges `owner` holds on `ino`.
    fn store_locks(&mut self, ino: Ino, owner: LockOwner, ranges: &[LockRange]) -> TxResult<()>;

    // ---- whole-volume scans (fsck, gc, status) ----
    /// Every referenced slice: (id, size, references).
    fn slice_refs(&mut self) -> TxResult<Vec<(u64, u32, u32)>>;
    fn scan_nodes(&mut self, f: &mut dyn FnMut(&Attr)) -> TxResult<()>;
    fn scan_entries(&mut self, f: &mut dyn FnMut(Ino, &[u8], Ino, Option<Kind>)) -> TxResult<()>;
    fn scan_chunks(&mut self, f: &mut dyn FnMut(Ino, u32, Option<Vec<SliceRec>>)) -> TxResult<()>;
}
