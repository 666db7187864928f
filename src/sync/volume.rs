//! A volume as an endpoint of `unkai sync` (META-URL[:/path]): its tree listed, read and
//! written through the `vfs` of a client opened in this process, without a mount, so that
//! quotas, the trash, scanning and the session list apply as for any other client.
//!
//! Not for: opening the volume (the caller hands over an opened [`Client`]: the flags and
//! the data side's settings are `cli`'s), comparing or copying (`sync`), or a path inside a
//! mount (that is a local directory, read and written through the kernel).

use std::sync::Arc;

use anyhow::Context;

use super::{EKind, Entry, Listed, PARTIAL, is_partial};
use crate::meta::{Ctx, Ino, Kind, ROOT_INO, RenameFlags, SetAttr, SetTime};
use crate::vfs::{self, Vfs, paths};
use crate::volume::client::Client;

/// Bytes asked of the vfs per read.
const READ: u32 = 1 << 20;

/// An opened volume, rooted at the directory the endpoint names.
pub struct Vol {
    client: parking_lot::Mutex<Option<Client>>,
    vfs: Arc<Vfs>,
    root: Ino,
    ctx: Ctx,
}

/// Splits `META-URL[:/path]` into the URL and the path in the volume ("/" when none).
pub fn split(given: &str) -> (&str, &str) {
    let scheme_end = given.find("://").map_or(0, |i| i + 3);
    match given[scheme_end..].rfind(":/") {
        Some(i) => (&given[..scheme_end + i], &given[scheme_end + i + 1..]),
        None => (given, "/"),
    }
}

/// A vfs error as a line.
fn err(e: vfs::Error) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

impl Vol {
    /// The directory `path` of the volume `client` serves: it must exist for a source; a
    /// destination's is made when missing (not in a dry run). `..` is refused: the path
    /// stays inside the volume.
    pub fn open(
        client: Client,
        path: &str,
        given: &str,
        is_src: bool,
        dry_run: bool,
    ) -> anyhow::Result<Vol> {
        let role = if is_src { "source" } else { "destination" };
        let vfs = client.export().vfs().clone();
        let ctx = Ctx {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            pid: std::process::id(),
            umask: 0o022,
        };
        let close = |e: anyhow::Error, client: Client| {
            let _ = client.close(None);
            Err(e)
        };
        if path.split('/').any(|c| c == "..") {
            return close(
                anyhow::anyhow!(
                    "{role} '{given}': the path leaves the volume ('..'); give a path from the \
                     volume's root, e.g. META-URL:/data"
                ),
                client,
            );
        }
        let found = paths::resolve(&vfs, &ctx, ROOT_INO, path.as_bytes());
        let root = match found {
            Ok(a) if a.kind == Kind::Dir => a.ino,
            Ok(_) => {
                return close(
                    anyhow::anyhow!(
                        "{role} '{given}': {path} is not a directory in the volume; give a \
                         directory (its contents are synced)"
                    ),
                    client,
                );
            }
            Err(e) if e.errno() == libc::ENOENT && !is_src => {
                if dry_run {
                    0
                } else {
                    match paths::mkdir_all(&vfs, &ctx, ROOT_INO, path.as_bytes(), 0o777) {
                        Ok(a) => a.ino,
                        Err(e) => {
                            return close(
                                anyhow::anyhow!(
                                    "{role} '{given}': cannot make {path} in the volume: {e}; \
                                     give a directory you may write"
                                ),
                                client,
                            );
                        }
                    }
                }
            }
            Err(e) => {
                return close(
                    anyhow::anyhow!(
                        "{role} '{given}': {path} in the volume: {e}; give an existing \
                         directory of the volume (META-URL:/path)"
                    ),
                    client,
                );
            }
        };
        Ok(Vol {
            client: parking_lot::Mutex::new(Some(client)),
            vfs,
            root,
            ctx,
        })
    }

    /// Flushes what was written and closes the session.
    pub fn close(&self) -> anyhow::Result<()> {
        match self.client.lock().take() {
            Some(c) => c.close(None),
            None => Ok(()),
        }
    }

    /// Whether the directory exists (a dry run's destination may not).
    pub fn exists(&self) -> bool {
        self.root != 0
    }

