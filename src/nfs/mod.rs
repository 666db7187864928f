//! `unkai nfs`: the volume (or `--subdir` of it) served over NFSv3, each request turned into
//! `vfs` calls as the FUSE adapter turns the kernel's (the `nfsserve` crate speaks the
//! protocol: XDR, ONC RPC, MOUNT; a file handle names an inode number).
//!
//! NFSv3 has no open or close: a file's vfs handle is opened at its first READ or WRITE and
//! kept in a small table across requests, then released once idle ([`IDLE`]), so the vfs
//! sees one open-write-close per burst of writes (the write-back hook and the antivirus scan
//! run at that close). nfsserve answers every WRITE FILE_SYNC (and has no COMMIT), so each
//! WRITE is made durable (`vfs::fsync`) before its reply.
//!
//! nfsserve is used as published; what it lacks is done around it here. Its accept loop
//! takes every peer and allocates whatever length a record mark claims, so it listens on an
//! ephemeral port of 127.0.0.1 only, and the public listener ([`serve`]) accepts clients,
//! closes those outside `--allow` at once, and relays the others' bytes, ending a
//! connection whose record fragment is longer than [`MAX_RECORD`] ([`Marks`]). It does not
//! hand the file system the caller's AUTH_UNIX credentials: every call acts as the export's
//! one identity (`export::Export::identity`).
//!
//! Not for: export options and identity (`export`), flags (`cli::nfs`), opening the volume
//! (`volume::front`), NFSv4 or locking (NLM).

pub mod export;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nfsserve::nfs::{
    fattr3, fileid3, filename3, fsinfo3, ftype3, nfs_fh3, nfspath3, nfsstat3, nfstime3,
    post_op_attr, sattr3, set_atime, set_gid3, set_mode3, set_mtime, set_size3, set_uid3,
    specdata3,
};
use nfsserve::tcp::{NFSTcp, NFSTcpListener};
use nfsserve::vfs::{DirEntry, NFSFileSystem, ReadDirResult, VFSCapabilities};
use parking_lot::Mutex;

use crate::meta::{Attr, Ino, Kind, MAX_NAME_LEN, Nanos, RenameFlags, SetAttr, SetTime};
use crate::vfs::{self, Vfs};
use crate::volume::front::Front;
use export::{Export, Identity};

/// How long a file's handle stays open after its last READ or WRITE.
pub const IDLE: Duration = Duration::from_millis(1500);

/// The most a READ returns and a WRITE should carry (FSINFO's rtmax and wtmax).
const MAX_IO: u32 = 1 << 20;

/// The longest RPC record (all its fragments) a client may send: the largest WRITE FSINFO
/// allows plus room for the RPC header, credentials and arguments (a few hundred bytes).
pub const MAX_RECORD: u64 = MAX_IO as u64 + (64 << 10);

/// Directory entries a READDIR reads from the vfs at most (the crate trims by bytes).
const DIR_PAGE: usize = 512;

/// The protocol's error for a vfs error: the one place errnos become NFS errors.
pub fn status(e: &vfs::Error) -> nfsstat3 {
    match e.errno() {
        libc::ENOENT => nfsstat3::NFS3ERR_NOENT,
        libc::EACCES => nfsstat3::NFS3ERR_ACCES,
        libc::EPERM => nfsstat3::NFS3ERR_PERM,
        libc::EEXIST => nfsstat3::NFS3ERR_EXIST,
        libc::ENOTDIR => nfsstat3::NFS3ERR_NOTDIR,
        libc::EISDIR => nfsstat3::NFS3ERR_ISDIR,
        libc::ENOTEMPTY => nfsstat3::NFS3ERR_NOTEMPTY,
        libc::ENOSPC => nfsstat3::NFS3ERR_NOSPC,
        libc::EDQUOT => nfsstat3::NFS3ERR_DQUOT,
        libc::EROFS => nfsstat3::NFS3ERR_ROFS,
        libc::ENAMETOOLONG => nfsstat3::NFS3ERR_NAMETOOLONG,
        libc::ESTALE => nfsstat3::NFS3ERR_STALE,
        libc::EFBIG => nfsstat3::NFS3ERR_FBIG,
        libc::EINVAL => nfsstat3::NFS3ERR_INVAL,
        libc::EXDEV => nfsstat3::NFS3ERR_XDEV,
        libc::EMLINK => nfsstat3::NFS3ERR_MLINK,
        _ => nfsstat3::NFS3ERR_IO,
    }
}

type Res<T> = Result<T, nfsstat3>;

fn err<T>(errno: i32) -> vfs::Result<T> {
    Err(vfs::Error::Sys(errno))
}

/// An open vfs handle of a file, shared by the requests that use it (all of them act as
/// the one identity that opened it, checked then).
struct Open {
    fh: u64,
}

/// A table entry: the handle and when a request last used it.
struct Slot {
    open: Arc<Open>,
    used: Instant,
}

/// The NFS file system over a [`Front`].
pub struct Server {
    vfs: Arc<Vfs>,
    root: Ino,
    read_only: bool,
    /// Whom every call acts as.
    who: Identity,
    /// Handles open for writing, and for reading, by inode.
    writers: Mutex<HashMap<Ino, Slot>>,
    readers: Mutex<HashMap<Ino, Slot>>,
    /// Where a listing goes on after an entry: (directory, entry's inode) → vfs cookie.
    cursors: Mutex<HashMap<(Ino, Ino), u64>>,
    /// With `--subdir`: the inodes this server named to clients (all under the export root);
    /// a handle of any other is stale.
    known: Option<Mutex<HashSet<Ino>>>,
    /// This run's file-handle generation and write verifier (a restart changes both).
    generation: u64,
}

