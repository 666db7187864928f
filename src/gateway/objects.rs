//! The S3 operations over the vfs: buckets are the top-level directories of the served root,
//! objects its regular files (a key's '/' are directories, made as a put needs them and
//! removed when a delete empties them), multipart uploads are part files under
//! `.unkai-s3/uploads/ID/` at the served root, joined on completion by sharing their blocks
//! (`copy_file_range`), never by copying bytes. An object appears whole or not at all: it is
//! written under `.unkai-s3/tmp/`, made durable (fsync), then renamed into place.
//!
//! ETags: the MD5 of the bytes (of the parts' MD5s, then `-N`, for a multipart upload), kept
//! in the `user.s3.etag` xattr with the mtime and size it belongs to; a file written or
//! changed otherwise (through a mount) gets one derived from its inode, mtime and size.
//! Content-Type and user metadata go with the object the same way (`headers`): set on the
//! temporary file before it is put in place, on an upload's directory until it completes.
//!
//! Not for: HTTP, signatures or XML (s3s), the server and its credentials (`gateway`),
//! streaming bytes (`io`), the key walk (`listing`), error codes (`error`), how the headers
//! are kept (`headers`).

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use md5::{Digest, Md5};
use s3s::dto::*;
use s3s::{S3, S3Error, S3Request, S3Response, S3Result, s3_error};

use super::error::{Missing, s3_error};
use super::headers::{self, Headers};
use super::io::{blocking, read_body, write_body};
use super::listing::{self, Query};
use crate::meta::{Attr, Ctx, Ino, Kind, RenameFlags};
use crate::vfs::export::Export;
use crate::vfs::{self, Vfs, may, paths};

/// The gateway's own directory at the served root: temporary files and multipart uploads.
pub const STATE_DIR: &str = ".unkai-s3";
const ETAG_XATTR: &[u8] = b"user.s3.etag";
/// On an upload's directory: the bucket and key it is for ("bucket/key").
const UPLOAD_XATTR: &[u8] = b"user.s3.upload";
/// S3's smallest part but the last.
const MIN_PART: u64 = 5 << 20;
/// S3's limit of keys per listing page.
const MAX_KEYS: usize = 1000;

/// A file being written under `.unkai-s3/tmp/`, before it is put in place.
struct Tmp {
    dir: Ino,
    name: String,
    fh: u64,
    ino: Ino,
}

/// The S3 service over a served root of the volume.
#[derive(Clone)]
pub struct Gateway(Arc<Inner>);

struct Inner {
    vfs: Arc<Vfs>,
    root: Ino,
    read_only: bool,
    /// Who the gateway acts as on the volume.
    ctx: Ctx,
}

impl Gateway {
    pub fn new(export: &Export, uid: u32, gid: u32) -> Gateway {
        Gateway(Arc::new(Inner {
            vfs: export.vfs().clone(),
            root: export.root(),
            read_only: export.read_only(),
            ctx: Ctx {
                uid,
                gid,
                pid: 0,
                umask: 0o022,
            },
        }))
    }

    /// Runs `f` on the gateway on a blocking thread (vfs calls block).
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> S3Result<T> + Send + 'static,
    ) -> S3Result<T> {
        let me = self.0.clone();
        blocking(move || f(&me)).await?
    }
}

fn ok<T>(output: T) -> S3Result<S3Response<T>> {
    Ok(S3Response::new(output))
}

fn timestamp(nanos: i64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_nanos(nanos.max(0) as u64))
}

fn read_only() -> S3Error {
    s3_error!(AccessDenied, "the volume is served read-only")
}

/// A key's path: its directories and its name. Keys a file system cannot hold as they are
/// (empty, '.' or '..' components, NUL) are refused: nothing outside the bucket can be named.
/// A key ending with '/' (a "folder") has an empty name.
fn key_path(key: &str) -> S3Result<(Vec<&str>, &str)> {
    let bad = || {
        s3_error!(
            InvalidArgument,
            "keys with empty, '.' or '..' path components, or NUL, cannot be stored as files"
        )
    };
    if key.is_empty() || key.contains('\0') {
        return Err(bad());
    }
    let mut parts: Vec<&str> = key.split('/').collect();
    let name = parts.pop().expect("split gives one at least");
    if parts
        .iter()
        .any(|c| c.is_empty() || *c == "." || *c == "..")
        || name == "."
        || name == ".."
        || (name.is_empty() && parts.is_empty())
    {
        return Err(bad());
    }
    Ok((parts, name))
}

/// Whether `name` may be a bucket here: S3's rules are s3s's to check; the served root's
/// hidden entries (the gateway's own directory) never are.
fn bucket_name_ok(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains('/')
}

