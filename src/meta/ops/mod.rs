//! Every [`Meta`] operation, written once over an [`Engine`]: what a create, an unlink, a
//! rename or a write means, which rows it reads, checks and changes, in which transaction.
//! This file keeps what every job shares: [`EngineMeta`] itself, the id pools (inode numbers
//! here; slice ids, reserved by the session that takes them, in `files`), the checks and change
//! notices several jobs use, the deletion of an inode, and the [`Meta`] implementation as a
//! table that names, for each operation, the file doing it:
//!
//! - `namespace`: lookups, creates, links, unlinks, renames, listings;
//! - `attrs`: an inode's attributes, flags, xattrs and ACLs;
//! - `files`: file contents as slices (writes, truncates, copies, compaction);
//! - `clients`: this client's session, opens and locks among other clients;
//! - `settings`: the volume's settings, quotas and usage;
//! - `maintenance`: what gc and fsck read and mend.
//!
//! What is answered from memory is kept in [`cache`]: every read here may be answered from
//! it, and every write tells it what the write made true.
//!
//! Not for: SQL or how rows are locked (the engines), file contents (`data`), the kernel's
//! caches (`fuse`).

mod attrs;
mod clients;
mod files;
mod maintenance;
mod namespace;
mod settings;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use super::cache::{Cache, Fact, PageKey};
use super::engine::{Engine, EntryHints, SubDir, TxResult, Txn, corrupt, fail, unless_gone};
use super::lock::{self, LockOwner};
use super::opens::OpenCounts;
use super::session::row_dead;
use super::slice::{self, SliceRec};
use super::trash;
use super::*;

pub(crate) use settings::{
    NEW_COUNTERS, check_reformat, parse_format, root_node, stored_per_inode,
};

/// How many ids are taken from the counters at once.
const ID_BATCH: u64 = 1024;

/// Space a file of `n` bytes is counted for (4 KiB units).
pub(crate) fn align4k(n: u64) -> i64 {
    n.div_ceil(4096) as i64 * 4096
}

/// EPERM for an inode that `chattr +i` or `+a` protects: it is not unlinked, renamed,
/// linked, truncated, or given other xattrs.
fn check_protected(a: &Attr) -> TxResult<()> {
    if a.flags & flags::PRIVILEGED != 0 {
        return fail(libc::EPERM);
    }
    Ok(())
}

/// A new inode made at `now`, owned by `(uid, gid)`, with its one name in `parent` (kept
/// as the parent of a directory), empty.
pub(crate) fn new_node(
    ino: Ino,
    kind: Kind,
    mode: u32,
    (uid, gid): (u32, u32),
    parent: Ino,
    now: Nanos,
) -> Attr {
    let dir = kind == Kind::Dir;
    Attr {
        ino,
        kind,
        mode,
        uid,
        gid,
        nlink: if dir { 2 } else { 1 },
        length: 0,
        rdev: 0,
        atime: now,
        mtime: now,
        ctime: now,
        parent: if dir { parent } else { 0 },
        flags: 0,
        stored: 0,
    }
}

pub(crate) fn attr_changed(ino: Ino) -> Change {
    Change::Inode { ino, data: false }
}

pub(crate) fn entry_changed(parent: Ino, name: &[u8]) -> Change {
    Change::Entry {
        parent,
        name: name.to_vec(),
    }
}

struct IdPool {
    next: u64,
    end: u64,
}

/// A volume's metadata on engine `E`: the [`Meta`] of every engine.
pub struct EngineMeta<E: Engine> {
    pub(crate) engine: E,
    /// The volume's settings: read at open, again at each heartbeat (`config` changes them).
    pub(crate) format: RwLock<Format>,
    inos: Mutex<IdPool>,
    slices: Mutex<IdPool>,
    /// Open counts of inodes opened through this client (see [`Engine::RECORDS_OPENS`]).
    opens: OpenCounts,
    session: Mutex<u64>,
    fragmented: Mutex<HashMap<(Ino, u32), usize>>,
    /// Inodes, names and xattrs answered from memory (see [`Meta::set_alone`] and
    /// [`Meta::watch`] for when).
    pub(crate) cache: Arc<Cache>,
    /// Whether this client has the volume to itself, as the mount last said.
    alone: AtomicBool,
    /// Whether other clients' changes are pushed to this one.
    pushed: Arc<AtomicBool>,
    /// The trash's inode (0: not known yet; see `trash`).
    pub(crate) trash: AtomicU64,
    /// The trash's directory of the current hour, made here.
    pub(crate) bin: Mutex<Option<(String, super::trash::Bin)>>,
}