impl Server {
    pub fn new(front: &Front, export: Export) -> Server {
        let subdir = front.root != crate::meta::ROOT_INO;
        Server {
            vfs: front.vfs.clone(),
            root: front.root,
            read_only: front.read_only,
            who: export.identity(),
            writers: Mutex::new(HashMap::new()),
            readers: Mutex::new(HashMap::new()),
            cursors: Mutex::new(HashMap::new()),
            known: subdir.then(|| Mutex::new(HashSet::from([front.root]))),
            generation: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1),
        }
    }

    /// Runs `f` (vfs calls, which block) off the runtime's threads, as the export's identity.
    async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Server, &Identity) -> vfs::Result<T> + Send + 'static,
    ) -> Res<T> {
        let me = self.clone();
        let who = self.who.clone();
        match tokio::task::spawn_blocking(move || f(&me, &who)).await {
            Ok(r) => r.map_err(|e| status(&e)),
            Err(e) => {
                tracing::error!("an NFS request failed: {e}");
                Err(nfsstat3::NFS3ERR_SERVERFAULT)
            }
        }
    }

    fn writable(&self) -> Res<()> {
        if self.read_only {
            Err(nfsstat3::NFS3ERR_ROFS)
        } else {
            Ok(())
        }
    }

    /// Remembers that clients were told of `ino` (with `--subdir`).
    fn learn(&self, ino: Ino) {
        if let Some(k) = &self.known {
            k.lock().insert(ino);
        }
    }

    /// Whether a client may name `ino` (always, unless `--subdir` and never told of it).
    fn reachable(&self, ino: Ino) -> bool {
        self.known.as_ref().is_none_or(|k| k.lock().contains(&ino))
    }

    /// The attributes of directory `dir` if `who` may search it.
    fn searchable(&self, who: &Identity, dir: Ino) -> vfs::Result<Attr> {
        let d = self.vfs.getattr(dir)?;
        if d.kind != Kind::Dir {
            return err(libc::ENOTDIR);
        }
        if !who.may(&d, 1) {
            return err(libc::EACCES);
        }
        Ok(d)
    }

    /// The attributes of directory `dir` if `who` may add or remove entries in it.
    fn changeable(&self, who: &Identity, dir: Ino) -> vfs::Result<Attr> {
        let d = self.searchable(who, dir)?;
        if !who.may(&d, 2) {
            return err(libc::EACCES);
        }
        Ok(d)
    }

    fn lookup_in(&self, who: &Identity, dir: Ino, name: &[u8]) -> vfs::Result<Attr> {
        self.searchable(who, dir)?;
        if name.len() > MAX_NAME_LEN {
            return err(libc::ENAMETOOLONG);
        }
        match name {
            b"" => err(libc::ENOENT),
            b"." => self.vfs.getattr(dir),
            // Never above the export's root.
            b".." if dir == self.root => self.vfs.getattr(dir),
            b".." => {
                let d = self.vfs.getattr(dir)?;
                self.vfs.getattr(d.parent)
            }
            _ => self.vfs.lookup(&who.ctx(), dir, name),
        }
    }

    /// A name a request creates or removes: not `.`, `..`, empty, or with a slash.
    fn plain(name: &[u8]) -> vfs::Result<&[u8]> {
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return err(libc::EINVAL);
        }
        if name.len() > MAX_NAME_LEN {
            return err(libc::ENAMETOOLONG);
        }
        Ok(name)
    }

    /// The handle of `ino` open for writing (opened now if none is), as `who`.
    fn writer(&self, who: &Identity, ino: Ino) -> vfs::Result<Arc<Open>> {
        if let Some(s) = self.writers.lock().get_mut(&ino) {
            s.used = Instant::now();
            return Ok(s.open.clone());
        }
        self.open_file(who, ino, true)
    }

    /// The handle of `ino` open for reading (a writer's, if there is one), as `who`.
    fn reader(&self, who: &Identity, ino: Ino) -> vfs::Result<Arc<Open>> {
        let cached = {
            let now = Instant::now();
            let mut w = self.writers.lock();
            match w.get_mut(&ino) {
                Some(s) => {
                    s.used = now;
                    Some(s.open.clone())
                }
                None => self.readers.lock().get_mut(&ino).map(|s| {
                    s.used = now;
                    s.open.clone()
                }),
            }
        };
        if let Some(o) = cached {
            return Ok(o);
        }
        self.open_file(who, ino, false)
    }

    /// Opens the regular file `ino` for writing or reading, as `who` may, and keeps the handle
    /// in the writers' or readers' table.
    fn open_file(&self, who: &Identity, ino: Ino, write: bool) -> vfs::Result<Arc<Open>> {
        let a = self.vfs.getattr(ino)?;
        match a.kind {
            Kind::File => {}
            Kind::Dir => return err(libc::EISDIR),
            _ => return err(libc::EINVAL),
        }
        let (want, flags, table) = match write {
            true => (2, libc::O_RDWR, &self.writers),
            false => (4, libc::O_RDONLY, &self.readers),
        };
        if !who.may(&a, want) {
            return err(libc::EACCES);
        }
        let o = self.vfs.open(ino, flags)?;
        Ok(self.keep(table, ino, o.fh))
    }

    /// Puts a handle just opened in `table`; if another request put one there meanwhile,
    /// that one is used and this one released.
    fn keep(&self, table: &Mutex<HashMap<Ino, Slot>>, ino: Ino, fh: u64) -> Arc<Open> {
        let (open, extra) = {
            let mut t = table.lock();
            match t.get_mut(&ino) {
                Some(s) => {
                    s.used = Instant::now();
                    (s.open.clone(), Some(fh))
                }
                None => {
                    let open = Arc::new(Open { fh });
                    t.insert(
                        ino,
                        Slot {
                            open: open.clone(),
                            used: Instant::now(),
                        },
                    );
                    (open, None)
                }
            }
        };
        if let Some(fh) = extra {
            if let Err(e) = self.vfs.release(fh) {
                tracing::warn!("inode {ino}: releasing a second handle: {e}");
            }
        }
        open
    }

    /// Releases the handles idle for `idle` or more (all of them with zero), writers made
    /// durable first. A handle a request is using is left for the next round.
    pub fn release_idle(&self, idle: Duration) {
        for (table, write) in [(&self.writers, true), (&self.readers, false)] {
            let gone: Vec<(Ino, Arc<Open>)> = {
                let mut t = table.lock();
                let done: Vec<Ino> = t
                    .iter()
                    .filter(|(_, s)| s.used.elapsed() >= idle && Arc::strong_count(&s.open) == 1)
                    .map(|(i, _)| *i)
                    .collect();
                done.into_iter()
                    .filter_map(|i| t.remove(&i).map(|s| (i, s.open)))
                    .collect()
            };
            for (ino, open) in gone {
                if write {
                    if let Err(e) = self.vfs.fsync(open.fh) {
                        tracing::error!("inode {ino}: storing what NFS clients wrote: {e}");
                    }
                }
                if let Err(e) = self.vfs.release(open.fh) {
                    tracing::error!("inode {ino}: closing after NFS writes: {e}");
                }
            }
        }
    }

    /// Applies `s` to `ino` as `who`, with the checks the kernel makes before a setattr.
    fn apply(&self, who: &Identity, ino: Ino, s: &sattr3) -> vfs::Result<Attr> {
        let a = self.vfs.getattr(ino)?;
        let mut set = SetAttr::default();
        if let set_mode3::mode(m) = s.mode {
            if !who.owns(&a) {
                return err(libc::EPERM);
            }
            let mut m = m & 0o7777;
            // As chmod(2): setgid goes when the owner is not in the file's group.
            if who.uid != 0 && a.kind != Kind::Dir && !who.ctx().in_group(a.gid) {
                m &= !libc::S_ISGID;
            }
            set.mode = Some(m);
        }
        if let set_uid3::uid(u) = s.uid {
            if u != a.uid && who.uid != 0 {
                return err(libc::EPERM);
            }
            set.uid = Some(u);
        }
        if let set_gid3::gid(g) = s.gid {
            if g != a.gid && who.uid != 0 && !(who.uid == a.uid && who.ctx().in_group(g)) {
                return err(libc::EPERM);
            }
            set.gid = Some(g);
        }
        let time = |t: Option<SetTime>| -> vfs::Result<Option<SetTime>> {
            match t {
                Some(SetTime::At(_)) if !who.owns(&a) => err(libc::EPERM),
                Some(SetTime::Now) if !who.owns(&a) && !who.may(&a, 2) => err(libc::EACCES),
                t => Ok(t),
            }
        };
        set.atime = time(match s.atime {
            set_atime::DONT_CHANGE => None,
            set_atime::SET_TO_SERVER_TIME => Some(SetTime::Now),
            set_atime::SET_TO_CLIENT_TIME(t) => Some(SetTime::At(nanos(t))),
        })?;
        set.mtime = time(match s.mtime {
            set_mtime::DONT_CHANGE => None,
            set_mtime::SET_TO_SERVER_TIME => Some(SetTime::Now),
            set_mtime::SET_TO_CLIENT_TIME(t) => Some(SetTime::At(nanos(t))),
        })?;
        let size = match s.size {
            set_size3::size(n) => {
                if a.kind == Kind::Dir {
                    return err(libc::EISDIR);
                }
                if !who.may(&a, 2) {
                    return err(libc::EACCES);
                }
                Some(n)
            }
            set_size3::Void => None,
        };
        self.vfs.setattr(&who.ctx(), ino, &set, size, false)
    }

    /// The listing of `dir` after the entry `after` (0: from the start), `.` and `..` left
    /// out (the crate's cookies are inode numbers, and theirs are not the entries').
    fn list(&self, who: &Identity, dir: Ino, after: Ino, max: usize) -> vfs::Result<ReadDirResult> {
        let d = self.vfs.getattr(dir)?;
        if d.kind != Kind::Dir {
            return err(libc::ENOTDIR);
        }
        if !who.may(&d, 4) {
            return err(libc::EACCES);
        }
        let ctx = who.ctx();
        let mut cookie = 0;
        if after != 0 {
            let known = self.cursors.lock().get(&(dir, after)).copied();
            cookie = match known {
                Some(c) => c,
                None => self.find_cookie(who, dir, after)?,
            };
        }
        let max = max.clamp(1, DIR_PAGE);
        let mut out = ReadDirResult {
            entries: Vec::new(),
            end: false,
        };
        let mut cursors = Vec::new();
        while out.entries.len() < max {
            let page = self.vfs.readdir(&ctx, dir, cookie, max, true)?;
            let Some(last) = page.last() else {
                out.end = true;
                break;
            };
            cookie = last.cookie;
            for e in page {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let a = match e.attr {
                    Some(a) => a,
                    None => match self.vfs.getattr(e.ino) {
                        Ok(a) => a,
                        Err(_) => continue, // gone meanwhile
                    },
                };
                cursors.push(((dir, e.ino), e.cookie));
                self.learn(e.ino);
                out.entries.push(DirEntry {
                    fileid: e.ino,
                    name: e.name.into(),
                    attr: fattr(&a),
                });
                if out.entries.len() == max {
                    break;
                }
            }
        }
        let mut c = self.cursors.lock();
        if c.len() > 65536 {
            c.clear();
        }
        c.extend(cursors);
        Ok(out)
    }

    /// The vfs cookie just after entry `ino` of `dir`, found by reading the directory
    /// (when this server did not list it itself). BAD_COOKIE-like (EINVAL) if it is gone.
    fn find_cookie(&self, who: &Identity, dir: Ino, ino: Ino) -> vfs::Result<u64> {
        let ctx = who.ctx();
        let mut cookie = 0;
        loop {
            let page = self.vfs.readdir(&ctx, dir, cookie, DIR_PAGE, false)?;
            let Some(last) = page.last() else {
                return err(libc::EINVAL);
            };
            if let Some(e) = page
                .iter()
                .find(|e| e.ino == ino && e.name != b"." && e.name != b"..")
            {
                return Ok(e.cookie);
            }
            cookie = last.cookie;
        }
    }

    /// Removes `name` from `dir` (a file or an empty directory), as `who`.
    fn remove_in(&self, who: &Identity, dir: Ino, name: &[u8]) -> vfs::Result<()> {
        let name = Self::plain(name)?;
        let d = self.changeable(who, dir)?;
        let victim = self.vfs.lookup(&who.ctx(), dir, name)?;
        if !who.may_delete(&d, &victim) {
            return err(libc::EACCES);
        }
        if victim.kind == Kind::Dir {
            self.vfs.rmdir(&who.ctx(), dir, name)
        } else {
            self.vfs.unlink(&who.ctx(), dir, name)
        }
    }

    fn rename_in(
        &self,
        who: &Identity,
        from: Ino,
        name: &[u8],
        to: Ino,
        new_name: &[u8],
    ) -> vfs::Result<()> {
        let name = Self::plain(name)?;
        let new_name = Self::plain(new_name)?;
        let fd = self.changeable(who, from)?;
        let td = self.changeable(who, to)?;
        let victim = self.vfs.lookup(&who.ctx(), from, name)?;
        if !who.may_delete(&fd, &victim) {
            return err(libc::EACCES);
        }
        match self.vfs.lookup(&who.ctx(), to, new_name) {
            Ok(old) if !who.may_delete(&td, &old) => return err(libc::EACCES),
            Ok(_) => {}
            Err(e) if e.errno() == libc::ENOENT => {}
            Err(e) => return Err(e),
        }
        // A directory moved to another parent gets a new `..`: write access to it is asked.
        if victim.kind == Kind::Dir && from != to && !who.may(&victim, 2) {
            return err(libc::EACCES);
        }
        self.vfs
            .rename(&who.ctx(), from, name, to, new_name, RenameFlags::default())
    }
}

