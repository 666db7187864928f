//! The trash: files and directories deleted (or replaced by a rename) are kept for the
//! volume's `trash_days` in `/.trash/YYYY-MM-DD-HH/` (the hour, UTC, of the deletion) under
//! the name `PARENT-INO-NAME`, each with its origin (`PARENT/NAME`) in the xattr
//! [`ORIGIN`], and purged once expired.
//!
//! Moving an entry into the trash is part of the deleting operation's own transaction (`ops`
//! calls [`EngineMeta::trash_move`]); the trash's directories are made beforehand, once an
//! hour per client. Reading [`ORIGIN`] answers the whole original path, resolved at that
//! moment through the parents (themselves maybe in the trash), which is what `unkai
//! restore` needs; a deletion stores only the parent's inode and the name, so it costs one
//! xattr row more, not a walk up the tree.
//!
//! Purging: expired hours at each heartbeat ([`EngineMeta::purge_expired`]), and, when a
//! mount finds the disk under a local bucket short of room, the oldest entries before their
//! time ([`EngineMeta::purge_early`]: one client at a time, counted in the volume).
//!
//! Not for: restoring (the `restore` command renames through the mount, so every client's
//! caches follow), deciding who may read what is in the trash (the modes of what it holds,
//! and the kernel), or deciding when a disk is short of room (`vfs::background`, `data::room`).

use std::sync::atomic::Ordering;

use super::cache::Fact;
use super::engine::{Engine, TxResult, Txn, fail};
use super::ops::{EngineMeta, attr_changed, entry_changed, new_node};
use super::*;

/// The trash's name in the root directory (hidden from the root's listing).
pub const TRASH_NAME: &[u8] = b".trash";

/// The xattr holding where a trashed entry was: `PARENT-INODE/NAME` as stored; read, the
/// whole original path.
pub const ORIGIN: &[u8] = b"trusted.unkai.origin";

const HOUR_NANOS: i64 = 3_600_000_000_000;

/// The setting naming the client purging the trash early, and until when its claim holds:
/// `SESSION:NANOS` (empty: nobody). A mount's business, not the volume's: never dumped.
pub const PURGER: &str = "trashPurger";
/// How long a claim to purge early holds (it is given back at the end of each round).
const PURGER_LEASE: i64 = 60 * 1_000_000_000;

/// The name of the hour directory of time `t` (ns): `YYYY-MM-DD-HH`, UTC.
pub fn hour_name(t: Nanos) -> String {
    let secs = t.div_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let hour = secs.rem_euclid(86_400) / 3600;
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}-{hour:02}")
}

/// When the hour named `name` began (ns), if it is an hour directory's name.
pub fn parse_hour(name: &[u8]) -> Option<Nanos> {
    let s = std::str::from_utf8(name).ok()?;
    let mut it = s.split('-');
    let mut num = |len: usize| -> Option<i64> {
        let p = it.next()?;
        (p.len() == len && p.bytes().all(|b| b.is_ascii_digit())).then(|| p.parse().ok())?
    };
    let (y, m, d, h) = (num(4)?, num(2)?, num(2)?, num(2)?);
    if it.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) || h > 23 {
        return None;
    }
    Some((days_from_civil(y, m, d) * 86_400 + h * 3600) * 1_000_000_000)
}

/// The name of a trashed entry: `PARENT-INODE-NAME`, cut to 255 bytes.
pub fn entry_name(parent: Ino, ino: Ino, name: &[u8]) -> Vec<u8> {
    let mut out = format!("{parent}-{ino}-").into_bytes();
    let room = 255usize.saturating_sub(out.len());
    out.extend_from_slice(&name[..name.len().min(room)]);
    out
}

// Howard Hinnant's algorithms for the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// What the cache learns when `ino` arrived in the hour directory `hour` as `name`.
pub(crate) fn arrived(hour: Ino, name: &[u8], ino: Ino) -> [Fact; 2] {
    [
        Fact::Stale(hour),
        Fact::Name(hour, name.to_vec(), Some(ino)),
    ]
}

/// What other clients are told of that arrival.
pub(crate) fn arrival_changes(hour: Ino, name: &[u8]) -> [Change; 2] {
    [entry_changed(hour, name), attr_changed(hour)]
}