impl<E: Engine> EngineMeta<E> {
    pub(crate) fn new(engine: E, format: Format) -> Self {
        EngineMeta {
            engine,
            format: RwLock::new(format),
            inos: Mutex::new(IdPool { next: 0, end: 0 }),
            slices: Mutex::new(IdPool { next: 0, end: 0 }),
            opens: OpenCounts::new(E::RECORDS_OPENS),
            session: Mutex::new(0),
            fragmented: Mutex::new(HashMap::new()),
            cache: Arc::new(Cache::default()),
            alone: AtomicBool::new(false),
            pushed: Arc::new(AtomicBool::new(false)),
            trash: AtomicU64::new(0),
            bin: Mutex::new(None),
        }
    }

    /// The cache's epoch, taken before a read or a write (`None`: not answering from
    /// memory). The cache answers while this client is alone and its engine has seen no
    /// other writer since (SQLite stops grouping by itself when another process commits, or
    /// when a group is lost), or while other clients' changes are pushed.
    pub(crate) fn epoch(&self) -> Option<u64> {
        let on = (self.alone.load(Ordering::Acquire) && self.engine.grouping())
            || self.pushed.load(Ordering::Acquire);
        self.cache.begin(on)
    }

    /// After a namespace change failed: what the cache said of the names and directories
    /// it touched may be what made the kernel ask (a name created elsewhere and not pushed
    /// yet), so they are forgotten.
    pub(crate) fn failed(&self, names: &[(Ino, &[u8])]) {
        let mut facts = Vec::with_capacity(names.len() * 2);
        for (p, n) in names {
            facts.push(Fact::NameStale(*p, n.to_vec()));
            facts.push(Fact::Stale(*p));
        }
        self.cache.learn(None, &facts);
    }

    /// An inode's attributes read from the engine, not from memory (and then kept).
    fn fresh_attr(&self, ino: Ino) -> Result<Attr> {
        self.read_attr(self.epoch(), ino)
    }

    /// [`Self::fresh_attr`] with the epoch taken already.
    fn read_attr(&self, e: Option<u64>, ino: Ino) -> Result<Attr> {
        let a = self.engine.read(|tx| tx.get_node(ino))?;
        self.cache.fill(e, &[Fact::Attr(a.clone())]);
        Ok(a)
    }

    fn sid(&self) -> u64 {
        *self.session.lock()
    }

    /// An inode number.
    pub(crate) fn alloc_ino(&self) -> Result<Ino> {
        self.alloc(&self.inos, "nextInode")
    }

    fn alloc(&self, pool: &Mutex<IdPool>, counter: &'static str) -> Result<u64> {
        let mut p = pool.lock();
        if p.next >= p.end {
            let start = self.engine.single(|tx| tx.take_ids(counter, ID_BATCH))?;
            p.next = start;
            p.end = start + ID_BATCH;
        }
        let id = p.next;
        p.next += 1;
        Ok(id)
    }

    /// Deletes an inode whose last link and last open are gone, releasing its slices.
    fn delete_inode(&self, tx: &mut dyn Txn, a: &Attr, now: Nanos) -> TxResult<()> {
        let recs = tx.delete_node_rows(a.ino)?;
        if a.kind == Kind::Dir && self.quotas_kept() {
            tx.delete_quota(a.ino)?;
        }
        tx.decref(&recs, now)?;
        let used = if a.kind == Kind::File {
            -align4k(a.length)
        } else {
            0
        };
        tx.add_usage(used, -1)
    }
}