/// NFS attributes of an inode.
pub fn fattr(a: &Attr) -> fattr3 {
    let size = if a.kind == Kind::Dir { 4096 } else { a.length };
    let used = if a.kind == Kind::File { a.stored } else { size };
    fattr3 {
        ftype: match a.kind {
            Kind::File => ftype3::NF3REG,
            Kind::Dir => ftype3::NF3DIR,
            Kind::Symlink => ftype3::NF3LNK,
            Kind::Fifo => ftype3::NF3FIFO,
            Kind::CharDev => ftype3::NF3CHR,
            Kind::BlockDev => ftype3::NF3BLK,
            Kind::Socket => ftype3::NF3SOCK,
        },
        mode: a.mode & 0o7777,
        nlink: a.visible_nlink(),
        uid: a.uid,
        gid: a.gid,
        size,
        used,
        rdev: specdata3 {
            specdata1: libc::major(a.rdev as libc::dev_t),
            specdata2: libc::minor(a.rdev as libc::dev_t),
        },
        fsid: 0,
        fileid: a.ino,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
    }
}

fn time(ns: Nanos) -> nfstime3 {
    let ns = ns.max(0);
    nfstime3 {
        seconds: (ns / 1_000_000_000).min(u32::MAX as i64) as u32,
        nseconds: (ns % 1_000_000_000) as u32,
    }
}

