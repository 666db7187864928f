//! The fuser adapter: each FUSE request becomes one `vfs` call and one reply.
//!
//! This is where errors become errnos, where attributes get their kernel cache TTLs, where
//! requests are counted and logged (through the `vfs::export`), and where
//! the kernel connection is configured (request sizes, READDIRPLUS, parallel directory ops).
//!
//! Not for: any file-system logic; if a method here does more than translate, it belongs in vfs.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType,
    Filesystem, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};

use super::Coherence;
use super::coherence::DataHook;
use super::inodes::Inodes;
use super::passthrough::{self, Passthrough};
use crate::meta::{
    Attr, Ctx, Kind, LockKind, LockRequest, Nanos, RenameFlags, SetAttr, SetTime, acl, flags,
};
use crate::vfs::export::log as accesslog;
use crate::vfs::export::{Caller, Export, Proto, Request as Op};
use crate::vfs::{self, Vfs};

/// Kernel cache settings of a mount.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    /// How long the kernel may remember that a name does not exist (0 = not at all).
    pub negative_ttl: Duration,
    /// Keep the kernel's page cache of a file across opens (safe when this mount is the only
    /// writer of the volume).
    pub keep_cache: bool,
    /// The kernel's writeback cache: writes land in the page cache and reach the server in
    /// large batches (on close, fsync, memory pressure or after ~30 s); the kernel owns the
    /// size and times of a cached file. Only for a mount that is the volume's only writer.
    pub writeback: bool,
    /// Whether other clients may change the volume (false: this mount is its only client).
    pub shared: bool,
    /// With change notification (the TTLs above assume it): the TTLs used while
    /// notifications do not flow (connection lost).
    pub fallback_ttl: Option<Duration>,
    /// TTLs that follow whether this mount is alone ([`Coherence::alone`]): the one used
    /// while it is (the TTLs above, and `shared`, hold while it is not).
    pub alone_ttl: Option<Duration>,
    /// FUSE passthrough (`super::passthrough`): the directory its local copies are made in;
    /// None: off. Never with `writeback` (the kernel does not do both).
    pub passthrough: Option<std::path::PathBuf>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            attr_ttl: Duration::from_secs(1),
            entry_ttl: Duration::from_secs(1),
            negative_ttl: Duration::from_secs(1),
            keep_cache: true,
            writeback: false,
            shared: true,
            fallback_ttl: None,
            alone_ttl: None,
            passthrough: None,
        }
    }
}

/// Largest FUSE write request we ask the kernel for: the most fuser's buffers take (16 MiB).
/// The kernel sends at most `/proc/sys/fs/fuse/max_pages_limit` pages in one request (256,
/// 1 MiB, by default): raising that sysctl lets a large write(2) reach unkai in fewer
/// requests (each a round trip through /dev/fuse).
const MAX_REQUEST: u32 = 16 << 20;

pub struct Adapter {
    vfs: Arc<Vfs>,
    cache: CacheConfig,
    coherence: Arc<Coherence>,
    /// Whether the kernel enforces POSIX ACLs (`FUSE_POSIX_ACL`); without it, setting one is
    /// refused rather than kept and ignored.
    acl: bool,
    /// What the mount serves: its access log (`.accesslog`, `--access-log`) and the requests
    /// served, by kind, and the bytes read and written (logged at unmount, served as
    /// metrics).
    export: Arc<Export>,
    /// The readers of `.accesslog` by their handles.
    log_readers: Mutex<HashMap<u64, Arc<accesslog::Reader>>>,
    /// The kernel's inode numbers of the volume's (a subdir mount's root is the kernel's 1).
    inodes: Inodes,
    /// FUSE passthrough, when on.
    passthrough: Option<Arc<Passthrough>>,
}

/// The kernel's inode of the mount's root (FUSE_ROOT_ID).
const FUSE_ROOT: u64 = 1;

/// The name of the access log's virtual file at the root.
pub const LOG_NAME: &[u8] = b".accesslog";

/// Its inode number: beyond any the volume hands out.
const LOG_INO: u64 = u64::MAX - 1;

/// The kinds of request the adapter answers, as the kernel's protocol names them: each is
/// counted from the start.
const KINDS: &[&str] = &[
    "lookup",
    "getattr",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "getlk",
    "setlk",
    "flush",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
    "fsyncdir",
    "statfs",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "access",
    "create",
    "ioctl",
    "fallocate",
    "lseek",
    "copy_file_range",
];

/// Handles of `.accesslog` readers: apart from the volume's (which count up from 1).
const LOG_FH: u64 = 1 << 62;

/// A request being answered (counted, timed and logged by the export): the failure noted
/// as the errno answered.
trait Answer {
    fn failed_with(&self, e: Errno) -> Errno;
}

impl Answer for Op<'_> {
    fn failed_with(&self, e: Errno) -> Errno {
        self.failed(e.code());
        e
    }
}

