//! rename(2) and renameat2(2) (pjdfstest rename/*).

use crate::common::pattern;
use crate::harness::*;
use crate::sys;
use std::path::Path;

fn src_file(d: &Dir) {
    create(Reg, d.p("src"));
}

/// Creates `kind` at `p` owned by uid/gid, or nothing for `None`.
fn maybe_create(kind: Option<Kind>, p: &Path, uid: u32, gid: u32) {
    if let Some(k) = kind {
        create_owned(k, p, uid, gid);
    }
}

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "rename (source)",
            needs: Needs::File,
            follows: false,
            prep: &no_prep,
            op: &|d, p| sys::rename(p, d.p("dst")),
        },
    );
    path_errors(
        env,
        &PathOp {
            name: "rename (destination)",
            needs: Needs::Nothing,
            follows: false,
            prep: &src_file,
            op: &|d, p| sys::rename(d.p("src"), p),
        },
    );

    env.case(
        "rename keeps inode, type, mode and links (every type)",
        |d| {
            for k in PLAIN {
                let n0 = d.p(&format!("{k:?}0"));
                let n1 = d.p(&format!("{k:?}1"));
                let n2 = d.p(&format!("{k:?}2"));
                create(k, &n0);
                ok(sys::chmod(&n0, 0o644), "chmod");
                let ino = lst(&n0).ino;
                ok(sys::rename(&n0, &n1), "rename");
                gone(&n0, "old name");
                let s = lst(&n1);
                assert_eq!(
                    (s.fmt(), s.ino, s.perm(), s.nlink),
                    (k.fmt(), ino, 0o644, 1),
                    "{k:?}"
                );
                ok(sys::link(&n1, &n0), "link");
                ok(sys::rename(&n1, &n2), "rename a linked file");
                gone(&n1, "old name");
                for p in [&n0, &n2] {
                    let s = lst(p);
                    assert_eq!((s.ino, s.nlink), (ino, 2), "{k:?}: after renaming one link");
                }
            }
            let dir = d.p("dir");
            create(Dir, &dir);
            create(Reg, dir.join("child"));
            let ino = lst(&dir).ino;
            ok(sys::rename(&dir, d.p("dir2")), "rename a directory");
            gone(&dir, "old dir name");
            let s = lst(d.p("dir2"));
            assert_eq!((s.fmt(), s.ino, s.perm()), (libc::S_IFDIR, ino, 0o755));
            lst(d.p("dir2/child"));
            // A symlink is renamed itself, not its target.
            let f = d.p("f");
            create(Reg, &f);
            ok(sys::symlink("f", d.p("l")), "symlink");
            let (fino, lino) = (lst(&f).ino, lst(d.p("l")).ino);
            ok(sys::rename(d.p("l"), d.p("l2")), "rename a symlink");
            assert_eq!(st(d.p("l2")).ino, fino, "link still points to the file");
            assert_eq!(lst(d.p("l2")).ino, lino, "same link");
            assert_eq!(lst(&f).ino, fino, "target not moved");
        },
    );

    env.case(
        "rename changes the moved inode's ctime (every type), not its mtime",
        |d| {
            for k in ALL {
                let src = d.p(&format!("{k:?}"));
                let dst = d.p(&format!("{k:?}-new"));
                create(k, &src);
                let b = lst(&src);
                ok(sys::rename(&src, &dst), "rename");
                let a = lst(&dst);
                later(b.ctime, a.ctime, format!("{k:?}: ctime"));
                if k != Dir {
                    same(b.mtime, a.mtime, format!("{k:?}: mtime"));
                }
            }
        },
    );

    env.case("rename updates the mtime and ctime of both parents", |d| {
        let a = d.p("a");
        let b = d.p("b");
        create(Dir, &a);
        create(Dir, &b);
        create(Reg, a.join("f"));
        let sa = st(&a);
        ok(sys::rename(a.join("f"), a.join("g")), "rename within a dir");
        let sa2 = st(&a);
        later(sa.mtime, sa2.mtime, "dir mtime (same dir)");
        later(sa.ctime, sa2.ctime, "dir ctime (same dir)");
        let (sa, sb) = (sa2, st(&b));
        ok(sys::rename(a.join("g"), b.join("h")), "rename across dirs");
        let (sa2, sb2) = (st(&a), st(&b));
        later(sa.mtime, sa2.mtime, "source dir mtime");
        later(sa.ctime, sa2.ctime, "source dir ctime");
        later(sb.mtime, sb2.mtime, "destination dir mtime");
        later(sb.ctime, sb2.ctime, "destination dir ctime");
    });

    env.case(
        "EACCES in a directory not writable by the user; nothing changes",
        |d| {
            for k in ALL {
                let src = d.p(&format!("{k:?}"));
                create(k, &src);
                let b = lst(&src);
                let dir = st(&d.path);
                fails(
                    as_nobody(|| sys::rename(&src, d.p("new"))),
                    libc::EACCES,
                    format!("{k:?}: rename as 65534 in root's 0755 dir"),
                );
                let a = lst(&src);
                same(b.ctime, a.ctime, format!("{k:?}: ctime"));
                same(dir.mtime, st(&d.path).mtime, format!("{k:?}: dir mtime"));
                gone(d.p("new"), "no new name");
            }
        },
    );

    env.case(
        "EACCES without write permission on the source or the destination dir",
        |d| {
            let n1 = d.p("n1");
            let n2 = d.p("n2");
            for p in [&n1, &n2] {
                ok(sys::mkdir(p, 0o755), "mkdir");
                ok(sys::chown(p, NOBODY, NOBODY), "chown");
            }
            create_owned(Reg, n1.join("f"), NOBODY, NOBODY);
            ok(
                as_nobody(|| sys::rename(n1.join("f"), n2.join("f"))),
                "as owner",
            );
            ok(
                as_nobody(|| sys::rename(n2.join("f"), n1.join("f"))),
                "and back",
            );
            ok(sys::chmod(&n2, 0o555), "chmod");
            fails(
                as_nobody(|| sys::rename(n1.join("f"), n2.join("f"))),
                libc::EACCES,
                "into a 0555 dir",
            );
            ok(sys::chmod(&n2, 0o755), "chmod");
            ok(sys::chmod(&n1, 0o555), "chmod");
            fails(
                as_nobody(|| sys::rename(n1.join("f"), n2.join("f"))),
                libc::EACCES,
                "out of a 0555 dir",
            );
            fails(
                as_nobody(|| sys::rename(n1.join("f"), n1.join("g"))),
                libc::EACCES,
                "within a 0555 dir",
            );
            lst(n1.join("f"));
        },
    );

    env.case(
        "moving a directory to another parent needs write permission on it",
        |d| {
            let n2 = d.p("n2");
            let n3 = d.p("n3");
            ok(sys::mkdir(&n2, 0o777), "mkdir");
            ok(sys::mkdir(&n3, 0o777), "mkdir");
            ok(sys::mkdir(n2.join("sub"), 0o700), "mkdir");
            ok(
                as_nobody(|| sys::rename(n2.join("sub"), n2.join("sub2"))),
                "same parent: allowed",
            );
            fails(
                as_nobody(|| sys::rename(n2.join("sub2"), n3.join("sub"))),
                libc::EACCES,
                "another parent: '..' must be rewritten",
            );
            lst(n2.join("sub2"));
            create(Reg, n2.join("f"));
            ok(
                as_nobody(|| sys::rename(n2.join("f"), n3.join("f"))),
                "a file needs no write permission on itself",
            );
        },
    );

    env.case(
        "replacing a multiply-linked target drops one link and updates its ctime",
        |d| {
            for k in PLAIN {
                let src = d.p(&format!("{k:?}-src"));
                let dst = d.p(&format!("{k:?}-dst"));
                let lnk = d.p(&format!("{k:?}-lnk"));
                create(k, &src);
                create(k, &dst);
                ok(sys::link(&dst, &lnk), "link");
                let b = lst(&lnk);
                ok(sys::rename(&src, &dst), "rename over");
                let a = lst(&lnk);
                assert_eq!((a.fmt(), a.nlink), (k.fmt(), 1), "{k:?}: other link");
                later(
                    b.ctime,
                    a.ctime,
                    format!("{k:?}: ctime of the replaced inode"),
                );
            }
        },
    );

    env.case(
        "a directory moved to another parent: nlinks and '..' follow",
        |d| {
            let sp = d.p("sp");
            let dp = d.p("dp");
            create(Dir, &sp);
            create(Dir, &dp);
            create(Dir, sp.join("src"));
            assert_eq!(lst(&sp).nlink, 3);
            assert_eq!(lst(&dp).nlink, 2);
            assert_eq!(lst(sp.join("src/..")).ino, lst(&sp).ino);
            let b = lst(sp.join("src"));
            ok(sys::rename(sp.join("src"), dp.join("dst")), "rename");
            assert_eq!(lst(&sp).nlink, 2, "source parent nlink");
            assert_eq!(lst(&dp).nlink, 3, "destination parent nlink");
            let a = lst(dp.join("dst"));
            assert_eq!((a.ino, a.nlink), (b.ino, 2));
            assert_eq!(
                lst(dp.join("dst/..")).ino,
                lst(&dp).ino,
                "'..' is the new parent"
            );
            later(b.ctime, a.ctime, "moved dir's ctime");
            // And the new '..' is usable for creating and resolving.
            create(Reg, dp.join("dst/../viaparent"));
            lst(dp.join("viaparent"));
        },
    );

    env.case(
        "rename over an existing file replaces it; an open target stays readable",
        |d| {
            let a = d.p("a");
            let b = d.p("b");
            write_file(&a, b"new contents");
            write_file(&b, b"old contents");
            let ino = lst(&a).ino;
            let fd = ok(sys::open(&b, libc::O_RDONLY, 0), "open the target");
            let dir = st(&d.path);
            ok(sys::rename(&a, &b), "rename over a file");
            gone(&a, "source name");
            assert_eq!(lst(&b).ino, ino);
            assert_eq!(read_file(&b), b"new contents");
            assert_eq!(ok(sys::pread(&fd, 100, 0), "pread"), b"old contents");
            assert_eq!(
                ok(sys::fstat(&fd), "fstat").nlink,
                0,
                "replaced inode unlinked"
            );
            let dir2 = st(&d.path);
            later(dir.mtime, dir2.mtime, "dir mtime");
            assert_eq!(dir2.nlink, dir.nlink);
        },
    );

    env.case(
        "rename over symlinks replaces the link, not its target",
        |d| {
            let t = d.p("t");
            write_file(&t, b"target");
            ok(sys::symlink("t", d.p("l")), "symlink");
            write_file(d.p("f"), b"file");
            ok(sys::rename(d.p("f"), d.p("l")), "file over symlink");
            assert_eq!(lst(d.p("l")).fmt(), libc::S_IFREG);
            assert_eq!(read_file(&t), b"target", "target untouched");
            ok(sys::symlink("t", d.p("l2")), "symlink");
            ok(sys::rename(d.p("l2"), d.p("l")), "symlink over file");
            assert_eq!(lst(d.p("l")).fmt(), libc::S_IFLNK);
            assert_eq!(read_file(d.p("l")), b"target");
        },
    );

    env.case("a directory replaces an empty directory", |d| {
        let a = d.p("a");
        let b = d.p("b");
        create(Dir, &a);
        create(Dir, &b);
        create(Reg, a.join("inside"));
        let ino = lst(&a).ino;
        let nlink = st(&d.path).nlink;
        ok(sys::rename(&a, &b), "dir over empty dir");
        gone(&a, "source");
        assert_eq!(lst(&b).ino, ino);
        lst(b.join("inside"));
        assert_eq!(
            st(&d.path).nlink,
            nlink - 1,
            "parent lost the replaced dir's '..'"
        );
        // Across parents too.
        let p = d.p("p");
        create(Dir, &p);
        create(Dir, p.join("empty"));
        ok(
            sys::rename(&b, p.join("empty")),
            "dir over empty dir elsewhere",
        );
        assert_eq!(lst(&p).nlink, 3);
        assert_eq!(lst(p.join("empty/..")).ino, lst(&p).ino);
    });

    env.case(
        "renaming a file onto itself or another of its links does nothing",
        |d| {
            let a = d.p("a");
            let b = d.p("b");
            write_file(&a, b"x");
            ok(sys::link(&a, &b), "link");
            let dir = st(&d.path);
            let f = lst(&a);
            ok(sys::rename(&a, &a), "rename a a");
            ok(sys::rename(&a, &b), "rename a b (same inode)");
            lst(&a);
            lst(&b);
            assert_eq!(lst(&a).nlink, 2);
            same(dir.mtime, st(&d.path).mtime, "dir mtime");
            same(f.ctime, lst(&a).ctime, "file ctime");
            create(Dir, d.p("dir"));
            ok(sys::rename(d.p("dir"), d.p("dir")), "rename dir dir");
        },
    );

    env.case("EINVAL moving a directory into itself or below", |d| {
        let n0 = d.p("n0");
        create(Dir, &n0);
        create(Dir, n0.join("n1"));
        fails(
            sys::rename(&n0, n0.join("n1")),
            libc::EINVAL,
            "into its child (existing)",
        );
        fails(
            sys::rename(&n0, n0.join("n1/n2")),
            libc::EINVAL,
            "below its child",
        );
        fails(
            sys::rename(&n0, n0.join("new")),
            libc::EINVAL,
            "into itself",
        );
        lst(n0.join("n1"));
    });

    env.case("EINVAL or EBUSY renaming '.' or '..'", |d| {
        create(Dir, d.p("n0"));
        create(Dir, d.p("n0/n1"));
        fails_any(
            sys::rename(d.p("n0/n1/."), d.p("x")),
            &[libc::EINVAL, libc::EBUSY],
            "rename n0/n1/.",
        );
        fails_any(
            sys::rename(d.p("n0/n1/.."), d.p("x")),
            &[libc::EINVAL, libc::EBUSY],
            "rename n0/n1/..",
        );
        create(Dir, d.p("y"));
        fails_any(
            sys::rename(d.p("y"), d.p("n0/n1/.")),
            &[libc::EINVAL, libc::EBUSY],
            "rename onto n0/n1/.",
        );
        lst(d.p("n0/n1"));
        lst(d.p("y"));
    });

    env.case(
        "ENOTEMPTY when the target directory is not empty (every child type)",
        |d| {
            let n0 = d.p("n0");
            let n1 = d.p("n1");
            create(Dir, &n0);
            create(Dir, &n1);
            for k in ALL {
                let c = n1.join("child");
                create(k, &c);
                fails(
                    sys::rename(&n0, &n1),
                    libc::ENOTEMPTY,
                    format!("child {k:?}"),
                );
                ok(remove(&c), "remove");
            }
            lst(&n0);
        },
    );

    env.case(
        "ENOTEMPTY when the target is an ancestor of the source",
        |d| {
            create(Dir, d.p("a"));
            create(Dir, d.p("a/b"));
            fails(
                sys::rename(d.p("a/b"), d.p("a")),
                libc::ENOTEMPTY,
                "rename a/b a",
            );
        },
    );

    env.case(
        "EISDIR file onto directory; ENOTDIR directory onto non-directory",
        |d| {
            let f = d.p("f");
            let dir = d.p("dir");
            create(Reg, &f);
            create(Dir, &dir);
            let b = st(&d.path);
            fails(sys::rename(&f, &dir), libc::EISDIR, "file onto empty dir");
            create(Reg, dir.join("x"));
            fails(
                sys::rename(&f, &dir),
                libc::EISDIR,
                "file onto non-empty dir",
            );
            let a = st(&d.path);
            same(b.mtime, a.mtime, "parent mtime after failures");
            let other = d.p("dir2");
            create(Dir, &other);
            for k in NOT_DIR {
                let t = d.p(&format!("{k:?}"));
                create(k, &t);
                fails(
                    sys::rename(&other, &t),
                    libc::ENOTDIR,
                    format!("dir onto {k:?}"),
                );
                assert_eq!(lst(&t).fmt(), k.fmt());
            }
            fails(
                sys::rename(&f, d.p("new/")),
                libc::ENOTDIR,
                "file to a name with a trailing slash",
            );
            ok(
                sys::rename(d.p("dir2/"), d.p("dir3/")),
                "dir with trailing slashes",
            );
        },
    );

    env.case("ENOENT for a missing source or destination prefix", |d| {
        fails(
            sys::rename(d.p("missing"), d.p("x")),
            libc::ENOENT,
            "missing source",
        );
        create(Reg, d.p("f"));
        fails(
            sys::rename(d.p("f"), d.p("missing/x")),
            libc::ENOENT,
            "missing destination prefix",
        );
        lst(d.p("f"));
    });

    env.case(
        "sticky source directory: EPERM unless owning the file or the directory",
        |d| {
            let n0 = d.p("n0");
            let n1 = d.p("n1");
            ok(sys::mkdir(&n0, 0o755), "mkdir");
            ok(sys::chmod(&n0, 0o1777), "chmod");
            ok(sys::mkdir(&n1, 0o755), "mkdir");
            ok(sys::chown(&n1, NOBODY, NOBODY), "chown");
            let src = n0.join("src");
            let dst = n1.join("dst");
            for k in NOT_DIR {
                // (directory owner, file owner, allowed)
                for (downer, fowner, allowed) in [
                    (NOBODY, NOBODY, true),
                    (NOBODY, 0, true),
                    (NOBODY, OTHER, true),
                    (0, NOBODY, true),
                    (OTHER, NOBODY, true),
                    (0, 0, false),
                    (OTHER, OTHER, false),
                ] {
                    ok(sys::chown(&n0, downer, downer), "chown");
                    create_owned(k, &src, fowner, fowner);
                    let ino = lst(&src).ino;
                    for t in [None, Some(Reg), Some(Symlink)] {
                        maybe_create(t, &dst, NOBODY, NOBODY);
                        let what = format!(
                            "{k:?} owned by {fowner} in sticky dir of {downer}, over {t:?}"
                        );
                        let r = as_nobody(|| sys::rename(&src, &dst));
                        if allowed {
                            ok(r, &what);
                            gone(&src, &what);
                            assert_eq!(lst(&dst).ino, ino, "{what}");
                            ok(
                                as_nobody(|| sys::rename(&dst, &src)),
                                format!("{what}: back"),
                            );
                            assert_eq!(lst(&src).ino, ino, "{what}");
                        } else {
                            fails_any(r, &[libc::EPERM, libc::EACCES], &what);
                            assert_eq!(lst(&src).ino, ino, "{what}: source kept");
                            if t.is_some() {
                                assert_eq!(lst(&dst).uid, NOBODY, "{what}: target kept");
                                ok(sys::unlink(&dst), "cleanup");
                            }
                        }
                    }
                    ok(sys::unlink(&src), "cleanup");
                }
            }
            // Directories in the sticky directory.
            for (downer, fowner) in [(NOBODY, NOBODY), (0, NOBODY), (NOBODY, 0), (0, 0)] {
                ok(sys::chown(&n0, downer, downer), "chown");
                ok(sys::mkdir(&src, 0o755), "mkdir");
                ok(sys::chown(&src, fowner, fowner), "chown");
                let what = format!("dir owned by {fowner} in sticky dir of {downer}");
                let r = as_nobody(|| sys::rename(&src, &dst));
                if fowner == NOBODY {
                    ok(r, &what);
                    ok(sys::rename(&dst, &src), "back");
                } else {
                    // Not the owner: the sticky rule (if the dir is not the user's) or the
                    // write permission needed to rewrite '..'.
                    fails_any(r, &[libc::EPERM, libc::EACCES], &what);
                    if downer == NOBODY {
                        ok(
                            as_nobody(|| sys::rename(&src, n0.join("renamed"))),
                            format!("{what}: within the user's sticky dir"),
                        );
                        ok(sys::rename(n0.join("renamed"), &src), "back");
                    }
                }
                lst(&src);
                ok(sys::rmdir(&src), "cleanup");
            }
        },
    );

    env.case(
        "sticky destination directory: EPERM replacing others' files",
        |d| {
            let n0 = d.p("n0");
            let n1 = d.p("n1");
            ok(sys::mkdir(&n0, 0o755), "mkdir");
            ok(sys::chown(&n0, NOBODY, NOBODY), "chown");
            ok(sys::mkdir(&n1, 0o755), "mkdir");
            ok(sys::chmod(&n1, 0o1777), "chmod");
            let src = n0.join("src");
            let dst = n1.join("dst");
            for k in NOT_DIR {
                for t in NOT_DIR {
                    for (downer, towner, allowed) in [
                        (NOBODY, NOBODY, true),
                        (NOBODY, 0, true),
                        (0, NOBODY, true),
                        (OTHER, NOBODY, true),
                        (0, 0, false),
                        (OTHER, OTHER, false),
                    ] {
                        ok(sys::chown(&n1, downer, downer), "chown");
                        create_owned(k, &src, NOBODY, NOBODY);
                        create_owned(t, &dst, towner, towner);
                        let ino = lst(&src).ino;
                        let what =
                            format!("{k:?} over {t:?} owned by {towner} in sticky dir of {downer}");
                        let r = as_nobody(|| sys::rename(&src, &dst));
                        if allowed {
                            ok(r, &what);
                            assert_eq!(lst(&dst).ino, ino, "{what}");
                            ok(sys::unlink(&dst), "cleanup");
                        } else {
                            fails_any(r, &[libc::EPERM, libc::EACCES], &what);
                            assert_eq!(lst(&dst).uid, towner, "{what}: target kept");
                            ok(sys::unlink(&dst), "cleanup");
                            ok(sys::unlink(&src), "cleanup");
                        }
                    }
                }
            }
            // Directories.
            for (downer, towner, allowed) in [(NOBODY, 0, true), (0, NOBODY, true), (0, 0, false)] {
                ok(sys::chown(&n1, downer, downer), "chown");
                ok(as_nobody(|| sys::mkdir(&src, 0o755)), "mkdir");
                ok(as_user(towner, towner, || sys::mkdir(&dst, 0o755)), "mkdir");
                let what = format!("dir over dir owned by {towner} in sticky dir of {downer}");
                let r = as_nobody(|| sys::rename(&src, &dst));
                if allowed {
                    ok(r, &what);
                    ok(sys::rmdir(&dst), "cleanup");
                } else {
                    fails_any(r, &[libc::EPERM, libc::EACCES], &what);
                    assert_eq!(lst(&dst).uid, towner, "{what}: target kept");
                    ok(sys::rmdir(&dst), "cleanup");
                    ok(sys::rmdir(&src), "cleanup");
                }
            }
        },
    );

    env.case("EXDEV renaming to another file system", |d| {
        let Some(other) = &d.other_fs else { return };
        create(Reg, d.p("f"));
        fails(
            sys::rename(d.p("f"), other.join("f")),
            libc::EXDEV,
            "rename out",
        );
        create(Reg, other.join("g"));
        fails(
            sys::rename(other.join("g"), d.p("g")),
            libc::EXDEV,
            "rename in",
        );
        lst(d.p("f"));
    });

    env.case(
        "RENAME_NOREPLACE: EEXIST on an existing target, else renames",
        |d| {
            write_file(d.p("a"), b"a");
            write_file(d.p("b"), b"b");
            fails(
                sys::renameat2(d.p("a"), d.p("b"), libc::RENAME_NOREPLACE),
                libc::EEXIST,
                "onto an existing file",
            );
            assert_eq!(read_file(d.p("b")), b"b");
            ok(
                sys::renameat2(d.p("a"), d.p("c"), libc::RENAME_NOREPLACE),
                "to a free name",
            );
            gone(d.p("a"), "source");
            assert_eq!(read_file(d.p("c")), b"a");
        },
    );

    env.case(
        "RENAME_EXCHANGE swaps two entries (and '..' of directories)",
        |d| {
            write_file(d.p("a"), b"a");
            write_file(d.p("b"), b"b");
            let (ia, ib) = (lst(d.p("a")).ino, lst(d.p("b")).ino);
            ok(
                sys::renameat2(d.p("a"), d.p("b"), libc::RENAME_EXCHANGE),
                "exchange files",
            );
            assert_eq!((lst(d.p("a")).ino, lst(d.p("b")).ino), (ib, ia));
            assert_eq!(read_file(d.p("a")), b"b");
            let p = d.p("p");
            create(Dir, &p);
            create(Dir, p.join("sub"));
            let (nd, np) = (st(&d.path).nlink, st(&p).nlink);
            ok(
                sys::renameat2(d.p("a"), p.join("sub"), libc::RENAME_EXCHANGE),
                "exchange a file and a dir across parents",
            );
            assert!(lst(d.p("a")).is_dir());
            assert_eq!(lst(p.join("sub")).fmt(), libc::S_IFREG);
            assert_eq!(
                lst(d.p("a/..")).ino,
                lst(&d.path).ino,
                "'..' of the moved dir"
            );
            assert_eq!(st(&d.path).nlink, nd + 1, "nlink of the dir's new parent");
            assert_eq!(st(&p).nlink, np - 1, "nlink of the dir's old parent");
            fails(
                sys::renameat2(d.p("a"), d.p("missing"), libc::RENAME_EXCHANGE),
                libc::ENOENT,
                "exchange with a missing entry",
            );
            fails(
                sys::renameat2(
                    d.p("a"),
                    d.p("b"),
                    libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE,
                ),
                libc::EINVAL,
                "both flags",
            );
        },
    );

    env.case(
        "renaming a file with unflushed writes, then reading it back",
        |d| {
            let data = pattern(1 << 20, 11);
            let fd = ok(
                sys::open(d.p("a"), libc::O_CREAT | libc::O_WRONLY, 0o644),
                "open",
            );
            ok(sys::write(&fd, &data), "write");
            ok(sys::rename(d.p("a"), d.p("b")), "rename while open");
            ok(sys::write(&fd, b"tail"), "write after rename");
            drop(fd);
            let got = read_file(d.p("b"));
            assert_eq!(got.len(), data.len() + 4);
            assert!(got[..data.len()] == data[..] && &got[data.len()..] == b"tail");
        },
    );

    env.case(
        "a replaced target that is still open keeps its unflushed writes",
        |d| {
            write_file(d.p("a"), b"new");
            let fd = ok(
                sys::open(d.p("b"), libc::O_CREAT | libc::O_RDWR, 0o644),
                "open b",
            );
            ok(sys::write(&fd, b"pending"), "write");
            ok(sys::rename(d.p("a"), d.p("b")), "rename a over b");
            assert_eq!(ok(sys::pread(&fd, 100, 0), "pread"), b"pending");
            ok(sys::write(&fd, b"+more"), "write after being replaced");
            assert_eq!(ok(sys::pread(&fd, 100, 0), "pread"), b"pending+more");
            drop(fd);
            assert_eq!(read_file(d.p("b")), b"new");
        },
    );

    env.case("readdir shows the new name and not the old one", |d| {
        create(Reg, d.p("a"));
        create(Dir, d.p("sub"));
        ok(sys::rename(d.p("a"), d.p("b")), "rename");
        ok(sys::rename(d.p("b"), d.p("sub/c")), "rename into sub");
        let names = |p: std::path::PathBuf| {
            let mut v: Vec<String> = std::fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(d.path.clone()), vec!["sub".to_string()]);
        assert_eq!(names(d.p("sub")), vec!["c".to_string()]);
    });
}