fn nanos(t: nfstime3) -> Nanos {
    t.seconds as i64 * 1_000_000_000 + t.nseconds.min(999_999_999) as i64
}

/// The file system the crate serves: a [`Server`] shared with the task that releases idle
/// handles.
pub struct Exported(pub Arc<Server>);

#[async_trait]
impl NFSFileSystem for Exported {
    fn capabilities(&self) -> VFSCapabilities {
        if self.0.read_only {
            VFSCapabilities::ReadOnly
        } else {
            VFSCapabilities::ReadWrite
        }
    }

    fn root_dir(&self) -> fileid3 {
        self.0.root
    }

    async fn lookup(&self, dirid: fileid3, filename: &filename3) -> Res<fileid3> {
        let name = filename.0.clone();
        let a = self
            .0
            .run(move |s, who| s.lookup_in(who, dirid, &name))
            .await?;
        self.0.learn(a.ino);
        Ok(a.ino)
    }

    async fn getattr(&self, id: fileid3) -> Res<fattr3> {
        self.0
            .run(move |s, _| s.vfs.getattr(id).map(|a| fattr(&a)))
            .await
    }

    async fn setattr(&self, id: fileid3, setattr: sattr3) -> Res<fattr3> {
        self.0.writable()?;
        self.0
            .run(move |s, who| s.apply(who, id, &setattr).map(|a| fattr(&a)))
            .await
    }

    async fn read(&self, id: fileid3, offset: u64, count: u32) -> Res<(Vec<u8>, bool)> {
        let count = count.min(MAX_IO);
        self.0
            .run(move |s, who| {
                let open = s.reader(who, id)?;
                let data = s.vfs.read(open.fh, offset, count)?;
                let eof = if (data.len() as u32) < count {
                    true
                } else {
                    offset + data.len() as u64 >= s.vfs.getattr(id)?.length
                };
                Ok((data, eof))
            })
            .await
    }

