//! The metadata layer: inodes, directory entries, chunk→slice maps, xattrs, sessions, counters.
//!
//! One trait, [`Meta`], implemented once (`ops`) over a small trait of what a database
//! provides (`engine`), with one engine per database: `sqlite` (the embedded default) and
//! `postgres` (volumes shared by many machines). Every method is one atomic transaction. The trait speaks POSIX
//! outcomes (`Error::Sys(errno)`) but knows nothing of FUSE, handles or object storage: file
//! *data* is only referenced here, as slice records (see [`slice`]).
//!
//! Not for: permission checks the kernel already performs (`default_permissions`), caching of
//! file data, talking to the bucket.

pub mod acl;
mod cache;
/// The rows of a volume as an engine reads and writes them: public for `admin::dump`, which
/// moves them between engines.
pub mod engine;
pub mod format;
pub mod lock;
mod opens;
mod ops;
pub mod postgres;
pub mod quota;
pub mod session;
pub mod slice;
pub mod sqlite;
pub mod trash;
pub mod url;

use std::time::{SystemTime, UNIX_EPOCH};

pub use format::Format;
pub use lock::{LockKind, LockRange, LockRequest};
pub use slice::SliceRec;

/// Starts a background thread of an engine that leaves the process's signals alone: an
/// engine opens before a mount blocks SIGINT, SIGTERM and SIGHUP for its signal thread, and a
/// thread that does not block them would take SIGTERM and end the process at once (seen: a
/// gateway and an NFS server on PostgreSQL killed by the SIGTERM meant to stop them cleanly,
/// when the signal went to the group commit's timer). Every thread an engine starts starts
/// here.
pub(crate) fn spawn_background(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> Option<std::thread::JoinHandle<()>> {
    use nix::sys::signal::{SigSet, Signal};
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let mut sigs = SigSet::empty();
            for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
                sigs.add(s);
            }
            let _ = sigs.thread_block();
            f()
        })
        .ok()
}

/// Inode number. The root directory is [`ROOT_INO`].
pub type Ino = u64;
pub const ROOT_INO: Ino = 1;

/// Size of a chunk: files are cut at fixed offsets into chunks of this size.
pub const CHUNK_SIZE: u64 = 64 << 20;
/// Largest file: the chunk index must fit in 32 bits.
pub const MAX_FILE_SIZE: u64 = (u32::MAX as u64) * CHUNK_SIZE;

/// Longest name a directory entry may have (bytes).
pub const MAX_NAME_LEN: usize = 255;
/// Largest xattr value and name, as on Linux.
pub const MAX_XATTR_VALUE: usize = 65536;
pub const MAX_XATTR_NAME: usize = 255;
/// The extended attribute holding a file's capabilities (dropped on write and chown).
pub const CAPABILITY: &[u8] = b"security.capability";
/// Longest symlink target (PATH_MAX).
pub const MAX_SYMLINK_LEN: usize = 4096;

/// Errors of the metadata layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A POSIX outcome the caller passes on as-is (ENOENT, EEXIST, ENOTEMPTY...).
    #[error("{}", std::io::Error::from_raw_os_error(*.0))]
    Sys(i32),
    /// The volume has not been formatted yet.
    #[error("volume not formatted at {0}: run `unkai format {0} NAME` first")]
    NotFormatted(String),
    /// A request the user must change (bad URL, volume already exists, ...); the message
    /// says what to do.
    #[error("{0}")]
    Refused(String),
    /// The database failed (I/O, corruption, ...). Reported as EIO to applications.
    #[error("metadata engine: {0}")]
    Engine(String),
}

impl Error {
    pub fn errno(&self) -> i32 {
        match self {
            Error::Sys(e) => *e,
            _ => libc::EIO,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand for a POSIX error.
pub fn sys<T>(errno: i32) -> Result<T> {
    Err(Error::Sys(errno))
}

/// What kind of file an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    CharDev = 5,
    BlockDev = 6,
    Socket = 7,
}

impl Kind {
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::File,
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Fifo,
            5 => Kind::CharDev,
            6 => Kind::BlockDev,
            7 => Kind::Socket,
            _ => return None,
        })
    }

    /// The kind encoded in the S_IFMT bits of a mode.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            libc::S_IFSOCK => Kind::Socket,
            _ => return None,
        })
    }
}

/// Nanoseconds since the Unix epoch.
pub type Nanos = i64;

