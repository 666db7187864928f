//! Every [`Meta`] operation, written once over an [`Engine`]: what a create, an unlink, a
//! rename or a write means, which rows it reads, checks and changes, in which transaction;
//! the id pools (slice ids reserved by the session that takes them), this client's open
//! counts, its session, and the chunks it saw fragment.
//!
//! What is answered from memory is kept in [`cache`]: every read here may be answered from
//! it, and every write tells it what the write made true.
//!
//! Not for: SQL or how rows are locked (the engines), file contents (`data`), the kernel's
//! caches (`fuse`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use super::cache::{Cache, Fact};
use super::engine::{Engine, EntryHints, TxResult, Txn, corrupt, fail, unless_gone};
use super::lock::{self, LockOwner};
use super::opens::OpenCounts;
use super::session::row_dead;
use super::slice::{self, SliceRec};
use super::trash;
use super::*;

/// Records a chunk may gather before it is offered to compaction.
const FRAGMENTED_AT: usize = 16;
/// How many ids are taken from the counters at once.
const ID_BATCH: u64 = 1024;

/// Space a file of `n` bytes is counted for (4 KiB units).
pub(crate) fn align4k(n: u64) -> i64 {
    n.div_ceil(4096) as i64 * 4096
}

/// Checks a name a new entry gets.
fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > MAX_NAME_LEN {
        return sys(libc::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return sys(libc::EINVAL);
    }
    Ok(())
}

/// EPERM for an inode that `chattr +i` or `+a` protects: it is not unlinked, renamed,
/// linked, truncated, or given other xattrs.
fn check_protected(a: &Attr) -> TxResult<()> {
    if a.flags & flags::PRIVILEGED != 0 {
        return fail(libc::EPERM);
    }
    Ok(())
}

/// EPERM for a directory whose flags forbid adding entries (immutable) or, when
/// `removing`, taking them away (immutable, append-only).
fn check_dir_change(dir: &Attr, removing: bool) -> TxResult<()> {
    let forbid = if removing {
        flags::PRIVILEGED
    } else {
        flags::IMMUTABLE
    };
    if dir.flags & forbid != 0 {
        return fail(libc::EPERM);
    }
    Ok(())
}

/// Checks a name an existing entry may have.
fn check_len(name: &[u8]) -> Result<()> {
    if name.len() > MAX_NAME_LEN {
        return sys(libc::ENAMETOOLONG);
    }
    Ok(())
}