impl Adapter {
    /// Starts answering a request `op`; `args` (its inodes, names, offsets) is made only if
    /// the access log is on.
    fn op(&self, req: &Request, op: &str, args: impl FnOnce() -> String) -> Op<'_> {
        self.export.request(&Caller::fuse(ctx(req)), op, args)
    }

    /// The attributes of `.accesslog`: a file only its readers may read.
    fn log_attr(&self) -> FileAttr {
        let now = SystemTime::now();
        FileAttr {
            ino: INodeNo(LOG_INO),
            size: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind: FileType::RegularFile,
            perm: 0o400,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    pub fn new(
        export: Arc<Export>,
        cache: CacheConfig,
        coherence: Arc<Coherence>,
        inodes: Inodes,
    ) -> Adapter {
        export.requests().register(Proto::Fuse, KINDS);
        let passthrough = cache.passthrough.as_ref().and_then(|dir| {
            match Passthrough::new(export.vfs().clone(), dir.clone(), passthrough::DEFAULT_MAX) {
                Ok(p) => {
                    let p = Arc::new(p);
                    let hook = p.clone();
                    coherence.on_data(DataHook(Box::new(move |ino| hook.changed_later(ino))));
                    Some(p)
                }
                Err(e) => {
                    tracing::warn!("FUSE passthrough off: {}: {e}", dir.display());
                    None
                }
            }
        });
        Adapter {
            passthrough,
            vfs: export.vfs().clone(),
            cache,
            coherence,
            acl: false,
            export,
            log_readers: Mutex::new(HashMap::new()),
            inodes,
        }
    }

    /// A TTL to hand out: as configured, the fallback while pushed changes do not flow, or
    /// the long one while this mount is alone on a volume it may share.
    fn ttl(&self, t: Duration) -> Duration {
        if let Some(a) = self.cache.alone_ttl {
            if self.coherence.alone() {
                return a;
            }
        }
        match self.cache.fallback_ttl {
            Some(f) if !self.coherence.pushed() => t.min(f),
            _ => t,
        }
    }

    /// Whether other clients may change the volume now.
    fn shared(&self) -> bool {
        match self.cache.alone_ttl {
            Some(_) => !self.coherence.alone(),
            None => self.cache.shared,
        }
    }

    /// How long the kernel may keep an inode's attributes: not at all in a directory where
    /// programs coordinate with locks (see [`Vfs::coordinates_in`]).
    fn attr_ttl(&self, a: &Attr) -> Duration {
        if self.vfs.coordinates_in(a.parent) {
            Duration::ZERO
        } else {
            self.ttl(self.cache.attr_ttl)
        }
    }

    /// How long the kernel may keep names of directory `dir`: not at all where programs
    /// coordinate with locks (a name another client adds or removes must show at once).
    fn entry_ttl(&self, dir: u64) -> Duration {
        if self.vfs.coordinates_in(dir) {
            Duration::ZERO
        } else {
            self.ttl(self.cache.entry_ttl)
        }
    }

    fn negative_ttl(&self, dir: u64) -> Duration {
        if self.vfs.coordinates_in(dir) {
            Duration::ZERO
        } else {
            self.ttl(self.cache.negative_ttl)
        }
    }

    /// With the writeback cache, tells the kernel a file is now `len` long if it was changed
    /// elsewhere (another mount of the volume): the kernel takes no size from our replies for
    /// a file it caches. Called where the kernel holds no dirty page of the file. A file made
    /// shorter elsewhere cannot be told (the kernel has no notice that shrinks a size).
    fn push_size(&self, ino: u64, len: u64) {
        if !self.cache.writeback || len == 0 {
            return;
        }
        match self.vfs.read_at(ino, len - 1) {
            Ok(Some(b)) => self.coherence.grow(ino, len, b),
            Ok(None) => {}
            Err(e) => tracing::debug!("reading the last byte of inode {ino}: {e}"),
        }
    }

    /// The entries naming file `ino` (none if they cannot be read: logged).
    fn names_of(&self, ino: u64) -> Vec<(u64, Vec<u8>)> {
        self.vfs.names_of(ino).unwrap_or_else(|e| {
            tracing::error!("inode {ino}: names of a file the kernel must forget: {e}");
            Vec::new()
        })
    }

    /// Makes the kernel forget bytes of file `ino` its writeback cache handed over and we
    /// refused, if any; whether there were.
    fn forget_refused(&self, ino: u64) -> bool {
        self.cache.writeback && self.coherence.forget_refused(ino, || self.names_of(ino))
    }

    /// Whether an open with `flags` bypasses the kernel's writeback cache (`FOPEN_DIRECT_IO`):
    /// one for writing while other clients share the volume. The cache writes back whole
    /// pages, so the bytes another client wrote beside ours in a page since the kernel read
    /// it would go back to their old values (lost though their close succeeded); direct,
    /// the kernel sends the bytes written and no others. Reads through other descriptors
    /// keep the page cache (a direct write drops the pages it covers), and a shared mmap
    /// goes through the page cache as before (`FUSE_DIRECT_IO_ALLOW_MMAP`). Its appends go
    /// at the volume's end (`Vfs::append_at_end`), not at the kernel's size, which keeps no
    /// count of the other client's appends since the open. A mount still alone at its last
    /// check of sessions (every 2 s) asks whether another client came since
    /// (`Vfs::others_wrote`: a second mount registering its session writes the database,
    /// and the session table then names it; a command without a session is no company):
    /// such an open bypasses the cache too, rather than keep it until the check.
    fn bypasses_cache(&self, flags: i32) -> bool {
        self.cache.writeback
            && flags & libc::O_ACCMODE != libc::O_RDONLY
            && (!self.coherence.alone() || self.export.vfs().others_wrote())
    }

    /// FOPEN flags of an open: the kernel keeps the file's pages only if the file has not
    /// changed elsewhere since this mount last saw it (`keep`); otherwise its cached size
    /// and times go too, so the open sees what the last close elsewhere left (close-to-open).
    /// (Alone on the volume, the kernel's attributes are exact.) Even where other clients'
    /// changes are pushed: the change's notice comes some
    /// milliseconds after the close elsewhere returned, and an open meanwhile would read the
    /// new bytes cut at the old size (tests/staging.rs caught it on PostgreSQL).
    fn open_flags(&self, ino: u64, keep: bool) -> FopenFlags {
        if !keep && self.shared() {
            // Attributes only: safe within a request (no page or inode lock is taken).
            self.coherence.forget_attr(ino);
        }
        if self.cache.keep_cache && keep {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }
}

fn ctx(req: &Request) -> Ctx {
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
        umask: 0,
    }
}

/// The caller of a create, with the umask it sent (meta applies it, or the directory's
/// default ACL instead).
fn creator(req: &Request, umask: u32) -> Ctx {
    Ctx {
        umask: umask & 0o777,
        ..ctx(req)
    }
}

fn lock_kind(typ: i32) -> Option<LockKind> {
    match typ {
        libc::F_RDLCK => Some(LockKind::Read),
        libc::F_WRLCK => Some(LockKind::Write),
        _ => None,
    }
}

fn lock_type(kind: LockKind) -> i32 {
    match kind {
        LockKind::Read => libc::F_RDLCK,
        LockKind::Write => libc::F_WRLCK,
    }
}

/// Whether the thread `tid` has a signal pending that it does not block. fuser does not pass
/// the kernel's interrupts on, so a process waiting for a lock (F_SETLKW, flock) would never
/// see its signal (Ctrl-C, an alarm set to time the wait out, SIGKILL); the wait ends with
/// EINTR when this turns true.
fn signal_pending(tid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return true; // gone
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let pending = field("SigPnd:") | field("ShdPnd:");
    pending & !field("SigBlk:") != 0
}

fn errno(e: &vfs::Error) -> Errno {
    let n = e.errno();
    if n == libc::EIO {
        tracing::error!("I/O error: {e}");
    }
    Errno::from_i32(n)
}

fn systime(ns: Nanos) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn nanos(t: SystemTime) -> Nanos {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
        Kind::Socket => FileType::Socket,
    }
}

