//! Paths for the front ends that name files by path (the S3 gateway, WebDAV): walking
//! '/'-separated names from a served root, never above it, and making the directories a
//! path needs.
//!
//! Not for: protocol-specific names (an S3 key's or a URL's encoding is its front end's to
//! undo), or anything the kernel's own walk does for the FUSE mount.

use super::{Result, Vfs, may, sys};
use crate::meta::{Attr, Ctx, Ino, Kind};

/// The components of `path`: empty ones and `.` dropped; `..` kept (the walk resolves it).
fn components(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
}

/// The inode `path` names, walked from `root` as `ctx` (each directory must let it search,
/// as the kernel's walk would: EACCES otherwise). `..` goes up one directory but never above `root`: there it
/// stays at `root`, as `/..` does. A symbolic link on the way is not followed (ENOENT past
/// it: a front end serving paths serves the links themselves).
pub fn resolve(vfs: &Vfs, ctx: &Ctx, root: Ino, path: &[u8]) -> Result<Attr> {
    let mut stack: Vec<Attr> = vec![vfs.getattr(root)?];
    for c in components(path) {
        if c == b".." {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let dir = stack.last().expect("never empty");
        if dir.kind != Kind::Dir {
            return sys(libc::ENOTDIR);
        }
        // The vfs checks no permissions (the kernel does, for a mount): the walk does.
        if !may(ctx, dir, 1) {
            return sys(libc::EACCES);
        }
        let a = vfs.lookup(ctx, dir.ino, c)?;
        stack.push(a);
    }
    Ok(stack.pop().expect("never empty"))
}

/// The directory `path` names under `root`, made (with `mode`, as `ctx`) where it or a
/// directory above it is missing, as `mkdir -p` does. `..` is refused (EINVAL): a path to
/// create names its directories plainly. A component that exists and is not a directory is
/// ENOTDIR. Permissions are checked as the kernel would: search on each directory walked,
/// write on one a directory is made in (EACCES).
pub fn mkdir_all(vfs: &Vfs, ctx: &Ctx, root: Ino, path: &[u8], mode: u32) -> Result<Attr> {
    let mut dir = vfs.getattr(root)?;
    for c in components(path) {
        if c == b".." {
            return sys(libc::EINVAL);
        }
        if dir.kind != Kind::Dir {
            return sys(libc::ENOTDIR);
        }
        if !may(ctx, &dir, 1) {
            return sys(libc::EACCES);
        }
        dir = match vfs.lookup(ctx, dir.ino, c) {
            Ok(a) => a,
            Err(e) if e.errno() == libc::ENOENT => {
                if !may(ctx, &dir, 3) {
                    return sys(libc::EACCES);
                }
                match vfs.mknod(ctx, dir.ino, c, Kind::Dir, mode, 0) {
                    Ok(a) => a,
                    // Made meanwhile by another request: take it.
                    Err(e) if e.errno() == libc::EEXIST => vfs.lookup(ctx, dir.ino, c)?,
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
    }
    if dir.kind != Kind::Dir {
        return sys(libc::ENOTDIR);
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Config as DataConfig, DataStore};
    use crate::meta::{Format, ROOT_INO};
    use crate::object::ObjectStorage;

    fn vfs() -> (tempfile::TempDir, tempfile::TempDir, Vfs) {
        let dir = tempfile::tempdir().unwrap();
        let storage = format!("file://{}", dir.path().join("bucket").display());
        let fmt = Format::for_tests("p", &storage, 64 << 10);
        let (mdir, meta) = crate::meta::sqlite::scratch(&fmt);
        let obj = ObjectStorage::open(&fmt.storage, true).unwrap();
        let store = DataStore::new(obj, fmt.clone(), DataConfig::default()).unwrap();
        let cfg = super::super::Config {
            background: false,
            ..Default::default()
        };
        (dir, mdir, Vfs::new(meta, store, cfg))
    }

    #[test]
    fn walks_makes_and_never_climbs_above_the_root() {
        let (_d, _m, vfs) = vfs();
        let ctx = Ctx::ROOT;
        let a = mkdir_all(&vfs, &ctx, ROOT_INO, b"/a/b//c/", 0o755).unwrap();
        assert_eq!(a.kind, Kind::Dir);
        // Again: the same directory, nothing made twice.
        assert_eq!(
            mkdir_all(&vfs, &ctx, ROOT_INO, b"a/b/c", 0o755)
                .unwrap()
                .ino,
            a.ino
        );
        assert_eq!(
            resolve(&vfs, &ctx, ROOT_INO, b"a/./b/c").unwrap().ino,
            a.ino
        );
        let b = resolve(&vfs, &ctx, ROOT_INO, b"a/b").unwrap();
        assert_eq!(
            resolve(&vfs, &ctx, ROOT_INO, b"a/b/c/..").unwrap().ino,
            b.ino
        );
        // Served from a/b: `..` stops there, and a/ is out of reach.
        assert_eq!(resolve(&vfs, &ctx, b.ino, b"../../..").unwrap().ino, b.ino);
        assert_eq!(resolve(&vfs, &ctx, b.ino, b"../c").unwrap().ino, a.ino);
        let e = resolve(&vfs, &ctx, b.ino, b"../../b").unwrap_err();
        assert_eq!(e.errno(), libc::ENOENT);
        assert_eq!(
            mkdir_all(&vfs, &ctx, b.ino, b"../x", 0o755)
                .unwrap_err()
                .errno(),
            libc::EINVAL
        );
        assert_eq!(
            resolve(&vfs, &ctx, ROOT_INO, b"a/nope")
                .unwrap_err()
                .errno(),
            libc::ENOENT
        );
        assert_eq!(resolve(&vfs, &ctx, ROOT_INO, b"").unwrap().ino, ROOT_INO);
    }

    #[test]
    fn the_walk_checks_search_and_write_permissions() {
        let (_d, _m, vfs) = vfs();
        mkdir_all(&vfs, &Ctx::ROOT, ROOT_INO, b"open/x", 0o755).unwrap();
        vfs.mknod(&Ctx::ROOT, ROOT_INO, b"shut", Kind::Dir, 0o700, 0)
            .unwrap();
        let user = Ctx {
            uid: 1000,
            gid: 1000,
            pid: 0,
            umask: 0o022,
        };
        assert!(resolve(&vfs, &user, ROOT_INO, b"open/x").is_ok());
        let denied = |r: Result<Attr>| r.unwrap_err().errno() == libc::EACCES;
        assert!(denied(resolve(&vfs, &user, ROOT_INO, b"shut/y")));
        assert!(denied(mkdir_all(&vfs, &user, ROOT_INO, b"shut/y", 0o755)));
        // Searchable, not writable: nothing can be made in it.
        assert!(denied(mkdir_all(&vfs, &user, ROOT_INO, b"open/new", 0o755)));
        assert!(mkdir_all(&vfs, &user, ROOT_INO, b"open/x", 0o755).is_ok());
    }
}