/// Whether [`now_nanos`] reads the kernel's coarse clock (see [`use_coarse_clock`]).
static COARSE_CLOCK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Stamps times with the kernel's coarse clock (`CLOCK_REALTIME_COARSE`) from now on, for the
/// whole process. A mount with the kernel's writeback cache needs it: the kernel stamps the
/// mtime and ctime of cached files itself, with that clock (a tick of a few ms), and a time
/// we stamped with the precise clock could be later than the kernel's next one, so a ctime
/// would step back (chmod after create, seen in the conformance tests).
pub fn use_coarse_clock() {
    COARSE_CLOCK.store(true, std::sync::atomic::Ordering::Relaxed);
}

pub fn now_nanos() -> Nanos {
    if COARSE_CLOCK.load(std::sync::atomic::Ordering::Relaxed) {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec.
        if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
            return ts.tv_sec * 1_000_000_000 + ts.tv_nsec;
        }
    }
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

/// Inode flags (`chattr`/`lsattr`, FS_IOC_GETFLAGS/SETFLAGS), with Linux's values.
pub mod flags {
    /// Nothing changes it: no write, truncate, rename, link, unlink, chmod, chown, utimes or
    /// xattr; a directory's entries neither come nor go.
    pub const IMMUTABLE: u32 = 0x10;
    /// Only appended to: writes through O_APPEND, no truncate, rename, link or unlink; a
    /// directory gains entries but loses none.
    pub const APPEND: u32 = 0x20;
    /// Skipped by dump(8) and backup tools that honour it (kept, nothing else).
    pub const NODUMP: u32 = 0x40;
    /// The flags unkai keeps; setting any other is refused (EOPNOTSUPP).
    pub const KEPT: u32 = IMMUTABLE | APPEND | NODUMP;
    /// Flags only a privileged caller (CAP_LINUX_IMMUTABLE) may set or clear.
    pub const PRIVILEGED: u32 = IMMUTABLE | APPEND;
    /// Not a `chattr` flag: the inode is in the trash (`meta::trash`), where its one link
    /// is the trash's. A file's link count is reported one lower, so that a file deleted
    /// while open shows `st_nlink` 0 as on any file system; nothing is made in a directory
    /// (ENOENT, as in one removed for good). Cleared when it is moved out.
    pub const TRASHED: u32 = 0x8000_0000;
    /// Not a `chattr` flag: the antivirus scan found the file infected (or, scanning failing
    /// closed, could not scan it): every open is refused (EACCES), by every client
    /// (`vfs::scan`). Unlink still works.
    pub const QUARANTINED: u32 = 0x4000_0000;
    /// The flags of unkai's own that `chattr` neither sets nor clears.
    pub const INTERNAL: u32 = TRASHED | QUARANTINED;
}

/// The attributes of an inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    /// Permission bits including suid/sgid/sticky (0o7777), without the type bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub length: u64,
    pub rdev: u32,
    pub atime: Nanos,
    pub mtime: Nanos,
    pub ctime: Nanos,
    /// Parent directory (directories only; 0 otherwise).
    pub parent: Ino,
    /// The inode flags `chattr` sets (the `FS_*_FL` bits of [`flags`] unkai keeps).
    pub flags: u32,
    /// Bytes of a regular file's data really stored: what its slices cover, holes not
    /// counted (0 for other kinds). Reported in `st_blocks`.
    pub stored: u64,
}

impl Attr {
    /// The link count a program sees: a file in the trash has none of its own.
    pub fn visible_nlink(&self) -> u32 {
        if self.flags & flags::TRASHED != 0 && self.kind != Kind::Dir {
            self.nlink.saturating_sub(1)
        } else {
            self.nlink
        }
    }
}

/// Who is asking: the caller's credentials as FUSE reports them.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// The caller's umask, for what it creates (FUSE sends it with create, mkdir and mknod):
    /// applied by [`Meta::mknod`] unless the directory's default ACL decides the mode.
    pub umask: u32,
}

impl Ctx {
    pub const ROOT: Ctx = Ctx {
        uid: 0,
        gid: 0,
        pid: 0,
        umask: 0,
    };

    /// Whether the caller belongs to `gid`, supplementary groups included (read from /proc).
    pub fn in_group(&self, gid: u32) -> bool {
        if self.gid == gid {
            return true;
        }
        if self.pid == 0 {
            return false;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", self.pid)) else {
            return false;
        };
        status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .map(|g| g.split_whitespace().any(|x| x.parse::<u32>() == Ok(gid)))
            .unwrap_or(false)
    }
}

/// A time to set: now, or a given instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(Nanos),
}

/// The attributes a `setattr` changes (size is changed by [`Meta::truncate`]).
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    /// The kernel's own ctime of the change, under its writeback cache: it owns the times of
    /// the files it caches, shows its own and takes none from us, so the one kept is its.
    pub ctime: Option<Nanos>,
}