/// `FS_XFLAG_*` bits of struct fsxattr and the inode flags they stand for.
const XFLAGS: [(u32, u32); 3] = [
    (0x08, flags::IMMUTABLE),
    (0x10, flags::APPEND),
    (0x80, flags::NODUMP),
];

fn xflags_of(flags: u32) -> u32 {
    XFLAGS
        .iter()
        .filter(|(_, f)| flags & f != 0)
        .fold(0, |x, (b, _)| x | b)
}

/// The inode flags of `FS_XFLAG_*` bits; a bit without one becomes a flag unkai does not
/// keep (so that setting it is refused).
fn flags_of_xflags(x: u32) -> u32 {
    let known = XFLAGS.iter().fold(0, |k, (b, _)| k | b);
    let unknown = if x & !known != 0 { 1 << 31 } else { 0 };
    XFLAGS
        .iter()
        .filter(|(b, _)| x & b != 0)
        .fold(unknown, |f, (_, fl)| f | fl)
}

fn file_attr(a: &Attr) -> FileAttr {
    let size = if a.kind == Kind::Dir { 4096 } else { a.length };
    // A file's blocks are the bytes it really stores (holes are not); other kinds' their size.
    let used = if a.kind == Kind::File { a.stored } else { size };
    FileAttr {
        ino: INodeNo(a.ino),
        size,
        blocks: used.div_ceil(512),
        atime: systime(a.atime),
        mtime: systime(a.mtime),
        ctime: systime(a.ctime),
        crtime: systime(a.ctime),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.visible_nlink(),
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(setattr_nanos(t)),
    }
}

/// The time a SETATTR request carries. fuser 0.18 builds a time before 1970 from the kernel's
/// (secs < 0, nsecs) as `EPOCH - (-secs s + nsecs ns)` instead of `EPOCH - (-secs s) + nsecs
/// ns`; undo that here so that 1969-12-31 23:59:59.5 stays what it is.
fn setattr_nanos(t: SystemTime) -> Nanos {
    match UNIX_EPOCH.duration_since(t) {
        Ok(d) if !d.is_zero() => -(d.as_secs() as i64 * 1_000_000_000) + d.subsec_nanos() as i64,
        _ => nanos(t),
    }
}