    /// nfsserve answers every WRITE FILE_SYNC: what it was given is durable before the reply
    /// (on a write-back volume, in the local staging; otherwise in the object store).
    async fn write(&self, id: fileid3, offset: u64, data: &[u8]) -> Res<fattr3> {
        self.0.writable()?;
        tracing::trace!("nfs write inode {id} at {offset} len {}", data.len());
        let data = data.to_vec();
        self.0
            .run(move |s, who| {
                let open = s.writer(who, id)?;
                let unprivileged = (who.uid != 0).then(|| who.ctx());
                s.vfs.write(open.fh, offset, &data, unprivileged.as_ref())?;
                s.vfs.fsync(open.fh)?;
                Ok(fattr(&s.vfs.getattr(id)?))
            })
            .await
    }

    async fn create(
        &self,
        dirid: fileid3,
        filename: &filename3,
        attr: sattr3,
    ) -> Res<(fileid3, fattr3)> {
        self.0.writable()?;
        let name = filename.0.clone();
        let a = self
            .0
            .run(move |s, who| {
                let name = Server::plain(&name)?;
                s.changeable(who, dirid)?;
                let mode = match attr.mode {
                    set_mode3::mode(m) => m & 0o7777,
                    set_mode3::Void => 0o644,
                };
                let trunc = matches!(attr.size, set_size3::size(0));
                let flags = libc::O_RDWR | if trunc { libc::O_TRUNC } else { 0 };
                let o = s.vfs.create(&who.ctx(), dirid, name, mode, flags)?;
                let ino = o.attr.ino;
                // Kept for the WRITEs that follow.
                s.keep(&s.writers, ino, o.fh);
                let rest = sattr3 {
                    mode: set_mode3::Void,
                    size: match attr.size {
                        set_size3::size(0) => set_size3::Void,
                        other => other,
                    },
                    ..attr
                };
                let nothing = matches!(
                    (rest.uid, rest.gid, rest.size, rest.atime, rest.mtime),
                    (
                        set_uid3::Void,
                        set_gid3::Void,
                        set_size3::Void,
                        set_atime::DONT_CHANGE,
                        set_mtime::DONT_CHANGE
                    )
                );
                if nothing {
                    s.vfs.getattr(ino)
                } else {
                    s.apply(who, ino, &rest)
                }
            })
            .await?;
        self.0.learn(a.ino);
        Ok((a.ino, fattr(&a)))
    }

    async fn create_exclusive(&self, dirid: fileid3, filename: &filename3) -> Res<fileid3> {
        self.0.writable()?;
        let name = filename.0.clone();
        let a = self
            .0
            .run(move |s, who| {
                let name = Server::plain(&name)?;
                s.changeable(who, dirid)?;
                let o =
                    s.vfs
                        .create(&who.ctx(), dirid, name, 0o644, libc::O_RDWR | libc::O_EXCL)?;
                s.keep(&s.writers, o.attr.ino, o.fh);
                Ok(o.attr)
            })
            .await?;
        self.0.learn(a.ino);
        Ok(a.ino)
    }

    async fn mkdir(&self, dirid: fileid3, dirname: &filename3) -> Res<(fileid3, fattr3)> {
        self.0.writable()?;
        let name = dirname.0.clone();
        let a = self
            .0
            .run(move |s, who| {
                let name = Server::plain(&name)?;
                s.changeable(who, dirid)?;
                // The crate does not pass the mode asked: the usual 0755 (a SETATTR may follow).
                s.vfs.mknod(&who.ctx(), dirid, name, Kind::Dir, 0o755, 0)
            })
            .await?;
        self.0.learn(a.ino);
        Ok((a.ino, fattr(&a)))
    }

    async fn remove(&self, dirid: fileid3, filename: &filename3) -> Res<()> {
        self.0.writable()?;
        let name = filename.0.clone();
        self.0
            .run(move |s, who| s.remove_in(who, dirid, &name))
            .await
    }

    async fn rename(
        &self,
        from_dirid: fileid3,
        from_filename: &filename3,
        to_dirid: fileid3,
        to_filename: &filename3,
    ) -> Res<()> {
        self.0.writable()?;
        let (from, to) = (from_filename.0.clone(), to_filename.0.clone());
        self.0
            .run(move |s, who| s.rename_in(who, from_dirid, &from, to_dirid, &to))
            .await
    }

    async fn readdir(
        &self,
        dirid: fileid3,
        start_after: fileid3,
        max_entries: usize,
    ) -> Res<ReadDirResult> {
        self.0
            .run(move |s, who| s.list(who, dirid, start_after, max_entries))
            .await
    }

    async fn symlink(
        &self,
        dirid: fileid3,
        linkname: &filename3,
        symlink: &nfspath3,
        _attr: &sattr3,
    ) -> Res<(fileid3, fattr3)> {
        self.0.writable()?;
        let (name, target) = (linkname.0.clone(), symlink.0.clone());
        let a = self
            .0
            .run(move |s, who| {
                let name = Server::plain(&name)?;
                s.changeable(who, dirid)?;
                s.vfs.symlink(&who.ctx(), dirid, name, &target)
            })
            .await?;
        self.0.learn(a.ino);
        Ok((a.ino, fattr(&a)))
    }

    async fn readlink(&self, id: fileid3) -> Res<nfspath3> {
        self.0
            .run(move |s, _| s.vfs.readlink(id).map(nfspath3::from))
            .await
    }

    async fn fsinfo(&self, root_fileid: fileid3) -> Res<fsinfo3> {
        let attr = self.getattr(root_fileid).await;
        Ok(fsinfo3 {
            obj_attributes: attr.map_or(post_op_attr::Void, post_op_attr::attributes),
            rtmax: MAX_IO,
            rtpref: MAX_IO,
            rtmult: 4096,
            wtmax: MAX_IO,
            wtpref: MAX_IO,
            wtmult: 4096,
            // nfsserve answers a plain READDIR from the top of the directory whatever its
            // cookie: a client that sizes it by this gets one page of ~30000 entries.
            dtpref: MAX_IO,
            maxfilesize: crate::meta::MAX_FILE_SIZE,
            time_delta: nfstime3 {
                seconds: 0,
                nseconds: 1,
            },
            properties: nfsserve::nfs::FSF_SYMLINK
                | nfsserve::nfs::FSF_HOMOGENEOUS
                | nfsserve::nfs::FSF_CANSETTIME,
        })
    }

