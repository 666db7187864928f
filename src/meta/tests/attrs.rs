//! Tests of attributes (`ops/attrs.rs`): setattr, inode flags, xattrs.

use super::*;

engine_tests!(
    inode_flags_protect_files_and_directories,
    setattr_fields,
    xattrs,
);

fn inode_flags_protect_files_and_directories(e: Engine) {
    each(e, |m| {
        let root = Ctx {
            uid: 0,
            gid: 0,
            ..CTX
        };
        let f = mkfile(m, ROOT_INO, "f");
        write(m, f.ino, 0, 100);
        // Who may set what.
        let other = Ctx { uid: 4242, ..CTX };
        assert_errno(
            m.set_flags(&other, f.ino, flags::NODUMP, false),
            libc::EPERM,
        );
        assert_errno(
            m.set_flags(&CTX, f.ino, flags::IMMUTABLE, false),
            libc::EPERM,
        );
        assert_errno(m.set_flags(&root, f.ino, 0x8000, false), libc::EOPNOTSUPP);
        assert_eq!(
            m.set_flags(&CTX, f.ino, flags::NODUMP, false)
                .unwrap()
                .flags,
            flags::NODUMP
        );
        let a = m.set_flags(&root, f.ino, flags::IMMUTABLE, false).unwrap();
        assert_eq!(m.getattr(f.ino).unwrap().flags, flags::IMMUTABLE);
        assert!(a.ctime > f.ctime);

        // Immutable: nothing changes, root included.
        let chmod = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        let touch = SetAttr {
            mtime: Some(SetTime::Now),
            ..SetAttr::default()
        };
        let punch = FallocMode {
            punch_hole: true,
            keep_size: true,
            ..FallocMode::default()
        };
        assert_errno(m.setattr(&root, f.ino, &chmod), libc::EPERM);
        assert_errno(m.setattr(&root, f.ino, &touch), libc::EPERM);
        assert_errno(m.truncate(&root, f.ino, 0), libc::EPERM);
        assert_errno(
            m.fallocate(&root, f.ino, FallocMode::default(), 0, 10),
            libc::EPERM,
        );
        let id = m.new_slice_id().unwrap();
        assert_errno(
            m.write_slices(f.ino, &slice_recs(id, 0, 10), Some(now_nanos())),
            libc::EPERM,
        );
        assert_errno(m.unlink(&root, ROOT_INO, b"f"), libc::EPERM);
        assert_errno(
            m.rename(&root, ROOT_INO, b"f", ROOT_INO, b"g", flags(false, false)),
            libc::EPERM,
        );
        assert_errno(m.link(&root, f.ino, ROOT_INO, b"h"), libc::EPERM);
        assert_errno(
            m.set_xattr(&root, f.ino, b"user.x", b"1", XattrSet::Any),
            libc::EPERM,
        );
        let g = mkfile(m, ROOT_INO, "g");
        assert_errno(
            m.rename(&root, ROOT_INO, b"g", ROOT_INO, b"f", flags(false, false)),
            libc::EPERM,
        );
        assert_eq!(m.getattr(f.ino).unwrap().length, 100);

        // Append-only: grows, its times may be set to now; nothing else.
        m.set_flags(&root, f.ino, flags::APPEND, false).unwrap();
        write(m, f.ino, 100, 50);
        assert_eq!(m.getattr(f.ino).unwrap().length, 150);
        m.setattr(&root, f.ino, &touch).unwrap();
        m.fallocate(&root, f.ino, FallocMode::default(), 0, 4096)
            .unwrap();
        assert_errno(m.fallocate(&root, f.ino, punch, 0, 10), libc::EPERM);
        assert_errno(m.setattr(&root, f.ino, &chmod), libc::EPERM);
        assert_errno(m.truncate(&root, f.ino, 0), libc::EPERM);
        assert_errno(m.unlink(&root, ROOT_INO, b"f"), libc::EPERM);
        assert_errno(m.copy_range(&root, g.ino, 0, f.ino, 0, 10), libc::EBADF);

        // Directories: immutable takes no entries, append-only keeps those it has.
        let d = mkdir(m, ROOT_INO, "d");
        mkfile(m, d.ino, "in");
        m.set_flags(&root, d.ino, flags::IMMUTABLE, false).unwrap();
        assert_errno(
            m.mknod(&root, d.ino, b"new", Kind::File, 0o644, 0, None),
            libc::EPERM,
        );
        assert_errno(m.unlink(&root, d.ino, b"in"), libc::EPERM);
        assert_errno(
            m.rename(&root, ROOT_INO, b"g", d.ino, b"g", flags(false, false)),
            libc::EPERM,
        );
        m.set_flags(&root, d.ino, flags::APPEND, false).unwrap();
        mkfile(m, d.ino, "new");
        m.rename(&root, ROOT_INO, b"g", d.ino, b"g", flags(false, false))
            .unwrap();
        assert_errno(m.unlink(&root, d.ino, b"in"), libc::EPERM);
        assert_errno(
            m.rename(&root, d.ino, b"g", ROOT_INO, b"g", flags(false, false)),
            libc::EPERM,
        );

        // Cleared: everything works again.
        m.set_flags(&root, d.ino, 0, false).unwrap();
        m.set_flags(&root, f.ino, 0, false).unwrap();
        m.truncate(&root, f.ino, 0).unwrap();
        m.unlink(&root, d.ino, b"in").unwrap();
        m.unlink(&root, ROOT_INO, b"f").unwrap();
    });
}

