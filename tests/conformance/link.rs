//! link(2) and linkat(2) (pjdfstest link/*).

use crate::harness::*;
use crate::sys;

fn src_file(d: &Dir) {
    create(Reg, d.p("src"));
}

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "link (source)",
            needs: Needs::File,
            follows: false,
            prep: &no_prep,
            op: &|d, p| sys::link(p, d.p("newlink")),
        },
    );
    path_errors(
        env,
        &PathOp {
            name: "link (destination)",
            needs: Needs::Nothing,
            follows: false,
            prep: &src_file,
            op: &|d, p| sys::link(d.p("src"), p),
        },
    );

    env.case(
        "links share the inode; nlink counts them (each type)",
        |d| {
            for k in PLAIN {
                let n0 = d.p(&format!("{k:?}0"));
                let n1 = d.p(&format!("{k:?}1"));
                let n2 = d.p(&format!("{k:?}2"));
                create(k, &n0);
                let s = lst(&n0);
                assert_eq!((s.fmt(), s.nlink), (k.fmt(), 1), "{k:?}");
                ok(sys::link(&n0, &n1), "link");
                assert_eq!(lst(&n0).nlink, 2, "{k:?}");
                assert_eq!(lst(&n1).nlink, 2, "{k:?}");
                ok(sys::link(&n1, &n2), "link");
                for p in [&n0, &n1, &n2] {
                    let s = lst(p);
                    assert_eq!(
                        (s.fmt(), s.nlink, s.ino),
                        (k.fmt(), 3, lst(&n0).ino),
                        "{k:?}"
                    );
                }
                ok(sys::chmod(&n1, 0o201), "chmod");
                ok(sys::chown(&n1, NOBODY, OTHER), "chown");
                for p in [&n0, &n1, &n2] {
                    let s = lst(p);
                    assert_eq!(
                        (s.perm(), s.nlink, s.uid, s.gid),
                        (0o201, 3, NOBODY, OTHER),
                        "{k:?}: shared attributes"
                    );
                }
                ok(sys::unlink(&n0), "unlink");
                gone(&n0, "unlinked name");
                assert_eq!(lst(&n1).nlink, 2, "{k:?}");
                assert_eq!(lst(&n2).perm(), 0o201, "{k:?}");
                ok(sys::unlink(&n2), "unlink");
                gone(&n2, "unlinked name");
                assert_eq!(lst(&n1).nlink, 1, "{k:?}");
                ok(sys::unlink(&n1), "unlink");
                gone(&n1, "last name");
            }
        },
    );

    env.case(
        "data written through one name is read through the other",
        |d| {
            let a = d.p("a");
            let b = d.p("b");
            write_file(&a, b"first");
            ok(sys::link(&a, &b), "link");
            write_file(&b, b"second version");
            assert_eq!(read_file(&a), b"second version");
            ok(sys::unlink(&b), "unlink");
            assert_eq!(read_file(&a), b"second version");
        },
    );

    env.case(
        "link updates the file's ctime and the directory's mtime/ctime",
        |d| {
            for k in PLAIN {
                let n0 = d.p(&format!("{k:?}0"));
                let n1 = d.p(&format!("{k:?}1"));
                create(k, &n0);
                let f = st(&n0);
                let dir = st(&d.path);
                ok(sys::link(&n0, &n1), "link");
                let f2 = st(&n0);
                let dir2 = st(&d.path);
                later(f.ctime, f2.ctime, format!("{k:?}: file ctime"));
                same(f.mtime, f2.mtime, format!("{k:?}: file mtime"));
                later(dir.ctime, dir2.ctime, format!("{k:?}: dir ctime"));
                later(dir.mtime, dir2.mtime, format!("{k:?}: dir mtime"));
            }
        },
    );

    env.case(
        "link into another directory changes only the destination directory",
        |d| {
            let a = d.p("a");
            let b = d.p("b");
            create(Dir, &a);
            create(Dir, &b);
            create(Reg, a.join("f"));
            let sa = st(&a);
            let sb = st(&b);
            ok(sys::link(a.join("f"), b.join("g")), "link");
            let sa2 = st(&a);
            let sb2 = st(&b);
            same(sa.mtime, sa2.mtime, "source dir mtime");
            same(sa.ctime, sa2.ctime, "source dir ctime");
            later(sb.mtime, sb2.mtime, "destination dir mtime");
            later(sb.ctime, sb2.ctime, "destination dir ctime");
            assert_eq!(
                sb2.nlink, sb.nlink,
                "a file link does not change the dir's nlink"
            );
        },
    );

    env.case(
        "EACCES in a directory not writable by the user; nothing changes",
        |d| {
            for k in PLAIN {
                let n0 = d.p(&format!("{k:?}0"));
                let n1 = d.p(&format!("{k:?}1"));
                create(k, &n0);
                ok(sys::lchown(&n0, NOBODY, 0), "chown");
                let f = st(&n0);
                let dir = st(&d.path);
                fails(
                    as_nobody(|| sys::link(&n0, &n1)),
                    libc::EACCES,
                    format!("{k:?}: link as 65534 in root's 0755 dir"),
                );
                let f2 = st(&n0);
                let dir2 = st(&d.path);
                same(f.ctime, f2.ctime, format!("{k:?}: file ctime"));
                assert_eq!(f2.nlink, 1, "{k:?}: nlink");
                same(dir.ctime, dir2.ctime, format!("{k:?}: dir ctime"));
                same(dir.mtime, dir2.mtime, format!("{k:?}: dir mtime"));
                gone(&n1, "no new name");
            }
        },
    );

    env.case(
        "EACCES without write permission on the destination (link/07)",
        |d| {
            let n1 = d.p("n1");
            let n2 = d.p("n2");
            for p in [&n1, &n2] {
                ok(sys::mkdir(p, 0o755), "mkdir");
                ok(sys::chown(p, NOBODY, NOBODY), "chown");
            }
            let src = n1.join("f");
            ok(
                as_nobody(|| sys::open_close(&src, libc::O_CREAT | libc::O_WRONLY, 0o644)),
                "create",
            );
            ok(as_nobody(|| sys::link(&src, n2.join("g"))), "link as owner");
            ok(as_nobody(|| sys::unlink(n2.join("g"))), "unlink");
            ok(sys::chmod(&n2, 0o555), "chmod");
            fails(
                as_nobody(|| sys::link(&src, n2.join("g"))),
                libc::EACCES,
                "link into a 0555 dir",
            );
            ok(sys::chmod(&n1, 0o555), "chmod");
            fails(
                as_nobody(|| sys::link(&src, n1.join("g"))),
                libc::EACCES,
                "link within a 0555 dir",
            );
            ok(sys::chmod(&n1, 0o755), "chmod");
        },
    );

    env.case("EPERM linking a directory (root and user)", |d| {
        let dir = d.p("dir");
        create(Dir, &dir);
        fails(
            sys::link(&dir, d.p("dir2")),
            libc::EPERM,
            "link of a dir by root",
        );
        let u = d.p("u");
        ok(sys::mkdir(&u, 0o755), "mkdir");
        ok(sys::chown(&u, NOBODY, NOBODY), "chown");
        ok(
            as_nobody(|| sys::mkdir(u.join("sub"), 0o755)),
            "mkdir as 65534",
        );
        fails(
            as_nobody(|| sys::link(u.join("sub"), u.join("sub2"))),
            libc::EPERM,
            "link of a dir by its owner",
        );
        assert_eq!(lst(&dir).nlink, 2);
    });

    env.case("EEXIST when the destination exists (every type)", |d| {
        let src = d.p("src");
        create(Reg, &src);
        for k in ALL {
            let p = d.p(&format!("{k:?}"));
            create(k, &p);
            fails(sys::link(&src, &p), libc::EEXIST, format!("over a {k:?}"));
        }
        let dangling = d.p("dangling");
        ok(sys::symlink("nowhere", &dangling), "symlink");
        fails(
            sys::link(&src, &dangling),
            libc::EEXIST,
            "over a dangling symlink",
        );
        assert_eq!(lst(&src).nlink, 1);
    });

    env.case("ENOENT when the source does not exist", |d| {
        fails(
            sys::link(d.p("missing"), d.p("new")),
            libc::ENOENT,
            "missing source",
        );
        gone(d.p("new"), "no destination");
    });

    env.case(
        "link does not follow a symlink source; linkat(AT_SYMLINK_FOLLOW) does",
        |d| {
            let f = d.p("f");
            let l = d.p("l");
            create(Reg, &f);
            ok(sys::symlink("f", &l), "symlink");
            ok(sys::link(&l, d.p("l2")), "link of a symlink");
            let s = lst(d.p("l2"));
            assert_eq!(
                (s.fmt(), s.nlink),
                (libc::S_IFLNK, 2),
                "hard link to the symlink"
            );
            assert_eq!(lst(&f).nlink, 1, "target untouched");
            ok(
                sys::linkat_follow(&l, d.p("f2")),
                "linkat AT_SYMLINK_FOLLOW",
            );
            let s = lst(d.p("f2"));
            assert_eq!((s.fmt(), s.ino), (libc::S_IFREG, lst(&f).ino));
            assert_eq!(lst(&f).nlink, 2);
            // A dangling symlink can be hard-linked too.
            ok(sys::symlink("nowhere", d.p("dl")), "symlink");
            ok(
                sys::link(d.p("dl"), d.p("dl2")),
                "link of a dangling symlink",
            );
            assert_eq!(sys::readlink(d.p("dl2")), Ok(b"nowhere".to_vec()));
        },
    );

    env.case(
        "protected_hardlinks: EPERM linking another user's unwritable file",
        |d| {
            let on = std::fs::read_to_string("/proc/sys/fs/protected_hardlinks")
                .map(|s| s.trim() == "1")
                .unwrap_or(false);
            ok(sys::chmod(&d.path, 0o777), "chmod");
            let f = d.p("f");
            create(Reg, &f);
            ok(sys::chmod(&f, 0o600), "chmod");
            let r = as_nobody(|| sys::link(&f, d.p("g")));
            if on {
                fails(r, libc::EPERM, "link of root's 0600 file as 65534");
            } else {
                ok(r, "link with protected_hardlinks off");
            }
            // The owner may always link.
            let g = d.p("mine");
            create_owned(Reg, &g, NOBODY, NOBODY);
            ok(sys::chmod(&g, 0o400), "chmod");
            ok(
                as_nobody(|| sys::link(&g, d.p("mine2"))),
                "owner links own file",
            );
        },
    );

    env.case("EXDEV linking to another file system", |d| {
        let Some(other) = &d.other_fs else { return };
        let f = d.p("f");
        create(Reg, &f);
        fails(
            sys::link(&f, other.join("x")),
            libc::EXDEV,
            "link across mounts",
        );
        let g = other.join("g");
        create(Reg, &g);
        fails(sys::link(&g, d.p("g")), libc::EXDEV, "link into this mount");
    });

    env.case("ENOTDIR with a trailing slash on a file", |d| {
        let f = d.p("f");
        create(Reg, &f);
        fails(
            sys::link(d.p("f/"), d.p("g")),
            libc::ENOTDIR,
            "source with a trailing slash",
        );
    });

    env.case("unflushed writes are seen through another link", |d| {
        let fd = ok(
            sys::open(d.p("a"), libc::O_CREAT | libc::O_WRONLY, 0o644),
            "open",
        );
        ok(sys::link(d.p("a"), d.p("b")), "link");
        ok(sys::write(&fd, b"12345"), "write");
        assert_eq!(lst(d.p("b")).size, 5, "size through the other link");
        assert_eq!(read_file(d.p("b")), b"12345");
    });
}
