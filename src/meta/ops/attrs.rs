//! An inode's attributes: getattr and setattr (a chmod rewriting the access ACL), the inode
//! flags (`chattr`, quarantine), atimes, extended attributes, and POSIX ACLs as stored in
//! their xattrs.
//!
//! Not for: sizes and contents (`files`: truncate, fallocate), names (`namespace`), parsing
//! or evaluating an ACL (`meta::acl`), or SQL (the engines).

use super::*;

impl<E: Engine> EngineMeta<E> {
    /// After an xattr of `ino` was set or removed (its attributes now `after`).
    fn xattrs_changed(&self, epoch: Option<u64>, ino: Ino, after: Option<Attr>) {
        let mut facts = vec![Fact::Stale(ino)];
        facts.extend(after.map(Fact::Attr));
        self.cache.learn(epoch, &facts);
        self.engine.publish(|| vec![attr_changed(ino)])
    }

    /// An ACL as stored (checked when it was set: one that no longer reads is damage).
    pub(super) fn stored_acl(ino: Ino, b: &[u8]) -> TxResult<acl::Acl> {
        acl::Acl::parse(b).ok_or_else(|| {
            corrupt(format!(
                "inode {ino} has a malformed ACL: remove it (setfacl -b, or setfacl -k for a \
                 directory's default ACL) and set it again"
            ))
        })
    }

    /// Only the owner (or root) sets or removes an inode's ACLs; symlinks have none.
    fn may_set_acl(ctx: &Ctx, a: &Attr) -> TxResult<()> {
        if a.kind == Kind::Symlink {
            return fail(libc::EOPNOTSUPP);
        }
        if ctx.uid != 0 && ctx.uid != a.uid {
            return fail(libc::EPERM);
        }
        Ok(())
    }

    /// Sets an ACL xattr of `a`. A default ACL is for directories only (EACCES); an access
    /// ACL sets the permission bits (mask or owning group in the group bits, and the setgid
    /// bit cleared for a caller outside the group, as `posix_acl_update_mode` does) and is
    /// not kept when the bits say it all.
    fn put_acl(
        tx: &mut dyn Txn,
        ctx: &Ctx,
        a: &mut Attr,
        name: &[u8],
        acl: &acl::Acl,
    ) -> TxResult<()> {
        Self::may_set_acl(ctx, a)?;
        if name == acl::DEFAULT {
            if a.kind != Kind::Dir {
                return fail(libc::EACCES);
            }
            return tx.put_xattr(a.ino, name, &acl.to_xattr());
        }
        a.mode = (a.mode & !0o777) | acl.mode();
        if ctx.uid != 0 && !ctx.in_group(a.gid) {
            a.mode &= !libc::S_ISGID;
        }
        if acl.is_minimal() {
            tx.delete_xattr(a.ino, name)?;
            Ok(())
        } else {
            tx.put_xattr(a.ino, name, &acl.to_xattr())
        }
    }

    /// Sets the flags of `ino` to what `new` makes of its attributes (or refuses), in one
    /// transaction; its ctime moves if they change, unless `keep_ctime`.
    fn update_flags(
        &self,
        ino: Ino,
        keep_ctime: bool,
        new: impl Fn(&Attr) -> TxResult<u32> + Send + Sync,
    ) -> Result<Attr> {
        let e = self.epoch();
        self.engine
            .write_grouped(&[ino], false, |tx| {
                let mut a = tx.lock_node(ino)?;
                let want = new(&a)?;
                if a.flags != want {
                    a.flags = want;
                    if !keep_ctime {
                        a.ctime = now_nanos();
                    }
                    tx.update_node(&a)?;
                }
                Ok(a)
            })
            .inspect(|a| {
                self.cache.learn(e, &[Fact::Attr(a.clone())]);
                self.engine.publish(|| vec![attr_changed(ino)])
            })
    }

    pub(super) fn set_quarantined(&self, ino: Ino, on: bool) -> Result<Attr> {
        self.update_flags(ino, false, |a| {
            Ok(match on {
                true => a.flags | flags::QUARANTINED,
                false => a.flags & !flags::QUARANTINED,
            })
        })
    }

    pub(super) fn getattr(&self, ino: Ino) -> Result<Attr> {
        let e = self.epoch();
        if e.is_some() {
            if let Some(a) = self.cache.attr(ino) {
                return Ok(a);
            }
        }
        self.read_attr(e, ino)
    }

    pub(super) fn setattr(&self, _ctx: &Ctx, ino: Ino, set: &SetAttr) -> Result<Attr> {
        if set.is_empty() {
            return self.getattr(ino);
        }
        let now = now_nanos();
        let e = self.epoch();
        // No inode to lock first: the UPDATE of `set_attr` locks its row itself (and a
        // chmod's ACL is read and rewritten under that lock). On PostgreSQL a chmod is then two
        // round trips (BEGIN, the UPDATE and the ACL's read in one; the ACL's rewrite with
        // COMMIT), anything else one statement on its own.
        let res = if set.mode.is_some() {
            // chmod rewrites the access ACL's owner, mask and other entries.
            self.engine.write_grouped(&[], false, |tx| {
                let (a, access) = tx.set_attr_with_acl(ino, set, now)?;
                if let Some(b) = access {
                    let mut acl = Self::stored_acl(ino, &b)?;
                    acl.chmod(a.mode);
                    tx.put_xattr(ino, acl::ACCESS, &acl.to_xattr())?;
                }
                Ok(a)
            })
        } else {
            self.engine.single_grouped(|tx| tx.set_attr(ino, set, now))
        };
        res.inspect(|a| {
            // A chmod may rewrite the access ACL: the xattrs known go.
            let mut facts = vec![Fact::Attr(a.clone())];
            if set.mode.is_some() {
                facts.insert(0, Fact::Stale(ino));
            }
            self.cache.learn(e, &facts);
            self.engine.publish(|| vec![attr_changed(ino)])
        })
    }

