//! The NFS server's file system: every call it makes into the `vfs` is made here, as the
//! identity the call acts as, with the checks the kernel makes for a local caller before the
//! same operation (mode bits and ACLs through `export::Identity`, the sticky bit, setattr's
//! ownership rules), since the vfs checks no permissions itself.
//!
//! NFSv3 has no open or close: a file's vfs handle is opened at its first READ or WRITE and
//! kept in a small table across requests, then released once idle ([`IDLE`]), so the vfs
//! sees one open-write-close per burst of writes (the write-back hook and the antivirus scan
//! run at that close). A cached handle is shared by every caller: each READ and WRITE checks
//! its own caller's permission (the owner may always read and write what it owns, as knfsd
//! allows, since a client checked the open itself: a file created 0444 is still written).
//! An UNSTABLE WRITE is buffered as a write(2) is; COMMIT and FILE_SYNC make it durable
//! (`vfs::fsync`), and so does the release of an idle handle.
//!
//! Not for: the protocol (`proto`, `rpc`), handles (`handle`), export options (`export`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::export::Identity;
use crate::meta::acl::{self, Acl};
use crate::meta::{Attr, DirEntry, Ino, Kind, MAX_NAME_LEN, RenameFlags, SetAttr, SetTime};
use crate::vfs::{self, StatFs, Vfs};

/// How long a file's handle stays open after its last READ or WRITE.
pub const IDLE: Duration = Duration::from_millis(1500);

pub type Result<T> = vfs::Result<T>;

fn err<T>(errno: i32) -> Result<T> {
    Err(vfs::Error::Sys(errno))
}

/// What a SETATTR (or a create's attributes) asks to change.
#[derive(Clone, Debug, Default)]
pub struct Change {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

impl Change {
    fn is_empty(&self) -> bool {
        self.mode.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.size.is_none()
            && self.atime.is_none()
            && self.mtime.is_none()
    }
}

/// An open vfs handle of a file, shared by the requests that use it.
struct Open {
    fh: u64,
}

/// A table entry: the handle and when a request last used it.
struct Slot {
    open: Arc<Open>,
    used: Instant,
}

/// The volume (or the `--subdir` of it) as the NFS server sees it.
pub struct Fs {
    vfs: Arc<Vfs>,
    /// The export's root: `..` never leads above it.
    pub root: Ino,
    /// Handles open for writing, and for reading, by inode.
    writers: Mutex<HashMap<Ino, Slot>>,
    readers: Mutex<HashMap<Ino, Slot>>,
}

impl Fs {
    pub fn new(vfs: Arc<Vfs>, root: Ino) -> Fs {
        Fs {
            vfs,
            root,
            writers: Mutex::new(HashMap::new()),
            readers: Mutex::new(HashMap::new()),
        }
    }

    /// The volume's uuid (file handles are keyed by it).
    pub fn volume_uuid(&self) -> String {
        self.vfs.meta().format().uuid.clone()
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.vfs.getattr(ino)
    }

    /// The access ACL of `a`, if it has one (looked up only for callers it can concern).
    fn acl(&self, who: &Identity, a: &Attr) -> Option<Acl> {
        if who.uid == 0 || who.uid == a.uid {
            return None;
        }
        self.vfs
            .get_xattr(a.ino, acl::ACCESS)
            .ok()
            .and_then(|x| Acl::parse(&x))
    }

    /// Whether `who` may access `a` for `want` (r=4, w=2, x=1).
    pub fn may(&self, who: &Identity, a: &Attr, want: u32) -> bool {
        who.may(a, want, self.acl(who, a).as_ref())
    }

    /// The attributes of directory `dir` if `who` may search it.
    fn searchable(&self, who: &Identity, dir: Ino) -> Result<Attr> {
        let d = self.vfs.getattr(dir)?;
        if d.kind != Kind::Dir {
            return err(libc::ENOTDIR);
        }
        if !self.may(who, &d, 1) {
            return err(libc::EACCES);
        }
        Ok(d)
    }

    /// The attributes of directory `dir` if `who` may add or remove entries in it.
    fn changeable(&self, who: &Identity, dir: Ino) -> Result<Attr> {
        let d = self.searchable(who, dir)?;
        if !self.may(who, &d, 2) {
            return err(libc::EACCES);
        }
        Ok(d)
    }