impl SetAttr {
    /// Applies the change to `a`; true if anything changed (then ctime is `now`, or the one
    /// given).
    pub fn apply(&self, a: &mut Attr, now: Nanos) -> bool {
        let time = |t: SetTime| match t {
            SetTime::Now => now,
            SetTime::At(n) => n,
        };
        let mut changed = false;
        if let Some(m) = self.mode {
            a.mode = m & 0o7777;
            changed = true;
        }
        if let Some(u) = self.uid {
            a.uid = u;
            changed = true;
        }
        if let Some(g) = self.gid {
            a.gid = g;
            changed = true;
        }
        if let Some(t) = self.atime {
            a.atime = time(t);
            changed = true;
        }
        if let Some(t) = self.mtime {
            a.mtime = time(t);
            changed = true;
        }
        if changed {
            a.ctime = self.ctime.unwrap_or(now);
        }
        changed
    }

    /// The inode flags that forbid this change: immutable forbids all; append-only all but
    /// setting the times to now (as Linux's `notify_change`).
    pub fn blocked_by(&self) -> u32 {
        let explicit = |t: Option<SetTime>| matches!(t, Some(SetTime::At(_)));
        if self.mode.is_some()
            || self.uid.is_some()
            || self.gid.is_some()
            || explicit(self.atime)
            || explicit(self.mtime)
        {
            flags::PRIVILEGED
        } else {
            flags::IMMUTABLE
        }
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.mode.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.atime.is_none()
            && self.mtime.is_none()
    }
}

/// One entry of a directory listing.
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: Kind,
    /// Resume cookie: pass it back to continue the listing after this entry.
    pub cookie: u64,
    /// Filled when the listing was asked with attributes (READDIRPLUS).
    pub attr: Option<Attr>,
}

/// Flags of `rename`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
    /// Leave a whiteout (a character device 0:0, as overlayfs marks a deleted lower file)
    /// under the old name.
    pub whiteout: bool,
}

/// Modes of `fallocate` that unkai supports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FallocMode {
    pub keep_size: bool,
    pub punch_hole: bool,
    pub zero_range: bool,
}

/// How `xattr` set treats an existing or missing attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrSet {
    Any,
    Create,
    Replace,
}

/// Volume-wide usage, from the engine's counters.
#[derive(Clone, Debug, Default)]
pub struct Usage {
    pub used_bytes: u64,
    pub inodes: u64,
    /// Bytes of slices still referenced (the data actually stored, before block rounding).
    pub slice_bytes: u64,
    pub slices: u64,
    /// Slices whose objects are queued for deletion.
    pub pending_delete: u64,
    /// Entries of the trash deleted before their time because a disk under a local bucket
    /// ran short of room, and the bytes of the files among them (see `meta::trash`).
    pub trash_purged_early: u64,
    pub trash_purged_early_bytes: u64,
}

/// What an early purge of the trash deleted: entries (files and directories) and the bytes
/// of the files among them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Purged {
    pub entries: u64,
    pub bytes: u64,
}

/// A mounted client registered in the volume.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct SessionInfo {
    pub host: String,
    pub pid: u32,
    pub mountpoint: String,
    pub version: String,
    #[serde(default)]
    pub started: Nanos,
    #[serde(default)]
    pub heartbeat: Nanos,
    #[serde(default)]
    pub id: u64,
    /// Blocks (and their bytes) this client has staged for upload, as of its last report.
    #[serde(default)]
    pub staged_blocks: u64,
    #[serde(default)]
    pub staged_bytes: u64,
    /// The peer cache group this client belongs to, and where it serves blocks to the
    /// others (`data::peers`); None: it is in no group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<PeerInfo>,
    /// When its process started (`/proc/PID/stat`'s starttime, clock ticks since boot; 0:
    /// unknown, a client from before it was recorded): with it, the process is known alive
    /// whatever its name (an in-process client runs in `python`), and a pid reused by
    /// another process is not taken for it.
    #[serde(default)]
    pub proc_start: u64,
}

/// The setting holding the peer cache groups' key (see [`Meta::peer_key`]); left out of
/// dumps and backups (a loaded volume makes a key of its own on first use).
pub const PEER_KEY: &str = "peerKey";

/// What a client of a peer cache group publishes in its session (`data::peers`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeerInfo {
    /// The group's name (`--cache-group`).
    pub group: String,
    /// Where it serves its blocks (None: it asks the others and serves nothing,
    /// `--no-sharing`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
}

