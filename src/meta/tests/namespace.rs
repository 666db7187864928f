//! Tests of the namespace (`ops/namespace.rs`): mknod, lookups, links, unlinks, rmdirs,
//! renames and listings.

use super::*;

engine_tests!(
    mknod_every_kind,
    mknod_errors,
    mknod_setgid_directory,
    mknod_updates_parent,
    link_and_unlink,
    rmdir_rules,
    unlinked_open_file_lives_until_close,
    removed_open_directory_lives_until_close,
    rename_plain,
    rename_across_directories,
    rename_over_file,
    rename_over_directory,
    rename_kind_mismatch_and_loops,
    rename_exchange,
    rename_whiteout,
    rename_between_hard_links_is_a_noop,
    readdir_lists_everything_with_kinds,
    readdir_paging,
    readdir_respects_small_limits,
    readdir_paging_with_concurrent_changes,
    concurrent_mknod_unlink,
);

// ---------------------------------------------------------------------------------------------
// mknod / lookup / getattr
// ---------------------------------------------------------------------------------------------
fn mknod_every_kind(e: Engine) {
    each(e, |m| {
        let t0 = tick();
        let rdev_c = libc::makedev(1, 3) as u32;
        let rdev_b = libc::makedev(8, 1) as u32;
        let cases: [(&str, Kind, u32, u32, Option<&[u8]>); 7] = [
            ("file", Kind::File, libc::S_IFREG | 0o640, 0, None),
            ("dir", Kind::Dir, libc::S_IFDIR | 0o750, 0, None),
            ("link", Kind::Symlink, 0o777, 0, Some(b"some/where/else")),
            ("fifo", Kind::Fifo, libc::S_IFIFO | 0o600, 0, None),
            ("chr", Kind::CharDev, libc::S_IFCHR | 0o620, rdev_c, None),
            ("blk", Kind::BlockDev, libc::S_IFBLK | 0o660, rdev_b, None),
            ("sock", Kind::Socket, libc::S_IFSOCK | 0o755, 0, None),
        ];
        let mut inos = HashSet::new();
        for (name, kind, mode, rdev, target) in cases {
            let a = m
                .mknod(&CTX, ROOT_INO, name.as_bytes(), kind, mode, rdev, target)
                .unwrap();
            let t1 = now_nanos();
            assert_eq!(a.kind, kind, "{name}");
            assert_eq!(a.mode, mode & 0o7777, "{name}");
            assert_eq!((a.uid, a.gid), (CTX.uid, CTX.gid), "{name}");
            assert_eq!(a.rdev, rdev, "{name}");
            assert_eq!(a.nlink, if kind == Kind::Dir { 2 } else { 1 }, "{name}");
            assert_eq!(a.length, target.map_or(0, |t| t.len() as u64), "{name}");
            if kind == Kind::Dir {
                assert_eq!(a.parent, ROOT_INO, "{name}");
            }
            for t in [a.atime, a.mtime, a.ctime] {
                assert!(t >= t0 && t <= t1, "{name}: time {t} not in [{t0}, {t1}]");
            }
            assert_ne!(a.ino, ROOT_INO);
            assert!(inos.insert(a.ino), "inode {} given twice", a.ino);
            assert_eq!(lookup(m, ROOT_INO, name).unwrap(), a, "{name}");
            assert_eq!(m.getattr(a.ino).unwrap(), a, "{name}");
            match target {
                Some(t) => assert_eq!(m.readlink(a.ino).unwrap(), t),
                None => assert_errno(m.readlink(a.ino), libc::EINVAL),
            }
        }
        // "." and "..".
        let dir = lookup(m, ROOT_INO, "dir").unwrap();
        assert_eq!(lookup(m, dir.ino, ".").unwrap().ino, dir.ino);
        assert_eq!(lookup(m, dir.ino, "..").unwrap().ino, ROOT_INO);
        assert_eq!(lookup(m, ROOT_INO, "..").unwrap().ino, ROOT_INO);
        // Missing names and inodes.
        assert_errno(lookup(m, ROOT_INO, "nothing"), libc::ENOENT);
        assert_errno(m.getattr(999_999), libc::ENOENT);
        assert_errno(lookup(m, 999_999, "x"), libc::ENOENT);
        let file = lookup(m, ROOT_INO, "file").unwrap();
        assert_errno(lookup(m, file.ino, "x"), libc::ENOTDIR);
        assert_errno(m.readlink(999_999), libc::ENOENT);
        assert_errno(
            lookup(m, ROOT_INO, &"n".repeat(MAX_NAME_LEN + 1)),
            libc::ENAMETOOLONG,
        );
    });
}

fn mknod_errors(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let d = mkdir(m, ROOT_INO, "d");
        let before = m.getattr(ROOT_INO).unwrap();
        // EEXIST, whatever the kinds.
        for (name, kind) in [("f", Kind::File), ("f", Kind::Dir), ("d", Kind::File)] {
            assert_errno(
                m.mknod(&CTX, ROOT_INO, name.as_bytes(), kind, 0o644, 0, None),
                libc::EEXIST,
            );
        }
        assert_errno(
            m.mknod(&CTX, ROOT_INO, b"d", Kind::Symlink, 0o777, 0, Some(b"t")),
            libc::EEXIST,
        );
        // Nothing changed by the failures.
        assert_eq!(m.getattr(ROOT_INO).unwrap(), before);
        assert_eq!(lookup(m, ROOT_INO, "f").unwrap().ino, f.ino);
        assert_eq!(lookup(m, ROOT_INO, "d").unwrap().ino, d.ino);
        // Missing parent.
        assert_errno(
            m.mknod(&CTX, 999_999, b"x", Kind::File, 0o644, 0, None),
            libc::ENOENT,
        );
        assert_errno(
            m.mknod(&CTX, 999_999, b"x", Kind::Dir, 0o755, 0, None),
            libc::ENOENT,
        );
        // Parent is a file.
        assert_errno(
            m.mknod(&CTX, f.ino, b"x", Kind::File, 0o644, 0, None),
            libc::ENOTDIR,
        );
        assert_errno(
            m.mknod(&CTX, f.ino, b"x", Kind::Dir, 0o755, 0, None),
            libc::ENOTDIR,
        );
        // Names: 255 bytes are fine, 256 too long.
        let ok = "a".repeat(MAX_NAME_LEN);
        let long = "b".repeat(MAX_NAME_LEN + 1);
        mkfile(m, d.ino, &ok);
        assert_eq!(lookup(m, d.ino, &ok).unwrap().kind, Kind::File);
        assert_errno(
            m.mknod(&CTX, d.ino, long.as_bytes(), Kind::File, 0o644, 0, None),
            libc::ENAMETOOLONG,
        );
        assert_errno(
            m.mknod(&CTX, d.ino, long.as_bytes(), Kind::Dir, 0o755, 0, None),
            libc::ENAMETOOLONG,
        );
        assert_errno(lookup(m, d.ino, &long), libc::ENAMETOOLONG);
        // A removed directory takes no new entries.
        let gone = mkdir(m, ROOT_INO, "gone");
        m.rmdir(&CTX, ROOT_INO, b"gone").unwrap();
        assert_errno(
            m.mknod(&CTX, gone.ino, b"x", Kind::File, 0o644, 0, None),
            libc::ENOENT,
        );
        // Bad names and symlink targets.
        for bad in [&b""[..], b"a/b", b"a\0b"] {
            assert_errno(
                m.mknod(&CTX, d.ino, bad, Kind::File, 0o644, 0, None),
                libc::EINVAL,
            );
        }
        assert_errno(
            m.mknod(&CTX, d.ino, b"l", Kind::Symlink, 0o777, 0, Some(b"")),
            libc::ENOENT,
        );
        let long_target = vec![b't'; MAX_SYMLINK_LEN + 1];
        assert_errno(
            m.mknod(
                &CTX,
                d.ino,
                b"l",
                Kind::Symlink,
                0o777,
                0,
                Some(&long_target),
            ),
            libc::ENAMETOOLONG,
        );
        let max_target = vec![b't'; MAX_SYMLINK_LEN];
        let l = m
            .mknod(
                &CTX,
                d.ino,
                b"l",
                Kind::Symlink,
                0o777,
                0,
                Some(&max_target),
            )
            .unwrap();
        assert_eq!(m.readlink(l.ino).unwrap(), max_target);
        m.unlink(&CTX, d.ino, b"l").unwrap();
        assert_eq!(names(m, d.ino), vec![".", "..", ok.as_str()]);
    });
}