    pub fn lookup(&self, who: &Identity, dir: Ino, name: &[u8]) -> Result<Attr> {
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
    fn plain(name: &[u8]) -> Result<&[u8]> {
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return err(libc::EINVAL);
        }
        if name.len() > MAX_NAME_LEN {
            return err(libc::ENAMETOOLONG);
        }
        Ok(name)
    }

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.vfs.readlink(ino)
    }

    /// The regular file `ino`'s attributes if `who` may read (4) or write (2) its data: by
    /// its permissions, or as its owner.
    fn data_access(&self, who: &Identity, ino: Ino, want: u32) -> Result<Attr> {
        let a = self.vfs.getattr(ino)?;
        match a.kind {
            Kind::File => {}
            Kind::Dir => return err(libc::EISDIR),
            _ => return err(libc::EINVAL),
        }
        if who.uid != a.uid && !self.may(who, &a, want) {
            return err(libc::EACCES);
        }
        Ok(a)
    }

    /// Reads up to `count` bytes at `off` as `who`: the bytes, whether they reach the end of
    /// the file, and its attributes after.
    pub fn read(
        &self,
        who: &Identity,
        ino: Ino,
        off: u64,
        count: u32,
    ) -> Result<(Vec<u8>, bool, Attr)> {
        self.data_access(who, ino, 4)?;
        let open = self.reader(ino)?;
        let data = self.vfs.read(open.fh, off, count)?;
        let a = self.vfs.getattr(ino)?;
        let eof = (data.len() as u32) < count || off + data.len() as u64 >= a.length;
        Ok((data, eof, a))
    }

    /// Writes `data` at `off` as `who`; made durable before returning if `sync` (FILE_SYNC
    /// or DATA_SYNC), else buffered until a COMMIT. Returns the attributes before and after.
    pub fn write(
        &self,
        who: &Identity,
        ino: Ino,
        off: u64,
        data: &[u8],
        sync: bool,
    ) -> Result<(Attr, Attr)> {
        let before = self.data_access(who, ino, 2)?;
        let open = self.writer(ino)?;
        let ctx = who.ctx_for(&before);
        let unprivileged = (who.uid != 0).then_some(&ctx);
        self.vfs.write(open.fh, off, data, unprivileged)?;
        if sync {
            self.vfs.fsync(open.fh)?;
        }
        Ok((before, self.vfs.getattr(ino)?))
    }

    /// COMMIT: what was written to `ino` is made durable.
    pub fn commit(&self, ino: Ino) -> Result<Attr> {
        let a = self.vfs.getattr(ino)?;
        if a.kind != Kind::File {
            return err(libc::EINVAL);
        }
        // Whatever handle syncs the file syncs all that was written to it: the writer's if
        // one is open, else a handle for reading (nothing to open for writing).
        let open = self.reader(ino)?;
        self.vfs.fsync(open.fh)?;
        self.vfs.getattr(ino)
    }

    /// The handle of `ino` open for writing (opened now if none is).
    fn writer(&self, ino: Ino) -> Result<Arc<Open>> {
        if let Some(s) = self.writers.lock().get_mut(&ino) {
            s.used = Instant::now();
            return Ok(s.open.clone());
        }
        let o = self.vfs.open(ino, libc::O_RDWR)?;
        Ok(self.keep(&self.writers, ino, o.fh))
    }