    /// The entries of one directory (`prefix` is its key and a '/', or empty at the root):
    /// files, and with `dirs`/`links` directories and symbolic links; subdirectories to
    /// walk next. A destination's partial files left by a killed run are removed.
    pub fn list_dir(
        &self,
        dir: Ino,
        prefix: &str,
        dirs: bool,
        links: bool,
        remove_partial: bool,
    ) -> anyhow::Result<Listed<Ino>> {
        let fh = self.vfs.opendir(dir, libc::O_RDONLY).map_err(err)?;
        let mut out = Vec::new();
        let mut subs = Vec::new();
        let mut cookie = 0;
        let res = (|| -> anyhow::Result<()> {
            loop {
                let page = self
                    .vfs
                    .readdir(&self.ctx, dir, cookie, 1000, true)
                    .map_err(err)?;
                let Some(last) = page.last() else {
                    return Ok(());
                };
                cookie = last.cookie;
                for e in page {
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    if dir == ROOT_INO && e.name == crate::meta::trash::TRASH_NAME {
                        continue;
                    }
                    let Ok(name) = std::str::from_utf8(&e.name) else {
                        tracing::warn!("{prefix}{:?}: not UTF-8, skipped", e.name);
                        continue;
                    };
                    let key = format!("{prefix}{name}");
                    let a = match e.attr {
                        Some(a) => a,
                        None => self.vfs.getattr(e.ino).map_err(err)?,
                    };
                    let entry = |kind| Entry {
                        key: key.clone(),
                        size: a.length,
                        modified: a.mtime,
                        mode: a.mode & 0o7777,
                        kind,
                    };
                    match a.kind {
                        Kind::Dir => {
                            if dirs {
                                out.push(entry(EKind::Dir));
                            }
                            subs.push((a.ino, format!("{key}/")));
                        }
                        Kind::File if is_partial(&key) => {
                            self.drop_partial(remove_partial, dir, &e.name)
                        }
                        Kind::File => out.push(entry(EKind::File)),
                        Kind::Symlink if links => {
                            let t = self.vfs.readlink(a.ino).map_err(err)?;
                            out.push(Entry {
                                size: t.len() as u64,
                                ..entry(EKind::Link(t))
                            });
                        }
                        _ => {}
                    }
                }
            }
        })();
        let _ = self.vfs.releasedir(fh);
        res.map(|()| (out, subs))
    }

    /// Removes a partial file left by a killed run (a destination's, when `remove`).
    fn drop_partial(&self, remove: bool, dir: Ino, name: &[u8]) {
        if remove {
            let _ = self.vfs.unlink(&self.ctx, dir, name);
        }
    }

    pub fn root(&self) -> Ino {
        self.root
    }

    /// The directory holding `key` and its last name; the directories made when `make`.
    fn parent(&self, key: &str, make: bool) -> vfs::Result<(Ino, String)> {
        let (dir, name) = key.rsplit_once('/').unwrap_or(("", key));
        let a = if make {
            paths::mkdir_all(&self.vfs, &self.ctx, self.root, dir.as_bytes(), 0o777)?
        } else {
            paths::resolve(&self.vfs, &self.ctx, self.root, dir.as_bytes())?
        };
        Ok((a.ino, name.to_string()))
    }

    pub fn open_read(&self, key: &str) -> anyhow::Result<u64> {
        let a = paths::resolve(&self.vfs, &self.ctx, self.root, key.as_bytes()).map_err(err)?;
        Ok(self.vfs.open(a.ino, libc::O_RDONLY).map_err(err)?.fh)
    }

