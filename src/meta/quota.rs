//! Directory quotas (`unkai quota`): what a directory's tree may hold, kept exact in the
//! transactions that change it.
//!
//! What counts: every entry below the directory (the directory itself not counted) counts
//! one inode, and a regular file's entry also its length rounded up to 4 KiB, as the volume's
//! usage counts it (a sparse file counts at its length). A file with several names counts once
//! per name, as in JuiceFS. An entry moved to the trash has left its directory: it no longer
//! counts in any directory quota (the root cannot have one; the volume's own limits,
//! `config --capacity/--inodes`, count the trash until it is purged).
//!
//! Every transaction that adds or removes an entry, moves one between directories or changes
//! a file's length adds the change to the quotas of the directories it lies in (its own and
//! its ancestors': [`EngineMeta::quota_chain`]), in the same transaction, and fails with
//! EDQUOT when a growth passes a limit; nothing of it is then committed. A quota row is
//! updated with its row lock held until commit, so that clients racing to a limit on a
//! PostgreSQL volume take turns and none passes it. A rename between directories under
//! different quotas moves the usage of the whole subtree (counted then, as JuiceFS does).
//!
//! Clients keep quotas only while the volume's settings say some directory has one
//! (`Format::quotas`, re-read at each heartbeat), so a volume without quotas pays nothing.
//!
//! Not for: parsing paths or limits (`admin::quota`), the volume's own limits (`Txn::charge`).

use super::engine::{Engine, TxResult, Txn, fail};
use super::ops::{EngineMeta, align4k, parse_format};
use super::{Attr, Ino, Kind, Quota, ROOT_INO, Summary};

/// What an entry counts in a quota: (bytes, inodes).
pub type Use = (i64, i64);

/// What one entry counts, its subtree not included.
pub fn entry_use(a: &Attr) -> Use {
    match a.kind {
        Kind::File => (align4k(a.length), 1),
        _ => (0, 1),
    }
}

fn neg((b, i): Use) -> Use {
    (-b, -i)
}

/// The quota directories among `dirs` that `dir` lies in (itself or an ancestor), nearest
/// first.
fn chain_of(tx: &mut dyn Txn, dirs: &[Ino], dir: Ino) -> TxResult<Vec<Ino>> {
    let mut out = Vec::new();
    if dirs.is_empty() {
        return Ok(out);
    }
    let mut cur = dir;
    for _ in 0..100_000 {
        if dirs.contains(&cur) {
            out.push(cur);
        }
        if cur == ROOT_INO || cur == 0 {
            return Ok(out);
        }
        cur = tx.get_node(cur)?.parent;
    }
    Err(super::engine::corrupt("directory tree has a cycle".into()))
}

/// Adds `u` to each quota of `chain`; EDQUOT if what grows passes its limit.
fn apply(tx: &mut dyn Txn, chain: &[Ino], (bytes, inodes): Use) -> TxResult<()> {
    if bytes == 0 && inodes == 0 {
        return Ok(());
    }
    for q in chain {
        if let Some(now) = tx.quota_add(*q, bytes, inodes)? {
            if over(&now, bytes, inodes) {
                return fail(libc::EDQUOT);
            }
        }
    }
    Ok(())
}

/// Whether a quota that grew by (`bytes`, `inodes`) is now past a limit.
fn over(q: &Quota, bytes: i64, inodes: i64) -> bool {
    (bytes > 0 && q.max_bytes > 0 && q.used_bytes > q.max_bytes as i64)
        || (inodes > 0 && q.max_inodes > 0 && q.used_inodes > q.max_inodes as i64)
}

/// What a directory's tree holds, as its quota counts it (the directory itself not counted).
pub(crate) fn tree_use(tx: &mut dyn Txn, dir: Ino) -> TxResult<Use> {
    let s = tree_summary(tx, dir)?;
    Ok((s.size as i64, s.entries() as i64))
}

/// What a directory's tree holds: an aggregate in the database per directory.
pub(crate) fn tree_summary(tx: &mut dyn Txn, dir: Ino) -> TxResult<Summary> {
    let mut total = Summary::default();
    let mut todo = vec![dir];
    while let Some(d) = todo.pop() {
        let (s, subdirs) = tx.dir_summary(d)?;
        total.add(&s);
        todo.extend(subdirs);
    }
    Ok(total)
}

/// What an entry counts with its subtree (a directory's tree and the directory's own entry).
fn subtree_use(tx: &mut dyn Txn, a: &Attr) -> TxResult<Use> {
    let own = entry_use(a);
    if a.kind != Kind::Dir {
        return Ok(own);
    }
    let (b, i) = tree_use(tx, a.ino)?;
    Ok((b + own.0, i + own.1))
}