/// Where a deletion sends an entry: the trash's inode and the hour directory's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bin {
    pub trash: Ino,
    pub hour: Ino,
}

impl<E: Engine> EngineMeta<E> {
    /// The trash's inode, if the volume has one (looked up once, then remembered: the trash
    /// is never deleted).
    pub(crate) fn trash_ino(&self) -> Result<Option<Ino>> {
        let known = self.trash.load(Ordering::Acquire);
        if known != 0 {
            return Ok(Some(known));
        }
        let found = self
            .engine
            .read(|tx| tx.get_edge(ROOT_INO, TRASH_NAME))?
            .map(|(_, i)| i);
        if let Some(i) = found {
            self.trash.store(i, Ordering::Release);
        }
        Ok(found)
    }

    /// The bin of this hour, made if missing; `None` while the volume keeps no trash.
    pub(crate) fn bin(&self) -> Result<Option<Bin>> {
        if self.format.read().trash_days == 0 {
            return Ok(None);
        }
        let now = now_nanos();
        let name = hour_name(now);
        if let Some((h, b)) = &*self.bin.lock() {
            if *h == name {
                return Ok(Some(*b));
            }
        }
        let made = match self.make_bin(name.as_bytes()) {
            Ok(b) => b,
            Err(Error::Refused(why)) => {
                tracing::warn!("no trash: {why}; deleted entries go for good");
                return Ok(None);
            }
            // Another client made them at the same moment: theirs are found now.
            Err(_) => self.make_bin(name.as_bytes())?,
        };
        *self.bin.lock() = Some((name, made));
        Ok(Some(made))
    }

    /// After a namespace change failed ([`Self::failed`]); ESTALE: the bin remembered was
    /// deleted under us, and is made again at the next deletion.
    pub(crate) fn failed_move(&self, err: &Error, names: &[(Ino, &[u8])]) {
        if err.errno() == libc::ESTALE {
            *self.bin.lock() = None;
        }
        self.failed(names)
    }

    fn make_bin(&self, hour: &[u8]) -> Result<Bin> {
        let trash = self.trash_ino()?;
        let (t_ino, h_ino) = (self.alloc_ino()?, self.alloc_ino()?);
        let e = self.epoch();
        let mut made = Vec::new();
        let bin = self.engine.write(&[ROOT_INO], false, |tx| {
            made.clear();
            let now = now_nanos();
            let trash = match trash.or(tx.get_edge(ROOT_INO, TRASH_NAME)?.map(|(_, i)| i)) {
                Some(t) => t,
                None => {
                    make_dir(tx, ROOT_INO, TRASH_NAME, t_ino, 0o555, now, &mut made)?;
                    t_ino
                }
            };
            if tx.get_node(trash)?.kind != Kind::Dir {
                return Err(Error::Refused(
                    "/.trash is not a directory (made before the trash existed): rename it".into(),
                )
                .into());
            }
            if let Some((_, h)) = tx.get_edge(trash, hour)? {
                return Ok(Bin { trash, hour: h });
            }
            // Sticky and open to all: owners may delete their own entries for good; nothing
            // can be created here (`ops` refuses), and listings show what the modes allow.
            make_dir(tx, trash, hour, h_ino, 0o1777, now, &mut made)?;
            Ok(Bin { trash, hour: h_ino })
        })?;
        self.trash.store(bin.trash, Ordering::Release);
        self.cache.learn(e, &made);
        self.engine.publish(|| {
            vec![
                entry_changed(ROOT_INO, TRASH_NAME),
                attr_changed(ROOT_INO),
                entry_changed(bin.trash, hour),
                attr_changed(bin.trash),
            ]
        });
        Ok(bin)
    }

    /// Whether entries deleted from `p` go to the trash: not those deleted inside it.
    pub(crate) fn trashes_from(bin: Option<Bin>, p: &Attr) -> Option<Bin> {
        bin.filter(|b| p.ino != b.trash && p.parent != b.trash)
    }