/// A directory's quota (`unkai quota`): its limits (0: none) and what its tree holds now,
/// the directory itself not counted. See [`quota`] for what counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Quota {
    pub ino: Ino,
    pub max_bytes: u64,
    pub max_inodes: u64,
    pub used_bytes: i64,
    pub used_inodes: i64,
}

/// What a directory's tree holds (`unkai summary`), the directory itself not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Fifos, sockets and devices.
    pub others: u64,
    /// The files' lengths.
    pub length: u64,
    /// The files' lengths rounded up to 4 KiB each: what quotas and the volume's usage count.
    pub size: u64,
    /// The bytes the files' data really covers (holes not counted), as `du` shows.
    pub stored: u64,
}

impl Summary {
    pub fn add(&mut self, o: &Summary) {
        self.files += o.files;
        self.dirs += o.dirs;
        self.symlinks += o.symlinks;
        self.others += o.others;
        self.length += o.length;
        self.size += o.size;
        self.stored += o.stored;
    }

    /// What `self` holds beyond `o` (a part of it).
    pub fn minus(&self, o: &Summary) -> Summary {
        Summary {
            files: self.files.saturating_sub(o.files),
            dirs: self.dirs.saturating_sub(o.dirs),
            symlinks: self.symlinks.saturating_sub(o.symlinks),
            others: self.others.saturating_sub(o.others),
            length: self.length.saturating_sub(o.length),
            size: self.size.saturating_sub(o.size),
            stored: self.stored.saturating_sub(o.stored),
        }
    }

    /// Every entry: files, directories, symlinks and the rest.
    pub fn entries(&self) -> u64 {
        self.files + self.dirs + self.symlinks + self.others
    }
}

/// A slice whose objects are no longer referenced and may be deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadSlice {
    pub id: u64,
    pub size: u32,
}

/// An external slice (`unkai import`): slice `id` (with [`slice::EXTERNAL`] set) is bytes
/// `[base, base + size)` of object `key` of the store `url`, whose ETag and size were `etag`
/// and `object_size` when it was imported. Rows never change: a refreshed object gets new ids.
/// Dumped as it is (`admin::dump`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct External {
    pub id: u64,
    /// The store, as `ObjectStorage::open` takes it (e.g. `s3://bucket/prefix`).
    pub url: String,
    /// The object's key in that store.
    pub key: String,
    pub etag: String,
    pub object_size: u64,
    /// Offset in the object of the slice's first byte.
    pub base: u64,
    /// The slice's bytes (at most a chunk).
    pub size: u32,
}

/// A change another client made to the volume, or news about the flow of such changes (see
/// [`Meta::watch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The attributes of an inode changed; with `data`, its contents (or size) too.
    Inode { ino: Ino, data: bool },
    /// The entry `name` of directory `parent` appeared, went away or now names another inode.
    Entry { parent: Ino, name: Vec<u8> },
    /// Changes are reported from now on (the engine is listening, again). Changes made while
    /// it was not may have been missed.
    Up,
    /// Changes are no longer reported (the engine lost its channel) until the next `Up`.
    Down,
}

/// Which engine holds a volume's metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// An SQLite file: every client of the volume runs on the machine that has the file.
    Sqlite,
    /// A PostgreSQL database: clients may be on many machines.
    Postgres,
}

impl EngineKind {
    /// Whether every client of the volume runs on this machine (so a mount alone on it may
    /// let the kernel cache for long).
    pub fn one_machine(self) -> bool {
        self == EngineKind::Sqlite
    }
}

/// Called with each directory entry of a scan: (parent, name, inode, kind recorded in the
/// entry).
pub type EntryVisitor<'a> = dyn FnMut(Ino, &[u8], Ino, Option<Kind>) + 'a;

/// Receives the [`Change`]s of [`Meta::watch`], on a thread of the engine.
pub type ChangeSink = Box<dyn Fn(Change) + Send + Sync>;

/// The contract every metadata engine implements. Each call is one transaction.
pub trait Meta: Send + Sync {
    /// The volume's settings, as recorded by `format` and changed since by `config` (seen
    /// here when the volume is opened and at each [`Meta::heartbeat`]).
    fn format(&self) -> Format;

    /// Records changed settings (`unkai config`). Refuses (`Refused`) a change of what a
    /// volume cannot change once formatted: its name, id, block size or key layout.
    fn set_format(&self, new: &Format) -> Result<()>;

    /// Deletes the volume's metadata, all of it (`unkai destroy`); refuses (`Refused`) while
    /// a live client other than this one has it mounted.
    fn destroy(&self) -> Result<()>;