    /// Up to `len` bytes at `off` (fewer only at the end of the file).
    pub fn read(&self, fh: u64, off: u64, len: usize) -> anyhow::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let want = (len - out.len()).min(READ as usize) as u32;
            let b = self
                .vfs
                .read(fh, off + out.len() as u64, want)
                .map_err(err)?;
            if b.is_empty() {
                break;
            }
            out.extend_from_slice(&b);
        }
        Ok(out)
    }

    pub fn release(&self, fh: u64) {
        let _ = self.vfs.release(fh);
    }

    /// A new temporary file beside `key`, open for writing: (directory, name, handle).
    pub fn create_tmp(&self, key: &str) -> anyhow::Result<(Ino, String, u64)> {
        let (dir, name) = self.parent(key, true).map_err(err)?;
        let tmp = format!("{PARTIAL}{name}.{:08x}.tmp", rand::random::<u32>());
        let o = self
            .vfs
            .create(
                &self.ctx,
                dir,
                tmp.as_bytes(),
                0o666,
                libc::O_WRONLY | libc::O_EXCL,
            )
            .map_err(err)?;
        Ok((dir, tmp, o.fh))
    }

    pub fn write(&self, fh: u64, mut off: u64, mut data: &[u8]) -> anyhow::Result<()> {
        while !data.is_empty() {
            let (n, _) = self.vfs.write(fh, off, data, None).map_err(err)?;
            if n == 0 {
                anyhow::bail!("a write took nothing");
            }
            off += n as u64;
            data = &data[n as usize..];
        }
        Ok(())
    }

    /// Closes temporary file `tmp` (flushing it: an error here is the file's), gives it the
    /// source's mtime (and mode), and renames it to `key`.
    pub fn finish(
        &self,
        (dir, tmp, fh): (Ino, String, u64),
        key: &str,
        mtime: i64,
        mode: Option<u32>,
    ) -> anyhow::Result<()> {
        let res = (|| -> anyhow::Result<()> {
            let a = self
                .vfs
                .lookup(&self.ctx, dir, tmp.as_bytes())
                .map_err(err)?;
            self.vfs.flush(fh).map_err(err)?;
            self.vfs.release(fh).map_err(err)?;
            self.stamp(a.ino, mtime, mode)?;
            let (_, name) = self.parent(key, false).map_err(err)?;
            self.vfs
                .rename(
                    &self.ctx,
                    dir,
                    tmp.as_bytes(),
                    dir,
                    name.as_bytes(),
                    RenameFlags::default(),
                )
                .map_err(err)
        })();
        if res.is_err() {
            let _ = self.vfs.release(fh);
            let _ = self.vfs.unlink(&self.ctx, dir, tmp.as_bytes());
        }
        res
    }

    /// Throws a temporary file away.
    pub fn abort(&self, (dir, tmp, fh): (Ino, String, u64)) {
        let _ = self.vfs.release(fh);
        let _ = self.vfs.unlink(&self.ctx, dir, tmp.as_bytes());
    }

    /// Deletes `key` (a file or link; a directory only when empty): into the trash, when
    /// the volume keeps one.
    pub fn delete(&self, key: &str, is_dir: bool) -> anyhow::Result<()> {
        let (dir, name) = match self.parent(key, false) {
            Ok(p) => p,
            Err(e) if e.errno() == libc::ENOENT => return Ok(()),
            Err(e) => return Err(err(e)),
        };
        let r = if is_dir {
            self.vfs.rmdir(&self.ctx, dir, name.as_bytes())
        } else {
            self.vfs.unlink(&self.ctx, dir, name.as_bytes())
        };
        match r {
            Err(e) if e.errno() != libc::ENOENT => Err(err(e)),
            _ => Ok(()),
        }
    }

    /// Makes directory `key` (and those above it), with `mode` when given.
    pub fn mkdir(&self, key: &str, mtime: i64, mode: Option<u32>) -> anyhow::Result<()> {
        let a = paths::mkdir_all(&self.vfs, &self.ctx, self.root, key.as_bytes(), 0o777)
            .map_err(err)?;
        self.stamp(a.ino, mtime, mode)
    }

    /// Sets `ino`'s mtime, and its mode when given (what a copy keeps of its source).
    fn stamp(&self, ino: Ino, mtime: i64, mode: Option<u32>) -> anyhow::Result<()> {
        let set = SetAttr {
            mtime: Some(SetTime::At(mtime)),
            mode,
            ..Default::default()
        };
        self.vfs
            .setattr(&self.ctx, ino, &set, None, false)
            .map_err(err)?;
        Ok(())
    }

    /// Makes symbolic link `key` to `target` (replacing what was there).
    pub fn symlink(&self, key: &str, target: &[u8]) -> anyhow::Result<()> {
        let (dir, name) = self.parent(key, true).map_err(err)?;
        let _ = self.vfs.unlink(&self.ctx, dir, name.as_bytes());
        self.vfs
            .symlink(&self.ctx, dir, name.as_bytes(), target)
            .map_err(err)?;
        Ok(())
    }

    /// Whether two endpoints are the same volume's (for the loop check).
    pub fn uuid(&self) -> String {
        self.vfs.meta().format().uuid.clone()
    }

    /// Whether directory `inner` lies in or under `outer` (both of this volume).
    pub fn is_under(&self, inner: Ino, outer: Ino) -> bool {
        let mut at = inner;
        for _ in 0..4096 {
            if at == outer {
                return true;
            }
            if at == ROOT_INO || at == 0 {
                return false;
            }
            match self.vfs.getattr(at) {
                Ok(a) => at = a.parent,
                Err(_) => return false,
            }
        }
        false
    }
}

/// Opens a volume for `unkai sync`: a client as the caller's opener builds it.
pub type Opener = dyn Fn(&str) -> anyhow::Result<Client> + Send + Sync;

/// Opens `given` (META-URL[:/path]) through `open`.
pub fn open(
    open: Option<&Opener>,
    given: &str,
    is_src: bool,
    dry_run: bool,
) -> anyhow::Result<Vol> {
    let (url, path) = split(given);
    let open = open.context("volumes are not an endpoint here")?;
    let client = open(url)?;
    Vol::open(client, path, given, is_src, dry_run)
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn meta_urls_split_from_their_path() {
        assert_eq!(split("sqlite:///a/b.db"), ("sqlite:///a/b.db", "/"));
        assert_eq!(split("sqlite:///a/b.db:/x/y"), ("sqlite:///a/b.db", "/x/y"));
        assert_eq!(
            split("postgres://u:p@h:5432/db"),
            ("postgres://u:p@h:5432/db", "/")
        );
        assert_eq!(
            split("postgres://u:p@h:5432/db:/data"),
            ("postgres://u:p@h:5432/db", "/data")
        );
    }
}