    fn id_to_fh(&self, id: fileid3) -> nfs_fh3 {
        let mut data = Vec::with_capacity(16);
        data.extend_from_slice(&self.0.generation.to_le_bytes());
        data.extend_from_slice(&id.to_le_bytes());
        nfs_fh3 { data }
    }

    fn fh_to_id(&self, fh: &nfs_fh3) -> Res<fileid3> {
        let Ok(bytes) = <[u8; 16]>::try_from(fh.data.as_slice()) else {
            return Err(nfsstat3::NFS3ERR_BADHANDLE);
        };
        let (g, i) = bytes.split_at(8);
        let generation = u64::from_le_bytes(g.try_into().expect("8 bytes"));
        let id = u64::from_le_bytes(i.try_into().expect("8 bytes"));
        // Another run's handle, or an inode outside of the export: stale.
        if generation != self.0.generation || id == 0 || !self.0.reachable(id) {
            return Err(nfsstat3::NFS3ERR_STALE);
        }
        Ok(id)
    }

    fn serverid(&self) -> [u8; 8] {
        self.0.generation.to_le_bytes()
    }
}

/// Serves `front` over NFSv3 at `listen` until the runtime stops it; then every handle is
/// released (the caller flushes the volume).
///
/// nfsserve listens on an ephemeral port of 127.0.0.1; `listen` is unkai's own listener,
/// which closes a client outside `--allow` before reading a byte and relays the others to
/// nfsserve ([`relay`]).
pub async fn serve(
    front: Front,
    listen: std::net::SocketAddr,
    export: Export,
) -> anyhow::Result<()> {
    let server = Arc::new(Server::new(&front, export.clone()));
    let public = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen at {listen}: {e}"))?;
    let inner = NFSTcpListener::bind("127.0.0.1:0", Exported(server.clone()))
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on 127.0.0.1 for the NFS server: {e}"))?;
    let backend = std::net::SocketAddr::new(inner.get_listen_ip(), inner.get_listen_port());
    let addr = public.local_addr()?;
    tracing::info!(
        "nfs serving volume '{}' at {addr} (relayed to {backend})",
        front.name
    );
    // Handles idle for a while are released; all of them when the server stops.
    let _release = Releaser(server.clone());
    let reaper = {
        let server = server.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(IDLE / 3).await;
                let s = server.clone();
                let _ = tokio::task::spawn_blocking(move || s.release_idle(IDLE)).await;
            }
        })
    };
    let mut nfs = tokio::spawn(async move { inner.handle_forever().await });
    let mut refused = 0u64;
    let res = loop {
        let (client, peer) = tokio::select! {
            r = &mut nfs => break match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(anyhow::anyhow!("the NFS server stopped: {e}")),
                Err(e) => Err(anyhow::anyhow!("the NFS server stopped: {e}")),
            },
            a = public.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: the listener itself stays.
                    tracing::warn!("accepting an NFS client: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if !export.allows(peer.ip()) {
            // Said for the first refusals, then every thousandth (a scan must not flood).
            if refused < 10 || refused % 1000 == 0 {
                tracing::warn!("refused an NFS client at {peer}: not in --allow");
            }
            refused += 1;
            drop(client);
            continue;
        }
        tokio::spawn(async move {
            if let Err(e) = relay(client, backend).await {
                tracing::debug!("NFS client {peer}: {e}");
            }
        });
    };
    reaper.abort();
    nfs.abort();
    res
}

/// Relays one allowed client to nfsserve at `backend` and back, ending the connection when
/// either side closes or the client's record marks break [`Marks`]' bound.
async fn relay(client: tokio::net::TcpStream, backend: std::net::SocketAddr) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = tokio::net::TcpStream::connect(backend).await?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async {
        let mut marks = Marks::default();
        let mut buf = vec![0u8; 256 << 10];
        loop {
            let n = cr.read(&mut buf).await?;
            if n == 0 {
                let _ = sw.shutdown().await;
                return anyhow::Ok(());
            }
            // Checked before nfsserve sees a byte of it.
            marks.check(&buf[..n])?;
            sw.write_all(&buf[..n]).await?;
        }
    };
    let down = async {
        // READ replies are up to 1 MiB: copied in large pieces, not tokio's default 8 KiB.
        let mut sr = tokio::io::BufReader::with_capacity(256 << 10, &mut sr);
        tokio::io::copy_buf(&mut sr, &mut cw).await?;
        let _ = cw.shutdown().await;
        anyhow::Ok(())
    };
    // Whichever ends first (an error, or nfsserve closing) ends both directions; a client
    // that only half-closes still gets the replies to what it sent.
    tokio::pin!(up, down);
    tokio::select! {
        r = &mut up => { r?; down.await }
        r = &mut down => r,
    }
}

/// ONC RPC record marking (RFC 5531 §11) of a client's byte stream, followed as it passes:
/// each fragment starts with a 4-byte mark, the top bit saying it ends its record and the
/// low 31 bits its length. nfsserve allocates whatever a mark claims before the bytes come,
/// so a record longer than [`MAX_RECORD`] ends the connection. Only the marks are read: the
/// calls themselves are nfsserve's.
#[derive(Default)]
struct Marks {
    /// Bytes of the current mark read so far, and how many.
    head: [u8; 4],
    have: usize,
    /// Bytes of the current fragment still to pass.
    left: u64,
    /// Length of the current record so far (its fragments').
    record: u64,
}