    /// Moves the entry `eid` (`name` in `p`, naming `a`, its last link) into the bin's hour
    /// directory, in the deleting operation's transaction. `p` is updated by the caller.
    /// Returns the entry's name there, for the caller's facts.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn trash_move(
        tx: &mut dyn Txn,
        bin: Bin,
        eid: Option<i64>,
        p: &mut Attr,
        a: &mut Attr,
        name: &[u8],
        now: Nanos,
    ) -> TxResult<Vec<u8>> {
        let h = match tx.lock_node(bin.hour) {
            Ok(h) if h.nlink > 0 => h,
            _ => return fail(libc::ESTALE),
        };
        let mut tname = entry_name(p.ino, a.ino, name);
        // The name is free when `a` has no other link: it names `a` (a name of the trash
        // says its parent and inode, and inodes are never reused), and an entry of `a` in the
        // trash would be another link. A directory has no other link; a file moved here has
        // none (a deletion trashes only a last link). Not looked up then: a change joining a
        // group could not have it answered without waiting for the server.
        let single = a.kind == Kind::Dir || a.nlink <= 1;
        if !single && tx.get_edge(bin.hour, &tname)?.is_some() {
            // The same inode trashed again within the hour (restored, then deleted).
            tname = entry_name(p.ino, a.ino, &[format!("{now}-").as_bytes(), name].concat());
        }
        match eid {
            Some(id) => tx.move_edge(id, bin.hour, &tname)?,
            None => tx.insert_edge(bin.hour, &tname, a.ino, a.kind)?,
        }
        let links = if a.kind == Kind::Dir {
            p.nlink = p.nlink.saturating_sub(1);
            a.parent = bin.hour;
            1
        } else {
            0
        };
        a.flags |= flags::TRASHED;
        a.ctime = now;
        tx.update_node(a)?;
        // Only its times and links: of `h`, as guessed, only that it is alive was checked.
        tx.touch_dir(&h, now, links)?;
        let mut origin = format!("{}/", p.ino).into_bytes();
        origin.extend_from_slice(name);
        tx.put_xattr(a.ino, ORIGIN, &origin)?;
        Ok(tname)
    }

    /// The whole original path of trashed inode `ino` (what reading [`ORIGIN`] answers).
    pub(crate) fn origin_path(&self, ino: Ino) -> Result<Vec<u8>> {
        self.engine.read(|tx| {
            let mut parts: Vec<Vec<u8>> = Vec::new();
            let Some(o) = tx.xattr(ino, ORIGIN)? else {
                return fail(libc::ENODATA);
            };
            let (mut dir, name) = split_origin(&o)?;
            parts.push(name);
            for _ in 0..4096 {
                if dir == ROOT_INO {
                    let mut path = Vec::new();
                    for p in parts.iter().rev() {
                        path.push(b'/');
                        path.extend_from_slice(p);
                    }
                    return Ok(path);
                }
                let d = tx.get_node(dir)?;
                // A directory in the trash: where it was; else its name in its parent.
                if let Some(o) = tx.xattr(dir, ORIGIN)? {
                    let (up, name) = split_origin(&o)?;
                    parts.push(name);
                    dir = up;
                    continue;
                }
                let Some(name) = tx.name_in(d.parent, dir)? else {
                    return fail(libc::ENOENT);
                };
                parts.push(name);
                dir = d.parent;
            }
            fail(libc::ELOOP)
        })
    }

    /// Deletes, for good, the hour directories of the trash older than `trash_days` (all of
    /// them at 0); returns how many entries went.
    pub(crate) fn purge_expired(&self) -> Result<u64> {
        let Some(trash) = self.trash_ino()? else {
            return Ok(0);
        };
        let days = self.format.read().trash_days as i64;
        let cutoff = now_nanos() - days * 24 * HOUR_NANOS;
        let mut gone = 0;
        for (name, ino, _) in self.entries(trash)? {
            let Some(start) = parse_hour(&name) else {
                continue;
            };
            if start + HOUR_NANOS > cutoff && days > 0 {
                continue;
            }
            gone += self.purge_tree(trash, &name, ino)?.entries;
        }
        Ok(gone)
    }

    /// Deletes for good the oldest entries of the trash until the files among them add up to
    /// `bytes` (see [`Meta::purge_trash_early`]), and counts them in the volume. One client at
    /// a time: a client claims the purge in the setting [`PURGER`] (or finds another's claim
    /// and does nothing: `None`), and gives it back when done; a claim that was not given
    /// back (its client died) lapses after [`PURGER_LEASE`].
    pub(crate) fn purge_early(&self, bytes: u64) -> Result<Option<Purged>> {
        let Some(trash) = self.trash_ino()? else {
            return Ok(Some(Purged::default()));
        };
        let me = self.session_id().to_string();
        if !self.claim_purge(&me)? {
            return Ok(None);
        }
        let mut done = Purged::default();
        let res = self.purge_oldest(trash, bytes, &mut done);
        // What went is counted, and the claim given back, even after an error midway.
        let counted = self.engine.write(&[], false, |tx| {
            if done.entries > 0 {
                tx.bump_counter("trashPurgedEarly", done.entries as i64)?;
                tx.bump_counter("trashPurgedEarlyBytes", done.bytes as i64)?;
            }
            let old = tx.setting(PURGER)?;
            if old
                .as_deref()
                .and_then(parse_claim)
                .is_some_and(|(who, _)| who == me)
            {
                tx.swap_setting(PURGER, old.as_deref(), "")?;
            }
            Ok(())
        });
        res?;
        counted?;
        Ok(Some(done))
    }

    /// Claims the early purge for client `me` unless another client's claim holds.
    fn claim_purge(&self, me: &str) -> Result<bool> {
        let now = now_nanos();
        self.engine.write(&[], false, |tx| {
            let old = tx.setting(PURGER)?;
            let free = old
                .as_deref()
                .and_then(parse_claim)
                .is_none_or(|(who, until)| who == me || until <= now);
            let claim = format!("{me}:{}", now + PURGER_LEASE);
            Ok(free && tx.swap_setting(PURGER, old.as_deref(), &claim)?)
        })
    }

    /// The oldest entries of the trash, for good, into `done`, until its bytes reach `bytes`:
    /// hour directories oldest first, and in each the entries by when they were deleted (their
    /// change time, which the deletion set). An hour directory emptied goes too, unless a
    /// client (its clock a little behind) may still be deleting into it.
    fn purge_oldest(&self, trash: Ino, bytes: u64, done: &mut Purged) -> Result<()> {
        let now = now_nanos();
        let mut hours: Vec<(Nanos, Vec<u8>, Ino)> = self
            .entries(trash)?
            .into_iter()
            .filter_map(|(name, ino, _)| parse_hour(&name).map(|t| (t, name, ino)))
            .collect();
        hours.sort();
        for (start, name, hour) in hours {
            let mut aged: Vec<(Nanos, Vec<u8>, Ino)> = Vec::new();
            let mut cookie = 2;
            loop {
                let page = self.readdir(hour, cookie, 1024, true)?;
                let Some(last) = page.last() else {
                    break;
                };
                cookie = last.cookie;
                aged.extend(
                    page.into_iter()
                        .filter(|e| e.name != b"." && e.name != b"..")
                        .map(|e| (e.attr.map_or(0, |a| a.ctime), e.name, e.ino)),
                );
            }
            aged.sort();
            let mut emptied = true;
            for (_, n, i) in aged {
                if done.bytes >= bytes {
                    emptied = false;
                    break;
                }
                let p = self.purge_tree(hour, &n, i)?;
                done.entries += p.entries;
                done.bytes += p.bytes;
            }
            if emptied && start + 2 * HOUR_NANOS < now {
                match self.remove_dir(&Ctx::ROOT, trash, &name, false) {
                    Ok(()) => {}
                    Err(e) if matches!(e.errno(), libc::ENOENT | libc::ENOTEMPTY) => {}
                    Err(e) => return Err(e),
                }
            }
            if done.bytes >= bytes {
                break;
            }
        }
        Ok(())
    }

    /// Every entry of directory `dir`: (name, inode, kind).
    fn entries(&self, dir: Ino) -> Result<Vec<(Vec<u8>, Ino, Kind)>> {
        let mut out = Vec::new();
        let mut cookie = 2;
        loop {
            let page = self.readdir(dir, cookie, 1024, false)?;
            let Some(last) = page.last() else {
                return Ok(out);
            };
            cookie = last.cookie;
            out.extend(
                page.into_iter()
                    .filter(|e| e.name != b"." && e.name != b"..")
                    .map(|e| (e.name, e.ino, e.kind)),
            );
        }
    }

    /// Deletes `name` (inode `ino`) of `parent` and all below it, bypassing the trash; returns
    /// the entries that went and the bytes of the files whose last link went. What another
    /// client purged first (ENOENT) counts for nothing.
    pub(crate) fn purge_tree(&self, parent: Ino, name: &[u8], ino: Ino) -> Result<Purged> {
        let ctx = Ctx::ROOT;
        let a = match self.getattr(ino) {
            Ok(a) => a,
            Err(e) if e.errno() == libc::ENOENT => return Ok(Purged::default()),
            Err(e) => return Err(e),
        };
        if a.kind != Kind::Dir {
            let bytes = if a.nlink <= 1 { a.stored } else { 0 };
            return match self.remove(&ctx, parent, name, false) {
                Ok(_) => Ok(Purged { entries: 1, bytes }),
                Err(e) if e.errno() == libc::ENOENT => Ok(Purged::default()),
                Err(e) => Err(e),
            };
        }
        let mut gone = Purged::default();
        for (n, i, _) in self.entries(ino)? {
            let p = self.purge_tree(ino, &n, i)?;
            gone.entries += p.entries;
            gone.bytes += p.bytes;
        }
        match self.remove_dir(&ctx, parent, name, false) {
            Ok(()) => gone.entries += 1,
            Err(e) if e.errno() == libc::ENOENT => {}
            Err(e) => return Err(e),
        }
        Ok(gone)
    }
}