    // ---- directory quotas (see [`quota`]) ----
    /// Every directory quota, with what its tree holds.
    fn quotas(&self) -> Result<Vec<Quota>>;
    /// Sets a directory's limits (None keeps the current one; 0 is none); a new quota counts
    /// its tree first. ENOTDIR for a file; `Refused` for the root (the volume's limits).
    fn set_quota(&self, dir: Ino, max_bytes: Option<u64>, max_inodes: Option<u64>)
    -> Result<Quota>;
    /// Makes every client keep quotas from its next heartbeat on (call before the first
    /// [`set_quota`](Meta::set_quota) while other clients are mounted); whether it was off.
    fn start_quotas(&self) -> Result<bool>;
    /// Deletes a directory's quota; whether there was one.
    fn delete_quota(&self, dir: Ino) -> Result<bool>;
    /// Counts a directory's tree as its quota counts it: the quota as stored and the count
    /// (bytes, inodes); with `repair`, the count becomes the quota's usage.
    fn recount_quota(&self, dir: Ino, repair: bool) -> Result<(Option<Quota>, (i64, i64))>;
    /// Whether a write could pass a limit (the volume has a capacity, or quotas): then
    /// writers ask [`room_for`](Meta::room_for) as a file grows.
    fn limited(&self) -> bool;
    /// Whether `bytes` more of file `ino` fit the volume's capacity and its directories'
    /// quotas as they stand (ENOSPC, EDQUOT if not), so that `write` itself fails instead of
    /// the later commit; the room left after them. The commit still checks, exactly.
    fn room_for(&self, ino: Ino, bytes: u64) -> Result<u64>;
    /// What a directory's tree holds (one consistent read; an aggregate per directory).
    fn summary(&self, dir: Ino) -> Result<Summary>;
    /// A directory's path from the root (`/a/b`; `/` for the root), through its names now.
    fn dir_path(&self, dir: Ino) -> Result<Vec<u8>>;
    /// The entries naming inode `ino`: (directory, name), one per hard link.
    fn names_of(&self, ino: Ino) -> Result<Vec<(Ino, Vec<u8>)>>;
    /// Sets or clears [`flags::QUARANTINED`] of `ino` (no permission check: the caller is
    /// the scanner of a client, acting for the volume).
    fn set_quarantined(&self, ino: Ino, on: bool) -> Result<Attr>;

    /// Which engine this is.
    fn engine(&self) -> EngineKind;

    /// The metadata's figures as the mount's metrics: transactions by kind, their time and
    /// retries (see `engine::TxStats`).
    fn figures(&self, out: &mut crate::metrics::Families) {
        let _ = out;
    }

    /// The engine's own check of the database file (SQLite's `quick_check`, a read of every
    /// page): the problems found, none when it is sound. Run before mounting, so that a
    /// damaged database is refused at once instead of failing later with EIO.
    fn check_storage(&self) -> Result<Vec<String>>;

    /// Starts reporting, to `sink`, the changes other clients (other sessions) make to the
    /// volume, and publishing this client's changes to them. Call once, after
    /// [`new_session`](Meta::new_session). Returns false if the engine cannot (then `sink` is
    /// never called and other clients' changes show only when re-read).
    fn watch(&self, sink: ChangeSink) -> Result<bool> {
        let _ = sink;
        Ok(false)
    }

    // ---- sessions ----
    /// Registers this client; also reclaims what dead sessions left behind.
    fn new_session(&self, info: SessionInfo) -> Result<u64>;
    /// Marks this client alive; also reclaims what sessions found dead left behind.
    /// (Also reads the volume's settings again, so that a `config` reaches live mounts.)
    fn heartbeat(&self) -> Result<()>;
    /// Called often (every background tick): notices another client joining the volume, for
    /// an engine that records opens only when shared (SQLite).
    fn watch_sessions(&self) -> Result<()> {
        Ok(())
    }
    fn close_session(&self) -> Result<()>;
    /// Records in this client's session what it has staged for upload (for `unkai status`).
    fn report_staged(&self, blocks: u64, bytes: u64) -> Result<()>;
    fn sessions(&self) -> Result<Vec<SessionInfo>>;
    /// The key the volume's peer cache groups authenticate each other with (32 random
    /// bytes, hex), created on first use and kept in the volume's settings (see
    /// `data::peers`). Never logged.
    fn peer_key(&self) -> Result<String>;