/// A directory's path from the root, through the names of it and its ancestors.
pub(crate) fn dir_path(tx: &mut dyn Txn, dir: Ino) -> TxResult<Vec<u8>> {
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut cur = dir;
    for _ in 0..100_000 {
        if cur == ROOT_INO {
            let mut path = Vec::new();
            for p in parts.iter().rev() {
                path.push(b'/');
                path.extend_from_slice(p);
            }
            if path.is_empty() {
                path.push(b'/');
            }
            return Ok(path);
        }
        let d = tx.get_node(cur)?;
        let Some(name) = tx.name_in(d.parent, cur)? else {
            return fail(libc::ENOENT);
        };
        parts.push(name);
        cur = d.parent;
    }
    fail(libc::ELOOP)
}

/// Sets `Format::quotas` in the stored settings; whether it changed.
fn store_quotas_flag(tx: &mut dyn Txn, on: bool) -> TxResult<bool> {
    let json = tx
        .setting("format")?
        .ok_or_else(|| super::engine::corrupt("the volume's settings are missing".into()))?;
    let mut f =
        parse_format(&json, "the volume").map_err(|e| super::engine::corrupt(e.to_string()))?;
    if f.quotas == on {
        return Ok(false);
    }
    f.quotas = on;
    tx.set_setting(
        "format",
        &serde_json::to_string(&f).expect("format serializes"),
    )?;
    Ok(true)
}

impl<E: Engine> EngineMeta<E> {
    /// Whether this client keeps quotas' usage (some directory of the volume has a quota).
    pub(crate) fn quotas_kept(&self) -> bool {
        self.format.read().quotas
    }

    /// The quotas `dir` lies in (its own and its ancestors'), nearest first; none when the
    /// volume keeps no quotas.
    pub(crate) fn quota_chain(&self, tx: &mut dyn Txn, dir: Ino) -> TxResult<Vec<Ino>> {
        if !self.quotas_kept() {
            return Ok(Vec::new());
        }
        let dirs = tx.quota_dirs()?;
        chain_of(tx, &dirs, dir)
    }

    /// An entry was added to `dir` (`u` positive) or left it (negative): counted in the
    /// quotas `dir` lies in; EDQUOT if a growth passes a limit.
    pub(crate) fn quota_charge(&self, tx: &mut dyn Txn, dir: Ino, u: Use) -> TxResult<()> {
        if !self.quotas_kept() || u == (0, 0) {
            return Ok(());
        }
        let chain = self.quota_chain(tx, dir)?;
        apply(tx, &chain, u)
    }

    /// A file's length (4 KiB-rounded) changed by `grown` bytes: counted for each of its names.
    pub(crate) fn quota_file_grew(&self, tx: &mut dyn Txn, ino: Ino, grown: i64) -> TxResult<()> {
        if !self.quotas_kept() || grown == 0 {
            return Ok(());
        }
        let dirs = tx.quota_dirs()?;
        if dirs.is_empty() {
            return Ok(());
        }
        for parent in tx.link_parents(ino)? {
            let chain = chain_of(tx, &dirs, parent)?;
            apply(tx, &chain, (grown, 0))?;
        }
        Ok(())
    }

    /// A rename moved `src` from directory `from` to `to` (and `dst` the other way for an
    /// exchange, or out of the tree as the replaced entry): the quotas of one side and not the
    /// other lose or gain what moved. Losses first, so that a move within limits never fails.
    pub(crate) fn quota_rename(
        &self,
        tx: &mut dyn Txn,
        (from, to): (Ino, Ino),
        src: &Attr,
        dst: Option<&Attr>,
        exchange: bool,
    ) -> TxResult<()> {
        if !self.quotas_kept() {
            return Ok(());
        }
        let dirs = tx.quota_dirs()?;
        if dirs.is_empty() {
            return Ok(());
        }
        let c1 = chain_of(tx, &dirs, from)?;
        let c2 = chain_of(tx, &dirs, to)?;
        let only = |a: &[Ino], b: &[Ino]| -> Vec<Ino> {
            a.iter().filter(|q| !b.contains(q)).copied().collect()
        };
        let (out1, in2) = (only(&c1, &c2), only(&c2, &c1));
        let mut changes: Vec<(Vec<Ino>, Use)> = Vec::new();
        match (dst, exchange) {
            (Some(d), false) => changes.push((c2.clone(), neg(entry_use(d)))),
            (Some(d), true) if !out1.is_empty() || !in2.is_empty() => {
                let u = subtree_use(tx, d)?;
                changes.push((in2.clone(), neg(u)));
                changes.push((out1.clone(), u));
            }
            _ => {}
        }
        if !out1.is_empty() || !in2.is_empty() {
            let u = subtree_use(tx, src)?;
            changes.push((out1, neg(u)));
            changes.push((in2, u));
        }
        changes.sort_by_key(|(_, (b, i))| (*b > 0) || (*i > 0));
        for (chain, u) in changes {
            apply(tx, &chain, u)?;
        }
        Ok(())
    }

    /// Whether a write could pass a limit: the volume has a capacity or quotas.
    pub(crate) fn limited(&self) -> bool {
        let f = self.format.read();
        f.capacity > 0 || f.quotas
    }