/// The operations by job: each is done by the method of the same name in the job's file (an
/// inherent method, which `EngineMeta::name` finds before the trait's), or here when it is one
/// call.
impl<E: Engine> Meta for EngineMeta<E> {
    // Names: lookups, creates, links, unlinks, renames, listings (namespace.rs).
    fn lookup(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr> {
        EngineMeta::lookup(self, ctx, parent, name)
    }

    fn mknod(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        kind: Kind,
        mode: u32,
        rdev: u32,
        target: Option<&[u8]>,
    ) -> Result<Attr> {
        self.make_node(ctx, parent, name, kind, (mode, rdev), target, false)
    }

    fn create_open(&self, ctx: &Ctx, parent: Ino, name: &[u8], mode: u32) -> Result<Attr> {
        self.make_node(ctx, parent, name, Kind::File, (mode, 0), None, true)
    }

    fn link(&self, ctx: &Ctx, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        EngineMeta::link(self, ctx, ino, parent, name)
    }

    fn unlink(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr> {
        EngineMeta::unlink(self, ctx, parent, name)
    }

    fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        EngineMeta::rmdir(self, ctx, parent, name)
    }

    fn purge(&self, parent: Ino, name: &[u8]) -> Result<Purged> {
        let a = EngineMeta::lookup(self, &Ctx::ROOT, parent, name)?;
        self.purge_tree(parent, name, a.ino)
    }

    fn rename(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<Option<Attr>> {
        EngineMeta::rename(self, ctx, parent, name, new_parent, new_name, flags)
    }

    fn readdir(&self, ino: Ino, cookie: u64, limit: usize, plus: bool) -> Result<Vec<DirEntry>> {
        EngineMeta::readdir(self, ino, cookie, limit, plus)
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        EngineMeta::readlink(self, ino)
    }

    // Attributes: stat fields, flags, xattrs and ACLs (attrs.rs).
    fn set_quarantined(&self, ino: Ino, on: bool) -> Result<Attr> {
        EngineMeta::set_quarantined(self, ino, on)
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        EngineMeta::getattr(self, ino)
    }

    fn setattr(&self, ctx: &Ctx, ino: Ino, set: &SetAttr) -> Result<Attr> {
        EngineMeta::setattr(self, ctx, ino, set)
    }

    fn set_flags(&self, ctx: &Ctx, ino: Ino, new: u32, keep_ctime: bool) -> Result<Attr> {
        EngineMeta::set_flags(self, ctx, ino, new, keep_ctime)
    }

    fn set_atimes(&self, times: &[(Ino, Nanos)]) -> Result<()> {
        EngineMeta::set_atimes(self, times)
    }

    fn set_xattr(
        &self,
        ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        how: XattrSet,
    ) -> Result<()> {
        EngineMeta::set_xattr(self, ctx, ino, name, value, how)
    }

    fn get_xattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        EngineMeta::get_xattr(self, ino, name)
    }

    fn list_xattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        EngineMeta::list_xattr(self, ino)
    }

    fn remove_xattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<()> {
        EngineMeta::remove_xattr(self, ctx, ino, name)
    }

    // File contents: slices, truncates, copies, compaction (files.rs).
    fn truncate(&self, ctx: &Ctx, ino: Ino, length: u64) -> Result<Attr> {
        EngineMeta::truncate(self, ctx, ino, length)
    }

    fn fallocate(&self, ctx: &Ctx, ino: Ino, mode: FallocMode, off: u64, len: u64) -> Result<Attr> {
        EngineMeta::fallocate(self, ctx, ino, mode, off, len)
    }

    fn read_chunk(&self, ino: Ino, index: u32) -> Result<Vec<SliceRec>> {
        self.engine.read(|tx| tx.chunk(ino, index))
    }

    fn new_slice_id(&self) -> Result<u64> {
        self.alloc_slice()
    }

    fn reserved_slices(&self) -> Result<Vec<(u64, u64, u64)>> {
        EngineMeta::reserved_slices(self)
    }

    fn slice_id_floor(&self) -> u64 {
        EngineMeta::slice_id_floor(self)
    }

    fn trim_reserved(&self, below: u64) -> Result<()> {
        EngineMeta::trim_reserved(self, below)
    }

    fn write_slices(
        &self,
        ino: Ino,
        slices: &[(u32, SliceRec)],
        mtime: Option<Nanos>,
    ) -> Result<Attr> {
        EngineMeta::write_slices(self, ino, slices, mtime)
    }