impl Marks {
    fn check(&mut self, mut bytes: &[u8]) -> anyhow::Result<()> {
        while !bytes.is_empty() {
            if self.left > 0 {
                let n = self.left.min(bytes.len() as u64);
                self.left -= n;
                bytes = &bytes[n as usize..];
                continue;
            }
            self.head[self.have] = bytes[0];
            self.have += 1;
            bytes = &bytes[1..];
            if self.have == 4 {
                self.have = 0;
                let mark = u32::from_be_bytes(self.head);
                let len = (mark & 0x7fff_ffff) as u64;
                self.record += len;
                if self.record > MAX_RECORD {
                    anyhow::bail!(
                        "an RPC record of {} bytes or more (at most {MAX_RECORD}): disconnected",
                        self.record
                    );
                }
                self.left = len;
                if mark & 0x8000_0000 != 0 {
                    self.record = 0;
                }
            }
        }
        Ok(())
    }
}

/// Releases every handle of the server when dropped (the server's task ends: a signal, or
/// an error).
struct Releaser(Arc<Server>);

impl Drop for Releaser {
    fn drop(&mut self) {
        // Off the runtime's threads: the vfs may block (and PostgreSQL's runs its own).
        let server = self.0.clone();
        let _ = std::thread::spawn(move || server.release_idle(Duration::ZERO)).join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Config as DataConfig, DataStore};
    use crate::meta::{Format, ROOT_INO};
    use crate::object::ObjectStorage;

