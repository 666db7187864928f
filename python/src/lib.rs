//! The native part of the `unkai` Python package (`unkai._unkai`): a volume opened in this
//! process through `vfs`, as a mount or a network server opens it (a client session, the
//! same caches, write-back, locks, quotas, trash and scanning), and the path calls and file
//! handles the package's Python side (`unkai/__init__.py`, `unkai/spec.py`) builds on.
//!
//! Every call acts as the process's effective uid, gid and supplementary groups at the time
//! of the call, under the kernel's permission rules (`vfs::export::rules`), as a FUSE mount's
//! caller would; what it creates takes the umask the process had when the volume opened.
//! Failures are `OSError(errno, strerror, path)`, which Python turns into
//! `FileNotFoundError`, `PermissionError`, ... by the errno. The GIL is released around
//! every call into the volume.
//!
//! Not for: the options' names and defaults (the flags of `unkai webdav`, parsed by
//! `cli::front`), fsspec (Python side), or any kernel crossing.

use std::sync::Arc;

use clap::Parser;
use parking_lot::Mutex;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use unkai::meta::{Attr, Ctx, Ino, Kind, RenameFlags, SetAttr, SetTime};
use unkai::vfs::export::rules::{Change, Identity, Rules};
use unkai::vfs::export::{Caller, Export, Proto};
use unkai::vfs::{self, Vfs};
use unkai::volume::client::Client;

/// Bytes written gathered before they are handed to the vfs in one write.
const WRITE_PIECE: usize = 1 << 20;

/// Entries asked of the vfs per page of a listing.
const PAGE: usize = 1024;

/// The options of `open_volume`, as the flags of the network servers' volume part.
#[derive(Parser)]
#[command(name = "unkai.open_volume", no_binary_name = true)]
struct Opts {
    #[command(flatten)]
    volume: unkai::cli::front::VolumeArgs,
}

fn errno(e: i32) -> vfs::Error {
    vfs::Error::Sys(e)
}

/// A vfs failure on `path` as Python's `OSError(errno, strerror, path)`.
fn os_error(e: &vfs::Error, path: &str) -> PyErr {
    let n = e.errno();
    let words = match e {
        vfs::Error::Sys(_) => nix::errno::Errno::from_raw(n).desc().to_string(),
        other => other.to_string(),
    };
    PyOSError::new_err((n, words, path.to_string()))
}

/// The process's effective identity now.
fn identity() -> Identity {
    Identity {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
        groups: nix::unistd::getgroups()
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default(),
    }
}

/// The process's umask, read without changing it (`/proc/self/status`).
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// The components of `path`: empty ones and `.` dropped.
fn components(path: &str) -> impl Iterator<Item = &[u8]> {
    path.as_bytes()
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
}