fn mknod_setgid_directory(e: Engine) {
    each(e, |m| {
        let sg = m
            .mknod(&Ctx::ROOT, ROOT_INO, b"sg", Kind::Dir, 0o2777, 0, None)
            .unwrap();
        let sg = m
            .setattr(
                &Ctx::ROOT,
                sg.ino,
                &SetAttr {
                    gid: Some(2000),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(sg.gid, 2000);
        assert_ne!(sg.mode & libc::S_ISGID, 0);
        // A file inherits the group, keeps its mode.
        let f = mkfile(m, sg.ino, "f");
        assert_eq!((f.uid, f.gid, f.mode), (CTX.uid, 2000, 0o644));
        // A subdirectory inherits the group and the setgid bit, and passes them on.
        let sub = mkdir(m, sg.ino, "sub");
        assert_eq!(sub.gid, 2000);
        assert_eq!(sub.mode, 0o755 | libc::S_ISGID);
        let subsub = mkdir(m, sub.ino, "subsub");
        assert_eq!(subsub.gid, 2000);
        assert_ne!(subsub.mode & libc::S_ISGID, 0);
        let deep = mkfile(m, subsub.ino, "deep");
        assert_eq!(deep.gid, 2000);
        // A setgid executable by a non-member loses the setgid bit; root keeps it.
        let x = m
            .mknod(&CTX, sg.ino, b"x", Kind::File, 0o2755, 0, None)
            .unwrap();
        assert_eq!((x.gid, x.mode), (2000, 0o755));
        let y = m
            .mknod(&Ctx::ROOT, sg.ino, b"y", Kind::File, 0o2755, 0, None)
            .unwrap();
        assert_eq!((y.gid, y.mode), (2000, 0o2755));
        // Without setgid on the parent, the caller's group is used.
        let plain = mkdir(m, ROOT_INO, "plain");
        let g = mkfile(m, plain.ino, "g");
        assert_eq!(g.gid, CTX.gid);
        let d = mkdir(m, plain.ino, "d");
        assert_eq!((d.gid, d.mode & libc::S_ISGID), (CTX.gid, 0));
    });
}

fn mknod_updates_parent(e: Engine) {
    each(e, |m| {
        assert_eq!(nlink(m, ROOT_INO), 2);
        let p = mkdir(m, ROOT_INO, "p");
        assert_eq!(nlink(m, ROOT_INO), 3);
        assert_eq!(p.nlink, 2);
        for i in 0..5 {
            mkdir(m, p.ino, &format!("sub{i}"));
            assert_eq!(nlink(m, p.ino), 3 + i);
        }
        for (i, kind) in [Kind::File, Kind::Fifo, Kind::Socket]
            .into_iter()
            .enumerate()
        {
            m.mknod(
                &CTX,
                p.ino,
                format!("n{i}").as_bytes(),
                kind,
                0o644,
                0,
                None,
            )
            .unwrap();
        }
        m.mknod(&CTX, p.ino, b"sym", Kind::Symlink, 0o777, 0, Some(b"x"))
            .unwrap();
        assert_eq!(nlink(m, p.ino), 7, "only subdirectories count");
        assert_eq!(nlink(m, ROOT_INO), 3);
        // mtime and ctime of the parent move on every creation.
        for (i, kind) in [Kind::File, Kind::Dir, Kind::Symlink]
            .into_iter()
            .enumerate()
        {
            let t0 = tick();
            let before = m.getattr(p.ino).unwrap();
            assert!(before.mtime < t0 && before.ctime < t0);
            let target: Option<&[u8]> = (kind == Kind::Symlink).then_some(b"t");
            m.mknod(
                &CTX,
                p.ino,
                format!("t{i}").as_bytes(),
                kind,
                0o644,
                0,
                target,
            )
            .unwrap();
            let after = m.getattr(p.ino).unwrap();
            assert!(after.mtime >= t0, "{kind:?}: parent mtime not updated");
            assert!(after.ctime >= t0, "{kind:?}: parent ctime not updated");
        }
        // A failed creation changes nothing.
        let before = m.getattr(p.ino).unwrap();
        tick();
        assert_errno(
            m.mknod(&CTX, p.ino, b"t0", Kind::File, 0o644, 0, None),
            libc::EEXIST,
        );
        assert_eq!(m.getattr(p.ino).unwrap(), before);
    });
}

// ---------------------------------------------------------------------------------------------
// link / unlink / rmdir
// ---------------------------------------------------------------------------------------------
fn link_and_unlink(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        let f = mkfile(m, ROOT_INO, "f");
        let t0 = tick();
        let l = m.link(&CTX, f.ino, d.ino, b"g").unwrap();
        assert_eq!((l.ino, l.nlink), (f.ino, 2));
        assert!(l.ctime >= t0, "link must update the inode's ctime");
        let dd = m.getattr(d.ino).unwrap();
        assert!(
            dd.mtime >= t0 && dd.ctime >= t0,
            "link must update the parent"
        );
        assert_eq!(dd.nlink, 2, "a link is not a subdirectory");
        assert_eq!(lookup(m, d.ino, "g").unwrap().ino, f.ino);
        assert_eq!(lookup(m, ROOT_INO, "f").unwrap().nlink, 2);
        let l3 = m.link(&CTX, f.ino, ROOT_INO, b"h").unwrap();
        assert_eq!(l3.nlink, 3);
        assert_eq!(nlink(m, f.ino), 3);
        // Errors.
        assert_errno(m.link(&CTX, f.ino, d.ino, b"g"), libc::EEXIST);
        assert_errno(m.link(&CTX, f.ino, ROOT_INO, b"d"), libc::EEXIST);
        assert_errno(m.link(&CTX, d.ino, ROOT_INO, b"d2"), libc::EPERM);
        assert_errno(m.link(&CTX, f.ino, 999_999, b"x"), libc::ENOENT);
        assert_errno(m.link(&CTX, 999_999, ROOT_INO, b"x"), libc::ENOENT);
        assert_errno(m.link(&CTX, f.ino, f.ino, b"x"), libc::ENOTDIR);
        assert_errno(
            m.link(&CTX, f.ino, ROOT_INO, "x".repeat(256).as_bytes()),
            libc::ENAMETOOLONG,
        );
        assert_eq!(nlink(m, f.ino), 3, "failed links change nothing");
        // Unlink, one name at a time.
        let t1 = tick();
        let a = m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert_eq!((a.ino, a.nlink), (f.ino, 2));
        assert!(a.ctime >= t1, "unlink must update the inode's ctime");
        let root = m.getattr(ROOT_INO).unwrap();
        assert!(root.mtime >= t1 && root.ctime >= t1);
        assert_errno(lookup(m, ROOT_INO, "f"), libc::ENOENT);
        assert_eq!(nlink(m, f.ino), 2);
        assert_eq!(m.unlink(&CTX, ROOT_INO, b"h").unwrap().nlink, 1);
        assert_eq!(lookup(m, d.ino, "g").unwrap().nlink, 1);
        let last = m.unlink(&CTX, d.ino, b"g").unwrap();
        assert_eq!((last.ino, last.nlink), (f.ino, 0));
        assert_errno(m.getattr(f.ino), libc::ENOENT);
        assert_errno(lookup(m, d.ino, "g"), libc::ENOENT);
        // A gone inode cannot be linked again.
        assert_errno(m.link(&CTX, f.ino, ROOT_INO, b"back"), libc::ENOENT);
        // Unlink errors.
        assert_errno(m.unlink(&CTX, ROOT_INO, b"f"), libc::ENOENT);
        assert_errno(m.unlink(&CTX, ROOT_INO, b"d"), libc::EISDIR);
        assert_eq!(lookup(m, ROOT_INO, "d").unwrap().ino, d.ino);
        let g = mkfile(m, ROOT_INO, "g");
        assert_errno(m.unlink(&CTX, g.ino, b"x"), libc::ENOTDIR);
        assert_errno(m.unlink(&CTX, 999_999, b"x"), libc::ENOENT);
        // Every kind can be unlinked.
        for (i, kind) in [Kind::Symlink, Kind::Fifo, Kind::CharDev, Kind::Socket]
            .into_iter()
            .enumerate()
        {
            let name = format!("k{i}");
            let target: Option<&[u8]> = (kind == Kind::Symlink).then_some(b"t");
            let a = m
                .mknod(&CTX, d.ino, name.as_bytes(), kind, 0o644, 0, target)
                .unwrap();
            assert_eq!(m.unlink(&CTX, d.ino, name.as_bytes()).unwrap().nlink, 0);
            assert_errno(m.getattr(a.ino), libc::ENOENT);
        }
        assert_eq!(names(m, d.ino), vec![".", ".."]);
    });
}

