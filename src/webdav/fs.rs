//! The volume as dav-server sees it: its `DavFileSystem` (and `DavFile`, `DavMetaData`,
//! `DavDirEntry`) implemented with `vfs` calls, on paths resolved under the export's root.
//!
//! Every vfs call runs in `spawn_blocking` (the engines block). Writes are gathered into
//! pieces of [`WRITE_PIECE`] bytes before they reach the vfs; nothing holds a whole file.
//! Errors become dav-server's `FsError` (hence HTTP statuses) in one place, [`fs_error`].
//! Mode bits are checked here as the kernel checks them for a FUSE mount
//! (`default_permissions`): the vfs leaves that to its front end.
//!
//! Not for: HTTP, authentication, TLS (`webdav`), path walking (`vfs::paths`).

use std::io::SeekFrom;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes, BytesMut};
use dav_server::davpath::DavPath;
use dav_server::fs::{
    DavDirEntry, DavFile, DavFileSystem, DavMetaData, DavProp, FsError, FsFuture, FsResult,
    FsStream, OpenOptions, ReadDirMeta,
};
use futures::FutureExt;
use http::StatusCode;

use crate::meta::{Attr, Ctx, Ino, Kind, Nanos, RenameFlags, SetAttr, SetTime};
use crate::vfs::export::{Export, Proto};
use crate::vfs::{self, Vfs, paths};

/// Bytes of a PUT gathered before they are handed to the vfs in one write.
pub const WRITE_PIECE: usize = 1 << 20;

/// Entries asked of the vfs per page of a listing.
const PAGE: usize = 256;

/// Dead properties (PROPPATCH) are kept as user xattrs of this prefix: the namespace, a
/// space, the name (`user.dav:DAV: getcontentlanguage`, say); the value is the XML element.
const PROP_PREFIX: &[u8] = b"user.dav:";

/// The errno of a vfs failure as dav-server's error, hence an HTTP status.
pub fn fs_error(e: &vfs::Error) -> FsError {
    match e.errno() {
        libc::ENOENT => FsError::NotFound,
        libc::EACCES | libc::EPERM | libc::EROFS | libc::EISDIR | libc::ENOTDIR => {
            FsError::Forbidden
        }
        libc::EEXIST | libc::ENOTEMPTY => FsError::Exists,
        libc::ENOSPC | libc::EDQUOT | libc::EMLINK => FsError::InsufficientStorage,
        libc::EFBIG => FsError::TooLarge,
        libc::ENAMETOOLONG => FsError::PathTooLong,
        libc::ELOOP => FsError::LoopDetected,
        libc::EXDEV => FsError::IsRemote,
        libc::ENOSYS | libc::EOPNOTSUPP => FsError::NotImplemented,
        _ => {
            tracing::warn!("webdav: {e}");
            FsError::GeneralFailure
        }
    }
}

fn errno(e: i32) -> vfs::Error {
    vfs::Error::Sys(e)
}

/// What the server is on the volume: the export (its root, whether it may change anything,
/// its counters), and who it acts as.
struct Served {
    export: Arc<Export>,
    vfs: Arc<Vfs>,
    root: Ino,
    read_only: bool,
    ctx: Ctx,
}

/// The volume (from the export's root down) as a dav-server file system.
#[derive(Clone)]
pub struct VolumeFs {
    ex: Arc<Served>,
}

impl VolumeFs {
    /// `ctx` is who every request acts as (its uid, gid and umask).
    pub fn new(export: Arc<Export>, ctx: Ctx) -> VolumeFs {
        VolumeFs {
            ex: Arc::new(Served {
                vfs: export.vfs().clone(),
                root: export.root(),
                read_only: export.read_only(),
                export,
                ctx,
            }),
        }
    }

    /// Runs `f` on the export in a blocking thread; its error as an `FsError`.
    async fn blocking<T, F>(&self, f: F) -> FsResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Served) -> vfs::Result<T> + Send + 'static,
    {
        let ex = self.ex.clone();
        run_blocking(move || f(&ex)).await
    }
}