/// Makes directory `name` (inode `ino`, owned by root) in `parent`, for the trash: counted in
/// the inode usage but never refused by its limit (a deletion must work at the limit).
fn make_dir(
    tx: &mut dyn Txn,
    parent: Ino,
    name: &[u8],
    ino: Ino,
    mode: u32,
    now: Nanos,
    made: &mut Vec<Fact>,
) -> TxResult<()> {
    let mut p = tx.lock_node(parent)?;
    let d = new_node(ino, Kind::Dir, mode, (0, 0), parent, now);
    p.nlink += 1;
    p.mtime = now;
    p.ctime = now;
    tx.create_in(&d, &p, name)?;
    tx.add_usage(0, 1)?;
    made.extend([
        Fact::Attr(p),
        Fact::Name(parent, name.to_vec(), Some(ino)),
        Fact::NewDir(ino),
        Fact::Attr(d),
    ]);
    Ok(())
}

/// The client and the deadline of a claim to purge early (`SESSION:NANOS`).
fn parse_claim(v: &str) -> Option<(&str, Nanos)> {
    let (who, until) = v.split_once(':')?;
    Some((who, until.parse().ok()?))
}

fn split_origin(o: &[u8]) -> TxResult<(Ino, Vec<u8>)> {
    let slash = o.iter().position(|b| *b == b'/');
    let parsed = slash.and_then(|i| {
        let ino: Ino = std::str::from_utf8(&o[..i]).ok()?.parse().ok()?;
        Some((ino, o[i + 1..].to_vec()))
    });
    match parsed {
        Some(p) => Ok(p),
        None => fail(libc::EIO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hour_names_round_trip() {
        // 2026-11-26 17:42:10 UTC.
        let t = 1_795_714_930 * 1_000_000_000;
        assert_eq!(hour_name(t), "2026-11-26-17");
        let start = parse_hour(b"2026-11-26-17").unwrap();
        assert!(start <= t && t < start + HOUR_NANOS);
        assert_eq!(hour_name(0), "1970-01-01-00");
        assert_eq!(
            parse_hour(b"2026-02-29-00").map(hour_name),
            Some("2026-03-01-00".into())
        );
        for bad in [
            &b"2026-11-26"[..],
            b"2026-13-01-00",
            b"x026-11-26-17",
            b"2026-11-26-24",
        ] {
            assert_eq!(parse_hour(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn entry_names_fit() {
        assert_eq!(entry_name(1, 42, b"a.txt"), b"1-42-a.txt");
        let long = vec![b'x'; 255];
        assert_eq!(entry_name(123, 456, &long).len(), 255);
    }
}