fn rmdir_rules(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        let sub = mkdir(m, d.ino, "sub");
        mkfile(m, ROOT_INO, "f");
        assert_eq!(nlink(m, ROOT_INO), 3);
        assert_errno(m.rmdir(&CTX, ROOT_INO, b"f"), libc::ENOTDIR);
        assert_errno(m.rmdir(&CTX, ROOT_INO, b"d"), libc::ENOTEMPTY);
        assert_errno(m.rmdir(&CTX, ROOT_INO, b"nothing"), libc::ENOENT);
        assert_errno(m.rmdir(&CTX, 999_999, b"x"), libc::ENOENT);
        assert_eq!(nlink(m, ROOT_INO), 3, "failed rmdirs change nothing");
        assert_eq!(nlink(m, d.ino), 3);
        // A directory holding only a file is not empty either.
        mkfile(m, sub.ino, "x");
        assert_errno(m.rmdir(&CTX, d.ino, b"sub"), libc::ENOTEMPTY);
        m.unlink(&CTX, sub.ino, b"x").unwrap();
        let t0 = tick();
        m.rmdir(&CTX, d.ino, b"sub").unwrap();
        let da = m.getattr(d.ino).unwrap();
        assert_eq!(da.nlink, 2);
        assert!(da.mtime >= t0 && da.ctime >= t0);
        assert_errno(m.getattr(sub.ino), libc::ENOENT);
        assert_errno(lookup(m, d.ino, "sub"), libc::ENOENT);
        m.rmdir(&CTX, ROOT_INO, b"d").unwrap();
        assert_eq!(nlink(m, ROOT_INO), 2);
        assert_errno(m.getattr(d.ino), libc::ENOENT);
        assert_errno(m.readdir(d.ino, 0, 10, false), libc::ENOENT);
        assert_eq!(names(m, ROOT_INO), vec![".", "..", "f"]);
    });
}

/// A directory open here and removed here stays (nlink 0) until its last close here, as an
/// unlinked open file does; its opens are counted in this client only (`open_dir`).
fn removed_open_directory_lives_until_close(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        let inodes = m.usage().unwrap().inodes;
        assert_eq!(m.open_dir(d.ino).unwrap().kind, Kind::Dir);
        m.open_dir(d.ino).unwrap();
        m.rmdir(&CTX, ROOT_INO, b"d").unwrap();
        assert_errno(lookup(m, ROOT_INO, "d"), libc::ENOENT);
        assert_eq!(names(m, ROOT_INO), vec![".", ".."]);
        // Still there for the handles open here.
        assert_eq!(m.getattr(d.ino).unwrap().nlink, 0);
        m.close_dir(d.ino).unwrap();
        assert_eq!(m.getattr(d.ino).unwrap().nlink, 0);
        // The last close: gone.
        m.close_dir(d.ino).unwrap();
        assert_errno(m.getattr(d.ino), libc::ENOENT);
        assert_eq!(m.usage().unwrap().inodes, inodes - 1);
        // A missing directory cannot be opened.
        assert_errno(m.open_dir(999_999), libc::ENOENT);
        // A directory opened and closed, not removed, stays; removed after its close, it
        // goes at once.
        let k = mkdir(m, ROOT_INO, "k");
        m.open_dir(k.ino).unwrap();
        m.close_dir(k.ino).unwrap();
        assert_eq!(m.getattr(k.ino).unwrap().nlink, 2);
        m.rmdir(&CTX, ROOT_INO, b"k").unwrap();
        assert_errno(m.getattr(k.ino), libc::ENOENT);
    });
}