async fn run_blocking<T, F>(f: F) -> FsResult<T>
where
    T: Send + 'static,
    F: FnOnce() -> vfs::Result<T> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| fs_error(&e)),
        Err(e) => {
            tracing::error!("webdav: a volume call failed: {e}");
            Err(FsError::GeneralFailure)
        }
    }
}

/// A path's bytes (decoded, without the server's prefix), owned for a blocking call.
fn bytes_of(p: &DavPath) -> Vec<u8> {
    p.as_bytes().to_vec()
}

/// `path` split into its parent's path and its last name (none for the root).
fn split(path: &[u8]) -> vfs::Result<(&[u8], &[u8])> {
    let trimmed = path.strip_suffix(b"/").unwrap_or(path);
    match trimmed.iter().rposition(|&c| c == b'/') {
        Some(i) if i + 1 < trimmed.len() => Ok((&trimmed[..i], &trimmed[i + 1..])),
        // The root itself: it cannot be created, removed or renamed.
        _ => Err(errno(libc::EPERM)),
    }
}

fn nanos_of(t: SystemTime) -> Nanos {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
    }
}

fn time_of(n: Nanos) -> SystemTime {
    if n >= 0 {
        UNIX_EPOCH + Duration::from_nanos(n as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(n.unsigned_abs())
    }
}

impl Served {
    fn resolve(&self, path: &[u8]) -> vfs::Result<Attr> {
        paths::resolve(&self.vfs, &self.ctx, self.root, path)
    }

    /// Refuses what would change the volume on a read-only export.
    fn writable(&self) -> vfs::Result<()> {
        if self.read_only {
            return Err(errno(libc::EROFS));
        }
        Ok(())
    }

    /// Whether the server's identity may access `a` for `want` (r=4, w=2, x=1).
    fn may(&self, a: &Attr, want: u32) -> vfs::Result<()> {
        if vfs::may(&self.ctx, a, want) {
            Ok(())
        } else {
            Err(errno(libc::EACCES))
        }
    }

    /// The directory `path` would be an entry of, checked for a change of its entries,
    /// and the entry's name.
    fn parent_for_change<'p>(&self, path: &'p [u8]) -> vfs::Result<(Attr, &'p [u8])> {
        self.writable()?;
        let (parent, name) = split(path)?;
        let dir = self.resolve(parent)?;
        if dir.kind != Kind::Dir {
            return Err(errno(libc::ENOTDIR));
        }
        self.may(&dir, 3)?;
        Ok((dir, name))
    }

    /// Removes entry `path` (a directory if `dir`).
    fn remove(&self, path: &[u8], dir: bool) -> vfs::Result<()> {
        let (parent, name) = self.parent_for_change(path)?;
        let a = self.vfs.lookup(&self.ctx, parent.ino, name)?;
        self.sticky(&parent, &a)?;
        match (dir, a.kind == Kind::Dir) {
            (true, true) => self.vfs.rmdir(&self.ctx, parent.ino, name),
            (false, false) => self.vfs.unlink(&self.ctx, parent.ino, name),
            (true, false) => Err(errno(libc::ENOTDIR)),
            (false, true) => Err(errno(libc::EISDIR)),
        }
    }

    /// A sticky directory's entries go (or are replaced) only by their owner or the
    /// directory's, as the kernel enforces it.
    fn sticky(&self, dir: &Attr, a: &Attr) -> vfs::Result<()> {
        if !vfs::sticky_allows(&self.ctx, dir, a) {
            return Err(errno(libc::EPERM));
        }
        Ok(())
    }

    /// Opens (or creates) `path` as `o` says; the handle and the file's attributes.
    fn open(&self, path: &[u8], o: &OpenOptions) -> vfs::Result<(u64, Attr)> {
        let writes = o.write || o.append || o.truncate || o.create || o.create_new;
        if writes {
            self.writable()?;
        }
        let mut flags = match (o.read, writes) {
            (_, false) => libc::O_RDONLY,
            (false, true) => libc::O_WRONLY,
            (true, true) => libc::O_RDWR,
        };
        if o.append {
            flags |= libc::O_APPEND;
        }
        let found = match self.resolve(path) {
            Ok(a) => Some(a),
            Err(e) if e.errno() == libc::ENOENT && (o.create || o.create_new) => None,
            Err(e) => return Err(e),
        };
        let (fh, a) = match found {
            Some(_) if o.create_new => return Err(errno(libc::EEXIST)),
            Some(a) => {
                match a.kind {
                    Kind::File => {}
                    Kind::Dir => return Err(errno(libc::EISDIR)),
                    // Symlinks are not followed (their targets may lie outside the export),
                    // nor are devices, fifos and sockets opened.
                    _ => return Err(errno(libc::EPERM)),
                }
                self.may(&a, if o.read { 4 } else { 0 } | if writes { 2 } else { 0 })?;
                let opened = self.vfs.open(a.ino, flags)?;
                (opened.fh, opened.attr)
            }
            None => {
                let (dir, name) = self.parent_for_change(path)?;
                let ctx = self.ctx;
                let opened = self.vfs.create(
                    &ctx,
                    dir.ino,
                    name,
                    0o666,
                    flags | libc::O_CREAT | libc::O_EXCL,
                )?;
                (opened.fh, opened.attr)
            }
        };
        if o.truncate && a.length > 0 {
            let ctx = self.ctx;
            match self
                .vfs
                .setattr(&ctx, a.ino, &SetAttr::default(), Some(0), false)
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

    /// Copies file `from` to `to` (replaced if it is a file): the copy shares the source's
    /// blocks (`copy_file_range`), and takes its dead properties.
    fn copy(&self, from: &[u8], to: &[u8]) -> vfs::Result<()> {
        let src = self.resolve(from)?;
        if src.kind != Kind::File {
            return Err(errno(libc::EPERM));
        }
        self.may(&src, 4)?;
        let (dir, name) = self.parent_for_change(to)?;
        if let Ok(old) = self.vfs.lookup(&self.ctx, dir.ino, name) {
            if old.ino == src.ino {
                return Ok(());
            }
            if old.kind != Kind::File {
                return Err(errno(libc::EEXIST));
            }
            self.may(&old, 2)?;
        }
        let input = self.vfs.open(src.ino, libc::O_RDONLY)?;
        let out = match self.vfs.create(
            &self.ctx,
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
                    &self.ctx,
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
            for (n, v) in self.dead_props(src.ino)? {
                self.vfs.set_xattr(&self.ctx, out.attr.ino, &n, &v, 0)?;
            }
            self.vfs.flush(out.fh)
        })();
        let released = self.vfs.release(out.fh);
        let _ = self.vfs.release(input.fh);
        copied.and(released)
    }

    fn rename(&self, from: &[u8], to: &[u8]) -> vfs::Result<()> {
        let (sdir, sname) = self.parent_for_change(from)?;
        let a = self.vfs.lookup(&self.ctx, sdir.ino, sname)?;
        self.sticky(&sdir, &a)?;
        let (ddir, dname) = self.parent_for_change(to)?;
        if let Ok(old) = self.vfs.lookup(&self.ctx, ddir.ino, dname) {
            self.sticky(&ddir, &old)?;
        }
        self.vfs.rename(
            &self.ctx,
            sdir.ino,
            sname,
            ddir.ino,
            dname,
            RenameFlags::default(),
        )
    }

    /// The dead properties of `ino`: (xattr name, value) pairs.
    fn dead_props(&self, ino: Ino) -> vfs::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        for n in self.vfs.list_xattr(ino)?.split(|&c| c == 0) {
            if n.starts_with(PROP_PREFIX) {
                match self.vfs.get_xattr(ino, n) {
                    Ok(v) => out.push((n.to_vec(), v)),
                    Err(e) if e.errno() == libc::ENODATA => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(out)
    }
}

/// The xattr that holds dead property `p`.
fn prop_xattr(p: &DavProp) -> Vec<u8> {
    let mut n = PROP_PREFIX.to_vec();
    n.extend_from_slice(p.namespace.as_deref().unwrap_or("").as_bytes());
    n.push(b' ');
    n.extend_from_slice(p.name.as_bytes());
    n
}

/// The dead property an xattr holds (its name, namespace and XML).
fn prop_of(xattr: &[u8], value: Vec<u8>) -> Option<DavProp> {
    let rest = std::str::from_utf8(xattr.strip_prefix(PROP_PREFIX)?).ok()?;
    let (ns, name) = rest.rsplit_once(' ')?;
    Some(DavProp {
        name: name.to_string(),
        prefix: None,
        namespace: (!ns.is_empty()).then(|| ns.to_string()),
        xml: Some(value),
    })
}

/// Attributes as dav-server's metadata.
#[derive(Clone, Debug)]
struct Meta(Attr);

impl DavMetaData for Meta {
    fn len(&self) -> u64 {
        if self.0.kind == Kind::File {
            self.0.length
        } else {
            0
        }
    }
    fn modified(&self) -> FsResult<SystemTime> {
        Ok(time_of(self.0.mtime))
    }
    fn is_dir(&self) -> bool {
        self.0.kind == Kind::Dir
    }
    fn is_symlink(&self) -> bool {
        self.0.kind == Kind::Symlink
    }
    fn accessed(&self) -> FsResult<SystemTime> {
        Ok(time_of(self.0.atime))
    }
    fn status_changed(&self) -> FsResult<SystemTime> {
        Ok(time_of(self.0.ctime))
    }
    fn executable(&self) -> FsResult<bool> {
        Ok(self.0.kind == Kind::File && self.0.mode & 0o100 != 0)
    }
    fn etag(&self) -> Option<String> {
        // The inode too: a file replaced by another of the same size and time differs.
        Some(format!(
            "{:x}-{:x}-{:x}",
            self.0.ino,
            self.len(),
            self.0.mtime.max(0)
        ))
    }
}

struct Entry {
    name: Vec<u8>,
    attr: Attr,
}

impl DavDirEntry for Entry {
    fn name(&self) -> Vec<u8> {
        self.name.clone()
    }
    fn metadata(&self) -> FsFuture<'_, Box<dyn DavMetaData>> {
        let m: Box<dyn DavMetaData> = Box::new(Meta(self.attr.clone()));
        std::future::ready(Ok(m)).boxed()
    }
}

/// An open file: a vfs handle, the position, and writes not yet handed to the vfs.
struct File {
    ex: Arc<Served>,
    fh: u64,
    ino: Ino,
    pos: u64,
    /// Bytes written at `pending_at..` not yet handed to the vfs.
    pending: BytesMut,
    pending_at: u64,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("ino", &self.ino)
            .field("fh", &self.fh)
            .field("pos", &self.pos)
            .finish()
    }
}

/// Hands `data` (written at `at`) to the vfs.
fn write_at(ex: &Served, fh: u64, at: u64, data: &[u8]) -> vfs::Result<()> {
    // A writer other than root drops setuid and setgid, as the kernel says for FUSE.
    let kill = (ex.ctx.uid != 0).then_some(&ex.ctx);
    let mut done = 0;
    while done < data.len() {
        let (n, _) = ex.vfs.write(fh, at + done as u64, &data[done..], kill)?;
        if n == 0 {
            return Err(errno(libc::EIO));
        }
        done += n as usize;
    }
    ex.export.requests().written(Proto::Webdav, data.len());
    Ok(())
}

impl File {
    /// Hands the pending writes to the vfs.
    async fn write_pending(&mut self) -> FsResult<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let data = self.pending.split().freeze();
        let (ex, fh, at) = (self.ex.clone(), self.fh, self.pending_at);
        run_blocking(move || write_at(&ex, fh, at, &data)).await
    }

    async fn add(&mut self, data: &[u8]) -> FsResult<()> {
        if !self.pending.is_empty() && self.pending_at + self.pending.len() as u64 != self.pos {
            self.write_pending().await?;
        }
        if self.pending.is_empty() {
            self.pending_at = self.pos;
        }
        self.pending.extend_from_slice(data);
        self.pos += data.len() as u64;
        if self.pending.len() >= WRITE_PIECE {
            self.write_pending().await?;
        }
        Ok(())
    }
}