// ---------------------------------------------------------------------------------------------
// setattr
// ---------------------------------------------------------------------------------------------
fn setattr_fields(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let set = |s: SetAttr| m.setattr(&CTX, f.ino, &s).unwrap();
        // Nothing to change: nothing changes, ctime included.
        tick();
        assert_eq!(set(SetAttr::default()), f);
        assert_eq!(m.getattr(f.ino).unwrap(), f);
        // Mode.
        let t0 = tick();
        let a = set(SetAttr {
            mode: Some(0o4711),
            ..Default::default()
        });
        assert_eq!(a.mode, 0o4711);
        assert!(a.ctime >= t0, "ctime moves");
        assert_eq!((a.mtime, a.atime), (f.mtime, f.atime), "only ctime moves");
        assert_eq!(m.getattr(f.ino).unwrap(), a);
        let a = set(SetAttr {
            mode: Some(libc::S_IFREG | 0o640),
            ..Default::default()
        });
        assert_eq!((a.mode, a.kind), (0o640, Kind::File), "type bits ignored");
        // Owner.
        let t1 = tick();
        let a = set(SetAttr {
            uid: Some(4242),
            gid: Some(4343),
            ..Default::default()
        });
        assert_eq!((a.uid, a.gid, a.mode), (4242, 4343, 0o640));
        assert!(a.ctime >= t1);
        let a = set(SetAttr {
            gid: Some(7),
            ..Default::default()
        });
        assert_eq!((a.uid, a.gid), (4242, 7), "uid kept");
        // Times at given instants.
        let t2 = tick();
        let a = set(SetAttr {
            atime: Some(SetTime::At(1_234_567_891)),
            mtime: Some(SetTime::At(987_654_321_000)),
            ..Default::default()
        });
        assert_eq!((a.atime, a.mtime), (1_234_567_891, 987_654_321_000));
        assert!(a.ctime >= t2, "ctime is now, not the given time");
        let a = set(SetAttr {
            mtime: Some(SetTime::At(5)),
            ..Default::default()
        });
        assert_eq!((a.atime, a.mtime), (1_234_567_891, 5), "atime kept");
        // Times set to now.
        let t3 = tick();
        let a = set(SetAttr {
            atime: Some(SetTime::Now),
            ..Default::default()
        });
        let t4 = now_nanos();
        assert!(a.atime >= t3 && a.atime <= t4);
        assert_eq!(a.mtime, 5);
        let a = set(SetAttr {
            mtime: Some(SetTime::Now),
            ..Default::default()
        });
        assert!(a.mtime >= t3 && a.mtime <= now_nanos());
        assert_eq!(m.getattr(f.ino).unwrap(), a);
        // Then again nothing.
        tick();
        assert_eq!(set(SetAttr::default()), a);
        assert_eq!(m.getattr(f.ino).unwrap(), a);
        // Directories and the root too.
        let r = m
            .setattr(
                &CTX,
                ROOT_INO,
                &SetAttr {
                    mode: Some(0o1777),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!((r.mode, r.kind, r.nlink), (0o1777, Kind::Dir, 2));
        assert_errno(m.setattr(&CTX, 999_999, &SetAttr::default()), libc::ENOENT);
    });
}