    /// The handle of `ino` open for reading (a writer's, if there is one).
    fn reader(&self, ino: Ino) -> Result<Arc<Open>> {
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
        let o = self.vfs.open(ino, libc::O_RDONLY)?;
        Ok(self.keep(&self.readers, ino, o.fh))
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

    /// How many handles are open (writers, readers).
    pub fn open_handles(&self) -> (usize, usize) {
        (self.writers.lock().len(), self.readers.lock().len())
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

    /// Applies `c` to `ino` as `who`, with the checks the kernel makes before a setattr;
    /// `guard`: the ctime the client expects the inode to have (NFS3ERR_NOT_SYNC if not).
    pub fn setattr(
        &self,
        who: &Identity,
        ino: Ino,
        c: &Change,
        guard: Option<i64>,
    ) -> Result<(Attr, Attr)> {
        let a = self.vfs.getattr(ino)?;
        if let Some(ctime) = guard {
            if ctime != a.ctime {
                return Err(vfs::Error::Sys(NOT_SYNC));
            }
        }
        let after = self.apply(who, &a, c)?;
        Ok((a, after))
    }

    fn apply(&self, who: &Identity, a: &Attr, c: &Change) -> Result<Attr> {
        let mut set = SetAttr::default();
        if let Some(m) = c.mode {
            if !who.owns(a) {
                return err(libc::EPERM);
            }
            let mut m = m & 0o7777;
            // As chmod(2): setgid goes when the owner is not in the file's group.
            if who.uid != 0 && a.kind != Kind::Dir && !who.in_group(a.gid) {
                m &= !libc::S_ISGID;
            }
            set.mode = Some(m);
        }
        if let Some(u) = c.uid {
            if u != a.uid && who.uid != 0 {
                return err(libc::EPERM);
            }
            set.uid = Some(u);
        }
        if let Some(g) = c.gid {
            if g != a.gid && who.uid != 0 && !(who.uid == a.uid && who.in_group(g)) {
                return err(libc::EPERM);
            }
            set.gid = Some(g);
        }
        let time = |t: Option<SetTime>| -> Result<Option<SetTime>> {
            match t {
                Some(SetTime::At(_)) if !who.owns(a) => err(libc::EPERM),
                Some(SetTime::Now) if !who.owns(a) && !self.may(who, a, 2) => err(libc::EACCES),
                t => Ok(t),
            }
        };
        set.atime = time(c.atime)?;
        set.mtime = time(c.mtime)?;
        if let Some(_n) = c.size {
            if a.kind == Kind::Dir {
                return err(libc::EISDIR);
            }
            if who.uid != a.uid && !self.may(who, a, 2) {
                return err(libc::EACCES);
            }
        }
        self.vfs
            .setattr(&who.ctx_for(a), a.ino, &set, c.size, false)
    }

    /// Creates the regular file `name` in `dir` as `who` with `mode`. `exclusive`: fail if
    /// it exists (GUARDED); otherwise an existing file is opened (UNCHECKED), truncated if
    /// `c` asks for size 0. The rest of `c` is applied after. Returns the file's attributes.
    pub fn create(
        &self,
        who: &Identity,
        dir: Ino,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        c: &Change,
    ) -> Result<Attr> {
        let name = Self::plain(name)?;
        self.changeable(who, dir)?;
        if !exclusive {
            // An existing file is opened as open(2) would: with the access asked.
            match self.vfs.lookup(&who.ctx(), dir, name) {
                Ok(a) if a.kind != Kind::File => return err(libc::EEXIST),
                Ok(a) => {
                    if who.uid != a.uid && !self.may(who, &a, 2) {
                        return err(libc::EACCES);
                    }
                    // As knfsd: of the attributes asked, only a truncation applies to a
                    // file that was there.
                    return match c.size {
                        Some(n) => {
                            let trunc = Change {
                                size: Some(n),
                                ..Change::default()
                            };
                            self.apply(who, &a, &trunc)
                        }
                        None => Ok(a),
                    };
                }
                Err(e) if e.errno() == libc::ENOENT => {}
                Err(e) => return Err(e),
            }
        }
        let o = self.vfs.create(
            &who.ctx(),
            dir,
            name,
            mode & 0o7777,
            libc::O_RDWR | libc::O_EXCL,
        )?;
        let ino = o.attr.ino;
        // Kept for the WRITEs that follow.
        self.keep(&self.writers, ino, o.fh);
        let rest = Change {
            size: c.size.filter(|&n| n != 0),
            mode: None,
            ..c.clone()
        };
        if rest.is_empty() {
            Ok(o.attr)
        } else {
            self.apply(who, &o.attr, &rest)
        }
    }

    /// An EXCLUSIVE create: the client's verifier is kept in the new file's access and
    /// modification times (as knfsd keeps it), so a retransmitted CREATE of the same file
    /// succeeds, and any other finds it existing.
    pub fn create_exclusive(
        &self,
        who: &Identity,
        dir: Ino,
        name: &[u8],
        verf: [u8; 8],
    ) -> Result<Attr> {
        let name = Self::plain(name)?;
        self.changeable(who, dir)?;
        let stamp = i64::from(u32::from_be_bytes(verf[..4].try_into().expect("4"))) * 1_000_000_000
            + i64::from(u32::from_be_bytes(verf[4..].try_into().expect("4")) % 1_000_000_000);
        match self.vfs.lookup(&who.ctx(), dir, name) {
            Ok(a) if a.kind == Kind::File && a.mtime == stamp && a.atime == stamp => {
                return Ok(a);
            }
            Ok(_) => return err(libc::EEXIST),
            Err(e) if e.errno() == libc::ENOENT => {}
            Err(e) => return Err(e),
        }
        let o = self
            .vfs
            .create(&who.ctx(), dir, name, 0o600, libc::O_RDWR | libc::O_EXCL)?;
        self.keep(&self.writers, o.attr.ino, o.fh);
        let set = SetAttr {
            atime: Some(SetTime::At(stamp)),
            mtime: Some(SetTime::At(stamp)),
            ..SetAttr::default()
        };
        self.vfs.setattr(&who.ctx(), o.attr.ino, &set, None, false)
    }

    #[allow(clippy::too_many_arguments)]
    /// Makes a directory, a symbolic link (`target`) or a special file in `dir` as `who`,
    /// then applies the rest of `c` (mode excepted: it is given at creation).
    pub fn make(
        &self,
        who: &Identity,
        dir: Ino,
        name: &[u8],
        kind: Kind,
        mode: u32,
        rdev: u32,
        target: Option<&[u8]>,
        c: &Change,
    ) -> Result<Attr> {
        let name = Self::plain(name)?;
        self.changeable(who, dir)?;
        if !who.may_mknod(kind) {
            return err(libc::EPERM);
        }
        let a = match target {
            Some(t) => self.vfs.symlink(&who.ctx(), dir, name, t)?,
            None => self
                .vfs
                .mknod(&who.ctx(), dir, name, kind, mode & 0o7777, rdev)?,
        };
        let rest = Change {
            mode: None,
            size: None,
            ..c.clone()
        };
        if rest.is_empty() {
            Ok(a)
        } else {
            self.apply(who, &a, &rest)
        }
    }

    /// Removes `name` from `dir` as `who`: a file (REMOVE) or an empty directory (RMDIR).
    pub fn remove(&self, who: &Identity, dir: Ino, name: &[u8], rmdir: bool) -> Result<()> {
        let name = Self::plain(name)?;
        let d = self.changeable(who, dir)?;
        let victim = self.vfs.lookup(&who.ctx(), dir, name)?;
        if !who.may_delete(&d, &victim) {
            return err(libc::EACCES);
        }
        match (rmdir, victim.kind == Kind::Dir) {
            (true, true) => self.vfs.rmdir(&who.ctx(), dir, name),
            (true, false) => err(libc::ENOTDIR),
            (false, true) => err(libc::EISDIR),
            (false, false) => self.vfs.unlink(&who.ctx(), dir, name),
        }
    }

    pub fn rename(
        &self,
        who: &Identity,
        from: Ino,
        name: &[u8],
        to: Ino,
        new_name: &[u8],
    ) -> Result<()> {
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
        if victim.kind == Kind::Dir && from != to && !self.may(who, &victim, 2) {
            return err(libc::EACCES);
        }
        self.vfs
            .rename(&who.ctx(), from, name, to, new_name, RenameFlags::default())
    }

    /// A hard link `name` in `dir` to `ino`, as `who`.
    pub fn link(&self, who: &Identity, ino: Ino, dir: Ino, name: &[u8]) -> Result<Attr> {
        let name = Self::plain(name)?;
        self.changeable(who, dir)?;
        let a = self.vfs.getattr(ino)?;
        if a.kind == Kind::Dir {
            return err(libc::EISDIR);
        }
        self.vfs.link(&who.ctx(), ino, dir, name)
    }

    /// Up to `max` entries of `dir` after the vfs cookie `cookie` (0: from the start), `.`
    /// and `..` left out, each with its attributes; and whether the listing is done. The
    /// vfs's cookies name positions that stay valid while entries come and go, and across
    /// restarts: they are the NFS cookies.
    pub fn list(
        &self,
        who: &Identity,
        dir: Ino,
        cookie: u64,
        max: usize,
    ) -> Result<(Vec<(DirEntry, Attr)>, bool)> {
        let d = self.vfs.getattr(dir)?;
        if d.kind != Kind::Dir {
            return err(libc::ENOTDIR);
        }
        if !self.may(who, &d, 4) {
            return err(libc::EACCES);
        }
        let ctx = who.ctx();
        let mut cookie = cookie.max(2);
        let mut out = Vec::new();
        let max = max.max(1);
        loop {
            let page = self.vfs.readdir(&ctx, dir, cookie, max + 1, true)?;
            let Some(last) = page.last().map(|e| e.cookie) else {
                return Ok((out, true));
            };
            for e in page {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                if out.len() == max {
                    return Ok((out, false));
                }
                let a = match &e.attr {
                    Some(a) => a.clone(),
                    None => match self.vfs.getattr(e.ino) {
                        Ok(a) => a,
                        Err(_) => continue, // gone meanwhile
                    },
                };
                out.push((e, a));
            }
            cookie = last;
        }
    }

    pub fn statfs(&self) -> Result<StatFs> {
        self.vfs.statfs_in(self.root)
    }
}

/// The errno standing for NFS3ERR_NOT_SYNC (a SETATTR guard that did not match): none of
/// the vfs's own.
pub const NOT_SYNC: i32 = -10002;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Config as DataConfig, DataStore};
    use crate::meta::{Format, ROOT_INO};
    use crate::object::ObjectStorage;