    fn attach_external(&self, ino: Ino, parts: &[External], mtime: Nanos) -> Result<Attr> {
        EngineMeta::attach_external(self, ino, parts, mtime)
    }

    fn external(&self, id: u64) -> Result<Option<External>> {
        self.read_committed(|tx| tx.external(id))
    }

    fn externals(&self) -> Result<Vec<External>> {
        self.read_committed(|tx| tx.externals())
    }

    fn copy_range(
        &self,
        ctx: &Ctx,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
    ) -> Result<(u64, Attr)> {
        EngineMeta::copy_range(self, ctx, src, src_off, dst, dst_off, len)
    }

    fn replace_slices(
        &self,
        ino: Ino,
        index: u32,
        old: &[SliceRec],
        new: &[SliceRec],
    ) -> Result<bool> {
        EngineMeta::replace_slices(self, ino, index, old, new)
    }

    fn fragmented_chunks(&self, min_records: usize, limit: usize) -> Result<Vec<(Ino, u32)>> {
        EngineMeta::fragmented_chunks(self, min_records, limit)
    }

    // This client among others: its session, opens, locks, and cache (clients.rs).
    fn watch(&self, sink: ChangeSink) -> Result<bool> {
        EngineMeta::watch(self, sink)
    }

    fn new_session(&self, info: SessionInfo) -> Result<u64> {
        EngineMeta::new_session(self, info)
    }

    fn heartbeat(&self) -> Result<()> {
        EngineMeta::heartbeat(self)
    }

    fn watch_sessions(&self) -> Result<()> {
        self.share_opens()
    }

    fn report_staged(&self, blocks: u64, bytes: u64) -> Result<()> {
        EngineMeta::report_staged(self, blocks, bytes)
    }

    fn close_session(&self) -> Result<()> {
        EngineMeta::close_session(self)
    }

    fn sessions(&self) -> Result<Vec<SessionInfo>> {
        EngineMeta::sessions(self)
    }

    fn peer_key(&self) -> Result<String> {
        EngineMeta::peer_key(self)
    }