impl Adapter {
    /// `a` as the kernel sees it: numbered by [`Inodes`].
    fn kernel_attr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: self.inodes.kernel(a.ino),
            ..file_attr(a)
        }
    }

    fn reply_entry(&self, reply: ReplyEntry, res: vfs::Result<Attr>) {
        match res {
            Ok(a) => reply.entry_with_ttls(
                &self.attr_ttl(&a),
                &self.entry_ttl(a.parent),
                &self.kernel_attr(&a),
                self.coherence.generation(a.ino),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

impl Filesystem for Adapter {
    fn destroy(&mut self) {
        tracing::info!("{}", self.export.requests().summary(Proto::Fuse));
        tracing::info!("{}", self.export.requests().time_summary(Proto::Fuse));
        if let Some(line) = self.export.requests().round_trip_summary(Proto::Fuse) {
            tracing::info!("{line}");
        }
        if let Some(p) = &self.passthrough {
            tracing::info!("{}", p.summary());
        }
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(max) = config.set_max_write(MAX_REQUEST) {
            let _ = config.set_max_write(max);
        }
        if let Some(pages) = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
        {
            tracing::debug!(
                "FUSE requests of up to {} KiB (the kernel's fs.fuse.max_pages_limit)",
                pages * 4
            );
        }
        let _ = config.set_max_background(64);
        if let Some(p) = &self.passthrough {
            // Backing files on a local file system (not itself stacked): depth 1.
            if config
                .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
                .is_err()
            {
                p.turn_off("the kernel lacks FUSE_PASSTHROUGH");
            } else if config.set_max_stack_depth(1).is_err() {
                p.turn_off("the kernel refused a stacking depth of 1");
            } else {
                tracing::info!("FUSE passthrough on: files read from local copies");
            }
        }
        if self.cache.writeback
            && config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .is_err()
        {
            tracing::warn!("the kernel lacks the FUSE writeback cache; writes go through");
        }
        if self.cache.writeback
            && config
                .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
                .is_err()
        {
            // Files opened for writing while others share the volume bypass the cache
            // (`bypasses_cache`); without this, a shared mmap of one fails (ENODEV).
            tracing::warn!(
                "the kernel lacks FUSE_DIRECT_IO_ALLOW_MMAP: while the volume is shared, a \
                 shared mmap of a file opened for writing fails"
            );
        }
        // POSIX ACLs: the kernel enforces them from the system.posix_acl_* xattrs and leaves
        // the umask to us (meta applies it, or a directory's default ACL instead).
        self.acl = config
            .add_capabilities(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK)
            .is_ok();
        if !self.acl {
            tracing::warn!("the kernel lacks FUSE POSIX ACLs: setting an ACL fails (EOPNOTSUPP)");
        }
        // Locks go to the volume (shared by every client) instead of staying in this kernel.
        for cap in [InitFlags::FUSE_POSIX_LOCKS, InitFlags::FUSE_FLOCK_LOCKS] {
            if config.add_capabilities(cap).is_err() {
                tracing::warn!(
                    "the kernel lacks FUSE {cap:?}: those locks stay local to this machine"
                );
            }
        }
        for cap in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            // Not FUSE_ASYNC_DIO: with it, the kernel completes an asynchronous O_DIRECT
            // write (io_submit, io_uring) when our reply comes, without dropping the pages a
            // buffered reader cached meanwhile from the bytes before it, so a read after the
            // write returned those stale bytes. Without it, the kernel sends the write's
            // requests one by one and drops the range's pages after the last reply, before
            // the write completes (as for a synchronous one). See docs/design.md, "O_DIRECT".
            InitFlags::FUSE_MAX_PAGES,
            // File handles (name_to_handle_at, NFS re-export): an inode is found again by
            // number through a lookup of "." (and a directory's parent through "..").
            // Not in a subdir mount: a handle names any inode of the volume, and the
            // directory mounted must be all that can be reached.
            if self.inodes.is_subdir() {
                InitFlags::empty()
            } else {
                InitFlags::FUSE_EXPORT_SUPPORT
            },
            // Setuid, setgid and file capabilities dropped by us on write, truncate and
            // chown (vfs::drop_privs): the kernel then stops asking for security.capability
            // before every write, a round trip that halved small-write rates.
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        ] {
            if config.add_capabilities(cap).is_err() {
                tracing::debug!("kernel lacks FUSE capability {cap:?}");
            }
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let op = self.op(req, "lookup", || {
            format!("({},{})", parent.0, name.to_string_lossy())
        });
        if parent.0 == FUSE_ROOT && name.as_bytes() == LOG_NAME {
            return reply.entry(&Duration::from_secs(1), &self.log_attr(), Generation(0));
        }
        let parent = self.inodes.volume(parent);
        let found = if self.inodes.is_root_parent(parent, name.as_bytes()) {
            self.vfs.getattr(parent)
        } else {
            self.vfs.lookup(&ctx(req), parent, name.as_bytes())
        };
        match found {
            Err(e) if e.errno() == libc::ENOENT && !self.negative_ttl(parent).is_zero() => {
                op.failed_with(Errno::ENOENT);
                // A negative entry: the kernel remembers the name is absent.
                let mut attr = file_attr(&Attr {
                    ino: 0,
                    kind: Kind::File,
                    mode: 0,
                    uid: 0,
                    gid: 0,
                    nlink: 0,
                    length: 0,
                    rdev: 0,
                    atime: 0,
                    mtime: 0,
                    ctime: 0,
                    parent: 0,
                    flags: 0,
                    stored: 0,
                });
                attr.ino = INodeNo(0);
                reply.entry_with_ttls(
                    &Duration::ZERO,
                    &self.negative_ttl(parent),
                    &attr,
                    Generation(0),
                );
            }
            res => self.reply_entry(reply, op.noted(res)),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let op = self.op(req, "getattr", || format!("({})", ino.0));
        if ino.0 == LOG_INO {
            return reply.attr(&Duration::from_secs(1), &self.log_attr());
        }
        let ino = self.inodes.volume(ino);
        match self.vfs.getattr(ino) {
            Ok(a) => reply.attr(&self.attr_ttl(&a), &self.kernel_attr(&a)),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let op = self.op(req, "setattr", || format!("({})", ino.0));
        let ino = self.inodes.volume(ino);
        // A SETATTR that sets nothing (or the ctime alone) is chown(-1, -1), or the kernel
        // asking to drop privileges it found (under FUSE_HANDLE_KILLPRIV_V2 it strips the
        // mode it would have set): both drop setuid, setgid and capabilities, as a chown.
        let chown = [mode, uid, gid].iter().all(Option::is_none)
            && size.is_none()
            && atime.is_none()
            && mtime.is_none();
        let set = SetAttr {
            mode,
            uid,
            gid,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            // Sent only by a kernel with the writeback cache, whose ctime `stat` shows.
            ctime: ctime.filter(|_| self.cache.writeback).map(setattr_nanos),
        };
        match self.vfs.setattr(&ctx(req), ino, &set, size, chown) {
            Ok(a) => {
                if let (Some(p), Some(_)) = (&self.passthrough, size) {
                    // A truncate by path: readers of the copy see it as others would.
                    p.changed(ino);
                }
                reply.attr(&self.attr_ttl(&a), &self.kernel_attr(&a))
            }
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let op = self.op(req, "readlink", || format!("({})", ino.0));
        let ino = self.inodes.volume(ino);
        match self.vfs.readlink(ino) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let op = self.op(req, "mknod", || {
            format!(
                "({},{},{},{},{})",
                parent.0,
                name.to_string_lossy(),
                mode,
                umask,
                rdev
            )
        });
        let parent = self.inodes.volume(parent);
        let Some(kind) = Kind::from_mode(mode) else {
            return reply.error(op.failed_with(Errno::EINVAL));
        };
        let res = self.vfs.mknod(
            &creator(req, umask),
            parent,
            name.as_bytes(),
            kind,
            mode & 0o7777,
            rdev,
        );
        self.reply_entry(reply, op.noted(res));
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let op = self.op(req, "mkdir", || {
            format!(
                "({},{},{},{})",
                parent.0,
                name.to_string_lossy(),
                mode,
                umask
            )
        });
        let parent = self.inodes.volume(parent);
        let res = self.vfs.mknod(
            &creator(req, umask),
            parent,
            name.as_bytes(),
            Kind::Dir,
            mode & 0o7777,
            0,
        );
        self.reply_entry(reply, op.noted(res));
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let op = self.op(req, "unlink", || {
            format!("({},{})", parent.0, name.to_string_lossy())
        });
        let parent = self.inodes.volume(parent);
        match self.vfs.unlink(&ctx(req), parent, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let op = self.op(req, "rmdir", || {
            format!("({},{})", parent.0, name.to_string_lossy())
        });
        let parent = self.inodes.volume(parent);
        match self.vfs.rmdir(&ctx(req), parent, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let op = self.op(req, "symlink", || {
            format!(
                "({},{},{})",
                parent.0,
                link_name.to_string_lossy(),
                target.display()
            )
        });
        let parent = self.inodes.volume(parent);
        let res = self.vfs.symlink(
            &ctx(req),
            parent,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
        );
        self.reply_entry(reply, op.noted(res));
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let op = self.op(req, "rename", || {
            format!(
                "({},{},{},{})",
                parent.0,
                name.to_string_lossy(),
                newparent.0,
                newname.to_string_lossy()
            )
        });
        let parent = self.inodes.volume(parent);
        let newparent = self.inodes.volume(newparent);
        let f = RenameFlags {
            noreplace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
            whiteout: flags.contains(fuser::RenameFlags::RENAME_WHITEOUT),
        };
        match self.vfs.rename(
            &ctx(req),
            parent,
            name.as_bytes(),
            newparent,
            newname.as_bytes(),
            f,
        ) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let op = self.op(req, "link", || {
            format!("({},{},{})", ino.0, newparent.0, newname.to_string_lossy())
        });
        let ino = self.inodes.volume(ino);
        let newparent = self.inodes.volume(newparent);
        let res = self.vfs.link(&ctx(req), ino, newparent, newname.as_bytes());
        self.reply_entry(reply, op.noted(res));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let op = self.op(req, "open", || format!("({})", ino.0));
        if ino.0 == LOG_INO {
            if req.uid() != 0 {
                return reply.error(op.failed_with(Errno::EACCES));
            }
            let mut rs = self.log_readers.lock();
            let fh = (LOG_FH + 1..)
                .find(|f| !rs.contains_key(f))
                .unwrap_or(LOG_FH + 1);
            rs.insert(fh, self.export.log().open_reader());
            return reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
        }
        let ino = self.inodes.volume(ino);
        match self.vfs.open(ino, flags.0) {
            Ok(o) => {
                if !o.keep && flags.0 & libc::O_TRUNC == 0 {
                    // Changed elsewhere: the kernel's size may be behind. (A byte this mount
                    // wrote there and has not handed over would be overwritten: only by a
                    // change made elsewhere at once, without a lock, which has no promise.)
                    self.push_size(ino, o.attr.length);
                }
                match &self.passthrough {
                    Some(p) => {
                        let ordinary = self.open_flags(ino, o.keep);
                        if let Err((reply, e)) = p.open(reply, &o.attr, o.fh, flags.0, ordinary) {
                            if let Err(e) = self.vfs.release(o.fh) {
                                tracing::warn!("inode {ino}: releasing a refused open: {e}");
                            }
                            reply.error(op.failed_with(e));
                        }
                    }
                    None => {
                        let mut f = self.open_flags(ino, o.keep);
                        if self.bypasses_cache(flags.0) {
                            f |= FopenFlags::FOPEN_DIRECT_IO;
                            self.vfs.append_at_end(o.fh);
                        }
                        reply.opened(FileHandle(o.fh), f)
                    }
                }
            }
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if fh.0 > LOG_FH {
            // Not logged: reading the log would log itself.
            let r = self.log_readers.lock().get(&fh.0).cloned();
            return match r {
                Some(r) => reply.data(&r.read(size as usize, Duration::from_secs(1))),
                None => reply.error(Errno::EBADF),
            };
        }
        let op = self.op(req, "read", || format!("({},{},{})", fh.0, offset, size));
        match self.vfs.read_shared(fh.0, offset, size) {
            Ok(d) => {
                self.export.requests().read(Proto::Fuse, d.len());
                reply.data(&d)
            }
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let op = self.op(req, "write", || {
            format!("({},{},{},{})", ino.0, fh.0, offset, data.len())
        });
        let ino = self.inodes.volume(ino);
        // Under FUSE_HANDLE_KILLPRIV_V2: the writer lacks CAP_FSETID.
        let kill = write_flags
            .contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            .then(|| ctx(req));
        // Written back from the kernel's writeback cache: the kernel keeps its times.
        let stamp = !(self.cache.writeback && write_flags.contains(WriteFlags::FUSE_WRITE_CACHE));
        match self
            .vfs
            .write_timed(fh.0, offset, data, kill.as_ref(), stamp)
        {
            Ok((n, changed)) => {
                if changed {
                    // Setuid or setgid dropped: the kernel still has them (attributes only:
                    // safe within a request).
                    self.coherence.forget_attr(ino);
                }
                self.export.requests().written(Proto::Fuse, n as usize);
                reply.written(n)
            }
            Err(e) => {
                if !stamp {
                    // From the writeback cache: the kernel keeps the refused bytes.
                    self.coherence.refused(ino);
                }
                reply.error(op.failed_with(errno(&e)))
            }
        }
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let op = self.op(req, "getlk", || {
            format!("({},{},{},{})", ino.0, start, end, typ)
        });
        let ino = self.inodes.volume(ino);
        let Some(kind) = lock_kind(typ) else {
            return reply.error(op.failed_with(Errno::EINVAL));
        };
        match self.vfs.getlk(ino, lock_owner.0, kind, start, end) {
            Ok(Some(l)) => reply.locked(l.start, l.end, lock_type(l.kind), l.pid),
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let op = self.op(req, "setlk", || {
            format!("({},{},{},{},{},{})", ino.0, fh.0, start, end, typ, pid)
        });
        let ino = self.inodes.volume(ino);
        let kind = match typ {
            libc::F_UNLCK => None,
            t => match lock_kind(t) {
                Some(k) => Some(k),
                None => return reply.error(op.failed_with(Errno::EINVAL)),
            },
        };
        let req = LockRequest {
            kind,
            start,
            end,
            pid,
        };
        let vfs = self.vfs.clone();
        let coherence = self.coherence.clone();
        let writeback = self.cache.writeback;
        if kind.is_none() && writeback {
            // What the kernel's writeback cache holds of the file was written under the lock:
            // handed over (the invalidation writes dirty pages back) before the lock goes.
            coherence.forget_file(ino);
        }
        let set =
            move || match vfs.setlk(ino, fh.0, lock_owner.0, req, sleep, &|| signal_pending(pid)) {
                Ok(()) => {
                    if kind.is_some() {
                        // As NFS does: a lock taken means the pages and attributes this kernel
                        // cached may predate another client's writes under that lock.
                        coherence.forget_file(ino);
                        if writeback {
                            // And the size, which the kernel keeps as its own.
                            match vfs.getattr(ino).and_then(|a| {
                                let b = match a.length {
                                    0 => None,
                                    n => vfs.read_at(ino, n - 1)?,
                                };
                                Ok((a.length, b))
                            }) {
                                Ok((n, Some(b))) => coherence.grow(ino, n, b),
                                Ok(_) => {}
                                Err(e) => tracing::debug!("size of inode {ino} at a lock: {e}"),
                            }
                        }
                    }
                    reply.ok()
                }
                Err(e) => reply.error(errno(&e)),
            };
        if sleep {
            // A wait may be long: not on a FUSE worker thread, which other requests need
            // (among them the unlock that ends the wait).
            if let Err(e) = std::thread::Builder::new()
                .name("unkai-lockwait".into())
                .spawn(set)
            {
                tracing::error!("cannot start a thread to wait for a lock: {e}");
            }
        } else {
            set();
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let op = self.op(req, "flush", || format!("({},{})", ino.0, fh.0));
        let ino = self.inodes.volume(ino);
        // A close by a process drops its fcntl locks on the file (the kernel leaves that to
        // a file system that keeps the locks).
        let res = self
            .vfs
            .flush(fh.0)
            .and(self.vfs.locks_closed_by(ino, lock_owner.0));
        // Before the reply: close(2) returns only once the kernel forgot refused bytes (its
        // pages are written back by now; no lock of the kernel's is held during a flush).
        self.forget_refused(ino);
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        // The flock owner: the address of a file already closed, perhaps reused by a newer
        // open (see `vfs::locks`); the handle says which locks go.
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if fh.0 > LOG_FH {
            if let Some(r) = self.log_readers.lock().remove(&fh.0) {
                self.export.log().close_reader(r);
            }
            return reply.ok();
        }
        let op = self.op(req, "release", || format!("({},{})", ino.0, fh.0));
        let ino = self.inodes.volume(ino);
        // Stored first (release flushes), then the locks go.
        let res = self.vfs.release_dropping(fh.0);
        if !self.forget_refused(ino) && matches!(res, Ok(true)) && self.cache.writeback {
            // The kernel still holds the dropped bytes and the size they made.
            self.coherence.forget_dropped(ino, &self.names_of(ino));
        }
        if let Some(p) = &self.passthrough {
            p.release(fh.0);
        }
        if let Err(e) = self.vfs.locks_released(ino, fh.0) {
            tracing::error!("inode {}: locks of a released file: {e}", ino);
        }
        match res {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn fsync(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let op = self.op(req, "fsync", || format!("({})", fh.0));
        match self.vfs.fsync(fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let op = self.op(req, "opendir", || format!("({})", ino.0));
        let ino = self.inodes.volume(ino);
        match self.vfs.opendir(ino, flags.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let op = self.op(req, "readdir", || format!("({},{})", ino.0, offset));
        let ino = self.inodes.volume(ino);
        let mut cookie = offset;
        loop {
            let (entries, end) =
                match self
                    .vfs
                    .readdir_open(&ctx(req), fh.0, ino, cookie, 256, false)
                {
                    Ok(e) => e,
                    Err(e) => return reply.error(op.failed_with(errno(&e))),
                };
            for e in &entries {
                if reply.add(
                    self.inodes.entry(ino, &e.name, e.ino),
                    e.cookie,
                    file_type(e.kind),
                    OsStr::from_bytes(&e.name),
                ) {
                    return reply.ok();
                }
                cookie = e.cookie;
            }
            if end {
                break;
            }
        }
        reply.ok()
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let op = self.op(req, "readdirplus", || format!("({},{})", ino.0, offset));
        let ino = self.inodes.volume(ino);
        let mut cookie = offset;
        loop {
            let (entries, end) =
                match self
                    .vfs
                    .readdir_open(&ctx(req), fh.0, ino, cookie, 128, true)
                {
                    Ok(e) => e,
                    Err(e) => return reply.error(op.failed_with(errno(&e))),
                };
            for e in &entries {
                let Some(a) = &e.attr else { continue };
                if reply.add(
                    self.inodes.entry(ino, &e.name, e.ino),
                    e.cookie,
                    OsStr::from_bytes(&e.name),
                    &self.entry_ttl(ino),
                    &self.kernel_attr(a),
                    self.coherence.generation(a.ino),
                ) {
                    return reply.ok();
                }
                cookie = e.cookie;
            }
            if end {
                break;
            }
        }
        reply.ok()
    }

    fn releasedir(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let op = self.op(req, "releasedir", || format!("({})", fh.0));
        match self.vfs.releasedir(fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn fsyncdir(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let op = self.op(req, "fsyncdir", || String::from("()"));
        match self.vfs.fsyncdir() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let op = self.op(req, "statfs", || format!("({})", ino.0));
        // A subdir mount whose directory has a quota shows the quota, as JuiceFS does.
        match self.vfs.statfs_in(self.inodes.root()) {
            Ok(s) => {
                let bs = 4096u64;
                reply.statfs(
                    s.total_bytes / bs,
                    s.free_bytes / bs,
                    s.free_bytes / bs,
                    s.files,
                    s.free_files,
                    bs as u32,
                    crate::meta::MAX_NAME_LEN as u32,
                    bs as u32,
                )
            }
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let op = self.op(req, "setxattr", || {
            format!(
                "({},{},{},{})",
                ino.0,
                name.to_string_lossy(),
                value.len(),
                flags
            )
        });
        let ino = self.inodes.volume(ino);
        if !self.acl && acl::is_acl(name.as_bytes()) {
            return reply.error(op.failed_with(Errno::EOPNOTSUPP));
        }
        match self
            .vfs
            .set_xattr(&ctx(req), ino, name.as_bytes(), value, flags)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let op = self.op(req, "getxattr", || {
            format!("({},{},{})", ino.0, name.to_string_lossy(), size)
        });
        let ino = self.inodes.volume(ino);
        match self.vfs.get_xattr(ino, name.as_bytes()) {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(op.failed_with(Errno::ERANGE)),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let op = self.op(req, "listxattr", || format!("({},{})", ino.0, size));
        let ino = self.inodes.volume(ino);
        match self.vfs.list_xattr(ino) {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(op.failed_with(Errno::ERANGE)),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let op = self.op(req, "removexattr", || {
            format!("({},{})", ino.0, name.to_string_lossy())
        });
        let ino = self.inodes.volume(ino);
        if !self.acl && acl::is_acl(name.as_bytes()) {
            return reply.error(op.failed_with(Errno::EOPNOTSUPP));
        }
        match self.vfs.remove_xattr(&ctx(req), ino, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let op = self.op(req, "access", || format!("({})", ino.0));
        let ino = self.inodes.volume(ino);
        // Only called without default_permissions; check the mode bits like the kernel would.
        let a = match self.vfs.getattr(ino) {
            Ok(a) => a,
            Err(e) => return reply.error(op.failed_with(errno(&e))),
        };
        if vfs::may(&ctx(req), &a, (mask.bits() & 7) as u32) {
            reply.ok()
        } else {
            reply.error(op.failed_with(Errno::EACCES))
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let op = self.op(req, "create", || {
            format!(
                "({},{},{},{},{})",
                parent.0,
                name.to_string_lossy(),
                mode,
                umask,
                flags
            )
        });
        let parent = self.inodes.volume(parent);
        match self.vfs.create(
            &creator(req, umask),
            parent,
            name.as_bytes(),
            mode & 0o7777,
            flags,
        ) {
            Ok(o) => {
                let (fh, a) = (o.fh, o.attr);
                if let Some(p) = &self.passthrough {
                    // The kernel opens a created file ordinarily.
                    p.opened_ordinarily(a.ino, fh);
                }
                // A new file: the kernel has no pages of it to keep or drop.
                let mut f = if self.cache.keep_cache {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                if self.bypasses_cache(flags) {
                    f |= FopenFlags::FOPEN_DIRECT_IO;
                    self.vfs.append_at_end(fh);
                }
                reply.created(
                    &self.attr_ttl(&a).min(self.entry_ttl(parent)),
                    &self.kernel_attr(&a),
                    self.coherence.generation(a.ino),
                    FileHandle(fh),
                    f,
                )
            }
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    /// The inode flags of `chattr`/`lsattr` (FS_IOC_GETFLAGS/SETFLAGS, an int whatever the
    /// size the number encodes); any other ioctl is ENOTTY, quietly.
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let op = self.op(req, "ioctl", || {
            format!("({},{},{},{})", ino.0, cmd, in_data.len(), out_size)
        });
        let ino = self.inodes.volume(ino);
        const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
        const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
        const FS_IOC32_GETFLAGS: u32 = 0x8004_6601;
        const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
        const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
        const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
        // Both setters carry the flags in their first 4 bytes (an int; fsxattr's fsx_xflags).
        let given = || match in_data.get(..4) {
            Some(b) => Ok(u32::from_ne_bytes(b.try_into().expect("4 bytes"))),
            None => Err(Errno::EINVAL),
        };
        let set = |flags: u32| match self
            .vfs
            .set_flags(&ctx(req), ino, flags, self.cache.writeback)
        {
            Ok(_) => Ok(Vec::new()),
            Err(e) => Err(errno(&e)),
        };
        let flags = || {
            self.vfs
                .getattr(ino)
                .map(|a| a.flags & crate::meta::flags::KEPT)
                .map_err(|e| errno(&e))
        };
        let res = match cmd {
            // The kernel passes an int (4 bytes), whatever size the number encodes.
            FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => flags().map(|f| {
                let mut out = f.to_ne_bytes().to_vec();
                out.resize(8, 0);
                out
            }),
            FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS => given().and_then(set),
            // struct fsxattr (28 bytes): the kernel reads the flags this way before it sets
            // them, and xfs_io uses it.
            FS_IOC_FSGETXATTR => flags().map(|f| {
                let mut out = vec![0u8; 28];
                out[..4].copy_from_slice(&xflags_of(f).to_ne_bytes());
                out
            }),
            FS_IOC_FSSETXATTR => given().and_then(|x| set(flags_of_xflags(x))),
            _ => {
                tracing::debug!("ioctl {cmd:#x} of inode {}: ENOTTY", ino);
                Err(Errno::ENOTTY)
            }
        };
        match res {
            Ok(mut out) => {
                out.truncate(out_size as usize);
                reply.ioctl(0, &out)
            }
            Err(e) => reply.error(op.failed_with(e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let op = self.op(req, "fallocate", || {
            format!("({},{},{},{})", fh.0, offset, length, mode)
        });
        match self.vfs.fallocate(&ctx(req), fh.0, offset, length, mode) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let op = self.op(req, "lseek", || format!("({},{},{})", fh.0, offset, whence));
        if self.cache.writeback && self.vfs.open_for_writing(self.inodes.volume(ino)) {
            // Dirty pages the kernel has not handed over yet would be invisible here (holes
            // where data was written): the invalidation writes them back first. A file no
            // descriptor of this mount can write has none.
            self.coherence.forget_file(self.inodes.volume(ino));
        }
        if offset < 0 {
            return reply.error(op.failed_with(Errno::ENXIO));
        }
        match self.vfs.lseek(fh.0, offset as u64, whence) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let op = self.op(req, "copy_file_range", || {
            format!(
                "({},{},{},{},{})",
                fh_in.0, offset_in, fh_out.0, offset_out, len
            )
        });
        let len = len.min(u32::MAX as u64 & !0xfff);
        match self
            .vfs
            .copy_file_range(&ctx(req), fh_in.0, offset_in, fh_out.0, offset_out, len)
        {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(op.failed_with(errno(&e))),
        }
    }
}