impl DavFile for File {
    fn metadata(&mut self) -> FsFuture<'_, Box<dyn DavMetaData>> {
        async move {
            self.write_pending().await?;
            let (ex, ino) = (self.ex.clone(), self.ino);
            let a = run_blocking(move || ex.vfs.getattr(ino)).await?;
            Ok(Box::new(Meta(a)) as Box<dyn DavMetaData>)
        }
        .boxed()
    }

    fn write_buf(&mut self, mut buf: Box<dyn Buf + Send>) -> FsFuture<'_, ()> {
        async move {
            while buf.has_remaining() {
                let chunk = buf.chunk().to_vec();
                buf.advance(chunk.len());
                self.add(&chunk).await?;
            }
            Ok(())
        }
        .boxed()
    }

    fn write_bytes(&mut self, buf: Bytes) -> FsFuture<'_, ()> {
        async move { self.add(&buf).await }.boxed()
    }

    fn read_bytes(&mut self, count: usize) -> FsFuture<'_, Bytes> {
        async move {
            self.write_pending().await?;
            let (ex, fh, pos) = (self.ex.clone(), self.fh, self.pos);
            let size = count.min(u32::MAX as usize) as u32;
            let read = ex.clone();
            let data = run_blocking(move || read.vfs.read(fh, pos, size)).await?;
            ex.export.requests().read(Proto::Webdav, data.len());
            self.pos += data.len() as u64;
            Ok(Bytes::from(data))
        }
        .boxed()
    }

    fn seek(&mut self, pos: SeekFrom) -> FsFuture<'_, u64> {
        async move {
            let to = match pos {
                SeekFrom::Start(n) => Some(n),
                SeekFrom::Current(d) => self.pos.checked_add_signed(d),
                SeekFrom::End(d) => {
                    self.write_pending().await?;
                    let (ex, ino) = (self.ex.clone(), self.ino);
                    let len = run_blocking(move || ex.vfs.getattr(ino)).await?.length;
                    len.checked_add_signed(d)
                }
            };
            self.pos = to.ok_or(FsError::GeneralFailure)?;
            Ok(self.pos)
        }
        .boxed()
    }

    fn flush(&mut self) -> FsFuture<'_, ()> {
        async move {
            self.write_pending().await?;
            let (ex, fh) = (self.ex.clone(), self.fh);
            run_blocking(move || ex.vfs.flush(fh)).await
        }
        .boxed()
    }
}