/// An upload id as this gateway makes them: 32 hex digits (anything else names no upload,
/// and can never be a path).
fn upload_id_ok(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

impl Inner {
    fn vfs(&self) -> &Vfs {
        &self.vfs
    }

    fn writable(&self) -> S3Result<()> {
        if self.read_only {
            return Err(read_only());
        }
        Ok(())
    }

    /// Directory `dir` lets the gateway add or remove entries.
    fn may_change(&self, dir: &Attr) -> vfs::Result<()> {
        if !may(&self.ctx, dir, 3) {
            return Err(vfs::Error::Sys(libc::EACCES));
        }
        Ok(())
    }

    /// The sticky bit of `dir` lets the gateway remove or replace `victim`.
    fn may_remove(&self, dir: &Attr, victim: &Attr) -> vfs::Result<()> {
        self.may_change(dir)?;
        if !vfs::sticky_allows(&self.ctx, dir, victim) {
            return Err(vfs::Error::Sys(libc::EACCES));
        }
        Ok(())
    }

    /// The bucket's directory.
    fn bucket(&self, name: &str) -> S3Result<Attr> {
        if !bucket_name_ok(name) {
            return Err(s3_error!(NoSuchBucket));
        }
        match paths::resolve(self.vfs(), &self.ctx, self.root, name.as_bytes()) {
            Ok(a) if a.kind == Kind::Dir => Ok(a),
            Ok(_) => Err(s3_error!(NoSuchBucket)),
            Err(e) => Err(s3_error(&e, Missing::Bucket)),
        }
    }

    /// The object's file (regular files only), and its bucket.
    fn object(&self, bucket: &str, key: &str) -> S3Result<Attr> {
        let b = self.bucket(bucket)?;
        let (_, name) = key_path(key)?;
        if name.is_empty() {
            return Err(s3_error!(NoSuchKey));
        }
        match paths::resolve(self.vfs(), &self.ctx, b.ino, key.as_bytes()) {
            Ok(a) if a.kind == Kind::File => Ok(a),
            Ok(_) => Err(s3_error!(NoSuchKey)),
            Err(e) => Err(s3_error(&e, Missing::Key)),
        }
    }

    /// The directory of temporary files (made when missing).
    fn tmp_dir(&self) -> S3Result<Attr> {
        let path = format!("{STATE_DIR}/tmp");
        paths::mkdir_all(self.vfs(), &self.ctx, self.root, path.as_bytes(), 0o700)
            .map_err(|e| s3_error(&e, Missing::Key))
    }

    /// A new temporary file, open for writing.
    fn create_tmp(&self) -> S3Result<Tmp> {
        let dir = self.tmp_dir()?;
        let name = random_hex();
        let o = self
            .vfs()
            .create(
                &self.ctx,
                dir.ino,
                name.as_bytes(),
                0o666,
                libc::O_WRONLY | libc::O_EXCL,
            )
            .map_err(|e| s3_error(&e, Missing::Key))?;
        Ok(Tmp {
            dir: dir.ino,
            name,
            fh: o.fh,
            ino: o.attr.ino,
        })
    }

    /// Throws a temporary file away (after a failure); `open`: its handle is still open.
    fn drop_tmp(&self, t: &Tmp, open: bool) {
        if open {
            let _ = self.vfs().release(t.fh);
        }
        let _ = self.vfs().unlink(&self.ctx, t.dir, t.name.as_bytes());
    }

    /// Makes temporary file `t` durable, closes it and records `etag` for it.
    fn seal(&self, t: &Tmp, etag: &str) -> vfs::Result<Attr> {
        let res = self.vfs().fsync(t.fh);
        let closed = self.vfs().release(t.fh);
        res?;
        closed?;
        let a = self.vfs().getattr(t.ino)?;
        self.save_etag(&a, etag)?;
        Ok(a)
    }

    fn save_etag(&self, a: &Attr, etag: &str) -> vfs::Result<()> {
        let value = format!("{etag} {} {}", a.mtime, a.length);
        self.vfs()
            .set_xattr(&self.ctx, a.ino, ETAG_XATTR, value.as_bytes(), 0)
    }

    /// The object's ETag: the one recorded for its current contents, or one derived from
    /// its inode, mtime and size.
    fn etag(&self, a: &Attr) -> String {
        if let Ok(v) = self.vfs().get_xattr(a.ino, ETAG_XATTR) {
            if let Ok(v) = std::str::from_utf8(&v) {
                let mut f = v.split(' ');
                if let (Some(etag), Some(mtime), Some(len)) = (f.next(), f.next(), f.next()) {
                    if mtime == a.mtime.to_string() && len == a.length.to_string() {
                        return etag.to_string();
                    }
                }
            }
        }
        let mut h = Md5::new();
        h.update(format!("{}:{}:{}", a.ino, a.mtime, a.length));
        hex::encode(h.finalize())
    }

    /// Puts temporary file `t` in place as `key` of `bucket`,
    /// making the directories it needs; replaces what was there.
    fn place(&self, t: &Tmp, bucket: &str, key: &str) -> S3Result<()> {
        let b = self.bucket(bucket)?;
        let (dirs, name) = key_path(key)?;
        let dir_path = dirs.join("/");
        let mut tries = 0;
        loop {
            tries += 1;
            let res = (|| -> vfs::Result<()> {
                let dir =
                    paths::mkdir_all(self.vfs(), &self.ctx, b.ino, dir_path.as_bytes(), 0o777)?;
                match self.vfs().lookup(&self.ctx, dir.ino, name.as_bytes()) {
                    Ok(old) if old.kind == Kind::Dir => return Err(vfs::Error::Sys(libc::EISDIR)),
                    Ok(old) => self.may_remove(&dir, &old)?,
                    Err(e) if e.errno() == libc::ENOENT => self.may_change(&dir)?,
                    Err(e) => return Err(e),
                }
                self.vfs().rename(
                    &self.ctx,
                    t.dir,
                    t.name.as_bytes(),
                    dir.ino,
                    name.as_bytes(),
                    RenameFlags::default(),
                )
            })();
            match res {
                Ok(()) => return Ok(()),
                // A delete emptied and removed a directory meanwhile: make it again.
                Err(e) if e.errno() == libc::ENOENT && tries < 4 => continue,
                Err(e) => return Err(s3_error(&e, Missing::Place)),
            }
        }
    }

    /// Removes the now empty directories of `key` in bucket `b`, deepest first.
    fn prune(&self, b: &Attr, dirs: &[&str]) {
        for n in (1..=dirs.len()).rev() {
            let parent = dirs[..n - 1].join("/");
            let Ok(p) = paths::resolve(self.vfs(), &self.ctx, b.ino, parent.as_bytes()) else {
                return;
            };
            if self.may_change(&p).is_err()
                || self
                    .vfs()
                    .rmdir(&self.ctx, p.ino, dirs[n - 1].as_bytes())
                    .is_err()
            {
                return;
            }
        }
    }

    /// Deletes `key` of bucket `b` (S3: a missing key is no error).
    fn delete(&self, b: &Attr, key: &str) -> S3Result<()> {
        let (dirs, name) = key_path(key)?;
        let dir_path = dirs.join("/");
        let dir = match paths::resolve(self.vfs(), &self.ctx, b.ino, dir_path.as_bytes()) {
            Ok(d) if d.kind == Kind::Dir => d,
            Ok(_) => return Ok(()),
            Err(e) if matches!(e.errno(), libc::ENOENT | libc::ENOTDIR) => return Ok(()),
            Err(e) => return Err(s3_error(&e, Missing::Key)),
        };
        let gone = |e: &vfs::Error| matches!(e.errno(), libc::ENOENT);
        if name.is_empty() {
            // A "folder": its directory, if empty.
            let parent_path = dirs[..dirs.len() - 1].join("/");
            let parent = paths::resolve(self.vfs(), &self.ctx, b.ino, parent_path.as_bytes())
                .map_err(|e| s3_error(&e, Missing::Key))?;
            self.may_remove(&parent, &dir)
                .map_err(|e| s3_error(&e, Missing::Key))?;
            match self
                .vfs()
                .rmdir(&self.ctx, parent.ino, dirs[dirs.len() - 1].as_bytes())
            {
                Ok(()) => self.prune(b, &dirs[..dirs.len() - 1]),
                Err(e) if gone(&e) || e.errno() == libc::ENOTEMPTY => {}
                Err(e) => return Err(s3_error(&e, Missing::Key)),
            }
            return Ok(());
        }
        let victim = match self.vfs().lookup(&self.ctx, dir.ino, name.as_bytes()) {
            Ok(a) if a.kind == Kind::File => a,
            Ok(_) => return Ok(()),
            Err(e) if gone(&e) => return Ok(()),
            Err(e) => return Err(s3_error(&e, Missing::Key)),
        };
        self.may_remove(&dir, &victim)
            .map_err(|e| s3_error(&e, Missing::Key))?;
        match self.vfs().unlink(&self.ctx, dir.ino, name.as_bytes()) {
            Ok(()) => self.prune(b, &dirs),
            Err(e) if gone(&e) => {}
            Err(e) => return Err(s3_error(&e, Missing::Key)),
        }
        Ok(())
    }

    /// Copies all of file `src` into open file `fh_out` at `at` by sharing its blocks.
    fn share_into(&self, src: Ino, fh_out: u64, at: u64) -> vfs::Result<u64> {
        let o = self.vfs().open(src, libc::O_RDONLY)?;
        let len = o.attr.length;
        let mut done = 0;
        let res = (|| {
            while done < len {
                let n = self.vfs().copy_file_range(
                    &self.ctx,
                    o.fh,
                    done,
                    fh_out,
                    at + done,
                    len - done,
                )?;
                if n == 0 {
                    return Err(vfs::Error::Sys(libc::EIO));
                }
                done += n;
            }
            Ok(len)
        })();
        let _ = self.vfs().release(o.fh);
        res
    }

    /// An upload's directory, checked to be for `bucket`/`key`.
    fn upload(&self, id: &str, bucket: &str, key: &str) -> S3Result<Attr> {
        if !upload_id_ok(id) {
            return Err(s3_error!(NoSuchUpload));
        }
        let path = format!("{STATE_DIR}/uploads/{id}");
        let dir = paths::resolve(self.vfs(), &self.ctx, self.root, path.as_bytes())
            .map_err(|e| s3_error(&e, Missing::Upload))?;
        let owner = self
            .vfs()
            .get_xattr(dir.ino, UPLOAD_XATTR)
            .unwrap_or_default();
        if dir.kind != Kind::Dir || owner != format!("{bucket}/{key}").as_bytes() {
            return Err(s3_error!(NoSuchUpload));
        }
        Ok(dir)
    }

    /// The parts of an upload: number and attributes, in order.
    fn parts(&self, dir: &Attr) -> S3Result<Vec<(i32, Attr)>> {
        let mut parts = Vec::new();
        let mut cookie = 0;
        loop {
            let page = self
                .vfs()
                .readdir(&self.ctx, dir.ino, cookie, 512, true)
                .map_err(|e| s3_error(&e, Missing::Upload))?;
            let Some(last) = page.last() else { break };
            cookie = last.cookie;
            for e in page {
                let n = std::str::from_utf8(&e.name)
                    .ok()
                    .and_then(|n| n.parse::<i32>().ok());
                if let (Some(n), Some(a)) = (n, e.attr) {
                    if a.kind == Kind::File {
                        parts.push((n, a));
                    }
                }
            }
        }
        parts.sort_by_key(|p| p.0);
        Ok(parts)
    }

    /// Removes an upload's directory and its parts.
    fn remove_upload(&self, dir: &Attr, id: &str) -> S3Result<()> {
        let mut cookie = 0;
        let mut names = Vec::new();
        loop {
            let page = self
                .vfs()
                .readdir(&self.ctx, dir.ino, cookie, 512, false)
                .map_err(|e| s3_error(&e, Missing::Upload))?;
            let Some(last) = page.last() else { break };
            cookie = last.cookie;
            names.extend(
                page.into_iter()
                    .map(|e| e.name)
                    .filter(|n| n != b"." && n != b".."),
            );
        }
        for n in names {
            self.vfs()
                .unlink(&self.ctx, dir.ino, &n)
                .map_err(|e| s3_error(&e, Missing::Upload))?;
        }
        let path = format!("{STATE_DIR}/uploads");
        let uploads = paths::resolve(self.vfs(), &self.ctx, self.root, path.as_bytes())
            .map_err(|e| s3_error(&e, Missing::Upload))?;
        self.vfs()
            .rmdir(&self.ctx, uploads.ino, id.as_bytes())
            .map_err(|e| s3_error(&e, Missing::Upload))
    }
}

/// "bytes first-last/length".
fn content_range(r: &std::ops::Range<u64>, len: u64) -> String {
    format!("bytes {}-{}/{len}", r.start, r.end - 1)
}

fn object_entry(key: String, a: &Attr, etag: String) -> Object {
    Object {
        key: Some(key),
        size: Some(a.length as i64),
        last_modified: Some(timestamp(a.mtime)),
        e_tag: Some(ETag::Strong(etag)),
        storage_class: Some(ObjectStorageClass::from_static(
            ObjectStorageClass::STANDARD,
        )),
        ..Default::default()
    }
}

/// The page of a listing: objects (with their ETags) and common prefixes.
fn list_page(
    inner: &Inner,
    bucket: &str,
    q: &Query,
) -> S3Result<(Vec<Object>, Vec<CommonPrefix>, listing::Page)> {
    let b = inner.bucket(bucket)?;
    let mut page = listing::list(inner.vfs(), &inner.ctx, b.ino, q)
        .map_err(|e| s3_error(&e, Missing::Bucket))?;
    let objects = std::mem::take(&mut page.keys)
        .into_iter()
        .map(|(k, a)| {
            let etag = inner.etag(&a);
            object_entry(k, &a, etag)
        })
        .collect();
    let prefixes = std::mem::take(&mut page.prefixes)
        .into_iter()
        .map(|p| CommonPrefix { prefix: Some(p) })
        .collect();
    Ok((objects, prefixes, page))
}

fn max_keys(m: Option<i32>) -> usize {
    m.map_or(MAX_KEYS, |m| (m.max(0) as usize).min(MAX_KEYS))
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn list_buckets(
        &self,
        _req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let buckets = self
            .run(|g| {
                let root = g
                    .vfs()
                    .getattr(g.root)
                    .map_err(|e| s3_error(&e, Missing::Bucket))?;
                if !may(&g.ctx, &root, 5) {
                    return Err(s3_error!(AccessDenied));
                }
                let mut out = Vec::new();
                let mut cookie = 0;
                loop {
                    let page = g
                        .vfs()
                        .readdir(&g.ctx, g.root, cookie, 512, true)
                        .map_err(|e| s3_error(&e, Missing::Bucket))?;
                    let Some(last) = page.last() else { break };
                    cookie = last.cookie;
                    for e in page {
                        let (Ok(name), Some(a)) = (String::from_utf8(e.name), e.attr) else {
                            continue;
                        };
                        if a.kind == Kind::Dir && bucket_name_ok(&name) {
                            out.push(Bucket {
                                name: Some(name),
                                creation_date: Some(timestamp(a.mtime)),
                                ..Default::default()
                            });
                        }
                    }
                }
                out.sort_by(|a, b| a.name.cmp(&b.name));
                Ok(out)
            })
            .await?;
        ok(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(Owner {
                display_name: Some("unkai".into()),
                id: Some("unkai".into()),
            }),
            ..Default::default()
        })
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let name = req.input.bucket;
        self.run(move |g| {
            g.writable()?;
            if !bucket_name_ok(&name) {
                return Err(s3_error!(InvalidBucketName));
            }
            let root = g
                .vfs()
                .getattr(g.root)
                .map_err(|e| s3_error(&e, Missing::Bucket))?;
            g.may_change(&root)
                .map_err(|e| s3_error(&e, Missing::Bucket))?;
            match g
                .vfs()
                .mknod(&g.ctx, g.root, name.as_bytes(), Kind::Dir, 0o777, 0)
            {
                Ok(_) => Ok(()),
                Err(e) if e.errno() == libc::EEXIST => Err(s3_error!(BucketAlreadyOwnedByYou)),
                Err(e) => Err(s3_error(&e, Missing::Bucket)),
            }
        })
        .await?;
        ok(CreateBucketOutput::default())
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let name = req.input.bucket;
        self.run(move |g| {
            g.writable()?;
            let b = g.bucket(&name)?;
            let root = g
                .vfs()
                .getattr(g.root)
                .map_err(|e| s3_error(&e, Missing::Bucket))?;
            g.may_remove(&root, &b)
                .map_err(|e| s3_error(&e, Missing::Bucket))?;
            g.vfs()
                .rmdir(&g.ctx, g.root, name.as_bytes())
                .map_err(|e| s3_error(&e, Missing::Bucket))
        })
        .await?;
        ok(DeleteBucketOutput::default())
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let name = req.input.bucket;
        self.run(move |g| g.bucket(&name).map(|_| ())).await?;
        ok(HeadBucketOutput::default())
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let name = req.input.bucket;
        self.run(move |g| g.bucket(&name).map(|_| ())).await?;
        ok(GetBucketLocationOutput::default())
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let HeadObjectInput { bucket, key, .. } = req.input;
        let (a, etag, stored) = self
            .run(move |g| {
                let a = g.object(&bucket, &key)?;
                let etag = g.etag(&a);
                let stored =
                    Headers::read(g.vfs(), a.ino).map_err(|e| s3_error(&e, Missing::Key))?;
                Ok((a, etag, stored))
            })
            .await?;
        let mut out = HeadObjectOutput {
            content_length: Some(a.length as i64),
            e_tag: Some(ETag::Strong(etag)),
            last_modified: Some(timestamp(a.mtime)),
            accept_ranges: Some("bytes".into()),
            ..Default::default()
        };
        headers::answer!(out, stored);
        ok(out)
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let GetObjectInput {
            bucket,
            key,
            range,
            response_content_type,
            response_cache_control,
            response_content_disposition,
            response_content_encoding,
            response_content_language,
            response_expires,
            ..
        } = req.input;
        let (a, etag, fh, r, stored) = self
            .run(move |g| {
                let a = g.object(&bucket, &key)?;
                if !may(&g.ctx, &a, 4) {
                    return Err(s3_error!(AccessDenied));
                }
                let o = g
                    .vfs()
                    .open(a.ino, libc::O_RDONLY)
                    .map_err(|e| s3_error(&e, Missing::Key))?;
                let a = o.attr;
                let r = match range {
                    Some(r) => match r.check(a.length) {
                        Ok(r) => Some(r),
                        Err(e) => {
                            let _ = g.vfs().release(o.fh);
                            return Err(e.into());
                        }
                    },
                    None => None,
                };
                let etag = g.etag(&a);
                let stored = match Headers::read(g.vfs(), a.ino) {
                    Ok(h) => h,
                    Err(e) => {
                        let _ = g.vfs().release(o.fh);
                        return Err(s3_error(&e, Missing::Key));
                    }
                };
                Ok((a, etag, o.fh, r, stored))
            })
            .await?;
        let whole = 0..a.length;
        let body = read_body(self.0.vfs.clone(), fh, r.clone().unwrap_or(whole.clone()));
        let span = r.as_ref().unwrap_or(&whole);
        let mut out = GetObjectOutput {
            body: Some(body),
            content_length: Some((span.end - span.start) as i64),
            content_range: r.as_ref().map(|r| content_range(r, a.length)),
            e_tag: Some(ETag::Strong(etag)),
            last_modified: Some(timestamp(a.mtime)),
            accept_ranges: Some("bytes".into()),
            ..Default::default()
        };
        // As S3: response-content-type and the like answer instead of what is stored.
        let shown = stored.overridden(
            response_content_type,
            response_cache_control,
            response_content_disposition,
            response_content_encoding,
            response_content_language,
            response_expires,
        );
        headers::answer!(out, shown);
        ok(out)
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let wanted = headers::requested!(req.input)?;
        let PutObjectInput {
            bucket,
            key,
            body,
            content_length,
            ..
        } = req.input;
        let (_, name) = key_path(&key)?;
        if name.is_empty() {
            // A "folder": its directory.
            if content_length.unwrap_or(0) != 0 {
                return Err(s3_error!(
                    InvalidArgument,
                    "a key ending with '/' names a directory: it holds no bytes"
                ));
            }
            self.run(move |g| {
                g.writable()?;
                let b = g.bucket(&bucket)?;
                paths::mkdir_all(g.vfs(), &g.ctx, b.ino, key.as_bytes(), 0o777)
                    .map_err(|e| s3_error(&e, Missing::Place))?;
                Ok(())
            })
            .await?;
            return ok(PutObjectOutput {
                e_tag: Some(ETag::Strong(hex::encode(Md5::digest(b"")))),
                ..Default::default()
            });
        }
        let etag = self
            .put(&bucket, &key, body, content_length, wanted)
            .await?;
        ok(PutObjectOutput {
            e_tag: Some(ETag::Strong(etag)),
            ..Default::default()
        })
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let DeleteObjectInput { bucket, key, .. } = req.input;
        self.run(move |g| {
            g.writable()?;
            let b = g.bucket(&bucket)?;
            g.delete(&b, &key)
        })
        .await?;
        ok(DeleteObjectOutput::default())
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let DeleteObjectsInput { bucket, delete, .. } = req.input;
        let quiet = delete.quiet.unwrap_or(false);
        let (deleted, errors) = self
            .run(move |g| {
                g.writable()?;
                let b = g.bucket(&bucket)?;
                let (mut deleted, mut errors) = (Vec::new(), Vec::new());
                for o in delete.objects {
                    match g.delete(&b, &o.key) {
                        Ok(()) if quiet => {}
                        Ok(()) => deleted.push(DeletedObject {
                            key: Some(o.key),
                            ..Default::default()
                        }),
                        Err(e) => errors.push(Error {
                            code: Some(e.code().as_str().to_string()),
                            message: e.message().map(str::to_string),
                            key: Some(o.key),
                            version_id: None,
                        }),
                    }
                }
                Ok((deleted, errors))
            })
            .await?;
        ok(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..Default::default()
        })
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        // x-amz-metadata-directive: COPY (the default) keeps the source's headers and
        // metadata; REPLACE takes the request's.
        let replace = match req.input.metadata_directive.as_ref().map(|d| d.as_str()) {
            None | Some(MetadataDirective::COPY) => false,
            Some(MetadataDirective::REPLACE) => true,
            Some(other) => {
                return Err(s3_error!(
                    InvalidArgument,
                    "unknown x-amz-metadata-directive {other}: COPY or REPLACE"
                ));
            }
        };
        let wanted = headers::requested!(req.input)?;
        let CopyObjectInput {
            bucket,
            key,
            copy_source,
            ..
        } = req.input;
        let CopySource::Bucket {
            bucket: src_bucket,
            key: src_key,
            ..
        } = copy_source
        else {
            return Err(s3_error!(NotImplemented, "only bucket/key copy sources"));
        };
        key_path(&key)?;
        if !replace && *src_bucket == *bucket && *src_key == *key {
            return Err(s3_error!(
                InvalidRequest,
                "This copy request is illegal because it is trying to copy an object to itself \
                 without changing the object's metadata, storage class, website redirect \
                 location or encryption attributes."
            ));
        }
        let (etag, a) = self
            .run(move |g| {
                g.writable()?;
                let src = g.object(&src_bucket, &src_key)?;
                if !may(&g.ctx, &src, 4) {
                    return Err(s3_error!(AccessDenied));
                }
                g.bucket(&bucket)?;
                let etag = g.etag(&src);
                let headers = match replace {
                    true => wanted,
                    false => {
                        Headers::read(g.vfs(), src.ino).map_err(|e| s3_error(&e, Missing::Key))?
                    }
                };
                let t = g.create_tmp()?;
                if let Err(e) = g.share_into(src.ino, t.fh, 0) {
                    g.drop_tmp(&t, true);
                    return Err(s3_error(&e, Missing::Key));
                }
                let a = match g
                    .seal(&t, &etag)
                    .and_then(|a| headers.save(g.vfs(), &g.ctx, t.ino).map(|()| a))
                {
                    Ok(a) => a,
                    Err(e) => {
                        g.drop_tmp(&t, false);
                        return Err(s3_error(&e, Missing::Key));
                    }
                };
                if let Err(e) = g.place(&t, &bucket, &key) {
                    g.drop_tmp(&t, false);
                    return Err(e);
                }
                Ok((etag, a))
            })
            .await?;
        ok(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(ETag::Strong(etag)),
                last_modified: Some(timestamp(a.mtime)),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let ListObjectsInput {
            bucket,
            delimiter,
            marker,
            max_keys: max,
            prefix,
            ..
        } = req.input;
        let (b, p, d, m) = (
            bucket.clone(),
            prefix.clone(),
            delimiter.clone(),
            marker.clone(),
        );
        let (contents, prefixes, page) = self
            .run(move |g| {
                let q = Query {
                    prefix: p.as_deref().unwrap_or(""),
                    delimiter: d.as_deref(),
                    after: m.as_deref().unwrap_or(""),
                    max: max_keys(max),
                };
                list_page(g, &b, &q)
            })
            .await?;
        ok(ListObjectsOutput {
            name: Some(bucket),
            prefix: Some(prefix.unwrap_or_default()),
            marker,
            max_keys: Some(max_keys(max) as i32),
            is_truncated: Some(page.truncated),
            next_marker: page.truncated.then_some(page.next).flatten(),
            contents: Some(contents),
            common_prefixes: Some(prefixes),
            delimiter,
            ..Default::default()
        })
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let ListObjectsV2Input {
            bucket,
            continuation_token,
            delimiter,
            max_keys: max,
            prefix,
            start_after,
            ..
        } = req.input;
        let after = continuation_token
            .clone()
            .or_else(|| start_after.clone())
            .unwrap_or_default();
        let (b, p, d) = (bucket.clone(), prefix.clone(), delimiter.clone());
        let (contents, prefixes, page) = self
            .run(move |g| {
                let q = Query {
                    prefix: p.as_deref().unwrap_or(""),
                    delimiter: d.as_deref(),
                    after: &after,
                    max: max_keys(max),
                };
                list_page(g, &b, &q)
            })
            .await?;
        ok(ListObjectsV2Output {
            name: Some(bucket),
            prefix: Some(prefix.unwrap_or_default()),
            max_keys: Some(max_keys(max) as i32),
            key_count: Some((contents.len() + prefixes.len()) as i32),
            continuation_token,
            is_truncated: Some(page.truncated),
            next_continuation_token: page.truncated.then_some(page.next).flatten(),
            contents: Some(contents),
            common_prefixes: Some(prefixes),
            delimiter,
            start_after,
            ..Default::default()
        })
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let wanted = headers::requested!(req.input)?;
        let CreateMultipartUploadInput { bucket, key, .. } = req.input;
        let (_, name) = key_path(&key)?;
        if name.is_empty() {
            return Err(s3_error!(
                InvalidArgument,
                "a key ending with '/' holds no bytes"
            ));
        }
        let (b, k) = (bucket.clone(), key.clone());
        let id = self
            .run(move |g| {
                g.writable()?;
                g.bucket(&b)?;
                let id = random_hex();
                let path = format!("{STATE_DIR}/uploads/{id}");
                let dir = paths::mkdir_all(g.vfs(), &g.ctx, g.root, path.as_bytes(), 0o700)
                    .map_err(|e| s3_error(&e, Missing::Upload))?;
                g.vfs()
                    .set_xattr(
                        &g.ctx,
                        dir.ino,
                        UPLOAD_XATTR,
                        format!("{b}/{k}").as_bytes(),
                        0,
                    )
                    .map_err(|e| s3_error(&e, Missing::Upload))?;
                // Kept with the upload until it completes.
                wanted
                    .save(g.vfs(), &g.ctx, dir.ino)
                    .map_err(|e| s3_error(&e, Missing::Upload))?;
                Ok(id)
            })
            .await?;
        ok(CreateMultipartUploadOutput {
            bucket: Some(bucket),
            key: Some(key),
            upload_id: Some(id),
            ..Default::default()
        })
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let UploadPartInput {
            bucket,
            key,
            upload_id,
            part_number,
            body,
            content_length,
            ..
        } = req.input;
        if !(1..=10000).contains(&part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to 10000"));
        }
        let dir = self
            .run(move |g| {
                g.writable()?;
                g.upload(&upload_id, &bucket, &key)
            })
            .await?;
        let etag = self
            .put_file(body, content_length, move |g, t| {
                let name = format!("{part_number:05}");
                g.vfs()
                    .rename(
                        &g.ctx,
                        t.dir,
                        t.name.as_bytes(),
                        dir.ino,
                        name.as_bytes(),
                        RenameFlags::default(),
                    )
                    .map_err(|e| s3_error(&e, Missing::Upload))
            })
            .await?;
        ok(UploadPartOutput {
            e_tag: Some(ETag::Strong(etag)),
            ..Default::default()
        })
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let ListPartsInput {
            bucket,
            key,
            upload_id,
            ..
        } = req.input;
        let (b, k, id) = (bucket.clone(), key.clone(), upload_id.clone());
        let parts = self
            .run(move |g| {
                let dir = g.upload(&id, &b, &k)?;
                Ok(g.parts(&dir)?
                    .into_iter()
                    .map(|(n, a)| Part {
                        part_number: Some(n),
                        size: Some(a.length as i64),
                        last_modified: Some(timestamp(a.mtime)),
                        e_tag: Some(ETag::Strong(g.etag(&a))),
                        ..Default::default()
                    })
                    .collect::<Vec<_>>())
            })
            .await?;
        ok(ListPartsOutput {
            bucket: Some(bucket),
            key: Some(key),
            upload_id: Some(upload_id),
            parts: Some(parts),
            is_truncated: Some(false),
            ..Default::default()
        })
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let AbortMultipartUploadInput {
            bucket,
            key,
            upload_id,
            ..
        } = req.input;
        self.run(move |g| {
            g.writable()?;
            let dir = g.upload(&upload_id, &bucket, &key)?;
            g.remove_upload(&dir, &upload_id)
        })
        .await?;
        ok(AbortMultipartUploadOutput::default())
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let CompleteMultipartUploadInput {
            bucket,
            key,
            upload_id,
            multipart_upload,
            ..
        } = req.input;
        let wanted: Vec<(i32, Option<String>)> = multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.part_number.unwrap_or(0), p.e_tag.map(ETag::into_value)))
            .collect();
        if wanted.is_empty() {
            return Err(s3_error!(
                MalformedXML,
                "no parts to complete the upload with"
            ));
        }
        if wanted.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(s3_error!(InvalidPartOrder));
        }
        let (b, k) = (bucket.clone(), key.clone());
        let etag = self
            .run(move |g| {
                g.writable()?;
                let dir = g.upload(&upload_id, &b, &k)?;
                let stored =
                    Headers::read(g.vfs(), dir.ino).map_err(|e| s3_error(&e, Missing::Upload))?;
                let have = g.parts(&dir)?;
                let mut chosen = Vec::new();
                let mut md5s = Md5::new();
                for (i, (n, etag)) in wanted.iter().enumerate() {
                    let Some((_, a)) = have.iter().find(|p| p.0 == *n) else {
                        return Err(s3_error!(InvalidPart, "part {n} was not uploaded"));
                    };
                    let stored = g.etag(a);
                    if etag.as_ref().is_some_and(|e| *e != stored) {
                        return Err(s3_error!(InvalidPart, "part {n} has another ETag"));
                    }
                    if i + 1 < wanted.len() && a.length < MIN_PART {
                        return Err(s3_error!(EntityTooSmall, "part {n} is under 5 MiB"));
                    }
                    md5s.update(
                        hex::decode(&stored)
                            .ok()
                            .unwrap_or_else(|| stored.clone().into_bytes()),
                    );
                    chosen.push(a.clone());
                }
                let etag = format!("{}-{}", hex::encode(md5s.finalize()), chosen.len());
                let t = g.create_tmp()?;
                let mut at = 0;
                for a in &chosen {
                    match g.share_into(a.ino, t.fh, at) {
                        Ok(n) => at += n,
                        Err(e) => {
                            g.drop_tmp(&t, true);
                            return Err(s3_error(&e, Missing::Upload));
                        }
                    }
                }
                if let Err(e) = g
                    .seal(&t, &etag)
                    .and_then(|_| stored.save(g.vfs(), &g.ctx, t.ino))
                {
                    g.drop_tmp(&t, false);
                    return Err(s3_error(&e, Missing::Key));
                }
                if let Err(e) = g.place(&t, &b, &k) {
                    g.drop_tmp(&t, false);
                    return Err(e);
                }
                if let Err(e) = g.remove_upload(&dir, &upload_id) {
                    tracing::warn!("gateway: upload {upload_id} completed, its parts stay: {e}");
                }
                Ok(etag)
            })
            .await?;
        ok(CompleteMultipartUploadOutput {
            bucket: Some(bucket),
            key: Some(key),
            e_tag: Some(ETag::Strong(etag)),
            ..Default::default()
        })
    }
}