    // ---- namespace ----
    fn usage(&self) -> Result<Usage>;
    fn lookup(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr>;
    fn getattr(&self, ino: Ino) -> Result<Attr>;
    fn setattr(&self, ctx: &Ctx, ino: Ino, set: &SetAttr) -> Result<Attr>;
    /// Sets the inode's [`flags`] (`chattr`): EOPNOTSUPP for flags unkai does not keep,
    /// EPERM unless the caller owns the inode, or is root to change immutable or append-only.
    /// The ctime moves unless `keep_ctime` (a file whose times a kernel's writeback cache
    /// owns: it shows its own ctime and takes none from us).
    fn set_flags(&self, ctx: &Ctx, ino: Ino, flags: u32, keep_ctime: bool) -> Result<Attr>;
    /// Stores access times read through a client, all in one transaction; each only moves
    /// an atime forward, and an inode gone meanwhile is skipped. Nothing else changes (not
    /// ctime), and other clients are not told.
    fn set_atimes(&self, times: &[(Ino, Nanos)]) -> Result<()>;
    /// Creates a file, directory, device, fifo, socket or symlink (`target`).
    #[allow(clippy::too_many_arguments)]
    fn mknod(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        kind: Kind,
        mode: u32,
        rdev: u32,
        target: Option<&[u8]>,
    ) -> Result<Attr>;
    /// Creates a regular file and opens it (`open(O_CREAT)`), the open counted and recorded
    /// with the create: an unlink of the new name, or a rename over it, by another client in
    /// between keeps the inode for this open (else the create would succeed and its open
    /// find nothing). Close it with [`Meta::close_inode`].
    fn create_open(&self, ctx: &Ctx, parent: Ino, name: &[u8], mode: u32) -> Result<Attr> {
        let a = self.mknod(ctx, parent, name, Kind::File, mode, 0, None)?;
        self.open_inode(a.ino)
    }
    fn link(&self, ctx: &Ctx, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr>;
    /// Removes a name; returns the inode's attributes after (nlink may be 0).
    fn unlink(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr>;
    fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()>;
    /// Deletes `name` of `parent` and everything below it for good, bypassing the trash (as
    /// its expiry does); returns what went. For `unkai csi`'s DeleteVolume with
    /// `onDelete: remove`. A name already gone is ENOENT.
    fn purge(&self, parent: Ino, name: &[u8]) -> Result<Purged>;
    /// Renames; returns the inode that was replaced (and is now unlinked), if any.
    fn rename(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<Option<Attr>>;
    /// Lists a directory from `cookie` on (0 = from the start, "." and ".." included).
    fn readdir(&self, ino: Ino, cookie: u64, limit: usize, plus: bool) -> Result<Vec<DirEntry>>;
    fn readlink(&self, ino: Ino) -> Result<Vec<u8>>;

    // ---- open files ----
    /// Notes that this client opened the inode (an open file outlives its last name).
    fn open_inode(&self, ino: Ino) -> Result<Attr>;
    /// Notes a close; the last close of an unlinked inode reclaims it.
    fn close_inode(&self, ino: Ino) -> Result<()>;
    /// Makes what this client made of inode `ino` visible to other clients now, if it still
    /// waits in a group of changes: called at every close(2) (FUSE's FLUSH, which close
    /// waits for, unlike the RELEASE after it), so that a file created and closed here is
    /// found by an open elsewhere after the close (close-to-open).
    fn share(&self, ino: Ino) -> Result<()> {
        let _ = ino;
        Ok(())
    }
    /// Notes that this client opened directory `ino` (counted in this client only, never
    /// recorded in the volume: a directory removed by another client is gone for this one
    /// too) and answers its attributes, from the cache when fresh.
    fn open_dir(&self, ino: Ino) -> Result<Attr>;
    /// Notes a close of a directory; the last close here of one removed here reclaims it.
    fn close_dir(&self, ino: Ino) -> Result<()>;

    // ---- file locks, shared by every client of the volume (see [`lock`]) ----
    /// The first lock of another owner that conflicts with `kind` over `start..=end`.
    fn getlk(
        &self,
        ino: Ino,
        owner: u64,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Result<Option<LockRange>>;
    /// Locks or unlocks a range for `owner` of this session. A conflicting lock of another
    /// owner is returned (and nothing changes); a conflicting lock whose session is dead is
    /// reclaimed first.
    fn setlk(&self, ino: Ino, owner: u64, req: LockRequest) -> Result<Option<LockRange>>;

    // ---- file data ----
    fn truncate(&self, ctx: &Ctx, ino: Ino, length: u64) -> Result<Attr>;
    fn fallocate(&self, ctx: &Ctx, ino: Ino, mode: FallocMode, off: u64, len: u64) -> Result<Attr>;
    /// The slice records of one chunk, oldest first.
    fn read_chunk(&self, ino: Ino, index: u32) -> Result<Vec<SliceRec>>;
    /// A fresh, never used slice id, reserved by this session until it ends or trims it (see
    /// [`Meta::trim_reserved`]). Take it through `data::SliceUpload::start`, which counts the
    /// slice in flight until it is committed.
    fn new_slice_id(&self) -> Result<u64>;
    /// No slice id [`Meta::new_slice_id`] hands out from now on is below this.
    fn slice_id_floor(&self) -> u64;
    /// This client's session (0 before it starts one).
    fn session_id(&self) -> u64;
    /// The slice ids live sessions have reserved (taken, and perhaps uploaded but not yet
    /// committed): (session, lo, hi) for ids `lo..hi`, sorted. Ranges of dead sessions are left
    /// out: what they uploaded and did not commit is garbage.
    fn reserved_slices(&self) -> Result<Vec<(u64, u64, u64)>>;
    /// Forgets this session's reservation of the slice ids below `below` (never of ids it has
    /// not handed out yet): the caller has committed or abandoned every one of them (a mount
    /// gives `data::DataStore::in_flight_floor` at each heartbeat).
    fn trim_reserved(&self, below: u64) -> Result<()>;
    /// Commits written slices: `(chunk index, record)` in write order; the file grows to cover
    /// them and its mtime/ctime become `mtime`.
    fn write_slices(
        &self,
        ino: Ino,
        slices: &[(u32, SliceRec)],
        mtime: Option<Nanos>,
    ) -> Result<Attr>;
    /// Makes regular file `ino` (empty) the bytes of an object imported by reference: one
    /// external slice per chunk (`parts`, in order, their `id`s ignored: new ids are taken),
    /// their rows and the chunks' records in one transaction; the file's length becomes the
    /// object's and its mtime `mtime`. `unkai import`.
    fn attach_external(&self, ino: Ino, parts: &[External], mtime: Nanos) -> Result<Attr>;
    /// The row of external slice `id`, if it has one.
    fn external(&self, id: u64) -> Result<Option<External>>;
    /// Every external slice's row (fsck, `import --refresh`).
    fn externals(&self) -> Result<Vec<External>>;
    /// Copies a byte range by referencing the source's slices. Returns bytes copied.
    #[allow(clippy::too_many_arguments)]
    fn copy_range(
        &self,
        ctx: &Ctx,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
    ) -> Result<(u64, Attr)>;
    /// Replaces the first `old.len()` records of a chunk with `new`, if they are still the
    /// same (compaction). Returns false if the chunk changed meanwhile.
    fn replace_slices(
        &self,
        ino: Ino,
        index: u32,
        old: &[SliceRec],
        new: &[SliceRec],
    ) -> Result<bool>;
    /// Chunks with at least `min_records` records: candidates for compaction.
    fn fragmented_chunks(&self, min_records: usize, limit: usize) -> Result<Vec<(Ino, u32)>>;

    // ---- xattrs ----
    fn set_xattr(
        &self,
        ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        how: XattrSet,
    ) -> Result<()>;
    fn get_xattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>>;
    fn list_xattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>>;
    fn remove_xattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<()>;

    // ---- durability & reclaiming ----
    /// Makes everything committed so far durable on stable storage.
    fn sync(&self) -> Result<()>;

    /// Starts writing out what the `sync` that follows will make durable, without waiting
    /// (see `Engine::begin_sync`: SQLite commits its group here; others do nothing).
    fn begin_sync(&self) -> Result<()> {
        Ok(())
    }

    /// The local file `sync` is an fdatasync of, if it is one (see `Engine::sync_file`).
    fn sync_file(&self) -> Option<std::path::PathBuf> {
        None
    }

    /// Whether this client has the volume to itself (no other session), as the mount last
    /// found: while it has, namespace and attribute changes share commits (SQLite, see
    /// `sqlite::group`) and inodes, names and xattrs are answered from memory (see
    /// `meta::cache`); `false` stops both and commits what is grouped.
    fn set_alone(&self, alone: bool) {
        let _ = alone;
    }

    /// Whether, though last found alone, this client may have company since: another
    /// process wrote the volume's database (SQLite; a second mount registering its session
    /// does) and the session table then shows another client (a command without a session,
    /// such as `unkai quota set`, is not company). Asked before what only a client alone may
    /// do (the kernel's writeback cache for a file opened for writing).
    fn others_wrote(&self) -> bool {
        false
    }
    /// Slices no longer referenced whose trash period is over (their objects may be deleted).
    fn dead_slices(&self, limit: usize) -> Result<Vec<DeadSlice>>;
    /// Slices no longer referenced, trash period or not, those dead longest first: for a disk
    /// short of room (see [`Meta::purge_trash_early`]).
    fn dead_slices_early(&self, limit: usize) -> Result<Vec<DeadSlice>>;
    /// Deletes for good the oldest entries of the trash (the oldest hour first, and in it the
    /// oldest deletion first) until the files among them add up to `bytes` or the trash is
    /// empty, and counts them in the volume ([`Usage::trash_purged_early`]): a disk under a
    /// local bucket ran short of room. `None`, deleting nothing, while another client does
    /// so (one at a time: see `meta::trash`).
    fn purge_trash_early(&self, bytes: u64) -> Result<Option<Purged>>;
    /// Forgets dead slices once their objects are deleted.
    fn forget_dead_slices(&self, ids: &[u64]) -> Result<()>;

    // ---- whole-volume scans (fsck, gc, status) ----
    /// Every slice referenced by any chunk, with its size and reference count.
    fn all_slices(&self) -> Result<Vec<(u64, u32, u32)>>;
    /// Every inode.
    fn scan_nodes(&self, f: &mut dyn FnMut(&Attr)) -> Result<()>;
    /// Every directory entry: (parent, name, inode, kind recorded in the entry).
    fn scan_entries(&self, f: &mut EntryVisitor<'_>) -> Result<()>;
    /// Every chunk: (inode, index, records; `None` if the records cannot be decoded).
    fn scan_chunks(&self, f: &mut dyn FnMut(Ino, u32, Option<Vec<SliceRec>>)) -> Result<()>;
    /// Every slice queued for deletion, trash period or not.
    fn all_dead_slices(&self) -> Result<Vec<DeadSlice>>;
    /// Inodes open in a session, as recorded in the volume (unlinked ones stay alive until
    /// their last close anywhere): (session id, inode).
    fn sustained(&self) -> Result<Vec<(u64, Ino)>>;
    /// Applies one repair found by fsck. Raw and unchecked: for fsck only.
    fn repair(&self, fix: &Fix) -> Result<()>;

    // ---- the whole volume, row by row (`admin::dump`) ----
    /// Runs `f` on the volume's rows in one read snapshot, so that everything it reads
    /// agrees (a dump). Changes grouped by this client are committed first.
    fn read_rows(
        &self,
        f: &mut dyn FnMut(&mut dyn engine::Txn) -> engine::TxResult<()>,
    ) -> Result<()>;
    /// Runs `f` in one write transaction, again from the start after a conflict. Raw and
    /// unchecked, and what this client answers from memory is not told: for rows it does not
    /// keep there (settings), or a volume nothing has open (a load).
    fn write_rows(
        &self,
        f: &mut dyn FnMut(&mut dyn engine::Txn) -> engine::TxResult<()>,
    ) -> Result<()>;
}

/// A repair fsck may apply (see [`Meta::repair`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fix {
    /// Remove a directory entry (e.g. one pointing to a missing inode).
    RemoveEntry {
        parent: Ino,
        name: Vec<u8>,
    },
    /// Correct the kind an entry records.
    SetEntryKind {
        parent: Ino,
        name: Vec<u8>,
        kind: Kind,
    },
    SetNlink {
        ino: Ino,
        nlink: u32,
    },
    SetParent {
        ino: Ino,
        parent: Ino,
    },
    /// Delete an inode and release its slices (an orphan nothing can reach or open).
    DeleteInode {
        ino: Ino,
    },
    /// Give an unreachable inode a name (in lost+found).
    Link {
        ino: Ino,
        parent: Ino,
        name: Vec<u8>,
        kind: Kind,
    },
    /// Drop a chunk (undecodable, or beyond the end of its file).
    DropChunk {
        ino: Ino,
        index: u32,
    },
    /// Set a slice's reference count (0: the slice is dead and its objects may go).
    SetSliceRefs {
        id: u64,
        size: u32,
        refs: u32,
    },
    /// Remove a slice from the deletion queue (it is still referenced).
    UndeadSlice {
        id: u64,
    },
    /// Forget an open-file record of a session that no longer exists.
    RemoveSustained {
        session: u64,
        ino: Ino,
    },
    /// Set the usage counters to what a scan counted.
    SetUsage {
        used_bytes: u64,
        inodes: u64,
    },
    /// Set the bytes a file stores to what its chunks cover.
    SetStored {
        ino: Ino,
        stored: u64,
    },
}
#[cfg(test)]
mod tests;