/// The root directory of a new volume.
pub(crate) fn root_node(now: Nanos) -> Attr {
    let (uid, gid) = (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    new_node(ROOT_INO, Kind::Dir, 0o755, (uid, gid), ROOT_INO, now)
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

/// The bytes each file's data covers, from its chunks' rows `(ino, encoded records)`: what a
/// volume of a schema before 4, which did not count them, starts from.
pub(crate) fn stored_per_inode(
    rows: impl IntoIterator<Item = (i64, Vec<u8>)>,
) -> BTreeMap<i64, u64> {
    let mut out = BTreeMap::new();
    for (ino, blob) in rows {
        let covered = slice::decode(&blob).map_or(0, |recs| slice::covered(&recs));
        *out.entry(ino).or_insert(0) += covered;
    }
    out
}

/// The counters of a new volume, with their first values.
pub(crate) const NEW_COUNTERS: [(&str, i64); 4] = [
    ("nextInode", 2),
    ("nextSlice", 1),
    ("usedSpace", 0),
    ("totalInodes", 1),
];

/// Refuses to format over a volume (unless `force`), or over one that is mounted.
pub(crate) fn check_reformat(
    old: &Format,
    url: &str,
    force: bool,
    sessions: impl IntoIterator<Item = (String, Nanos)>,
) -> Result<()> {
    if !force {
        return Err(Error::Refused(format!(
            "a volume named '{}' already exists at {url}; refusing to format over it \
             (use --force to erase it and start afresh)",
            old.name
        )));
    }
    let now = now_nanos();
    let live = sessions
        .into_iter()
        .filter(|(info, hb)| !row_dead(info, *hb, now))
        .count();
    if live > 0 {
        return Err(Error::Refused(format!(
            "volume '{}' at {url} is mounted by {live} client(s); unmount it before \
             formatting with --force",
            old.name
        )));
    }
    Ok(())
}

/// Which setting that can never change after `format` differs between `old` and `new`.
pub(crate) fn fixed_setting_changed(old: &Format, new: &Format) -> Option<&'static str> {
    [
        ("the volume's name", old.name != new.name),
        ("the volume's id", old.uuid != new.uuid),
        ("the block size", old.block_size != new.block_size),
        ("the key layout", old.layout != new.layout),
        ("hashed key prefixes", old.hash_prefix != new.hash_prefix),
        ("checksums", old.checksums != new.checksums),
        ("compression", old.compress != new.compress),
        (
            "encryption",
            old.encryption != new.encryption
                && !format::Encryption::protected_in_place(
                    old.encryption.as_ref(),
                    new.encryption.as_ref(),
                ),
        ),
        ("the creation time", old.created != new.created),
    ]
    .into_iter()
    .find(|(_, changed)| *changed)
    .map(|(what, _)| what)
}

/// Reads a volume's recorded settings; refuses a schema newer than this binary's.
pub(crate) fn parse_format(json: &str, url: &str) -> Result<Format> {
    let format: Format = serde_json::from_str(json)
        .map_err(|e| Error::Engine(format!("unreadable volume settings in {url}: {e}")))?;
    if format.schema > format::SCHEMA_VERSION {
        return Err(Error::Refused(format!(
            "volume at {url} uses metadata schema {} but this unkai understands up to {}; \
             upgrade unkai",
            format.schema,
            format::SCHEMA_VERSION
        )));
    }
    if format.layout > format::LAYOUT_VERSION {
        return Err(Error::Refused(format!(
            "volume at {url} stores its blocks in layout {} but this unkai understands up to \
             {}; upgrade unkai",
            format.layout,
            format::LAYOUT_VERSION
        )));
    }
    Ok(format)
}

pub(crate) fn attr_changed(ino: Ino) -> Change {
    Change::Inode { ino, data: false }
}

fn data_changed(ino: Ino) -> Change {
    Change::Inode { ino, data: true }
}

pub(crate) fn entry_changed(parent: Ino, name: &[u8]) -> Change {
    Change::Entry {
        parent,
        name: name.to_vec(),
    }
}

/// What a link or an unlink of `name` in `parent` (naming `ino`) changed.
fn named_inode_changed(parent: Ino, name: &[u8], ino: Ino) -> Vec<Change> {
    vec![
        entry_changed(parent, name),
        attr_changed(parent),
        attr_changed(ino),
    ]
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

    /// Reads the volume's settings again (a `config` elsewhere may have changed them).
    fn reload_format(&self) -> Result<()> {
        let Some(json) = self.engine.read(|tx| tx.setting("format"))? else {
            return Ok(());
        };
        let new = parse_format(&json, "the volume")?;
        let mut cur = self.format.write();
        if new.uuid == cur.uuid && *cur != new {
            tracing::info!(
                "volume settings changed: trash {} day{}, capacity {}, inodes {}",
                new.trash_days,
                if new.trash_days == 1 { "" } else { "s" },
                new.capacity,
                new.inodes
            );
            *cur = new;
        }
        Ok(())
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

    /// After a change of a file's contents or size, now `a`.
    fn stored(&self, epoch: Option<u64>, a: &Attr) {
        self.cache.learn(epoch, &[Fact::Attr(a.clone())]);
        self.engine.publish(|| vec![data_changed(a.ino)])
    }

    /// After an xattr of `ino` was set or removed (its attributes now `after`).
    fn xattrs_changed(&self, epoch: Option<u64>, ino: Ino, after: Option<Attr>) {
        let mut facts = vec![Fact::Stale(ino)];
        facts.extend(after.map(Fact::Attr));
        self.cache.learn(epoch, &facts);
        self.engine.publish(|| vec![attr_changed(ino)])
    }

    /// mknod, and with `open` the open of the new file (`create_open`) counted before and
    /// recorded in the same transaction. `perm` is (mode, rdev).
    #[allow(clippy::too_many_arguments)]
    fn make_node(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        kind: Kind,
        (mode, rdev): (u32, u32),
        target: Option<&[u8]>,
        open: bool,
    ) -> Result<Attr> {
        check_name(name)?;
        if let Some(t) = target {
            if t.is_empty() {
                return sys(libc::ENOENT);
            }
            if t.len() > MAX_SYMLINK_LEN {
                return sys(libc::ENAMETOOLONG);
            }
        }
        if parent == ROOT_INO && name == trash::TRASH_NAME {
            return sys(libc::EEXIST);
        }
        let ino = self.alloc(&self.inos, "nextInode")?;
        // Counted before the create commits, and recorded with it (see `create_open`).
        let recorded = open && self.opens.add(ino).1;
        let sid = self.sid();
        let e = self.epoch();
        let mut after = None;
        self.engine
            .write_grouped(&[parent], false, |tx| {
                let mut p = Self::parent_dir(tx, parent)?;
                self.check_not_trash(&p)?;
                check_dir_change(&p, false)?;
                let now = now_nanos();
                let mut mode = mode & 0o7777;
                let mut gid = ctx.gid;
                if p.mode & libc::S_ISGID != 0 {
                    gid = p.gid;
                    if kind == Kind::Dir {
                        mode |= libc::S_ISGID;
                    } else if mode & (libc::S_ISGID | libc::S_IXGRP)
                        == (libc::S_ISGID | libc::S_IXGRP)
                        && ctx.uid != 0
                        && !ctx.in_group(gid)
                    {
                        mode &= !libc::S_ISGID;
                    }
                }
                // The directory's default ACL decides the permission bits (masked by those
                // asked for) instead of the umask, and is passed on (POSIX.1e).
                let (mut inherited, mut access) = (None, None);
                if kind != Kind::Symlink {
                    match tx.default_acl(parent)? {
                        Some(b) => {
                            let (acl, perm) = Self::stored_acl(parent, &b)?.inherit(mode);
                            mode = (mode & !0o777) | perm;
                            access = acl;
                            inherited = Some(b);
                        }
                        None => mode &= !(ctx.umask & 0o777),
                    }
                }
                let a = Attr {
                    length: target.map_or(0, |t| t.len() as u64),
                    rdev,
                    ..new_node(ino, kind, mode, (ctx.uid, gid), parent, now)
                };
                p.mtime = now;
                p.ctime = now;
                if kind == Kind::Dir {
                    p.nlink += 1;
                }
                tx.create_in(&a, &p, name)?;
                if let Some(t) = target {
                    tx.insert_symlink(ino, t)?;
                }
                if let Some(acl) = access {
                    tx.put_xattr(ino, acl::ACCESS, &acl.to_xattr())?;
                }
                if let (Kind::Dir, Some(d)) = (kind, &inherited) {
                    tx.put_xattr(ino, acl::DEFAULT, d)?;
                }
                tx.charge(0, 1, 0, self.format.read().inodes)?;
                self.quota_charge(tx, parent, (0, 1))?;
                if recorded {
                    tx.insert_open(ino, sid)?;
                }
                after = Some(p);
                Ok(a)
            })
            .inspect(|a| {
                let mut facts = vec![
                    Fact::Attr(a.clone()),
                    // File capabilities are never inherited.
                    Fact::NoXattr(a.ino, CAPABILITY),
                    Fact::Name(parent, name.to_vec(), Some(a.ino)),
                ];
                facts.extend(after.take().map(Fact::Attr));
                if a.kind == Kind::Dir {
                    facts.push(Fact::NewDir(a.ino));
                }
                self.cache.learn(e, &facts);
                self.engine
                    .publish(|| vec![entry_changed(parent, name), attr_changed(parent)])
            })
            .inspect_err(|_| {
                if open {
                    self.opens.remove(ino);
                }
                self.failed(&[(parent, name)])
            })
    }

    fn sid(&self) -> u64 {
        *self.session.lock()
    }

    /// Runs `f`, which only reads, on committed changes only (grouped ones committed first):
    /// what is deleted from the bucket is decided from them.
    fn read_committed<T>(&self, f: impl FnMut(&mut dyn Txn) -> TxResult<T>) -> Result<T> {
        self.engine.commit_group()?;
        self.engine.read(f)
    }

    /// EPERM for a directory of the trash itself (its root and hour directories): nothing
    /// is made there but by a deletion.
    fn check_not_trash(&self, dir: &Attr) -> TxResult<()> {
        let t = self.trash.load(Ordering::Acquire);
        if t != 0 && (dir.ino == t || dir.parent == t) {
            return fail(libc::EPERM);
        }
        Ok(())
    }

    /// Where deleting `name` of `parent` sends it (`None`: nowhere, it goes for good), and
    /// the inodes the deletion locks. EPERM for the trash itself.
    fn deletion_bin(
        &self,
        parent: Ino,
        name: &[u8],
        to_trash: bool,
    ) -> Result<(Option<trash::Bin>, Vec<Ino>)> {
        if parent == ROOT_INO && name == trash::TRASH_NAME {
            return sys(libc::EPERM);
        }
        let bin = if to_trash { self.bin()? } else { None };
        Ok((
            bin,
            std::iter::once(parent).chain(bin.map(|b| b.hour)).collect(),
        ))
    }

    /// What deleting `name` of `parent` (a directory if `dir`) into `bin` will read: the
    /// entry, and the name it would have in the trash if it names the inode this client
    /// knows (`trash_move` looks that name up).
    fn entry_hints<'a>(
        &self,
        parent: Ino,
        name: &'a [u8],
        dir: bool,
        bin: Option<trash::Bin>,
    ) -> EntryHints<'a> {
        let edges = match (bin, self.cache.name(parent, name)) {
            (Some(b), Some(Some(ino))) => vec![(b.hour, trash::entry_name(parent, ino, name))],
            _ => Vec::new(),
        };
        EntryHints {
            entry: (parent, name),
            dir,
            edges,
        }
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

    /// A slice id. A batch taken from the counter is recorded, in the same transaction, as
    /// reserved by this session: until the session ends (or trims it, see
    /// [`Meta::trim_reserved`]), `gc` leaves the objects of these ids alone, since an upload
    /// of them may still be committed. (Without a session, e.g. in tools, nothing is reserved.)
    fn alloc_slice(&self) -> Result<u64> {
        let mut p = self.slices.lock();
        if p.next >= p.end {
            let sid = self.sid();
            let start = self.engine.write(&[], false, |tx| {
                let start = tx.take_ids("nextSlice", ID_BATCH)?;
                if sid != 0 {
                    tx.reserve_slices(sid, start, start + ID_BATCH)?;
                }
                Ok(start)
            })?;
            p.next = start;
            p.end = start + ID_BATCH;
        }
        let id = p.next;
        p.next += 1;
        Ok(id)
    }

    fn note_fragmented(&self, ino: Ino, index: u32, count: usize) {
        if count >= FRAGMENTED_AT {
            self.fragmented.lock().insert((ino, index), count);
        }
    }

    fn parent_dir(tx: &mut dyn Txn, parent: Ino) -> TxResult<Attr> {
        let p = tx.lock_node(parent)?;
        if p.kind != Kind::Dir {
            return fail(libc::ENOTDIR);
        }
        if p.nlink == 0 {
            return fail(libc::ENOENT);
        }
        Ok(p)
    }

    /// An ACL as stored (checked when it was set: one that no longer reads is damage).
    fn stored_acl(ino: Ino, b: &[u8]) -> TxResult<acl::Acl> {
        acl::Acl::parse(b).ok_or_else(|| {
            corrupt(format!(
                "inode {ino} has a malformed ACL: remove it (setfacl -b, or setfacl -k for a \
                 directory's default ACL) and set it again"
            ))
        })
    }

    /// Only the owner (or root) sets or removes an inode's ACLs; symlinks have none.
    fn may_set_acl(ctx: &Ctx, a: &Attr) -> TxResult<()> {
        if a.kind == Kind::Symlink {
            return fail(libc::EOPNOTSUPP);
        }
        if ctx.uid != 0 && ctx.uid != a.uid {
            return fail(libc::EPERM);
        }
        Ok(())
    }

    /// Sets an ACL xattr of `a`. A default ACL is for directories only (EACCES); an access
    /// ACL sets the permission bits (mask or owning group in the group bits, and the setgid
    /// bit cleared for a caller outside the group, as `posix_acl_update_mode` does) and is
    /// not kept when the bits say it all.
    fn put_acl(
        tx: &mut dyn Txn,
        ctx: &Ctx,
        a: &mut Attr,
        name: &[u8],
        acl: &acl::Acl,
    ) -> TxResult<()> {
        Self::may_set_acl(ctx, a)?;
        if name == acl::DEFAULT {
            if a.kind != Kind::Dir {
                return fail(libc::EACCES);
            }
            return tx.put_xattr(a.ino, name, &acl.to_xattr());
        }
        a.mode = (a.mode & !0o777) | acl.mode();
        if ctx.uid != 0 && !ctx.in_group(a.gid) {
            a.mode &= !libc::S_ISGID;
        }
        if acl.is_minimal() {
            tx.delete_xattr(a.ino, name)?;
            Ok(())
        } else {
            tx.put_xattr(a.ino, name, &acl.to_xattr())
        }
    }

    /// Locks a regular file: EISDIR for a directory, `other` for any other kind.
    fn lock_file(tx: &mut dyn Txn, ino: Ino, other: i32) -> TxResult<Attr> {
        let a = tx.lock_node(ino)?;
        match a.kind {
            Kind::File => Ok(a),
            Kind::Dir => fail(libc::EISDIR),
            _ => fail(other),
        }
    }

    /// Writes a file's new length and (if `time`) its mtime and ctime, counting the change of
    /// its size from `old_len` in the volume's usage.
    fn store_file(
        &self,
        tx: &mut dyn Txn,
        a: &mut Attr,
        old_len: u64,
        time: Option<Nanos>,
    ) -> TxResult<()> {
        let max = self.format.read().capacity;
        let grown = align4k(a.length) - align4k(old_len);
        tx.charge(grown, 0, max, 0)?;
        self.quota_file_grew(tx, a.ino, grown)?;
        if let Some(t) = time {
            a.mtime = t;
            a.ctime = t;
        }
        tx.update_node(a)
    }

    /// EINVAL if `dir` is `ancestor` or lies below it. Parent pointers change only in moves
    /// between directories, which hold the rename lock.
    fn check_not_below(tx: &mut dyn Txn, dir: Ino, ancestor: Ino) -> TxResult<()> {
        let mut cur = dir;
        for _ in 0..100_000 {
            if cur == ancestor {
                return fail(libc::EINVAL);
            }
            if cur == ROOT_INO {
                return Ok(());
            }
            cur = tx.get_node(cur)?.parent;
        }
        Err(corrupt("directory tree has a cycle".into()))
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

    /// Unlinked to zero links: keep the inode (nlink 0) if it is open here (engines counting
    /// opens in memory record it as `sustained`) or recorded open anywhere (`open`, when the
    /// engine already knows), else delete it. The last close anywhere deletes a kept one.
    fn release(&self, tx: &mut dyn Txn, a: &Attr, open: Option<bool>, now: Nanos) -> TxResult<()> {
        if !E::RECORDS_OPENS && self.opens.is_open(a.ino) {
            tx.insert_sustained(self.sid(), a.ino)?;
            return tx.update_node(a);
        }
        let open = match open {
            Some(o) => o,
            None => tx.open_anywhere(a.ino)?,
        };
        if open {
            tx.update_node(a)
        } else {
            self.delete_inode(tx, a, now)
        }
    }

    /// Appends records to chunks of `a`, `(chunk index, record)` sorted by chunk, and counts
    /// in `a.stored` the holes they fill and the data they zero.
    fn append(&self, tx: &mut dyn Txn, a: &mut Attr, recs: &[(u32, SliceRec)]) -> TxResult<()> {
        for (index, recs) in slice::by_chunk(recs) {
            let list = tx.append_chunk(a.ino, index, &recs)?;
            self.note_fragmented(a.ino, index, list.len());
            let before = &list[..list.len().saturating_sub(recs.len())];
            a.stored = (a.stored + slice::covered(&list)).saturating_sub(slice::covered(before));
        }
        Ok(())
    }

    /// Once another client shares the volume, records this client's opens (those open now,
    /// and every first open from now on) so that its unlinks keep them. Never goes back: the
    /// cost is one write per first open and last close. (Engines that record every open
    /// from the start have nothing to do.)
    fn share_opens(&self) -> Result<()> {
        if E::RECORDS_OPENS || self.opens.is_recorded() {
            return Ok(());
        }
        let sid = self.sid();
        let now = now_nanos();
        let others = self.engine.read(|tx| tx.sessions())?;
        if !others
            .iter()
            .any(|(id, info, hb)| *id != sid && !row_dead(info, *hb, now))
        {
            return Ok(());
        }
        let n = self.engine.write(&[], false, |tx| {
            // Inside the write transaction: a first open or last close that saw `recorded`
            // false has written nothing, and one that sees it true writes its row after this.
            let open = self.opens.record_all();
            for ino in &open {
                tx.insert_open(*ino, sid)?;
            }
            Ok(open.len())
        })?;
        tracing::info!("another client shares the volume: recording opens ({n} open now)");
        Ok(())
    }

    /// Deletes a session, its open records and its reserved slice ids (what it uploaded and
    /// did not commit is garbage from now on); the unlinked inodes no other client has open
    /// any more are deleted.
    fn end_session(&self, sid: u64) -> Result<()> {
        let now = now_nanos();
        // The inodes it deletes are not known here: everything is forgotten.
        self.cache.clear();
        self.engine.write(&[], false, |tx| {
            tx.release_slices(sid, None)?;
            for ino in tx.take_session_opens(sid)? {
                if let Some(a) = unless_gone(tx.lock_node(ino))? {
                    if a.nlink == 0 && !tx.open_anywhere(ino)? {
                        self.delete_inode(tx, &a, now)?;
                    }
                }
            }
            tx.delete_session(sid)
        })
    }

    /// Whether a session stopped: its row is gone, or its client is known dead.
    fn session_is_dead(&self, id: u64) -> Result<bool> {
        Ok(match self.engine.read(|tx| tx.session(id))? {
            None => true,
            Some((_, info, hb)) => row_dead(&info, hb, now_nanos()),
        })
    }

    /// Cleans up after sessions whose process is gone (or that stopped heartbeating): their
    /// open records, and the unlinked inodes only they had open.
    fn clean_dead_sessions(&self) -> Result<usize> {
        let now = now_nanos();
        let sessions = self.engine.read(|tx| tx.sessions())?;
        let mut cleaned = 0;
        for (id, info, hb) in sessions {
            if id == self.sid() || !row_dead(&info, hb, now) {
                continue;
            }
            self.end_session(id)?;
            tracing::info!("cleaned up after dead session {id}");
            cleaned += 1;
        }
        Ok(cleaned)
    }

    fn lock_owner(&self, owner: u64) -> LockOwner {
        LockOwner {
            session: self.sid(),
            owner,
        }
    }

    /// What a rename that succeeded made true: `moved`, the inodes found under the source
    /// and the target names; `victim`, the inode it unlinked.
    fn renamed(
        moved: Option<(Ino, Option<Ino>)>,
        flags: RenameFlags,
        whiteout: Option<Ino>,
        victim: &Option<Attr>,
        (parent, name): (Ino, &[u8]),
        (new_parent, new_name): (Ino, &[u8]),
    ) -> Vec<Fact> {
        let mut facts = vec![Fact::Stale(parent), Fact::Stale(new_parent)];
        let Some((src, dst)) = moved else {
            return facts;
        };
        if dst == Some(src) {
            // Two names of one inode: nothing moved.
            return facts;
        }
        facts.push(Fact::Stale(src));
        let (old_now, new_now) = match (flags.exchange, dst) {
            (true, Some(d)) => (Some(d), Some(src)),
            _ => (whiteout, Some(src)),
        };
        if let Some(d) = dst {
            facts.push(Fact::Stale(d));
        }
        if let Some(v) = victim {
            facts.push(match v.nlink {
                0 => Fact::Gone(v.ino),
                _ => Fact::Stale(v.ino),
            });
        }
        facts.push(Fact::Name(parent, name.to_vec(), old_now));
        facts.push(Fact::Name(new_parent, new_name.to_vec(), new_now));
        facts
    }

    /// The rename of an entry over another, or to a free name (not an exchange).
    #[allow(clippy::too_many_arguments)]
    fn move_entry(
        &self,
        tx: &mut dyn Txn,
        (mut p1, mut p2): (Attr, Attr),
        (src_eid, mut src): (i64, Attr),
        dst: Option<(i64, Attr)>,
        new_parent: Ino,
        new_name: &[u8],
        noreplace: bool,
        now: Nanos,
        (bin, trashed): (Option<trash::Bin>, &mut Option<(Ino, Vec<u8>)>),
    ) -> TxResult<Option<Attr>> {
        let cross = p1.ino != p2.ino;
        if let Some((_, d)) = &dst {
            if noreplace {
                return fail(libc::EEXIST);
            }
            if src.kind == Kind::Dir {
                if d.kind != Kind::Dir {
                    return fail(libc::ENOTDIR);
                }
                if !tx.dir_is_empty(d.ino)? {
                    return fail(libc::ENOTEMPTY);
                }
            } else if d.kind == Kind::Dir {
                return fail(libc::EISDIR);
            }
        }
        if src.kind == Kind::Dir && cross {
            Self::check_not_below(tx, new_parent, src.ino)?;
        }
        let mut victim = None;
        if let Some((dst_eid, mut d)) = dst {
            tx.delete_edge(dst_eid)?;
            d.ctime = now;
            if d.kind == Kind::Dir {
                d.nlink = 0;
                p2.nlink -= 1;
            } else {
                d.nlink = d.nlink.saturating_sub(1);
            }
            let bin = Self::trashes_from(bin, &p2).filter(|_| d.kind != Kind::Dir);
            if let (0, Some(b)) = (d.nlink, bin) {
                // A file replaced by a rename goes to the trash, as a deleted one does.
                d.nlink = 1;
                let mut at = p2.clone();
                let tname = Self::trash_move(tx, b, None, &mut at, &mut d, new_name, now)?;
                *trashed = Some((b.hour, tname));
            } else if d.nlink == 0 {
                self.release(tx, &d, None, now)?;
            } else {
                tx.update_node(&d)?;
            }
            victim = Some(d);
        }
        tx.move_edge(src_eid, new_parent, new_name)?;
        // Out of the trash (`restore`): its own link again.
        src.flags &= !flags::TRASHED;
        if src.kind == Kind::Dir && cross {
            src.parent = new_parent;
            p1.nlink -= 1;
            p2.nlink += 1;
        }
        src.ctime = now;
        tx.update_node(&src)?;
        if cross {
            p1.mtime = now;
            p1.ctime = now;
            tx.update_node(&p1)?;
        }
        // Same directory: p2 carries the nlink changes of a replaced directory.
        p2.mtime = now;
        p2.ctime = now;
        tx.update_node(&p2)?;
        Ok(victim)
    }

    /// Rename's exchange: the two entries swap inodes.
    fn exchange(
        tx: &mut dyn Txn,
        (mut p1, mut p2): (Attr, Attr),
        (src_eid, mut src): (i64, Attr),
        (dst_eid, mut dst): (i64, Attr),
        now: Nanos,
    ) -> TxResult<()> {
        let cross = p1.ino != p2.ino;
        if cross {
            if src.kind == Kind::Dir {
                Self::check_not_below(tx, p2.ino, src.ino)?;
            }
            if dst.kind == Kind::Dir {
                Self::check_not_below(tx, p1.ino, dst.ino)?;
            }
        }
        tx.set_edge_target(src_eid, dst.ino, dst.kind)?;
        tx.set_edge_target(dst_eid, src.ino, src.kind)?;
        if cross {
            if src.kind == Kind::Dir {
                src.parent = p2.ino;
                p1.nlink -= 1;
                p2.nlink += 1;
            }
            if dst.kind == Kind::Dir {
                dst.parent = p1.ino;
                p2.nlink -= 1;
                p1.nlink += 1;
            }
        }
        src.ctime = now;
        dst.ctime = now;
        tx.update_node(&src)?;
        tx.update_node(&dst)?;
        p1.mtime = now;
        p1.ctime = now;
        tx.update_node(&p1)?;
        if cross {
            p2.mtime = now;
            p2.ctime = now;
            tx.update_node(&p2)?;
        }
        Ok(())
    }
    /// unlink(2): the entry goes, and its inode with its last link, or to the trash (if
    /// `to_trash` and the volume keeps one).
    pub(crate) fn remove(
        &self,
        _ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        to_trash: bool,
    ) -> Result<Attr> {
        check_len(name)?;
        let (bin, lock) = self.deletion_bin(parent, name, to_trash)?;
        let mut trashed: Option<(Ino, Vec<u8>)> = None;
        let e = self.epoch();
        let mut after = None;
        let hints = self.entry_hints(parent, name, false, bin);
        self.engine
            .write_entry(&lock, &hints, |tx| {
                trashed = None;
                let mut p = Self::parent_dir(tx, parent)?;
                let Some((eid, mut a)) = tx.lock_entry(parent, name)? else {
                    return fail(libc::ENOENT);
                };
                if a.kind == Kind::Dir {
                    return fail(libc::EISDIR);
                }
                check_dir_change(&p, true)?;
                check_protected(&a)?;
                let (bytes, inodes) = quota::entry_use(&a);
                self.quota_charge(tx, parent, (-bytes, -inodes))?;
                let now = now_nanos();
                p.mtime = now;
                p.ctime = now;
                if let Some(b) = Self::trashes_from(bin, &p).filter(|_| a.nlink <= 1) {
                    let tname = Self::trash_move(tx, b, Some(eid), &mut p, &mut a, name, now)?;
                    tx.update_node(&p)?;
                    trashed = Some((b.hour, tname));
                    after = Some(p);
                    return Ok(a);
                }
                let open = tx.remove_entry(eid, &p, a.ino)?;
                a.nlink = a.nlink.saturating_sub(1);
                a.ctime = now;
                if a.nlink == 0 {
                    self.release(tx, &a, open, now)?;
                } else {
                    tx.update_node(&a)?;
                }
                after = Some(p);
                Ok(a)
            })
            .inspect(|r| {
                let mut facts = vec![
                    match r.nlink {
                        0 => Fact::Gone(r.ino),
                        _ => Fact::Attr(r.clone()),
                    },
                    Fact::Name(parent, name.to_vec(), None),
                ];
                facts.extend(after.take().map(Fact::Attr));
                if let Some((hour, tname)) = &trashed {
                    facts.push(Fact::Stale(r.ino));
                    facts.push(Fact::Attr(r.clone()));
                    facts.extend(trash::arrived(*hour, tname, r.ino));
                }
                self.cache.learn(e, &facts);
                self.engine.publish(|| {
                    let mut v = named_inode_changed(parent, name, r.ino);
                    if let Some((hour, tname)) = &trashed {
                        v.extend(trash::arrival_changes(*hour, tname));
                    }
                    v
                })
            })
            .inspect_err(|err| self.failed_move(err, &[(parent, name)]))
    }

    /// rmdir(2): the empty directory goes, or to the trash (if `to_trash` and the volume
    /// keeps one).
    pub(crate) fn remove_dir(
        &self,
        _ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        to_trash: bool,
    ) -> Result<()> {
        check_len(name)?;
        if name == b"." {
            return sys(libc::EINVAL);
        }
        if name == b".." {
            return sys(libc::ENOTEMPTY);
        }
        let (bin, lock) = self.deletion_bin(parent, name, to_trash)?;
        let mut trashed: Option<(Ino, Vec<u8>, Attr)> = None;
        let e = self.epoch();
        let mut after = None;
        let hints = self.entry_hints(parent, name, true, bin);
        self.engine
            .write_entry(&lock, &hints, |tx| {
                trashed = None;
                let mut p = Self::parent_dir(tx, parent)?;
                let Some((eid, mut a)) = tx.lock_entry(parent, name)? else {
                    return fail(libc::ENOENT);
                };
                if a.kind != Kind::Dir {
                    return fail(libc::ENOTDIR);
                }
                check_dir_change(&p, true)?;
                check_protected(&a)?;
                if !tx.dir_is_empty(a.ino)? {
                    return fail(libc::ENOTEMPTY);
                }
                self.quota_charge(tx, parent, (0, -1))?;
                let now = now_nanos();
                p.mtime = now;
                p.ctime = now;
                if let Some(b) = Self::trashes_from(bin, &p) {
                    let tname = Self::trash_move(tx, b, Some(eid), &mut p, &mut a, name, now)?;
                    tx.update_node(&p)?;
                    trashed = Some((b.hour, tname, a));
                    after = Some((p, 0));
                    return Ok(());
                }
                p.nlink = p.nlink.saturating_sub(1);
                let open = tx.remove_entry(eid, &p, a.ino)?;
                a.nlink = 0;
                a.ctime = now;
                self.release(tx, &a, open, now)?;
                after = Some((p, a.ino));
                Ok(())
            })
            .inspect(|_| {
                if let Some((p, gone)) = after.take() {
                    let mut facts = vec![Fact::Name(parent, name.to_vec(), None), Fact::Attr(p)];
                    match &trashed {
                        Some((hour, tname, a)) => {
                            facts.push(Fact::Stale(a.ino));
                            facts.push(Fact::Attr(a.clone()));
                            facts.extend(trash::arrived(*hour, tname, a.ino));
                        }
                        None => facts.push(Fact::Gone(gone)),
                    }
                    self.cache.learn(e, &facts);
                }
                self.engine.publish(|| {
                    let mut v = vec![entry_changed(parent, name), attr_changed(parent)];
                    if let Some((hour, tname, a)) = &trashed {
                        v.extend(trash::arrival_changes(*hour, tname));
                        v.push(attr_changed(a.ino));
                    }
                    v
                })
            })
            .inspect_err(|err| self.failed_move(err, &[(parent, name)]))
    }

    /// Sets the flags of `ino` to what `new` makes of its attributes (or refuses), in one
    /// transaction; its ctime moves if they change.
    fn update_flags(
        &self,
        ino: Ino,
        new: impl Fn(&Attr) -> TxResult<u32> + Send + Sync,
    ) -> Result<Attr> {
        let e = self.epoch();
        self.engine
            .write_grouped(&[ino], false, |tx| {
                let mut a = tx.lock_node(ino)?;
                let want = new(&a)?;
                if a.flags != want {
                    a.flags = want;
                    a.ctime = now_nanos();
                    tx.update_node(&a)?;
                }
                Ok(a)
            })
            .inspect(|a| {
                self.cache.learn(e, &[Fact::Attr(a.clone())]);
                self.engine.publish(|| vec![attr_changed(ino)])
            })
    }
}

impl<E: Engine> Meta for EngineMeta<E> {
    fn format(&self) -> Format {
        self.format.read().clone()
    }

    fn set_format(&self, new: &Format) -> Result<()> {
        let json = serde_json::to_string(new).expect("format serializes");
        self.engine.write(&[], false, |tx| {
            let old = tx
                .setting("format")?
                .ok_or_else(|| corrupt("the volume's settings are missing".into()))?;
            let old = parse_format(&old, "the volume").map_err(|e| corrupt(e.to_string()))?;
            if let Some(what) = fixed_setting_changed(&old, new) {
                return Err(super::engine::TxError::Meta(Error::Refused(format!(
                    "{what} cannot change once a volume is formatted"
                ))));
            }
            tx.set_setting("format", &json)
        })?;
        *self.format.write() = new.clone();
        Ok(())
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
        self.engine.snapshot(|tx| {
            if tx.get_node(dir)?.kind != Kind::Dir {
                return fail(libc::ENOTDIR);
            }
            let mut s = quota::tree_summary(tx, dir)?;
            // The trash is not part of the tree a program sees (the root does not list it).
            if dir == ROOT_INO {
                if let Some((_, t)) = tx.get_edge(ROOT_INO, trash::TRASH_NAME)? {
                    let mut gone = quota::tree_summary(tx, t)?;
                    gone.dirs += 1;
                    s = s.minus(&gone);
                }
            }
            Ok(s)
        })
    }

    fn dir_path(&self, dir: Ino) -> Result<Vec<u8>> {
        self.engine.read(|tx| quota::dir_path(tx, dir))
    }

    fn names_of(&self, ino: Ino) -> Result<Vec<(Ino, Vec<u8>)>> {
        self.engine.read(|tx| tx.names_of(ino))
    }

    fn set_quarantined(&self, ino: Ino, on: bool) -> Result<Attr> {
        self.update_flags(ino, |a| {
            Ok(match on {
                true => a.flags | flags::QUARANTINED,
                false => a.flags & !flags::QUARANTINED,
            })
        })
    }

    fn destroy(&self) -> Result<()> {
        let me = self.sid();
        self.engine.write(&[], true, |tx| {
            let now = now_nanos();
            let live = tx
                .sessions()?
                .into_iter()
                .filter(|(id, info, hb)| *id != me && !row_dead(info, *hb, now))
                .count();
            if live > 0 {
                return Err(Error::Refused(format!(
                    "the volume is mounted by {live} client(s) (see `unkai status`); unmount \
                     it everywhere first"
                ))
                .into());
            }
            tx.erase_volume()
        })
    }

    fn check_storage(&self) -> Result<Vec<String>> {
        self.engine.check_storage()
    }

    fn watch(&self, sink: ChangeSink) -> Result<bool> {
        // Pushed changes reach the cache first, then the caller: while they flow, the cache
        // answers; when they stop, it is off (and forgets) until they flow again.
        let (cache, pushed) = (self.cache.clone(), self.pushed.clone());
        let sink: ChangeSink = Box::new(move |c| {
            match &c {
                Change::Up => pushed.store(true, Ordering::Release),
                Change::Down => {
                    pushed.store(false, Ordering::Release);
                    cache.set_on(false);
                }
                _ => cache.changed(&c),
            }
            sink(c)
        });
        self.engine.watch(self.sid(), sink)
    }

    fn new_session(&self, mut info: SessionInfo) -> Result<u64> {
        self.clean_dead_sessions()?;
        let now = now_nanos();
        info.started = now;
        info.heartbeat = now;
        let json = serde_json::to_string(&info).unwrap_or_default();
        let id = self.engine.single(|tx| tx.insert_session(&json, now))?;
        *self.session.lock() = id;
        // Slice ids taken before are not reserved by this session: start a fresh batch.
        *self.slices.lock() = IdPool { next: 0, end: 0 };
        self.share_opens()?;
        Ok(id)
    }

    fn heartbeat(&self) -> Result<()> {
        let sid = self.sid();
        let alive = self
            .engine
            .single(|tx| tx.touch_session(sid, now_nanos()))?;
        if !alive && sid != 0 {
            tracing::warn!(
                "session {sid} was ended by another client (heartbeat too late?): files open \
                 here are no longer protected from unlinks elsewhere"
            );
        }
        self.clean_dead_sessions()?;
        self.reload_format()?;
        match self.purge_expired() {
            Ok(0) => {}
            Ok(n) => tracing::info!("trash: {n} expired entries deleted"),
            Err(e) => tracing::warn!("trash: purging expired entries: {e}"),
        }
        self.share_opens()
    }

    fn watch_sessions(&self) -> Result<()> {
        self.share_opens()
    }

    fn report_staged(&self, blocks: u64, bytes: u64) -> Result<()> {
        let sid = self.sid();
        if sid == 0 {
            return Ok(());
        }
        self.engine.single(|tx| {
            let Some((_, info, _)) = tx.session(sid)? else {
                return Ok(());
            };
            let Ok(mut s) = serde_json::from_str::<SessionInfo>(&info) else {
                return Ok(());
            };
            s.staged_blocks = blocks;
            s.staged_bytes = bytes;
            let json = serde_json::to_string(&s).unwrap_or(info);
            tx.set_session_info(sid, &json)
        })
    }

    fn close_session(&self) -> Result<()> {
        self.engine.unwatch();
        let sid = self.sid();
        if sid == 0 {
            return Ok(());
        }
        self.end_session(sid)?;
        *self.session.lock() = 0;
        *self.slices.lock() = IdPool { next: 0, end: 0 };
        self.sync()
    }

    fn sessions(&self) -> Result<Vec<SessionInfo>> {
        let rows = self.engine.read(|tx| tx.sessions())?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, info, hb)| {
                let mut s: SessionInfo = serde_json::from_str(&info).ok()?;
                s.id = id;
                s.heartbeat = hb;
                Some(s)
            })
            .collect())
    }

    fn usage(&self) -> Result<Usage> {
        self.engine.snapshot(|tx| tx.usage())
    }

    fn lookup(&self, _ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr> {
        check_len(name)?;
        if name == b"." {
            return self.getattr(parent);
        }
        if name == b".." {
            return self.engine.read(|tx| {
                let p = tx.get_node(parent)?;
                tx.get_node(p.parent.max(ROOT_INO))
            });
        }
        if parent == ROOT_INO && name == trash::TRASH_NAME {
            // Known from now on: nothing may be made in the trash's own directories.
            self.trash_ino()?;
        }
        let e = self.epoch();
        if e.is_some() {
            match self.cache.name(parent, name) {
                Some(None) => return sys(libc::ENOENT),
                Some(Some(ino)) => {
                    if let Some(a) = self.cache.attr(ino) {
                        return Ok(a);
                    }
                }
                None => {}
            }
        }
        let res = self.engine.read(|tx| tx.find(parent, name));
        match &res {
            Ok(a) => self.cache.fill(
                e,
                &[
                    Fact::Name(parent, name.to_vec(), Some(a.ino)),
                    Fact::Attr(a.clone()),
                ],
            ),
            Err(err) if err.errno() == libc::ENOENT => self
                .cache
                .fill(e, &[Fact::Name(parent, name.to_vec(), None)]),
            Err(_) => {}
        }
        res
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        let e = self.epoch();
        if e.is_some() {
            if let Some(a) = self.cache.attr(ino) {
                return Ok(a);
            }
        }
        self.read_attr(e, ino)
    }

    fn setattr(&self, _ctx: &Ctx, ino: Ino, set: &SetAttr) -> Result<Attr> {
        if set.is_empty() {
            return self.getattr(ino);
        }
        let now = now_nanos();
        let e = self.epoch();
        // No inode to lock first: the UPDATE of `set_attr` locks its row itself (and a
        // chmod's ACL is read and rewritten under that lock). On PostgreSQL a chmod is then two
        // round trips (BEGIN, the UPDATE and the ACL's read in one; the ACL's rewrite with
        // COMMIT), anything else one statement on its own.
        let res = if set.mode.is_some() {
            // chmod rewrites the access ACL's owner, mask and other entries.
            self.engine.write_grouped(&[], false, |tx| {
                let (a, access) = tx.set_attr_with_acl(ino, set, now)?;
                if let Some(b) = access {
                    let mut acl = Self::stored_acl(ino, &b)?;
                    acl.chmod(a.mode);
                    tx.put_xattr(ino, acl::ACCESS, &acl.to_xattr())?;
                }
                Ok(a)
            })
        } else {
            self.engine.single_grouped(|tx| tx.set_attr(ino, set, now))
        };
        res.inspect(|a| {
            // A chmod may rewrite the access ACL: the xattrs known go.
            let mut facts = vec![Fact::Attr(a.clone())];
            if set.mode.is_some() {
                facts.insert(0, Fact::Stale(ino));
            }
            self.cache.learn(e, &facts);
            self.engine.publish(|| vec![attr_changed(ino)])
        })
    }

    fn set_flags(&self, ctx: &Ctx, ino: Ino, new: u32) -> Result<Attr> {
        if new & !flags::KEPT != 0 {
            return sys(libc::EOPNOTSUPP);
        }
        self.update_flags(ino, |a| {
            // The owner may; immutable and append-only take privilege (the kernel has
            // checked both already; a client of another kind may not have).
            if ctx.uid != 0 && (ctx.uid != a.uid || (a.flags ^ new) & flags::PRIVILEGED != 0) {
                return fail(libc::EPERM);
            }
            Ok(new | (a.flags & flags::INTERNAL))
        })
    }

    fn set_atimes(&self, times: &[(Ino, Nanos)]) -> Result<()> {
        if times.is_empty() {
            return Ok(());
        }
        let inos: Vec<Ino> = times.iter().map(|t| t.0).collect();
        let e = self.epoch();
        let res = self.engine.write(&inos, false, |tx| {
            for &(ino, at) in times {
                if let Some(mut a) = unless_gone(tx.lock_node(ino))? {
                    if at > a.atime {
                        a.atime = at;
                        tx.update_node(&a)?;
                    }
                }
            }
            Ok(())
        });
        let facts: Vec<Fact> = inos.iter().map(|i| Fact::Stale(*i)).collect();
        self.cache.learn(e, &facts);
        res
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
    fn link(&self, _ctx: &Ctx, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        if parent == ROOT_INO && name == trash::TRASH_NAME {
            return sys(libc::EEXIST);
        }
        let e = self.epoch();
        let mut after = None;
        self.engine
            .write_grouped(&[ino, parent], false, |tx| {
                let (mut a, mut p) = tx.lock_two(ino, parent)?;
                if a.kind == Kind::Dir {
                    return fail(libc::EPERM);
                }
                if a.nlink == 0 {
                    return fail(libc::ENOENT);
                }
                if p.kind != Kind::Dir {
                    return fail(libc::ENOTDIR);
                }
                if p.nlink == 0 {
                    return fail(libc::ENOENT);
                }
                if tx.get_edge(parent, name)?.is_some() {
                    return fail(libc::EEXIST);
                }
                self.check_not_trash(&p)?;
                check_protected(&a)?;
                check_dir_change(&p, false)?;
                if a.nlink >= u32::MAX - 1 {
                    return fail(libc::EMLINK);
                }
                let now = now_nanos();
                tx.insert_edge(parent, name, ino, a.kind)?;
                self.quota_charge(tx, parent, quota::entry_use(&a))?;
                a.nlink += 1;
                a.ctime = now;
                tx.update_node(&a)?;
                p.mtime = now;
                p.ctime = now;
                tx.update_node(&p)?;
                after = Some(p);
                Ok(a)
            })
            .inspect(|r| {
                let mut facts = vec![
                    Fact::Attr(r.clone()),
                    Fact::Name(parent, name.to_vec(), Some(r.ino)),
                ];
                facts.extend(after.take().map(Fact::Attr));
                self.cache.learn(e, &facts);
                self.engine
                    .publish(|| named_inode_changed(parent, name, r.ino))
            })
            .inspect_err(|_| {
                self.failed(&[(parent, name)]);
                self.cache.learn(None, &[Fact::Stale(ino)]);
            })
    }

    fn unlink(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr> {
        match self.remove(ctx, parent, name, true) {
            // The trash's hour directory went meanwhile: made again.
            Err(e) if e.errno() == libc::ESTALE => self.remove(ctx, parent, name, true),
            r => r,
        }
    }

    fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        match self.remove_dir(ctx, parent, name, true) {
            // The trash's hour directory went meanwhile: made again.
            Err(e) if e.errno() == libc::ESTALE => self.remove_dir(ctx, parent, name, true),
            r => r,
        }
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
        check_len(name)?;
        check_name(new_name)?;
        if flags.exchange && (flags.noreplace || flags.whiteout) {
            return sys(libc::EINVAL);
        }
        if (parent == ROOT_INO && name == trash::TRASH_NAME)
            || (new_parent == ROOT_INO && new_name == trash::TRASH_NAME)
        {
            return sys(libc::EPERM);
        }
        let whiteout = if flags.whiteout {
            Some(self.alloc(&self.inos, "nextInode")?)
        } else {
            None
        };
        let bin = self.bin()?;
        let mut lock = vec![parent, new_parent];
        lock.extend(bin.map(|b| b.hour));
        let mut trashed: Option<(Ino, Vec<u8>)> = None;
        // Moves between directories take the rename lock: one at a time (check_not_below).
        let cross = parent != new_parent;
        let e = self.epoch();
        let mut moved = None;
        self.engine
            .write_grouped(&lock, cross, |tx| {
                trashed = None;
                let now = now_nanos();
                let (p1, p2) = tx.lock_two(parent, new_parent)?;
                for p in [&p1, &p2] {
                    if p.kind != Kind::Dir {
                        return fail(libc::ENOTDIR);
                    }
                    if p.nlink == 0 {
                        return fail(libc::ENOENT);
                    }
                }
                self.check_not_trash(&p2)?;
                let Some((src_eid, src_ino)) = tx.get_edge(parent, name)? else {
                    return fail(libc::ENOENT);
                };
                let dst_edge = tx.get_edge(new_parent, new_name)?;
                moved = Some((src_ino, dst_edge.map(|d| d.1)));
                let (src, dst) = match dst_edge {
                    Some((dst_eid, dst_ino)) if dst_ino != src_ino => {
                        let (s, d) = tx.lock_two(src_ino, dst_ino)?;
                        (s, Some((dst_eid, d)))
                    }
                    // The same inode under both names (hard links): nothing to do.
                    Some(_) => {
                        tx.lock_node(src_ino)?;
                        if flags.noreplace {
                            return fail(libc::EEXIST);
                        }
                        return Ok(None);
                    }
                    None => (tx.lock_node(src_ino)?, None),
                };
                check_dir_change(&p1, true)?;
                check_dir_change(&p2, dst.is_some())?;
                check_protected(&src)?;
                if let Some((_, d)) = &dst {
                    check_protected(d)?;
                }
                let moved_attrs = self
                    .quotas_kept()
                    .then(|| (src.clone(), dst.as_ref().map(|d| d.1.clone())));
                if flags.exchange {
                    let Some(dst) = dst else {
                        return fail(libc::ENOENT);
                    };
                    Self::exchange(tx, (p1, p2), (src_eid, src), dst, now)?;
                    if let Some((s, d)) = &moved_attrs {
                        self.quota_rename(tx, (parent, new_parent), s, d.as_ref(), true)?;
                    }
                    return Ok(None);
                }
                let victim = self.move_entry(
                    tx,
                    (p1, p2),
                    (src_eid, src),
                    dst,
                    new_parent,
                    new_name,
                    flags.noreplace,
                    now,
                    (bin, &mut trashed),
                )?;
                if let Some((s, d)) = &moved_attrs {
                    self.quota_rename(tx, (parent, new_parent), s, d.as_ref(), false)?;
                }
                if let Some(ino) = whiteout {
                    let w = new_node(ino, Kind::CharDev, 0, (ctx.uid, ctx.gid), parent, now);
                    tx.create_entry(&w, parent, name)?;
                    tx.charge(0, 1, 0, self.format.read().inodes)?;
                    self.quota_charge(tx, parent, (0, 1))?;
                }
                Ok(victim)
            })
            .inspect(|r| {
                let mut facts = Self::renamed(
                    moved,
                    flags,
                    whiteout,
                    r,
                    (parent, name),
                    (new_parent, new_name),
                );
                if let (Some((hour, tname)), Some(v)) = (&trashed, r) {
                    facts.extend(trash::arrived(*hour, tname, v.ino));
                }
                self.cache.learn(e, &facts);
                self.engine.publish(|| {
                    let mut v = vec![
                        entry_changed(parent, name),
                        entry_changed(new_parent, new_name),
                        attr_changed(parent),
                        attr_changed(new_parent),
                    ];
                    v.extend(r.iter().map(|a| attr_changed(a.ino)));
                    if let Some((hour, tname)) = &trashed {
                        v.extend(trash::arrival_changes(*hour, tname));
                    }
                    v
                })
            })
            .inspect_err(|err| self.failed_move(err, &[(parent, name), (new_parent, new_name)]))
    }

    fn readdir(&self, ino: Ino, cookie: u64, limit: usize, plus: bool) -> Result<Vec<DirEntry>> {
        let dot = cookie < 1 && limit > 0;
        let dotdot = cookie < 2 && limit > usize::from(dot);
        let want = limit - usize::from(dot) - usize::from(dotdot);
        let after = cookie.saturating_sub(2) as i64;
        let (dir, pattr, listed) = self
            .engine
            .snapshot(|tx| tx.read_dir(ino, plus && dotdot, after, want as i64, plus))?;
        let mut out = Vec::new();
        if dot {
            out.push(DirEntry {
                name: b".".to_vec(),
                ino,
                kind: Kind::Dir,
                cookie: 1,
                attr: plus.then(|| dir.clone()),
            });
        }
        if dotdot {
            out.push(DirEntry {
                name: b"..".to_vec(),
                ino: dir.parent.max(ROOT_INO),
                kind: Kind::Dir,
                cookie: 2,
                attr: pattr,
            });
        }
        // The trash is reached by its name, never listed: `find`, `du` and `rm -rf` of the
        // root pass it by.
        out.extend(
            listed
                .into_iter()
                .filter(|e| ino != ROOT_INO || e.name != trash::TRASH_NAME),
        );
        Ok(out)
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.engine.read(|tx| match tx.symlink(ino)? {
            Some(t) => Ok(t),
            None => {
                tx.get_node(ino)?;
                fail(libc::EINVAL)
            }
        })
    }

    fn getlk(
        &self,
        ino: Ino,
        owner: u64,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Result<Option<LockRange>> {
        let me = self.lock_owner(owner);
        let held = self.engine.read(|tx| tx.locks(ino))?;
        Ok(lock::conflict(&held, me, kind, start, end).map(|(_, r)| r))
    }

    fn setlk(&self, ino: Ino, owner: u64, req: LockRequest) -> Result<Option<LockRange>> {
        let me = self.lock_owner(owner);
        lock::settle(
            || {
                // The inode's lock orders the lockers of one inode across clients.
                self.engine.write(&[ino], false, |tx| {
                    tx.lock_node(ino)?;
                    // Locks of sessions that ended are void.
                    tx.drop_orphan_locks(ino)?;
                    let held = tx.locks(ino)?;
                    let d = lock::decide(&held, me, req);
                    if let lock::Decision::Store(ranges) = &d {
                        tx.store_locks(ino, me, ranges)?;
                    }
                    Ok(d)
                })
            },
            |s| self.session_is_dead(s),
            || self.clean_dead_sessions(),
        )
        .inspect(|_| {
            // Programs that coordinate with locks read what the last holder wrote: a change
            // another client made may not have been pushed here yet, so after a lock
            // nothing is answered from what was known before it.
            if self.pushed.load(Ordering::Acquire) {
                self.cache.clear();
            }
        })
    }

    fn open_inode(&self, ino: Ino) -> Result<Attr> {
        let t = self.opens.transition(ino);
        // Counted before the lookup: an unlink or a rename over the name committing after the
        // lookup then sees the open and keeps the inode.
        let (first, recorded) = self.opens.add(ino);
        if !(first && recorded) {
            drop(t);
            // Counting first is not enough where opens are counted in memory: a write
            // transaction in flight (an unlink, a rename over the name) may have found the
            // inode not open just before the count and be about to commit its deletion. Once
            // it has committed, the lookup below fails, or it saw the count and kept the inode.
            self.engine.settle_writes();
            // From the engine, not from memory: a write that committed its deletion before
            // the settle tells the cache after releasing the writer, so the cache may not
            // know yet (and close-to-open: an open sees what the last close elsewhere
            // committed, even before its change is pushed here).
            return self.fresh_attr(ino).inspect_err(|_| {
                let _ = self.close_inode(ino);
            });
        }
        // The first open here, recorded for other clients' unlinks to see: an unlink that
        // commits first leaves nothing to open (ENOENT) or an inode another client keeps; one
        // after sees the record and keeps the inode.
        let sid = self.sid();
        self.engine
            .single(|tx| tx.open_node(ino, sid))
            .inspect_err(|_| {
                self.opens.remove(ino);
            })
    }

    fn close_inode(&self, ino: Ino) -> Result<()> {
        let _t = self.opens.transition(ino);
        let (last, recorded) = self.opens.remove(ino);
        if !last {
            return Ok(());
        }
        // The last close here. Most are of linked files: one statement forgets the open and
        // reads the link count (after any unlink holding the inode has committed).
        let sid = self.sid();
        // Not recorded (an engine that counts opens in memory): a read, after the writes in
        // flight, and among the changes grouped with them.
        let nlink = match recorded {
            true => self.engine.single(|tx| tx.close_node(ino, sid, recorded))?,
            false => self
                .engine
                .write_grouped(&[ino], false, |tx| tx.close_node(ino, sid, recorded))?,
        };
        if nlink.is_none_or(|n| n > 0) {
            return Ok(());
        }
        // Unlinked: the last close anywhere deletes it. Another client closing at the same
        // time waits for this lock, and the one that finds no open left deletes.
        let e = self.epoch();
        let res = self.engine.write(&[ino], false, |tx| {
            let Some(a) = unless_gone(tx.lock_node(ino))? else {
                return Ok(());
            };
            if a.nlink == 0 {
                tx.delete_sustained(ino, Some(sid))?;
                if !tx.open_anywhere(ino)? {
                    tx.delete_sustained(ino, None)?;
                    self.delete_inode(tx, &a, now_nanos())?;
                }
            }
            Ok(())
        });
        self.cache.learn(e, &[Fact::Gone(ino)]);
        res
    }

    fn truncate(&self, _ctx: &Ctx, ino: Ino, length: u64) -> Result<Attr> {
        if length > MAX_FILE_SIZE {
            return sys(libc::EFBIG);
        }
        let e = self.epoch();
        self.engine
            .write(&[ino], false, |tx| {
                let mut a = Self::lock_file(tx, ino, libc::EINVAL)?;
                check_protected(&a)?;
                let now = now_nanos();
                if length < a.length {
                    let dropped = tx.drop_chunks(ino, length.div_ceil(CHUNK_SIZE), u64::MAX)?;
                    let gone: u64 = dropped.iter().map(|c| slice::covered(c)).sum();
                    a.stored = a.stored.saturating_sub(gone);
                    tx.decref(&dropped.concat(), now)?;
                    let pos = length % CHUNK_SIZE;
                    if pos != 0 {
                        let index = (length / CHUNK_SIZE) as u32;
                        let recs = tx.chunk(ino, index)?;
                        if recs.iter().any(|r| r.end() > pos) {
                            let z = SliceRec::zero(pos as u32, (CHUNK_SIZE - pos) as u32);
                            self.append(tx, &mut a, &[(index, z)])?;
                        }
                    }
                }
                let old = a.length;
                a.length = length;
                self.store_file(tx, &mut a, old, Some(now))?;
                Ok(a)
            })
            .inspect(|a| self.stored(e, a))
    }

    fn fallocate(
        &self,
        _ctx: &Ctx,
        ino: Ino,
        mode: FallocMode,
        off: u64,
        len: u64,
    ) -> Result<Attr> {
        let end = off.checked_add(len).filter(|e| *e <= MAX_FILE_SIZE);
        let Some(end) = end else {
            return sys(libc::EFBIG);
        };
        if len == 0 {
            return sys(libc::EINVAL);
        }
        let e = self.epoch();
        self.engine
            .write(&[ino], false, |tx| {
                let mut a = Self::lock_file(tx, ino, libc::ENODEV)?;
                // As Linux: nothing on an immutable file, only allocation on an append-only.
                let reshapes = mode.punch_hole || mode.zero_range;
                if a.flags & flags::IMMUTABLE != 0 || (a.flags & flags::APPEND != 0 && reshapes) {
                    return fail(libc::EPERM);
                }
                let now = now_nanos();
                // As ext4: a punched hole is stored no more (and nothing is punched past the
                // end); a zeroed range stays allocated, as unwritten extents; an allocation
                // reserves the holes of the range, data left as it is. A reservation counts
                // as stored (`st_blocks`), so writing into it later grows nothing.
                let recs = if mode.punch_hole {
                    slice::zero_recs(off, end.min(a.length))
                } else if mode.zero_range {
                    slice::reserved_recs(off, end)
                } else {
                    slice::reserve_holes(off, end, |i| tx.chunk(ino, i))?
                };
                if !recs.is_empty() {
                    self.append(tx, &mut a, &recs)?;
                }
                let old = a.length;
                if !mode.keep_size && !mode.punch_hole && end > a.length {
                    a.length = end;
                }
                let touched = a.length != old || mode.punch_hole || mode.zero_range;
                self.store_file(tx, &mut a, old, touched.then_some(now))?;
                Ok(a)
            })
            .inspect(|a| self.stored(e, a))
    }

    fn read_chunk(&self, ino: Ino, index: u32) -> Result<Vec<SliceRec>> {
        self.engine.read(|tx| tx.chunk(ino, index))
    }

    fn new_slice_id(&self) -> Result<u64> {
        self.alloc_slice()
    }

    fn reserved_slices(&self) -> Result<Vec<(u64, u64, u64)>> {
        let now = now_nanos();
        let (sessions, ranges) = self
            .engine
            .snapshot(|tx| Ok((tx.sessions()?, tx.reserved_slices()?)))?;
        let live: std::collections::HashSet<u64> = sessions
            .into_iter()
            .filter(|(_, info, hb)| !row_dead(info, *hb, now))
            .map(|(id, _, _)| id)
            .collect();
        Ok(ranges
            .into_iter()
            .filter(|(s, _, _)| live.contains(s))
            .collect())
    }

    fn session_id(&self) -> u64 {
        self.sid()
    }

    fn slice_id_floor(&self) -> u64 {
        // Ids come from the pool in order; the next batch starts at or after its end.
        self.slices.lock().next
    }

    fn trim_reserved(&self, below: u64) -> Result<()> {
        let sid = self.sid();
        if sid == 0 {
            return Ok(());
        }
        // Never past the ids this client still holds in its pool.
        let below = below.min(self.slices.lock().next);
        self.engine
            .write(&[], false, |tx| tx.release_slices(sid, Some(below)))
    }

    fn write_slices(&self, ino: Ino, slices: &[(u32, SliceRec)], mtime: Nanos) -> Result<Attr> {
        let e = self.epoch();
        self.engine
            .write(&[ino], false, |tx| {
                let mut a = tx.lock_node(ino)?;
                if a.kind != Kind::File {
                    return fail(libc::EBADF);
                }
                if a.flags & flags::IMMUTABLE != 0 {
                    return fail(libc::EPERM);
                }
                let old = a.length;
                let recs: Vec<SliceRec> = slices.iter().map(|(_, r)| *r).collect();
                tx.incref(&recs)?;
                for (index, r) in slices {
                    a.length = a.length.max(*index as u64 * CHUNK_SIZE + r.end());
                }
                self.append(tx, &mut a, slices)?;
                self.store_file(tx, &mut a, old, Some(mtime))?;
                Ok(a)
            })
            .inspect(|a| self.stored(e, a))
    }

    fn copy_range(
        &self,
        _ctx: &Ctx,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
    ) -> Result<(u64, Attr)> {
        let e = self.epoch();
        self.engine
            .write(&[src, dst], false, |tx| {
                let (s, mut d) = tx.lock_two(src, dst)?;
                if s.kind == Kind::Dir || d.kind == Kind::Dir {
                    return fail(libc::EISDIR);
                }
                if s.kind != Kind::File || d.kind != Kind::File {
                    return fail(libc::EINVAL);
                }
                if d.flags & flags::IMMUTABLE != 0 {
                    return fail(libc::EPERM);
                }
                if d.flags & flags::APPEND != 0 {
                    return fail(libc::EBADF);
                }
                if src_off >= s.length || len == 0 {
                    return Ok((0, d));
                }
                let len = len.min(s.length - src_off);
                if dst_off.checked_add(len).is_none_or(|e| e > MAX_FILE_SIZE) {
                    return fail(libc::EFBIG);
                }
                if src == dst && src_off < dst_off + len && dst_off < src_off + len {
                    return fail(libc::EINVAL);
                }
                // Destination records, computed from the source as it is before the copy.
                let out = slice::plan_copy(src_off, dst_off, len, |index| tx.chunk(src, index))?;
                let recs: Vec<SliceRec> = out.iter().map(|(_, r)| *r).collect();
                tx.incref(&recs)?;
                self.append(tx, &mut d, &out)?;
                let now = now_nanos();
                let old = d.length;
                d.length = d.length.max(dst_off + len);
                self.store_file(tx, &mut d, old, Some(now))?;
                Ok((len, d))
            })
            .inspect(|(_, d)| self.stored(e, d))
    }

    fn replace_slices(
        &self,
        ino: Ino,
        index: u32,
        old: &[SliceRec],
        new: &[SliceRec],
    ) -> Result<bool> {
        let e = self.epoch();
        let res = self.engine.write(&[ino], false, |tx| {
            // The inode's lock keeps writers of this chunk out until we are done.
            let Some(mut a) = unless_gone(tx.lock_node(ino))? else {
                return Ok(false);
            };
            let cur = tx.chunk(ino, index)?;
            if cur.len() < old.len() || cur[..old.len()] != *old {
                return Ok(false);
            }
            let mut list = new.to_vec();
            list.extend_from_slice(&cur[old.len()..]);
            tx.incref(new)?;
            tx.decref(old, now_nanos())?;
            tx.set_chunk(ino, index, &list)?;
            let (after, before) = (slice::covered(&list), slice::covered(&cur));
            if after != before {
                a.stored = (a.stored + after).saturating_sub(before);
                tx.update_node(&a)?;
            }
            Ok(true)
        });
        self.cache.learn(e, &[Fact::Stale(ino)]);
        res
    }

    fn fragmented_chunks(&self, min_records: usize, limit: usize) -> Result<Vec<(Ino, u32)>> {
        let mut f = self.fragmented.lock();
        let picked: Vec<(Ino, u32)> = f
            .iter()
            .filter(|(_, n)| **n >= min_records)
            .map(|(k, _)| *k)
            .take(limit)
            .collect();
        for k in &picked {
            f.remove(k);
        }
        Ok(picked)
    }

    fn set_xattr(
        &self,
        ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        how: XattrSet,
    ) -> Result<()> {
        if name.is_empty() {
            return sys(libc::EINVAL);
        }
        if name.len() > MAX_XATTR_NAME {
            return sys(libc::ERANGE);
        }
        if value.len() > MAX_XATTR_VALUE {
            return sys(libc::E2BIG);
        }
        let acl = match acl::is_acl(name) {
            true => Some(acl::Acl::parse(value).ok_or(Error::Sys(libc::EINVAL))?),
            false => None,
        };
        let e = self.epoch();
        let mut after = None;
        self.engine
            .write_grouped(&[ino], false, |tx| {
                let mut a = tx.lock_node(ino)?;
                check_protected(&a)?;
                let exists = tx.xattr(ino, name)?.is_some();
                match how {
                    XattrSet::Create if exists => return fail(libc::EEXIST),
                    XattrSet::Replace if !exists => return fail(libc::ENODATA),
                    _ => {}
                }
                match &acl {
                    Some(acl) => Self::put_acl(tx, ctx, &mut a, name, acl)?,
                    None => tx.put_xattr(ino, name, value)?,
                }
                a.ctime = now_nanos();
                tx.update_node(&a)?;
                after = Some(a);
                Ok(())
            })
            .inspect(|_| self.xattrs_changed(e, ino, after.take()))
    }

    fn get_xattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        if name.len() > MAX_XATTR_NAME {
            return sys(libc::ERANGE);
        }
        if name == trash::ORIGIN {
            // Where a trashed entry was: its whole path, resolved now.
            return self.origin_path(ino);
        }
        let e = self.epoch();
        if e.is_some() {
            match self.cache.xattr(ino, name) {
                Some(Some(v)) => return Ok(v),
                Some(None) => return sys(libc::ENODATA),
                None => {}
            }
        }
        let res = self.engine.read(|tx| match tx.xattr(ino, name)? {
            Some(v) => Ok(v),
            None => {
                tx.get_node(ino)?;
                fail(libc::ENODATA)
            }
        });
        match &res {
            Ok(v) => self.cache.fill_xattr(e, ino, name, Some(v)),
            Err(err) if err.errno() == libc::ENODATA => self.cache.fill_xattr(e, ino, name, None),
            Err(_) => {}
        }
        res
    }

    fn list_xattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.engine.snapshot(|tx| {
            tx.get_node(ino)?;
            tx.xattr_names(ino)
        })
    }

    fn remove_xattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<()> {
        if name.len() > MAX_XATTR_NAME {
            return sys(libc::ERANGE);
        }
        let is_acl = acl::is_acl(name);
        let e = self.epoch();
        let mut after = None;
        self.engine
            .write_grouped(&[ino], false, |tx| {
                let mut a = tx.lock_node(ino)?;
                check_protected(&a)?;
                if is_acl {
                    Self::may_set_acl(ctx, &a)?;
                }
                if !tx.delete_xattr(ino, name)? {
                    // As on ext4: an ACL that is not there is removed already.
                    return if is_acl { Ok(()) } else { fail(libc::ENODATA) };
                }
                a.ctime = now_nanos();
                tx.update_node(&a)?;
                after = Some(a);
                Ok(())
            })
            .inspect(|_| self.xattrs_changed(e, ino, after.take()))
    }

    fn sync(&self) -> Result<()> {
        self.engine.sync()
    }

    fn set_alone(&self, alone: bool) {
        self.engine.group_writes(alone);
        self.alone.store(alone, Ordering::Release);
        self.epoch();
    }

    fn dead_slices(&self, limit: usize) -> Result<Vec<DeadSlice>> {
        let cutoff = now_nanos() - self.format.read().trash_days as i64 * 86_400 * 1_000_000_000;
        self.read_committed(|tx| tx.dead_slices(Some(cutoff), limit))
    }

    fn dead_slices_early(&self, limit: usize) -> Result<Vec<DeadSlice>> {
        self.read_committed(|tx| tx.dead_slices_by_age(limit))
    }

    fn purge_trash_early(&self, bytes: u64) -> Result<Option<Purged>> {
        self.purge_early(bytes)
    }

    fn forget_dead_slices(&self, ids: &[u64]) -> Result<()> {
        self.engine.single(|tx| tx.forget_dead(ids))
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
        self.engine.commit_group()?;
        self.engine.snapshot(|tx| f(tx))
    }

    fn write_rows(&self, f: &mut dyn FnMut(&mut dyn Txn) -> TxResult<()>) -> Result<()> {
        self.engine.write(&[], false, |tx| f(tx))
    }

    fn repair(&self, fix: &Fix) -> Result<()> {
        let now = now_nanos();
        self.cache.clear();
        self.engine.write(&[], false, |tx| {
            match fix {
                Fix::RemoveEntry { parent, name } => tx.remove_edge_named(*parent, name)?,
                Fix::SetEntryKind { parent, name, kind } => {
                    tx.set_edge_kind(*parent, name, *kind)?
                }
                Fix::SetNlink { ino, nlink } => {
                    if let Some(mut a) = unless_gone(tx.lock_node(*ino))? {
                        a.nlink = *nlink;
                        tx.update_node(&a)?;
                    }
                }
                Fix::SetParent { ino, parent } => {
                    if let Some(mut a) = unless_gone(tx.lock_node(*ino))? {
                        a.parent = *parent;
                        tx.update_node(&a)?;
                    }
                }
                Fix::DeleteInode { ino } => {
                    let a = tx.lock_node(*ino)?;
                    self.delete_inode(tx, &a, now)?;
                    tx.delete_sustained(*ino, None)?;
                    tx.delete_open(*ino, None)?;
                }
                Fix::Link {
                    ino,
                    parent,
                    name,
                    kind,
                } => tx.insert_edge(*parent, name, *ino, *kind)?,
                Fix::DropChunk { ino, index } => {
                    let recs = tx.drop_chunks(*ino, *index as u64, *index as u64 + 1)?;
                    tx.decref(&recs.concat(), now)?;
                }
                Fix::SetSliceRefs { id, size, refs } => {
                    tx.set_slice_refs(*id, *size, *refs, now)?
                }
                Fix::UndeadSlice { id } => tx.forget_dead(&[*id])?,
                Fix::RemoveSustained { session, ino } => {
                    tx.delete_sustained(*ino, Some(*session))?;
                    tx.delete_open(*ino, Some(*session))?;
                }
                Fix::SetUsage { used_bytes, inodes } => tx.set_usage(*used_bytes, *inodes)?,
                Fix::SetStored { ino, stored } => {
                    if let Some(mut a) = unless_gone(tx.lock_node(*ino))? {
                        a.stored = *stored;
                        tx.update_node(&a)?;
                    }
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settings from a newer unkai (a schema or a block layout this binary does not know) are
    /// refused in one line that says to upgrade, never read with the wrong meaning.
    #[test]
    fn newer_volumes_are_refused() {
        let mut f = Format::for_tests("v", "file:///b", 4 << 20);
        f.layout = format::LAYOUT_VERSION;
        let json = serde_json::to_string(&f).unwrap();
        assert_eq!(parse_format(&json, "u").unwrap(), f);
        for (schema, layout) in [
            (format::SCHEMA_VERSION + 1, format::LAYOUT_VERSION),
            (format::SCHEMA_VERSION, format::LAYOUT_VERSION + 1),
        ] {
            let mut g = f.clone();
            (g.schema, g.layout) = (schema, layout);
            let json = serde_json::to_string(&g).unwrap();
            let e = parse_format(&json, "u").unwrap_err().to_string();
            assert!(e.contains("upgrade unkai") && !e.contains('\n'), "{e}");
        }
    }
}