fn unlinked_open_file_lives_until_close(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let s = write(m, f.ino, 0, 10_000);
        let inodes = m.usage().unwrap().inodes;
        m.open_inode(f.ino).unwrap();
        m.open_inode(f.ino).unwrap();
        let a = m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert_eq!(a.nlink, 0);
        assert_errno(lookup(m, ROOT_INO, "f"), libc::ENOENT);
        // Still there for its open handles, data included.
        let g = m.getattr(f.ino).unwrap();
        assert_eq!((g.nlink, g.length), (0, 10_000));
        assert_eq!(extents(m, f.ino, 0, 10_000), vec![(0, 10_000, s, 0)]);
        assert!(!dead_ids(m).contains(&s));
        assert_eq!(refs(m).get(&s), Some(&1));
        // Writes through an open handle still work.
        let s2 = write(m, f.ino, 10_000, 100);
        assert_eq!(m.getattr(f.ino).unwrap().length, 10_100);
        // First close: another handle is open.
        m.close_inode(f.ino).unwrap();
        assert_eq!(m.getattr(f.ino).unwrap().nlink, 0);
        assert!(!dead_ids(m).contains(&s));
        // Last close: gone, slices dead (trash_days 0).
        m.close_inode(f.ino).unwrap();
        assert_errno(m.getattr(f.ino), libc::ENOENT);
        let dead = m.dead_slices(1000).unwrap();
        assert!(
            dead.contains(&DeadSlice {
                id: s,
                size: 10_000
            }),
            "{dead:?}"
        );
        assert!(dead.contains(&DeadSlice { id: s2, size: 100 }), "{dead:?}");
        let r = refs(m);
        assert!(!r.contains_key(&s) && !r.contains_key(&s2), "{r:?}");
        assert_eq!(m.usage().unwrap().inodes, inodes - 1);
        assert_eq!(m.usage().unwrap().used_bytes, 0);
        // Opening a missing inode fails.
        assert_errno(m.open_inode(999_999), libc::ENOENT);
        // A close of a file that is still linked keeps it.
        let h = mkfile(m, ROOT_INO, "h");
        m.open_inode(h.ino).unwrap();
        m.close_inode(h.ino).unwrap();
        assert_eq!(m.getattr(h.ino).unwrap().nlink, 1);
        // Unlinked, not open: gone at once, slices dead at once.
        let s3 = write(m, h.ino, 0, 4096);
        m.unlink(&CTX, ROOT_INO, b"h").unwrap();
        assert_errno(m.getattr(h.ino), libc::ENOENT);
        assert!(dead_ids(m).contains(&s3));
        // Forgetting dead slices.
        m.forget_dead_slices(&[s, s2, s3]).unwrap();
        let left = dead_ids(m);
        assert!(!left.contains(&s) && !left.contains(&s3), "{left:?}");
    });
}

// ---------------------------------------------------------------------------------------------
// rename
// ---------------------------------------------------------------------------------------------
fn rename_plain(e: Engine) {
    each(e, |m| {
        let a = mkfile(m, ROOT_INO, "a");
        let t0 = tick();
        assert!(rename(m, ROOT_INO, "a", ROOT_INO, "b").unwrap().is_none());
        assert_errno(lookup(m, ROOT_INO, "a"), libc::ENOENT);
        let b = lookup(m, ROOT_INO, "b").unwrap();
        assert_eq!(b.ino, a.ino);
        assert_eq!(b.nlink, 1);
        assert!(b.ctime >= t0, "rename must update the moved inode's ctime");
        let root = m.getattr(ROOT_INO).unwrap();
        assert!(root.mtime >= t0 && root.ctime >= t0);
        assert_eq!(root.nlink, 2);
        assert_eq!(names(m, ROOT_INO), vec![".", "..", "b"]);
        // A directory too.
        let d = mkdir(m, ROOT_INO, "d");
        let t1 = tick();
        rename(m, ROOT_INO, "d", ROOT_INO, "e").unwrap();
        let e = lookup(m, ROOT_INO, "e").unwrap();
        assert_eq!((e.ino, e.nlink, e.parent), (d.ino, 2, ROOT_INO));
        assert!(e.ctime >= t1);
        assert_eq!(nlink(m, ROOT_INO), 3);
        // Errors.
        assert_errno(rename(m, ROOT_INO, "a", ROOT_INO, "c"), libc::ENOENT);
        assert_errno(rename(m, 999_999, "a", ROOT_INO, "c"), libc::ENOENT);
        assert_errno(rename(m, ROOT_INO, "b", 999_999, "c"), libc::ENOENT);
        assert_errno(rename(m, ROOT_INO, "b", b.ino, "c"), libc::ENOTDIR);
        assert_errno(
            rename(m, ROOT_INO, "b", ROOT_INO, &"n".repeat(256)),
            libc::ENAMETOOLONG,
        );
        // Renaming onto itself changes nothing.
        assert!(rename(m, ROOT_INO, "b", ROOT_INO, "b").unwrap().is_none());
        assert_eq!(lookup(m, ROOT_INO, "b").unwrap().ino, a.ino);
        assert_eq!(nlink(m, a.ino), 1);
    });
}

fn rename_across_directories(e: Engine) {
    each(e, |m| {
        let p1 = mkdir(m, ROOT_INO, "p1");
        let p2 = mkdir(m, ROOT_INO, "p2");
        let f = mkfile(m, p1.ino, "f");
        let t0 = tick();
        assert!(rename(m, p1.ino, "f", p2.ino, "g").unwrap().is_none());
        assert_errno(lookup(m, p1.ino, "f"), libc::ENOENT);
        assert_eq!(lookup(m, p2.ino, "g").unwrap().ino, f.ino);
        assert!(m.getattr(f.ino).unwrap().ctime >= t0);
        for p in [p1.ino, p2.ino] {
            let a = m.getattr(p).unwrap();
            assert!(a.mtime >= t0 && a.ctime >= t0, "parent {p} times");
            assert_eq!(a.nlink, 2, "moving a file changes no nlink");
        }
        // A directory carries its parent's nlink along.
        let d = mkdir(m, p1.ino, "d");
        mkfile(m, d.ino, "inside");
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 2));
        let t1 = tick();
        rename(m, p1.ino, "d", p2.ino, "d").unwrap();
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (2, 3));
        assert_eq!(nlink(m, ROOT_INO), 4);
        let da = m.getattr(d.ino).unwrap();
        assert_eq!((da.parent, da.nlink), (p2.ino, 2));
        assert!(da.ctime >= t1);
        assert_eq!(lookup(m, d.ino, "..").unwrap().ino, p2.ino);
        let l = listing(m, d.ino);
        assert_eq!((l[1].name.as_slice(), l[1].ino), (&b".."[..], p2.ino));
        assert_eq!(lookup(m, d.ino, "inside").unwrap().kind, Kind::File);
        // And up to the root.
        rename(m, p2.ino, "d", ROOT_INO, "top").unwrap();
        assert_eq!((nlink(m, p2.ino), nlink(m, ROOT_INO)), (2, 5));
        assert_eq!(m.getattr(d.ino).unwrap().parent, ROOT_INO);
    });
}

