//! The namespace: lookups, creates (mknod, mkdir, symlink, create-and-open), hard links,
//! unlinks and rmdirs (into the trash when the volume keeps one), renames and exchanges,
//! directory listings and symlink targets; what each made true, told to the cache.
//!
//! Not for: an inode's attributes, xattrs or ACLs once it exists (`attrs`, though a create
//! applies its directory's default ACL here), its contents (`files`), the trash's own
//! bookkeeping (`meta::trash`), or SQL (the engines).

use super::*;

/// Directories below a listed one whose first pages are read with it (where the engine can
/// in the same read): a walk (`find`, `du`, `rm -rf`, `ls -R`) then lists them from memory,
/// a round trip saved for each on PostgreSQL.
const TREE_DIRS: i64 = 64;

/// Checks a name a new entry gets.
fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > MAX_NAME_LEN {
        return sys(libc::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return sys(libc::EINVAL);
    }
    Ok(())
}

/// EPERM for a directory whose flags forbid adding entries (immutable) or, when
/// `removing`, taking them away (immutable, append-only).
fn check_dir_change(dir: &Attr, removing: bool) -> TxResult<()> {
    let forbid = if removing {
        flags::PRIVILEGED
    } else {
        flags::IMMUTABLE
    };
    if dir.flags & forbid != 0 {
        return fail(libc::EPERM);
    }
    Ok(())
}

/// Checks a name an existing entry may have.
fn check_len(name: &[u8]) -> Result<()> {
    if name.len() > MAX_NAME_LEN {
        return sys(libc::ENAMETOOLONG);
    }
    Ok(())
}

/// What a link or an unlink of `name` in `parent` (naming `ino`) changed.
fn named_inode_changed(parent: Ino, name: &[u8], ino: Ino) -> Vec<Change> {
    vec![
        entry_changed(parent, name),
        attr_changed(parent),
        attr_changed(ino),
    ]
}

impl<E: Engine> EngineMeta<E> {
    fn parent_dir(tx: &mut dyn Txn, parent: Ino) -> TxResult<Attr> {
        let p = tx.lock_node(parent)?;
        if p.kind != Kind::Dir {
            return fail(libc::ENOTDIR);
        }
        if p.nlink == 0 {
            return fail(libc::ENOENT);
        }
        Ok(p)
    }