    /// A server over a scratch volume whose calls act as root (`--anonuid 0 --anongid 0`).
    fn server(root: Option<&[u8]>) -> (tempfile::TempDir, tempfile::TempDir, Exported) {
        let dir = tempfile::tempdir().unwrap();
        let storage = format!("file://{}", dir.path().join("bucket").display());
        let fmt = Format::for_tests("n", &storage, 64 << 10);
        let (mdir, meta) = crate::meta::sqlite::scratch(&fmt);
        let obj = ObjectStorage::open(&fmt.storage, true).unwrap();
        let store = DataStore::new(obj, fmt.clone(), DataConfig::default()).unwrap();
        let cfg = vfs::Config {
            background: false,
            ..Default::default()
        };
        let vfs = Arc::new(Vfs::new(meta, store, cfg));
        let root = match root {
            Some(p) => {
                vfs::paths::mkdir_all(&vfs, &crate::meta::Ctx::ROOT, ROOT_INO, p, 0o755)
                    .unwrap()
                    .ino
            }
            None => ROOT_INO,
        };
        let front = Front {
            vfs,
            root,
            read_only: false,
            name: "n".into(),
        };
        let export = Export {
            anon_uid: 0,
            anon_gid: 0,
            ..Export::local()
        };
        (dir, mdir, Exported(Arc::new(Server::new(&front, export))))
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn writes_read_back_and_listings_resume_after_any_entry() {
        // The crate's READDIRPLUS passes the cookie it gave (an entry's file id) as
        // `start_after`: each page resumes after the last entry of the one before.
        let (_d, _m, fs) = server(None);
        rt().block_on(async {
            let root = fs.root_dir();
            let (f, _) = fs
                .create(root, &b"f".to_vec().into(), sattr3::default())
                .await
                .unwrap();
            let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
            fs.write(f, 0, &data[..200_000]).await.unwrap();
            let a = fs.write(f, 200_000, &data[200_000..]).await.unwrap();
            assert_eq!(a.size, 300_000);
            // One handle for the burst, kept across requests.
            assert_eq!(fs.0.writers.lock().len(), 1);
            let (got, eof) = fs.read(f, 0, 1 << 20).await.unwrap();
            assert!(eof && got == data);
            let (got, eof) = fs.read(f, 100, 10).await.unwrap();
            assert!(!eof && got == data[100..110]);
            // Idle handles go, and what they wrote stays.
            fs.0.release_idle(Duration::ZERO);
            assert!(fs.0.writers.lock().is_empty() && fs.0.readers.lock().is_empty());
            assert!(fs.read(f, 0, 1 << 20).await.unwrap().0 == data);

            for i in 0..30 {
                fs.mkdir(root, &format!("d{i:02}").into_bytes().into())
                    .await
                    .unwrap();
            }
            // Pages of 7, each resuming after the last entry of the one before.
            let mut names = Vec::new();
            let mut after = 0;
            loop {
                let page = fs.readdir(root, after, 7).await.unwrap();
                assert!(page.entries.len() <= 7);
                names.extend(page.entries.iter().map(|e| e.name.0.clone()));
                match page.entries.last() {
                    Some(e) if !page.end => after = e.fileid,
                    _ => break,
                }
            }
            assert_eq!(names.len(), 31, "{names:?}");
            assert!(!names.iter().any(|n| n == b"." || n == b".."));
            // Resuming after an entry this server never listed: looked up.
            fs.0.cursors.lock().clear();
            let d10 = fs.lookup(root, &b"d10".to_vec().into()).await.unwrap();
            let rest = fs.readdir(root, d10, 100).await.unwrap();
            assert!(rest.end);
            let idx = names.iter().position(|n| n == b"d10").unwrap();
            assert_eq!(rest.entries.len(), names.len() - idx - 1);

            assert!(matches!(
                fs.remove(root, &b"d00".to_vec().into()).await,
                Ok(())
            ));
            assert!(matches!(
                fs.lookup(root, &b"d00".to_vec().into()).await,
                Err(nfsstat3::NFS3ERR_NOENT)
            ));
            assert!(matches!(
                fs.create_exclusive(root, &b"f".to_vec().into()).await,
                Err(nfsstat3::NFS3ERR_EXIST)
            ));
            assert!(matches!(
                fs.mkdir(root, &b"..".to_vec().into()).await,
                Err(nfsstat3::NFS3ERR_INVAL)
            ));
        });
    }

    #[test]
    fn setattr_truncates_chmods_and_sets_times_for_its_owner_only() {
        let (_d, _m, fs) = server(None);
        rt().block_on(async {
            let root = fs.root_dir();
            let (f, _) = fs
                .create(root, &b"f".to_vec().into(), sattr3::default())
                .await
                .unwrap();
            fs.write(f, 0, &[1u8; 5000]).await.unwrap();
            let set = sattr3 {
                size: set_size3::size(10),
                mode: set_mode3::mode(0o600),
                mtime: set_mtime::SET_TO_CLIENT_TIME(nfstime3 {
                    seconds: 1_000_000,
                    nseconds: 5,
                }),
                ..sattr3::default()
            };
            let a = fs.setattr(f, set).await.unwrap();
            assert_eq!((a.size, a.mode, a.mtime.seconds), (10, 0o600, 1_000_000));
            assert_eq!(fs.read(f, 0, 100).await.unwrap().0, vec![1u8; 10]);
            // Owned by root, 0600: somebody else may neither chmod nor read it.
            let other = Identity {
                uid: 1000,
                gid: 1000,
            };
            let chmod = sattr3 {
                mode: set_mode3::mode(0o777),
                ..sattr3::default()
            };
            let e = fs.0.apply(&other, f, &chmod).unwrap_err();
            assert_eq!(status(&e) as u32, nfsstat3::NFS3ERR_PERM as u32);
            // (Handles are checked when opened; a server has one identity, so the ones open
            // now were opened as it.)
            fs.0.release_idle(Duration::ZERO);
            assert!(fs.0.reader(&other, f).is_err());
            assert!(fs.0.writer(&other, f).is_err());
        });
    }

    #[test]
    fn a_subdir_export_reaches_nothing_above_it() {
        let (_d, _m, fs) = server(Some(b"a/b"));
        rt().block_on(async {
            let root = fs.root_dir();
            assert_ne!(root, ROOT_INO);
            assert_eq!(fs.lookup(root, &b"..".to_vec().into()).await.unwrap(), root);
            let fh = fs.id_to_fh(ROOT_INO);
            assert!(matches!(fs.fh_to_id(&fh), Err(nfsstat3::NFS3ERR_STALE)));
            assert_eq!(fs.fh_to_id(&fs.id_to_fh(root)).unwrap(), root);
            let (c, _) = fs.mkdir(root, &b"c".to_vec().into()).await.unwrap();
            // Named to a client: reachable; its `..` is the export root again.
            assert_eq!(fs.fh_to_id(&fs.id_to_fh(c)).unwrap(), c);
            assert_eq!(fs.lookup(c, &b"..".to_vec().into()).await.unwrap(), root);
            // Another run's handle is stale.
            let mut old = fs.id_to_fh(c);
            old.data[0] ^= 1;
            assert!(matches!(fs.fh_to_id(&old), Err(nfsstat3::NFS3ERR_STALE)));
            assert!(matches!(
                fs.fh_to_id(&nfs_fh3 {
                    data: vec![1, 2, 3]
                }),
                Err(nfsstat3::NFS3ERR_BADHANDLE)
            ));
        });
    }

    #[test]
    fn record_marks_are_followed_and_long_records_refused() {
        let rec = |last: bool, len: u32| -> Vec<u8> {
            let mut r = ((last as u32) << 31 | len).to_be_bytes().to_vec();
            r.resize(4 + len as usize, 7);
            r
        };
        // Whole records, split anywhere (a byte at a time, marks cut in two).
        let mut stream = rec(true, 100);
        stream.extend(rec(false, 500_000));
        stream.extend(rec(true, 500_000));
        stream.extend(rec(true, MAX_RECORD as u32));
        stream.extend(rec(true, 0));
        let mut m = Marks::default();
        for b in stream.chunks(1) {
            m.check(b).unwrap();
        }
        let mut m = Marks::default();
        for b in stream.chunks(4093) {
            m.check(b).unwrap();
        }
        assert_eq!((m.have, m.left, m.record), (0, 0, 0));
        // One fragment too long, refused at its mark.
        let mut m = Marks::default();
        assert!(
            m.check(&(0x8000_0000u32 | (MAX_RECORD as u32 + 1)).to_be_bytes())
                .is_err()
        );
        // 2 GiB claimed (a last-fragment mark of 0x7fffffff, or 0xffffffff).
        assert!(Marks::default().check(&[0x7f, 0xff, 0xff, 0xff]).is_err());
        assert!(Marks::default().check(&[0xff; 16]).is_err());
        // A record of fragments each small but too long together.
        let mut m = Marks::default();
        let half = (MAX_RECORD / 2 + 1) as u32;
        m.check(&rec(false, half)).unwrap();
        assert!(m.check(&rec(true, half)[..4]).is_err());
    }

    #[test]
    fn errnos_map_to_nfs_errors() {
        for (errno, want) in [
            (libc::ENOENT, nfsstat3::NFS3ERR_NOENT as u32),
            (libc::EACCES, nfsstat3::NFS3ERR_ACCES as u32),
            (libc::EDQUOT, nfsstat3::NFS3ERR_DQUOT as u32),
            (libc::ENOTEMPTY, nfsstat3::NFS3ERR_NOTEMPTY as u32),
            (libc::EIO, nfsstat3::NFS3ERR_IO as u32),
            (libc::EBADMSG, nfsstat3::NFS3ERR_IO as u32),
        ] {
            assert_eq!(
                status(&vfs::Error::Sys(errno)) as u32,
                want,
                "errno {errno}"
            );
        }
    }
}
