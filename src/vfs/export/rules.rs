//! The kernel's permission rules, written once for every front end the kernel does not stand
//! in front of (the NFS, S3 and WebDAV servers; a FUSE mount gets the kernel's own, as
//! `default_permissions`): who may look up in, create in, remove from, rename across, open,
//! and change the attributes of what, by mode bits, POSIX ACLs and the sticky bit, and the
//! errno Linux gives when not (`EACCES` for a missing permission bit, `EPERM` for the sticky
//! bit and for what only an owner may do). The vfs checks no permissions itself.
//!
//! Not for: a protocol's own words for the errno (each front end maps it), identities from
//! a protocol's credentials (each server makes its [`Identity`]), a read-only export (each
//! front end refuses changes with its protocol's error first).

use crate::meta::acl::{self, Acl};
use crate::meta::{Attr, Ctx, Kind, SetAttr, SetTime};
use crate::vfs::{self, Vfs};

fn err<T>(errno: i32) -> vfs::Result<T> {
    Err(vfs::Error::Sys(errno))
}

/// The identity a request acts as: a uid, a gid and supplementary groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Identity {
    /// A server's one identity (WebDAV's, S3's): `ctx`'s uid and gid, no other groups.
    pub fn of(ctx: &Ctx) -> Identity {
        Identity {
            uid: ctx.uid,
            gid: ctx.gid,
            groups: Vec::new(),
        }
    }

    /// As a `Ctx` for the vfs (no umask: NFS clients apply their own to the mode they send).
    /// What it creates gets this uid and gid.
    pub fn ctx(&self) -> Ctx {
        Ctx {
            uid: self.uid,
            gid: self.gid,
            pid: 0,
            umask: 0,
        }
    }

    /// Whether it belongs to `gid`, supplementary groups included.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// A `Ctx` for rules about inode `a` that the vfs applies by the caller's group
    /// (`vfs::may`, the setgid bit a write or chmod drops): a `Ctx` carries one group and
    /// no supplementary ones, so where this identity belongs to `a`'s group by a
    /// supplementary group, that group stands as its primary one.
    pub fn ctx_for(&self, a: &Attr) -> Ctx {
        let mut c = self.ctx();
        if self.in_group(a.gid) {
            c.gid = a.gid;
        }
        c
    }

    /// Whether it may access `a` for `want` (r=4, w=2, x=1): the mode bits as `vfs::may`
    /// checks them, or `acl`, the inode's access ACL if it has one, as the kernel's
    /// `posix_acl_permission` does (root and the owner are decided by the mode bits alone).
    pub fn may(&self, a: &Attr, want: u32, acl: Option<&Acl>) -> bool {
        match acl {
            Some(acl) if self.uid != 0 && self.uid != a.uid => {
                acl.permits(a.uid, a.gid, self.uid, &|g| self.in_group(g), want)
            }
            _ => vfs::may(&self.ctx_for(a), a, want),
        }
    }

    /// Whether it owns `a` (or is root): chmod, and times set explicitly.
    pub fn owns(&self, a: &Attr) -> bool {
        self.uid == 0 || self.uid == a.uid
    }

    /// Whether the sticky bit of `dir` lets it remove or replace `victim`.
    pub fn may_delete(&self, dir: &Attr, victim: &Attr) -> bool {
        vfs::sticky_allows(&self.ctx(), dir, victim)
    }

    /// Whether it may create a device node (CAP_MKNOD: root only).
    pub fn may_mknod(&self, kind: Kind) -> bool {
        self.uid == 0 || !matches!(kind, Kind::CharDev | Kind::BlockDev)
    }
}

/// What a setattr (or a create's attributes) asks to change.
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
    pub fn is_empty(&self) -> bool {
        self.mode.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.size.is_none()
            && self.atime.is_none()
            && self.mtime.is_none()
    }
}

/// The rules, applied to a volume's inodes (whose ACLs it reads).
pub struct Rules<'a> {
    vfs: &'a Vfs,
}