    /// An `Fs` over a scratch volume (its root, or `root` made under it).
    fn scratch(root: Option<&[u8]>) -> (tempfile::TempDir, tempfile::TempDir, Fs) {
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
        (dir, mdir, Fs::new(vfs, root))
    }

    fn id(uid: u32, gid: u32, groups: &[u32]) -> Identity {
        Identity {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn unstable_writes_read_back_and_listings_resume_at_any_cookie() {
        let (_d, _m, fs) = scratch(None);
        let root = id(0, 0, &[]);
        let f = fs
            .create(&root, ROOT_INO, b"f", 0o644, false, &Change::default())
            .unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        fs.write(&root, f.ino, 0, &data[..200_000], false).unwrap();
        let (_, a) = fs
            .write(&root, f.ino, 200_000, &data[200_000..], false)
            .unwrap();
        assert_eq!(a.length, 300_000);
        // One handle for the burst, kept across requests.
        assert_eq!(fs.open_handles(), (1, 0));
        let (got, eof, _) = fs.read(&root, f.ino, 0, 1 << 20).unwrap();
        assert!(eof && got == data);
        let (got, eof, _) = fs.read(&root, f.ino, 100, 10).unwrap();
        assert!(!eof && got == data[100..110]);
        fs.commit(f.ino).unwrap();
        // Idle handles go, and what they wrote stays.
        fs.release_idle(Duration::ZERO);
        assert_eq!(fs.open_handles(), (0, 0));
        assert!(fs.read(&root, f.ino, 0, 1 << 20).unwrap().0 == data);

        for i in 0..30 {
            let name = format!("d{i:02}");
            fs.make(
                &root,
                ROOT_INO,
                name.as_bytes(),
                Kind::Dir,
                0o755,
                0,
                None,
                &Change::default(),
            )
            .unwrap();
        }
        // Pages of 7, each resuming at the cookie of the last entry of the one before.
        let mut names = Vec::new();
        let mut cookies = Vec::new();
        let mut cookie = 0;
        loop {
            let (page, end) = fs.list(&root, ROOT_INO, cookie, 7).unwrap();
            assert!(page.len() <= 7);
            names.extend(page.iter().map(|(e, _)| e.name.clone()));
            cookies.extend(page.iter().map(|(e, _)| e.cookie));
            match page.last() {
                Some((e, _)) if !end => cookie = e.cookie,
                _ => break,
            }
        }
        assert_eq!(names.len(), 31, "{names:?}");
        assert!(!names.iter().any(|n| n == b"." || n == b".."));
        // Resuming at any entry's cookie gives what follows it.
        let at = names.iter().position(|n| n == b"d10").unwrap();
        let (rest, end) = fs.list(&root, ROOT_INO, cookies[at], 100).unwrap();
        assert!(end);
        assert_eq!(rest.len(), names.len() - at - 1);

        fs.remove(&root, ROOT_INO, b"d00", true).unwrap();
        assert_eq!(
            fs.lookup(&root, ROOT_INO, b"d00").unwrap_err().errno(),
            libc::ENOENT
        );
        assert_eq!(
            fs.remove(&root, ROOT_INO, b"f", true).unwrap_err().errno(),
            libc::ENOTDIR
        );
        assert_eq!(
            fs.create(&root, ROOT_INO, b"f", 0o644, true, &Change::default())
                .unwrap_err()
                .errno(),
            libc::EEXIST
        );
        // UNCHECKED of a file that is there: opened, its mode left, a truncation applied.
        let again = Change {
            mode: Some(0o600),
            size: Some(0),
            ..Change::default()
        };
        let a = fs
            .create(&root, ROOT_INO, b"f", 0o600, false, &again)
            .unwrap();
        assert_eq!((a.ino, a.mode, a.length), (f.ino, 0o644, 0));
        let dotdot = fs.make(
            &root,
            ROOT_INO,
            b"..",
            Kind::Dir,
            0o755,
            0,
            None,
            &Change::default(),
        );
        assert_eq!(dotdot.unwrap_err().errno(), libc::EINVAL);
    }

    #[test]
    fn permissions_are_each_callers_own() {
        let (_d, _m, fs) = scratch(None);
        let root = id(0, 0, &[]);
        let open = Change {
            mode: Some(0o777),
            ..Change::default()
        };
        let dir = fs
            .make(&root, ROOT_INO, b"open", Kind::Dir, 0o777, 0, None, &open)
            .unwrap();
        let alice = id(1000, 1000, &[]);
        let f = fs
            .create(&alice, dir.ino, b"f", 0o600, false, &Change::default())
            .unwrap();
        assert_eq!((f.uid, f.gid, f.mode), (1000, 1000, 0o600));
        fs.write(&alice, f.ino, 0, b"hello", true).unwrap();
        // A handle opened for alice serves only alice.
        let bob = id(1001, 1001, &[]);
        assert_eq!(
            fs.read(&bob, f.ino, 0, 10).unwrap_err().errno(),
            libc::EACCES
        );
        assert_eq!(
            fs.write(&bob, f.ino, 0, b"x", false).unwrap_err().errno(),
            libc::EACCES
        );
        // Somebody else may not chmod; the owner may, and may write a 0400 file it owns.
        let chmod = Change {
            mode: Some(0o400),
            ..Change::default()
        };
        assert_eq!(
            fs.setattr(&bob, f.ino, &chmod, None).unwrap_err().errno(),
            libc::EPERM
        );
        fs.setattr(&alice, f.ino, &chmod, None).unwrap();
        fs.write(&alice, f.ino, 5, b"!", false).unwrap();
        // A SETATTR guard that does not match is refused.
        let a = fs.getattr(f.ino).unwrap();
        let e = fs.setattr(&alice, f.ino, &chmod, Some(a.ctime + 1));
        assert_eq!(e.unwrap_err().errno(), NOT_SYNC);
        // Sticky directory: bob may not remove alice's file.
        let sticky = Change {
            mode: Some(0o1777),
            ..Change::default()
        };
        fs.setattr(&root, dir.ino, &sticky, None).unwrap();
        assert_eq!(
            fs.remove(&bob, dir.ino, b"f", false).unwrap_err().errno(),
            libc::EACCES
        );
        // An ACL naming bob lets him read.
        let acl = Acl::parse(
            &[
                2u32.to_le_bytes().to_vec(),
                [1u16, 6, 0, 0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                [2u16, 4].iter().flat_map(|v| v.to_le_bytes()).collect(),
                1001u32.to_le_bytes().to_vec(),
                [4u16, 0, 0, 0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                [0x10u16, 4, 0, 0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                [0x20u16, 0, 0, 0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ]
            .concat(),
        )
        .expect("a valid ACL");
        fs.vfs
            .set_xattr(
                &crate::meta::Ctx::ROOT,
                f.ino,
                acl::ACCESS,
                &acl.to_xattr(),
                0,
            )
            .unwrap();
        assert_eq!(fs.read(&bob, f.ino, 0, 10).unwrap().0, b"hello!");
        let carol = id(1002, 1002, &[]);
        assert_eq!(
            fs.read(&carol, f.ino, 0, 10).unwrap_err().errno(),
            libc::EACCES
        );
    }

    #[test]
    fn a_subdir_export_reaches_nothing_above_it() {
        let (_d, _m, fs) = scratch(Some(b"a/b"));
        let root = id(0, 0, &[]);
        assert_ne!(fs.root, ROOT_INO);
        assert_eq!(fs.lookup(&root, fs.root, b"..").unwrap().ino, fs.root);
        let c = fs
            .make(
                &root,
                fs.root,
                b"c",
                Kind::Dir,
                0o755,
                0,
                None,
                &Change::default(),
            )
            .unwrap();
        assert_eq!(fs.lookup(&root, c.ino, b"..").unwrap().ino, fs.root);
    }
}