impl Gateway {
    /// Writes `body` to a new temporary file, makes it durable with its ETag (the MD5 of the
    /// bytes), and hands it to `place`; on any failure, the temporary file goes.
    async fn put_file(
        &self,
        body: Option<StreamingBlob>,
        length: Option<i64>,
        place: impl FnOnce(&Inner, &Tmp) -> S3Result<()> + Send + 'static,
    ) -> S3Result<String> {
        let t = self
            .run(|g| {
                g.writable()?;
                g.create_tmp()
            })
            .await?;
        let written = match body {
            Some(body) => write_body(&self.0.vfs, t.fh, body).await,
            None => Ok((0, Md5::digest(b"").into())),
        };
        let written = written.and_then(|(n, md5)| match length {
            Some(l) if l as u64 != n => Err(s3_error!(
                IncompleteBody,
                "the body had {n} bytes, its Content-Length said {l}"
            )),
            _ => Ok(hex::encode(md5)),
        });
        self.run(move |g| {
            let etag = match written {
                Ok(etag) => etag,
                Err(e) => {
                    g.drop_tmp(&t, true);
                    return Err(e);
                }
            };
            if let Err(e) = g.seal(&t, &etag) {
                g.drop_tmp(&t, false);
                return Err(s3_error(&e, Missing::Key));
            }
            if let Err(e) = place(g, &t) {
                g.drop_tmp(&t, false);
                return Err(e);
            }
            Ok(etag)
        })
        .await
    }