fn rename_over_file(e: Engine) {
    each(e, |m| {
        let a = mkfile(m, ROOT_INO, "a");
        let b = mkfile(m, ROOT_INO, "b");
        let s = write(m, b.ino, 0, 5000);
        let inodes = m.usage().unwrap().inodes;
        let t0 = tick();
        let victim = rename(m, ROOT_INO, "a", ROOT_INO, "b")
            .unwrap()
            .expect("the replaced inode is returned");
        assert_eq!((victim.ino, victim.nlink), (b.ino, 0));
        assert_errno(m.getattr(b.ino), libc::ENOENT);
        assert_eq!(lookup(m, ROOT_INO, "b").unwrap().ino, a.ino);
        assert_errno(lookup(m, ROOT_INO, "a"), libc::ENOENT);
        assert!(m.getattr(a.ino).unwrap().ctime >= t0);
        assert!(dead_ids(m).contains(&s), "the victim's slices die with it");
        assert_eq!(m.usage().unwrap().inodes, inodes - 1);
        assert_eq!(names(m, ROOT_INO), vec![".", "..", "b"]);
        // Across directories, over a file that has another name: it survives.
        let d = mkdir(m, ROOT_INO, "d");
        let c = mkfile(m, d.ino, "c");
        m.link(&CTX, c.ino, ROOT_INO, b"c2").unwrap();
        let victim = rename(m, ROOT_INO, "b", d.ino, "c").unwrap().unwrap();
        assert_eq!((victim.ino, victim.nlink), (c.ino, 1));
        assert_eq!(m.getattr(c.ino).unwrap().nlink, 1);
        assert_eq!(lookup(m, d.ino, "c").unwrap().ino, a.ino);
        assert_eq!(lookup(m, ROOT_INO, "c2").unwrap().ino, c.ino);
        // Over an open file: kept until closed.
        let e = mkfile(m, d.ino, "e");
        m.open_inode(e.ino).unwrap();
        let victim = rename(m, ROOT_INO, "c2", d.ino, "e").unwrap().unwrap();
        assert_eq!((victim.ino, victim.nlink), (e.ino, 0));
        assert_eq!(m.getattr(e.ino).unwrap().nlink, 0);
        m.close_inode(e.ino).unwrap();
        assert_errno(m.getattr(e.ino), libc::ENOENT);
    });
}

fn rename_over_directory(e: Engine) {
    each(e, |m| {
        let x = mkdir(m, ROOT_INO, "x");
        let y = mkdir(m, ROOT_INO, "y");
        mkfile(m, x.ino, "content");
        assert_eq!(nlink(m, ROOT_INO), 4);
        let victim = rename(m, ROOT_INO, "x", ROOT_INO, "y")
            .unwrap()
            .expect("the replaced directory is returned");
        assert_eq!((victim.ino, victim.nlink), (y.ino, 0));
        assert_errno(m.getattr(y.ino), libc::ENOENT);
        assert_eq!(nlink(m, ROOT_INO), 3);
        let now_y = lookup(m, ROOT_INO, "y").unwrap();
        assert_eq!((now_y.ino, now_y.nlink), (x.ino, 2));
        assert_eq!(lookup(m, x.ino, "content").unwrap().kind, Kind::File);
        // Across directories.
        let p1 = mkdir(m, ROOT_INO, "p1");
        let p2 = mkdir(m, ROOT_INO, "p2");
        mkdir(m, p1.ino, "a");
        let b = mkdir(m, p2.ino, "b");
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 3));
        let victim = rename(m, p1.ino, "a", p2.ino, "b").unwrap().unwrap();
        assert_eq!((victim.ino, victim.nlink), (b.ino, 0));
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (2, 3));
        // Non-empty destination.
        let q = mkdir(m, ROOT_INO, "q");
        let r = mkdir(m, ROOT_INO, "r");
        mkfile(m, r.ino, "f");
        let before = nlink(m, ROOT_INO);
        assert_errno(rename(m, ROOT_INO, "q", ROOT_INO, "r"), libc::ENOTEMPTY);
        assert_eq!(lookup(m, ROOT_INO, "q").unwrap().ino, q.ino);
        assert_eq!(lookup(m, ROOT_INO, "r").unwrap().ino, r.ino);
        assert_eq!(nlink(m, ROOT_INO), before);
        // A subdirectory makes it non-empty too.
        let r2 = mkdir(m, ROOT_INO, "r2");
        mkdir(m, r2.ino, "sub");
        assert_errno(rename(m, ROOT_INO, "q", ROOT_INO, "r2"), libc::ENOTEMPTY);
    });
}

fn rename_kind_mismatch_and_loops(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let d = mkdir(m, ROOT_INO, "d");
        assert_errno(rename(m, ROOT_INO, "f", ROOT_INO, "d"), libc::EISDIR);
        assert_errno(rename(m, ROOT_INO, "d", ROOT_INO, "f"), libc::ENOTDIR);
        assert_eq!(lookup(m, ROOT_INO, "f").unwrap().ino, f.ino);
        assert_eq!(lookup(m, ROOT_INO, "d").unwrap().ino, d.ino);
        // A directory into itself or below it.
        let a = mkdir(m, ROOT_INO, "a");
        let b = mkdir(m, a.ino, "b");
        let c = mkdir(m, b.ino, "c");
        assert_errno(rename(m, ROOT_INO, "a", a.ino, "z"), libc::EINVAL);
        assert_errno(rename(m, ROOT_INO, "a", b.ino, "z"), libc::EINVAL);
        assert_errno(rename(m, ROOT_INO, "a", c.ino, "z"), libc::EINVAL);
        assert_errno(rename(m, a.ino, "b", c.ino, "z"), libc::EINVAL);
        assert_eq!(m.getattr(a.ino).unwrap().parent, ROOT_INO);
        assert_eq!(lookup(m, ROOT_INO, "a").unwrap().ino, a.ino);
        assert_eq!((nlink(m, a.ino), nlink(m, b.ino)), (3, 3));
        // Moving a directory next to itself or up is fine.
        rename(m, b.ino, "c", a.ino, "c").unwrap();
        assert_eq!((nlink(m, a.ino), nlink(m, b.ino)), (4, 2));
        // noreplace.
        let g = mkfile(m, ROOT_INO, "g");
        assert_errno(
            m.rename(&CTX, ROOT_INO, b"f", ROOT_INO, b"g", flags(true, false)),
            libc::EEXIST,
        );
        assert_errno(
            m.rename(&CTX, ROOT_INO, b"f", ROOT_INO, b"d", flags(true, false)),
            libc::EEXIST,
        );
        assert_eq!(lookup(m, ROOT_INO, "g").unwrap().ino, g.ino);
        assert_eq!(lookup(m, ROOT_INO, "f").unwrap().ino, f.ino);
        assert!(
            m.rename(&CTX, ROOT_INO, b"f", ROOT_INO, b"h", flags(true, false))
                .unwrap()
                .is_none()
        );
        assert_eq!(lookup(m, ROOT_INO, "h").unwrap().ino, f.ino);
        assert_errno(
            m.rename(&CTX, ROOT_INO, b"h", ROOT_INO, b"g", flags(true, true)),
            libc::EINVAL,
        );
    });
}