impl<'a> Rules<'a> {
    pub fn new(vfs: &'a Vfs) -> Rules<'a> {
        Rules { vfs }
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

    /// Whether `who` may access `a` for `want` (r=4, w=2, x=1), ACL included.
    pub fn may(&self, who: &Identity, a: &Attr, want: u32) -> bool {
        who.may(a, want, self.acl(who, a).as_ref())
    }

    /// `who` may look names up in `dir` (ENOTDIR, EACCES).
    pub fn search(&self, who: &Identity, dir: &Attr) -> vfs::Result<()> {
        if dir.kind != Kind::Dir {
            return err(libc::ENOTDIR);
        }
        if !self.may(who, dir, 1) {
            return err(libc::EACCES);
        }
        Ok(())
    }

    /// `who` may list `dir` (ENOTDIR, EACCES).
    pub fn list(&self, who: &Identity, dir: &Attr) -> vfs::Result<()> {
        if dir.kind != Kind::Dir {
            return err(libc::ENOTDIR);
        }
        if !self.may(who, dir, 4) {
            return err(libc::EACCES);
        }
        Ok(())
    }

    /// `who` may add an entry to `dir`, as the kernel's `may_create`: search and write
    /// permission on it (ENOTDIR, EACCES).
    pub fn create(&self, who: &Identity, dir: &Attr) -> vfs::Result<()> {
        self.search(who, dir)?;
        if !self.may(who, dir, 2) {
            return err(libc::EACCES);
        }
        Ok(())
    }

    /// `who` may remove `victim` from `dir`, as the kernel's `may_delete`: search and write
    /// permission on the directory (EACCES), then its sticky bit (EPERM: only the owner of
    /// the entry or of the directory, or root, removes from a sticky directory).
    pub fn remove(&self, who: &Identity, dir: &Attr, victim: &Attr) -> vfs::Result<()> {
        self.create(who, dir)?;
        if !who.may_delete(dir, victim) {
            return err(libc::EPERM);
        }
        Ok(())
    }

    /// `who` may move `victim` from `from` to `to`, replacing `replaced` if there is one:
    /// removal from `from`, then removal of `replaced` from `to` or creation in it, and, as
    /// `vfs_rename` asks, write permission on a directory that moves to another parent (its
    /// `..` changes: EACCES).
    pub fn rename(
        &self,
        who: &Identity,
        from: &Attr,
        victim: &Attr,
        to: &Attr,
        replaced: Option<&Attr>,
    ) -> vfs::Result<()> {
        self.remove(who, from, victim)?;
        match replaced {
            Some(old) => self.remove(who, to, old)?,
            None => self.create(who, to)?,
        }
        if victim.kind == Kind::Dir && from.ino != to.ino && !self.may(who, victim, 2) {
            return err(libc::EACCES);
        }
        Ok(())
    }

    /// `who` may open `a` for `want` (r=4, w=2), as `open(2)` checks: a directory is not
    /// opened for writing (EISDIR), then the permission bits (EACCES).
    pub fn open(&self, who: &Identity, a: &Attr, want: u32) -> vfs::Result<()> {
        if a.kind == Kind::Dir && want & 2 != 0 {
            return err(libc::EISDIR);
        }
        if !self.may(who, a, want) {
            return err(libc::EACCES);
        }
        Ok(())
    }

    /// What `who` may change of `a` as `c` asks, as the kernel's `setattr_prepare`: only
    /// the owner (or root) changes the mode (EPERM; setgid dropped when the owner is not in
    /// the file's group) or sets times explicitly (EPERM); only root gives a file away, and
    /// the owner gives it only to a group of its own (EPERM); setting times to now needs
    /// ownership or write permission (EACCES), and so does a truncation (EACCES; EISDIR for a
    /// directory). The size is the caller's to apply, as `c.size` says.
    pub fn setattr(&self, who: &Identity, a: &Attr, c: &Change) -> vfs::Result<SetAttr> {
        let mut set = SetAttr::default();
        if let Some(m) = c.mode {
            if !who.owns(a) {
                return err(libc::EPERM);
            }
            let mut m = m & 0o7777;
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
        let time = |t: Option<SetTime>| -> vfs::Result<Option<SetTime>> {
            match t {
                Some(SetTime::At(_)) if !who.owns(a) => err(libc::EPERM),
                Some(SetTime::Now) if !who.owns(a) && !self.may(who, a, 2) => err(libc::EACCES),
                t => Ok(t),
            }
        };
        set.atime = time(c.atime)?;
        set.mtime = time(c.mtime)?;
        if c.size.is_some() {
            if a.kind == Kind::Dir {
                return err(libc::EISDIR);
            }
            if !self.may(who, a, 2) {
                return err(libc::EACCES);
            }
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ino: u64, kind: Kind, mode: u32, uid: u32) -> Attr {
        Attr {
            ino,
            kind,
            mode,
            uid,
            gid: uid,
            nlink: 1,
            length: 0,
            rdev: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            parent: 1,
            flags: 0,
            stored: 0,
        }
    }

    fn id(uid: u32) -> Identity {
        Identity {
            uid,
            gid: uid,
            groups: Vec::new(),
        }
    }

    /// The rules without a volume: no inode here has an ACL (the check reads none for the
    /// owner or root, and these tests look at mode bits only).
    #[test]
    fn errnos_are_linuxs() {
        let dir = tempfile::tempdir().unwrap();
        let storage = format!("file://{}", dir.path().join("bucket").display());
        let fmt = crate::meta::Format::for_tests("r", &storage, 64 << 10);
        let (_mdir, meta) = crate::meta::sqlite::scratch(&fmt);
        let obj = crate::object::ObjectStorage::open(&fmt.storage, true).unwrap();
        let store = crate::data::DataStore::new(obj, fmt, crate::data::Config::default()).unwrap();
        let vfs = Vfs::new(
            meta,
            store,
            vfs::Config {
                background: false,
                ..Default::default()
            },
        );
        let r = Rules::new(&vfs);
        let e = |res: vfs::Result<()>| res.err().map(|e| e.errno());
        let sticky = attr(1_000_001, Kind::Dir, 0o1777, 0);
        let theirs = attr(1_000_002, Kind::File, 0o666, 1001);
        let mine = attr(1_000_003, Kind::File, 0o644, 1000);
        assert_eq!(e(r.remove(&id(1000), &sticky, &theirs)), Some(libc::EPERM));
        assert_eq!(e(r.remove(&id(1000), &sticky, &mine)), None);
        assert_eq!(e(r.remove(&id(1001), &sticky, &theirs)), None);
        assert_eq!(e(r.remove(&id(0), &sticky, &theirs)), None);
        let closed = attr(1_000_004, Kind::Dir, 0o755, 0);
        assert_eq!(e(r.create(&id(1000), &closed)), Some(libc::EACCES));
        assert_eq!(e(r.create(&id(1000), &mine)), Some(libc::ENOTDIR));
        // A directory moved to another parent needs write permission on itself.
        let (a, b) = (
            attr(1_000_005, Kind::Dir, 0o777, 0),
            attr(1_000_006, Kind::Dir, 0o777, 0),
        );
        let d = attr(1_000_007, Kind::Dir, 0o555, 1001);
        assert_eq!(e(r.rename(&id(1000), &a, &d, &b, None)), Some(libc::EACCES));
        assert_eq!(e(r.rename(&id(1000), &a, &d, &a, None)), None);
        assert_eq!(e(r.rename(&id(1001), &a, &d, &b, None)), Some(libc::EACCES));
        assert_eq!(e(r.rename(&id(0), &a, &d, &b, None)), None);
        // Replacing in a sticky directory: EPERM.
        assert_eq!(
            e(r.rename(&id(1000), &a, &mine, &sticky, Some(&theirs))),
            Some(libc::EPERM)
        );
        let ro = attr(1_000_008, Kind::File, 0o444, 1001);
        assert_eq!(e(r.open(&id(1000), &ro, 2)), Some(libc::EACCES));
        assert_eq!(e(r.open(&id(1000), &ro, 4)), None);
        assert_eq!(e(r.open(&id(0), &ro, 2)), None);
        assert_eq!(e(r.open(&id(1000), &a, 2)), Some(libc::EISDIR));
        let chmod = Change {
            mode: Some(0o600),
            ..Change::default()
        };
        assert_eq!(
            r.setattr(&id(1000), &ro, &chmod).unwrap_err().errno(),
            libc::EPERM
        );
        assert_eq!(r.setattr(&id(1001), &ro, &chmod).unwrap().mode, Some(0o600));
        let trunc = Change {
            size: Some(0),
            ..Change::default()
        };
        assert_eq!(
            r.setattr(&id(1000), &ro, &trunc).unwrap_err().errno(),
            libc::EACCES
        );
    }
}