impl Drop for File {
    /// The handle is released (its writes committed, as at a close) in a blocking thread.
    fn drop(&mut self) {
        let (ex, fh, at) = (self.ex.clone(), self.fh, self.pending_at);
        let data = self.pending.split().freeze();
        let close = move || {
            let res = if data.is_empty() {
                Ok(())
            } else {
                write_at(&ex, fh, at, &data)
            };
            if let Err(e) = res.and(ex.vfs.release(fh)) {
                tracing::warn!("webdav: closing a file: {e}");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(close);
            }
            Err(_) => close(),
        }
    }
}

impl DavFileSystem for VolumeFs {
    fn open<'a>(
        &'a self,
        path: &'a DavPath,
        options: OpenOptions,
    ) -> FsFuture<'a, Box<dyn DavFile>> {
        let p = bytes_of(path);
        async move {
            let ex = self.ex.clone();
            let (fh, a) = self.blocking(move |ex| ex.open(&p, &options)).await?;
            Ok(Box::new(File {
                ex,
                fh,
                ino: a.ino,
                pos: 0,
                pending: BytesMut::new(),
                pending_at: 0,
            }) as Box<dyn DavFile>)
        }
        .boxed()
    }

    fn read_dir<'a>(
        &'a self,
        path: &'a DavPath,
        _meta: ReadDirMeta,
    ) -> FsFuture<'a, FsStream<Box<dyn DavDirEntry>>> {
        let p = bytes_of(path);
        async move {
            let dir = self
                .blocking(move |ex| {
                    let a = ex.resolve(&p)?;
                    if a.kind != Kind::Dir {
                        return Err(errno(libc::ENOTDIR));
                    }
                    ex.may(&a, 5)?;
                    Ok(a.ino)
                })
                .await?;
            // Page by page: a directory of any size is listed in bounded memory.
            let state = (
                self.ex.clone(),
                Some(0u64),
                std::collections::VecDeque::new(),
            );
            let entries =
                futures::stream::unfold(state, move |(ex, mut cookie, mut page)| async move {
                    loop {
                        if let Some(e) = page.pop_front() {
                            return Some((Ok(e), (ex, cookie, page)));
                        }
                        let c = cookie?;
                        let ex2 = ex.clone();
                        let got = run_blocking(move || {
                            let ctx = ex2.ctx;
                            let list = ex2.vfs.readdir(&ctx, dir, c, PAGE, true)?;
                            let next = list.last().map(|e| e.cookie);
                            let mut out = Vec::new();
                            for e in list {
                                if e.name == b"." || e.name == b".." {
                                    continue;
                                }
                                let attr = match e.attr {
                                    Some(a) => a,
                                    None => match ex2.vfs.getattr(e.ino) {
                                        Ok(a) => a,
                                        Err(err) if err.errno() == libc::ENOENT => continue,
                                        Err(err) => return Err(err),
                                    },
                                };
                                out.push(
                                    Box::new(Entry { name: e.name, attr }) as Box<dyn DavDirEntry>
                                );
                            }
                            Ok((next, out))
                        })
                        .await;
                        match got {
                            Ok((next, out)) => {
                                cookie = next;
                                page.extend(out);
                            }
                            Err(e) => return Some((Err(e), (ex, None, page))),
                        }
                    }
                });
            Ok(Box::pin(entries) as FsStream<Box<dyn DavDirEntry>>)
        }
        .boxed()
    }

    fn metadata<'a>(&'a self, path: &'a DavPath) -> FsFuture<'a, Box<dyn DavMetaData>> {
        let p = bytes_of(path);
        async move {
            let a = self.blocking(move |ex| ex.resolve(&p)).await?;
            Ok(Box::new(Meta(a)) as Box<dyn DavMetaData>)
        }
        .boxed()
    }

    fn create_dir<'a>(&'a self, path: &'a DavPath) -> FsFuture<'a, ()> {
        let p = bytes_of(path);
        async move {
            self.blocking(move |ex| {
                let (dir, name) = ex.parent_for_change(&p)?;
                ex.vfs
                    .mknod(&ex.ctx, dir.ino, name, Kind::Dir, 0o777, 0)
                    .map(|_| ())
            })
            .await
        }
        .boxed()
    }

    fn remove_dir<'a>(&'a self, path: &'a DavPath) -> FsFuture<'a, ()> {
        let p = bytes_of(path);
        async move { self.blocking(move |ex| ex.remove(&p, true)).await }.boxed()
    }

    fn remove_file<'a>(&'a self, path: &'a DavPath) -> FsFuture<'a, ()> {
        let p = bytes_of(path);
        async move { self.blocking(move |ex| ex.remove(&p, false)).await }.boxed()
    }

    fn rename<'a>(&'a self, from: &'a DavPath, to: &'a DavPath) -> FsFuture<'a, ()> {
        let (f, t) = (bytes_of(from), bytes_of(to));
        async move { self.blocking(move |ex| ex.rename(&f, &t)).await }.boxed()
    }

    fn copy<'a>(&'a self, from: &'a DavPath, to: &'a DavPath) -> FsFuture<'a, ()> {
        let (f, t) = (bytes_of(from), bytes_of(to));
        async move { self.blocking(move |ex| ex.copy(&f, &t)).await }.boxed()
    }

    fn set_modified<'a>(&'a self, path: &'a DavPath, tm: SystemTime) -> FsFuture<'a, ()> {
        let p = bytes_of(path);
        async move {
            self.blocking(move |ex| {
                ex.writable()?;
                let a = ex.resolve(&p)?;
                if ex.ctx.uid != 0 && ex.ctx.uid != a.uid {
                    return Err(errno(libc::EPERM));
                }
                let set = SetAttr {
                    mtime: Some(SetTime::At(nanos_of(tm))),
                    ..SetAttr::default()
                };
                ex.vfs
                    .setattr(&ex.ctx, a.ino, &set, None, false)
                    .map(|_| ())
            })
            .await
        }
        .boxed()
    }

    fn have_props<'a>(
        &'a self,
        _path: &'a DavPath,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>> {
        std::future::ready(true).boxed()
    }

    fn patch_props<'a>(
        &'a self,
        path: &'a DavPath,
        patch: Vec<(bool, DavProp)>,
    ) -> FsFuture<'a, Vec<(StatusCode, DavProp)>> {
        let p = bytes_of(path);
        async move {
            self.blocking(move |ex| {
                ex.writable()?;
                let a = ex.resolve(&p)?;
                if ex.ctx.uid != 0 && ex.ctx.uid != a.uid {
                    ex.may(&a, 2)?;
                }
                let mut out = Vec::new();
                for (set, prop) in patch {
                    let name = prop_xattr(&prop);
                    let res = if set {
                        let xml = prop.xml.clone().unwrap_or_default();
                        ex.vfs.set_xattr(&ex.ctx, a.ino, &name, &xml, 0)
                    } else {
                        match ex.vfs.remove_xattr(&ex.ctx, a.ino, &name) {
                            Err(e) if e.errno() == libc::ENODATA => Ok(()),
                            r => r,
                        }
                    };
                    let status = match res {
                        Ok(()) => StatusCode::OK,
                        Err(e)
                            if matches!(e.errno(), libc::ENOSPC | libc::E2BIG | libc::ERANGE) =>
                        {
                            StatusCode::INSUFFICIENT_STORAGE
                        }
                        Err(_) => StatusCode::FORBIDDEN,
                    };
                    let prop = DavProp { xml: None, ..prop };
                    out.push((status, prop));
                }
                Ok(out)
            })
            .await
        }
        .boxed()
    }

    fn get_props<'a>(&'a self, path: &'a DavPath, do_content: bool) -> FsFuture<'a, Vec<DavProp>> {
        let p = bytes_of(path);
        async move {
            self.blocking(move |ex| {
                let a = ex.resolve(&p)?;
                Ok(ex
                    .dead_props(a.ino)?
                    .into_iter()
                    .filter_map(|(n, v)| prop_of(&n, v))
                    .map(|mut p| {
                        if !do_content {
                            p.xml = None;
                        }
                        p
                    })
                    .collect())
            })
            .await
        }
        .boxed()
    }

    fn get_prop<'a>(&'a self, path: &'a DavPath, prop: DavProp) -> FsFuture<'a, Vec<u8>> {
        let p = bytes_of(path);
        async move {
            self.blocking(move |ex| {
                let a = ex.resolve(&p)?;
                match ex.vfs.get_xattr(a.ino, &prop_xattr(&prop)) {
                    Err(e) if e.errno() == libc::ENODATA => Err(errno(libc::ENOENT)),
                    r => r,
                }
            })
            .await
        }
        .boxed()
    }

    fn get_quota(&self) -> FsFuture<'_, (u64, Option<u64>)> {
        async move {
            self.blocking(|ex| {
                let s = ex.vfs.statfs_in(ex.root)?;
                Ok((
                    s.total_bytes.saturating_sub(s.free_bytes),
                    Some(s.total_bytes),
                ))
            })
            .await
        }
        .boxed()
    }
}