fn rename_exchange(e: Engine) {
    each(e, |m| {
        // Same directory, file <-> directory.
        let f = mkfile(m, ROOT_INO, "f");
        let d = mkdir(m, ROOT_INO, "d");
        let root_nlink = nlink(m, ROOT_INO);
        let t0 = tick();
        assert!(exchange(m, ROOT_INO, "f", ROOT_INO, "d").unwrap().is_none());
        let now_f = lookup(m, ROOT_INO, "f").unwrap();
        let now_d = lookup(m, ROOT_INO, "d").unwrap();
        assert_eq!((now_f.ino, now_f.kind), (d.ino, Kind::Dir));
        assert_eq!((now_d.ino, now_d.kind), (f.ino, Kind::File));
        assert!(now_f.ctime >= t0 && now_d.ctime >= t0, "both ctimes move");
        assert_eq!(nlink(m, ROOT_INO), root_nlink);
        assert_eq!(m.getattr(d.ino).unwrap().parent, ROOT_INO);
        let kinds: HashMap<Vec<u8>, (Ino, Kind)> = listing(m, ROOT_INO)
            .into_iter()
            .map(|e| (e.name, (e.ino, e.kind)))
            .collect();
        assert_eq!(kinds[&b"f".to_vec()], (d.ino, Kind::Dir));
        assert_eq!(kinds[&b"d".to_vec()], (f.ino, Kind::File));
        // And back.
        exchange(m, ROOT_INO, "d", ROOT_INO, "f").unwrap();
        assert_eq!(lookup(m, ROOT_INO, "f").unwrap().ino, f.ino);
        assert_eq!(lookup(m, ROOT_INO, "d").unwrap().ino, d.ino);

        // Across directories: a directory and a file.
        let p1 = mkdir(m, ROOT_INO, "p1");
        let p2 = mkdir(m, ROOT_INO, "p2");
        let d1 = mkdir(m, p1.ino, "d1");
        let f2 = mkfile(m, p2.ino, "f2");
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 2));
        let t1 = tick();
        exchange(m, p1.ino, "d1", p2.ino, "f2").unwrap();
        assert_eq!(lookup(m, p1.ino, "d1").unwrap().ino, f2.ino);
        assert_eq!(lookup(m, p2.ino, "f2").unwrap().ino, d1.ino);
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (2, 3));
        assert_eq!(m.getattr(d1.ino).unwrap().parent, p2.ino);
        assert_eq!(lookup(m, d1.ino, "..").unwrap().ino, p2.ino);
        for p in [p1.ino, p2.ino] {
            let a = m.getattr(p).unwrap();
            assert!(a.mtime >= t1 && a.ctime >= t1, "parent {p} times");
        }
        // The other way round restores everything.
        exchange(m, p2.ino, "f2", p1.ino, "d1").unwrap();
        assert_eq!(lookup(m, p1.ino, "d1").unwrap().ino, d1.ino);
        assert_eq!(lookup(m, p2.ino, "f2").unwrap().ino, f2.ino);
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 2));
        assert_eq!(m.getattr(d1.ino).unwrap().parent, p1.ino);

        // Two directories across: nlinks stay, parents swap.
        let d2 = mkdir(m, p2.ino, "d2");
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 3));
        exchange(m, p1.ino, "d1", p2.ino, "d2").unwrap();
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 3));
        assert_eq!(m.getattr(d1.ino).unwrap().parent, p2.ino);
        assert_eq!(m.getattr(d2.ino).unwrap().parent, p1.ino);
        assert_eq!(lookup(m, p1.ino, "d1").unwrap().ino, d2.ino);
        assert_eq!(lookup(m, p2.ino, "d2").unwrap().ino, d1.ino);

        // Two files across.
        let g1 = mkfile(m, p1.ino, "g1");
        let g2 = mkfile(m, p2.ino, "g2");
        exchange(m, p1.ino, "g1", p2.ino, "g2").unwrap();
        assert_eq!(lookup(m, p1.ino, "g1").unwrap().ino, g2.ino);
        assert_eq!(lookup(m, p2.ino, "g2").unwrap().ino, g1.ino);
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 3));

        // Errors: a missing side, a directory into its own subtree.
        assert_errno(exchange(m, p1.ino, "g1", p2.ino, "none"), libc::ENOENT);
        assert_errno(exchange(m, p1.ino, "none", p2.ino, "g2"), libc::ENOENT);
        let inner = mkdir(m, p1.ino, "inner");
        assert_errno(exchange(m, ROOT_INO, "p1", p1.ino, "inner"), libc::EINVAL);
        assert_errno(exchange(m, p1.ino, "inner", ROOT_INO, "p1"), libc::EINVAL);
        assert_eq!(m.getattr(inner.ino).unwrap().parent, p1.ino);
        assert_eq!(m.getattr(p1.ino).unwrap().parent, ROOT_INO);
    });
}

fn rename_whiteout(e: Engine) {
    each(e, |m| {
        let whiteout = RenameFlags {
            whiteout: true,
            ..RenameFlags::default()
        };
        let a = mkfile(m, ROOT_INO, "a");
        let d = mkdir(m, ROOT_INO, "d");
        let b = mkfile(m, d.ino, "b");
        let inodes = m.usage().unwrap().inodes;
        let ctx = Ctx {
            uid: 7,
            gid: 8,
            ..CTX
        };
        // Over another file, across directories: the old name becomes a whiteout.
        let victim = m
            .rename(&ctx, ROOT_INO, b"a", d.ino, b"b", whiteout)
            .unwrap()
            .expect("the replaced inode is returned");
        assert_eq!(victim.ino, b.ino);
        assert_eq!(lookup(m, d.ino, "b").unwrap().ino, a.ino);
        let w = lookup(m, ROOT_INO, "a").unwrap();
        assert_ne!(w.ino, a.ino);
        assert_eq!((w.kind, w.rdev, w.mode), (Kind::CharDev, 0, 0));
        assert_eq!((w.uid, w.gid, w.nlink), (7, 8, 1));
        let kinds: Vec<(String, Kind)> = listing(m, ROOT_INO)
            .into_iter()
            .map(|e| (String::from_utf8(e.name).unwrap(), e.kind))
            .filter(|(n, _)| n == "a")
            .collect();
        assert_eq!(kinds, vec![("a".to_string(), Kind::CharDev)]);
        // One inode replaced, one whiteout made.
        assert_eq!(m.usage().unwrap().inodes, inodes);
        // To a free name, with noreplace; a directory too.
        let noreplace = RenameFlags {
            noreplace: true,
            ..whiteout
        };
        m.rename(&ctx, ROOT_INO, b"d", ROOT_INO, b"e", noreplace)
            .unwrap();
        assert_eq!(lookup(m, ROOT_INO, "e").unwrap().ino, d.ino);
        assert_eq!(lookup(m, ROOT_INO, "d").unwrap().kind, Kind::CharDev);
        // Nothing to move: nothing made. With exchange: refused.
        assert_errno(
            m.rename(&ctx, ROOT_INO, b"nope", ROOT_INO, b"x", whiteout),
            libc::ENOENT,
        );
        assert_errno(lookup(m, ROOT_INO, "nope"), libc::ENOENT);
        let both = RenameFlags {
            exchange: true,
            ..whiteout
        };
        assert_errno(
            m.rename(&ctx, ROOT_INO, b"e", ROOT_INO, b"a", both),
            libc::EINVAL,
        );
        // A whiteout is deleted as any inode.
        m.unlink(&CTX, ROOT_INO, b"a").unwrap();
        assert_errno(m.getattr(w.ino), libc::ENOENT);
    });
}