/// `path` split into its parent's path and its last name (EPERM for the root itself).
fn split(path: &str) -> vfs::Result<(&str, &[u8])> {
    let trimmed = path.trim_end_matches('/');
    let (parent, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    if name.is_empty() || name == "." || name == ".." {
        return Err(errno(libc::EPERM));
    }
    Ok((parent, name.as_bytes()))
}

/// The opened volume, as every call sees it.
struct Served {
    export: Arc<Export>,
    vfs: Arc<Vfs>,
    root: Ino,
    read_only: bool,
    umask: u32,
}

/// Who a call acts as: the identity, its `Ctx` and the export's `Caller`.
struct Who {
    id: Identity,
    ctx: Ctx,
    caller: Caller,
}

impl Served {
    fn who(&self) -> Who {
        let id = identity();
        let ctx = Ctx {
            uid: id.uid,
            gid: id.gid,
            pid: std::process::id(),
            umask: self.umask,
        };
        Who {
            caller: Caller {
                proto: Proto::Python,
                ctx,
                client: None,
                user: None,
            },
            ctx,
            id,
        }
    }

    fn rules(&self) -> Rules<'_> {
        Rules::new(&self.vfs)
    }

    /// Runs `f` as request `op` on `path`: counted, logged, its failure an `OSError`.
    fn call<T>(&self, op: &str, path: &str, f: impl FnOnce(&Who) -> vfs::Result<T>) -> PyResult<T> {
        let who = self.who();
        let req = self.export.request(&who.caller, op, || path.to_string());
        req.noted(f(&who)).map_err(|e| os_error(&e, path))
    }

    /// The inode `path` names under the root, each directory walked searchable by `who`
    /// (EACCES, ENOTDIR). `..` never climbs above the root; symbolic links are not followed.
    fn resolve(&self, who: &Who, path: &str) -> vfs::Result<Attr> {
        let mut stack = vec![self.vfs.getattr(self.root)?];
        for c in components(path) {
            if c == b".." {
                if stack.len() > 1 {
                    stack.pop();
                }
                continue;
            }
            let dir = stack.last().expect("never empty");
            self.rules().search(&who.id, dir)?;
            let a = self.vfs.lookup(&who.ctx, dir.ino, c)?;
            stack.push(a);
        }
        Ok(stack.pop().expect("never empty"))
    }

    fn writable(&self) -> vfs::Result<()> {
        if self.read_only {
            return Err(errno(libc::EROFS));
        }
        Ok(())
    }

    /// The directory `path` would be an entry of, checked for a change of its entries, and
    /// the entry's name.
    fn parent_for_change<'p>(&self, who: &Who, path: &'p str) -> vfs::Result<(Attr, &'p [u8])> {
        self.writable()?;
        let (parent, name) = split(path)?;
        let dir = self.resolve(who, parent)?;
        self.rules().create(&who.id, &dir)?;
        Ok((dir, name))
    }

    fn mkdir(&self, who: &Who, path: &str, mode: u32) -> vfs::Result<Attr> {
        let (dir, name) = self.parent_for_change(who, path)?;
        self.vfs
            .mknod(&who.ctx, dir.ino, name, Kind::Dir, mode & 0o7777, 0)
    }

    /// `mkdir -p`: every missing directory of `path` made; an existing one is EEXIST
    /// unless `exist_ok`.
    fn makedirs(&self, who: &Who, path: &str, mode: u32, exist_ok: bool) -> vfs::Result<()> {
        let mut dir = self.vfs.getattr(self.root)?;
        let mut made = false;
        for c in components(path) {
            if c == b".." {
                return Err(errno(libc::EINVAL));
            }
            self.rules().search(&who.id, &dir)?;
            dir = match self.vfs.lookup(&who.ctx, dir.ino, c) {
                Ok(a) => {
                    made = false;
                    a
                }
                Err(e) if e.errno() == libc::ENOENT => {
                    self.writable()?;
                    self.rules().create(&who.id, &dir)?;
                    made = true;
                    match self
                        .vfs
                        .mknod(&who.ctx, dir.ino, c, Kind::Dir, mode & 0o7777, 0)
                    {
                        Ok(a) => a,
                        Err(e) if e.errno() == libc::EEXIST => {
                            self.vfs.lookup(&who.ctx, dir.ino, c)?
                        }
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
        }
        if dir.kind != Kind::Dir {
            return Err(errno(libc::ENOTDIR));
        }
        if !made && !exist_ok {
            return Err(errno(libc::EEXIST));
        }
        Ok(())
    }

    /// Removes entry `path`: a directory if `dir`, else anything but one.
    fn remove(&self, who: &Who, path: &str, dir: bool) -> vfs::Result<()> {
        let (parent, name) = self.parent_for_change(who, path)?;
        let a = self.vfs.lookup(&who.ctx, parent.ino, name)?;
        self.rules().remove(&who.id, &parent, &a)?;
        match (dir, a.kind == Kind::Dir) {
            (true, true) => self.vfs.rmdir(&who.ctx, parent.ino, name),
            (false, false) => self.vfs.unlink(&who.ctx, parent.ino, name),
            (true, false) => Err(errno(libc::ENOTDIR)),
            (false, true) => Err(errno(libc::EISDIR)),
        }
    }

    fn rename(&self, who: &Who, from: &str, to: &str) -> vfs::Result<()> {
        let (sdir, sname) = self.parent_for_change(who, from)?;
        let a = self.vfs.lookup(&who.ctx, sdir.ino, sname)?;
        let (ddir, dname) = self.parent_for_change(who, to)?;
        let old = match self.vfs.lookup(&who.ctx, ddir.ino, dname) {
            Ok(old) => Some(old),
            Err(e) if e.errno() == libc::ENOENT => None,
            Err(e) => return Err(e),
        };
        self.rules()
            .rename(&who.id, &sdir, &a, &ddir, old.as_ref())?;
        self.vfs.rename(
            &who.ctx,
            sdir.ino,
            sname,
            ddir.ino,
            dname,
            RenameFlags::default(),
        )
    }

    /// Copies file `from` to `to` (replaced if it is a file): the copy shares the source's
    /// blocks (`copy_file_range`), nothing is read or written through.
    fn copy(&self, who: &Who, from: &str, to: &str) -> vfs::Result<()> {
        let src = self.resolve(who, from)?;
        match src.kind {
            Kind::File => {}
            Kind::Dir => return Err(errno(libc::EISDIR)),
            _ => return Err(errno(libc::EINVAL)),
        }
        self.rules().open(&who.id, &src, 4)?;
        let (dir, name) = self.parent_for_change(who, to)?;
        if let Ok(old) = self.vfs.lookup(&who.ctx, dir.ino, name) {
            if old.ino == src.ino {
                return Ok(());
            }
            if old.kind == Kind::Dir {
                return Err(errno(libc::EISDIR));
            }
            self.rules().open(&who.id, &old, 2)?;
        }
        let input = self.vfs.open(src.ino, libc::O_RDONLY)?;
        let out = match self.vfs.create(
            &who.ctx,
            dir.ino,
            name,
            src.mode & 0o777,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        ) {
            Ok(o) => o,
            Err(e) => {
                let _ = self.vfs.release(input.fh);
                return Err(e);
            }
        };
        let copied = (|| {
            let len = self.vfs.getattr(src.ino)?.length;
            let mut off = 0;
            while off < len {
                let n = self.vfs.copy_file_range(
                    &who.ctx,
                    input.fh,
                    off,
                    out.fh,
                    off,
                    (len - off).min(1 << 30),
                )?;
                if n == 0 {
                    break;
                }
                off += n;
            }
            self.vfs.flush(out.fh)
        })();
        let released = self.vfs.release(out.fh);
        let _ = self.vfs.release(input.fh);
        copied.and(released)
    }

    /// Applies `c` to `path` as the kernel's `setattr` would let `who`.
    fn setattr(&self, who: &Who, path: &str, c: &Change) -> vfs::Result<Attr> {
        self.writable()?;
        let a = self.resolve(who, path)?;
        let set = self.rules().setattr(&who.id, &a, c)?;
        self.vfs.setattr(&who.ctx, a.ino, &set, c.size, false)
    }

    /// Opens `path` as `m` says: the handle and the file's attributes.
    fn open(&self, who: &Who, path: &str, m: &Mode) -> vfs::Result<(u64, Attr)> {
        let writes = m.write || m.append || m.truncate || m.create;
        if writes {
            self.writable()?;
        }
        let mut flags = match (m.read, writes) {
            (_, false) => libc::O_RDONLY,
            (false, true) => libc::O_WRONLY,
            (true, true) => libc::O_RDWR,
        };
        if m.append {
            flags |= libc::O_APPEND;
        }
        let found = match self.resolve(who, path) {
            Ok(a) => Some(a),
            Err(e) if e.errno() == libc::ENOENT && m.create => None,
            Err(e) => return Err(e),
        };
        let (fh, a) = match found {
            Some(_) if m.exclusive => return Err(errno(libc::EEXIST)),
            Some(a) => {
                match a.kind {
                    Kind::File => {}
                    Kind::Dir => return Err(errno(libc::EISDIR)),
                    // Links are not followed, nor devices, fifos and sockets opened.
                    _ => return Err(errno(libc::EINVAL)),
                }
                let want = if m.read { 4 } else { 0 } | if writes { 2 } else { 0 };
                self.rules().open(&who.id, &a, want)?;
                let opened = self.vfs.open(a.ino, flags)?;
                (opened.fh, opened.attr)
            }
            None => {
                let (dir, name) = self.parent_for_change(who, path)?;
                let opened = self.vfs.create(
                    &who.ctx,
                    dir.ino,
                    name,
                    0o666,
                    flags | libc::O_CREAT | libc::O_EXCL,
                )?;
                (opened.fh, opened.attr)
            }
        };
        if m.truncate && a.length > 0 {
            match self
                .vfs
                .setattr(&who.ctx, a.ino, &SetAttr::default(), Some(0), false)
            {
                Ok(a) => return Ok((fh, a)),
                Err(e) => {
                    let _ = self.vfs.release(fh);
                    return Err(e);
                }
            }
        }
        Ok((fh, a))
    }
}

/// How a file is opened (Python's `open` modes: r, w, a, x, each with an optional +).
#[derive(Clone, Copy, Default)]
struct Mode {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    exclusive: bool,
}

impl Mode {
    fn parse(s: &str) -> Option<Mode> {
        let plus = s.contains('+');
        let base: String = s.chars().filter(|c| !"bt+".contains(*c)).collect();
        let mut m = Mode::default();
        match base.as_str() {
            "r" => m.read = true,
            "w" => {
                m.write = true;
                m.truncate = true;
                m.create = true;
            }
            "a" => {
                m.write = true;
                m.append = true;
                m.create = true;
            }
            "x" => {
                m.write = true;
                m.create = true;
                m.exclusive = true;
            }
            _ => return None,
        }
        if plus {
            m.read = true;
            m.write = true;
        }
        Some(m)
    }
}

/// Attributes as the Python side takes them: (kind, mode, uid, gid, nlink, size, atime,
/// mtime, ctime (ns), ino).
type Stat = (&'static str, u32, u32, u32, u32, u64, i64, i64, i64, u64);

fn stat_of(a: &Attr) -> Stat {
    let kind = match a.kind {
        Kind::File => "file",
        Kind::Dir => "directory",
        Kind::Symlink => "link",
        _ => "other",
    };
    let size = if a.kind == Kind::File { a.length } else { 0 };
    (
        kind, a.mode, a.uid, a.gid, a.nlink, size, a.atime, a.mtime, a.ctime, a.ino,
    )
}

/// A volume opened in this process: a client session until [`Volume::close`].
#[pyclass(module = "unkai._unkai", frozen)]
struct Volume {
    s: Arc<Served>,
    client: Mutex<Option<Client>>,
    #[pyo3(get)]
    name: String,
}

#[pymethods]
impl Volume {
    /// The attributes of `path` (symbolic links not followed).
    fn stat(&self, py: Python<'_>, path: &str) -> PyResult<Stat> {
        py.detach(|| {
            self.s
                .call("getattr", path, |w| Ok(stat_of(&self.s.resolve(w, path)?)))
        })
    }

    /// The entries of directory `path` (not `.` and `..`), each with its attributes.
    fn listdir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<(String, Stat)>> {
        py.detach(|| {
            self.s.call("readdir", path, |w| {
                let s = &self.s;
                let dir = s.resolve(w, path)?;
                s.rules().list(&w.id, &dir)?;
                s.rules().search(&w.id, &dir)?;
                let mut out = Vec::new();
                let mut cookie = 0;
                loop {
                    let page = s.vfs.readdir(&w.ctx, dir.ino, cookie, PAGE, true)?;
                    let Some(last) = page.last().map(|e| e.cookie) else {
                        break;
                    };
                    cookie = last;
                    for e in page {
                        if e.name == b"." || e.name == b".." {
                            continue;
                        }
                        let a = match e.attr {
                            Some(a) => a,
                            None => match s.vfs.getattr(e.ino) {
                                Ok(a) => a,
                                Err(err) if err.errno() == libc::ENOENT => continue,
                                Err(err) => return Err(err),
                            },
                        };
                        out.push((String::from_utf8_lossy(&e.name).into_owned(), stat_of(&a)));
                    }
                }
                Ok(out)
            })
        })
    }

    #[pyo3(signature = (path, mode = 0o777))]
    fn mkdir(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        py.detach(|| {
            self.s
                .call("mkdir", path, |w| self.s.mkdir(w, path, mode).map(|_| ()))
        })
    }

    #[pyo3(signature = (path, mode = 0o777, exist_ok = false))]
    fn makedirs(&self, py: Python<'_>, path: &str, mode: u32, exist_ok: bool) -> PyResult<()> {
        py.detach(|| {
            self.s
                .call("mkdir", path, |w| self.s.makedirs(w, path, mode, exist_ok))
        })
    }

    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        py.detach(|| self.s.call("rmdir", path, |w| self.s.remove(w, path, true)))
    }

    fn unlink(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        py.detach(|| {
            self.s
                .call("unlink", path, |w| self.s.remove(w, path, false))
        })
    }

    /// Renames `src` to `dst`, replacing a file there (POSIX `rename`).
    fn rename(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        py.detach(|| self.s.call("rename", src, |w| self.s.rename(w, src, dst)))
    }

    /// Copies file `src` to `dst` without reading it: the copy shares its blocks.
    fn copy(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        py.detach(|| {
            self.s
                .call("copy_file_range", src, |w| self.s.copy(w, src, dst))
        })
    }

    fn truncate(&self, py: Python<'_>, path: &str, size: u64) -> PyResult<()> {
        let c = Change {
            size: Some(size),
            ..Change::default()
        };
        py.detach(|| {
            self.s
                .call("setattr", path, |w| self.s.setattr(w, path, &c).map(|_| ()))
        })
    }

    fn chmod(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        let c = Change {
            mode: Some(mode),
            ..Change::default()
        };
        py.detach(|| {
            self.s
                .call("setattr", path, |w| self.s.setattr(w, path, &c).map(|_| ()))
        })
    }

    /// Sets the access and modification times (ns since the epoch; None: now).
    #[pyo3(signature = (path, atime_ns = None, mtime_ns = None))]
    fn utime(
        &self,
        py: Python<'_>,
        path: &str,
        atime_ns: Option<i64>,
        mtime_ns: Option<i64>,
    ) -> PyResult<()> {
        let t = |n: Option<i64>| Some(n.map_or(SetTime::Now, SetTime::At));
        let c = Change {
            atime: t(atime_ns),
            mtime: t(mtime_ns),
            ..Change::default()
        };
        py.detach(|| {
            self.s
                .call("setattr", path, |w| self.s.setattr(w, path, &c).map(|_| ()))
        })
    }

    /// Opens file `path` with Python's `mode` (r, w, a, x, with + and b).
    #[pyo3(signature = (path, mode = "rb"))]
    fn open(&self, py: Python<'_>, path: &str, mode: &str) -> PyResult<File> {
        let Some(m) = Mode::parse(mode) else {
            return Err(PyValueError::new_err(format!(
                "invalid mode '{mode}': give r, w, a or x, optionally with + and b"
            )));
        };
        let (fh, a) = py.detach(|| self.s.call("open", path, |w| self.s.open(w, path, &m)))?;
        Ok(File {
            s: self.s.clone(),
            path: path.to_string(),
            readable: m.read,
            writable: m.write || m.append,
            st: Mutex::new(FileState {
                fh: Some(fh),
                ino: a.ino,
                pos: if m.append { a.length } else { 0 },
                pending: Vec::new(),
                pending_at: 0,
            }),
        })
    }

    /// Flushes everything written and closes the session (the volume is unusable after).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let client = self.client.lock().take();
        match client {
            Some(c) => py
                .detach(|| c.close(None))
                .map_err(|e| PyOSError::new_err(format!("closing the volume: {e:#}"))),
            None => Ok(()),
        }
    }

    /// Whether the volume is still open.
    #[getter]
    fn is_open(&self) -> bool {
        self.client.lock().is_some()
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if let Some(c) = self.client.lock().take() {
            if let Err(e) = c.close(None) {
                tracing::error!("closing the volume {}: {e:#}", self.name);
            }
        }
    }
}

/// The mutable part of an open file.
struct FileState {
    /// None once closed.
    fh: Option<u64>,
    ino: Ino,
    pos: u64,
    /// Bytes written at `pending_at..` not yet handed to the vfs.
    pending: Vec<u8>,
    pending_at: u64,
}

/// An open file of a volume.
#[pyclass(module = "unkai._unkai", frozen)]
struct File {
    s: Arc<Served>,
    #[pyo3(get)]
    path: String,
    #[pyo3(get)]
    readable: bool,
    #[pyo3(get)]
    writable: bool,
    st: Mutex<FileState>,
}

impl File {
    fn fh(&self, st: &FileState) -> PyResult<u64> {
        st.fh
            .ok_or_else(|| PyValueError::new_err("I/O operation on closed file"))
    }

    /// Hands the pending writes to the vfs.
    fn write_pending(&self, st: &mut FileState) -> PyResult<()> {
        if st.pending.is_empty() {
            return Ok(());
        }
        let fh = self.fh(st)?;
        let data = std::mem::take(&mut st.pending);
        let at = st.pending_at;
        self.s.call("write", &self.path, |w| {
            // A writer other than root drops setuid and setgid, as the kernel says.
            let kill = (w.ctx.uid != 0).then_some(&w.ctx);
            let mut done = 0;
            while done < data.len() {
                let (n, _) = self
                    .s
                    .vfs
                    .write(fh, at + done as u64, &data[done..], kill)?;
                if n == 0 {
                    return Err(errno(libc::EIO));
                }
                done += n as usize;
            }
            self.s.export.requests().written(Proto::Python, data.len());
            Ok(())
        })
    }

    fn length(&self, st: &FileState) -> PyResult<u64> {
        let ino = st.ino;
        let end = st.pending_at + st.pending.len() as u64;
        let len = self
            .s
            .vfs
            .getattr(ino)
            .map_err(|e| os_error(&e, &self.path))?
            .length;
        Ok(if st.pending.is_empty() {
            len
        } else {
            len.max(end)
        })
    }
}

#[pymethods]
impl File {
    /// Reads `size` bytes from the position (all to the end if negative); fewer only at
    /// the end of the file.
    #[pyo3(signature = (size = -1))]
    fn read<'py>(&self, py: Python<'py>, size: i64) -> PyResult<Bound<'py, PyBytes>> {
        if !self.readable {
            return Err(PyOSError::new_err((
                libc::EBADF,
                "File not open for reading",
            )));
        }
        let data = py.detach(|| -> PyResult<Vec<u8>> {
            let mut st = self.st.lock();
            let fh = self.fh(&st)?;
            self.write_pending(&mut st)?;
            let want = if size < 0 {
                self.length(&st)?.saturating_sub(st.pos)
            } else {
                size as u64
            };
            let pos = st.pos;
            let data = self.s.call("read", &self.path, |_| {
                let mut out: Vec<u8> = Vec::new();
                while (out.len() as u64) < want {
                    let ask = (want - out.len() as u64).min(u32::MAX as u64 / 2) as u32;
                    let got = self.s.vfs.read(fh, pos + out.len() as u64, ask)?;
                    if got.is_empty() {
                        break;
                    }
                    if out.is_empty() {
                        out = got;
                    } else {
                        out.extend_from_slice(&got);
                    }
                }
                self.s.export.requests().read(Proto::Python, out.len());
                Ok(out)
            })?;
            st.pos += data.len() as u64;
            Ok(data)
        })?;
        Ok(PyBytes::new(py, &data))
    }

    /// Writes `data` (any bytes-like object) at the position; returns its length.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        if !self.writable {
            return Err(PyOSError::new_err((
                libc::EBADF,
                "File not open for writing",
            )));
        }
        let buf = PyBuffer::<u8>::get(data)?;
        let bytes = buf.to_vec(py)?;
        let n = bytes.len();
        py.detach(|| -> PyResult<()> {
            let mut st = self.st.lock();
            self.fh(&st)?;
            if !st.pending.is_empty() && st.pending_at + st.pending.len() as u64 != st.pos {
                self.write_pending(&mut st)?;
            }
            if st.pending.is_empty() {
                st.pending_at = st.pos;
            }
            st.pending.extend_from_slice(&bytes);
            st.pos += n as u64;
            if st.pending.len() >= WRITE_PIECE {
                self.write_pending(&mut st)?;
            }
            Ok(())
        })?;
        Ok(n)
    }

    /// Moves the position as `os.lseek` does (whence 0, 1 or 2); returns it.
    #[pyo3(signature = (offset, whence = 0))]
    fn seek(&self, py: Python<'_>, offset: i64, whence: i32) -> PyResult<u64> {
        py.detach(|| {
            let mut st = self.st.lock();
            self.fh(&st)?;
            let base = match whence {
                0 => 0,
                1 => st.pos,
                2 => self.length(&st)?,
                _ => return Err(PyValueError::new_err(format!("invalid whence ({whence})"))),
            };
            let to = base
                .checked_add_signed(offset)
                .ok_or_else(|| PyOSError::new_err((libc::EINVAL, "Invalid argument")))?;
            st.pos = to;
            Ok(to)
        })
    }

    fn tell(&self) -> PyResult<u64> {
        let st = self.st.lock();
        self.fh(&st)?;
        Ok(st.pos)
    }

    /// The file's length now (what this handle wrote included).
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| {
            let st = self.st.lock();
            self.fh(&st)?;
            self.length(&st)
        })
    }

    /// Commits what is written, so that the next open (here or on another client) sees it.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let mut st = self.st.lock();
            let Some(fh) = st.fh else {
                return Ok(());
            };
            self.write_pending(&mut st)?;
            self.s.call("flush", &self.path, |_| self.s.vfs.flush(fh))
        })
    }

    /// Makes what is written durable (`fsync`).
    fn fsync(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let mut st = self.st.lock();
            let fh = self.fh(&st)?;
            self.write_pending(&mut st)?;
            self.s.call("fsync", &self.path, |_| self.s.vfs.fsync(fh))
        })
    }

    /// Cuts or extends the file to `size` (the position if None); returns the size.
    #[pyo3(signature = (size = None))]
    fn truncate(&self, py: Python<'_>, size: Option<u64>) -> PyResult<u64> {
        if !self.writable {
            return Err(PyOSError::new_err((
                libc::EBADF,
                "File not open for writing",
            )));
        }
        py.detach(|| {
            let mut st = self.st.lock();
            self.fh(&st)?;
            self.write_pending(&mut st)?;
            let size = size.unwrap_or(st.pos);
            let ino = st.ino;
            self.s.call("setattr", &self.path, |w| {
                self.s
                    .vfs
                    .setattr(&w.ctx, ino, &SetAttr::default(), Some(size), false)
            })?;
            Ok(size)
        })
    }

    /// Writes what is pending and releases the handle (its writes committed, as a close);
    /// a failure to store them is raised here. Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let mut st = self.st.lock();
            let Some(fh) = st.fh else {
                return Ok(());
            };
            let wrote = self.write_pending(&mut st);
            // As close(2) on a mount: FLUSH (for a handle that may have written), RELEASE.
            let flushed = if self.writable {
                self.s.call("flush", &self.path, |_| self.s.vfs.flush(fh))
            } else {
                Ok(())
            };
            st.fh = None;
            let released = self
                .s
                .call("release", &self.path, |_| self.s.vfs.release(fh));
            wrote.and(flushed).and(released)
        })
    }

    #[getter]
    fn closed(&self) -> bool {
        self.st.lock().fh.is_none()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let st = self.st.get_mut();
        if let Some(fh) = st.fh.take() {
            let data = std::mem::take(&mut st.pending);
            if !data.is_empty() {
                if let Err(e) = self.s.vfs.write(fh, st.pending_at, &data, None) {
                    tracing::error!("{}: writes lost at close: {e}", self.path);
                }
            }
            if let Err(e) = self.s.vfs.release(fh) {
                tracing::error!("{}: closing: {e}", self.path);
            }
        }
    }
}