    /// Whether `bytes` more of file `ino` fit the volume's capacity and the quotas of its
    /// directories, as they stand now (ENOSPC, EDQUOT if not); the room left after them.
    /// Read-only: the transaction that stores the file checks again, exactly.
    pub(crate) fn room_for(&self, ino: Ino, bytes: u64) -> super::Result<u64> {
        let (cap, quotas) = {
            let f = self.format.read();
            (f.capacity, f.quotas)
        };
        let need = align4k(bytes);
        self.engine.read(|tx| {
            let mut left = u64::MAX;
            if cap > 0 {
                let used = tx
                    .row(
                        "SELECT value FROM unkai_counter WHERE name = 'usedSpace'",
                        &[],
                    )?
                    .map(|r| r.int(0))
                    .transpose()?
                    .unwrap_or(0);
                let room = cap as i64 - used - need;
                if room < 0 {
                    return fail(libc::ENOSPC);
                }
                left = left.min(room as u64);
            }
            if quotas {
                let all = tx.quotas()?;
                let dirs: Vec<Ino> = all.iter().map(|q| q.ino).collect();
                for parent in tx.link_parents(ino)? {
                    for d in chain_of(tx, &dirs, parent)? {
                        let Some(q) = all.iter().find(|q| q.ino == d) else {
                            continue;
                        };
                        if q.max_bytes > 0 {
                            let room = q.max_bytes as i64 - q.used_bytes - need;
                            if room < 0 {
                                return fail(libc::EDQUOT);
                            }
                            left = left.min(room as u64);
                        }
                    }
                }
            }
            Ok(left)
        })
    }

    /// Every quota.
    pub(crate) fn list_quotas(&self) -> super::Result<Vec<Quota>> {
        self.engine.read(|tx| tx.quotas())
    }

    /// Sets a directory's limits (None keeps what it has; a new quota counts its tree first)
    /// and makes every client keep quotas.
    pub(crate) fn put_quota(
        &self,
        dir: Ino,
        max_bytes: Option<u64>,
        max_inodes: Option<u64>,
    ) -> super::Result<Quota> {
        if dir == ROOT_INO {
            return Err(super::Error::Refused(
                "the root's limits are the volume's: use `unkai config --capacity SIZE --inodes N`"
                    .into(),
            ));
        }
        let q = self.engine.write(&[dir], false, |tx| {
            let a = tx.lock_node(dir)?;
            if a.kind != Kind::Dir {
                return fail(libc::ENOTDIR);
            }
            if a.nlink == 0 {
                return fail(libc::ENOENT);
            }
            store_quotas_flag(tx, true)?;
            let cur = tx.quotas()?.into_iter().find(|q| q.ino == dir);
            let mut q = match cur {
                Some(q) => q,
                None => {
                    let (used_bytes, used_inodes) = tree_use(tx, dir)?;
                    Quota {
                        ino: dir,
                        used_bytes,
                        used_inodes,
                        ..Quota::default()
                    }
                }
            };
            q.max_bytes = max_bytes.unwrap_or(q.max_bytes);
            q.max_inodes = max_inodes.unwrap_or(q.max_inodes);
            tx.put_quota(&q)?;
            Ok(q)
        })?;
        self.format.write().quotas = true;
        Ok(q)
    }

    /// Turns the keeping of quotas on for every client (before the first quota is set:
    /// see `admin::quota`); whether it was off.
    pub(crate) fn start_quotas(&self) -> super::Result<bool> {
        let changed = self
            .engine
            .write(&[], false, |tx| store_quotas_flag(tx, true))?;
        self.format.write().quotas = true;
        Ok(changed)
    }

    /// Deletes a directory's quota; whether it had one. The last one gone, clients stop
    /// keeping quotas.
    pub(crate) fn remove_quota(&self, dir: Ino) -> super::Result<bool> {
        let (had, none_left) = self.engine.write(&[], false, |tx| {
            let had = tx.delete_quota(dir)?;
            let none_left = tx.quota_dirs()?.is_empty();
            if none_left {
                store_quotas_flag(tx, false)?;
            }
            Ok((had, none_left))
        })?;
        if none_left {
            self.format.write().quotas = false;
        }
        Ok(had)
    }

    /// Counts a directory's tree as its quota counts it: (the quota as stored, what the tree
    /// holds); with `repair`, the count becomes the quota's usage (in one transaction, so
    /// nothing another client changes meanwhile is lost).
    pub(crate) fn recount_quota(
        &self,
        dir: Ino,
        repair: bool,
    ) -> super::Result<(Option<Quota>, Use)> {
        let count = |tx: &mut dyn Txn| -> TxResult<(Option<Quota>, Use)> {
            let q = tx.quotas()?.into_iter().find(|q| q.ino == dir);
            if repair && q.is_some() {
                // Holds the row: a change counted elsewhere waits for this count.
                tx.quota_add(dir, 0, 0)?;
            }
            let used = tree_use(tx, dir)?;
            if let (true, Some(q)) = (repair, q) {
                tx.put_quota(&Quota {
                    used_bytes: used.0,
                    used_inodes: used.1,
                    ..q
                })?;
            }
            Ok((q, used))
        };
        if repair {
            self.engine.write(&[dir], false, count)
        } else {
            self.engine.snapshot(count)
        }
    }
}