fn rename_between_hard_links_is_a_noop(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let d = mkdir(m, ROOT_INO, "d");
        m.link(&CTX, f.ino, ROOT_INO, b"g").unwrap();
        m.link(&CTX, f.ino, d.ino, b"h").unwrap();
        assert!(rename(m, ROOT_INO, "f", ROOT_INO, "g").unwrap().is_none());
        assert!(rename(m, ROOT_INO, "f", d.ino, "h").unwrap().is_none());
        assert!(exchange(m, ROOT_INO, "f", d.ino, "h").unwrap().is_none());
        for (p, n) in [(ROOT_INO, "f"), (ROOT_INO, "g"), (d.ino, "h")] {
            assert_eq!(lookup(m, p, n).unwrap().ino, f.ino, "{n}");
        }
        assert_eq!(nlink(m, f.ino), 3);
    });
}

// ---------------------------------------------------------------------------------------------
// readdir
// ---------------------------------------------------------------------------------------------
fn readdir_lists_everything_with_kinds(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        let mut want: HashMap<Vec<u8>, (Ino, Kind)> = HashMap::new();
        for (name, kind) in [
            ("file", Kind::File),
            ("dir", Kind::Dir),
            ("link", Kind::Symlink),
            ("fifo", Kind::Fifo),
            ("chr", Kind::CharDev),
            ("blk", Kind::BlockDev),
            ("sock", Kind::Socket),
        ] {
            let target: Option<&[u8]> = (kind == Kind::Symlink).then_some(b"t");
            let a = m
                .mknod(&CTX, d.ino, name.as_bytes(), kind, 0o644, 0, target)
                .unwrap();
            want.insert(name.as_bytes().to_vec(), (a.ino, kind));
        }
        let l = m.readdir(d.ino, 0, 1000, false).unwrap();
        assert_eq!(l.len(), 9, "{l:?}");
        assert_eq!(
            (l[0].name.as_slice(), l[0].ino, l[0].kind),
            (&b"."[..], d.ino, Kind::Dir)
        );
        assert_eq!(
            (l[1].name.as_slice(), l[1].ino, l[1].kind),
            (&b".."[..], ROOT_INO, Kind::Dir)
        );
        let got: HashMap<Vec<u8>, (Ino, Kind)> = l[2..]
            .iter()
            .map(|e| (e.name.clone(), (e.ino, e.kind)))
            .collect();
        assert_eq!(got, want);
        assert!(l.iter().all(|e| e.attr.is_none()), "no attrs without plus");
        // Cookies resume after the entry.
        let cookies: HashSet<u64> = l.iter().map(|e| e.cookie).collect();
        assert_eq!(cookies.len(), l.len(), "cookies are distinct");
        for (i, e) in l.iter().enumerate() {
            let rest = m.readdir(d.ino, e.cookie, 1000, false).unwrap();
            let rest: Vec<&[u8]> = rest.iter().map(|e| e.name.as_slice()).collect();
            let expect: Vec<&[u8]> = l[i + 1..].iter().map(|e| e.name.as_slice()).collect();
            assert_eq!(rest, expect, "after entry {i}");
        }
        // With attributes.
        let lp = m.readdir(d.ino, 0, 1000, true).unwrap();
        assert_eq!(lp.len(), 9);
        for e in &lp {
            let a = e.attr.as_ref().expect("plus fills attrs");
            assert_eq!(a, &m.getattr(e.ino).unwrap(), "{:?}", e.name);
            assert_eq!(a.kind, e.kind);
        }
        assert_eq!(lp[0].attr.as_ref().unwrap().ino, d.ino);
        assert_eq!(lp[1].attr.as_ref().unwrap().ino, ROOT_INO);
        // The root's ".." is the root; an empty directory has just "." and "..".
        let r = m.readdir(ROOT_INO, 0, 1000, true).unwrap();
        assert_eq!((r[1].name.as_slice(), r[1].ino), (&b".."[..], ROOT_INO));
        let dir = want[&b"dir".to_vec()].0;
        assert_eq!(names(m, dir), vec![".", ".."]);
        // Not a directory, or missing.
        let file = want[&b"file".to_vec()].0;
        assert_errno(m.readdir(file, 0, 10, false), libc::ENOTDIR);
        assert_errno(m.readdir(999_999, 0, 10, false), libc::ENOENT);
    });
}

/// Lists a directory in pages of `limit`; checks each page's size.
fn paged(m: &dyn Meta, dir: Ino, limit: usize, plus: bool) -> Vec<DirEntry> {
    let mut out: Vec<DirEntry> = Vec::new();
    let mut cookie = 0;
    for _ in 0..100_000 {
        let page = m.readdir(dir, cookie, limit, plus).unwrap();
        assert!(
            page.len() <= limit,
            "page of {} > limit {limit}",
            page.len()
        );
        let Some(last) = page.last() else {
            return out;
        };
        cookie = last.cookie;
        out.extend(page);
    }
    panic!("listing never ends");
}

fn readdir_paging(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        let mut want: HashSet<Vec<u8>> = [b".".to_vec(), b"..".to_vec()].into();
        for i in 0..1000 {
            let name = format!("entry-{i:04}");
            if i % 10 == 0 {
                mkdir(m, d.ino, &name);
            } else {
                mkfile(m, d.ino, &name);
            }
            want.insert(name.into_bytes());
        }
        for plus in [false, true] {
            let all = paged(m, d.ino, 7, plus);
            assert_eq!(all.len(), 1002, "plus={plus}");
            let got: HashSet<Vec<u8>> = all.iter().map(|e| e.name.clone()).collect();
            assert_eq!(got.len(), 1002, "plus={plus}: duplicates");
            assert_eq!(got, want, "plus={plus}");
            for e in &all {
                if e.name.starts_with(b"entry-") {
                    let i: usize = std::str::from_utf8(&e.name[6..]).unwrap().parse().unwrap();
                    let k = if i % 10 == 0 { Kind::Dir } else { Kind::File };
                    assert_eq!(e.kind, k, "{i}");
                }
                assert_eq!(e.attr.is_some(), plus);
                if let Some(a) = &e.attr {
                    assert_eq!((a.ino, a.kind), (e.ino, e.kind));
                }
            }
        }
    });
}