// ---------------------------------------------------------------------------------------------
// xattrs
// ---------------------------------------------------------------------------------------------
fn xattrs(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        assert!(m.list_xattr(f.ino).unwrap().is_empty());
        assert_errno(m.get_xattr(f.ino, b"user.a"), libc::ENODATA);
        let t0 = tick();
        m.set_xattr(&CTX, f.ino, b"user.b", b"2", XattrSet::Any)
            .unwrap();
        assert!(m.getattr(f.ino).unwrap().ctime >= t0, "set moves ctime");
        m.set_xattr(&CTX, f.ino, b"user.a", b"1", XattrSet::Any)
            .unwrap();
        m.set_xattr(&CTX, f.ino, b"user.empty", b"", XattrSet::Any)
            .unwrap();
        assert_eq!(m.get_xattr(f.ino, b"user.a").unwrap(), b"1");
        assert_eq!(m.get_xattr(f.ino, b"user.b").unwrap(), b"2");
        assert_eq!(m.get_xattr(f.ino, b"user.empty").unwrap(), b"");
        let mut l = m.list_xattr(f.ino).unwrap();
        l.sort();
        assert_eq!(
            l,
            vec![
                b"user.a".to_vec(),
                b"user.b".to_vec(),
                b"user.empty".to_vec()
            ]
        );
        // Any overwrites.
        m.set_xattr(&CTX, f.ino, b"user.a", b"one", XattrSet::Any)
            .unwrap();
        assert_eq!(m.get_xattr(f.ino, b"user.a").unwrap(), b"one");
        // Create / Replace.
        assert_errno(
            m.set_xattr(&CTX, f.ino, b"user.a", b"x", XattrSet::Create),
            libc::EEXIST,
        );
        assert_eq!(m.get_xattr(f.ino, b"user.a").unwrap(), b"one");
        m.set_xattr(&CTX, f.ino, b"user.c", b"3", XattrSet::Create)
            .unwrap();
        assert_errno(
            m.set_xattr(&CTX, f.ino, b"user.none", b"x", XattrSet::Replace),
            libc::ENODATA,
        );
        assert_errno(m.get_xattr(f.ino, b"user.none"), libc::ENODATA);
        m.set_xattr(&CTX, f.ino, b"user.c", b"three", XattrSet::Replace)
            .unwrap();
        assert_eq!(m.get_xattr(f.ino, b"user.c").unwrap(), b"three");
        // Binary values, exactly at the limit.
        let big: Vec<u8> = (0..MAX_XATTR_VALUE).map(|i| (i * 7) as u8).collect();
        m.set_xattr(&CTX, f.ino, b"user.big", &big, XattrSet::Any)
            .unwrap();
        assert_eq!(m.get_xattr(f.ino, b"user.big").unwrap(), big);
        let long_ok = vec![b'n'; MAX_XATTR_NAME];
        m.set_xattr(&CTX, f.ino, &long_ok, b"v", XattrSet::Any)
            .unwrap();
        assert_eq!(m.get_xattr(f.ino, &long_ok).unwrap(), b"v");
        // Over the limits.
        let too_long = vec![b'n'; MAX_XATTR_NAME + 1];
        assert_errno(
            m.set_xattr(&CTX, f.ino, &too_long, b"v", XattrSet::Any),
            libc::ERANGE,
        );
        assert_errno(m.get_xattr(f.ino, &too_long), libc::ERANGE);
        assert_errno(
            m.set_xattr(
                &CTX,
                f.ino,
                b"user.huge",
                &vec![0u8; MAX_XATTR_VALUE + 1],
                XattrSet::Any,
            ),
            libc::E2BIG,
        );
        assert_errno(m.get_xattr(f.ino, b"user.huge"), libc::ENODATA);
        // Remove.
        let t1 = tick();
        m.remove_xattr(&CTX, f.ino, b"user.a").unwrap();
        assert!(m.getattr(f.ino).unwrap().ctime >= t1, "remove moves ctime");
        assert_errno(m.get_xattr(f.ino, b"user.a"), libc::ENODATA);
        assert_errno(m.remove_xattr(&CTX, f.ino, b"user.a"), libc::ENODATA);
        assert_errno(m.remove_xattr(&CTX, f.ino, b"user.none"), libc::ENODATA);
        let l = m.list_xattr(f.ino).unwrap();
        assert_eq!(l.len(), 5, "{l:?}");
        assert!(!l.contains(&b"user.a".to_vec()));
        // Per inode: a directory has its own, and a new file none.
        let d = mkdir(m, ROOT_INO, "d");
        m.set_xattr(&CTX, d.ino, b"user.a", b"dir", XattrSet::Create)
            .unwrap();
        assert_eq!(m.get_xattr(d.ino, b"user.a").unwrap(), b"dir");
        assert_errno(m.get_xattr(f.ino, b"user.a"), libc::ENODATA);
        assert_errno(
            m.set_xattr(&CTX, d.ino, b"", b"x", XattrSet::Any),
            libc::EINVAL,
        );
        // Missing inode.
        assert_errno(m.get_xattr(999_999, b"user.a"), libc::ENOENT);
        assert_errno(m.list_xattr(999_999), libc::ENOENT);
        assert_errno(
            m.set_xattr(&CTX, 999_999, b"user.a", b"x", XattrSet::Any),
            libc::ENOENT,
        );
        assert_errno(m.remove_xattr(&CTX, 999_999, b"user.a"), libc::ENOENT);
        // A deleted inode's xattrs do not leak to anything later.
        m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert_errno(m.list_xattr(f.ino), libc::ENOENT);
    });
}