/// Opens a volume: `args` are `unkai webdav`'s arguments without the listener's (a
/// META-URL, then flags such as `--cache-dir DIR`). The client is opened in a thread of its
/// own: it blocks SIGINT, SIGTERM and SIGHUP in the thread that opens it and those it
/// starts, which must not be Python's.
#[pyfunction]
fn open(py: Python<'_>, args: Vec<String>) -> PyResult<Volume> {
    let opts = match Opts::try_parse_from(&args) {
        Ok(o) => o,
        Err(e) => {
            let first = e.to_string();
            let first = first
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            return Err(PyValueError::new_err(format!(
                "{first}: options are the flags of `unkai webdav --help` (its volume part), \
                 '-' written '_': e.g. cache_dir='/var/cache/unkai', read_only=True"
            )));
        }
    };
    let umask = umask();
    let opened = py.detach(move || {
        std::thread::Builder::new()
            .name("unkai-python-open".into())
            .spawn(move || -> anyhow::Result<Client> {
                let (meta, cfg) = unkai::cli::front::prepare(&opts.volume, "python")?;
                unkai::volume::front::client(
                    meta,
                    &cfg,
                    format!("(python, pid {})", std::process::id()),
                )
            })
            .map_err(anyhow::Error::from)
            .and_then(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("opening the volume panicked")))
            })
    });
    let client = opened.map_err(|e| PyOSError::new_err(format!("{e:#}")))?;
    let export = client.export().clone();
    Ok(Volume {
        name: export.name().to_string(),
        s: Arc::new(Served {
            vfs: export.vfs().clone(),
            root: export.root(),
            read_only: export.read_only(),
            export,
            umask,
        }),
        client: Mutex::new(Some(client)),
    })
}

/// Logs go to standard error, as `UNKAI_LOG` says (default: warnings).
fn init_logging() {
    let filter = std::env::var("UNKAI_LOG").unwrap_or_else(|_| "warn".into());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[pymodule]
fn _unkai(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    m.add_class::<Volume>()?;
    m.add_class::<File>()?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    Ok(())
}