    /// mknod, and with `open` the open of the new file (`create_open`) counted before and
    /// recorded in the same transaction. `perm` is (mode, rdev).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn make_node(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        kind: Kind,
        (mode, rdev): (u32, u32),
        target: Option<&[u8]>,
        open: bool,
    ) -> Result<Attr> {
        check_name(name)?;
        if let Some(t) = target {
            if t.is_empty() {
                return sys(libc::ENOENT);
            }
            if t.len() > MAX_SYMLINK_LEN {
                return sys(libc::ENAMETOOLONG);
            }
        }
        if parent == ROOT_INO && name == trash::TRASH_NAME {
            return sys(libc::EEXIST);
        }
        let ino = self.alloc(&self.inos, "nextInode")?;
        // Counted before the create commits, and recorded with it (see `create_open`).
        let recorded = open && self.opens.add(ino).1;
        let sid = self.sid();
        let e = self.epoch();
        let mut after = None;
        let contained = !self.quotas_kept() && self.format.read().inodes == 0;
        self.engine
            .write_in_dir(parent, contained, |tx| {
                let mut p = Self::parent_dir(tx, parent)?;
                self.check_not_trash(&p)?;
                check_dir_change(&p, false)?;
                let now = now_nanos();
                let mut mode = mode & 0o7777;
                let mut gid = ctx.gid;
                if p.mode & libc::S_ISGID != 0 {
                    gid = p.gid;
                    if kind == Kind::Dir {
                        mode |= libc::S_ISGID;
                    } else if mode & (libc::S_ISGID | libc::S_IXGRP)
                        == (libc::S_ISGID | libc::S_IXGRP)
                        && ctx.uid != 0
                        && !ctx.in_group(gid)
                    {
                        mode &= !libc::S_ISGID;
                    }
                }
                // The directory's default ACL decides the permission bits (masked by those
                // asked for) instead of the umask, and is passed on (POSIX.1e).
                let (mut inherited, mut access) = (None, None);
                if kind != Kind::Symlink {
                    match tx.default_acl(parent)? {
                        Some(b) => {
                            let (acl, perm) = Self::stored_acl(parent, &b)?.inherit(mode);
                            mode = (mode & !0o777) | perm;
                            access = acl;
                            inherited = Some(b);
                        }
                        None => mode &= !(ctx.umask & 0o777),
                    }
                }
                let a = Attr {
                    length: target.map_or(0, |t| t.len() as u64),
                    rdev,
                    ..new_node(ino, kind, mode, (ctx.uid, gid), parent, now)
                };
                p.mtime = now;
                p.ctime = now;
                if kind == Kind::Dir {
                    p.nlink += 1;
                }
                tx.create_in(&a, &p, name)?;
                if let Some(t) = target {
                    tx.insert_symlink(ino, t)?;
                }
                if let Some(acl) = access {
                    tx.put_xattr(ino, acl::ACCESS, &acl.to_xattr())?;
                }
                if let (Kind::Dir, Some(d)) = (kind, &inherited) {
                    tx.put_xattr(ino, acl::DEFAULT, d)?;
                }
                tx.charge(0, 1, 0, self.format.read().inodes)?;
                self.quota_charge(tx, parent, (0, 1))?;
                if recorded {
                    tx.insert_open(ino, sid)?;
                }
                after = Some(p);
                Ok(a)
            })
            .inspect(|a| {
                let mut facts = vec![
                    Fact::Attr(a.clone()),
                    // File capabilities are never inherited.
                    Fact::NoXattr(a.ino, CAPABILITY),
                    Fact::Name(parent, name.to_vec(), Some(a.ino)),
                ];
                facts.extend(after.take().map(Fact::Attr));
                if a.kind == Kind::Dir {
                    facts.push(Fact::NewDir(a.ino));
                }
                self.cache.learn(e, &facts);
                self.engine
                    .publish(|| vec![entry_changed(parent, name), attr_changed(parent)])
            })
            .inspect_err(|_| {
                if open {
                    self.opens.remove(ino);
                }
                self.failed(&[(parent, name)])
            })
    }

    /// EPERM for a directory of the trash itself (its root and hour directories): nothing
    /// is made there but by a deletion; ENOENT for a directory deleted into it.
    fn check_not_trash(&self, dir: &Attr) -> TxResult<()> {
        // A directory deleted into the trash (by another client, while this one still knew
        // it by its name): gone, as a directory removed for good is.
        if dir.flags & flags::TRASHED != 0 {
            return fail(libc::ENOENT);
        }
        let t = self.trash.load(Ordering::Acquire);
        if t != 0 && (dir.ino == t || dir.parent == t) {
            return fail(libc::EPERM);
        }
        Ok(())
    }

    /// Where deleting `name` of `parent` sends it (`None`: nowhere, it goes for good), and
    /// the inodes the deletion locks. EPERM for the trash itself.
    fn deletion_bin(
        &self,
        parent: Ino,
        name: &[u8],
        to_trash: bool,
    ) -> Result<(Option<trash::Bin>, Vec<Ino>)> {
        if parent == ROOT_INO && name == trash::TRASH_NAME {
            return sys(libc::EPERM);
        }
        let bin = if to_trash { self.bin()? } else { None };
        Ok((
            bin,
            std::iter::once(parent).chain(bin.map(|b| b.hour)).collect(),
        ))
    }

    /// What deleting `name` of `parent` (a directory if `dir`) into `bin` will read: the
    /// entry, and the name it would have in the trash if it names the inode this client
    /// knows (`trash_move` looks that name up).
    fn entry_hints<'a>(
        &self,
        parent: Ino,
        name: &'a [u8],
        dir: bool,
        bin: Option<trash::Bin>,
    ) -> EntryHints<'a> {
        let edges = match (bin, self.cache.name(parent, name)) {
            (Some(b), Some(Some(ino))) => vec![(b.hour, trash::entry_name(parent, ino, name))],
            _ => Vec::new(),
        };
        EntryHints {
            entry: (parent, name),
            dir,
            edges,
            trash_hour: bin.map(|b| b.hour),
        }
    }

    /// EINVAL if `dir` is `ancestor` or lies below it. Parent pointers change only in moves
    /// between directories, which hold the rename lock.
    fn check_not_below(tx: &mut dyn Txn, dir: Ino, ancestor: Ino) -> TxResult<()> {
        let mut cur = dir;
        for _ in 0..100_000 {
            if cur == ancestor {
                return fail(libc::EINVAL);
            }
            if cur == ROOT_INO {
                return Ok(());
            }
            cur = tx.get_node(cur)?.parent;
        }
        Err(corrupt("directory tree has a cycle".into()))
    }

    /// Unlinked to zero links: keep the inode (nlink 0) if it is open here (engines counting
    /// opens in memory record it as `sustained`) or recorded open anywhere (`open`, when the
    /// engine already knows), else delete it. The last close anywhere deletes a kept one.
    fn release(&self, tx: &mut dyn Txn, a: &Attr, open: Option<bool>, now: Nanos) -> TxResult<()> {
        if (!E::RECORDS_OPENS && self.opens.is_open(a.ino))
            || (a.kind == Kind::Dir && self.opens.keep_if_open_dir(a.ino))
        {
            tx.insert_sustained(self.sid(), a.ino)?;
            return tx.update_node(a);
        }
        let open = match open {
            Some(o) => o,
            None => tx.open_anywhere(a.ino)?,
        };
        if open {
            tx.update_node(a)
        } else {
            self.delete_inode(tx, a, now)
        }
    }

    /// What a rename that succeeded made true: `moved`, the inodes found under the source
    /// and the target names; `victim`, the inode it unlinked.
    fn renamed(
        moved: Option<(Ino, Option<Ino>)>,
        flags: RenameFlags,
        whiteout: Option<Ino>,
        victim: &Option<Attr>,
        (parent, name): (Ino, &[u8]),
        (new_parent, new_name): (Ino, &[u8]),
    ) -> Vec<Fact> {
        let mut facts = vec![Fact::Stale(parent), Fact::Stale(new_parent)];
        let Some((src, dst)) = moved else {
            return facts;
        };
        if dst == Some(src) {
            // Two names of one inode: nothing moved.
            return facts;
        }
        facts.push(Fact::Stale(src));
        let (old_now, new_now) = match (flags.exchange, dst) {
            (true, Some(d)) => (Some(d), Some(src)),
            _ => (whiteout, Some(src)),
        };
        if let Some(d) = dst {
            facts.push(Fact::Stale(d));
        }
        if let Some(v) = victim {
            facts.push(match v.nlink {
                0 => Fact::Gone(v.ino),
                _ => Fact::Stale(v.ino),
            });
        }
        facts.push(Fact::Name(parent, name.to_vec(), old_now));
        facts.push(Fact::Name(new_parent, new_name.to_vec(), new_now));
        facts
    }

    /// The rename of an entry over another, or to a free name (not an exchange).
    #[allow(clippy::too_many_arguments)]
    fn move_entry(
        &self,
        tx: &mut dyn Txn,
        (mut p1, mut p2): (Attr, Attr),
        (src_eid, mut src): (i64, Attr),
        dst: Option<(i64, Attr)>,
        new_parent: Ino,
        new_name: &[u8],
        noreplace: bool,
        now: Nanos,
        (bin, trashed): (Option<trash::Bin>, &mut Option<(Ino, Vec<u8>)>),
    ) -> TxResult<Option<Attr>> {
        let cross = p1.ino != p2.ino;
        if let Some((_, d)) = &dst {
            if noreplace {
                return fail(libc::EEXIST);
            }
            if src.kind == Kind::Dir {
                if d.kind != Kind::Dir {
                    return fail(libc::ENOTDIR);
                }
                if !tx.dir_is_empty(d.ino)? {
                    return fail(libc::ENOTEMPTY);
                }
            } else if d.kind == Kind::Dir {
                return fail(libc::EISDIR);
            }
        }
        if src.kind == Kind::Dir && cross {
            Self::check_not_below(tx, new_parent, src.ino)?;
        }
        let mut victim = None;
        if let Some((dst_eid, mut d)) = dst {
            tx.delete_edge(dst_eid)?;
            d.ctime = now;
            if d.kind == Kind::Dir {
                d.nlink = 0;
                p2.nlink -= 1;
            } else {
                d.nlink = d.nlink.saturating_sub(1);
            }
            let bin = Self::trashes_from(bin, &p2).filter(|_| d.kind != Kind::Dir);
            if let (0, Some(b)) = (d.nlink, bin) {
                // A file replaced by a rename goes to the trash, as a deleted one does.
                d.nlink = 1;
                let mut at = p2.clone();
                let tname = Self::trash_move(tx, b, None, &mut at, &mut d, new_name, now)?;
                *trashed = Some((b.hour, tname));
            } else if d.nlink == 0 {
                self.release(tx, &d, None, now)?;
            } else {
                tx.update_node(&d)?;
            }
            victim = Some(d);
        }
        tx.move_edge(src_eid, new_parent, new_name)?;
        // Out of the trash (`restore`): its own link again.
        src.flags &= !flags::TRASHED;
        if src.kind == Kind::Dir && cross {
            src.parent = new_parent;
            p1.nlink -= 1;
            p2.nlink += 1;
        }
        src.ctime = now;
        tx.update_node(&src)?;
        if cross {
            p1.mtime = now;
            p1.ctime = now;
            tx.update_node(&p1)?;
        }
        // Same directory: p2 carries the nlink changes of a replaced directory.
        p2.mtime = now;
        p2.ctime = now;
        tx.update_node(&p2)?;
        Ok(victim)
    }

    /// Rename's exchange: the two entries swap inodes.
    fn exchange(
        tx: &mut dyn Txn,
        (mut p1, mut p2): (Attr, Attr),
        (src_eid, mut src): (i64, Attr),
        (dst_eid, mut dst): (i64, Attr),
        now: Nanos,
    ) -> TxResult<()> {
        let cross = p1.ino != p2.ino;
        if cross {
            if src.kind == Kind::Dir {
                Self::check_not_below(tx, p2.ino, src.ino)?;
            }
            if dst.kind == Kind::Dir {
                Self::check_not_below(tx, p1.ino, dst.ino)?;
            }
        }
        tx.set_edge_target(src_eid, dst.ino, dst.kind)?;
        tx.set_edge_target(dst_eid, src.ino, src.kind)?;
        if cross {
            if src.kind == Kind::Dir {
                src.parent = p2.ino;
                p1.nlink -= 1;
                p2.nlink += 1;
            }
            if dst.kind == Kind::Dir {
                dst.parent = p1.ino;
                p2.nlink -= 1;
                p1.nlink += 1;
            }
        }
        src.ctime = now;
        dst.ctime = now;
        tx.update_node(&src)?;
        tx.update_node(&dst)?;
        p1.mtime = now;
        p1.ctime = now;
        tx.update_node(&p1)?;
        if cross {
            p2.mtime = now;
            p2.ctime = now;
            tx.update_node(&p2)?;
        }
        Ok(())
    }

    /// unlink(2): the entry goes, and its inode with its last link, or to the trash (if
    /// `to_trash` and the volume keeps one).
    pub(crate) fn remove(
        &self,
        _ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        to_trash: bool,
    ) -> Result<Attr> {
        check_len(name)?;
        let (bin, lock) = self.deletion_bin(parent, name, to_trash)?;
        let mut trashed: Option<(Ino, Vec<u8>)> = None;
        let e = self.epoch();
        let mut after = None;
        let hints = self.entry_hints(parent, name, false, bin);
        self.engine
            .write_entry(&lock, &hints, |tx| {
                trashed = None;
                let mut p = Self::parent_dir(tx, parent)?;
                let Some((eid, mut a)) = tx.lock_entry(parent, name)? else {
                    return fail(libc::ENOENT);
                };
                if a.kind == Kind::Dir {
                    return fail(libc::EISDIR);
                }
                check_dir_change(&p, true)?;
                check_protected(&a)?;
                let (bytes, inodes) = quota::entry_use(&a);
                self.quota_charge(tx, parent, (-bytes, -inodes))?;
                let now = now_nanos();
                p.mtime = now;
                p.ctime = now;
                if let Some(b) = Self::trashes_from(bin, &p).filter(|_| a.nlink <= 1) {
                    let tname = Self::trash_move(tx, b, Some(eid), &mut p, &mut a, name, now)?;
                    tx.update_node(&p)?;
                    trashed = Some((b.hour, tname));
                    after = Some(p);
                    return Ok(a);
                }
                let open = tx.remove_entry(eid, &p, a.ino)?;
                a.nlink = a.nlink.saturating_sub(1);
                a.ctime = now;
                if a.nlink == 0 {
                    self.release(tx, &a, open, now)?;
                } else {
                    tx.update_node(&a)?;
                }
                after = Some(p);
                Ok(a)
            })
            .inspect(|r| {
                let mut facts = vec![
                    match r.nlink {
                        0 => Fact::Gone(r.ino),
                        _ => Fact::Attr(r.clone()),
                    },
                    Fact::Name(parent, name.to_vec(), None),
                ];
                facts.extend(after.take().map(Fact::Attr));
                if let Some((hour, tname)) = &trashed {
                    facts.push(Fact::Stale(r.ino));
                    facts.push(Fact::Attr(r.clone()));
                    facts.extend(trash::arrived(*hour, tname, r.ino));
                }
                self.cache.learn(e, &facts);
                self.engine.publish(|| {
                    let mut v = named_inode_changed(parent, name, r.ino);
                    if let Some((hour, tname)) = &trashed {
                        v.extend(trash::arrival_changes(*hour, tname));
                    }
                    v
                })
            })
            .inspect_err(|err| self.failed_move(err, &[(parent, name)]))
    }

    /// rmdir(2): the empty directory goes, or to the trash (if `to_trash` and the volume
    /// keeps one).
    pub(crate) fn remove_dir(
        &self,
        _ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        to_trash: bool,
    ) -> Result<()> {
        check_len(name)?;
        if name == b"." {
            return sys(libc::EINVAL);
        }
        if name == b".." {
            return sys(libc::ENOTEMPTY);
        }
        let (bin, lock) = self.deletion_bin(parent, name, to_trash)?;
        let mut trashed: Option<(Ino, Vec<u8>, Attr)> = None;
        let e = self.epoch();
        let mut after = None;
        let hints = self.entry_hints(parent, name, true, bin);
        self.engine
            .write_entry(&lock, &hints, |tx| {
                trashed = None;
                let mut p = Self::parent_dir(tx, parent)?;
                let Some((eid, mut a)) = tx.lock_entry(parent, name)? else {
                    return fail(libc::ENOENT);
                };
                if a.kind != Kind::Dir {
                    return fail(libc::ENOTDIR);
                }
                check_dir_change(&p, true)?;
                check_protected(&a)?;
                if !tx.dir_is_empty(a.ino)? {
                    return fail(libc::ENOTEMPTY);
                }
                self.quota_charge(tx, parent, (0, -1))?;
                let now = now_nanos();
                p.mtime = now;
                p.ctime = now;
                if let Some(b) = Self::trashes_from(bin, &p) {
                    let tname = Self::trash_move(tx, b, Some(eid), &mut p, &mut a, name, now)?;
                    tx.update_node(&p)?;
                    trashed = Some((b.hour, tname, a));
                    after = Some((p, 0));
                    return Ok(());
                }
                p.nlink = p.nlink.saturating_sub(1);
                let open = tx.remove_entry(eid, &p, a.ino)?;
                a.nlink = 0;
                a.ctime = now;
                self.release(tx, &a, open, now)?;
                after = Some((p, a.ino));
                Ok(())
            })
            .inspect(|_| {
                if let Some((p, gone)) = after.take() {
                    let mut facts = vec![Fact::Name(parent, name.to_vec(), None), Fact::Attr(p)];
                    match &trashed {
                        Some((hour, tname, a)) => {
                            facts.push(Fact::Stale(a.ino));
                            facts.push(Fact::Attr(a.clone()));
                            facts.extend(trash::arrived(*hour, tname, a.ino));
                        }
                        None => facts.push(Fact::Gone(gone)),
                    }
                    self.cache.learn(e, &facts);
                }
                self.engine.publish(|| {
                    let mut v = vec![entry_changed(parent, name), attr_changed(parent)];
                    if let Some((hour, tname, a)) = &trashed {
                        v.extend(trash::arrival_changes(*hour, tname));
                        v.push(attr_changed(a.ino));
                    }
                    v
                })
            })
            .inspect_err(|err| self.failed_move(err, &[(parent, name)]))
    }

    pub(super) fn lookup(&self, _ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr> {
        check_len(name)?;
        if name == b"." {
            return self.getattr(parent);
        }
        if name == b".." {
            return self.engine.read(|tx| {
                let p = tx.get_node(parent)?;
                tx.get_node(p.parent.max(ROOT_INO))
            });
        }
        if parent == ROOT_INO && name == trash::TRASH_NAME {
            // Known from now on: nothing may be made in the trash's own directories.
            self.trash_ino()?;
        }
        let e = self.epoch();
        if e.is_some() {
            match self.cache.name(parent, name) {
                Some(None) => return sys(libc::ENOENT),
                Some(Some(ino)) => {
                    if let Some(a) = self.cache.attr(ino) {
                        return Ok(a);
                    }
                }
                None => {}
            }
        }
        let res = self.engine.read(|tx| tx.find(parent, name));
        match &res {
            Ok(a) => self.cache.fill(
                e,
                &[
                    Fact::Name(parent, name.to_vec(), Some(a.ino)),
                    Fact::Attr(a.clone()),
                ],
            ),
            Err(err) if err.errno() == libc::ENOENT => self
                .cache
                .fill(e, &[Fact::Name(parent, name.to_vec(), None)]),
            Err(_) => {}
        }
        res
    }

    pub(super) fn link(&self, _ctx: &Ctx, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        if parent == ROOT_INO && name == trash::TRASH_NAME {
            return sys(libc::EEXIST);
        }
        let e = self.epoch();
        let mut after = None;
        self.engine
            .write_grouped(&[ino, parent], false, |tx| {
                let (mut a, mut p) = tx.lock_two(ino, parent)?;
                if a.kind == Kind::Dir {
                    return fail(libc::EPERM);
                }
                if a.nlink == 0 {
                    return fail(libc::ENOENT);
                }
                if p.kind != Kind::Dir {
                    return fail(libc::ENOTDIR);
                }
                if p.nlink == 0 {
                    return fail(libc::ENOENT);
                }
                if tx.get_edge(parent, name)?.is_some() {
                    return fail(libc::EEXIST);
                }
                self.check_not_trash(&p)?;
                check_protected(&a)?;
                check_dir_change(&p, false)?;
                if a.nlink >= u32::MAX - 1 {
                    return fail(libc::EMLINK);
                }
                let now = now_nanos();
                tx.insert_edge(parent, name, ino, a.kind)?;
                self.quota_charge(tx, parent, quota::entry_use(&a))?;
                a.nlink += 1;
                a.ctime = now;
                tx.update_node(&a)?;
                p.mtime = now;
                p.ctime = now;
                tx.update_node(&p)?;
                after = Some(p);
                Ok(a)
            })
            .inspect(|r| {
                let mut facts = vec![
                    Fact::Attr(r.clone()),
                    Fact::Name(parent, name.to_vec(), Some(r.ino)),
                ];
                facts.extend(after.take().map(Fact::Attr));
                self.cache.learn(e, &facts);
                self.engine
                    .publish(|| named_inode_changed(parent, name, r.ino))
            })
            .inspect_err(|_| {
                self.failed(&[(parent, name)]);
                self.cache.learn(None, &[Fact::Stale(ino)]);
            })
    }

    pub(super) fn unlink(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr> {
        match self.remove(ctx, parent, name, true) {
            // The trash's hour directory went meanwhile: made again.
            Err(e) if e.errno() == libc::ESTALE => self.remove(ctx, parent, name, true),
            r => r,
        }
    }

    pub(super) fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        match self.remove_dir(ctx, parent, name, true) {
            // The trash's hour directory went meanwhile: made again.
            Err(e) if e.errno() == libc::ESTALE => self.remove_dir(ctx, parent, name, true),
            r => r,
        }
    }

    pub(super) fn rename(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<Option<Attr>> {
        check_len(name)?;
        check_name(new_name)?;
        if flags.exchange && (flags.noreplace || flags.whiteout) {
            return sys(libc::EINVAL);
        }
        if (parent == ROOT_INO && name == trash::TRASH_NAME)
            || (new_parent == ROOT_INO && new_name == trash::TRASH_NAME)
        {
            return sys(libc::EPERM);
        }
        let whiteout = if flags.whiteout {
            Some(self.alloc(&self.inos, "nextInode")?)
        } else {
            None
        };
        let bin = self.bin()?;
        let mut lock = vec![parent, new_parent];
        lock.extend(bin.map(|b| b.hour));
        let mut trashed: Option<(Ino, Vec<u8>)> = None;
        // Moves between directories take the rename lock: one at a time (check_not_below).
        let cross = parent != new_parent;
        let e = self.epoch();
        let mut moved = None;
        self.engine
            .write_grouped(&lock, cross, |tx| {
                trashed = None;
                let now = now_nanos();
                let (p1, p2) = tx.lock_two(parent, new_parent)?;
                for p in [&p1, &p2] {
                    if p.kind != Kind::Dir {
                        return fail(libc::ENOTDIR);
                    }
                    if p.nlink == 0 {
                        return fail(libc::ENOENT);
                    }
                }
                self.check_not_trash(&p2)?;
                let Some((src_eid, src_ino)) = tx.get_edge(parent, name)? else {
                    return fail(libc::ENOENT);
                };
                let dst_edge = tx.get_edge(new_parent, new_name)?;
                moved = Some((src_ino, dst_edge.map(|d| d.1)));
                let (src, dst) = match dst_edge {
                    Some((dst_eid, dst_ino)) if dst_ino != src_ino => {
                        let (s, d) = tx.lock_two(src_ino, dst_ino)?;
                        (s, Some((dst_eid, d)))
                    }
                    // The same inode under both names (hard links): nothing to do.
                    Some(_) => {
                        tx.lock_node(src_ino)?;
                        if flags.noreplace {
                            return fail(libc::EEXIST);
                        }
                        return Ok(None);
                    }
                    None => (tx.lock_node(src_ino)?, None),
                };
                check_dir_change(&p1, true)?;
                check_dir_change(&p2, dst.is_some())?;
                check_protected(&src)?;
                if let Some((_, d)) = &dst {
                    check_protected(d)?;
                }
                let moved_attrs = self
                    .quotas_kept()
                    .then(|| (src.clone(), dst.as_ref().map(|d| d.1.clone())));
                if flags.exchange {
                    let Some(dst) = dst else {
                        return fail(libc::ENOENT);
                    };
                    Self::exchange(tx, (p1, p2), (src_eid, src), dst, now)?;
                    if let Some((s, d)) = &moved_attrs {
                        self.quota_rename(tx, (parent, new_parent), s, d.as_ref(), true)?;
                    }
                    return Ok(None);
                }
                let victim = self.move_entry(
                    tx,
                    (p1, p2),
                    (src_eid, src),
                    dst,
                    new_parent,
                    new_name,
                    flags.noreplace,
                    now,
                    (bin, &mut trashed),
                )?;
                if let Some((s, d)) = &moved_attrs {
                    self.quota_rename(tx, (parent, new_parent), s, d.as_ref(), false)?;
                }
                if let Some(ino) = whiteout {
                    let w = new_node(ino, Kind::CharDev, 0, (ctx.uid, ctx.gid), parent, now);
                    tx.create_entry(&w, parent, name)?;
                    tx.charge(0, 1, 0, self.format.read().inodes)?;
                    self.quota_charge(tx, parent, (0, 1))?;
                }
                Ok(victim)
            })
            .inspect(|r| {
                let mut facts = Self::renamed(
                    moved,
                    flags,
                    whiteout,
                    r,
                    (parent, name),
                    (new_parent, new_name),
                );
                if let (Some((hour, tname)), Some(v)) = (&trashed, r) {
                    facts.extend(trash::arrived(*hour, tname, v.ino));
                }
                self.cache.learn(e, &facts);
                self.engine.publish(|| {
                    let mut v = vec![
                        entry_changed(parent, name),
                        entry_changed(new_parent, new_name),
                        attr_changed(parent),
                        attr_changed(new_parent),
                    ];
                    v.extend(r.iter().map(|a| attr_changed(a.ino)));
                    if let Some((hour, tname)) = &trashed {
                        v.extend(trash::arrival_changes(*hour, tname));
                    }
                    v
                })
            })
            .inspect_err(|err| self.failed_move(err, &[(parent, name), (new_parent, new_name)]))
    }

    pub(super) fn readdir(
        &self,
        ino: Ino,
        cookie: u64,
        limit: usize,
        plus: bool,
    ) -> Result<Vec<DirEntry>> {
        // Asked again before anything changed (rm -rf opens each directory twice): the
        // page read then. Only while other clients' changes are pushed (PostgreSQL), each
        // moving the epoch: a lone SQLite client learns of another process's commit at its
        // next read of the engine, which a page answered from memory would skip (an NFS
        // server beside a mount listed a name the mount had renamed), and a listing there
        // costs no round trip.
        let e = if self.pushed.load(Ordering::Acquire) {
            self.epoch()
        } else {
            None
        };
        let key = PageKey {
            dir: ino,
            cookie,
            limit,
            plus,
        };
        let first = e.is_some() && cookie == 0 && limit > 1;
        if first {
            self.cache.listed(ino);
        }
        if e.is_some()
            && let Some(page) = self.cache.page(key)
        {
            return Ok(page);
        }
        let dot = cookie < 1 && limit > 0;
        let dotdot = cookie < 2 && limit > usize::from(dot);
        let want = limit - usize::from(dot) - usize::from(dotdot);
        let after = cookie.saturating_sub(2) as i64;
        // The first page with attributes of a directory whose parent was just listed (a
        // walk's): the first pages of the directories below are read with it, where the
        // engine can in the same read, and kept; from the directory's own entry in its
        // parent on when the parent's page tells where that is (its next siblings then come
        // with it). Not for any listing: an `ls -l` of one directory would carry its
        // subdirectories' pages for nothing.
        let walk = match first && plus {
            true => self
                .cache
                .attr(ino)
                .map(|a| a.parent)
                .filter(|p| *p != ino && self.cache.listed_lately(*p)),
            false => None,
        };
        if let Some(parent) = walk
            && let Some(c) = self.cache.cookie_in(parent, ino)
        {
            let from = c.saturating_sub(2) as i64;
            let tree = self
                .engine
                .snapshot(|tx| tx.read_dir_tree(parent, want as i64, TREE_DIRS, from))?;
            if let Some((top, below)) = tree {
                self.keep_below(e, &top.0, &below, limit);
                if let Some(page) = self.cache.page(key) {
                    return Ok(page);
                }
            }
        }
        let tree = match walk {
            Some(_) => self
                .engine
                .snapshot(|tx| tx.read_dir_tree(ino, want as i64, TREE_DIRS, 0))?,
            None => None,
        };
        let (dir, pattr, listed) = match tree {
            Some((first, below)) => {
                self.keep_below(e, &first.0, &below, limit);
                first
            }
            None => self
                .engine
                .snapshot(|tx| tx.read_dir(ino, plus && dotdot, after, want as i64, plus))?,
        };
        let mut out = Vec::new();
        if dot {
            out.push(DirEntry {
                name: b".".to_vec(),
                ino,
                kind: Kind::Dir,
                cookie: 1,
                attr: plus.then(|| dir.clone()),
            });
        }
        if dotdot {
            out.push(DirEntry {
                name: b"..".to_vec(),
                ino: dir.parent.max(ROOT_INO),
                kind: Kind::Dir,
                cookie: 2,
                attr: pattr,
            });
        }
        // The trash is reached by its name, never listed: `find`, `du` and `rm -rf` of the
        // root pass it by.
        out.extend(
            listed
                .into_iter()
                .filter(|e| ino != ROOT_INO || e.name != trash::TRASH_NAME),
        );
        self.cache.fill_page(e, key, &out);
        // The directories listed, known (a walk descends into them next: see `walk`).
        let facts: Vec<Fact> = out
            .iter()
            .filter(|d| d.kind == Kind::Dir && d.name != b"." && d.name != b"..")
            .filter_map(|d| Some(Fact::Attr(d.attr.clone()?)))
            .collect();
        self.cache.fill(e, &facts);
        Ok(out)
    }

    /// Keeps the first pages of the directories read below `top` (as `readdir` would answer
    /// them with attributes, `limit` entries at most), and what they teach of names and
    /// attributes.
    fn keep_below(&self, e: Option<u64>, top: &Attr, below: &[SubDir], limit: usize) {
        let mut attrs: HashMap<Ino, &Attr> = HashMap::new();
        attrs.insert(top.ino, top);
        for s in below {
            attrs.insert(s.attr.ino, &s.attr);
        }
        let mut facts = vec![Fact::Attr(top.clone())];
        for s in below {
            let up = s.attr.parent.max(ROOT_INO);
            let Some(pattr) = attrs.get(&up) else {
                continue;
            };
            let mut page = Vec::with_capacity(s.entries.len() + 2);
            page.push(DirEntry {
                name: b".".to_vec(),
                ino: s.attr.ino,
                kind: Kind::Dir,
                cookie: 1,
                attr: Some(s.attr.clone()),
            });
            page.push(DirEntry {
                name: b"..".to_vec(),
                ino: up,
                kind: Kind::Dir,
                cookie: 2,
                attr: Some((*pattr).clone()),
            });
            page.extend(s.entries.iter().cloned());
            facts.push(Fact::Attr(s.attr.clone()));
            for en in &s.entries {
                facts.push(Fact::Name(s.attr.ino, en.name.clone(), Some(en.ino)));
                facts.extend(en.attr.clone().map(Fact::Attr));
            }
            let key = PageKey {
                dir: s.attr.ino,
                cookie: 0,
                limit,
                plus: true,
            };
            self.cache.fill_page(e, key, &page);
        }
        self.cache.fill(e, &facts);
    }

    pub(super) fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.engine.read(|tx| match tx.symlink(ino)? {
            Some(t) => Ok(t),
            None => {
                tx.get_node(ino)?;
                fail(libc::EINVAL)
            }
        })
    }
}