fn readdir_respects_small_limits(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        for i in 0..5 {
            mkfile(m, d.ino, &format!("f{i}"));
        }
        for limit in [1, 2, 3] {
            let all = paged(m, d.ino, limit, false);
            let got: Vec<&[u8]> = all.iter().map(|e| e.name.as_slice()).collect();
            let want: Vec<&[u8]> = vec![b".", b"..", b"f0", b"f1", b"f2", b"f3", b"f4"];
            assert_eq!(got, want, "limit {limit}");
        }
    });
}

fn readdir_paging_with_concurrent_changes(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        for i in 0..100 {
            mkfile(m, d.ino, &format!("old-{i:03}"));
        }
        let mut seen: Vec<Vec<u8>> = Vec::new();
        let mut cookie = 0;
        let mut pages = 0;
        let mut removed = HashSet::new();
        loop {
            let page = m.readdir(d.ino, cookie, 7, false).unwrap();
            let Some(last) = page.last() else { break };
            cookie = last.cookie;
            seen.extend(page.into_iter().map(|e| e.name));
            pages += 1;
            let pause = match pages {
                3 => Some((["old-003", "old-004"], ["old-090", "old-091"], "old-013")),
                8 => Some((["old-020", "old-021"], ["old-092", "old-093"], "old-040")),
                _ => None,
            };
            if let Some((listed, unlisted, moved)) = pause {
                for n in listed.iter().chain([moved].iter()) {
                    assert!(seen.contains(&n.as_bytes().to_vec()), "{n} listed already");
                }
                // New entries while the listing is under way...
                for j in 0..30 {
                    mkfile(m, d.ino, &format!("new-{pages}-{j:02}"));
                }
                // ...removals of entries listed already and not listed yet...
                for n in listed.iter().chain(unlisted.iter()) {
                    m.unlink(&CTX, d.ino, n.as_bytes()).unwrap();
                    removed.insert(n.to_string());
                }
                // ...and a rename of an entry listed already (to a new name).
                m.rename(
                    &CTX,
                    d.ino,
                    moved.as_bytes(),
                    d.ino,
                    format!("moved-{pages}").as_bytes(),
                    RenameFlags::default(),
                )
                .unwrap();
                removed.insert(moved.to_string());
            }
            assert!(pages < 1000, "listing never ends");
        }
        let mut counts: HashMap<&[u8], usize> = HashMap::new();
        for n in &seen {
            *counts.entry(n.as_slice()).or_default() += 1;
        }
        let dups: Vec<_> = counts
            .iter()
            .filter(|(_, c)| **c > 1)
            .map(|(n, _)| String::from_utf8_lossy(n))
            .collect();
        assert!(dups.is_empty(), "listed twice: {dups:?}");
        // Every entry that existed throughout is listed.
        for i in 0..100 {
            let name = format!("old-{i:03}");
            if !removed.contains(&name) {
                assert_eq!(counts.get(name.as_bytes()), Some(&1), "{name} missing");
            }
        }
        // Removed entries that had not been listed yet do not show up.
        for n in ["old-090", "old-091", "old-092", "old-093"] {
            assert!(!counts.contains_key(n.as_bytes()), "{n} was removed");
        }
    });
}

fn concurrent_mknod_unlink(e: Engine) {
    for (name, make) in engines(e) {
        eprintln!("--- engine {name}");
        let (_dir, m) = make();
        let d = mkdir(&*m, ROOT_INO, "d");
        let inodes = m.usage().unwrap().inodes;
        let done = std::sync::atomic::AtomicBool::new(false);
        let unexpected = parking_lot::Mutex::new(Vec::<String>::new());
        let bad = |what: String| unexpected.lock().push(what);
        std::thread::scope(|sc| {
            let mut writers = Vec::new();
            for t in 0..8 {
                let m = m.clone();
                let bad = &bad;
                writers.push(sc.spawn(move || {
                    for i in 0..200 {
                        let own = format!("t{t}-{i}");
                        if let Err(e) =
                            m.mknod(&CTX, d.ino, own.as_bytes(), Kind::File, 0o644, 0, None)
                        {
                            bad(format!("mknod {own}: {e:?}"));
                        }
                        // A name all threads fight over.
                        let shared = format!("shared-{}", i % 5);
                        match m.mknod(&CTX, d.ino, shared.as_bytes(), Kind::File, 0o644, 0, None) {
                            Ok(_) | Err(Error::Sys(libc::EEXIST)) => {}
                            Err(e) => bad(format!("mknod {shared}: {e:?}")),
                        }
                        match lookup(&*m, d.ino, &own) {
                            Ok(a) if a.kind == Kind::File => {}
                            other => bad(format!("lookup {own}: {other:?}")),
                        }
                        match m.unlink(&CTX, d.ino, shared.as_bytes()) {
                            Ok(a) if a.nlink == 0 => {}
                            Ok(a) => bad(format!("unlink {shared}: nlink {}", a.nlink)),
                            Err(Error::Sys(libc::ENOENT)) => {}
                            Err(e) => bad(format!("unlink {shared}: {e:?}")),
                        }
                        if let Err(e) = m.unlink(&CTX, d.ino, own.as_bytes()) {
                            bad(format!("unlink {own}: {e:?}"));
                        }
                    }
                }));
            }
            // Readers beside the writers.
            for _ in 0..2 {
                let m = m.clone();
                let (bad, done) = (&bad, &done);
                sc.spawn(move || {
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        if let Err(e) = m.readdir(d.ino, 0, 100, true) {
                            bad(format!("readdir: {e:?}"));
                        }
                        match lookup(&*m, d.ino, "shared-0") {
                            Ok(_) | Err(Error::Sys(libc::ENOENT)) => {}
                            Err(e) => bad(format!("lookup shared-0: {e:?}")),
                        }
                        if let Err(e) = m.getattr(d.ino) {
                            bad(format!("getattr: {e:?}"));
                        }
                    }
                });
            }
            for w in writers {
                w.join().unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let unexpected = unexpected.into_inner();
        assert!(
            unexpected.is_empty(),
            "{} unexpected outcomes, e.g. {:?}",
            unexpected.len(),
            &unexpected[..unexpected.len().min(10)]
        );
        assert_eq!(
            names(&*m, d.ino),
            vec![".", ".."],
            "directory left non-empty"
        );
        assert_eq!(nlink(&*m, d.ino), 2);
        assert_eq!(m.usage().unwrap().inodes, inodes);
    }
}