    fn getlk(
        &self,
        ino: Ino,
        owner: u64,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Result<Option<LockRange>> {
        EngineMeta::getlk(self, ino, owner, kind, start, end)
    }

    fn setlk(&self, ino: Ino, owner: u64, req: LockRequest) -> Result<Option<LockRange>> {
        EngineMeta::setlk(self, ino, owner, req)
    }

    fn open_inode(&self, ino: Ino) -> Result<Attr> {
        EngineMeta::open_inode(self, ino)
    }

    fn close_inode(&self, ino: Ino) -> Result<()> {
        EngineMeta::close_inode(self, ino)
    }

    fn share(&self, ino: Ino) -> Result<()> {
        self.engine.share(ino)
    }

    fn open_dir(&self, ino: Ino) -> Result<Attr> {
        EngineMeta::open_dir(self, ino)
    }

    fn close_dir(&self, ino: Ino) -> Result<()> {
        EngineMeta::close_dir(self, ino)
    }

    fn session_id(&self) -> u64 {
        self.sid()
    }

    fn sync(&self) -> Result<()> {
        self.engine.sync()
    }

    fn begin_sync(&self) -> Result<()> {
        self.engine.begin_sync()
    }

    fn sync_file(&self) -> Option<std::path::PathBuf> {
        self.engine.sync_file()
    }

    fn set_alone(&self, alone: bool) {
        EngineMeta::set_alone(self, alone)
    }

    fn others_wrote(&self) -> bool {
        EngineMeta::others_wrote(self)
    }

    // The volume: its settings, quotas, usage (settings.rs).
    fn format(&self) -> Format {
        self.format.read().clone()
    }

    fn set_format(&self, new: &Format) -> Result<()> {
        EngineMeta::set_format(self, new)
    }

    fn figures(&self, out: &mut crate::metrics::Families) {
        self.engine.stats().figures(out);
    }

    fn engine(&self) -> EngineKind {
        self.engine.kind()
    }

    fn quotas(&self) -> Result<Vec<Quota>> {
        self.list_quotas()
    }

    fn set_quota(
        &self,
        dir: Ino,
        max_bytes: Option<u64>,
        max_inodes: Option<u64>,
    ) -> Result<Quota> {
        self.put_quota(dir, max_bytes, max_inodes)
    }

    fn start_quotas(&self) -> Result<bool> {
        EngineMeta::start_quotas(self)
    }

    fn delete_quota(&self, dir: Ino) -> Result<bool> {
        self.remove_quota(dir)
    }

    fn recount_quota(&self, dir: Ino, repair: bool) -> Result<(Option<Quota>, (i64, i64))> {
        EngineMeta::recount_quota(self, dir, repair)
    }

    fn limited(&self) -> bool {
        EngineMeta::limited(self)
    }

    fn room_for(&self, ino: Ino, bytes: u64) -> Result<u64> {
        EngineMeta::room_for(self, ino, bytes)
    }

    fn summary(&self, dir: Ino) -> Result<Summary> {
        EngineMeta::summary(self, dir)
    }

    fn dir_path(&self, dir: Ino) -> Result<Vec<u8>> {
        self.engine.read(|tx| quota::dir_path(tx, dir))
    }

    fn destroy(&self) -> Result<()> {
        EngineMeta::destroy(self)
    }

    fn usage(&self) -> Result<Usage> {
        self.engine.snapshot(|tx| tx.usage())
    }

    // What gc and fsck read and mend (maintenance.rs).
    fn names_of(&self, ino: Ino) -> Result<Vec<(Ino, Vec<u8>)>> {
        self.engine.read(|tx| tx.names_of(ino))
    }

    fn check_storage(&self) -> Result<Vec<String>> {
        self.engine.check_storage()
    }

    fn dead_slices(&self, limit: usize) -> Result<Vec<DeadSlice>> {
        EngineMeta::dead_slices(self, limit)
    }

    fn dead_slices_early(&self, limit: usize) -> Result<Vec<DeadSlice>> {
        self.read_committed(|tx| tx.dead_slices_by_age(limit))
    }

    fn purge_trash_early(&self, bytes: u64) -> Result<Option<Purged>> {
        self.purge_early(bytes)
    }

    fn forget_dead_slices(&self, ids: &[u64]) -> Result<()> {
        if !ids.iter().any(|i| slice::is_external(*i)) {
            return self.engine.single(|tx| tx.forget_dead(ids));
        }
        // External slices' rows go with them (their objects are never deleted).
        self.engine.write(&[], false, |tx| {
            tx.forget_dead(ids)?;
            tx.forget_externals(ids)
        })
    }

    fn all_slices(&self) -> Result<Vec<(u64, u32, u32)>> {
        self.read_committed(|tx| tx.slice_refs())
    }

    fn scan_nodes(&self, f: &mut dyn FnMut(&Attr)) -> Result<()> {
        self.engine.snapshot(|tx| tx.scan_nodes(&mut *f))
    }

    fn scan_entries(&self, f: &mut EntryVisitor<'_>) -> Result<()> {
        self.engine.snapshot(|tx| tx.scan_entries(&mut *f))
    }

    fn scan_chunks(&self, f: &mut dyn FnMut(Ino, u32, Option<Vec<SliceRec>>)) -> Result<()> {
        self.engine.snapshot(|tx| tx.scan_chunks(&mut *f))
    }

    fn all_dead_slices(&self) -> Result<Vec<DeadSlice>> {
        self.read_committed(|tx| tx.dead_slices(None, usize::MAX))
    }

    fn sustained(&self) -> Result<Vec<(u64, Ino)>> {
        self.read_committed(|tx| tx.open_records())
    }

    fn read_rows(&self, f: &mut dyn FnMut(&mut dyn Txn) -> TxResult<()>) -> Result<()> {
        EngineMeta::read_rows(self, f)
    }

    fn write_rows(&self, f: &mut dyn FnMut(&mut dyn Txn) -> TxResult<()>) -> Result<()> {
        self.engine.write(&[], false, |tx| f(tx))
    }

    fn repair(&self, fix: &Fix) -> Result<()> {
        EngineMeta::repair(self, fix)
    }
}