    pub(super) fn set_flags(
        &self,
        ctx: &Ctx,
        ino: Ino,
        new: u32,
        keep_ctime: bool,
    ) -> Result<Attr> {
        if new & !flags::KEPT != 0 {
            return sys(libc::EOPNOTSUPP);
        }
        self.update_flags(ino, keep_ctime, |a| {
            // The owner may; immutable and append-only take privilege (the kernel has
            // checked both already; a client of another kind may not have).
            if ctx.uid != 0 && (ctx.uid != a.uid || (a.flags ^ new) & flags::PRIVILEGED != 0) {
                return fail(libc::EPERM);
            }
            Ok(new | (a.flags & flags::INTERNAL))
        })
    }

    pub(super) fn set_atimes(&self, times: &[(Ino, Nanos)]) -> Result<()> {
        if times.is_empty() {
            return Ok(());
        }
        let inos: Vec<Ino> = times.iter().map(|t| t.0).collect();
        let e = self.epoch();
        let res = self.engine.write(&inos, false, |tx| {
            for &(ino, at) in times {
                if let Some(mut a) = unless_gone(tx.lock_node(ino))? {
                    if at > a.atime {
                        a.atime = at;
                        tx.update_node(&a)?;
                    }
                }
            }
            Ok(())
        });
        let facts: Vec<Fact> = inos.iter().map(|i| Fact::Stale(*i)).collect();
        self.cache.learn(e, &facts);
        res
    }

    pub(super) fn set_xattr(
        &self,
        ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        how: XattrSet,
    ) -> Result<()> {
        if name.is_empty() {
            return sys(libc::EINVAL);
        }
        if name.len() > MAX_XATTR_NAME {
            return sys(libc::ERANGE);
        }
        if value.len() > MAX_XATTR_VALUE {
            return sys(libc::E2BIG);
        }
        let acl = match acl::is_acl(name) {
            true => Some(acl::Acl::parse(value).ok_or(Error::Sys(libc::EINVAL))?),
            false => None,
        };
        let e = self.epoch();
        let mut after = None;
        self.engine
            .write_grouped(&[ino], false, |tx| {
                let mut a = tx.lock_node(ino)?;
                check_protected(&a)?;
                let exists = tx.xattr(ino, name)?.is_some();
                match how {
                    XattrSet::Create if exists => return fail(libc::EEXIST),
                    XattrSet::Replace if !exists => return fail(libc::ENODATA),
                    _ => {}
                }
                match &acl {
                    Some(acl) => Self::put_acl(tx, ctx, &mut a, name, acl)?,
                    None => tx.put_xattr(ino, name, value)?,
                }
                a.ctime = now_nanos();
                tx.update_node(&a)?;
                after = Some(a);
                Ok(())
            })
            .inspect(|_| self.xattrs_changed(e, ino, after.take()))
    }

    pub(super) fn get_xattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        if name.len() > MAX_XATTR_NAME {
            return sys(libc::ERANGE);
        }
        if name == trash::ORIGIN {
            // Where a trashed entry was: its whole path, resolved now.
            return self.origin_path(ino);
        }
        let e = self.epoch();
        if e.is_some() {
            match self.cache.xattr(ino, name) {
                Some(Some(v)) => return Ok(v),
                Some(None) => return sys(libc::ENODATA),
                None => {}
            }
        }
        let res = self.engine.read(|tx| match tx.xattr(ino, name)? {
            Some(v) => Ok(v),
            None => {
                tx.get_node(ino)?;
                fail(libc::ENODATA)
            }
        });
        match &res {
            Ok(v) => self.cache.fill_xattr(e, ino, name, Some(v)),
            Err(err) if err.errno() == libc::ENODATA => self.cache.fill_xattr(e, ino, name, None),
            Err(_) => {}
        }
        res
    }

    pub(super) fn list_xattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.engine.snapshot(|tx| {
            tx.get_node(ino)?;
            tx.xattr_names(ino)
        })
    }

    pub(super) fn remove_xattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<()> {
        if name.len() > MAX_XATTR_NAME {
            return sys(libc::ERANGE);
        }
        let is_acl = acl::is_acl(name);
        let e = self.epoch();
        let mut after = None;
        self.engine
            .write_grouped(&[ino], false, |tx| {
                let mut a = tx.lock_node(ino)?;
                check_protected(&a)?;
                if is_acl {
                    Self::may_set_acl(ctx, &a)?;
                }
                if !tx.delete_xattr(ino, name)? {
                    // As on ext4: an ACL that is not there is removed already.
                    return if is_acl { Ok(()) } else { fail(libc::ENODATA) };
                }
                a.ctime = now_nanos();
                tx.update_node(&a)?;
                after = Some(a);
                Ok(())
            })
            .inspect(|_| self.xattrs_changed(e, ino, after.take()))
    }
}