    /// PutObject of a file: written aside, given its `headers`, then put in place as `key`
    /// of `bucket`.
    async fn put(
        &self,
        bucket: &str,
        key: &str,
        body: Option<StreamingBlob>,
        length: Option<i64>,
        headers: Headers,
    ) -> S3Result<String> {
        let (b, k) = (bucket.to_string(), key.to_string());
        // The bucket is checked before the body is read.
        let b2 = b.clone();
        self.run(move |g| g.bucket(&b2).map(|_| ())).await?;
        self.put_file(body, length, move |g, t| {
            headers
                .save(g.vfs(), &g.ctx, t.ino)
                .map_err(|e| s3_error(&e, Missing::Key))?;
            g.place(t, &b, &k)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_cannot_be_paths_are_refused() {
        assert!(key_path("a/b/c.txt").is_ok());
        assert_eq!(key_path("dir/").unwrap(), (vec!["dir"], ""));
        for bad in [
            "",
            "/x",
            "a//b",
            "../x",
            "a/../../b",
            "./a",
            "a/.",
            "a/..",
            "/",
            "a\0b",
        ] {
            assert!(key_path(bad).is_err(), "{bad:?}");
        }
        assert!(!bucket_name_ok(".unkai-s3"));
        assert!(upload_id_ok(&random_hex()));
        assert!(!upload_id_ok("../../etc/passwd0000000000000000000"));
    }
}
